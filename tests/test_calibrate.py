"""The closed loop on the machine in hand: `meshscale calibrate` on 2 processes (quick), the ClusterSpec it
writes used by `predict` and by `train --cluster --predict` (whose JSONL ends with one summary object), the
operator counts the dispatch term charges, the CPU allocator probe, `plan --fix`, and the demo training the
layout it planned."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshscale.cost import overhead, predict
from meshscale.errors import UserError
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout, trainer_refusal
from meshscale.specs.model import load_model

ROOT = Path(__file__).resolve().parents[1]


def _meshscale(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "meshscale", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("calibrate") / "local.toml"
    r = _meshscale("calibrate", "--nproc", "2", "--quick", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout
    return out


def test_calibrate_writes_a_cluster_spec_that_predict_uses(calibrated):
    cluster = load_cluster(str(calibrated))
    assert dict(cluster.calibration)["nproc"] == "2" and "torch" in dict(cluster.calibration)
    assert {c[0] for c in cluster.collectives} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                   "send_recv"}
    assert all(bw > 0 and lat > 0 for _, lat, bw in cluster.collectives)
    assert cluster.op_overhead_s > 0 and len(cluster.gemm_rates) >= 3 and cluster.attention_rates
    assert cluster.rates_precision == "fp32"  # what `train` runs on a CPU
    assert cluster.tiers[0].bandwidth == max(bw for _, _, bw in cluster.collectives)
    # our eager runtime, two ranks sharing the host's cores, and how much of a collective compute hides here
    assert cluster.calibrated_ranks == 2 and not cluster.software.fused_elementwise
    assert 0 <= cluster.software.overlap_efficiency <= 1
    assert cluster.overlap_slowdown == 0.0  # measured overlap holds compute's slowdown: not derived on top
    # FSDP2's own host time enters zero=3 only: per unit and micro-batch, per sharded tensor in the update
    assert cluster.fsdp_unit_overhead_s > 0 and cluster.fsdp_tensor_overhead_s > 0
    tiny, layout = load_model("tiny"), Layout(dp=2, zero=2)
    no_fsdp = replace(cluster, fsdp_unit_overhead_s=0.0, fsdp_tensor_overhead_s=0.0)
    fsdp = Layout(dp=2, zero=3, mbs=4)  # 2 micro-batches of the 16 sequences
    extra = predict(tiny, cluster, fsdp, 16, "fp32").compute_s - predict(tiny, no_fsdp, fsdp, 16, "fp32").compute_s
    assert extra == pytest.approx(2 * (tiny.layers + 1) * cluster.fsdp_unit_overhead_s)
    assert predict(tiny, cluster, layout, 16, "fp32").step_time_s == predict(tiny, no_fsdp, layout, 16,
                                                                             "fp32").step_time_s
    # Each measured term enters the prediction: without them the same spec predicts a different step.
    full = predict(tiny, cluster, layout, 16, "fp32")
    bare = predict(tiny, replace(cluster, op_overhead_s=0.0), layout, 16, "fp32")
    host = sum(overhead.chunk_seconds(cluster, layout, tiny.layers, True))
    assert full.step_time_s > bare.step_time_s and host > 0
    for rates in ("gemm_rates", "attention_rates"):  # the measured kernel rates replace the preset's ceiling
        assert predict(tiny, replace(cluster, **{rates: ()}), layout, 16, "fp32").compute_s != full.compute_s
    rs = next(e for e in full.comm if e["collective"] == "reduce_scatter")
    generic = predict(tiny, replace(cluster, collectives=()), layout, 16, "fp32")
    assert rs["time_s"] != next(e for e in generic.comm if e["collective"] == "reduce_scatter")["time_s"]
    r = _meshscale("predict", "--model", "tiny", "--cluster", str(calibrated), "--devices", "2", "--layout",
                   "dp=2,zero=2", "--global-batch", "16", "--precision", "fp32", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["step_time_s"] == pytest.approx(full.step_time_s)


def test_more_ranks_than_calibrated_share_the_cores(calibrated):
    """Four ranks on a host calibrated with two: each rank computes at half the measured rates."""
    cluster, tiny = load_cluster(str(calibrated)), load_model("tiny")
    alone = replace(cluster, calibrated_ranks=0)
    for devices, factor in ((2, 1), (4, 2)):
        layout = Layout(dp=devices)
        assert predict(tiny, cluster, layout, 16, "fp32").compute_s == pytest.approx(
            factor * predict(tiny, alone, layout, 16, "fp32").compute_s)
    shared = overhead.shared_cores(cluster, 4)
    assert overhead.shared_cores(shared, 4) == shared  # applying it twice changes nothing


def test_simulate_agrees_with_predict_on_the_calibrated_machine(calibrated):
    """Host time, FSDP2's hooks, the measured overlap, shared cores and the control all-reduces enter the
    simulator's passes and tail as they enter predict. FSDP is compared with nothing overlapped: where its
    gathers outrun compute (tiny here, depending on what was measured) the simulator's unit-by-unit prefetch
    exposes a unit's compute per pass that predict's rule does not, a few percent."""
    from meshscale.sim.step import simulate

    cluster, tiny = load_cluster(str(calibrated)), load_model("tiny")
    serial = cluster.with_software(overlap_efficiency=0.0)
    for text, devices, spec in (("dp=2", 2, cluster), ("dp=2,zero=1", 2, cluster), ("dp=2,zero=3", 2, serial),
                                ("tp=2", 2, cluster), ("dp=2,tp=2", 4, cluster)):
        layout = Layout.parse(text, devices)
        assert simulate(tiny, spec, layout, 8, "fp32").step_time_s == pytest.approx(
            predict(tiny, spec, layout, 8, "fp32").step_time_s, rel=0.02)


def test_measured_rates_cost_their_own_precision_only():
    """A CPU's fp32 GEMM rates say nothing of its bf16 kernels (nor a GPU's bf16 of its FP8): the rates stand
    for the precision they were measured in, and the others keep the preset's model."""
    from meshscale.cost.kernels import gemm_seconds

    cpu, tiny, layout = load_cluster("local-cpu"), load_model("tiny"), Layout(dp=2)
    measured = replace(cpu, gemm_rates=((1024, 1024, 1024, 1e9),), attention_rates=((64, 32, 1e8),))
    peak = cpu.peak_flops("fp32")
    assert gemm_seconds(measured, 1024, 1024, 1024, peak, 4) == pytest.approx(2 * 1024**3 / 1e9)
    assert gemm_seconds(measured, 1024, 1024, 1024, peak, 2) == gemm_seconds(cpu, 1024, 1024, 1024, peak, 2)
    assert predict(tiny, measured, layout, 16, "fp32").compute_s != predict(tiny, cpu, layout, 16, "fp32").compute_s
    assert predict(tiny, measured, layout, 16, "bf16").compute_s == predict(tiny, cpu, layout, 16, "bf16").compute_s
    bf16 = replace(measured, rates_precision="bf16")
    assert gemm_seconds(bf16, 1024, 1024, 1024, peak, 2) == pytest.approx(2 * 1024**3 / 1e9)
    assert gemm_seconds(bf16, 1024, 1024, 1024, peak, 2, operand_bytes=1) != pytest.approx(2 * 1024**3 / 1e9)
    with pytest.raises(UserError, match="rates_precision must be fp32 or bf16"):
        replace(cpu, rates_precision="fp8")


def test_a_gpu_calibration_keeps_its_datasheet_for_what_it_did_not_measure(monkeypatch, tmp_path):
    """What calibrate writes for a GPU (bf16 rates at a llama3-8b layer's shapes, no new peaks), read back:
    bf16 GEMMs cost the measured rates, FP8 ones the preset's model. Built from made-up rates (no GPU here)."""
    import torch

    from meshscale.cost.kernels import gemm_seconds, nearest
    from meshscale.runtime.measure import calibrate

    sweep = calibrate.SWEEPS["cuda"]
    assert sweep.precision == "bf16" and (8192, 8192, 8192) in sweep.gemms
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    rank = {"gemm": [(m, n, k, 6e14) for m, n, k in sweep.gemms],
            "attention": [(s, d, 4e14 * d / 128) for s, d in sweep.attention], "bandwidth": 4.3e12,
            "op_overhead": 1e-5}
    path = tmp_path / "gpu.toml"
    path.write_text(calibrate.to_toml(calibrate.cluster_fields([rank], torch.device("cuda", 0), 1, "test")))
    gpu, h200 = load_cluster(str(path)), load_cluster("h200")
    assert gpu.rates_precision == "bf16" and gpu.calibrated_ranks == 0
    # heads of 64 (GPT-OSS's) read their own measured rate at each length, not 128's
    assert [nearest(gpu.attention_rates, (s, 64)) for s in (1024, 4096, 8192)] == [2e14] * 3
    assert (gpu.peak_flops_bf16, gpu.peak_flops_fp32, gpu.matmul_efficiency) == (
        h200.peak_flops_bf16, h200.peak_flops_fp32, h200.matmul_efficiency)
    model, layout = load_model("llama3-8b"), Layout(dp=8)
    kernels = predict(model, gpu, layout, 64, "bf16").compute_s
    assert kernels != predict(model, h200, layout, 64, "bf16").compute_s
    bare = replace(gpu, gemm_rates=(), attention_rates=())
    assert predict(model, gpu, layout, 64, "fp32").compute_s == predict(model, bare, layout, 64, "fp32").compute_s
    fp8 = gpu.gemm_peak("fp8")  # FP8 operands: the preset's model (its attention and head stay bf16, measured)
    assert gemm_seconds(gpu, 4096, 4096, 4096, fp8, 2, operand_bytes=1) == gemm_seconds(bare, 4096, 4096, 4096, fp8,
                                                                                       2, operand_bytes=1)


def test_calibrate_never_overwrites_silently(calibrated):
    before = calibrated.read_text()
    r = _meshscale("calibrate", "--nproc", "2", "--quick", "--out", str(calibrated))
    assert r.returncode == 2 and "--overwrite" in r.stderr and r.stderr.count("\n") == 1
    assert calibrated.read_text() == before


def test_train_predict_ends_the_metrics_with_one_summary(calibrated, tmp_path):
    metrics = tmp_path / "m.jsonl"
    r = _meshscale("train", "--layout", "dp=2,zero=1", "--nproc", "2", "--steps", "4", "--global-batch", "8",
                   "--predict", "--cluster", str(calibrated), "--metrics-out", str(metrics), "--bucket-mb", "0.25")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row.get("summary") for row in rows] == [None] * 4 + [True]
    summary = rows[-1]
    # costed with the buckets the run cut (--bucket-mb 0.25: 65,536 fp32 gradients), not the file's [software]
    cluster = load_cluster(str(calibrated))
    run = cluster.with_software(framework="torch", grad_bucket_params=2**16)
    expected = predict(load_model("tiny"), run, Layout(dp=2, zero=1), 8, "fp32")
    assert expected.step_time_s != predict(load_model("tiny"), cluster, Layout(dp=2, zero=1), 8, "fp32").step_time_s
    assert summary["predicted_step_time_s"] == pytest.approx(expected.step_time_s)
    assert summary["predicted_memory_bytes"] == pytest.approx(expected.memory_per_device_bytes["total"])
    steady = sorted(row["step_time_s"] for row in rows[1:3])  # the last step is the profiled one
    assert summary["step_time_s"] in steady
    # The allocator's peak holds at least the model state the cost model counts (params, grads, optimizer).
    mem = expected.memory_per_device_bytes
    assert summary["peak_memory_bytes"] >= mem["params"] + mem["grads"] + mem["optimizer"]
    assert {(c["collective"], c["axis"]) for c in summary["comm"]} == {("reduce_scatter", "dp"), ("all_gather", "dp")}
    assert all(c["measured_bytes"] == c["predicted_bytes"] > 0 for c in summary["comm"])


def test_memory_probe_sees_a_tensor_freed_inside_the_step():
    import torch

    from meshscale.runtime.measure.metrics import MemoryProbe, heap_bytes

    import torch.profiler  # noqa: F401  (imported before the baseline, as the trainer does)

    probe = MemoryProbe(heap_bytes())
    with probe.step():
        x = torch.ones(2**21)  # 8 MiB, gone before the step ends
        del x
    assert 8 * 2**20 <= probe.peak < 16 * 2**20


def test_operator_counts_match_the_runtime_model():
    """cost/overhead.py charges these per layer; count them on models/transformer.py's blocks (1 and 2 layers, so
    the root's share separates) with a dispatch mode."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from meshscale.models.transformer import build_model
    from meshscale.runtime.loop.optim import build_optimizer

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    counts = []
    for layers in (1, 2):
        spec = replace(load_model("tiny"), layers=layers)
        model = build_model(spec, 0, "cpu")
        optimizer = build_optimizer(list(model.parameters()), 1e-3, 0.1)
        x = torch.randint(0, spec.vocab, (2, spec.seq + 1))

        def forward():
            return torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())

        forward().backward()
        optimizer.step()  # the first step creates the optimizer state: count a steady one
        with Count() as fwd:
            loss = forward()
        with Count() as bwd:
            loss.backward()
        with Count() as opt:
            optimizer.step()
        counts.append((fwd.n, bwd.n, opt.n, len(list(model.parameters()))))
    (f1, b1, o1, t1), (f2, b2, o2, t2) = counts
    assert (f2 - f1, b2 - b1) == (overhead.FORWARD_OPS_PER_LAYER, overhead.BACKWARD_OPS_PER_LAYER)
    assert (f1 - overhead.FORWARD_OPS_PER_LAYER, b1 - overhead.BACKWARD_OPS_PER_LAYER) == (
        overhead.ROOT_FORWARD_OPS, overhead.ROOT_BACKWARD_OPS)
    assert t2 - t1 == overhead.TENSORS_PER_LAYER and t1 - overhead.TENSORS_PER_LAYER == overhead.ROOT_TENSORS
    assert (o2 - o1) == overhead.TENSORS_PER_LAYER * overhead.OPTIMIZER_OPS_PER_TENSOR


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt", "tiny+relu2"])
@pytest.mark.parametrize("mode", ["none", "selective"])
def test_eager_activation_count_matches_what_autograd_saves(name, mode):
    """cost/memory.py's eager count: the bytes autograd keeps for backward in one block of models/transformer.py
    (fp32), found with saved-tensor hooks, each storage once, parameters and RoPE tables left out. tiny+relu2:
    Nemotron-4's block (squared ReLU, LayerNorm without biases elsewhere)."""
    import torch

    from meshscale.cost.memory import eager_saved_elements
    from meshscale.parallel.recompute import apply_recompute
    from meshscale.models.transformer import build_model

    spec = load_model(name.removesuffix("+relu2"))
    if name.endswith("+relu2"):
        spec = replace(spec, mlp="relu2", norm="layernorm")
    model = build_model(spec, 0, "cpu")
    apply_recompute(model, mode)
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    batch = 3
    x = torch.randn(batch, spec.seq, spec.hidden, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.layers["0"](x, model.rope_cos, model.rope_sin).sum().backward()
    expected = eager_saved_elements(spec, 1, False, mode == "selective") * batch * spec.seq * 4
    assert sum(saved.values()) == pytest.approx(expected, rel=0.01)


def test_fix_constrains_the_search_and_is_explained():
    from meshscale.plan.explain import explain
    from meshscale.plan.search import parse_fix, search

    model, cluster = load_model("llama3-8b"), load_cluster("h100-80gb")
    free = search(model, cluster, 64, 256, top=5)
    fix = parse_fix("zero=3,schedule=1f1b,pp=2")
    fixed = search(model, cluster, 64, 256, top=5, fix=fix)
    assert fixed.ranked and fixed.enumerated < free.enumerated / 10
    for p in fixed.ranked + fixed.rejected:
        layout = Layout.parse(p.layout)
        assert (layout.zero, layout.schedule, layout.pp) == (3, "1f1b", 2)
    assert fixed.ranked[0].step_time_s >= free.ranked[0].step_time_s
    assert "Fixed by --fix: zero=3, schedule=1f1b, pp=2" in explain(fixed, model, cluster, 64, 256)[0]
    assert parse_fix("fsdp=8,sp=true") == {"dp": 8, "zero": 3, "sp": True}


@pytest.mark.parametrize("fix, needle", [("pp", "not key=value"), ("tp=two", "whole number"), ("zero=4", "0-3"),
                                         ("schedule=fast", "unknown schedule"), ("pp=1,pp=2", "two values"),
                                         ("warp=2", "not key=value")])
def test_bad_fix_is_one_line_exit_2(fix, needle):
    r = _meshscale("plan", "--model", "tiny", "--cluster", "local-cpu", "--devices", "2", "--global-batch", "16",
                   "--fix", fix)
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1


def test_demo_trains_the_layout_it_planned(calibrated, tmp_path):
    from meshscale import demo

    (tmp_path / "runs").mkdir()
    shutil.copy(calibrated, tmp_path / demo.CLUSTER)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        trained = demo.winner()
        r = _meshscale(*demo.PLAN, "--json", "--top", "1", cwd=tmp_path)
    finally:
        os.chdir(cwd)
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)["ranked"][0]["layout"]
    model = load_model("tiny")
    if trainer_refusal(Layout.parse(planned), model) is None:
        assert trained == planned
    else:
        assert trainer_refusal(Layout.parse(trained), model) is None
