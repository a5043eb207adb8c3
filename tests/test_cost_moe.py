"""MoE as it costs (cost model only, no torch): dispatch and combine by NCCL's all-to-all or DeepEP for the
tiers they cross, the SMs those kernels take from overlapped compute, routing's memory traffic, and the
routing-imbalance knob."""

import json
import re
from dataclasses import replace

import pytest

from meshscale.cost import predict
from meshscale.cost.comm import DEEPEP_NVLINK, DEEPEP_SMS, deepep_seconds, group_link
from meshscale.cost.kernels import Gemm, gemm_pass_seconds, gemm_seconds, layer_gemms, layer_passes, routing_seconds
from meshscale.errors import UserError
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model

H100 = load_cluster("h100-80gb")
MIXTRAL = load_model("mixtral-8x7b")


def with_software(cluster=H100, **software):
    return replace(cluster, software=replace(cluster.software, **software))


def ep_entry(pred) -> dict:
    return next(e for e in pred.comm if e["axis"] == "ep")


def test_imbalance_slows_the_busiest_ranks_experts_and_dispatch():
    layout = Layout.parse("dp=8,ep=8,mbs=1", 8)
    even = predict(MIXTRAL, H100, layout, 8)
    skew = predict(MIXTRAL, with_software(moe_imbalance=1.5), layout, 8)
    assert ep_entry(skew)["time_s"] == pytest.approx(1.5 * ep_entry(even)["time_s"])
    assert ep_entry(skew)["bytes"] == ep_entry(even)["bytes"]  # the ledger's bytes are the mean rank's
    assert skew.compute_s > even.compute_s
    tokens = 4096.0
    routed = [g for g in layer_gemms(MIXTRAL, 0, layout, tokens, 1.5) if g.batch > 1]
    assert all(g.m == pytest.approx(1.5 * tokens * 2) for g in routed)  # top-2 of 8 experts, one a rank
    # without EP every rank holds every expert: nothing to wait for
    assert layer_gemms(MIXTRAL, 0, Layout(), tokens, 1.5) == layer_gemms(MIXTRAL, 0, Layout(), tokens)


@pytest.mark.parametrize("n, k", [(4096, 7168), (7168, 2048)])
def test_grouped_gemms_lose_throughput_with_few_tokens_per_expert_as_deepgemm_measured(n, k):
    """DeepGEMM's H800 scan (kernels.GROUPED_GEMM_EFFICIENCY): 4 groups of 256 tokens run at 0.70-0.74 of a dense
    M=4096 GEMM's throughput, 1 group of 1024 at 0.79-0.97, 8 groups of 4096 at >= 1. The expert GEMMs of a
    layer carry it; attention's batched GEMMs (not grouped) do not."""
    peak = H100.gemm_peak("fp8")
    dense = 2 * 4096 * n * k / gemm_seconds(H100, 4096, n, k, peak, 1)

    def ratio(groups, m):
        f, b, _ = gemm_pass_seconds(H100, (Gemm(m, n, k, groups, True),), peak, 1)
        return 2 * groups * m * n * k / f / dense

    assert 0.65 < ratio(4, 256) < 0.80  # the table holds the two shapes' mean: 0.79 and 0.67
    assert 0.75 < ratio(1, 1024) < 0.98
    assert ratio(8, 4096) > 0.98
    f_batched = gemm_pass_seconds(H100, (Gemm(256, n, k, 4),), peak, 1)[0]
    assert f_batched == pytest.approx(gemm_seconds(H100, 256, n, k, peak, 1, 4))
    experts = [g for g in layer_gemms(MIXTRAL, 0, Layout(mbs=1), 4096.0) if g.batch > 1]
    assert len(experts) == 2 and all(g.grouped for g in experts)


def test_routing_is_memory_traffic_in_both_passes():
    tokens = 4096.0
    bytes_ = 3 * 4 * tokens * MIXTRAL.experts + 2 * (1 + MIXTRAL.top_k) * tokens * MIXTRAL.hidden * 2
    assert routing_seconds(MIXTRAL, H100, tokens, 2) == pytest.approx(bytes_ / H100.achieved_hbm_bandwidth)
    layout = Layout(mbs=1)
    gemms = layer_gemms(MIXTRAL, 0, layout, tokens)
    f, b, _ = gemm_pass_seconds(H100, gemms, H100.gemm_peak("bf16"), 2)
    passes = layer_passes(MIXTRAL, H100, layout, True, "bf16")
    routing = routing_seconds(MIXTRAL, H100, tokens, 2)
    assert passes.forward >= f + routing
    assert passes.backward >= b + routing


def test_deepep_at_its_measured_fractions_of_each_tier():
    v, calls = 8e9, 100
    inside = group_link(H100, 8, 8, 1)  # EP8 inside a DGX H100
    t = deepep_seconds(v, calls, 8, inside, H100)
    assert t > 7 / 8 * v / (450e9 * DEEPEP_NVLINK)
    assert t < 7 / 8 * v / (450e9 * DEEPEP_NVLINK) + calls * 100e-6
    across = group_link(H100, 16, 16, 1)  # EP16 over two nodes: half leaves through each rank's NIC
    assert deepep_seconds(v, calls, 16, across, H100) > 8 / 16 * v / (50e9 * 0.86)
    # DeepEP's NVLink kernels beat NCCL's all-to-all at its ring ceiling; across nodes both are NIC-bound
    deepep = with_software(moe_dispatcher="deepep")
    nccl_in = ep_entry(predict(MIXTRAL, H100, Layout.parse("dp=8,ep=8,mbs=1", 8), 8))["time_s"]
    deep_in = ep_entry(predict(MIXTRAL, deepep, Layout.parse("dp=8,ep=8,mbs=1", 8), 8))["time_s"]
    assert deep_in < nccl_in
    nccl_out = ep_entry(predict(MIXTRAL, H100, Layout.parse("dp=8,ep=8,tp=2,mbs=1", 16), 16))
    assert nccl_out["tier"] == "nvlink+ib"  # EP strided over the TP ranks leaves the node
    assert nccl_out["time_s"] > 4 / 8 * nccl_out["bytes"] / (50e9 * 0.85)  # each rank's share of its own NIC


def test_dispatch_kernels_take_sms_from_the_compute_they_hide_behind():
    layout = Layout.parse("dp=8,ep=8,mbs=1", 8)
    for dispatcher, sms in (("deepep", DEEPEP_SMS), ("alltoall", 24)):  # NCCL: one block per channel
        cluster = with_software(moe_dispatcher=dispatcher, ep_comm_overlap=True)
        e = ep_entry(predict(MIXTRAL, cluster, layout, 64))  # 8 micro-batches: all but the first hide
        shown = e["time_s"] / 8
        assert e["exposed_s"] == pytest.approx(shown)
        assert e["interference_s"] == pytest.approx((e["time_s"] - shown) * sms / 132)


@pytest.mark.parametrize("software, needle", [({"moe_imbalance": 0.9}, "moe_imbalance must be >= 1"),
                                              ({"moe_dispatcher": "hybridep"}, "moe_dispatcher must be"),
                                              ])
def test_bad_moe_knobs_are_one_line(tmp_path, software, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"base": "h100-80gb", "software": software}))
    with pytest.raises(UserError, match=re.escape(needle)) as e:
        load_cluster(str(path))
    assert "\n" not in str(e.value)
    path.write_text(json.dumps({"base": "tpu-v5p", "software": {"moe_dispatcher": "deepep"}}))
    with pytest.raises(UserError, match="NVIDIA cluster"):
        load_cluster(str(path))


def test_megatron_fsdp_gathers_a_layers_experts_in_one_collective():
    """zero=3 with EP: Megatron-FSDP (framework megatron-core) launches one expert all-gather and one reduce-
    scatter per layer over the expert data-parallel group; the runtime's FSDP2 (framework torch) one per
    expert. Same bytes, fewer latency-bound launches: the step is faster under Megatron-FSDP."""
    model = MIXTRAL
    layout = Layout.parse("dp=64,zero=3,ep=2,mbs=1", 64)  # 4 experts a rank
    m = layout.microbatches(64)
    runs = {fw: predict(model, with_software(framework=fw), layout, 64) for fw in ("megatron-core", "torch")}
    edp = {fw: {e["collective"]: e for e in p.comm if e["axis"] == "edp"} for fw, p in runs.items()}
    for layers_units, fw in ((model.layers + 1, "megatron-core"), (model.layers * 4 + 1, "torch")):
        assert edp[fw]["all_gather"]["calls"] == m * (2 * layers_units - 1)
        assert edp[fw]["reduce_scatter"]["calls"] == m * layers_units
    assert edp["megatron-core"]["all_gather"]["bytes"] == edp["torch"]["all_gather"]["bytes"]
    assert edp["megatron-core"]["all_gather"]["time_s"] < edp["torch"]["all_gather"]["time_s"]
    assert runs["megatron-core"].step_time_s < runs["torch"].step_time_s
