"""Megatron-LM's command line (`pretrain_gpt.py` arguments, megatron/training/arguments.py; Megatron-Core
turns them into its TransformerConfig and DistributedDataParallelConfig field by field).

Megatron's mesh is [pp, dp, cp, tp] as ours, and its expert ranks are carved out of dp x cp with the experts
TP-sharded like the rest (expert-tensor-parallel-size = tp). ZeRO-1 is its distributed optimizer, ZeRO-2/3
Megatron-FSDP's optim_grads / optim_grads_params, hybrid sharding its distributed-optimizer instances.
"""

import shlex

from meshscale.cost.comm import DDP_BUCKET_BYTES
from meshscale.export import Job, change
from meshscale.specs.layout import Layout, split_layers
from meshscale.specs.model import ModelSpec

PRECISIONS = {"bf16-pure": ("bf16", "Megatron-LM keeps fp32 main parameters under --bf16 (16 B/param)")}


def refusal(cluster) -> str | None:
    if cluster.torus:
        return f"Megatron-LM runs on GPUs; {cluster.name} is a TPU slice, use --emit maxtext"
    return None


def adapt(layout: Layout, model: ModelSpec) -> tuple[Layout, list[str]]:
    changes = []
    if layout.pp > 1 and layout.schedule not in ("1f1b", "interleaved"):
        layout, why = change(layout, f"Megatron-LM schedules 1F1B and interleaved 1F1B, not "
                                     f"{layout.schedule}", schedule="1f1b", vpp=1)
        changes.append(why)
    if layout.recompute == "op":
        layout, why = change(layout, "Megatron-LM recomputes whole layers or named modules, not every other "
                                     "matmul", recompute="full")
        changes.append(why)
    return layout, changes


def arguments(job: Job) -> list[str]:
    """The arguments, as `--flag` or `--flag value` items."""
    lay, model, sw = job.layout, job.model, job.cluster.software
    args = _model_arguments(model)
    args += [f"--seq-length {model.seq}", f"--micro-batch-size {lay.mbs}",
             f"--global-batch-size {job.global_batch}", f"--train-iters {job.steps}",
             f"--tensor-model-parallel-size {lay.tp}", f"--pipeline-model-parallel-size {lay.pp}",
             f"--context-parallel-size {lay.cp}"]
    if lay.sp:
        args.append("--sequence-parallel")
    if lay.tp > 1 and sw.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if lay.pp > 1:
        args += _pipeline_arguments(model, lay)
    if lay.cp > 1:
        args.append("--cp-comm-type p2p")  # K,V passed around the ring, as the cost model charges
    if lay.ep > 1:
        args += [f"--expert-model-parallel-size {lay.ep}", f"--expert-tensor-parallel-size {lay.tp}"]
        if sw.ep_comm_overlap:
            args.append("--overlap-moe-expert-parallel-comm")
    args += _data_parallel_arguments(job)
    args += {"none": [], "selective": ["--recompute-granularity selective"],
             "full": ["--recompute-granularity full", "--recompute-method uniform",
                      "--recompute-num-layers 1"]}[lay.recompute]
    if job.precision in ("bf16", "bf16-pure", "fp8"):
        args.append("--bf16")
    if job.precision == "fp8":
        args.append("--fp8-format hybrid")  # Transformer Engine's recipe: e4m3 forward, e5m2 gradients
    args.append(f"--data-path {shlex.quote(job.data)}" if job.data else "--mock-data")
    return args


def _model_arguments(model: ModelSpec) -> list[str]:
    args = [f"--num-layers {model.layers}", f"--hidden-size {model.hidden}",
            f"--num-attention-heads {model.heads}", f"--ffn-hidden-size {model.ffn}",
            f"--max-position-embeddings {model.seq}", "--tokenizer-type NullTokenizer",
            f"--vocab-size {model.vocab}"]
    if model.head_dim != model.hidden // model.heads and not model.uses_mla:
        args.append(f"--kv-channels {model.head_dim}")
    if model.kv_heads != model.heads:
        args += ["--group-query-attention", f"--num-query-groups {model.kv_heads}"]
    if model.mlp == "swiglu":
        args.append("--swiglu")
    if model.learned_positions:
        args += ["--position-embedding-type learned_absolute", "--normalization LayerNorm"]
    else:
        args += ["--position-embedding-type rope", "--normalization RMSNorm"]
    if not model.biases:
        args.append("--disable-bias-linear")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if model.is_moe:
        pattern = [int(model.is_moe_layer(i)) for i in range(model.layers)]
        args += [f"--num-experts {model.experts}", f"--moe-router-topk {model.top_k}",
                 f"--moe-ffn-hidden-size {model.expert_ffn}", "--moe-grouped-gemm",
                 "--moe-token-dispatcher-type alltoall", f"--moe-aux-loss-coeff {model.aux_loss_coef}",
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
    return args


def _pipeline_arguments(model: ModelSpec, lay: Layout) -> list[str]:
    if model.layers % lay.stages == 0:
        return ([f"--num-layers-per-virtual-pipeline-stage {model.layers // lay.stages}"]
                if lay.vpp > 1 else [])
    # the uneven cut the cost model charged (specs.layout.split_layers), stage by stage: E embedding,
    # t a transformer layer, L the output head and loss
    stages = ["t" * len(r) for r in split_layers(model.layers, lay.stages)]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "L"
    return [f"--pipeline-model-parallel-layout {'|'.join(stages)}"]


def _data_parallel_arguments(job: Job) -> list[str]:
    lay, sw = job.layout, job.cluster.software
    if lay.dp * lay.cp == 1:
        return []
    # buckets of the size the cost model charged: 25 MB of fp32 gradient (Megatron counts elements)
    args = [f"--ddp-bucket-size {int(DDP_BUCKET_BYTES // 4)}"]
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


def notes(job: Job) -> list[str]:
    return []
