"""The host that issues a GPU's kernels (cost model only, no torch): a pass takes at least as long as its host
needs to run the framework's layers, and a MoE layer's host wait drops the lead the host had."""

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from meshscale.commands import report
from meshscale.cost import overhead, predict
from meshscale.cost.step import chunk_passes, host_bound
from meshscale.cost.kernels import Passes
from meshscale.errors import UserError
from meshscale.plan.explain import components
from meshscale.specs.cluster import HOST_LINEAR_S, load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model

ROOT = Path(__file__).resolve().parents[1]
GB200 = load_cluster("gb200-nvl72")
NO_HOST = replace(GB200, host_linear_s=0.0)
SMALL_MOE = load_model("small-moe")  # so little work a layer that its host is the slower side
LLAMA = load_model("llama3-8b")


def test_presets_take_their_host_cpus_linear_time_and_tpus_none():
    h100 = load_cluster("h100-80gb")
    assert GB200.host_linear_s == HOST_LINEAR_S["arm"] > h100.host_linear_s == HOST_LINEAR_S["intel"]
    assert load_cluster("tpu-v5p").host_linear_s == 0.0 and load_cluster("local-cpu").host_linear_s == 0.0


def test_a_host_bound_moe_chunk_takes_its_host_time_and_a_linear_after_each_wait():
    layout = Layout.parse("dp=4,ep=4,mbs=1", 4)
    device = chunk_passes(SMALL_MOE, NO_HOST, layout, 0)
    passes = chunk_passes(SMALL_MOE, GB200, layout, 0)
    dense = sum(not SMALL_MOE.is_moe_layer(i) for i in range(SMALL_MOE.layers))
    host_f, host_b = overhead.framework_seconds(SMALL_MOE, GB200, layout, dense, SMALL_MOE.layers - dense, True)
    assert host_f > device.forward and host_b > device.backward + device.weight  # the premise: host-bound
    waits = (SMALL_MOE.layers - dense) * overhead.LINEAR_HOST * GB200.host_linear_s
    assert passes.forward == pytest.approx(host_f + waits)
    assert passes.backward + passes.weight == pytest.approx(host_b)


def test_without_a_wait_the_passes_stretch_together_to_the_hosts_total():
    device = Passes(forward=1.0, backward=1.5, weight=0.5, attention=0.3)
    assert host_bound(device, 0.5, 1.0, 0.0) == device  # the host keeps ahead: nothing changes
    stretched = host_bound(device, 3.0, 3.0, 0.0)  # 6 s of calls against 3 s of kernels
    assert stretched.total == pytest.approx(6.0)
    assert stretched.forward / stretched.backward == pytest.approx(device.forward / device.backward)
    assert stretched.attention == pytest.approx(0.6)
    # a host slow in forward but ahead over the whole pass loses nothing without a wait, a forward with one
    assert host_bound(device, 1.5, 0.5, 0.0) == device
    waited = host_bound(device, 1.5, 0.5, 0.01)
    assert waited.forward == pytest.approx(1.51) and waited.backward == pytest.approx(1.5)


def test_the_slower_host_slows_the_step_only_where_the_host_bounds_it():
    moe = Layout.parse("dp=4,ep=4,mbs=1", 4)
    assert predict(SMALL_MOE, GB200, moe, 8).step_time_s > 1.5 * predict(SMALL_MOE, NO_HOST, moe, 8).step_time_s
    dense = Layout.parse("dp=8,zero=1,mbs=1", 8)  # an 8B layer's GEMMs outlast its calls many times over
    assert predict(LLAMA, GB200, dense, 8).step_time_s == predict(LLAMA, NO_HOST, dense, 8).step_time_s


def test_recompute_makes_its_calls_again_in_backward():
    plain, full, attn = (Layout.parse(f"dp=8,mbs=1,recompute={r}", 8) for r in ("none", "full", "selective"))
    f, b = overhead.framework_seconds(LLAMA, GB200, plain, 4, 0, False)
    assert (f, b) == pytest.approx(tuple(4 * t * GB200.host_linear_s for t in overhead.LAYER_HOST[False]))
    assert overhead.framework_seconds(LLAMA, GB200, full, 4, 0, False)[1] == pytest.approx(b + f)
    extra = overhead.framework_seconds(LLAMA, GB200, attn, 4, 0, False)[1] - b
    assert extra == pytest.approx(4 * overhead.RECOMPUTE_HOST["core_attn"] * GB200.host_linear_s)


def test_the_layers_host_figures_are_the_recorded_benchmarks():
    recorded = json.loads((ROOT / "benchmarks/data/host_calls_cpu.json").read_text())["linears"]
    figures = {"dense": overhead.LAYER_HOST[False], "moe": overhead.LAYER_HOST[True], "root": overhead.ROOT_HOST,
               "mla_extra": overhead.MLA_EXTRA_HOST, "mlp": overhead.MLP_HOST, "router": overhead.ROUTER_HOST}
    for name, pair in figures.items():
        assert pair == pytest.approx(recorded[name], abs=0.05), name
    assert (overhead.LINEAR_HOST, overhead.NORM_HOST) == pytest.approx(
        (recorded["linear"][0], recorded["norm"][0]), abs=0.05)


def test_shared_experts_and_mla_add_their_measured_host_time():
    base = overhead.layer_host(replace(LLAMA, experts=8, top_k=2, expert_ffn=1024), True)
    shared = overhead.layer_host(replace(LLAMA, experts=8, top_k=2, expert_ffn=1024, shared_experts=1), True)
    assert shared == pytest.approx(tuple(a + m for a, m in zip(base, overhead.MLP_HOST)))
    mla = overhead.layer_host(load_model("deepseek-v3"), False)
    assert mla == pytest.approx(tuple(a + m for a, m in zip(overhead.LAYER_HOST[False], overhead.MLA_EXTRA_HOST)))


def test_a_negative_host_call_time_is_refused_naming_the_field():
    with pytest.raises(UserError, match="host_linear_s must be >= 0"):
        replace(GB200, host_linear_s=-1e-6).validate()


def test_cuda_graphs_leave_the_host_a_launch_and_a_moe_layers_eager_dispatch():
    graphs = GB200.with_software(cuda_graphs=True)
    plain = Layout.parse("dp=8,mbs=1", 8)
    f, b = overhead.framework_seconds(LLAMA, graphs, plain, 4, 0, False)
    assert f == b == pytest.approx(4 * overhead.LINEAR_HOST * GB200.host_linear_s)  # one graph a layer each way
    eager = overhead.layer_host(SMALL_MOE, True, graphs=True)
    assert eager == pytest.approx(tuple(m - r + overhead.LINEAR_HOST
                                        for m, r in zip(overhead.MOE_BLOCK_HOST, overhead.ROUTER_HOST)))
    assert 0 < eager[0] < overhead.layer_host(SMALL_MOE, True)[0]
    moe = Layout.parse("dp=4,ep=4,mbs=1", 4)
    steps = [predict(SMALL_MOE, c, moe, 8).step_time_s for c in (NO_HOST, graphs, GB200)]
    assert steps[0] < steps[1] < steps[2]


@pytest.mark.parametrize("software, why", [({"cuda_graphs": True, "framework": "torch"}, "with torch"),
                                           ({"cuda_graphs": "yes"}, "got 'yes'")])
def test_cuda_graphs_are_megatron_cores_and_a_bool(software, why):
    with pytest.raises(UserError, match=f"cuda_graphs is Megatron-Core's.*{why}"):
        GB200.with_software(**software)


def test_a_calibrated_machine_takes_no_cuda_graphs():
    with pytest.raises(UserError, match="cuda_graphs"):
        replace(NO_HOST, software=replace(GB200.software, cuda_graphs=True))


def test_predict_says_how_long_the_device_waits_for_its_host():
    layout = Layout.parse("dp=4,ep=4,mbs=1", 4)
    waits, free = predict(SMALL_MOE, GB200, layout, 8), predict(SMALL_MOE, NO_HOST, layout, 8)
    assert free.host_wait_s == 0.0 and waits.host_wait_s > 0.5 * waits.compute_s
    assert waits.host_wait_s == pytest.approx(waits.compute_s - free.compute_s)
    assert waits.to_dict()["host_wait_s"] == waits.host_wait_s
    # the wait outlasts the kernels: the host bounds the step, and the plan's terms split it from the compute
    assert (waits.bound, free.bound) == ("host", "compute")
    terms = components(waits)
    assert terms["host wait"] == waits.host_wait_s and terms["compute"] == pytest.approx(free.compute_s)
    assert sum(terms.values()) == pytest.approx(waits.step_time_s, rel=1e-12)
    shown = io.StringIO()
    report.print_prediction(waits, Console(file=shown, width=200))
    assert "of which waiting on the host" in shown.getvalue()
    assert "host-bound: the devices wait" in shown.getvalue()
    assert "[software] cuda_graphs = true" in shown.getvalue()
    shown = io.StringIO()
    report.print_prediction(free, Console(file=shown, width=200))
    assert "waiting on the host" not in shown.getvalue() and "cuda_graphs" not in shown.getvalue()
