"""MoE as it costs (cost model only, no torch): dispatch and combine by NCCL's all-to-all or DeepEP for the
tiers they cross, the SMs those kernels take from overlapped compute, routing's memory traffic, and the
routing-imbalance knob."""

import json
import math
import re
from dataclasses import replace

import pytest

from meshscale.cost import predict
from meshscale.cost import comm
from meshscale.cost.comm import DEEPEP_NVLINK, DISPATCHERS, deepep_seconds, distinct_groups, group_link
from meshscale.cost.kernels import Gemm, gemm_pass_seconds, gemm_seconds, layer_gemms, layer_passes, routing_seconds
from meshscale.cost.memory import memory_per_device
from meshscale.errors import UserError
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model

H100 = load_cluster("h100-80gb")
MIXTRAL = load_model("mixtral-8x7b")
QWEN3 = load_model("qwen3-235b-a22b")


def with_software(cluster=H100, **software):
    return cluster.with_software(**software)


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
    skewed = with_software(moe_imbalance=1.5).software
    routed = [g for g in layer_gemms(MIXTRAL, 0, layout, tokens, skewed) if g.batch > 1]
    assert all(g.m == pytest.approx(1.5 * tokens * 2) for g in routed)  # top-2 of 8 experts, one a rank
    # without EP every rank holds every expert: nothing to wait for
    assert layer_gemms(MIXTRAL, 0, Layout(), tokens, skewed) == layer_gemms(MIXTRAL, 0, Layout(), tokens)


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


def test_routing_is_memory_traffic_in_both_passes_at_the_permute_kernels_measured_rate():
    """The router's logits at the memory rate; the permute and unpermute's copies at the share of it their
    kernels reached on an H200 (kernels.PERMUTE_EFFICIENCY): torch's ops, Megatron-Core's default, several
    times slower than Transformer Engine's fused ones ([software] moe_permute_fusion)."""
    tokens, rate = 4096.0, H100.achieved_hbm_bandwidth
    router = 3 * 4 * tokens * MIXTRAL.experts
    permute = 2 * (1 + MIXTRAL.top_k) * tokens * MIXTRAL.hidden * 2
    fused = with_software(moe_permute_fusion=True)
    assert routing_seconds(MIXTRAL, H100, tokens, 2) == pytest.approx(router / rate + permute / (rate * 0.15))
    assert routing_seconds(MIXTRAL, fused, tokens, 2) == pytest.approx(router / rate + permute / (rate * 0.76))
    layout = Layout.parse("dp=8,ep=8,mbs=1", 8)
    assert predict(MIXTRAL, fused, layout, 8).compute_s < predict(MIXTRAL, H100, layout, 8).compute_s
    layout = Layout(mbs=1)
    gemms = layer_gemms(MIXTRAL, 0, layout, tokens)
    f, b, _ = gemm_pass_seconds(H100, gemms, H100.gemm_peak("bf16"), 2)
    passes = layer_passes(MIXTRAL, H100, layout, True, "bf16")
    routing = routing_seconds(MIXTRAL, H100, tokens, 2)
    assert passes.forward >= f + routing
    assert passes.backward >= b + routing


@pytest.mark.parametrize("software, why", [({"moe_permute_fusion": True, "framework": "torch"}, "with torch"),
                                           ({"moe_permute_fusion": 1}, "got 1")])
def test_permute_fusion_is_megatron_cores_and_a_bool(software, why):
    with pytest.raises(UserError, match=f"moe_permute_fusion is Megatron-Core's.*{why}"):
        with_software(**software)


def test_a_grouped_weight_gradient_slows_with_few_tokens_per_expert_as_the_h200_scan_measured():
    """Tokens are the weight gradient's K: at 128 a group it ran at 0.68 of what the tile model charges on an
    H200 (kernels.GROUPED_WGRAD_EFFICIENCY), at 1,024 and more at 0.93; a dense GEMM's is the tile model's."""
    peak, n, k = H100.gemm_peak("bf16"), 3072, 4096

    def wgrad(m, grouped):
        return gemm_pass_seconds(H100, (Gemm(m, n, k, 16, grouped),), peak, 2)[2]

    assert wgrad(128, True) == pytest.approx(wgrad(128, False) / 0.68)
    assert wgrad(4096, True) == pytest.approx(wgrad(4096, False) / 0.93)
    assert wgrad(128, False) / wgrad(128, True) < wgrad(512, False) / wgrad(512, True) < 0.93


def test_deepep_at_its_measured_fractions_of_each_tier():
    v, calls = 8e9, 100
    inside = group_link(H100, 8, 8, 1)  # EP8 inside a DGX H100
    t = deepep_seconds(v, calls, 8, inside, H100)  # no model: every byte once over NVLink, its own rank's too
    assert t > v / (450e9 * DEEPEP_NVLINK)
    assert t < v / (450e9 * DEEPEP_NVLINK) + calls * 100e-6
    across = group_link(H100, 16, 16, 1)  # EP16 over two nodes: half leaves through each rank's NIC
    assert deepep_seconds(v, calls, 16, across, H100) > 8 / 16 * v / (50e9 * 0.86)
    # DeepEP sends a token once to each rank holding its experts: fine-grained experts (Qwen3's 128, top-8: 5.3
    # ranks a token) go faster than NCCL's all-to-all of every copy; with one expert a rank (Mixtral) nothing is
    # saved and the two run near the same rate (DeepEP's 0.78 of NVLink, its own rank's rows included)
    deepep = with_software(moe_dispatcher="deepep")
    fine = replace(QWEN3, layers=2)
    layout = Layout.parse("dp=8,ep=8,mbs=1", 8)
    assert ep_entry(predict(fine, deepep, layout, 8))["time_s"] < ep_entry(predict(fine, H100, layout, 8))["time_s"]
    nccl_in = ep_entry(predict(MIXTRAL, H100, layout, 8))["time_s"]
    deep_in = ep_entry(predict(MIXTRAL, deepep, layout, 8))["time_s"]
    assert 0.8 < deep_in / nccl_in < 1.25
    nccl_out = ep_entry(predict(MIXTRAL, H100, Layout.parse("dp=8,ep=8,tp=2,mbs=1", 16), 16))
    assert nccl_out["tier"] == "nvlink+ib"  # EP strided over the TP ranks leaves the node
    nic = H100.tiers[-1]
    assert nccl_out["time_s"] > 4 / 8 * nccl_out["bytes"] / (nic.bandwidth * nic.efficiency)  # its share of its NIC


def test_dispatch_kernels_take_sms_from_the_compute_they_hide_behind():
    layout = Layout.parse("dp=8,ep=8,mbs=1", 8)
    # DeepEP's 20 SMs, Hybrid-EP's 16 (Megatron-Core's defaults), NCCL's one block per channel
    for dispatcher, sms in (("deepep", 20), ("hybridep", 16), ("alltoall", 24)):
        cluster = with_software(moe_dispatcher=dispatcher, ep_comm_overlap=True)
        e = ep_entry(predict(MIXTRAL, cluster, layout, 64))  # 8 micro-batches: all but the first hide
        shown = e["time_s"] / 8
        assert e["exposed_s"] == pytest.approx(shown)
        assert e["interference_s"] == pytest.approx((e["time_s"] - shown) * sms / 132)


@pytest.mark.parametrize("software, needle", [({"moe_imbalance": 0.9}, "moe_imbalance must be >= 1"),
                                              ({"moe_dispatcher": "pplx"}, "moe_dispatcher must be"),
                                              ({"moe_dispatcher": "hybridep", "framework": "torch"},
                                               'moe_dispatcher = "hybridep" is Megatron-Core\'s'),
                                              ])
def test_bad_moe_knobs_are_one_line(tmp_path, software, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"base": "h100-80gb", "software": software}))
    with pytest.raises(UserError, match=re.escape(needle)) as e:
        load_cluster(str(path))
    assert "\n" not in str(e.value)
    for dispatcher in DISPATCHERS:
        path.write_text(json.dumps({"base": "tpu-v5p", "software": {"moe_dispatcher": dispatcher}}))
        with pytest.raises(UserError, match="NVIDIA cluster"):
            load_cluster(str(path))


def test_gshard_einsum_dispatch_pads_every_expert_to_capacity_and_multiplies_by_its_masks():
    """GShard's dispatcher (MaxText's dense_matmul with a capacity factor): every expert computes its whole buffer,
    capacity_factor x its balanced share, and each sequence's tokens go in and out by two GEMMs against one-hot
    masks of 2 s h (cf k s) FLOPs each, the dispatch mask taking no gradient; no permute. The all-to-alls move the
    padded buffers. Dropless routing with a capacity drops what is over it, so it caps the busiest rank's share."""
    from meshscale.cost.kernels import expert_load, layer_gemm_parts

    model = replace(MIXTRAL.with_seq(4096), capacity_factor=1.25)
    einsum = load_cluster("tpu-v6e").with_software(moe_dispatcher="einsum")
    layout = Layout.parse("dp=256,zero=3,mbs=8", 256)
    tokens = 8 * 4096
    plain = layer_gemm_parts(model, 0, layout, tokens)["experts"]
    padded = layer_gemm_parts(model, 0, layout, tokens, einsum.software)["experts"]
    assert [g.m for g in padded[:2]] == pytest.approx([1.25 * g.m for g in plain])
    dispatch, combine = padded[2:]
    slots = 1.25 * 2 * 4096
    flops = 2 * 4096 * 4096 * slots * 8
    assert 2 * dispatch.m * dispatch.n * dispatch.k * dispatch.batch == pytest.approx(flops)
    assert 2 * combine.m * combine.n * combine.k * combine.batch == pytest.approx(flops)
    assert not dispatch.weight_grad and combine.weight_grad
    f, b, w = gemm_pass_seconds(einsum, (dispatch,), 1e15, 2)
    assert w == 0 and f > 0 and b > 0
    masks = 2 * tokens * slots * 2 / einsum.achieved_hbm_bandwidth  # written once each, no permute
    router = 3 * 4 * tokens * model.experts / einsum.achieved_hbm_bandwidth
    assert routing_seconds(model, einsum, tokens, 2) == pytest.approx(masks + router)
    assert expert_load(model, einsum.software, 8) == 1.25
    skewed = H100.with_software(moe_imbalance=1.5).software
    assert expert_load(model, skewed, 8) == 1.25 and expert_load(MIXTRAL, skewed, 8) == 1.5
    assert expert_load(model, skewed, 1) == 1.0
    ep = Layout.parse("dp=8,ep=8,mbs=1", 8)
    einsum_h100 = H100.with_software(moe_dispatcher="einsum")
    assert ep_entry(predict(model, einsum_h100, ep, 8))["time_s"] == pytest.approx(
        1.25 * ep_entry(predict(model, H100, ep, 8))["time_s"])
    with pytest.raises(UserError, match="moe_dispatcher = \"einsum\" fills each expert's buffer"):
        predict(MIXTRAL, einsum_h100, ep, 8)


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



def test_deepep_sends_a_token_once_per_rank_and_node_holding_its_experts():
    """DeepEP's dispatch sends each token once to every rank (NVLink) and every node (RDMA) holding one of its
    top_k experts (tests/test_intranode.py counts recv_x, test_internode.py num_rdma_token_sent): under balanced
    routing, groups * (1 - C(E - E/groups, k) / C(E, k)) of them."""
    assert distinct_groups(128, 8, 8) == pytest.approx(8 * (1 - math.comb(112, 8) / math.comb(128, 8)))
    assert 5.2 < distinct_groups(128, 8, 8) < 5.4  # Qwen3 over EP8: 5.3 ranks a token, not 8 copies
    assert distinct_groups(256, 8, 2) == pytest.approx(2 * (1 - math.comb(128, 8) / math.comb(256, 8)))
    assert distinct_groups(8, 2, 8) == pytest.approx(2)  # one expert a rank: every copy to its own rank


def test_deepep_reproduces_its_readme_bandwidths_in_its_own_bytes():
    """DeepEP README (2025-02), H800 (NVLink 200 GB/s nominal one way, DeepEP issue #16; CX7 50 GB/s), DeepSeek-V3's
    setting (4096 tokens of 7168, 256 experts, top-8), bf16: intranode EP8 153-158 GB/s of received rows (its own
    included), internode EP16 43 GB/s of rows sent one per destination node (its own included)."""
    h800 = replace(H100, tiers=(replace(H100.tiers[0], bandwidth=200e9), H100.tiers[1]))
    row = 4096 * 7168 * 2
    inside = group_link(h800, 8, 8, 1)
    t = deepep_seconds(8 * row, 1, 8, inside, h800, 256, 8) - deepep_seconds(0.0, 1, 8, inside, h800, 256, 8)
    assert 150e9 < row * distinct_groups(256, 8, 8) / t < 160e9
    across = group_link(h800, 16, 16, 1)
    t = deepep_seconds(8 * row, 1, 16, across, h800, 256, 8) - deepep_seconds(0.0, 1, 16, across, h800, 256, 8)
    assert 41e9 < row * distinct_groups(256, 8, 2) / t < 45e9
    # on H100-class NVLink (450 GB/s nominal) DeepEP's intranode test measured 337 GB/s (H20, DeepEP issue #16)
    t = deepep_seconds(8 * row, 1, 8, group_link(H100, 8, 8, 1), H100, 256, 8)
    assert 320e9 < row * distinct_groups(256, 8, 8) / (t - deepep_seconds(0.0, 1, 8, inside, H100, 256, 8)) < 380e9


def test_on_nvlink5_the_dispatch_kernels_set_the_rate_not_the_link():
    """NVIDIA's Hybrid-EP benchmarks in DeepEP (Hybrid-EP_Implementation.md, DeepSeek-V3's setting, BF16, the mean
    of dispatch and combine): DeepEP's normal kernels on 8 B200 at their 20 SMs ~391 GB/s of NVLink's 900 (348 and
    302 at 16 SMs, 494 and 420 at 24); Hybrid-EP at 16 SMs on GB200 NVL72 544 GB/s at EP8, 444 at EP36; across
    H100 nodes 53.9 GB/s at EP16 in DeepEP's logical bytes. On Hopper's 450 GB/s NVLink the link binds first."""
    row = 4096 * 7168 * 2

    def rate(cluster, dispatcher, n):  # the bytes the kernels' tests count over the slower tier's time
        link = group_link(cluster, n, n, 1)
        t = deepep_seconds(8 * row, 1, n, link, cluster, 256, 8, dispatcher)
        nodes = n // link.fabric.ppn
        moved = distinct_groups(256, 8, n) if nodes == 1 else distinct_groups(256, 8, nodes)
        return row * moved / (t - deepep_seconds(0.0, 1, n, link, cluster, 256, 8, dispatcher))

    b200, gb200 = load_cluster("b200"), load_cluster("gb200-nvl72")
    assert rate(b200, "deepep", 8) == pytest.approx(391e9, rel=1e-3)
    assert rate(gb200, "hybridep", 8) == pytest.approx(544e9, rel=1e-3)
    assert rate(gb200, "hybridep", 72) == pytest.approx(444e9, rel=1e-3)
    assert rate(H100, "hybridep", 8) == rate(H100, "deepep", 8) == pytest.approx(450e9 * DEEPEP_NVLINK)
    assert rate(H100, "hybridep", 16) == pytest.approx(53.9e9, rel=1e-3)
    assert rate(H100, "deepep", 16) == pytest.approx(43e9, rel=1e-3)


def test_moe_layers_have_no_sp_gather_where_the_dispatcher_takes_the_sp_chunk():
    """Megatron-Core's MoELayer dispatches the sequence-parallel hidden states as they come: under SP with EP a
    MoE layer has the attention region's TP all-gathers and reduce-scatters only (moe_layer.py,
    token_dispatcher.py); without EP, or a dense layer, both regions'. A shared expert gathers the sequence as
    a dense MLP does, and so does meshscale's runtime around every MoE layer (its ledger's bytes)."""
    tokens, m, n = 4096.0, 2, 3
    folded = Layout.parse("dp=2,tp=4,sp=true,ep=8,etp=1", 8)

    def counts(layout, moe_layers, model=QWEN3, megatron=True):
        framework = "megatron-core" if megatron else "torch"
        ops = comm.tensor_parallel_ops(model, layout, tokens, 2, n, False, False, m, 0, moe_layers, framework)
        return {(op.collective, op.overlap): op.calls for op in ops if op.collective != "all_reduce"}

    shared = replace(QWEN3, shared_experts=1)
    assert counts(folded, n, shared) == counts(folded, 0, shared) == counts(folded, n, megatron=False)

    dense, moe = counts(folded, 0), counts(folded, n)
    for key, calls in dense.items():
        assert moe[key] == calls // 2, key  # 4 all-gathers, 2 + 2 reduce-scatters a layer -> 2, 1 + 1
    split = Layout.parse("dp=2,tp=4,sp=true,ep=2", 8)  # etp = tp: the expert-TP gather replaces the MLP's
    assert counts(split, n) == moe
    assert comm.expert_tensor_parallel_ops(QWEN3, split, tokens, 2, n, m)  # ... and is counted there
    assert counts(Layout.parse("dp=2,tp=4,sp=true", 8), n) == dense  # no EP: the MoE region is a TP region


def test_expert_weight_gradients_read_and_write_their_fp32_accumulator():
    """Megatron-Core's TEGroupedLinear accumulates each expert's weight gradient into its fp32 main_grad in the
    GEMM (fuse_wgrad_accumulation): at 512 tokens an expert that traffic (8 bytes an element of 4096 x 3072)
    outweighs the GEMM's FLOPs, so the weight pass is no faster than it (at the achieved HBM rate)."""
    layout = Layout.parse("dp=2,tp=4,sp=true,ep=8,etp=1,mbs=1", 8)
    experts = [g for g in layer_gemms(QWEN3, 0, layout, 4096.0) if g.grouped]
    assert all(g.m == 512 and g.batch == 16 for g in experts)
    accumulate = sum(g.batch * (2 * g.m * (g.n + g.k) + 8 * g.n * g.k) for g in experts) / H100.achieved_hbm_bandwidth
    _, _, w = gemm_pass_seconds(H100, tuple(experts), H100.gemm_peak("bf16"), 2, 2, 4)
    assert w == pytest.approx(accumulate)
    passes = layer_passes(QWEN3, H100, layout, True, "bf16")
    assert passes.weight > accumulate
    # gradients kept in bf16 ([software] grad_reduce_fp32 = false) move half the accumulator bytes
    bf16 = with_software(grad_reduce_fp32=False)
    assert layer_passes(QWEN3, bf16, layout, True, "bf16").weight < passes.weight


def test_folded_expert_state_per_rank_is_the_hand_count():
    """Qwen3-235B as Megatron-MoE-ModelZoo ran it (TP4 EP8 ETP1 PP8 VPP4, DP8, the distributed optimizer): a
    pipeline rank holds 12 layers; each rank 16 whole experts of each (128 / ep, etp = 1); the fp32 master and
    Adam moments of those shard over the expert data-parallel group, tp*dp/(ep*etp) = 4 ranks, the rest over
    dp = 8 (Megatron-Core's distributed optimizer, one buffer per (dtype, is_expert_parallel))."""
    layout = Layout.parse("dp=8,zero=1,tp=4,sp=true,pp=8,vpp=4,schedule=interleaved,ep=8,etp=1,mbs=1", 256)
    assert (layout.edp, layout.expert_tp) == (4, 1)
    experts = 12 * 128 * 3 * 4096 * 1536 / 8
    mem = memory_per_device(QWEN3, layout, 2048)
    dense = mem.params / 2 - experts
    assert 0 < dense < 0.1 * experts  # attention and norms, split by TP
    assert mem.optimizer == pytest.approx(12 * (experts / 4 + dense / 8))
    assert mem.total < H100.hbm_bytes


def test_the_step_waits_for_the_rank_whose_passes_and_collectives_take_longest():
    """Each pipeline rank's collectives are costed on its own layers, its MTP module's included, and the step
    waits for the rank whose compute and exposed collectives take longest. Under DeepSeek-V3's V (dualpipev,
    pp=16) rank 0 holds layer 0 (dense), the MTP module (a MoE layer) and both heads: the slowest compute, and
    with DeepEP's hidden dispatch the rank the step waits for, its all-to-alls the MTP layer's alone (dispatch
    and combine, forward and backward: 4 a micro-batch). Under NCCL's all-to-all the exposed dispatch of the
    ranks holding four MoE layers outweighs rank 0's heads: the step waits for one of them, beyond the span of
    rank 0's passes that every rank's passes take."""
    from meshscale.cost.step import rank_passes

    dsv3, h800 = load_model("deepseek-v3"), load_cluster("h800")
    layout = Layout.parse("dp=128,zero=1,pp=16,schedule=dualpipev,ep=64,mbs=1", 2048)
    m = 15360 // 128
    compute = [m * rank_passes(dsv3, h800, layout, r, "fp8").total for r in range(16)]
    assert max(range(16), key=compute.__getitem__) == 0

    def ep_calls(cluster):
        p = predict(dsv3, cluster, layout, 15360, "fp8")
        return p, sum(e["calls"] for e in p.comm if e["axis"] == "ep")

    deepep, calls = ep_calls(with_software(h800, moe_dispatcher="deepep"))
    assert calls == 4 * m and deepep.compute_s == pytest.approx(compute[0])
    nccl, calls = ep_calls(h800)
    assert calls == 4 * 4 * m and nccl.compute_s == pytest.approx(compute[0]) and nccl.comm_rank != 0
    assert nccl.compute_s + nccl.exposed_comm_s > compute[0] + deepep.exposed_comm_s
