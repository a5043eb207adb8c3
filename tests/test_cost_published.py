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
    # Measured on this set (README table): median 6.2%. One stated miss, Qwen3-235B's FSDP run (+57%), whose
    # expert parameters Megatron-FSDP's default gathers and reduces per micro-batch across 32 nodes, more than
    # its 17.6 s could have moved. The rest within 30%: the worst, the same model's PP run (-28.2%; every MoE term
    # checks out against its source, 8 s of the 29 s are in none of them, published.py qwen3_runs); next, v5p
    # 128B over two slices (-25%). Margins: 1.3 points on the median, 1.8 on the worst.
    miss = errors.pop(("Megatron-MoE-ModelZoo Qwen3", "235B TP2 EP8 FSDP"))
    assert statistics.median(errors.values()) < 0.075
    assert max(errors.values()) < 0.30
    assert miss > 0.30  # still a miss: when it is not, fold it back into the worst case above


def test_runs_that_ran_are_predicted_to_fit(rows):
    """Every GPU run fits its HBM. The TPU runs are not held to it: most of MaxText's 2023 rows are predicted
    over their HBM though they ran (XLA's buffer assignment is not our accounting; open)."""
    for run, layout, _, _, pred in rows:
        if run.hardware in ("A100", "H100"):
            assert pred.fits, (run.name, pred.memory_per_device_bytes)
