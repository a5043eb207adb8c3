"""[software] options beyond overlap: the gradient reduction dtype, fused element-wise kernels, the framework's
gradient buckets (and the planner's bound under them and the wgrad overlap)."""

import json
import math
import re
from dataclasses import replace

import pytest

from meshscale.cost import predict
from meshscale.cost.comm import grad_buckets
from meshscale.cost.memory import params_on_rank
from meshscale.errors import UserError
from meshscale.cost.overhead import LINEAR_HOST
from meshscale.cost.step import eager_forward_elements, elementwise_seconds, rank_passes
from meshscale.plan.search import search
from meshscale.sim.step import simulate
from meshscale.specs.cluster import FRAMEWORK_SWITCHES, load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec, load_model

from boundcheck import bounds_and_memory_hold  # noqa: E402

A100 = load_cluster("a100-80gb")
MODEL = load_model("llama3-8b")


def with_software(**software):
    return A100.with_software(**software)


def dp_bytes(pred) -> dict:
    return {e["collective"]: e["bytes"] for e in pred.comm if e["axis"] == "dp"}


def test_gradients_reduce_in_the_compute_dtype_when_not_fp32():
    for layout in ("dp=16,mbs=1", "dp=16,zero=1,mbs=1", "dp=16,zero=3,mbs=1", "dp=16,zero=1,shard=8,mbs=1"):
        fp32 = predict(MODEL, A100, Layout.parse(layout, 16), 16)
        half = predict(MODEL, with_software(grad_reduce_fp32=False), Layout.parse(layout, 16), 16)
        grads = "all_reduce" if layout.startswith("dp=16,mbs") else "reduce_scatter"
        assert dp_bytes(half)[grads] == dp_bytes(fp32)[grads] / 2
        assert half.step_time_s <= fp32.step_time_s
        if "zero=1" in layout:  # the parameter all-gather is not a gradient
            assert dp_bytes(half)["all_gather"] == dp_bytes(fp32)["all_gather"]
    # fp32 training has nothing narrower to reduce in
    a = predict(MODEL, A100, Layout.parse("dp=16,mbs=1", 16), 16, precision="fp32")
    b = predict(MODEL, with_software(grad_reduce_fp32=False), Layout.parse("dp=16,mbs=1", 16), 16, precision="fp32")
    assert dp_bytes(a) == dp_bytes(b)


def test_planner_bound_holds_for_half_gradients_eager_kernels_and_wgrad_overlap():
    """Pruning by the vectorised bound keeps the exhaustive ranking under these switches."""
    cluster = with_software(grad_reduce_fp32=False, grad_reduce_overlap=False, fused_elementwise=False,
                            tp_wgrad_overlap=True)
    fast = search(MODEL, cluster, 16, 64, top=5, fix={"pp": 1, "cp": 1, "zero": 1})  # TP with SP wins
    full = search(MODEL, cluster, 16, 64, top=5, fix={"pp": 1, "cp": 1, "zero": 1}, prune=False)
    assert "sp=true" in fast.ranked[0].layout
    assert [p.layout for p in fast.ranked] == [p.layout for p in full.ranked]


def test_eager_elementwise_moves_more_than_fused_and_splits_like_the_layout():
    tokens = 4096.0
    fused = elementwise_seconds(MODEL, A100, Layout(dp=1), tokens, 2)
    eager = elementwise_seconds(MODEL, with_software(fused_elementwise=False), Layout(dp=1), tokens, 2)
    assert eager > 1.5 * fused  # fp32 norms and RoPE, one read and write per operator
    one, tp = eager_forward_elements(MODEL, 1, False), eager_forward_elements(MODEL, 4, False)
    sp = eager_forward_elements(MODEL, 4, True)
    hidden = 42 * MODEL.hidden  # norms and residuals: replicated over TP unless SP splits them
    assert tp - hidden == (one - hidden) / 4
    assert sp == one / 4
    mha = replace(MODEL, name="mha", kv_heads=MODEL.heads)
    q = MODEL.heads * MODEL.head_dim
    assert eager_forward_elements(mha, 1, False) - one == 10 * (q - MODEL.kv_heads * MODEL.head_dim) \
        - 2 * (MODEL.kv_heads * MODEL.head_dim + q)  # no repeat_kv copies without grouped heads


def test_eager_elementwise_counts_the_blocks_own_norms_and_positions():
    """A GPT-style block (LayerNorm under autocast, learned positions) moves 2 x 8 fewer elements per hidden
    element in its norms than torchtitan's fp32 RMSNorm, and runs no RoPE; partial rotary rotates its share."""
    q, kv = MODEL.heads * MODEL.head_dim, MODEL.kv_heads * MODEL.head_dim
    llama = eager_forward_elements(MODEL, 1, False)
    assert eager_forward_elements(replace(MODEL, learned_positions=True), 1, False) == llama - 10 * (q + kv)
    assert eager_forward_elements(replace(MODEL, rotary_fraction=0.25), 1, False) == llama - 7.5 * (q + kv)
    gpt = replace(MODEL, biases=True, learned_positions=True)
    assert eager_forward_elements(gpt, 1, False) == llama - 10 * (q + kv) - 16 * MODEL.hidden


def test_a_low_precision_norm_moves_the_2_byte_activations_once():
    """llm-foundry's low_precision_layernorm: each of the block's two norms reads and writes the activations once
    (2 elements a hidden element), where torchtitan's fp32 RMSNorm moves 18 and an autocast LayerNorm 10; fused
    element-wise kernels are what they were."""
    gpt = replace(MODEL, biases=True, learned_positions=True)
    for model, norm in ((MODEL, 18), (gpt, 10)):
        assert eager_forward_elements(model, 1, False) - eager_forward_elements(model, 1, False, True) \
            == 2 * (norm - 2) * MODEL.hidden
    layout, tokens = Layout(dp=1), 4096.0
    eager, low = (elementwise_seconds(MODEL, with_software(fused_elementwise=False, low_precision_norm=lp), layout,
                                      tokens, 2) for lp in (False, True))
    assert low < eager
    assert elementwise_seconds(MODEL, with_software(low_precision_norm=True), layout, tokens, 2) == \
        elementwise_seconds(MODEL, A100, layout, tokens, 2)


def test_attention_unpadding_copies_q_k_v_and_the_output_and_waits_for_the_host():
    """flash-attn's unpad_input / pad_input around the varlen kernel (llm-foundry's flash_attn_fn): forward, q, k, v
    gathered (2 elements moved each) and the output put into zeros (3); backward, their gradients scattered into
    zeros (3 each) and the output's indexed (2); a full recompute unpads again. Each unpad_input waits for the
    device twice, and the device then idles through the host's next call: three such waits a layer's forward."""
    gqa = replace(MODEL, kv_heads=8, heads=32)
    q, kv = 4096, 8 * 128
    for recompute, forwards in (("none", 1), ("full", 2)):
        layout, tokens = Layout.parse(f"dp=1,recompute={recompute}"), 1.0
        extra = (elementwise_seconds(gqa, with_software(attention_unpad=True), layout, tokens, 2)
                 - elementwise_seconds(gqa, A100, layout, tokens, 2))
        moved = forwards * (2 * (q + 2 * kv) + 3 * q) + 3 * (q + 2 * kv) + 2 * q
        assert extra * A100.achieved_hbm_bandwidth == pytest.approx(gqa.layers * moved * 2)
    layout = Layout.parse("dp=8,zero=3,mbs=1", 8)
    plain, unpadded = (predict(MODEL, with_software(attention_unpad=u), layout, 8) for u in (False, True))
    copies = elementwise_seconds(MODEL, with_software(attention_unpad=True), layout, MODEL.seq, 2) - \
        elementwise_seconds(MODEL, A100, layout, MODEL.seq, 2)
    waits = 3 * MODEL.layers * LINEAR_HOST * A100.host_linear_s
    assert unpadded.compute_s - plain.compute_s == pytest.approx(copies + waits, rel=0.05)


def test_eager_elementwise_lengthens_the_step_more_with_full_recompute():
    def step(recompute, **software):
        layout = Layout.parse(f"dp=8,zero=3,mbs=1,recompute={recompute}", 8)
        return predict(MODEL, with_software(**software), layout, 8).compute_s

    extra_none = step("none", fused_elementwise=False) - step("none")
    extra_full = step("full", fused_elementwise=False) - step("full")
    assert 0 < extra_none < extra_full


def test_overlap_efficiency_scales_what_compute_hides():
    """[software] overlap_efficiency: 1 hides what the overlap rules allow, 0 hides nothing, between is
    between (where compute covers the collective, the rest of its time and that share of what shows anyway);
    collectives nothing overlaps are untouched."""
    layout = Layout.parse("dp=64,zero=3,tp=8,mbs=1", 512)
    exposed = {}
    for eff in (0.0, 0.5, 1.0):
        exposed[eff] = [(e["time_s"], e["exposed_s"], e["overlap"], e["hidden_by_s"], e["shown_s"])
                        for e in predict(MODEL, with_software(overlap_efficiency=eff), layout, 512).comm]
    for (t, none, overlap, window, shown), (_, half, *_), (_, full, *_) in zip(*exposed.values()):
        assert none == t and full <= half <= none
        if overlap == "none":
            assert full == t
        elif t - shown <= window:
            assert half == pytest.approx(t / 2 + shown / 2) and full == pytest.approx(shown)
    assert any(full < t for t, full, *_ in exposed[1.0])


def test_control_all_reduces_cost_latency_only():
    """The gradient norm, loss and non-finite all-reduces: latency over their groups, nothing at 1 device.
    Megatron-Core makes one per group; torch's frameworks (our runtime's control exchange) one over every rank."""
    from meshscale.cost.step import control_seconds

    assert control_seconds(A100, 1, Layout()) == 0
    small, large = control_seconds(A100, 64, Layout(dp=64)), control_seconds(A100, 4096, Layout(dp=512, tp=8))
    assert 0 < small < large < 1e-3
    torch_cpu = load_cluster("local-cpu")
    one = control_seconds(torch_cpu, 4, Layout(dp=4))
    assert control_seconds(torch_cpu, 4, Layout(dp=2, tp=2)) == one  # one exchange, whatever the groups
    megatron_cpu = torch_cpu.with_software(framework="megatron-core")
    assert control_seconds(megatron_cpu, 4, Layout(dp=2, tp=2)) > 1.5 * one  # tp, dp and world groups


def test_zero_parameter_gather_travels_in_the_compute_dtype_or_in_fp32():
    """ZeRO-1/2's updated parameters: bf16 in frameworks that keep bf16 model parameters (the presets), fp32
    in our runtime (local-cpu and every calibrated file); the planner's bound follows."""
    params = MODEL.param_count()  # no pipeline or TP: each rank gathers the whole model
    for zero in (1, 2):
        layout = Layout.parse(f"dp=16,zero={zero},mbs=1", 16)
        half = predict(MODEL, A100, layout, 16)
        full = predict(MODEL, with_software(param_gather_fp32=True), layout, 16)
        assert dp_bytes(half)["all_gather"] == pytest.approx(2 * params)
        assert dp_bytes(full)["all_gather"] == pytest.approx(4 * params)
        assert dp_bytes(half)["reduce_scatter"] == dp_bytes(full)["reduce_scatter"]
    assert load_cluster("local-cpu").software.param_gather_fp32
    cluster = with_software(param_gather_fp32=True, param_gather_overlap=False)
    fast = search(MODEL, cluster, 16, 64, top=3, fix={"pp": 1, "cp": 1, "tp": 1})
    full = search(MODEL, cluster, 16, 64, top=3, fix={"pp": 1, "cp": 1, "tp": 1}, prune=False)
    assert [p.layout for p in fast.ranked] == [p.layout for p in full.ranked]


def test_fp8_parameters_gather_one_byte_each_and_need_fp8():
    """Megatron-Core's --fp8-param-gather: the distributed optimizer's all-gather moves FP8 parameters; the
    gradients' reduce-scatter is untouched. Asked of bf16 training, or of a framework without it: one line."""
    h100 = load_cluster("h100-80gb")
    fp8_params = h100.with_software(fp8_param_gather=True)
    layout = Layout.parse("dp=16,zero=1,mbs=1", 16)
    half, quarter = (dp_bytes(predict(MODEL, c, layout, 16, "fp8")) for c in (h100, fp8_params))
    assert quarter["all_gather"] == pytest.approx(half["all_gather"] / 2) == pytest.approx(MODEL.param_count())
    assert quarter["reduce_scatter"] == half["reduce_scatter"]
    with pytest.raises(UserError, match="fp8_param_gather gathers FP8 parameters; it needs --precision fp8"):
        predict(MODEL, fp8_params, layout, 16, "bf16")
    with pytest.raises(UserError, match=r"fp8_param_gather is Megatron-Core's \(--fp8-param-gather\)"):
        h100.with_software(framework="torch", fp8_param_gather=True)


def test_the_precision_aware_optimizer_keeps_remainders_of_the_master_and_bf16_moments():
    """Megatron-Core's --use-precision-aware-optimizer (with its distributed optimizer, zero >= 1): the fp32
    master as 16-bit remainders beside bf16 parameters (fp32 beside FP8 ones), the moments in adam_moments'
    dtype. Without the distributed optimizer it does not apply; the update moves the smaller state."""
    layout = Layout.parse("dp=8,zero=1,mbs=1", 8)
    h100 = load_cluster("h100-80gb")

    def state(precision="bf16", zero1=layout, **software):
        pred = predict(MODEL, h100.with_software(**software), zero1, 8, precision)
        return pred.memory_per_device_bytes["optimizer"], pred.optimizer_s

    (plain, plain_s), (aware, _), (bf16, bf16_s) = (state(**sw) for sw in (
        {}, dict(precision_aware_optimizer=True), dict(precision_aware_optimizer=True, adam_moments="bf16")))
    assert aware == pytest.approx(plain * 10 / 12) and bf16 == pytest.approx(plain * 6 / 12)
    assert bf16_s < plain_s
    fp8_params = state("fp8", precision_aware_optimizer=True, adam_moments="bf16", fp8_param_gather=True)[0]
    assert fp8_params == pytest.approx(plain * 8 / 12)
    replicated = Layout.parse("dp=8,mbs=1", 8)
    assert state(zero1=replicated, precision_aware_optimizer=True)[0] == state(zero1=replicated)[0]
    for software, needle in ((dict(adam_moments="bf16"), "adam_moments must be fp32, or bf16 with "
                                                         "precision_aware_optimizer = true"),
                             (dict(adam_moments="fp16", precision_aware_optimizer=True), "got 'fp16'")):
        with pytest.raises(UserError, match=needle):
            h100.with_software(**software)
    with pytest.raises(UserError, match="precision_aware_optimizer splits a mixed-precision run's fp32 master; "
                                        "it needs --precision bf16, fp8 or mxfp8, got bf16-pure"):
        predict(MODEL, h100.with_software(precision_aware_optimizer=True), layout, 8, "bf16-pure")


def test_the_planners_memory_is_predicts_under_the_precision_aware_optimizer():
    cluster = load_cluster("h100-80gb").with_software(precision_aware_optimizer=True, adam_moments="bf16")
    found = search(MODEL, cluster, 8, 32, top=3, fix={"tp": 1, "pp": 2, "cp": 1}, prune=False)
    costed = bounds_and_memory_hold(MODEL, cluster, found.pool, 32, "bf16")
    assert {Layout.parse(pred.layout).zero for _, pred in costed} == {0, 1, 2, 3}


def test_fp8_attention_runs_the_core_at_cudnns_measured_speed_over_bf16():
    """[software] fp8_attention (Megatron-Core --fp8-dot-product-attention): the attention core's forward and
    backward take cuDNN's measured FP8 time over its bf16 one (cudnn-frontend's H200 and GB200 scans): on Blackwell
    faster both ways, on Hopper a faster forward and, causal from 8k, a slower backward (that release's FP8 causal
    backward nears its unmasked time). Asked of bf16, or of a GPU with no such measurement: one line."""
    from meshscale.cost.kernels import FP8_ATTENTION_GB200, attention_core_seconds, fp8_attention_speed

    row = next(r for r in FP8_ATTENTION_GB200 if r[0] == 8192)
    assert fp8_attention_speed("blackwell", 8192, True) == pytest.approx((row[1] / row[2], row[3] / row[4]))
    forward, backward = fp8_attention_speed("hopper", 8192, True)
    assert forward > 1.4 and backward < 0.85 and min(fp8_attention_speed("hopper", 8192, False)) > 1.0
    model, layout = MODEL.with_seq(8192), Layout.parse("dp=8,mbs=1", 8)
    for name in ("b200", "h100-80gb"):
        cluster = load_cluster(name)
        bf16 = attention_core_seconds(model, cluster, layout, 8192, "fp8")
        fp8 = attention_core_seconds(model, cluster.with_software(fp8_attention=True), layout, 8192, "fp8")
        speed = fp8_attention_speed(cluster.gpu_arch, 8192, True)
        assert (bf16[0] / fp8[0], bf16[1] / fp8[1]) == pytest.approx(speed), name
    b200 = load_cluster("b200")
    assert predict(model, b200.with_software(fp8_attention=True), layout, 8, "fp8").step_time_s < \
        predict(model, b200, layout, 8, "fp8").step_time_s
    with pytest.raises(UserError, match="fp8_attention runs the attention core in FP8; it needs --precision fp8"):
        predict(model, b200.with_software(fp8_attention=True), layout, 8, "bf16")
    with pytest.raises(UserError, match="no FP8 attention data"):
        predict(model, load_cluster("mi300x").with_software(fp8_attention=True), layout, 8, "fp8")


def test_lora_input_gradient_scatters_hide_behind_their_dgrad_gemms_with_rs_dgrad_overlap():
    """Under SP the column-parallel layers' input-gradient reduce-scatter hides behind the weight gradients
    (tp_wgrad_overlap), which a LoRA's frozen weights do not have; Megatron-Core's --tp-comm-overlap-rs-dgrad
    pipelines it with its own dgrad GEMM instead, so only its first ring step shows."""
    model = replace(load_model("llama2-70b").with_seq(8192), lora_rank=16)
    h100 = load_cluster("h100-80gb").with_software(tp_comm_overlap=True, tp_wgrad_overlap=True)
    layout = Layout.parse("dp=2,zero=1,tp=4,sp=true,mbs=1", 8)

    def scatters(cluster):  # the TP reduce-scatters the layers' GEMMs and weight gradients could hide
        pred = predict(model, cluster, layout, 8, "fp8")
        return pred, [e for e in pred.comm if e["axis"] == "tp" and e["collective"] == "reduce_scatter" and
                      e["overlap"] != "none"]

    behind_wgrad, before = scatters(h100)
    pipelined, after = scatters(h100.with_software(tp_overlap_rs_dgrad=True))
    dgrad = next(e for e in before if e["overlap"] == "wgrad")
    assert dgrad["exposed_s"] > 0.8 * dgrad["time_s"]  # frozen weights: little weight gradient to hide behind
    assert [e["overlap"] for e in after] == ["gemm", "gemm"]
    assert all(e["exposed_s"] == pytest.approx(e["time_s"] / 4) for e in after)  # the first of 4 ring steps
    assert pipelined.step_time_s < behind_wgrad.step_time_s


@pytest.mark.parametrize("knob", sorted(FRAMEWORK_SWITCHES))
def test_a_switch_a_framework_does_not_have_is_refused_in_one_line(knob):
    """Each framework-specific [software] switch is accepted on with the frameworks that have it and refused,
    naming itself, the frameworks it needs and the one given, with the others."""
    frameworks, _ = FRAMEWORK_SWITCHES[knob]
    for framework in ("megatron-core", "torch", "deepspeed"):
        if framework in frameworks:
            assert getattr(with_software(framework=framework, **{knob: True}).software, knob) is True
            continue
        with pytest.raises(UserError, match=rf"\[software\] {knob} is .*: true or false with framework = "
                                            rf".*\"{frameworks[0]}\".*got True with {framework}$"):
            with_software(framework=framework, **{knob: True})


# Nemotron-4 15B (arXiv:2402.16819 Table 1: 32 layers, h 6144, 48 heads, 8 KV heads, squared-ReLU MLP of
# 24576, 256k vocab, seq 4096): the 64-B200 DDP run.
NEMOTRON = ModelSpec(name="nemotron-4-15b", layers=32, hidden=6144, heads=48, kv_heads=8, ffn=24576,
                     vocab=256000, seq=4096, mlp="gelu")


def dp_calls(pred) -> int:
    return next(e["calls"] for e in pred.comm if e["axis"] == "dp")


def test_gradient_buckets_follow_the_framework():
    b200 = load_cluster("b200")
    assert b200.software.framework == "megatron-core"
    layout = Layout.parse("dp=64,mbs=1", 64)
    params = params_on_rank(NEMOTRON, layout, 0)
    megatron = predict(NEMOTRON, b200, layout, 256)
    torch = predict(NEMOTRON, b200.with_software(framework="torch"), layout, 256)
    assert dp_calls(megatron) == math.ceil(params / 64e6)  # max(40M, 1M x 64) parameters a bucket
    assert dp_calls(torch) == math.ceil(params / (25 * 2**20 / 4))  # DDP's 25 MiB of fp32 gradient
    assert dp_calls(torch) > 2000 and dp_calls(megatron) < 250
    assert megatron.step_time_s < torch.step_time_s
    small = predict(NEMOTRON, b200, Layout.parse("dp=8,mbs=1", 8), 32)
    assert dp_calls(small) == math.ceil(params / 40e6)  # the 40M floor below dp=40
    deepspeed = predict(NEMOTRON, b200.with_software(framework="deepspeed"),
                        Layout.parse("dp=64,zero=1,mbs=1", 64), 256)
    assert dp_calls(deepspeed) == math.ceil(params / 5e8)  # reduce_bucket_size


def test_megatron_buckets_once_without_overlap_and_off_the_first_stage():
    sw = replace(A100.software, framework="megatron-core")
    assert grad_buckets(sw, 4e9, 64) == 63
    assert grad_buckets(replace(sw, grad_reduce_overlap=False), 4e9, 64) == 1
    assert grad_buckets(sw, 4e9, 64, first_stage=False, chunks=3) == 3  # one per virtual chunk
    assert grad_buckets(sw, 4e9, 64, first_stage=True, chunks=2) == 32 + 1  # only the first chunk is cut
    assert grad_buckets(replace(sw, grad_bucket_params=1e8), 4e9, 64) == 40  # the knob wins
    layout = Layout.parse("dp=16,zero=1,pp=4,mbs=1", 64)
    pred = predict(MODEL, replace(A100, software=sw), layout, 64)
    assert dp_calls(pred) == 1  # the busiest rank is a later stage: one bucket


@pytest.mark.parametrize("software, needle", [({"grad_bucket_params": 0}, "grad_bucket_params"),
                                              ({"grad_bucket_params": -5}, "grad_bucket_params"),
                                              ({"framework": "jax"}, "framework must be one of"),
                                              ({"attention_kernel": "xformers"}, "attention_kernel must be one of"),
                                              ({"metric_cross_entropies": -1}, "metric_cross_entropies must be"),
                                              ({"metric_cross_entropies": 1.5}, "metric_cross_entropies must be"),
                                              ({"low_precision_norm": "yes"}, "low_precision_norm must be"),
                                              ({"attention_unpad": 1}, "attention_unpad must be"),
                                              ({"nccl": "2.x"}, 'nccl must be an NCCL release as "major.minor"'),
                                              ({"nccl": 2.27}, "nccl must be"),
                                              ({"bucket_cap_mb": 25}, "unknown field(s) bucket_cap_mb")])
def test_bad_bucket_knobs_are_one_line(tmp_path, software, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"base": "h100-80gb", "software": software}))
    with pytest.raises(UserError, match=re.escape(needle)) as e:
        load_cluster(str(path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("base, software, needle", [
    ("tpu-v5p", {"attention_kernel": "fa2"}, "fa2 and fa-triton on an NVIDIA cluster"),
    ("tpu-v5p", {"attention_unpad": True}, "attention_unpad is flash-attn's"),
    ("b200", {"attention_kernel": "fa1"}, "fa1 on ampere or hopper), got 'fa1' with gpu_arch blackwell")])
def test_other_attention_kernels_are_nvidia_ones(tmp_path, base, software, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"base": base, "software": software}))
    with pytest.raises(UserError, match=re.escape(needle)) as e:
        load_cluster(str(path))
    assert "\n" not in str(e.value)


def test_blocking_pipeline_sends_show_in_full():
    """pp_comm_overlap=false (Megatron-LM before 2023): interleaved 1F1B's stage-boundary sends, which otherwise
    show only on the first and last micro-batches' chain, block their rank: all of their time shows."""
    layout = Layout.parse("tp=8,pp=4,vpp=2,schedule=interleaved,dp=2,mbs=1", 64)
    sends, steps = {}, {}
    for overlap in (True, False):
        pred = predict(MODEL, with_software(pp_comm_overlap=overlap), layout, 64)
        sends[overlap] = next(e for e in pred.comm if e["axis"] == "pp" and e["collective"] == "send_recv")
        steps[overlap] = pred.step_time_s
    assert steps[False] > steps[True]
    assert sends[True]["time_s"] == sends[False]["time_s"]
    assert sends[True]["exposed_s"] < 0.5 * sends[True]["time_s"]
    assert sends[False]["exposed_s"] == pytest.approx(sends[False]["time_s"])


def test_deepspeeds_pipeline_receives_block_as_its_sends_do():
    """DeepSpeed's pipeline engine blocks each rank on its receives as on its sends, whatever pp_comm_overlap
    says: a rank's stage-boundary traffic is twice Megatron-LM's blocking sends' (a middle rank's four transfers
    a micro-batch), all of it shows, and the simulator steps through the same, its BF16_Optimizer's gradient
    copies included."""
    layout = Layout.parse("tp=2,pp=4,dp=2,zero=1,mbs=1", 16)
    megatron = with_software(pp_comm_overlap=False)
    sends = {}
    for name, cluster in (("megatron", megatron), ("deepspeed", with_software(framework="deepspeed")),
                          ("deepspeed fp16 grads", with_software(framework="deepspeed", grad_reduce_fp32=False))):
        pred = predict(MODEL, cluster, layout, 64)
        sends[name] = next(e for e in pred.comm if e["axis"] == "pp")
        assert sends[name]["exposed_s"] == pytest.approx(sends[name]["time_s"])
        assert simulate(MODEL, cluster, layout, 64).step_time_s == pytest.approx(pred.step_time_s, rel=0.01), name
    for name in ("deepspeed", "deepspeed fp16 grads"):
        assert (sends[name]["calls"], sends[name]["bytes"]) == (2 * sends["megatron"]["calls"],
                                                                 2 * sends["megatron"]["bytes"])


def test_fsdp2_copies_its_gathered_parameters_out_on_the_compute_stream():
    """framework torch, zero=3: FSDP2 reads and writes every gathered byte once more (its copy-out), which
    slows the step; FSDP1 (fsdp_copy_out false) and Megatron-FSDP gather in place."""
    layout = Layout.parse("dp=8,zero=3,mbs=1", 8)

    def gather(**software):
        pred = predict(MODEL, with_software(**software), layout, 16)
        entry = next(e for e in pred.comm if e["collective"] == "all_gather")
        return entry, pred.step_time_s

    (fsdp2, t2), (fsdp1, t1) = gather(framework="torch"), gather(framework="torch", fsdp_copy_out=False)
    copy = 2 * fsdp2["bytes"] / A100.achieved_hbm_bandwidth
    assert fsdp2["interference_s"] - fsdp1["interference_s"] == pytest.approx(copy)
    megatron, _ = gather(framework="megatron-core")
    assert megatron["interference_s"] == pytest.approx(fsdp1["interference_s"])


def test_torch_fsdp_prepares_each_reduce_scatter_in_memory():
    """Before each reduce-scatter FSDP2 (zero=3) copies the bf16 gradients into its fp32 buffer (2 + 4 bytes an
    element) and NCCL averages; FSDP1 cats them into its flat gradient (2 + 2), casts it to fp32 (2 + 4) and
    pre-divides in place (4 + 4), or with bf16 reduction only divides (2 + 2); Megatron-Core reduces the buffer its
    gradients accumulate in. Per micro-batch."""
    def reduce(zero, m=1, **software):
        pred = predict(MODEL, with_software(**software), Layout.parse(f"dp=8,zero={zero},mbs=1", 8), 8 * m)
        entry = next(e for e in pred.comm if e["collective"] == "reduce_scatter" and e["axis"] == "dp")
        return entry["interference_s"], entry["bytes"]

    fsdp1, fsdp2, bf16 = {"framework": "torch", "fsdp_copy_out": False}, {"framework": "torch"}, \
        {"grad_reduce_fp32": False}
    for zero, m, a, b, moved, width in ((3, 1, fsdp2, {"framework": "megatron-core"}, 6, 4),
                                        (3, 1, fsdp1, fsdp2, 18 - 6, 4),
                                        (2, 1, fsdp1, fsdp2, 18, 4),  # our ZeRO-2 reduces its own buckets
                                        (2, 2, fsdp1, fsdp2, 18, 4),
                                        (2, 1, fsdp1 | bf16, fsdp2 | bf16, 8, 2)):
        (slow, nbytes), (fast, _) = reduce(zero, m, **a), reduce(zero, m, **b)
        assert slow - fast == pytest.approx(moved * nbytes / width / A100.achieved_hbm_bandwidth)


def test_deepspeeds_bf16_optimizer_copies_each_backward_to_fp32_and_all_reduces():
    """DeepSpeed at ZeRO-1 with bf16 and fp32 gradient accumulation runs its BF16_Optimizer: after every
    micro-batch's backward each gradient is copied and added into fp32 (18 bytes an element), and the fp32
    gradients are all-reduced where ZeRO-1 reduce-scatters; in bf16 gradients it is DeepSpeed's ZeRO-1 as usual."""
    layout = Layout.parse("dp=8,zero=1,pp=2,mbs=1", 16)

    def run(**software):
        return predict(MODEL, with_software(framework="deepspeed", **software), layout, 64)

    bf16_opt, zero1 = run(), run(grad_reduce_fp32=False)
    assert set(dp_bytes(bf16_opt)) == {"all_reduce", "all_gather"}
    assert set(dp_bytes(zero1)) == {"reduce_scatter", "all_gather"}
    assert dp_bytes(bf16_opt)["all_reduce"] == 2 * dp_bytes(zero1)["reduce_scatter"]  # fp32 against bf16
    assert bf16_opt.step_time_s > zero1.step_time_s
    for rank in range(2):
        copies = (rank_passes(MODEL, with_software(framework="deepspeed"), layout, rank).backward
                  - rank_passes(MODEL, with_software(framework="deepspeed", grad_reduce_fp32=False), layout,
                                rank).backward)
        assert copies == pytest.approx(18 * params_on_rank(MODEL, layout, rank) / A100.achieved_hbm_bandwidth)


def test_gradient_clipping_reads_the_gradients_and_torch_scales_them_too():
    """The update pays clipping's norm, a read of every gradient in the dtype it accumulates in (fp32 here), and
    under torch's clip_grad_norm_ the scale that follows whatever the norm (a read and a write): 2 gradient
    passes more than Megatron-Core, which scales only over the limit; bf16 accumulation halves the bytes."""
    layout = Layout.parse("dp=8,mbs=1", 8)
    megatron = predict(MODEL, A100, layout, 8)
    torch_ = predict(MODEL, with_software(framework="torch"), layout, 8)
    grads = megatron.memory_per_device_bytes["grads"]  # bf16 on the device: 2 bytes an element
    extra = (torch_.optimizer_s - megatron.optimizer_s) * A100.achieved_hbm_bandwidth
    assert extra == pytest.approx(2 * grads / 2 * 4, rel=1e-6)
    half = predict(MODEL, with_software(grad_reduce_fp32=False), layout, 8)
    assert (megatron.optimizer_s - half.optimizer_s) * A100.achieved_hbm_bandwidth == pytest.approx(grads, rel=1e-6)


def test_autocast_casts_fp32_weights_every_micro_batch_but_fsdp2_gathers_bf16():
    """[software] param_gather_fp32 (our runtime's fp32 parameters under autocast): each micro-batch's forward
    casts every matrix weight to bf16 (4 + 2 bytes) and its backward the weight's gradient back (2 + 4); the
    embedding table, only looked up, is not cast. FSDP2 (zero=3) gathers bf16 copies, and fp32 or bf16-pure
    runs cast nothing."""
    runtime = with_software(framework="torch", param_gather_fp32=True)
    plain = with_software(framework="torch")
    layout = Layout.parse("dp=8,mbs=1", 8)
    ours, theirs = rank_passes(MODEL, runtime, layout, 0), rank_passes(MODEL, plain, layout, 0)
    matrices = params_on_rank(MODEL, layout, 0) - MODEL.vocab * MODEL.hidden
    cast = 6 * matrices / A100.achieved_hbm_bandwidth
    assert ours.forward - theirs.forward == pytest.approx(cast)
    assert ours.backward - theirs.backward == pytest.approx(cast)
    for other, precision in (("dp=8,zero=3,mbs=1", "bf16"), ("dp=8,mbs=1", "fp32"), ("dp=8,mbs=1", "bf16-pure")):
        layout = Layout.parse(other, 8)
        assert rank_passes(MODEL, runtime, layout, 0, precision) == rank_passes(MODEL, plain, layout, 0, precision)
