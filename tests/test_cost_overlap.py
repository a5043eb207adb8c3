"""Which communication hides behind compute: the [software] options of a ClusterSpec (cost/step.py)."""

from dataclasses import replace

import pytest

from meshscale.cost import predict
from meshscale.errors import UserError
from meshscale.specs.cluster import PRESETS, Software, load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model

H100 = load_cluster("h100-80gb")
MODEL = load_model("llama3-8b")


def run(layout: str, devices: int, batch: int, **software):
    cluster = H100.with_software(**software)
    pred = predict(MODEL, cluster, Layout.parse(layout, devices), batch)
    return pred, {(e["axis"], e["collective"]): e for e in pred.comm}


def test_defaults_follow_megatron_core_and_fsdp2():
    assert H100.software == Software(grad_reduce_overlap=True, param_gather_overlap=True, fsdp_prefetch=True,
                                     tp_comm_overlap=False, ep_comm_overlap=False)


def test_gradient_reduction_hides_behind_backward_only_when_overlapped():
    on, ops_on = run("dp=16,mbs=1", 16, 16)
    off, ops_off = run("dp=16,mbs=1", 16, 16, grad_reduce_overlap=False)
    ar_on, ar_off = ops_on["dp", "all_reduce"], ops_off["dp", "all_reduce"]
    assert ar_off["exposed_s"] == ar_off["time_s"] and ar_on["exposed_s"] < ar_on["time_s"]
    assert on.step_time_s < off.step_time_s


def test_zero1_parameter_gather_hides_behind_the_next_forward():
    on, ops_on = run("dp=16,zero=1,mbs=1", 16, 16)
    off, ops_off = run("dp=16,zero=1,mbs=1", 16, 16, param_gather_overlap=False)
    assert ops_off["dp", "all_gather"]["exposed_s"] == ops_off["dp", "all_gather"]["time_s"]
    assert ops_on["dp", "all_gather"]["exposed_s"] < ops_on["dp", "all_gather"]["time_s"]
    assert on.step_time_s < off.step_time_s


def test_fsdp_prefetch():
    on, ops_on = run("dp=16,zero=3,mbs=1", 16, 16)
    off, ops_off = run("dp=16,zero=3,mbs=1", 16, 16, fsdp_prefetch=False)
    for kind in ("all_gather", "reduce_scatter"):
        assert ops_off["dp", kind]["exposed_s"] == ops_off["dp", kind]["time_s"]
        assert ops_on["dp", kind]["exposed_s"] < ops_on["dp", kind]["time_s"]
    assert on.step_time_s < off.step_time_s


def test_tp_comm_overlap_hides_sp_collectives_behind_their_gemms():
    off, ops_off = run("tp=8,sp=true,mbs=1", 8, 4)
    on, ops_on = run("tp=8,sp=true,mbs=1", 8, 4, tp_comm_overlap=True)
    for kind in ("all_gather", "reduce_scatter"):
        assert ops_off["tp", kind]["exposed_s"] == ops_off["tp", kind]["time_s"]
        # decomposed into tp ring steps behind the GEMM: the first step shows
        assert ops_on["tp", kind]["exposed_s"] == pytest.approx(ops_on["tp", kind]["time_s"] / 8)
    assert on.step_time_s < off.step_time_s
    assert on.comm and all(0 <= e["exposed_s"] <= e["time_s"] for e in on.comm)


def test_the_qkv_gather_runs_alone_where_megatron_disables_its_overlap():
    """tp_overlap_disable_qkv (Megatron-Core's tp_comm_overlap_disable_qkv): each layer's forward all-gather before
    its QKV projection shows in full, every micro-batch; the other all-gathers stay behind their GEMMs. Only
    Megatron-Core has the switch."""
    def gathers(pred):  # {overlap class: entry}
        return {e["overlap"]: e for e in pred.comm if e["axis"] == "tp" and e["collective"] == "all_gather"}

    on, _ = run("tp=8,sp=true,mbs=1", 8, 4, tp_comm_overlap=True)
    alone, _ = run("tp=8,sp=true,mbs=1", 8, 4, tp_comm_overlap=True, tp_overlap_disable_qkv=True)
    before, after = gathers(on), gathers(alone)
    assert set(before) == {"gemm"} and set(after) == {"gemm", "none"}
    qkv = after["none"]
    assert qkv["calls"] == MODEL.layers * 4 and qkv["exposed_s"] == qkv["time_s"] > 0
    assert qkv["calls"] + after["gemm"]["calls"] == before["gemm"]["calls"]
    assert after["gemm"]["exposed_s"] == pytest.approx(after["gemm"]["time_s"] / 8)
    assert alone.step_time_s > on.step_time_s
    with pytest.raises(UserError, match="tp_overlap_disable_qkv is Megatron-Core's"):
        H100.with_software(framework="torch", tp_overlap_disable_qkv=True)


def test_collective_matmul_of_the_all_gathers_alone_leaves_the_reduce_scatters_exposed():
    """tp_overlap_scatters = false (XLA's --xla_tpu_decompose_all_gather_einsum without its reduce-scatter twin):
    the all-gathers hide behind their GEMMs as under tp_comm_overlap, the reduce-scatters show in full; the TPU
    presets run SP's backward reduce-scatter beside the weight gradients (XLA's async collective fusions)."""
    both, ops_both = run("tp=8,sp=true,mbs=1", 8, 4, tp_comm_overlap=True)
    gathers, ops = run("tp=8,sp=true,mbs=1", 8, 4, tp_comm_overlap=True, tp_overlap_scatters=False)
    assert ops["tp", "all_gather"]["exposed_s"] == ops_both["tp", "all_gather"]["exposed_s"]
    scatters = [e for e in gathers.comm if e["axis"] == "tp" and e["collective"] == "reduce_scatter"]
    assert scatters and all(e["exposed_s"] == e["time_s"] > 0 for e in scatters)
    assert both.step_time_s < gathers.step_time_s
    assert all(load_cluster(n).software.tp_wgrad_overlap for n in ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"))
    # on a TPU slice every framework compiles through XLA, so both switches stand under any of them
    assert load_cluster("tpu-v5p").with_software(framework="torch", tp_comm_overlap=True).software.tp_wgrad_overlap
    with pytest.raises(UserError, match="tp_wgrad_overlap is Megatron-LM's"):
        H100.with_software(framework="torch", tp_wgrad_overlap=True)


def test_sp_input_gradient_reduce_scatter_hides_behind_the_weight_gradient():
    def reduce_scatters(pred):  # {overlap class as run: entry}
        return {e["overlap"]: e for e in pred.comm if e["axis"] == "tp" and e["collective"] == "reduce_scatter"}

    off, ops_off = run("tp=8,sp=true,mbs=1", 8, 4)
    on, ops_on = run("tp=8,sp=true,mbs=1", 8, 4, tp_wgrad_overlap=True)
    assert all(e["exposed_s"] == e["time_s"] > 0 for e in off.comm if e["axis"] == "tp")
    rs = reduce_scatters(on)
    # forward (row-parallel outputs, the embedding) and backward (column-parallel input gradients, the head):
    # as many bytes each; only the backward's hide, behind the weight gradients computed meanwhile
    assert set(rs) == {"none", "wgrad"} and rs["none"]["bytes"] == rs["wgrad"]["bytes"]
    assert rs["none"]["exposed_s"] == rs["none"]["time_s"] and rs["wgrad"]["exposed_s"] < rs["wgrad"]["time_s"]
    assert ops_on["tp", "all_gather"]["exposed_s"] == ops_on["tp", "all_gather"]["time_s"]
    # what hides still slows the weight-gradient GEMMs beside it by its kernels' share of the SMs
    hidden = rs["wgrad"]["time_s"] - rs["wgrad"]["exposed_s"]
    assert rs["wgrad"]["interference_s"] == pytest.approx(hidden * 24 / 132)
    assert off.step_time_s - on.step_time_s == pytest.approx(hidden - rs["wgrad"]["interference_s"])
    # over a slow link the weight gradients cannot hide it all
    slow = replace(H100, tiers=(replace(H100.tiers[0], bandwidth=5e9),) + H100.tiers[1:],
                   software=replace(H100.software, tp_wgrad_overlap=True))
    part = reduce_scatters(predict(MODEL, slow, Layout.parse("tp=8,sp=true,mbs=1", 8), 4))["wgrad"]
    assert 0 < part["exposed_s"] < part["time_s"]


def test_software_section_in_a_cluster_file_overrides_the_base_key_by_key(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('base = "h100-80gb"\n[software]\ntp_comm_overlap = true\n')
    cluster = load_cluster(str(path))
    assert cluster.software == replace(PRESETS["h100-80gb"].software, tp_comm_overlap=True)
    bad = tmp_path / "bad.toml"
    bad.write_text('base = "h100-80gb"\n[software]\noverlap_everything = true\n')
    with pytest.raises(UserError, match="overlap_everything"):
        load_cluster(str(bad))


def test_moe_all_to_all_hides_behind_another_micro_batch():
    mixtral = load_model("mixtral-8x7b")
    layout = Layout.parse("dp=8,ep=8,pp=2,mbs=1", 16)
    ops = {}
    for overlap in (False, True):
        cluster = H100.with_software(ep_comm_overlap=overlap)
        ops[overlap] = next(e for e in predict(mixtral, cluster, layout, 64).comm if e["axis"] == "ep")
    assert ops[False]["exposed_s"] == ops[False]["time_s"]
    assert ops[True]["exposed_s"] < ops[True]["time_s"]
    dualpipe = predict(mixtral, H100, Layout.parse("dp=8,ep=8,pp=2,schedule=dualpipev,mbs=1", 16), 64)
    ep = next(e for e in dualpipe.comm if e["axis"] == "ep")
    assert ep["exposed_s"] < ep["time_s"]  # DualPipe pairs a forward with a backward chunk by design
