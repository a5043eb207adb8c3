"""Megatron-LM's command line (`pretrain_gpt.py` arguments, megatron/training/arguments.py; Megatron-Core
turns them into its TransformerConfig and DistributedDataParallelConfig field by field).

Megatron's mesh is [pp, dp, cp, tp] as ours, and its expert ranks fold over the stage's tp x cp x dp ranks as
ours do (expert-tensor-parallel-size = etp, tp unless set; parallel_state's expert RankGenerator, order
tp-ep-dp). ZeRO-1 is its distributed optimizer, ZeRO-2/3
Megatron-FSDP's optim_grads / optim_grads_params, hybrid sharding its distributed-optimizer instances.
"""

import shlex

from meshscale.cost.comm import bucket_params
from meshscale.errors import UserError
from meshscale.export import Job, Shape, change, no_int8
from meshscale.specs.cluster import is_fp8
from meshscale.specs.layout import KEEPS_MATMULS, RECOMPUTE_MODULES, Layout, split_layers
from meshscale.specs.model import ModelSpec

GPU_ONLY = "Megatron-LM"  # named in the refusal of a TPU slice
# [software] moe_dispatcher as Megatron-Core runs it: NCCL's all-to-all, or DeepEP's or Hybrid-EP's kernels behind the
# flex dispatcher (GShard's einsum dispatch, MaxText's, has no twin: the all-to-all padded to capacity, with a note)
DISPATCHERS = {"alltoall": "--moe-token-dispatcher-type alltoall",
               "einsum": "--moe-token-dispatcher-type alltoall --moe-pad-expert-input-to-capacity",
               "deepep": "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep",
               "hybridep": "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep"}
PRECISIONS = {"bf16-pure": ("bf16", "Megatron-LM keeps fp32 main parameters under --bf16 (16 B/param)"),
              "int8": no_int8(GPU_ONLY)}


def adapt(layout: Layout, model: ModelSpec) -> tuple[Layout, list[str]]:
    changes: list[str] = []
    if layout.pp > 1 and layout.schedule not in ("1f1b", "interleaved"):
        layout = change(layout, changes, f"Megatron-LM schedules 1F1B and interleaved 1F1B, not "
                                         f"{layout.schedule}", schedule="1f1b", vpp=1)
    if layout.offload and (layout.recompute != "none" or layout.offload >= model.layers):
        # TransformerConfig: "CPU offloading does not work when activation recomputation is enabled", and it
        # offloads fewer layers than the model has
        layout = change(layout, changes, "Megatron-Core offloads fewer than all layers' activations, without "
                                         "recompute", offload=0)
    if layout.recompute == "op":
        layout = change(layout, changes, "Megatron-LM recomputes whole layers or named modules, not every other "
                                         "matmul", recompute="full")
    if layout.recompute in KEEPS_MATMULS:
        layout = change(layout, changes, "Megatron-LM keeps the linear layers' inputs, not their outputs: its "
                                         "attention-core recompute is the nearest", recompute="selective")
    return layout, changes


def arguments(job: Job) -> list[str]:
    """The arguments, as `--flag` or `--flag value` items."""
    lay, model, sw = job.layout, job.model, job.cluster.software
    args = _model_arguments(model, sw.moe_dispatcher)
    if model.is_moe and sw.moe_permute_fusion:
        args.append("--moe-permute-fusion")
    args += [f"--seq-length {model.seq}", f"--micro-batch-size {lay.mbs}",
             f"--global-batch-size {job.global_batch}", f"--train-iters {job.steps}",
             f"--tensor-model-parallel-size {lay.tp}", f"--pipeline-model-parallel-size {lay.pp}",
             f"--context-parallel-size {lay.cp}"]
    if lay.sp:
        args.append("--sequence-parallel")
    if lay.tp > 1 and sw.tp_comm_overlap:
        args.append("--tp-comm-overlap")
        if lay.sp and sw.tp_overlap_rs_dgrad:
            args.append("--tp-comm-overlap-rs-dgrad")
    if lay.pp > 1:
        args += _pipeline_arguments(model, lay)
        if lay.schedule == "interleaved" and not sw.pp_comm_overlap:
            args.append("--no-overlap-p2p-communication")
    if lay.cp > 1:
        args.append("--cp-comm-type p2p")  # K,V passed around the ring, as the cost model charges
    if lay.ep > 1:
        args += [f"--expert-model-parallel-size {lay.ep}", f"--expert-tensor-parallel-size {lay.expert_tp}"]
        if sw.ep_comm_overlap:
            args.append("--overlap-moe-expert-parallel-comm")
    args += _data_parallel_arguments(job)
    if lay.offload:
        args.append(f"--cpu-offloading-num-layers {lay.offload}")
    if sw.cuda_graphs and not _graphs_refused(lay):
        args += _graph_arguments(model)
    if lay.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif lay.recompute_modules:  # selective is core_attn, Megatron-Core's default module list
        modules = [m for m in RECOMPUTE_MODULES if m in lay.recompute_modules]
        args += ["--recompute-granularity selective"] + ([f"--recompute-modules {' '.join(modules)}"]
                                                         if lay.recompute != "selective" else [])
    if job.precision in ("bf16", "bf16-pure") or is_fp8(job.precision):
        args.append("--bf16")
    if job.precision == "mxfp8":  # block-scaled: e4m3 throughout (TransformerConfig refuses hybrid with it)
        args += ["--fp8-format e4m3", "--fp8-recipe mxfp8"]
    if job.precision == "fp8" and job.cluster.fp8_scaling == "blockwise":  # DeepSeek-V3's: e4m3 on all tensors
        args += ["--fp8-format e4m3", "--fp8-recipe blockwise"]
    elif job.precision == "fp8":
        args.append("--fp8-format hybrid")  # Transformer Engine's recipe: e4m3 forward, e5m2 gradients
        # current scaling is Megatron-Core's tensorwise recipe; TransformerConfig refuses layernorm and moe_act
        # recompute with delayed scaling
        if job.cluster.fp8_scaling == "current" or lay.recompute_modules & {"layernorm", "moe_act"}:
            args.append("--fp8-recipe tensorwise")
    if is_fp8(job.precision) and sw.fp8_param_gather and lay.zero >= 1:
        args.append("--fp8-param-gather")
    if sw.precision_aware_optimizer and lay.zero >= 1:  # it needs the distributed optimizer
        args.append("--use-precision-aware-optimizer")
        if sw.adam_moments == "bf16":
            args += ["--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]
    args.append(f"--data-path {shlex.quote(job.data)}" if job.data else "--mock-data")
    return args


def _model_arguments(model: ModelSpec, dispatcher: str) -> list[str]:
    args = [f"--num-layers {model.layers}", f"--hidden-size {model.hidden}",
            f"--num-attention-heads {model.heads}", f"--ffn-hidden-size {model.ffn}",
            f"--max-position-embeddings {model.seq}", "--tokenizer-type NullTokenizer",
            f"--vocab-size {model.vocab}"]
    if model.head_dim != model.hidden // model.heads and not model.uses_mla:
        args.append(f"--kv-channels {model.head_dim}")
    if model.kv_heads != model.heads:
        args += ["--group-query-attention", f"--num-query-groups {model.kv_heads}"]
    if model.mlp in ("swiglu", "relu2"):
        args.append("--swiglu" if model.mlp == "swiglu" else "--squared-relu")
    args.append("--normalization " + ("LayerNorm" if model.layer_norm else "RMSNorm"))
    if model.learned_positions:
        args.append("--position-embedding-type learned_absolute")
    else:
        args += ["--position-embedding-type rope", f"--rotary-base {round(model.rope_theta)}"]  # type=int
        if model.rotary_fraction < 1:
            args.append(f"--rotary-percent {model.rotary_fraction}")
    if not model.biases:
        args.append("--disable-bias-linear")
    if model.qkv_bias:
        args.append("--add-qkv-bias")
    if model.qk_norm:
        args.append("--qk-layernorm")
    if model.sliding_window and not model.chunked_attention:  # Transformer Engine's (left, right): itself, w-1 before
        args.append(f"--window-size {model.sliding_window - 1},0")
        if model.full_attention_every:
            args.append(f"--window-attn-skip-freq {model.full_attention_every}")
    if model.attention_sinks:
        args.append("--softmax-type learnable")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if model.is_moe:
        pattern = [int(model.is_moe_layer(i)) for i in range(model.layers)]
        args += [f"--num-experts {model.experts}", f"--moe-router-topk {model.top_k}",
                 f"--moe-ffn-hidden-size {model.expert_ffn}", "--moe-grouped-gemm",
                 DISPATCHERS[dispatcher], f"--moe-aux-loss-coeff {model.aux_loss_coef}",
                 f"--moe-layer-freq {shlex.quote(str(pattern).replace(' ', ''))}"]
        if model.shared_experts:
            args.append(f"--moe-shared-expert-intermediate-size {model.shared_experts * model.expert_ffn}")
        if model.capacity_factor:
            args.append(f"--moe-expert-capacity-factor {model.capacity_factor}")
    if model.uses_mla:
        args += ["--multi-latent-attention", f"--kv-lora-rank {model.kv_lora_rank}",
                 f"--qk-head-dim {model.head_dim}", f"--qk-pos-emb-head-dim {model.rope_head_dim}",
                 f"--v-head-dim {model.v_head_dim}"]
        if model.q_lora_rank:
            args.append(f"--q-lora-rank {model.q_lora_rank}")
    if model.mtp_layers:
        args.append(f"--mtp-num-layers {model.mtp_layers}")
    return args


def _pipeline_arguments(model: ModelSpec, lay: Layout) -> list[str]:
    if lay.embedding_layer or lay.loss_layer:  # check_against has held the cut to Megatron-Core's rules
        return ((["--account-for-embedding-in-pipeline-split"] if lay.embedding_layer else [])
                + (["--account-for-loss-in-pipeline-split"] if lay.loss_layer else [])
                + ([f"--num-virtual-stages-per-pipeline-rank {lay.vpp}"] if lay.vpp > 1 else []))
    if model.layers % lay.stages == 0 and not (model.mtp_layers or lay.first or lay.last):
        return ([f"--num-layers-per-virtual-pipeline-stage {model.layers // lay.stages}"]
                if lay.vpp > 1 else [])
    # the uneven cut the cost model charged (specs.layout.split_layers), stage by stage: E embedding,
    # t a transformer layer, m a multi-token prediction module, L the output head and loss
    stages = ["t" * len(r) for r in split_layers(model.layers, lay.stages, model.mtp_layers, lay.pp, lay.first,
                                                 lay.last)]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "m" * model.mtp_layers + "L"
    return [f"--pipeline-model-parallel-layout {shlex.quote('|'.join(stages))}"]  # quoted: | is a shell pipe


def _data_parallel_arguments(job: Job) -> list[str]:
    lay, sw = job.layout, job.cluster.software
    if lay.dp * lay.cp == 1:
        return []
    # buckets of the size the cost model charged ([software] framework's default or grad_bucket_params; elements)
    args = [f"--ddp-bucket-size {int(bucket_params(sw, lay.dp * lay.cp))}"]
    if sw.grad_reduce_overlap:
        args.append("--overlap-grad-reduce")
    if sw.grad_reduce_fp32:
        args.append("--accumulate-allreduce-grads-in-fp32")
    if lay.zero >= 1:
        args.append("--use-distributed-optimizer")
    if lay.zero == 1 and sw.param_gather_overlap:
        args.append("--overlap-param-gather")
    if lay.zero >= 2:
        strategy = "optim_grads" if lay.zero == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
                 "--ckpt-format fsdp_dtensor"]
    if lay.replicas > 1:
        args.append(f"--num-distributed-optimizer-instances {lay.replicas}")
    return args


def render(job: Job) -> str:
    lay = job.layout
    per_node = job.devices_per_node
    nodes = max(1, lay.devices // per_node)
    rdzv = " --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500" if nodes > 1 else ""
    header = (f"# meshscale: {job.model.name}, {job.global_batch} x {job.model.seq} tokens a step on "
              f"{lay.devices} x {job.cluster.name}, layout {lay}")
    launcher = f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{rdzv} pretrain_gpt.py"
    return header + "\n" + " \\\n    ".join([launcher] + arguments(job)) + "\n"


def _graph_arguments(model: ModelSpec) -> list[str]:
    """CUDA graphs as the cost model charges them: a dense layer whole (an empty scope), a dropless MoE layer's
    attention and router (with its dense layers' MLPs)."""
    args = ["--cuda-graph-impl transformer_engine"]
    if model.is_moe:
        dense = any(not model.is_moe_layer(i) for i in range(model.layers))
        args.append("--cuda-graph-scope attn moe_router" + (" mlp" if dense else ""))
    return args


def _graphs_refused(lay: Layout) -> str:
    """Why Megatron-Core's TransformerConfig refuses per-layer CUDA graphs with this layout ('' if it takes them)."""
    if lay.offload:
        return "with activation offload"
    if lay.recompute in ("full", "op"):
        return "with full recompute (only a whole-iteration graph, --cuda-graph-impl local, takes it)"
    if "moe" in lay.recompute_modules:
        return "with the moe recompute module beside a captured router"
    return ""


def notes(job: Job) -> list[str]:
    why = job.cluster.software.cuda_graphs and _graphs_refused(job.layout)
    out = [f"[software] cuda_graphs is left out: Megatron-Core refuses per-layer CUDA graphs {why}; the "
           f"prediction assumed their shorter host time"] if why else []
    if job.model.is_moe and job.cluster.software.moe_dispatcher == "einsum":
        out.append("Megatron-Core has no GShard einsum dispatch ([software] moe_dispatcher einsum, MaxText's without "
                   "megablox): these arguments dispatch by all-to-all into buffers padded to capacity, without the "
                   "mask GEMMs the prediction charged")
    if job.model.chunked_attention:
        out.append(f"Megatron-LM has no chunked attention: these arguments give {job.model.name} full attention in "
                   f"every layer, where the prediction attends within chunks of {job.model.sliding_window}")
    return out


def parse_arguments(text: str) -> dict:
    """`--flag value` and `--switch` items of a Megatron-LM command line (a launcher before them is skipped):
    dest name -> value, True for a switch."""
    try:
        tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as e:
        raise UserError(f"Megatron-LM arguments: cannot split them ({e})") from None
    start = next((i for i, t in enumerate(tokens) if t.endswith(".py")), -1) + 1
    out: dict = {}
    key = None
    for token in tokens[start:]:
        if token.startswith("--"):
            key, _, value = token[2:].replace("-", "_").partition("=")
            out[key] = value or True
        elif key is not None:
            out[key] = token if out[key] is True else f"{out[key]} {token}"
    return out


def read(text: str, devices: int | None) -> Shape:
    """The job Megatron-LM's arguments describe; `devices` (the world size) is not among them."""
    args = parse_arguments(text)
    number = lambda key, default=None: int(args[key]) if key in args else default  # noqa: E731
    if devices is None:
        raise UserError("Megatron-LM arguments do not hold the world size; give --devices")
    tp, pp, cp = number("tensor_model_parallel_size", 1), number("pipeline_model_parallel_size", 1), \
        number("context_parallel_size", 1)
    if devices % (tp * pp * cp):
        raise UserError(f"Megatron-LM arguments: tp*pp*cp = {tp * pp * cp} does not divide --devices {devices}")
    layers = number("num_layers")
    per_chunk = number("num_layers_per_virtual_pipeline_stage")
    vpp = number("num_virtual_stages_per_pipeline_rank") or (layers // pp // per_chunk if per_chunk else 1)
    zero = 0
    if args.get("use_distributed_optimizer"):
        zero = 1
    if args.get("use_megatron_fsdp") or args.get("use_torch_fsdp2"):
        zero = {"optim_grads": 2, "optim": 1}.get(args.get("data_parallel_sharding_strategy", ""), 3)
    dp = devices // (tp * pp * cp)
    instances = number("num_distributed_optimizer_instances", 1)
    granularity = args.get("recompute_granularity", "")
    layout = Layout(dp=dp, zero=zero, shard=dp * cp // instances if instances > 1 else 0, tp=tp,
                    sp=bool(args.get("sequence_parallel")), pp=pp, vpp=vpp if pp > 1 else 1,
                    schedule="interleaved" if vpp > 1 else "1f1b", cp=cp,
                    first=number("decoder_first_pipeline_num_layers", 0) if pp > 1 else 0,
                    last=number("decoder_last_pipeline_num_layers", 0) if pp > 1 else 0,
                    embedding_layer=pp > 1 and bool(args.get("account_for_embedding_in_pipeline_split")),
                    loss_layer=pp > 1 and bool(args.get("account_for_loss_in_pipeline_split")),
                    ep=number("expert_model_parallel_size", 1), mbs=number("micro_batch_size", 1),
                    etp=number("expert_tensor_parallel_size", 0) if number("expert_model_parallel_size", 1) > 1 else 0,
                    recompute={"full": "full", "selective": "selective"}.get(granularity, "none"))
    precision = ("mxfp8" if args.get("fp8_recipe") == "mxfp8" else "fp8" if args.get("fp8_format") else
                 "bf16" if args.get("bf16") or args.get("fp16") else "fp32")
    seq = number("seq_length", 2048)
    return Shape(layout, number("global_batch_size", layout.mbs * dp), precision, seq,
                 _model_of(args, seq) if layers else None)


def _model_of(args: dict, seq: int) -> ModelSpec:
    """The model Megatron-LM's network-size arguments spell out (its defaults where one is left out)."""
    number = lambda key, default=0: int(args[key]) if key in args else default  # noqa: E731
    hidden, heads = number("hidden_size"), number("num_attention_heads")
    swiglu, biases = bool(args.get("swiglu")), not args.get("disable_bias_linear")
    layer_norm = args.get("normalization", "LayerNorm") == "LayerNorm"
    moe_freq = args.get("moe_layer_freq", "1")
    pattern = [int(x) for x in moe_freq.strip("[]").split(",")] if moe_freq.startswith("[") else None
    return ModelSpec(
        name="the Megatron-LM arguments' model", layers=number("num_layers"), hidden=hidden, heads=heads,
        ffn=number("ffn_hidden_size", 4 * hidden if not swiglu else int(8 * hidden / 3)),
        vocab=number("vocab_size", 50257), seq=seq,
        kv_heads=number("num_query_groups", heads) if args.get("group_query_attention") else heads,
        head_dim=number("kv_channels"), mlp="swiglu" if swiglu else "relu2" if args.get("squared_relu") else "gelu",
        norm="" if layer_norm == biases else "layernorm" if layer_norm else "rmsnorm",
        rotary_fraction=float(args.get("rotary_percent", 1.0)),
        tied_embeddings=not args.get("untie_embeddings_and_output_weights"),
        learned_positions=args.get("position_embedding_type", "learned_absolute") == "learned_absolute",
        biases=biases, experts=number("num_experts"),
        top_k=number("moe_router_topk", 2) if args.get("num_experts") else 0,
        expert_ffn=number("moe_ffn_hidden_size"),
        shared_experts=number("moe_shared_expert_intermediate_size") // max(number("moe_ffn_hidden_size"), 1),
        first_dense_layers=pattern.index(1) if pattern and 1 in pattern else 0)
