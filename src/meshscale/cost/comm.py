"""Every collective a layout issues in one step: its contract bytes, the tier it crosses, its time.

Bytes follow the comm-accounting contract (parallel/ledger.py defines it): per-rank payload per optimizer
step, a call counting the FULL buffer the collective operates on; send_recv counts sends only (and the
receives, where each is a call that blocks its rank: Software.pipeline_receives_block). Wire factors
such as a ring's 2(n-1)/n are applied to time only.

On GPU clusters (ClusterSpec.gpu_arch) time is NCCL's: cost/collectives.py picks the algorithm and
protocol per call as NCCL's tuner does, with per-hop latencies by what each hop crosses. Elsewhere (TPU ICI,
calibrated CPU hosts) it is the alpha-beta model (Hockney 1994): steps * alpha + wire bytes / bus bandwidth,
with the ring volumes of Patarasuk & Yuan 2009 (all-reduce 2(n-1)/n V, all-gather / reduce-scatter
(n-1)/n V) and, for all-reduce latency, a double binary tree (2 log2 n steps) when shorter than the ring's.
"""

import itertools
import math
import operator
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache

from meshscale.cost import collectives
from meshscale.cost.kernels import expert_load
from meshscale.specs.cluster import FRAMEWORK_BUCKETS, ClusterSpec, Software
from meshscale.specs.layout import KEEPS_MATMULS, Layout, kv_heads_per_rank
from meshscale.specs.model import COLUMN_PARALLEL, ModelSpec
from meshscale.specs.placement import sends_per_rank



class Overlap(StrEnum):
    """What a collective may run behind (cost/step.py's rules say how much of it shows)."""
    NONE = "none"  # nothing: it runs alone
    ATTENTION = "attention"  # CP ring steps, behind the attention blocks they feed
    BACKWARD = "backward"  # gradient buckets, behind the last micro-batch's backward
    EACH_BACKWARD = "each_backward"  # gradient buckets, behind every micro-batch's backward (ZeRO-2)
    FORWARD = "forward"  # ZeRO-1/2's parameter all-gather, behind the next step's forward
    FSDP = "fsdp"  # ZeRO-3's gathers and reduce-scatters, one unit ahead, behind all compute
    OTHER_MICROBATCH = "other_microbatch"  # EP all-to-alls, behind another micro-batch's compute
    GEMM = "gemm"  # TP collectives decomposed into ring steps, behind the GEMM slices they feed
    WGRAD = "wgrad"  # SP's backward reduce-scatter, behind the column-parallel weight gradients


@dataclass
class CommOp:
    """One kind of collective a rank issues in a step: `calls` of them moving `bytes` in all (the contract's
    bytes, above), over the group of mesh axis `axis` (set by predict)."""
    collective: str  # all_reduce, all_gather, reduce_scatter, all_to_all, send_recv
    bytes: float
    calls: int
    overlap: Overlap = Overlap.NONE
    axis: str = ""


@dataclass(frozen=True)
class Link:
    tier: str
    bandwidth: float  # effective bytes/s per device for this group (efficiency applied)
    raw_bandwidth: float  # the same before efficiency (for the scaling book's rooflines)
    latency: float
    steps: int  # latency steps of one ring pass over the group
    fabric: collectives.Fabric | None = None  # NCCL's view of the group (GPU clusters): collective_time uses it
    # Alpha-beta groups (no NCCL fabric) whose all-to-alls and sends do not move at the ring's `bandwidth` (0: they
    # do): an all-to-all sends most of a rank's buffer through its own NIC when the group spans domains, and
    # crosses a torus at its bisection (`all_to_all_rate`); a ring's sends step together, each step waiting on
    # the pair that crosses between domains through one rank's NIC (as collectives._p2p_busbw on NCCL's).
    all_to_all_bandwidth: float = 0.0
    send_bandwidth: float = 0.0


# ---- what is communicated ----------------------------------------------------------------------------

def bucket_params(sw: Software, dp: int) -> float:
    """Parameters in one gradient bucket over `dp` ranks: [software] grad_bucket_params, or the framework's
    default (specs/cluster.py FRAMEWORK_BUCKETS); what the exporters write as the bucket size."""
    if sw.grad_bucket_params:
        return sw.grad_bucket_params
    floor, per_rank = FRAMEWORK_BUCKETS[sw.framework]
    return max(floor, per_rank * dp)


def grad_buckets(sw: Software, params: float, dp: int, first_stage: bool = True, chunks: int = 1) -> int:
    """Gradient buckets (reduce launches) for `params` parameters reduced over `dp` ranks by a pipeline rank
    holding `chunks` model chunks (`first_stage`: pipeline rank 0), as `sw.framework` cuts them."""
    size = bucket_params(sw, dp)
    if sw.framework == "megatron-core" and not sw.grad_bucket_params:
        if not sw.grad_reduce_overlap or not first_stage:
            return chunks
        return math.ceil(params / chunks / size) + chunks - 1
    return max(chunks, math.ceil(params / size))


def data_parallel_ops(zero: int, params: float, m: int, param_bytes: int, units: int,
                      root_params: float = 0.0, pipelined: bool = False, grad_bytes: int = 4,
                      update_bytes: int = 4, buckets: int = 1, all_reduced: bool = False,
                      trained: float | None = None) -> list[CommOp]:
    """The data-parallel family per optimizer step (the contract's rule, in one place).
    params: parameters on the rank; trained: those of them the optimizer updates (default all; LoRA's adapters),
    whose gradients are reduced and, under ZeRO-1/2, updated values gathered, where ZeRO-3 gathers every
    parameter; m: micro-batches per DP rank; gradients travel in `grad_bytes` per
    parameter (fp32 unless [software] grad_reduce_fp32 is off), ZeRO-1/2's updated parameters in
    `update_bytes` ([software] param_gather_fp32), ZeRO-3's gathered ones in `param_bytes`;
    units: FSDP wrapping units (layers + root); root_params: those in the root unit (embedding, final norm,
    head); pipelined: inside a pipeline schedule (pp > 1); buckets: DDP/ZeRO-1/2's gradient buckets
    (`grad_buckets`), each one launch of each collective; all_reduced: ZeRO-1 whose gradients are all-reduced
    (DeepSpeed's BF16_Optimizer, step.bf16_optimizer)."""
    trained = params if trained is None else trained
    grads = grad_bytes * trained
    if zero == 0:  # DDP: one all-reduce after the last micro-batch (no_sync before)
        return [CommOp("all_reduce", grads, buckets, Overlap.BACKWARD)]
    if zero == 1:  # reduce-scatter the gradient once; all-gather the updated params
        return [CommOp("all_reduce" if all_reduced else "reduce_scatter", grads, buckets, Overlap.BACKWARD),
                CommOp("all_gather", update_bytes * trained, buckets, Overlap.FORWARD)]
    if zero == 2:  # nobody holds a full gradient: reduce-scatter every micro-batch
        return [CommOp("reduce_scatter", grads * m, buckets * m, Overlap.EACH_BACKWARD),
                CommOp("all_gather", update_bytes * trained, buckets, Overlap.FORWARD)]
    blocks = params - root_params
    if pipelined:
        # FSDP2 inside torch's pipeline stages (measured on torch 2.13): the stage defers gradient sync and
        # backward resharding to the last micro-batch, so each block is gathered in every forward and once
        # for all backwards, the root once, and gradients are reduce-scattered once.
        return [CommOp("all_gather", param_bytes * ((m + 1) * blocks + root_params), (m + 1) * (units - 1) + 1,
                       Overlap.FSDP),
                CommOp("reduce_scatter", grads, units, Overlap.FSDP)]
    # zero=3 (FSDP2, measured on torch 2.13): each block is gathered (compute dtype) in forward and again in
    # backward, per micro-batch; the root is not resharded after forward, so it is gathered once.
    # Recompute adds no gather: the backward gather is already in place when the block re-runs.
    gathered = 2 * params - root_params
    return [CommOp("all_gather", m * param_bytes * gathered, m * (2 * units - 1), Overlap.FSDP),
            CommOp("reduce_scatter", m * grads, m * units, Overlap.FSDP)]


def replica_ops(zero: int, params: float, m: int, units: int, shard: int, replicas: int,
                pipelined: bool = False, grad_bytes: int = 4, buckets: int = 1) -> list[CommOp]:
    """Hybrid sharding (HSDP; Zhao et al. 2023, "PyTorch FSDP", sec. 3.2.2): after the shard group's
    reduce-scatter, each rank all-reduces its gradient shard (grad_bytes * params / shard bytes) with the ranks
    holding the same shard in the other `replicas` groups. FSDP2 (zero=3) does so after every reduce-scatter
    (each unit, each micro-batch; once per unit inside a pipeline), ZeRO-1/2 once per step per bucket."""
    if replicas == 1:
        return []
    v = grad_bytes * params / shard
    if zero in (1, 2):
        return [CommOp("all_reduce", v, buckets, Overlap.NONE)]
    times = 1 if pipelined else m
    return [CommOp("all_reduce", times * v, times * units, Overlap.FSDP)]


def tensor_parallel_ops(model: ModelSpec, layout: Layout, tokens: float, act_bytes: int, n_layers: int,
                        first: bool, last: bool, m: int, crossings: int = 0, moe_layers: int = 0,
                        framework: str = "torch", qkv_alone: bool = False) -> list[CommOp]:
    """Megatron TP (Shoeybi et al. 2019, sec. 3; Korthikanti et al. 2022, sec. 4.2.2), per micro-batch of
    `tokens`, as parallel/tensor.py runs it (the ledger measures exactly these bytes).
    Per layer: 2 all-reduces forward (g) + 2 backward (f); with SP each becomes an all-gather +
    reduce-scatter pair (4 AG and 4 RS per layer). A dense parallel-residual layer (GPT-J, GPT-NeoX, PaLM) is
    one region: its attention and MLP read the same input and their partial outputs are summed before one g
    (PaLM, Chowdhery et al. 2022, sec. 2), so half of that, and its norms (whose gradients then reach each
    rank only through its heads and columns) sum their weights' gradients over TP with or without SP. Full
    recompute repeats the forward's collectives, but for `framework` "torch" each layer's last: torch's
    non-reentrant checkpoint (torch.utils.checkpoint, our runtime's and torchtitan's) stops recomputing once the
    last tensor saved for backward is back, before the g after the layer's last row-parallel matmul, where
    Megatron-Core's CheckpointFunction and DeepSpeed's rerun the whole forward. The
    vocab-parallel embedding adds one forward all-reduce (SP: RS forward, AG backward); the column-parallel
    head one backward all-reduce (SP: AG forward, RS backward). Each of these moves the full s*b*h activation.
    Small ones, in fp32: SP's replicated norm weights sum their gradient over TP (2 per layer, and the final
    norm; each micro-batch in our runtime, once a step in Megatron-Core: `replicated_gradient_sums`), and the
    vocab-parallel loss all-reduces 3 numbers per token (max, sum of exponentials, target
    logit; Megatron-LM sec. 3). Without SP, each of the rank's `crossings` pipeline boundaries per
    micro-batch (see pipeline_ops) all-gathers the activation the TP ranks sent in slices. A MoE layer is one
    TP region like a dense MLP (but for Megatron-Core's MLP region under SP with EP, below),
    and its whole router weight sums its gradient over TP (experts*hidden, fp32).
    With tp > kv_heads each layer's replicated K and V weight gradients (fp32) are summed over the ranks
    sharing the head, every backward; a qk-norm's two weights (head_dim each) over TP, every backward.
    Under SP with `qkv_alone` ([software] tp_overlap_disable_qkv) each layer's forward all-gather before its QKV
    projection, and its rerun under full recompute, is an op of its own that nothing hides."""
    if layout.tp == 1:
        return []
    v = tokens * model.hidden * act_bytes
    fused = n_layers - moe_layers if model.parallel_residual else 0  # parallel blocks (MoE ones keep two regions)
    regions = 2 * n_layers - fused
    calls = (regions * (3 if layout.recompute == "full" else 2) + first + last) * m
    # each layer's last g, not rerun by torch's checkpoint (a reduce-scatter under SP, an all-reduce without)
    stopped = n_layers * m if layout.recompute == "full" and framework == "torch" else 0
    # a recomputed MLP region (the mlp module: dense layers'; moe: MoE layers') runs its forward's one again; a
    # parallel block's MLP has none of its own
    modules = layout.recompute_modules
    calls += ((n_layers - moe_layers - fused) * ("mlp" in modules) + moe_layers * ("moe" in modules)) * m
    # Where the EP dispatcher takes each TP rank's SP chunk of the tokens (Layout.dispatch_split: SP, or experts
    # split otherwise than TP), a MoE layer's MLP region has none of the SP gather and scatter: Megatron-Core's
    # MoELayer (moe_layer.py) routes and dispatches the sequence-parallel hidden states as they come (it asserts
    # SP where TP > 1), its dispatchers move them over the EP (or TP x EP) group, and any expert-TP gather and
    # scatter is expert_tensor_parallel_ops'. Those layers keep the attention region's half (and of the dgrad
    # reduce-scatters, the QKV's). A shared expert is a TP-split MLP beside them, and gathers and scatters the
    # sequence as a dense MLP does (Megatron-Core's SharedExpertMLP). parallel/tensor.py gathers the sequence
    # around every MoE layer under SP (its dispatcher picks each TP rank's chunk from the whole), so the runtime
    # (any other framework) keeps the dense count.
    chunked = framework == "megatron-core" and not model.shared_experts and layout.sp and layout.ep > 1 and \
        layout.dispatch_split == layout.tp
    sp_moe = moe_layers if chunked else 0
    calls -= sp_moe * (2 + (layout.recompute == "full") + ("moe" in modules)) * m
    # recompute=minimal (and minimal_mlp) keeps the weight matmuls' outputs (JAX's
    # checkpoint_dots_with_no_batch_dims, MaxText's "minimal") and rebuilds the rest the backward reads: each region's
    # input, gathered again under SP for its weight gradient, and in a two-region layer the sum the first region
    # hands the second, whose norm reads it (reduce-scattered again under SP, all-reduced again without)
    rebuilt = layout.recompute in KEEPS_MATMULS
    regathers = (regions - sp_moe) * m if rebuilt and layout.sp else 0
    resums = (n_layers - fused) * m if rebuilt else 0
    kv_calls = 2 * n_layers * m if layout.tp > model.kv_heads else 0
    small_calls = (3 if last else 0) * m + kv_calls
    small = (3 * m if last else 0) * tokens * 4 + kv_calls * model.hidden * model.head_dim * 4
    # TP-replicated weights whose gradient each rank holds only part of, (count, elements): the routers, the
    # qk-norms (each rank's heads), the norms' weights (LayerNorm: and biases) under SP (each rank's tokens) or in
    # a parallel block (its heads and columns), and under SP the GPT-style biases after the reduce-scatter
    norms = (2 * n_layers + last) * (2 if model.layer_norm else 1) + 2 * n_layers * model.biases if layout.sp else \
        2 * fused * (2 if model.layer_norm else 1)
    weights = ((moe_layers, model.experts * model.hidden), (2 * n_layers * model.qk_norm, model.head_dim),
               (norms, model.hidden))
    summed_calls, summed_bytes = replicated_gradient_sums(weights, m, framework)
    small, small_calls = small + summed_bytes, small_calls + summed_calls
    if not layout.sp:
        gathers = crossings * m
        calls += resums - stopped
        return [CommOp("all_reduce", v * calls + small, calls + small_calls, Overlap.NONE)] + \
            ([CommOp("all_gather", v * gathers, gathers, Overlap.NONE)] if gathers else [])
    # the column-parallel layers' (QKV, gate/up, the head) input gradients, reduce-scattered in backward
    dgrad = (regions - sp_moe + last) * m
    # a learned position table is added to the whole embedding, so it is all-reduced and then scattered (no
    # forward reduce-scatter; Megatron-Core's LanguageModelEmbedding reduce-scatters only without positions)
    positions = m if first and model.learned_positions else 0
    scatters = calls - dgrad - positions - stopped + resums
    qkv = n_layers * m * (2 if layout.recompute == "full" else 1) if qkv_alone else 0
    gathers = calls + regathers - qkv
    return [CommOp("all_gather", v * gathers, gathers, Overlap.GEMM)] + \
        ([CommOp("all_gather", v * qkv, qkv, Overlap.NONE)] if qkv else []) + \
        [CommOp("reduce_scatter", v * scatters, scatters, Overlap.GEMM),
         CommOp("reduce_scatter", v * dgrad, dgrad, Overlap.WGRAD),
         CommOp("all_reduce", small + v * positions, small_calls + positions, Overlap.NONE)]


def lora_adapter_ops(model: ModelSpec, layout: Layout, tokens: float, act_bytes: int, n_layers: int, m: int,
                     own_gather: bool = False, all_to_all: bool = False) -> list[CommOp]:
    """The TP collectives of LoRA's adapters, per micro-batch of `tokens`, as NeMo's ParallelLinearAdapter runs
    them (nemo/collections/nlp/modules/common/megatron/adapters/parallel_adapters.py, v2.0.0; nothing hides
    them). Beside a column-parallel matrix (QKV, gate/up) A is column-parallel with its r-wide output gathered
    and B column-parallel, whose input gradient is all-reduced: two r-wide collectives. Without SP, A's input
    gradient is all-reduced too, the full width. Under SP the adapter reads the gathered norm output Transformer
    Engine returns, unless (`own_gather`) TP overlap runs without disable_qkv: then it gathers the sequence
    itself and reduce-scatters its input gradient. Beside a row-parallel matrix (output projection, down) A is
    row-parallel, its r-wide output all-reduced, and B column-parallel (its input gradient all-reduced); its
    h-wide output is gathered over TP (without SP, and under SP unless `all_to_all`, where the SP split's
    backward gathers the sequence again), or under SP with `all_to_all` (a2a_experimental) sent to each rank's
    sequence slice by an all-to-all each way."""
    if not model.lora or layout.tp == 1:
        return []
    v, narrow = tokens * model.hidden * act_bytes, tokens * model.lora_rank * act_bytes
    columns = sum(t in COLUMN_PARALLEL for t in model.lora_targets) * n_layers * m
    rows = len(model.lora_targets) * n_layers * m - columns
    wide: dict[str, int] = {}
    if not layout.sp:
        wide = {"all_reduce": columns, "all_gather": rows}
    elif all_to_all:
        wide = {"all_to_all": 2 * rows}
    else:
        wide = {"all_gather": 2 * rows}
    if layout.sp and own_gather:
        wide["all_gather"] = wide.get("all_gather", 0) + columns
        wide["reduce_scatter"] = columns
    ops = [CommOp("all_gather", narrow * columns, columns, Overlap.NONE),
           CommOp("all_reduce", narrow * (columns + 2 * rows), columns + 2 * rows, Overlap.NONE)]
    # an all-to-all from (sequence, h / tp) to (sequence / tp, h) moves a TP rank's share, v / tp
    ops += [CommOp(kind, calls * (v / layout.tp if kind == "all_to_all" else v), calls, Overlap.NONE)
            for kind, calls in wide.items() if calls]
    return ops


def replicated_gradient_sums(weights: tuple, m: int, framework: str) -> tuple[int, float]:
    """(calls, bytes) of summing TP-replicated weights' fp32 gradients over TP, `weights` as (count, elements):
    one all-reduce per weight and micro-batch as our runtime does it (an f on each weight); Megatron-Core sums
    the accumulated gradients once a step in one coalesced all-reduce (finalize_model_grads.py,
    _allreduce_non_tensor_model_parallel_grads: the weights marked sequence_parallel, norms, biases and routers,
    and the qk layernorms)."""
    count, elements = sum(n for n, _ in weights), sum(n * e for n, e in weights)
    if framework == "megatron-core":
        return min(count, 1), elements * 4
    return count * m, elements * 4 * m


def pipeline_sends(layout: Layout, rank: int) -> int:
    """Sends per micro-batch from `rank` (specs.placement.sends_per_rank)."""
    return sends_per_rank(layout.pp, layout.stages, layout.v_shaped)[rank]


def pipeline_ops(model: ModelSpec, layout: Layout, tokens: float, act_bytes: int, m: int,
                 rank: int | None = None, receives_block: bool = False) -> list[CommOp]:
    """Activations forward and their gradients backward at each stage boundary, from pipeline rank `rank`
    (None: the rank sending most). Each TP rank sends 1/tp of the activation: its SP sequence shard, or
    without SP a slice the receiver all-gathers over TP (Megatron's scatter/gather, Narayanan et al. 2021,
    sec. 4.1; DeepSpeed's engine alike since 0.5.4, pipe/engine.py is_pipe_partitioned and is_grad_partitioned;
    tensor_parallel_ops counts the gather).
    Where `receives_block` (Software.pipeline_receives_block) the rank's receives are calls on its stream too:
    one for each send, since a rank receives across the same boundaries it sends across."""
    if layout.pp == 1:
        return []
    v = tokens * model.hidden * act_bytes / layout.tp
    per_rank = sends_per_rank(layout.pp, layout.stages, layout.v_shaped)
    calls = (max(per_rank) if rank is None else per_rank[rank]) * m * (2 if receives_block else 1)
    return [CommOp("send_recv", v * calls, calls, Overlap.NONE)]


def tied_embedding_ops(model: ModelSpec, layout: Layout, holds_an_end: bool) -> list[CommOp]:
    """Tied input and output embeddings split over a pipeline: the first and last stages sum their copies'
    gradients once per step (Megatron's embedding group, Narayanan et al. 2021), fp32, the table's TP shard.
    V schedules keep both ends on one rank: nothing travels."""
    if not (model.tied_embeddings and layout.pp > 1 and holds_an_end) or layout.v_shaped:
        return []
    rows = model.vocab / layout.tp
    if layout.zero == 3 and layout.dp * layout.cp > 1:  # each rank sums its FSDP shard (the first rank: the ceiling)
        rows = math.ceil(rows / layout.shard_size)
    return [CommOp("all_reduce", 4 * rows * model.hidden, 1, Overlap.NONE)]


def context_parallel_ops(model: ModelSpec, layout: Layout, tokens: float, act_bytes: int, n_layers: int,
                         m: int, moe_layers: int = 0) -> list[CommOp]:
    """Ring attention (Liu et al. 2023; Megatron CP), as parallel/context.py runs it: per layer each rank sends
    a K,V block cp-1 times forward; backward sends K,V cp-1 times again and the blocks' dK,dV cp-1 times;
    recompute of the attention core (selective, core_attn) or the block (full) repeats the forward's ring. Hidden
    behind the attention core. Each MoE layer's balance loss is per whole sequence: its per-sequence expert
    counts and router-probability sums (2 x sequences x experts, fp32) are all-reduced over CP in forward
    (Megatron-Core's router likewise all-reduces its token counts over the TP x CP group)."""
    if layout.cp == 1:
        return []
    kv_block = 2 * tokens * kv_heads_per_rank(model.kv_heads, layout.tp) * model.head_dim * act_bytes
    passes = 3 + (1 if layout.reruns("core_attn") else 0)
    sends = n_layers * m * (layout.cp - 1) * passes
    ops = [CommOp("send_recv", kv_block * sends, sends, Overlap.ATTENTION)]
    if moe_layers:
        sequences = tokens * layout.cp / model.seq
        calls = moe_layers * m * (2 if layout.reruns("moe") else 1)
        ops.append(CommOp("all_reduce", calls * 2 * sequences * model.experts * 4, calls, Overlap.NONE))
    return ops


def expert_parallel_ops(model: ModelSpec, layout: Layout, tokens: float, act_bytes: int, moe_layers: int,
                        m: int) -> list[CommOp]:
    """Token dispatch and combine all-to-alls per MoE layer, forward and backward (Lepikhin et al. 2020,
    GShard; DeepSeek-V3 sec. 3.2); each sends top_k copies of the tokens the rank dispatches; recompute of the MoE
    layer (full, or the moe module) dispatches and combines again in backward. Exact for the mean
    rank of an EP group under dropless routing (what a group sends, it receives); one rank's share depends on
    the routing (parallel/expert.py). Each TP rank dispatches its 1/tp chunk of the tokens where
    Layout.dispatch_split says so (SP, or an EP group folded across TP ranks, etp != tp: Megatron-Core's
    all-to-all dispatcher, whose input is the SP chunk; Liu et al. 2025 sec. 3); otherwise (etp = tp without
    SP) every TP rank sends its own copy to the TP-split experts. The group is ep ranks etp apart
    (cost/step.py `_axis_group`), so it crosses the links its folding puts it on."""
    if layout.ep == 1 or not moe_layers:
        return []
    v = tokens / layout.dispatch_split * model.top_k * model.hidden * act_bytes
    calls = moe_layers * m * (4 + (2 if layout.reruns("moe") else 0))
    return [CommOp("all_to_all", v * calls, calls, Overlap.OTHER_MICROBATCH)]


def expert_tensor_parallel_ops(model: ModelSpec, layout: Layout, tokens: float, act_bytes: int, moe_layers: int,
                               m: int) -> list[CommOp]:
    """Expert tensor parallelism around the experts' column- then row-parallel GEMMs (Megatron-Core's
    all-to-all dispatcher, token_dispatcher.py: gather_from_sequence_parallel_region over the expert-TP group
    after the dispatch, reduce_scatter_to_sequence_parallel_region before the combine; Liu et al. 2025
    sec. 3): where each TP rank dispatches its chunk and etp > 1, the etp ranks all-gather their arrivals and
    reduce-scatter the partial outputs, each etp x the rank's top_k * tokens/tp rows (the EP group's mean,
    like the all-to-all), forward, and the conjugate in backward; full recompute repeats the forward's.
    Where every TP rank dispatches all its tokens (etp = tp without SP) the experts' partial outputs are
    summed by the MoE region's TP all-reduce instead (tensor_parallel_ops)."""
    if layout.ep == 1 or not moe_layers or layout.expert_tp == 1 or layout.dispatch_split == 1:
        return []
    a = layout.expert_tp * tokens / layout.dispatch_split * model.top_k * model.hidden * act_bytes
    n = moe_layers * m * (2 + (1 if layout.reruns("moe") else 0))
    return [CommOp("all_gather", a * n, n, Overlap.NONE), CommOp("reduce_scatter", a * n, n, Overlap.NONE)]


# ---- where it travels ------------------------------------------------------------------------------

def torus_shape(cluster: ClusterSpec, devices: int, inner: int = 1) -> tuple:
    """The slice a job of `devices` chips runs on (several equal slices joined by DCN when it outgrows the
    largest), shaped for its innermost group of `inner` chips (`slice_dims`)."""
    largest = math.prod(cluster.torus)
    if devices <= largest:
        return slice_dims(cluster.torus, devices, inner) or (devices,)
    for count in range(-(-devices // largest), devices + 1):
        dims = slice_dims(cluster.torus, devices // count, inner) if devices % count == 0 else ()
        if dims:
            return dims
    return cluster.torus


@lru_cache(maxsize=4096)
def slice_dims(torus: tuple, chips: int, inner: int) -> tuple:
    """Dims of a slice of `chips`, each at most the torus's: a 3D slice of 64 chips or more is made of 4x4x4
    cubes (Cloud TPU v4/v5p system architecture: slice shapes are multiples of 4 on every axis, and the optical
    switches close each axis into a ring, Jouppi et al. 2023 sec. 2); others are powers of two (v5e's 2x2 to
    16x16). Preferred: a shape whose leading axes the innermost group of `inner` chips fills exactly, then the
    most cubic; () if none. The dims come in any order of the slice's axes: JAX's create_device_mesh
    (mesh_utils._create_device_mesh_for_nd_torus) lays each logical axis, the most communicating first, on
    whichever whole physical axes multiply to its size, so 8-way TP on a 4x4x8 slice gets the ring of 8."""
    cube = len(torus) == 3 and chips >= 64
    lengths = [[d for d in range(1, top + 1) if (d % 4 == 0 if cube else d & (d - 1) == 0)] for top in torus]
    shapes = {order for dims in itertools.product(*lengths) if math.prod(dims) == chips
              for order in itertools.permutations(dims)}
    if not shapes:
        return ()

    def fills(dims):
        return inner in itertools.accumulate(dims, operator.mul)

    return min(shapes, key=lambda d: (not fills(d), max(d) / min(d), [-x for x in d]))


@lru_cache(maxsize=4096)
def group_link(cluster: ClusterSpec, devices: int, size: int, stride: int) -> Link:
    """The link a group of `size` ranks, `stride` apart in the mesh, communicates over (a frozen Link, cached:
    predict and the planner's bound ask for the same few groups thousands of times)."""
    fast, slow = cluster.tiers[0], cluster.tiers[-1]
    if cluster.torus:
        return _torus_link(cluster, devices, size, stride)
    domain = min(fast.size or devices, devices)
    if size * stride <= domain or len(cluster.tiers) == 1:
        link = Link(fast.name, fast.bandwidth * fast.efficiency, fast.bandwidth, fast.latency, size - 1)
        return _with_fabric(cluster, link, size, 1)
    if stride >= domain:
        link = Link(slow.name, slow.bandwidth * slow.efficiency, slow.bandwidth, slow.latency, size - 1)
        return _with_fabric(cluster, link, 1, size)
    # Hierarchical: k members per domain share k NICs, so the scale-out part runs at k x NIC bandwidth
    # (nccl-tests multi-node busbw on DGX ~ 8 x NIC), capped by the fast tier.
    k = domain // stride
    bw = min(fast.bandwidth * fast.efficiency, k * slow.bandwidth * slow.efficiency)
    raw = min(fast.bandwidth, k * slow.bandwidth)
    # An all-to-all is not a ring: of a rank's buffer, (k-1)/size stays in its domain and (size-k)/size leaves
    # through the rank's own NIC, both at once (what collectives.all_to_all_seconds does on NCCL's fabric)
    a2a = all_to_all_rate(size, max((k - 1) / size / (fast.bandwidth * fast.efficiency),
                                    (size - k) / size / (slow.bandwidth * slow.efficiency)))
    link = Link(f"{fast.name}+{slow.name}", bw, raw, slow.latency, size - 1, all_to_all_bandwidth=a2a,
                send_bandwidth=slow.bandwidth * slow.efficiency)
    return _with_fabric(cluster, link, k, -(-size // k))


def _with_fabric(cluster: ClusterSpec, link: Link, ppn: int, nodes: int) -> Link:
    """The link with NCCL's view of its group (GPU clusters only): `ppn` ranks in each of `nodes` NVLink
    domains, the link's bus bandwidth, NVLS where the group has ranks sharing an NVSwitch."""
    if not cluster.gpu_arch:
        return link
    slow = cluster.tiers[-1]
    fast = cluster.tiers[0]
    fabric = collectives.Fabric(cluster.gpu_arch, ppn, nodes, link.bandwidth / 1e9,
                                cluster.nvls_bandwidth / 1e9 if ppn > 1 else 0.0,
                                slow.bandwidth * slow.efficiency / 1e9,
                                fast.bandwidth * fast.efficiency / 1e9 if ppn > 1 and nodes > 1 else 0.0,
                                host=cluster.host_cpu, nccl=cluster.software.nccl_release)
    return replace(link, fabric=fabric)


def _torus_link(cluster: ClusterSpec, devices: int, size: int, stride: int) -> Link:
    """Scaling book Part 2: a collective over M torus axes gets M times one axis's bandwidth; an axis
    covered only partly has no wraparound and gets half. Rings run per axis, so latency steps add up."""
    ici, dcn = cluster.tiers[0], cluster.tiers[-1]
    dims = torus_shape(cluster, devices, stride if stride > 1 else size)
    slice_size = math.prod(dims)
    if stride >= slice_size:
        return Link(dcn.name, dcn.bandwidth * dcn.efficiency, dcn.bandwidth, dcn.latency, size - 1)
    inside = min(size, slice_size // stride)
    axes, steps, longest = _axes_spanned(dims, stride, inside)
    bw_raw = ici.bandwidth * axes
    # An all-to-all's uniform traffic under dimension-order routing loads a torus's channels by its longest ring
    # (Dally & Towles 2004, sec. 3.3.1: k/8 of the injected rate on a bidirectional k-ary n-cube, k/4 on a
    # mesh): its ICI share of a rank's buffer takes longest x share / (4 x the per-axis bandwidth), the scaling
    # book's AllToAll on a ring, a quarter of an AllGather of the whole array (Part 3, question 10).
    ici_per_byte = longest * inside / size / (4 * ici.bandwidth * ici.efficiency)
    if inside < size:  # the group spans slices: DCN between them, `inside` chips per slice share it
        bw = min(bw_raw * ici.efficiency, inside * dcn.bandwidth * dcn.efficiency)
        dcn_per_byte = (size - inside) / size / (dcn.bandwidth * dcn.efficiency)  # each chip's own share of DCN
        return Link(f"{ici.name}+{dcn.name}", bw, min(bw_raw, inside * dcn.bandwidth), dcn.latency,
                    steps + size // inside, all_to_all_bandwidth=all_to_all_rate(size, max(ici_per_byte, dcn_per_byte)),
                    send_bandwidth=dcn.bandwidth * dcn.efficiency)
    return Link(ici.name, bw_raw * ici.efficiency, bw_raw, ici.latency, steps,
                all_to_all_bandwidth=all_to_all_rate(size, ici_per_byte))


def all_to_all_rate(n: int, seconds_per_byte: float) -> float:
    """Link.all_to_all_bandwidth of a group of `n` whose all-to-all takes `seconds_per_byte` of a rank's buffer:
    what `collective_time`'s (n-1)/n of the buffer is divided by."""
    return (n - 1) / n / seconds_per_byte if seconds_per_byte > 0 else 0.0


@lru_cache(maxsize=4096)
def _axes_spanned(dims: tuple, stride: int, size: int) -> tuple[float, int, float]:
    """Members are i*stride for i < size, the first dim innermost. Returns (axis weight, ring steps, longest
    ring): a fully covered axis counts 1, a partly covered one (no wraparound) 1/2; the longest ring is the
    most members along one axis over its weight."""
    axes, steps, block, longest = 0.0, 0, 1, 1.0
    for d in dims:
        touched = len({(i * stride // block) % d for i in range(size)})
        if touched > 1:
            weight = 1.0 if touched == d else 0.5
            axes += weight
            steps += touched - 1
            longest = max(longest, touched / weight)
        block *= d
    return max(axes, 0.5), max(steps, 1), longest


# DeepEP's normal (training) kernels, deepseek-ai/DeepEP README "Performance" (2025-02): on H800, one CX7
# 400 Gb/s NIC (50 GB/s) per GPU, DeepSeek-V3's setting (4096 tokens, hidden 7168, 256 experts, top-8), the
# bottleneck bandwidth of dispatch / combine: intranode EP8 153 / 158 GB/s (NVLink); internode EP16 43 / 43,
# EP32 44 / 47, EP64 46 / 45 GB/s (RDMA). The bytes are DeepEP's own (tests/test_intranode.py and
# test_internode.py): NVLink, the rows a rank receives, one per (token, destination rank), its own included;
# RDMA, one per (token, destination node), its own node included (the README's later note: "logical bandwidth
# ... contains local rank traffic"). As fractions of the links' nominal one-way rates: the README's "~160 GB/s"
# is the H800's achievable NVLink, its nominal 200 GB/s (DeepEP issue #16, the maintainers), so NVLink 0.78 --
# and on H100-class NVLink (450 GB/s nominal) DeepEP's intranode test measured 337 GB/s on H20 (issue #16),
# 0.75; RDMA 0.86 at EP16, 0.91 at EP32, 0.91 at EP64 and beyond.
DEEPEP_NVLINK = (153 + 158) / 2 / 200
DEEPEP_RDMA = ((16, 43 / 50), (32, (44 + 47) / 2 / 50), (64, (46 + 45) / 2 / 50))


@dataclass(frozen=True)
class Dispatcher:
    """A [software] moe_dispatcher's kernels: the SMs they hold while they run, the NVLink rate they reach where
    the link is not what bounds them, ((ranks in the NVLink domain, B/s), ...), and their RDMA rate as a fraction
    of the rank's NIC, ((EP ranks, fraction), ...), both in DeepEP's bytes (above)."""
    sms: int
    nvlink: tuple
    rdma: tuple


# On NVLink5 (900 GB/s) the kernels, not the link, set the rate. NVIDIA's Hybrid-EP benchmarks in DeepEP
# (Hybrid-EP_Implementation.md, 2025-09; DeepSeek-V3's setting, random uniform routing, torch API, BF16 dispatch
# and combine, the mean of the two): DeepEP's normal kernels on 8 B200 at 16 / 24 SMs 348 / 494 and 302 / 420
# GB/s, so 391 at their 20 (Megatron-Core's moe_deepep_num_sms; DeepSeek-V3 sec. 3.2.2 "only 20 SMs"; 8 GB200
# on MNNVL agree, 403); Hybrid-EP at Megatron-Core's moe_hybridep_num_sms, 16, on GB200 NVL72 by ranks: EP8
# 544, EP16 474, EP24 443, EP32 454, EP36 444 GB/s (8 B200: 533), and across H100 nodes (one 400 Gb/s NIC a
# GPU) 53.9, 49.9, 43.9 GB/s at EP16, 32, 64 in the same logical bytes as DeepEP's RDMA figures. Neither has a
# Hopper NVLink scan: there the link binds first (DEEPEP_NVLINK of it).
DISPATCHERS = {
    "deepep": Dispatcher(20, ((1, 391e9),), DEEPEP_RDMA),
    "hybridep": Dispatcher(16, ((1, 544e9), (16, 474e9), (24, 443e9), (32, 454e9), (36, 444e9)),
                           ((16, 53.9 / 50), (32, 49.9 / 50), (64, 43.9 / 50))),
}


def _by_size(rows: tuple, n: int) -> float:
    """The value of the last row whose size `n` reaches (the first row's below them all)."""
    return next((v for size, v in reversed(rows) if n >= size), rows[0][1])


# Megatron-Core's TP overlap (--tp-comm-overlap) runs on Transformer Engine's userbuffers, not NCCL. Its default
# (transformer_engine/pytorch/module/base.py initialize_ub, get_default_config, 2024): ring-exchange all-gathers
# (the forward's and those ahead of the row-parallel dgrads) hold 1 SM; the pipelined forward reduce-scatters and
# the bulk backward all-gathers (the column-parallel wgrads' inputs) and reduce-scatters hold 16. Per layer, half
# the all-gathers are each kind.
USERBUFFER_SMS = {"all_gather": (1 + 16) / 2, "reduce_scatter": 16}


def distinct_groups(experts: int, top_k: int, groups: int) -> float:
    """Expected groups (ranks or nodes, each holding experts/groups of the experts) a token's top_k distinct
    experts fall in, under balanced routing (every set of top_k experts equally likely):
    groups * (1 - C(experts - experts/groups, top_k) / C(experts, top_k))."""
    if groups <= 1 or not experts or not top_k:
        return float(min(groups, max(top_k, 1)))
    return groups * (1 - math.comb(experts - experts // groups, top_k) / math.comb(experts, top_k))


def deepep_seconds(nbytes: float, calls: int, n: int, link: Link, cluster: ClusterSpec, experts: int = 0,
                   top_k: int = 0, dispatcher: str = "deepep") -> float:
    """Dispatch or combine of a rank's `nbytes` (top_k copies of each token it dispatches, the contract's bytes;
    `experts` and `top_k` of the model) by DeepEP's kernels, its normal or its Hybrid-EP ones (`dispatcher`, a
    DISPATCHERS key): they send a token once to each rank (NVLink) and once to each node (RDMA) holding one of
    its experts (`distinct_groups`; top_k 0, unknown: every byte once on NVLink, the other nodes' share on
    RDMA), NVLink at the slower of DEEPEP_NVLINK of the link and the kernels' own rate, RDMA at their measured
    fraction of the rank's NIC, both at once (the slower sets the time), in DeepEP's own bytes (above); per call
    the latency of NCCL's all-to-all over the same ranks."""
    kernels = DISPATCHERS[dispatcher]
    fast, slow = cluster.tiers[0], cluster.tiers[-1]
    fabric = link.fabric
    ppn = fabric.ppn if fabric else n
    nodes = max(1, n // ppn)
    if top_k:
        row = nbytes / top_k  # one copy of every token the rank dispatches
        nvlink, rdma_bytes = row * distinct_groups(experts, top_k, n), row * distinct_groups(experts, top_k, nodes)
    else:
        nvlink, rdma_bytes = nbytes, (n - ppn) / n * nbytes
    inside = nvlink / min(fast.bandwidth * DEEPEP_NVLINK, _by_size(kernels.nvlink, min(n, ppn)))
    outside = 0.0
    if nodes > 1:
        outside = rdma_bytes / (slow.bandwidth * _by_size(kernels.rdma, n))
    latency = collectives.all_to_all_seconds(fabric, 0.0, calls) if fabric else calls * link.steps * link.latency
    return max(inside, outside) + latency


def sm_share(cluster: ClusterSpec, axis: str, link: Link | None = None, collective: str = "") -> float:
    """The share of compute throughput a collective of `axis` takes from the kernels running beside it: the SMs
    its kernels hold, one thread block per NCCL channel (collectives.collective_blocks: 24 on Ampere and Hopper,
    18% of an H100, 32 on Blackwell, 16 from NCCL 2.28; a send/recv over `link` holds collectives.p2p_blocks, 4
    once it crosses the network), DeepEP's 20 or Hybrid-EP's 16 for MoE dispatch and combine (DISPATCHERS),
    Transformer Engine's userbuffers for Megatron-Core's TP overlap (USERBUFFER_SMS).
    Measured: GEMMs beside NCCL collectives slow 18.9% on average (max 40%) on A100 and H100 (Agrawal et al.
    2025, arXiv:2507.03114, "Characterizing Compute-Communication Overlap"); NVIDIA's forum case of a 132-tile
    GEMM beside a 24-block all-gather on H100 shows the mechanism, and benchmarks/kernel_scan.py's interference
    rows measure it on an H200: an 8192^3 bf16 GEMM beside a copy holding 8 or 24 thread blocks slowed as their
    share of the 132 SMs predicts, within 1%. A measured `ClusterSpec.overlap_slowdown` wins; 0 off NVIDIA GPUs
    (TPU ICI collectives run on DMA engines)."""
    if cluster.overlap_slowdown is not None and axis != "ep":
        return cluster.overlap_slowdown
    if not (cluster.gpu_arch and cluster.compute_units):
        return 0.0
    blocks: float
    if axis == "ep" and cluster.software.moe_dispatcher in DISPATCHERS:
        blocks = DISPATCHERS[cluster.software.moe_dispatcher].sms
    elif axis == "tp" and collective in USERBUFFER_SMS and userbuffers(cluster.software):
        blocks = USERBUFFER_SMS[collective]
    elif collective == "send_recv" and link is not None and link.fabric is not None:
        blocks = collectives.p2p_blocks(link.fabric)
    else:
        blocks = collectives.collective_blocks(cluster.gpu_arch, cluster.software.nccl_release)
    return min(1.0, blocks / cluster.compute_units)


def tp_decomposed(sw, collective: str) -> bool:
    """Whether [software] splits a TP all-gather or reduce-scatter into steps behind the GEMM it feeds or
    follows (tp_comm_overlap; its reduce-scatters only with tp_overlap_scatters)."""
    return sw.tp_comm_overlap and (collective == "all_gather" or sw.tp_overlap_scatters)


def userbuffers(sw) -> bool:
    """Whether TP's all-gathers and reduce-scatters run on Transformer Engine's userbuffers (Megatron-Core's
    --tp-comm-overlap) rather than NCCL."""
    return sw.tp_comm_overlap and sw.framework == "megatron-core"


def expert_dispatch_time(cluster: ClusterSpec, nbytes: float, calls: int, n: int, link: Link,
                         model: ModelSpec) -> float:
    """The EP all-to-alls of the busiest EP rank (kernels.expert_load times the mean rank's bytes, which it
    receives and returns: the padded buffers, or the busiest rank's share) by the [software] moe_dispatcher
    (DeepEP's or Hybrid-EP's kernels: the model's experts and top_k say how many ranks and nodes each token goes
    to, `deepep_seconds`)."""
    sw = cluster.software
    if sw.moe_dispatcher in DISPATCHERS and n > 1 and nbytes:
        t = deepep_seconds(nbytes, calls, n, link, cluster, model.experts, model.top_k, sw.moe_dispatcher)
    else:
        t = collective_time("all_to_all", nbytes, calls, n, link)
    return t * expert_load(model, sw, n)


def nccl_fabric(link: Link, n: int):
    """The fabric NCCL's model (cost/collectives.py) costs a group of `n` on `link` over, or None where the
    alpha-beta model does: no NCCL fabric, or one whose ranks are not the group's."""
    return link.fabric if link.fabric is not None and link.fabric.ranks == n else None


def collective_time(collective: str, nbytes: float, calls: int, n: int, link: Link) -> float:
    """Seconds of `calls` calls moving `nbytes` in all over a group of `n` on `link`; calls=0: bandwidth
    time alone (a lower bound whatever the calls, for the planner)."""
    if n <= 1 or nbytes == 0:
        return 0.0
    fabric = nccl_fabric(link, n)
    if fabric is not None:
        return collectives.seconds(collective, fabric, nbytes, calls)
    bw, alpha = link.bandwidth, link.latency
    if collective == "all_reduce":
        steps = min(2 * link.steps, 2 * math.ceil(math.log2(n)))
        return 2 * (n - 1) / n * nbytes / bw + calls * steps * alpha
    if collective == "all_to_all":
        bw = link.all_to_all_bandwidth or bw
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * nbytes / bw + calls * link.steps * alpha
    return nbytes / (link.send_bandwidth or bw) + calls * alpha  # send_recv: point to point
