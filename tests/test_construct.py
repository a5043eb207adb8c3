"""Sharded construction (parallel/construct.py): a model built on the meta device and materialised rank by
rank holds, on every rank and under every kind of split (TP slices and KV-head copies, FSDP2 and hybrid
shards, pipeline stages, experts, tied tables), exactly the values the single-process model has there; the
initial values are a function of (seed, name, global index); and `train` refuses a layout that cannot fit
before building anything."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multirank import run_ranks

ROOT = Path(__file__).resolve().parents[1]
TINY_KV2 = str(ROOT / "configs" / "tiny-kv2.toml")
# (model, layout) on 4 ranks: each split the runtime makes, alone and composed
CASES = [("tiny", "dp=4,zero=3"), ("tiny", "dp=2,zero=3,tp=2,sp=true"), ("tiny", "dp=4,zero=3,shard=2"),
         ("tiny", "dp=2,zero=1,pp=2,schedule=interleaved,vpp=2,mbs=1"), ("tiny", "dp=2,zero=3,pp=2,mbs=1"),
         ("tiny", "tp=2,pp=2,schedule=zbv,mbs=1"), (TINY_KV2, "tp=4"),
         ("tiny-gpt", "dp=4,zero=3"), ("tiny-gpt", "dp=2,tp=2,pp=1"), ("tiny-gpt", "tp=2,pp=2,mbs=1"),
         ("tiny-moe", "dp=4,zero=3,ep=2"), ("tiny-moe", "dp=2,tp=2,ep=2"), ("tiny-moe", "dp=4,ep=4,zero=2")]


def test_any_slice_draws_the_numbers_of_the_whole():
    from meshscale.models.init import normal_block

    g = torch.Generator().manual_seed(0)
    for shape in [(1, 7), (130, 1100), (64, 512), (300, 65)]:
        whole = normal_block("k", shape, (0, 0), shape)
        assert not torch.equal(whole, normal_block("other", shape, (0, 0), shape))
        for _ in range(6):
            r0, c0 = (int(torch.randint(0, n, (), generator=g)) for n in shape)
            rows, cols = (int(torch.randint(1, n - o + 1, (), generator=g)) for n, o in zip(shape, (r0, c0)))
            got = normal_block("k", shape, (r0, c0), (rows, cols))
            assert torch.equal(got, whole[r0:r0 + rows, c0:c0 + cols]), (shape, r0, c0, rows, cols)


def test_meta_structure_holds_no_parameter_memory():
    from meshscale.models.transformer import build_model, meta_model
    from meshscale.specs.model import load_model

    spec = load_model("llama2-7b")  # 6.7e9 parameters: a whole build would take 27 GB
    model = meta_model(spec)
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()
    assert model.rope_cos.device.type == "cpu" and model.rope_cos.abs().sum() > 0
    tiny = load_model("tiny-gpt")
    built = build_model(tiny, seed=5)
    assert built.output.weight is built.tok_embeddings.weight  # tied: one tensor, as constructed
    again = build_model(tiny, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(built.parameters(), again.parameters()))
    assert not torch.equal(built.tok_embeddings.weight, build_model(tiny, seed=6).tok_embeddings.weight)


def _held(par) -> dict:
    return {name: (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
            for _, chunk in par.chunks for name, p in chunk.named_parameters()}


def _owned(rank, world, cases):
    from meshscale.models.transformer import build_model, meta_model
    from meshscale.parallel.apply import apply_layout
    from meshscale.parallel.ledger import CommLedger
    from meshscale.parallel.mesh import build_mesh
    from meshscale.runtime.loop.config import TrainConfig, resolve

    out = {}
    for model, text in cases:
        run = resolve(TrainConfig(model=model, layout=text, global_batch=8, seed=3), world)
        mesh = build_mesh(run.layout, "cpu")
        sharded = apply_layout(meta_model(run.spec), run.layout, mesh, CommLedger(), seed=3, device="cpu")
        whole = apply_layout(build_model(run.spec, 3), run.layout, mesh, CommLedger())
        mine, reference = _held(sharded), _held(whole)
        out[(model, text)] = {
            "names": sorted(mine) == sorted(reference),
            "equal": [n for n in mine if not torch.equal(mine[n], reference.get(n, torch.empty(0)))],
            "meta": [n for _, c in sharded.chunks for n, p in c.named_parameters() if p.is_meta],
            "numel": sum(t.numel() for t in mine.values()),
            "total": run.spec.param_count(),
        }
    return out


@pytest.fixture(scope="module")
def owned():
    return run_ranks(4, _owned, CASES)


def test_every_rank_materialises_the_single_process_values(owned):
    for rank, per_case in enumerate(owned):
        for case, r in per_case.items():
            assert r["names"] and not r["meta"], (rank, case)
            assert r["equal"] == [], f"rank {rank} {case}: differs from the single-process model in {r['equal']}"


def test_sharded_layouts_hold_a_share(owned):
    for case in CASES:
        held = [per_case[case]["numel"] for per_case in owned]
        if "zero=3" in case[1] and "shard" not in case[1] and "ep" not in case[1] and "tp" not in case[1]:
            # FSDP over 4 ranks: each holds about a quarter (pipeline: of its stage), never the whole
            assert max(held) < 0.5 * owned[0][case]["total"], (case, held)


def _meshscale(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "meshscale", *args], capture_output=True, text=True, env=env,
                          timeout=240, cwd=ROOT)


def test_a_layout_that_cannot_fit_is_refused_before_building():
    out = _meshscale("train", "--model", "llama2-7b", "--nproc", "1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "GiB per rank (cost model" in out.stderr and "available" in out.stderr and out.stdout == ""


def test_owned_cores_split_the_affinity_set_unless_omp_num_threads_says(monkeypatch):
    from meshscale.runtime.loop.launch import owned_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert owned_cores(1) == cores and owned_cores(cores) == 1 and owned_cores(10 * cores) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert owned_cores(1) == 3 and owned_cores(10 * cores) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "many")  # not a count: ignored, as torch ignores it
    assert owned_cores(1) == cores
