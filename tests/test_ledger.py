"""The comm ledger measures, on real gloo ranks, exactly the bytes the contract (parallel/ledger.py)
derives from the parameter count, for every zero stage with and without accumulation; and the
predicted-vs-measured comparison agrees only when bytes agree."""

import pytest

from multirank import run_ranks

WORLD = 2
CASES = ["zero=0", "zero=0,mbs=2", "zero=1", "zero=1,mbs=2", "zero=2", "zero=2,mbs=1",
         "zero=3", "zero=3,mbs=2", "zero=3,mbs=2,recompute=full", "zero=3,mbs=2,recompute=selective",
         "zero=3,mbs=2,recompute=op", "zero=3,mbs=2,recompute=minimal",
         "zero=3,mbs=2@bf16", "zero=2,mbs=2@bf16"]


def expected_comm(spec, zero: int, m: int, precision: str) -> dict:
    """Per-rank bytes per optimizer step, keyed by (collective, axis). Gradients reduce in fp32."""
    p = spec.param_count()
    grads = 4 * p
    if zero == 0:
        return {("all_reduce", "dp"): grads}
    if zero == 1:
        return {("reduce_scatter", "dp"): grads, ("all_gather", "dp"): 4 * p}
    if zero == 2:
        return {("reduce_scatter", "dp"): m * grads, ("all_gather", "dp"): 4 * p}
    # FSDP2, as measured: each block's params are gathered in forward and again in backward; the root
    # (embeddings, final norm, head) is not resharded after forward, so it is gathered once.
    blocks = sum(spec.layer_params(i) for i in range(spec.layers))
    root = p - blocks
    param_bytes = 2 if precision == "bf16" else 4
    return {("all_gather", "dp"): m * param_bytes * (2 * blocks + root), ("reduce_scatter", "dp"): m * grads}


def _run(case: str):
    from meshscale.runtime.loop.config import TrainConfig, resolve

    layout, _, precision = case.partition("@")
    return resolve(TrainConfig(layout=layout, steps=2, global_batch=8, precision=precision or "fp32",
                               bucket_mb=0.5), WORLD)


def _measure(rank, world, cases):
    import torch

    from meshscale.runtime.loop.data import load_tokens
    from meshscale.runtime.loop.trainer import train

    tokens = load_tokens(None)[: 1 << 20]
    return {case: train(_run(case), torch.device("cpu"), tokens, log=False) for case in cases}


@pytest.fixture(scope="module")
def measured():
    return run_ranks(WORLD, _measure, CASES)


def test_model_parameters_match_the_spec():
    from meshscale.models.transformer import build_model
    from meshscale.specs.model import PRESETS

    spec = PRESETS["tiny"]
    assert sum(p.numel() for p in build_model(spec).parameters()) == spec.param_count()


@pytest.mark.parametrize("case", CASES)
def test_measured_bytes_equal_the_contract(case, measured):
    run = _run(case)
    m = run.layout.microbatches(run.config.global_batch)
    want = expected_comm(run.spec, run.layout.zero, m, run.config.precision)
    for rank, per_step in enumerate(measured):
        for step, summary in enumerate(per_step[case]["comm"]):
            got = {(e["collective"], e["axis"]): e["bytes"] for e in summary}
            assert got == want, f"{case}: rank {rank} step {step}: {got} != {want}"
            assert all(e["time_s"] >= 0 for e in summary)


@pytest.mark.parametrize("case", CASES)
def test_cost_model_predicts_the_measured_bytes(case, measured):
    """The closed loop: `meshscale train --predict` compares these, and they must agree exactly."""
    from meshscale.cost import predict
    from meshscale.specs.cluster import load_cluster

    run = _run(case)
    pred = predict(run.spec, load_cluster("local-cpu"), run.layout, run.config.global_batch, run.config.precision)
    want = {(e["collective"], e["axis"]): e["bytes"] for e in pred.to_dict()["comm"]}
    got = {(e["collective"], e["axis"]): e["bytes"] for e in measured[0][case]["comm"][-1]}
    assert got == want


def test_fsdp_calls_per_microbatch(measured):
    # 8 blocks gathered twice + the root once = 17 all-gathers; 8 blocks + root = 9 reduce-scatters.
    summary = {(e["collective"]): e["calls"] for e in measured[0]["zero=3,mbs=2"]["comm"][-1]}
    assert summary == {"all_gather": 2 * 17, "reduce_scatter": 2 * 9}


def test_comparison_flags_any_byte_difference(measured):
    from meshscale.runtime.measure.metrics import compare_comm, format_comparison

    summary = measured[0]["zero=2,mbs=1"]["comm"][-1]
    exact = [{"axis": e["axis"], "collective": e["collective"], "bytes": e["bytes"], "time_s": 0.01} for e in summary]
    rows = compare_comm(summary, exact)
    assert all(r["match"] for r in rows) and len(rows) == 2
    off = [dict(e, bytes=e["bytes"] + 4) if e["collective"] == "all_gather" else e for e in exact]
    rows = compare_comm(summary, off)
    assert [r["match"] for r in rows] == [False, True]  # sorted: all_gather, reduce_scatter
    missing = compare_comm(summary + [{"axis": "tp", "collective": "all_reduce", "bytes": 8, "time_s": 0}], exact)
    assert {(r["collective"], r["axis"]): r["match"] for r in missing}[("all_reduce", "tp")] is False
    assert "DIFF" in format_comparison(rows) and "ok" in format_comparison(rows)


def test_ledger_requires_named_groups():
    from meshscale.parallel.ledger import CommLedger

    ledger = CommLedger()
    ledger.name_group("g", "tp")
    assert ledger.axis_of("g") == "tp"
    with pytest.raises(KeyError):
        ledger.axis_of("unknown")
    ledger.begin_step(3)
    ledger.record("tp", "all_reduce", 100, 0.5)
    ledger.record("tp", "all_reduce", 28, 0.25)
    assert ledger.summary() == [{"collective": "all_reduce", "axis": "tp", "bytes": 128, "calls": 2, "time_s": 0.75}]


def test_report_puts_prediction_beside_measurement(measured):
    from meshscale.runtime.measure.metrics import report

    case = "zero=2,mbs=1"
    run, result = _run(case), measured[0][case]
    m = run.layout.microbatches(run.config.global_batch)
    exact = [{"collective": c, "axis": a, "bytes": b, "time_s": 1e-3}
             for (c, a), b in expected_comm(run.spec, 2, m, "fp32").items()]
    prediction = {"comm": exact, "step_time_s": 0.05, "memory_per_device_bytes": {"total": 2**20}}
    text = report(run, result, prediction)
    assert "comm bytes: all agree" in text and "ratio" in text and "validation loss" in text
    wrong = dict(prediction, comm=[dict(e, bytes=e["bytes"] * 2) for e in exact])
    assert "MISMATCH" in report(run, result, wrong)
    assert "predicted" not in report(run, result)


def _functional(rank, world):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    from meshscale.parallel.ledger import CommLedger

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    ledger = CommLedger()
    ledger.name_mesh(mesh)
    x = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
    with ledger.tap(functional=True):
        full = x.redistribute(mesh, [Replicate()]).to_local()  # all-gather of a 8x4 fp32 tensor
        partial = DTensor.from_local(torch.ones(8, 4), mesh, [Partial()])
        partial.redistribute(mesh, [Replicate()]).to_local()  # all-reduce of 8x4 fp32
    return float(full.sum()), [(e["collective"], e["axis"], e["bytes"]) for e in ledger.records]


def test_tap_records_dtensor_functional_collectives():
    for total, records in run_ranks(2, _functional):
        assert total == 32.0
        assert records == [("all_gather", "tp", 128), ("all_reduce", "tp", 128)]


def test_module_level_record_goes_to_the_active_ledger():
    from meshscale.parallel.ledger import CommLedger, record

    ledger = CommLedger()
    record("tp", "all_gather", 64)  # no active ledger: dropped
    with ledger.active():
        record("tp", "all_gather", 64, 0.1)
    record("tp", "all_gather", 64)
    assert [(r["axis"], r["bytes"]) for r in ledger.records] == [("tp", 64)]
