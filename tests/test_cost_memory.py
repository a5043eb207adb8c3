"""Memory accounting against published figures: Korthikanti et al. 2022 Table 2, Megatron-LM's interleaved
schedule, FlashAttention's linear memory, and a layout that ran (Llama 3 405B)."""

import dataclasses

import pytest

from meshscale.cost import predict
from meshscale.cost.memory import (activation_bytes_per_layer, busiest_rank, held_layer_microbatches, memory_per_device,
                                   params_on_rank)
from meshscale.errors import UserError
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout, check_against, trainer_refusal
from meshscale.specs.model import ModelSpec, load_model

GPT3 = load_model("gpt3-175b")  # GPT-3 175B: Korthikanti's model (4h GeLU MLP, MHA, dropout)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table2_per_layer_activations(t):
    s, b, h, a = GPT3.seq, 1, GPT3.hidden, GPT3.heads
    sbh = s * b * h

    def ours(**kw):
        return activation_bytes_per_layer(GPT3, Layout(tp=t, **kw), s * b, fused_attention=False)

    # Table 2 rows: no parallelism sbh(34 + 5as/h); tensor parallel sbh(10 + 24/t + 5as/(ht));
    # + sequence parallel sbh(34/t + 5as/(ht)); + selective recompute 34 sbh/t; full recompute 2 sbh.
    assert ours() == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    if t > 1:
        assert ours(sp=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
        assert ours(sp=True, recompute="selective") == pytest.approx(sbh * 34 / t)
    assert ours(recompute="full") == pytest.approx(2 * sbh)


def test_flash_attention_memory_is_linear_in_sequence_length():
    """Dao et al. 2022: the fused kernel never stores the s x s scores, so bytes per token do not grow with s."""
    model = load_model("llama2-13b")
    per_token = {}
    for seq in (2048, 8192):
        m = model.with_seq(seq)
        per_token[seq, True] = activation_bytes_per_layer(m, Layout(), seq, fused_attention=True) / seq
        per_token[seq, False] = activation_bytes_per_layer(m, Layout(), seq, fused_attention=False) / seq
    assert per_token[2048, True] == per_token[8192, True]
    assert per_token[8192, False] > 2 * per_token[2048, False]


def test_interleaved_warm_up_counted_chunk_by_chunk():
    """Megatron-LM's interleaved 1F1B: rank 0 runs (p-1)*2 + (v-1)*p warm-up forwards, p micro-batches per
    chunk in turn, then one more. 14 layers + embedding + head over p=2 ranks x v=2 chunks of 4: rank 0 holds
    chunks 0 (embedding + 3 layers) and 2 (4 layers); 5 forwards run chunks 0, 0, 2, 2, 0: 3+3+4+4+3."""
    model = ModelSpec(name="x", layers=14, hidden=64, heads=4, ffn=128, vocab=64)
    layout = Layout(pp=2, vpp=2, schedule="interleaved")
    assert held_layer_microbatches(model, layout, m=4) == 17
    # 1F1B: p micro-batches of the first rank's layers (Narayanan et al. 2021 sec. 2.2.1)
    assert held_layer_microbatches(model, Layout(pp=2), m=4) == 2 * 7
    # Korthikanti's closed form, (L/p)*p*(1 + (p-1)/(p*v)) = 14 * 1.25 = 17.5, is the even-cut estimate
    assert held_layer_microbatches(model, layout, m=4) <= 14 * (1 + 1 / 4)


def test_rebuilt_layer_and_logits_never_coexist():
    """Under full recompute the loss's backward frees its fp32 logits before the last layer is rebuilt, so the
    peak holds every layer's input and the larger of the two, not their sum (a small vocabulary: the rebuilt
    layer; a large one: the logits)."""
    layout, seq = Layout(recompute="full"), 512
    for vocab in (64, 1 << 20):
        model = ModelSpec(name="x", layers=4, hidden=256, heads=4, ffn=1024, vocab=vocab, seq=seq)
        inputs = 4 * activation_bytes_per_layer(model, layout, seq)
        rebuilt = activation_bytes_per_layer(model, Layout(recompute="selective"), seq, fused_attention=True)
        logits = 4 * seq * vocab
        assert memory_per_device(model, layout, 1).activations == pytest.approx(inputs + max(rebuilt, logits))


def test_llama3_405b_layout_that_ran_fits_in_80gb():
    """Dubey et al. 2024 sec. 3.3.2 / Table 4: TP8 x PP16 x DP64, interleaved, 8K sequences, no activation
    recomputation, on 80 GB H100s."""
    model, h100 = load_model("llama3-405b"), load_cluster("h100-80gb")
    pred = predict(model, h100, Layout.parse("dp=64,zero=1,tp=8,sp=true,pp=16,vpp=4,schedule=interleaved,mbs=1",
                                             8192), 2048)
    assert pred.fits
    assert 60e9 < pred.memory_per_device_bytes["activations"] < h100.hbm_bytes


def test_llama_style_models_store_no_dropout_masks():
    llama, gpt = load_model("llama2-7b"), GPT3
    for model, masks in ((llama, 0), (gpt, 2)):
        sp = activation_bytes_per_layer(model, Layout(tp=2, sp=True), 1)
        no_sp = activation_bytes_per_layer(model, Layout(tp=2), 1)
        # the norms' and block inputs (8h) and the masks are what SP splits and TP alone does not
        assert no_sp - sp == pytest.approx((8 + masks) * model.hidden / 2)


def test_optimizer_states_follow_zero_stages():
    model = load_model("llama3-8b")
    p = model.param_count()
    mem = [memory_per_device(model, Layout(dp=8, zero=z), 8) for z in range(4)]
    assert mem[0].params + mem[0].grads + mem[0].optimizer == pytest.approx(16 * p, rel=1e-6)
    # ZeRO-3 (FSDP2): the shards, and in bf16 the root unit (embedding, final norm, head) gathered with its whole
    # gradient, two blocks gathered (one prefetched) and one block's whole gradient
    root, block = 2 * model.vocab * model.hidden + model.hidden, model.layer_params(0)
    assert mem[3].params + mem[3].grads + mem[3].optimizer == pytest.approx(16 * p / 8, rel=1e-6)
    assert mem[3].gathered == pytest.approx(2 * (2 * root + 3 * block), rel=1e-6) and mem[1].gathered == 0
    # a framework that does not hold the root (XLA, DeepSpeed) has two units in flight and one whole gradient at
    # a time: here the root (untied: embedding and head) is the largest unit
    unheld = memory_per_device(model, Layout(dp=8, zero=3), 8, root_held=False)
    assert root > block and unheld.gathered == pytest.approx(2 * (2 * root + block), rel=1e-6)
    # inside a pipeline stage FSDP2 holds the stage's parameters and gradients whole until the last micro-batch
    layout = Layout(dp=4, zero=3, pp=2)
    piped, stage = memory_per_device(model, layout, 8), params_on_rank(model, layout, busiest_rank(model, layout))
    assert piped.gathered == pytest.approx(2 * 2 * stage)


def test_op_recompute_keeps_the_saved_matmul_outputs():
    """recompute=op keeps the block input, q, v, gate and down outputs and the attention output: between none
    and full; layouts it is not built for are one clear error."""
    model = load_model("llama3-8b")
    h, q, kv = model.hidden, model.heads * model.head_dim, model.kv_heads * model.head_dim
    op = activation_bytes_per_layer(model, Layout(recompute="op"), 1, True)
    assert op == 2 * (h + q + kv + model.ffn + h + q)
    none, full = (activation_bytes_per_layer(model, Layout(recompute=r), 1, True) for r in ("none", "full"))
    assert full < op < none
    for bad, batch in (("tp=2,recompute=op", 8), ("cp=2,recompute=op", 8)):
        with pytest.raises(UserError, match="recompute=op"):
            check_against(Layout.parse(bad, 8), model, batch)
    with pytest.raises(UserError, match="recompute=op"):
        check_against(Layout.parse("dp=8,ep=8,recompute=op", 8), load_model("mixtral-8x7b"), 8)


def test_minimal_recompute_keeps_every_matmul_output_and_reruns_no_matmul():
    """recompute=minimal (MaxText's remat_policy minimal) keeps the block input and the matmul outputs backward
    reads: q, k, v, gate and up, and a sequential block's attention projection (split by SP, the rest by TP);
    eager torch's checkpoint also keeps the down projection's. Its backward reruns the attention core and the
    element-wise work, never a GEMM; MoE models and the trainer's TP are one line."""
    model = load_model("llama3-8b")
    h, q, kv, f = model.hidden, model.heads * model.head_dim, model.kv_heads * model.head_dim, model.ffn
    kept = 2 * (2 * h + q + 2 * kv + 2 * f)
    assert activation_bytes_per_layer(model, Layout(recompute="minimal"), 1, True) == kept
    assert activation_bytes_per_layer(model, Layout(recompute="minimal"), 1, True, eager=True) == kept + 2 * h
    assert activation_bytes_per_layer(model, Layout(tp=4, sp=True, recompute="minimal"), 1, True) == kept / 4
    parallel = dataclasses.replace(model, parallel_residual=True)  # PaLM's block: the projection is not read
    assert activation_bytes_per_layer(parallel, Layout(recompute="minimal"), 1, True) == kept - 2 * h
    none, sel, full = (activation_bytes_per_layer(model, Layout(recompute=r), 1, True)
                       for r in ("none", "selective", "full"))
    assert full < kept < sel <= none
    cluster = load_cluster("h100-80gb")
    pred = {r: predict(model, cluster, Layout.parse(f"dp=8,zero=3,mbs=1,recompute={r}", 8), 8)
            for r in ("selective", "minimal", "full")}
    assert pred["selective"].compute_s < pred["minimal"].compute_s < pred["full"].compute_s
    assert pred["minimal"].hardware_flops_per_step == pred["selective"].hardware_flops_per_step
    with pytest.raises(UserError, match="recompute=minimal is built for dense models"):
        check_against(Layout.parse("dp=8,ep=8,recompute=minimal", 8), load_model("mixtral-8x7b"), 8)
    check_against(Layout.parse("tp=2,sp=true,cp=2,recompute=minimal", 8), model, 8)  # predict costs any TP and CP
    assert "tp=1 and cp=1" in trainer_refusal(Layout.parse("tp=2,recompute=minimal", 8), load_model("tiny"))


def test_minimal_mlp_recompute_reruns_the_mlps_first_matmul_too():
    """recompute=minimal_mlp (MaxText's save_dot_except_mlpwi) keeps what minimal keeps but the MLP's first matmul
    output (gate and up), which backward reruns: that GEMM's forward, and its FLOPs in the hardware count. plan does
    not search it, the trainer refuses it in one line, MaxText takes it by name."""
    from meshscale.cost.kernels import Gemm, layer_passes, linear_pass_seconds
    from meshscale.plan.search import parse_fix

    model, v5p = load_model("llama3-8b"), load_cluster("tpu-v5p")
    first = (2 if model.gated_mlp else 1) * model.ffn
    minimal, mlp = (activation_bytes_per_layer(model, Layout(tp=4, recompute=r), 1, True)
                    for r in ("minimal", "minimal_mlp"))
    assert minimal - mlp == 2 * first / 4
    shape, tokens = Layout(tp=4, mbs=2, recompute="minimal"), 2 * model.seq
    rerun = linear_pass_seconds(v5p, (Gemm(tokens, first / 4, model.hidden),), "bf16")[0]
    passes = {r: layer_passes(model, v5p, Layout(tp=4, mbs=2, recompute=r), False, "bf16")
              for r in ("minimal", "minimal_mlp")}
    assert passes["minimal_mlp"].backward - passes["minimal"].backward == pytest.approx(rerun) and rerun > 0
    assert (passes["minimal_mlp"].forward, passes["minimal_mlp"].weight) == (passes["minimal"].forward,
                                                                             passes["minimal"].weight)
    pred = {r: predict(model, v5p, Layout.parse(f"dp=64,zero=3,tp=4,sp=true,mbs=4,recompute={r}", 256), 256)
            for r in ("minimal", "minimal_mlp")}
    tokens_per_step = 256 * model.seq
    extra = pred["minimal_mlp"].hardware_flops_per_step - pred["minimal"].hardware_flops_per_step
    assert extra == pytest.approx(2 * model.hidden * first * model.layers * tokens_per_step)
    assert pred["minimal_mlp"].step_time_s > pred["minimal"].step_time_s
    assert shape.reruns("core_attn") and Layout(recompute="minimal_mlp").reruns("core_attn")
    assert "save_dot_except_mlpwi" in trainer_refusal(Layout.parse("dp=8,recompute=minimal_mlp", 8), load_model("tiny"))
    with pytest.raises(UserError, match="plan does not search recompute=minimal_mlp"):
        parse_fix("recompute=minimal_mlp")
    with pytest.raises(UserError, match="recompute=minimal_mlp is built for dense models"):
        check_against(Layout.parse("dp=8,ep=8,recompute=minimal_mlp", 8), load_model("mixtral-8x7b"), 8)


def test_moe_layers_keep_each_routed_copy_of_a_token():
    """Each extra expert a token is routed to keeps that expert's SwiGLU activations (6 B per expert-ffn
    element) and two hidden-wide copies of the token (the permuted input of the first GEMM, whole on each TP
    rank; the expert's output, on the rank's own SP tokens), besides the router's fp32 probabilities."""
    mixtral = load_model("mixtral-8x7b")
    h, f = mixtral.hidden, mixtral.expert_ffn
    for t, sp in ((1, False), (4, False), (4, True)):
        layout = Layout(tp=t, sp=sp, dp=1)
        one, two = (activation_bytes_per_layer(dataclasses.replace(mixtral, top_k=k), layout, 1, True)
                    for k in (1, 2))
        assert two - one == pytest.approx(6 * f / t + 2 * h + 2 * h / (t if sp else 1))
