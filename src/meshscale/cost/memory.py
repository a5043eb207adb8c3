"""Bytes each device holds: parameters, gradients, optimizer states and activations.

Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO, sec. 3.1): bf16 params (2) + bf16 grads (2) + fp32
master, momentum and variance (12) = 16 bytes/param, sharded by ZeRO stage (ZeRO sec. 5: stage 1 shards the
12, stage 2 also the grads, stage 3 also the params). Activations follow Korthikanti et al. 2022
(arXiv:2205.05198) Table 2, generalised from GPT's 4h GeLU MLP to the model's own widths.
"""

from dataclasses import dataclass
from functools import lru_cache

from meshscale.cost.flops import block_matmuls
from meshscale.specs.cluster import ClusterSpec, is_fp8
from meshscale.specs.layout import KEEPS_MATMULS, REBUILDS_LAYER, Layout, kv_heads_per_rank
from meshscale.specs.placement import chunk_ranges, head_rank, layout_ends, rank_layers
from meshscale.specs.model import COLUMN_PARALLEL, ModelSpec

# (params, grads, optimizer) bytes per parameter, and the dtype activations and gathered params travel in.
PRECISIONS = {
    "bf16": dict(params=2, grads=2, optimizer=12, compute=2),  # ZeRO's 16 bytes/param
    # bf16 weights, gradients and AdamW moments, no master: 2 + 2 + 2 * 2 = 8 bytes/param (the recipe of
    # Zamirai et al. 2020, "Revisiting BFloat16 Training", sec. 3: pure bf16 state; torch's AdamW keeps its
    # moments in the parameter's dtype, and `train --precision bf16-pure` holds exactly these bytes)
    "bf16-pure": dict(params=2, grads=2, optimizer=4, compute=2),
    "fp8": dict(params=2, grads=2, optimizer=12, compute=2),  # fp8 GEMMs, bf16 weights kept (TE recipe)
    "mxfp8": dict(params=2, grads=2, optimizer=12, compute=2),  # block-scaled fp8 GEMMs, the same weights
    "int8": dict(params=2, grads=2, optimizer=12, compute=2),  # AQT's int8 GEMMs (cost/kernels.py), bf16's state
    "fp32": dict(params=4, grads=4, optimizer=8, compute=4),  # no separate master copy
}


def weight_bytes(cluster: ClusterSpec, precision: str) -> int:
    """Bytes a weight holds between steps: the precision's, but 1 under FP8 parameters ([software]
    fp8_param_gather: Transformer Engine's fp8_model_init keeps each weight as an FP8 tensor, the fp32 master being
    the optimizer's) where no second FP8 copy sits beside it. Hopper's FP8 GEMMs read TN operands alone, so a weight
    keeps its transpose unless that cache is off (disable_parameter_transpose_cache), and MXFP8 and blockwise weights
    keep both layouts (as kernels.weight_cast_bytes moves them). A LoRA run's frozen weights are that one byte alone:
    MLPerf's Llama 2 70B LoRA configs (fp8_params, the cache off) hold 69 GB of them on each GPU of a TP1 layout."""
    sw = cluster.software
    if not (sw.fp8_param_gather and is_fp8(precision)):
        return PRECISIONS[precision]["params"]
    transposed = cluster.gpu_arch != "blackwell" and not sw.disable_parameter_transpose_cache
    return 2 if transposed or cluster.fp8_recipe(precision) in ("mxfp8", "blockwise") else 1


def optimizer_bytes(cluster: ClusterSpec, precision: str, zero: int) -> int:
    """Optimizer-state bytes a parameter holds: the precision's (mixed precision: an fp32 master and two fp32
    moments, 12), or under Megatron-Core's precision-aware optimizer with its distributed optimizer (zero >= 1)
    the master as 16-bit remainders beside bf16 parameters (fp32 beside FP8 ones) and the moments in
    [software] adam_moments: 2 + 8, or 2 + 4 with bf16 moments."""
    sw = cluster.software
    if not (sw.precision_aware_optimizer and zero >= 1):
        return PRECISIONS[precision]["optimizer"]
    master = 4 if sw.fp8_param_gather and is_fp8(precision) else 2
    return master + 2 * (2 if sw.adam_moments == "bf16" else 4)


@dataclass(frozen=True)
class Memory:
    params: float
    grads: float
    optimizer: float
    activations: float
    gathered: float = 0.0  # ZeRO-3: the unsharded units beside the shards (`fsdp_gathered`)
    frozen: float = 0.0  # LoRA: the frozen weights, which no update reads or writes (`params` is the adapters)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.gathered + self.frozen

    def to_dict(self) -> dict:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "gathered": self.gathered, "frozen": self.frozen,
                "total": self.total}


def params_on_rank(model: ModelSpec, layout: Layout, rank: int) -> float:
    """Parameters one device holds before ZeRO sharding. Megatron TP splits every matrix (and the
    vocabulary) by tp and replicates norms, the row-parallel biases and the MoE router; routed experts are
    split by ep and etp (Megatron-Core's expert tensor parallelism, Liu et al. 2025)."""
    return params_per_rank(model, layout.tp, layout.ep, layout.expert_tp, layout.pp, layout.stages,
                           layout.v_shaped, layout_ends(layout))[rank]


def trained_params_on_rank(model: ModelSpec, layout: Layout, rank: int) -> float:
    """Of `params_on_rank`, those the optimizer updates (and whose gradients data parallelism reduces): all of
    them, or under LoRA the adapters of the rank's layers."""
    return trained_per_rank(model, layout.tp, layout.ep, layout.expert_tp, layout.pp, layout.stages,
                            layout.v_shaped, layout_ends(layout))[rank]


@lru_cache(maxsize=4096)
def trained_per_rank(model: ModelSpec, tp: int, ep: int, etp: int, pp: int, chunks: int, v_shaped: bool,
                     ends: tuple = ()) -> tuple:
    """`trained_params_on_rank` of every pipeline rank. A LoRA adapter is split over TP as its matrix
    (kernels.adapter_seconds), so a rank holds 1/tp of its layers' adapters."""
    if not model.lora:
        return params_per_rank(model, tp, ep, etp, pp, chunks, v_shaped, ends)
    owned = (rank_layers(model.layers, pp, chunks, v_shaped, rank, model.mtp_layers, ends) for rank in range(pp))
    return tuple(len(layers) * model.adapter_params() / tp for layers in owned)


def adapter_widths(model: ModelSpec, tp: int) -> tuple:
    """(input, output) widths of each LoRA adapter on a rank: beside a column-parallel matrix (QKV, gate and
    up) it reads the whole input and writes the rank's columns, beside a row-parallel one (output and down
    projections) it reads the rank's rows and writes the whole output (NeMo's ParallelLinearAdapter)."""
    return tuple((i, o / tp) if target in COLUMN_PARALLEL else (i / tp, o)
                 for target, (i, o) in zip(model.lora_targets, model.lora_matrices()))


def adapter_saved_elements(model: ModelSpec, tp: int) -> float:
    """Elements (2-byte ones; a 1-byte mask counts 1/2) a layer's LoRA adapters keep for backward per token
    beyond what their matrices' inputs already are: with dropout, each adapter's dropped-out input and its mask;
    A's rank-r output always."""
    dropout = 1.5 if model.lora_dropout else 0.0
    return sum(dropout * i + model.lora_rank for i, _ in adapter_widths(model, tp))


def root_params_on_rank(model: ModelSpec, layout: Layout, rank: int) -> float:
    """Parameters outside the transformer blocks (embedding, final norm, output head) on one device.
    FSDP wraps them in the root unit, which is gathered once per micro-batch (see comm.data_parallel_ops)."""
    return _root_params(model, layout.tp, layout.pp, layout.v_shaped, rank)


def _root_params(model: ModelSpec, tp: int, pp: int, v_shaped: bool, rank: int) -> float:
    table = model.vocab * model.hidden / tp
    total = 0.0
    if rank == 0:
        total += table + (model.seq * model.hidden if model.learned_positions else 0)
    if rank == (0 if v_shaped else pp - 1):  # final norm, and the output head (a second copy of a tied table under PP)
        final_norm = model.hidden * (2 if model.layer_norm else 1)  # LayerNorm has a bias
        total += final_norm + (table if not model.tied_embeddings or pp > 1 else 0)
    return total


@lru_cache(maxsize=4096)
def params_per_rank(model: ModelSpec, tp: int, ep: int, etp: int, pp: int, chunks: int, v_shaped: bool,
                    ends: tuple = ()) -> tuple:
    """`params_on_rank` of every pipeline rank, from the layout's degrees (what the planner's bound reads)."""
    per_layer = _layer_params_on_rank(model, tp, ep, etp)
    # the multi-token prediction modules beside the head: two norms, a column-parallel 2h -> h projection and a
    # layer like the last (DeepSeek-V3 sec. 2.2)
    mtp = model.mtp_layers * (per_layer[-1] + 2 * model.hidden * model.hidden / tp + 2 * model.hidden)
    head = 0 if v_shaped else pp - 1
    owned = (rank_layers(model.layers, pp, chunks, v_shaped, rank, model.mtp_layers, ends) for rank in range(pp))
    return tuple(sum(per_layer[i] for i in layers) + _root_params(model, tp, pp, v_shaped, rank)
                 + (mtp if rank == head else 0) for rank, layers in enumerate(owned))


@lru_cache(maxsize=1024)
def _layer_params_on_rank(model: ModelSpec, tp: int, ep: int, etp: int) -> tuple:
    """Each layer's parameters on one device under tp, ep and etp (the routed experts: experts/ep of them,
    each split etp ways)."""
    per_layer = []
    for i in range(model.layers):
        routed = model.experts * model.expert_params() if model.is_moe_layer(i) else 0
        whole = _tp_replicated_params(model, i)
        per_layer.append((model.layer_params(i) - routed - whole) / tp + routed / (etp * ep) + whole
                         + kv_replicated_params(model, tp))
    return tuple(per_layer)


@lru_cache(maxsize=4096)
def heaviest_rank(model: ModelSpec, tp: int, ep: int, etp: int, pp: int, chunks: int, v_shaped: bool,
                  ends: tuple = ()) -> int:
    """The pipeline rank holding the most parameters (the first of equals)."""
    per_rank = params_per_rank(model, tp, ep, etp, pp, chunks, v_shaped, ends)
    return max(range(pp), key=per_rank.__getitem__)


@lru_cache(maxsize=4096)
def fsdp_gathered(model: ModelSpec, tp: int, ep: int, etp: int, pp: int, chunks: int,
                  v_shaped: bool, ends: tuple = (), root_held: bool = True) -> tuple[float, float]:
    """(parameters, gradients), in parameters, that ZeRO-3 (parallel/fsdp.py: a unit per block, the root holding
    embedding, final norm and head) holds unsharded beside the shards at the step's peak, on the pipeline rank
    holding the most. A unit is gathered with the next one prefetched (Zhao et al. 2023, "PyTorch FSDP", sec.
    3.3: two units in flight), its gradient whole until reduce-scattered. `root_held`: torch's FSDP does not
    reshard the root after forward (fully_shard: "the root FSDP state has its value specially set to False";
    FSDP1's _post_forward_reshard alike), so its parameters stay gathered through backward and its gradients
    whole until its reduce-scatter at backward's end; other frameworks (XLA, which frees a buffer when its last
    use is done; DeepSpeed's ZeRO-3, which repartitions each module after use) hold it only while it runs.
    Inside a pipeline stage FSDP2 defers backward's resharding and the reduce-scatter to the last micro-batch
    (measured, cost/comm.py data_parallel_ops): the stage's parameters and gradients are whole then (taken for
    every framework: no other was measured)."""
    rank = heaviest_rank(model, tp, ep, etp, pp, chunks, v_shaped, ends)
    if pp > 1:
        whole = params_per_rank(model, tp, ep, etp, pp, chunks, v_shaped, ends)[rank]
        return whole, whole
    per_layer = _layer_params_on_rank(model, tp, ep, etp)
    block = max(per_layer[i] for i in rank_layers(model.layers, pp, chunks, v_shaped, rank, model.mtp_layers, ends))
    root = _root_params(model, tp, pp, v_shaped, rank)
    if root_held:
        return root + 2 * block, root + block
    return max(root, block) + block, max(root, block)


def _tp_replicated_params(model: ModelSpec, layer: int) -> float:
    """Parameters of a layer every TP rank holds whole: norms, the biases added after a row-parallel sum
    (attention output and MLP down projection), the router (and Qwen2-MoE's shared-expert gate)."""
    router = model.hidden * (model.experts + model.shared_expert_gate)
    return (model.norm_params() + (2 * model.hidden if model.biases else 0)
            + (router if model.is_moe_layer(layer) else 0))


def expert_params_on_rank(model: ModelSpec, layout: Layout, rank: int) -> float:
    """Routed expert parameters one device holds (split by ep and etp): what EP reduces, and ZeRO shards, over
    the expert data-parallel group (tp*cp*dp/(ep*etp) ranks, Layout.edp) rather than over dp*cp."""
    return expert_params_per_rank(model, layout.ep, layout.expert_tp, layout.pp, layout.stages,
                                  layout.v_shaped, layout_ends(layout))[rank]


@lru_cache(maxsize=4096)
def expert_params_per_rank(model: ModelSpec, ep: int, etp: int, pp: int, chunks: int, v_shaped: bool,
                           ends: tuple = ()) -> tuple:
    """`expert_params_on_rank` of every pipeline rank, from the layout's degrees."""
    one_layer = model.experts * model.expert_params() / (etp * ep)
    owned = (rank_layers(model.layers, pp, chunks, v_shaped, r, model.mtp_layers, ends) for r in range(pp))
    return tuple(one_layer * sum(model.is_moe_layer(i) for i in layers) for layers in owned)


def zero_held(params: float, experts: float, zero: int, stage: int, shard: int, expert_shard: int) -> float:
    """Of `params` on a device (`experts` of them routed experts), what it keeps when ZeRO stage `stage` shards
    this kind of state: dense ones over the shard group (`shard`: dp*cp, or a hybrid-sharding group), experts
    over their replicas, the expert data-parallel group (`expert_shard`)."""
    if zero < stage:
        return params
    return (params - experts) / shard + experts / expert_shard


def kv_replicated_params(model: ModelSpec, tp: int) -> float:
    """K and V projection parameters a TP rank holds beyond its 1/tp share when tp exceeds kv_heads and each
    rank keeps a copy of its KV head (Megatron-LM's grouped-query rule)."""
    extra_heads = kv_heads_per_rank(model.kv_heads, tp) - model.kv_heads / tp
    return 2 * (model.hidden + (1 if model.biases or model.qkv_bias else 0)) * model.head_dim * extra_heads


def busiest_rank(model: ModelSpec, layout: Layout) -> int:
    return heaviest_rank(model, layout.tp, layout.ep, layout.expert_tp, layout.pp, layout.stages, layout.v_shaped,
                         layout_ends(layout))


def activation_bytes_per_layer(model: ModelSpec, layout: Layout, tokens: float, fused_attention: bool = False,
                               eager: bool = False) -> float:
    """One layer, one micro-batch of `tokens` (= s*b) on one device, 2-byte activations.

    Korthikanti et al. 2022 eq. 2: s*b*h*(34 + 5*a*s/h), of which 10*s*b*h (norms, block inputs, dropout
    masks) is not split by TP unless SP is on; the 5*a*s^2*b attention scores vanish with selective
    recompute (sec. 5) and with a fused (flash) attention kernel. Full recompute keeps each layer's input, 2*s*b*h.
    The dropout masks and the scores' dropout output exist only for models trained with dropout: GPT-style
    models (biases; Brown et al. 2020) do, LLaMA-style models do not (Touvron et al. 2023).
    """
    h, s, t = model.hidden, model.seq, layout.tp
    if eager and fused_attention and layout.recompute in ("none", "selective"):
        return 2 * tokens * eager_saved_elements(model, t, layout.sp, layout.recompute == "selective")
    if layout.recompute == "full":
        return 2 * tokens * h / (t if layout.sp else 1)
    if layout.recompute == "op":  # the block's input, the saved matmul outputs and the attention output (tp=1)
        saved = block_matmuls(model)[0::2]
        return 2 * tokens * (h + sum(o for _, o in saved) + model.heads * model.head_dim)
    if layout.recompute in KEEPS_MATMULS:  # minimal_mlp reruns the MLP's first matmul: its output is not kept
        return 2 * tokens * minimal_saved_elements(model, t, layout.sp, eager, layout.recompute == "minimal")
    kv = kv_heads_per_rank(model.kv_heads, t) * t * model.head_dim  # replicated KV heads count on every rank
    # Attention block: qkv input 2h, Q 2h(q width), K and V 2kv each, out-proj input 2h, dropout mask h.
    q = model.heads * model.head_dim
    attn_split = 2 * q + 4 * kv + 2 * q
    # per MLP width: GeLU's input and output, or SwiGLU's gate, up and their product (the down projection's input)
    per_width = 6 if model.gated_mlp else 4
    modules = layout.recompute_modules  # Megatron-Core's recompute modules keep only their inputs
    if "mla_up_proj" in modules:  # MLA's Q, K, V, rebuilt from the latents its up-projections keep anyway
        attn_split -= 2 * q + 4 * kv
    mlp_split = 0.0 if "mlp" in modules else per_width * model.ffn
    routing = 0.0
    if model.is_moe:
        routed = (per_width - 2 * ("moe_act" in modules)) * model.top_k * model.expert_ffn  # moe_act: the act's output
        shared = 0.0 if "shared_experts" in modules else per_width * model.shared_experts * model.expert_ffn
        # Megatron-Core's MoE layer (moe_utils.permute/unpermute): the top_k permuted copies of each token the
        # experts' first GEMM keeps (the rank's arrivals: gathered over ETP, every ETP rank running its slice of
        # the experts on them all, etp/tp of the tokens' copies; expert.py), the experts' outputs the combine
        # keeps for the gradient of the routing probabilities, and the router's fp32 probabilities, both on the
        # rank's own (SP) tokens
        routing = (2 * model.top_k * h * layout.expert_tp / t
                   + (2 * model.top_k * h + 4 * model.experts) / (t if layout.sp else 1))
        mlp_split = routed + shared
        if "moe" in modules:  # the whole MoE layer, shared experts included, from its input
            mlp_split = routing = 0.0
    # two norms' inputs (4h) and outputs (the attention and MLP inputs, 4h; layernorm recompute drops them), masks
    unsplit = (10 if model.biases else 8) * h - (4 * h if "layernorm" in modules else 0)
    # the scores' softmax output (2 bytes), and with dropout its mask (1) and output (2)
    scores = (5 if model.biases else 2) * model.heads * s if "core_attn" not in modules and not fused_attention else 0
    # LoRA: frozen matrices' inputs, kept for nothing but their weight gradients
    frozen_unsplit, frozen_split = _frozen_inputs(model, "layernorm" in modules, "mlp" in modules)
    per_token = ((unsplit - frozen_unsplit) / (t if layout.sp else 1)
                 + (attn_split + mlp_split - frozen_split + scores) / t + routing)
    return (per_token + 2 * adapter_saved_elements(model, t)) * tokens


def _frozen_inputs(model: ModelSpec, norms_rerun: bool, mlp_rerun: bool) -> tuple[float, float]:
    """Bytes per token, (TP-unsplit, TP-split), that LoRA's frozen matrices need not keep: their inputs, which
    only a weight gradient reads (Transformer Engine's Linear and LayerNormLinear save the input only when the
    weight requires a gradient): the two norms' outputs (QKV's and the MLP's first matrix's inputs) and a dense
    MLP's down-projection input, unless an adapter without dropout reads that same input in backward. The
    output projection's input stays: it is the attention's output, which the attention core's backward reads."""
    if not model.lora:
        return 0.0, 0.0
    bare = not model.lora_dropout  # an adapter without dropout keeps its matrix's input for its A's gradient
    keeps_qkv, keeps_fc1, keeps_fc2 = (bare and t in model.lora_targets for t in ("linear_qkv", "linear_fc1",
                                                                                "linear_fc2"))
    norms = 0.0 if norms_rerun else 2 * model.hidden * ((not keeps_qkv) + (not keeps_fc1))
    down = 0.0 if keeps_fc2 or mlp_rerun or model.is_moe else 2 * model.ffn
    return norms, down


def minimal_saved_elements(model: ModelSpec, tp: int, sp: bool, eager: bool, mlp_in: bool = True) -> float:
    """Elements per token one layer keeps under recompute=minimal: its input, and the weight matmuls' outputs
    backward reads (q, k, v and, where `mlp_in`, the MLP's first, split by TP; a sequential block's attention
    projection, which rebuilds the second norm's input, split by SP). That is what JAX's partial evaluation
    (MaxText) and a compiled graph's partitioner keep; eager torch's selective checkpoint keeps each output its
    policy saves, so also the down projection's and a parallel block's attention projection's."""
    stream = 3 if eager else 1 + (not model.parallel_residual)  # the input, attention projection, down
    first = model.mlp_in_width if mlp_in else 0.0
    qkv = model.heads * model.head_dim / tp + 2 * kv_heads_per_rank(model.kv_heads, tp) * model.head_dim
    return stream * model.hidden / (tp if sp else 1) + qkv + first / tp


def zero_copy_bytes(precision: str, zero: int) -> int:
    """Bytes per parameter, sharded as the optimizer state, that ZeRO-1/2 add in fp32: a master shard for the
    optimizer to update and the shard gradient the reduce-scatter lands in (stage 1 keeps it beside the full
    gradient; stage 2's is the gradient counted already). DeepSpeed's stage 1/2 optimizer keeps both whatever
    the precision (its fp32 partitions), as parallel/zero.py does; mixed precision counts the master among its
    12 bytes."""
    if precision != "fp32" or zero not in (1, 2):
        return 0
    return 4 + (4 if zero == 1 else 0)


def eager_saved_elements(model: ModelSpec, tp: int, sp: bool, selective: bool) -> float:
    """Elements per token one block of our runtime (models/transformer.py) keeps for backward when every operator
    runs eagerly ([software] fused_elementwise = false), as autograd saves them (tests/test_calibrate.py
    counts them with saved-tensor hooks): per RMSNorm its input, rsqrt and normalised output, (LayerNorm: input,
    mean and rstd) sharded by SP, and the projection's input, gathered whole; for attention the query, key and
    value as the fused kernel sees them (keys and values expanded to the query heads), its output and log-sum-
    exp (RoPE multiplies by constant tables and keeps nothing); SwiGLU's gate, up, silu and product (GeLU: input
    and output). Selective recompute keeps the projections' outputs and the attention output instead."""
    q = model.heads * model.head_dim / tp
    kv = kv_heads_per_rank(model.kv_heads, tp) * model.head_dim
    width = ((model.top_k + model.shared_experts) * model.expert_ffn if model.is_moe else model.ffn) / tp
    norm = (model.hidden + 2 if model.layer_norm else 2 * model.hidden + 1) / (tp if sp else 1) + model.hidden
    attention = q + 2 * kv + q if selective else 4 * q + model.heads / tp
    return 2 * norm + attention + (4 if model.gated_mlp else 2) * width


def inflight_microbatches(layout: Layout, m: int) -> float:
    """Micro-batches whose activations the first pipeline rank holds at its peak.
    GPipe: all m. 1F1B and ZB-H1: p (Narayanan et al. 2021 sec. 2.2.1). Interleaved: p*(1 + (p-1)/(p*v))
    (Korthikanti et al. 2022 sec. 4.2.3). ZB-V: p (Qi et al. 2024). DualPipeV: p+1 (DeepSeek-V3 Table 2)."""
    p, v = layout.pp, layout.vpp
    if p == 1:
        return 1
    if layout.schedule == "gpipe":
        return m
    if layout.schedule == "interleaved":
        return min(m, p) * (1 + (p - 1) / (p * v))
    if layout.schedule == "dualpipev":
        return min(m, p + 1)
    return min(m, p)


def held_layer_microbatches(model: ModelSpec, layout: Layout, m: int) -> float:
    """Layer activations (one layer, one micro-batch each) the first pipeline rank holds at its peak. The
    interleaved schedule is counted chunk by chunk: rank 0 runs (p-1)*2 + (v-1)*p warm-up forwards, p micro-
    batches per chunk in turn, then one more before its first backward (Megatron-LM, schedules.py,
    forward_backward_pipelining_with_interleaving), and its chunks differ in size (the embedding takes a slot
    in the first). Other schedules: the rank's layers times inflight_microbatches."""
    return held_layers(model.layers, layout.pp, layout.vpp, layout.schedule, m, model.mtp_layers, layout_ends(layout))


@lru_cache(maxsize=65536)
def held_layers(layers: int, pp: int, vpp: int, schedule: str, m: int, mtp: int = 0, ends: tuple = ()) -> float:
    """`held_layer_microbatches` from the layout's pipeline degrees and schedule (what the planner's bound reads)."""
    layout = Layout(pp=pp, vpp=vpp, schedule=schedule)
    own = rank_layers(layers, pp, pp * vpp, layout.v_shaped, 0, mtp, ends)
    if pp == 1 or schedule != "interleaved":  # rank 0 holds the last chunk, and its MTP modules, alone or in a V
        mtp_here = mtp if pp == 1 or layout.v_shaped else 0
        return (len(own) + mtp_here) * inflight_microbatches(layout, m)
    ranges = chunk_ranges(layers, pp * vpp, mtp, pp, ends)
    sizes = [len(ranges[c]) for c in range(0, pp * vpp, pp)]  # rank 0's chunks, in order
    forwards = min((pp - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    # forward k runs chunk (k // pp) % vpp: pp forwards of each chunk a cycle, then what is left of one
    cycles, rest = divmod(forwards, pp * vpp)
    return sum(size * (cycles * pp + min(pp, max(0, rest - c * pp))) for c, size in enumerate(sizes))


def memory_per_device(model: ModelSpec, layout: Layout, global_batch: int, precision: str = "bf16",
                      fused_attention: bool = True, eager: bool = False, root_held: bool = True,
                      weights: int = 0, optimizer: int = 0) -> Memory:
    """What each device holds; `weights` and `optimizer`: bytes a weight and its optimizer state hold
    (`weight_bytes`, `optimizer_bytes`; 0: the precision's)."""
    layout = layout.resolve_mbs(global_batch)
    m = layout.microbatches(global_batch)
    bytes_ = PRECISIONS[precision]
    rank = busiest_rank(model, layout)
    p, e = params_on_rank(model, layout, rank), expert_params_on_rank(model, layout, rank)
    # ZeRO/FSDP shard over the ranks holding the same parameters (or a hybrid-sharding group of them); under
    # LoRA the frozen weights have no gradient or optimizer state, and the adapters (`trained`) have all three
    shard, expert_shard = layout.shard_size, layout.edp
    trained, trained_experts = trained_params_on_rank(model, layout, rank), (0.0 if model.lora else e)
    # LoRA's adapters are modules of their own beside the FP8 ones, in the precision's dtype
    weights = weights or bytes_["params"]
    params = zero_held(trained, trained_experts, layout.zero, 3, shard, expert_shard) * (
        bytes_["params"] if model.lora else weights)
    frozen = zero_held(p, e, layout.zero, 3, shard, expert_shard) * weights if model.lora else 0.0
    grads = zero_held(trained, trained_experts, layout.zero, 2, shard, expert_shard) * bytes_["grads"]
    state = zero_held(trained, trained_experts, layout.zero, 1, shard, expert_shard) * (
        (optimizer or bytes_["optimizer"]) + zero_copy_bytes(precision, layout.zero))
    gathered = 0.0
    if layout.fsdp:  # the unsharded units beside the shards, in the compute dtype
        gathered = sum(fsdp_gathered(model, layout.tp, layout.ep, layout.expert_tp, layout.pp, layout.stages,
                                     layout.v_shaped, layout_ends(layout), root_held))
        gathered *= bytes_["compute"]
    tokens = layout.mbs * model.seq / layout.cp
    scale = bytes_["compute"] / 2
    # The first rank (busiest in activations) holds its layers for each micro-batch in flight; the embedding
    # counts as a layer in the cut, so it holds fewer (Llama 3, Dubey et al. 2024 sec. 3.3.2, balances so).
    # Parameters are those of the busiest rank: a bound when the two differ.
    per_layer = activation_bytes_per_layer(model, layout, tokens, fused_attention, eager) * scale
    # offloaded layers' activations wait in host memory (Layout.offload: pp=1, one micro-batch in flight)
    acts = per_layer * (held_layer_microbatches(model, layout, m) - layout.offload)
    # fp32 logits for the loss where the first rank also holds the head (counted once: freed right away).
    logits = 4 * tokens * model.vocab / layout.tp if head_rank(layout) == 0 else 0.0
    # one layer is rebuilt at a time during backward, after the loss's backward has freed the logits: the two
    # never coexist, the larger sets the peak
    rebuilt = (rebuilt_layer_bytes(model, layout.tp, layout.sp, tokens, fused_attention, eager) * scale
               if layout.recompute in REBUILDS_LAYER else 0.0)
    acts += max(rebuilt, logits)
    return Memory(params=params, grads=grads, optimizer=state, activations=acts, gathered=gathered,
                  frozen=frozen)


def rebuilt_layer_bytes(model: ModelSpec, tp: int, sp: bool, tokens: float, fused_attention: bool,
                        eager: bool) -> float:
    """What the one layer rebuilt at a time under full, op or minimal recompute holds (2-byte activations): all it
    saves, which a fused-attention Korthikanti count gives as the selective one; eagerly, everything."""
    recompute = "none" if eager else "selective"
    return activation_bytes_per_layer(model, Layout(tp=tp, sp=sp, recompute=recompute), tokens, fused_attention,
                                      eager)
