"""Predicted step times against the published measured runs of benchmarks/published.py."""

import importlib.util
import os
import statistics

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_published():
    spec = importlib.util.spec_from_file_location("published", os.path.join(ROOT, "benchmarks", "published.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows():
    return list(load_published().rows())


def test_the_validation_set_covers_hardware_kinds_and_scales(rows):
    runs = [r for r, *_ in rows]
    assert len(runs) >= 25
    assert sum(not r.source.startswith(("Narayanan", "Korthikanti")) for r in runs) >= 12
    assert {"A100", "H100", "TPU v4", "TPU v5e", "TPU v5p"} <= {r.hardware for r in runs}
    assert any(r.moe for r in runs) and any(not r.moe for r in runs)
    assert min(r.devices for r in runs) <= 8 and max(r.devices for r in runs) >= 16384


def test_step_times_within_stated_error(rows):
    errors = {(r.source, r.name): abs(pred / real - 1) for r, _, pred, real, _ in rows}
    # Measured on this set (README table): median 6.5%. Two stated misses, both Qwen3-235B: the FSDP run (+56%),
    # whose expert parameters we gather per micro-batch across 32 nodes as FSDP2 does where Megatron-FSDP's run
    # took 17.6 s in all; and the PP run written as it ran (ETP1, the distributed optimizer: -35%), where every
    # MoE term checks out against its source and 10 s of the 29 s are in none of them (published.py
    # qwen3_runs). The rest within 26%. Margins: 1 point on the median, 4 on the worst.
    misses = [errors.pop(("Megatron-MoE-ModelZoo Qwen3", name)) for name in ("235B TP2 EP8 FSDP", "235B TP4 EP8 PP8")]
    assert statistics.median(errors.values()) < 0.075
    assert max(errors.values()) < 0.30
    assert min(misses) > 0.30  # still misses: when one is not, fold it back into the worst case above


def test_runs_that_ran_are_predicted_to_fit(rows):
    """Every GPU run fits its HBM; the TPU runs that do not (host-offloaded remat, MaxText's 'minimal'
    policy that keeps only matmul outputs) are the ones our recompute modes cannot describe."""
    for run, layout, _, _, pred in rows:
        if run.hardware in ("A100", "H100"):
            assert pred.fits, (run.name, pred.memory_per_device_bytes)
