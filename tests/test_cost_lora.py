"""LoRA fine-tuning in the cost model: frozen weights take no gradient, keep no optimizer state and reduce
nothing over data parallelism; the adapters cost what they move; the planner's bound and memory stay predict's."""

from dataclasses import replace

import pytest

from meshscale.cost import flops, predict
from meshscale.cost.kernels import layer_passes
from meshscale.cost.memory import zero_copy_bytes
from meshscale.errors import UserError
from meshscale.plan.search import parse_fix, search
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout, trainer_refusal
from meshscale.specs.model import load_model

from boundcheck import bounds_and_memory_hold  # noqa: E402
H100 = load_cluster("h100-80gb")
LLAMA = load_model("llama2-70b").with_seq(8192)
LORA = replace(LLAMA, lora_rank=16, lora_dropout=0.1)


def test_adapters_count_rank_times_in_plus_out_beside_each_adapted_matrix():
    q, kv = LLAMA.heads * LLAMA.head_dim, LLAMA.kv_heads * LLAMA.head_dim
    assert LORA.adapter_params() == 16 * (LLAMA.hidden + q + 2 * kv) + 16 * (q + LLAMA.hidden)
    assert LORA.trained_param_count() == 80 * LORA.adapter_params()  # 44.6M of 69B
    both = replace(LORA, lora_modules="all")
    # one adapter beside the fused gate and up matrix (NeMo's linear_fc1), one beside the down projection
    fc1, fc2 = LLAMA.hidden + 2 * LLAMA.ffn, LLAMA.ffn + LLAMA.hidden
    assert both.adapter_params() == LORA.adapter_params() + 16 * (fc1 + fc2)
    assert LLAMA.trained_param_count() == LLAMA.param_count()
    # NeMo's default target: the fused QKV alone, column-parallel, keeping the norm's output its A reads
    qkv = replace(LORA, lora_modules="qkv", lora_dropout=0.0)
    assert qkv.adapter_params() == 16 * (LLAMA.hidden + q + 2 * kv)
    shape = Layout(tp=8, dp=8, mbs=1)
    lean, attention = (predict(m, H100, shape, 64, "fp8") for m in (qkv, replace(qkv, lora_modules="attention")))
    assert lean.memory_per_device_bytes["grads"] < attention.memory_per_device_bytes["grads"]
    assert lean.step_time_s < attention.step_time_s


def test_the_frozen_weights_take_no_gradient():
    """A layer's weight-gradient pass is the adapters' alone, a small fraction of the full one; the forward and
    input gradient keep the frozen GEMMs; the model FLOPs drop the frozen weight gradients (2F + core + adapters'
    three passes against 3F)."""
    shape = Layout(tp=8, cp=2, dp=8, ep=8, mbs=1)
    full, lora = (layer_passes(m, H100, shape, False, "fp8") for m in (LLAMA, LORA))
    assert lora.weight < 0.15 * full.weight  # six small GEMMs' launches and bytes
    assert lora.forward > full.forward  # the adapters beside the frozen GEMMs
    assert lora.backward > full.backward and lora.backward + lora.weight < 0.9 * (full.backward + full.weight)
    tokens = 8 * 8192
    core = sum(flops.attention_core_flops(LLAMA, 8192, layer=i) for i in range(80))
    forward = flops.forward_flops_per_token(LLAMA, 8192) + flops.adapter_flops(LORA)
    assert flops.model_flops_per_step(LORA, tokens) == pytest.approx((2 * forward + core + flops.adapter_flops(LORA))
                                                                     * tokens)
    assert flops.model_flops_per_step(LORA, tokens) < 0.75 * flops.model_flops_per_step(LLAMA, tokens)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_only_the_adapters_have_gradients_optimizer_state_and_data_parallel_reductions(zero):
    layout = Layout(tp=8, dp=8, zero=zero, mbs=1)
    full, lora = (predict(m, H100, layout, 64, "bf16") for m in (LLAMA, LORA))
    adapters = LORA.trained_param_count() / 8  # a TP rank's share
    mem = lora.memory_per_device_bytes
    shard = 8 if zero >= 2 else 1
    assert mem["grads"] == pytest.approx(2 * adapters / shard)
    copies = zero_copy_bytes("bf16", zero)
    assert mem["optimizer"] == pytest.approx((12 + copies) * adapters / (8 if zero else 1))
    assert mem["frozen"] == pytest.approx(full.memory_per_device_bytes["params"])
    assert mem["params"] == pytest.approx(2 * adapters / (8 if zero == 3 else 1))
    assert lora.optimizer_s < 0.01 * full.optimizer_s  # the update reads and writes the adapters alone
    reduced = [e for e in lora.comm if e["axis"] == "dp" and e["collective"] in ("all_reduce", "reduce_scatter")]
    m = 8  # micro-batches: ZeRO-2 and 3 reduce-scatter each one's gradients
    assert reduced and all(e["bytes"] == pytest.approx(4 * adapters * (m if zero >= 2 else 1)) for e in reduced)
    gathers = {e["collective"]: e["bytes"] for e in lora.comm if e["axis"] == "dp"}
    full_gathers = {e["collective"]: e["bytes"] for e in full.comm if e["axis"] == "dp"}
    if zero == 3:  # FSDP gathers the frozen weights all the same
        assert gathers["all_gather"] == pytest.approx(full_gathers["all_gather"])
    assert lora.step_time_s < full.step_time_s
    assert lora.checkpoint_bytes_total == pytest.approx(12 * LORA.trained_param_count())


def test_frozen_matrices_keep_no_inputs_but_an_adapter_without_dropout_keeps_its_own():
    layout = Layout(tp=8, dp=8, mbs=1)
    acts = {name: predict(m, H100, layout, 64, "bf16").memory_per_device_bytes["activations"]
            for name, m in (("full", LLAMA), ("dropout", LORA), ("bare", replace(LORA, lora_dropout=0.0)))}
    assert acts["bare"] < acts["full"] and acts["bare"] < acts["dropout"]
    # the bare adapter keeps QKV's input (the first norm's output, 2h an element) that dropout's copy replaces
    tokens = 8192
    per_token = (acts["dropout"] - acts["bare"]) / tokens / 80
    assert per_token == pytest.approx(2 * 1.5 * (LLAMA.hidden + LLAMA.heads * LLAMA.head_dim / 8) - 2 * LLAMA.hidden)


@pytest.mark.parametrize("name, fix", [("tiny", "pp=2"), ("tiny", "pp=1"), ("tiny-moe", "pp=1")])
def test_the_planners_bound_and_memory_are_predicts_under_lora(name, fix):
    model, cpu = replace(load_model(name), lora_rank=4), load_cluster("local-cpu")
    found = search(model, cpu, 4, 8, "fp32", top=3, fix=parse_fix(fix), prune=False)
    costed = bounds_and_memory_hold(model, cpu, found.pool, 8, "fp32")
    assert {Layout.parse(pred.layout).zero for _, pred in costed} == {0, 1, 2, 3}


def test_the_bound_holds_where_lora_leaves_little_but_the_pipeline_sends():
    """Without the frozen weights' gradient traffic little but the stage-boundary sends is left beside compute;
    the bound's send floor must then stay under what predict shows of them: under interleaving, which queues
    other passes behind them, none (it had charged what the slowest rank's lead does not hide, up to 2.6% over
    predict's step)."""
    model = replace(load_model("llama2-7b").with_seq(4096), lora_rank=8, packed_samples=512)
    found = search(model, H100, 16, 64, "fp8", top=3, fix=parse_fix("tp=1,pp=2,cp=2"), prune=False)
    costed = bounds_and_memory_hold(model, H100, found.pool, 64, "fp8")
    assert any("interleaved" in pred.layout for _, pred in costed)


def test_fp8_parameters_hold_a_frozen_weight_in_one_byte_where_no_transpose_is_cached():
    """MLPerf's Llama 2 70B LoRA configs (fp8_params, disable_parameter_transpose_cache) ran TP1 on 8 H200s and
    8 B200s: the frozen weights are FP8 alone (69 GB a GPU), not bf16 (138 GB, which fit neither). Hopper's
    cached transpose, and MXFP8's second layout, are a second byte; the adapters stay in bf16."""
    layout = Layout.parse("dp=4,zero=1,cp=2,mbs=1", 8)

    def memory(cluster, precision="fp8", **software):
        return predict(LORA, load_cluster(cluster).with_software(**software), layout, 8,
                       precision).memory_per_device_bytes

    plain, cached, mlperf = (memory("h200", **sw) for sw in (
        {}, dict(fp8_param_gather=True), dict(fp8_param_gather=True, disable_parameter_transpose_cache=True)))
    assert plain["frozen"] == cached["frozen"] == pytest.approx(2 * mlperf["frozen"])
    assert mlperf["frozen"] == LORA.param_count()  # the base model's weights, a byte each
    assert mlperf["params"] == plain["params"]  # the adapters: bf16 modules beside Transformer Engine's
    assert mlperf["total"] < load_cluster("h200").hbm_bytes < plain["total"]
    assert memory("b200", fp8_param_gather=True)["frozen"] == mlperf["frozen"]  # Blackwell reads either layout
    assert memory("b200", "mxfp8", fp8_param_gather=True)["frozen"] == plain["frozen"]


def test_the_planners_memory_is_predicts_with_fp8_parameters():
    cluster = H100.with_software(fp8_param_gather=True, disable_parameter_transpose_cache=True)
    for model in (replace(load_model("llama2-7b").with_seq(4096), lora_rank=8), load_model("llama2-7b")):
        found = search(model, cluster, 8, 32, "fp8", top=3, fix=parse_fix("tp=1,pp=2,cp=1"), prune=False)
        costed = bounds_and_memory_hold(model, cluster, found.pool, 32, "fp8")
        assert {Layout.parse(pred.layout).zero for _, pred in costed} == {0, 1, 2, 3}


@pytest.mark.parametrize("fields, needle", [
    (dict(lora_rank=-1), "lora_rank must be >= 0"),
    (dict(lora_rank=8, lora_modules="ffn"), "lora_modules must be one of"),
    (dict(lora_rank=8, lora_dropout=1.0), "lora_dropout must be in [0, 1)"),
])
def test_bad_lora_fields_name_what_they_accept(fields, needle):
    with pytest.raises(UserError, match=needle.replace("[", r"\[").replace(")", r"\)")):
        replace(LLAMA, **fields)


def test_lora_refuses_what_it_does_not_cost_and_the_trainer_says_it_trains_everything():
    with pytest.raises(UserError, match="adapters on MoE experts"):
        replace(load_model("mixtral-8x7b"), lora_rank=8, lora_modules="mlp")
    with pytest.raises(UserError, match="multi-head latent attention or MTP"):
        replace(load_model("deepseek-v3"), lora_rank=8)
    assert "LoRA adapters" in trainer_refusal(Layout(dp=2), replace(load_model("tiny"), lora_rank=4))


def test_the_adapters_tp_collectives_are_nemos_parallel_adapters():
    """Beside a column-parallel matrix an adapter gathers its r-wide output and all-reduces B's input gradient
    (and, without SP, A's h-wide one); beside a row-parallel one it all-reduces twice r-wide and moves its h-wide
    output to the sequence split: two gathers, or (lora_all_to_all) an all-to-all each way of a rank's share."""
    from meshscale.cost.comm import lora_adapter_ops

    tokens, layers, m = 4096, 10, 2
    v, narrow = tokens * LLAMA.hidden * 2, tokens * 16 * 2

    def ops(layout, **kw):
        return {(op.collective, op.bytes / op.calls): op.calls
                for op in lora_adapter_ops(LORA, layout, tokens, 2, layers, m, **kw)}

    per = layers * m  # each of the two adapted matrices, every layer and micro-batch
    assert lora_adapter_ops(LORA, Layout(tp=1, dp=8), tokens, 2, layers, m) == []
    assert ops(Layout(tp=4, sp=True), all_to_all=True) == {("all_gather", narrow): per,
                                                          ("all_reduce", narrow): 3 * per,
                                                          ("all_to_all", v / 4): 2 * per}
    assert ops(Layout(tp=4, sp=True))[("all_gather", v)] == 2 * per
    assert ops(Layout(tp=4, sp=True), own_gather=True)[("all_gather", v)] == 3 * per
    assert ops(Layout(tp=4, sp=True), own_gather=True)[("reduce_scatter", v)] == per
    no_sp = ops(Layout(tp=4))
    assert no_sp[("all_reduce", v)] == per and no_sp[("all_gather", v)] == per
    qkv = {(op.collective, op.bytes / op.calls): op.calls
           for op in lora_adapter_ops(replace(LORA, lora_modules="qkv"), Layout(tp=4), tokens, 2, layers, m)}
    assert ("all_gather", v) not in qkv and qkv[("all_reduce", v)] == per
    # predict shows them on the tp axis, nothing hiding them; only Megatron-Core (NeMo) has the all-to-all switch
    pred = predict(LORA, H100.with_software(lora_all_to_all=True), Layout(tp=4, sp=True, dp=2, mbs=1), 8, "fp8")
    a2a = [e for e in pred.comm if e["axis"] == "tp" and e["collective"] == "all_to_all"]
    assert a2a and a2a[0]["exposed_s"] == a2a[0]["time_s"] > 0
    with pytest.raises(UserError, match="lora_all_to_all is NeMo's"):
        H100.with_software(framework="torch", lora_all_to_all=True)
