"""Tensor parallelism (Megatron column/row split) and sequence parallelism over one TP process group.

Shoeybi et al. 2019, "Megatron-LM", sec. 3: a column-parallel matmul followed by a row-parallel one needs
one collective in forward and one in backward, placed by the conjugate operators f (identity forward,
all-reduce backward) and g (all-reduce forward, identity backward). Korthikanti et al. 2022, "Reducing
Activation Recomputation", sec. 4.2.2: with sequence parallelism the residual stream, norms and
pointwise work are sharded along the sequence, g becomes a reduce-scatter and f an all-gather.

We use our own autograd functions on plain tensors rather than DTensor: every parameter stays an ordinary
local shard (so FSDP2 over "dp" and our flat-buffer ZeRO-1/2 see plain tensors), and every collective is a
plain `torch.distributed` call whose payload goes straight into the comm ledger.

Bytes per micro-batch of b x s tokens on a stage with L blocks, P of them dense parallel-residual blocks
(`ParallelBlock`: one TP region, the others two; R = 2L - P regions) (A = b*s*hidden*activation bytes, the full
residual-stream buffer; emb/head = 1 where the stage holds the embedding / output head, else 0):
  sp off: all_reduce tp  2*(R + emb + head) * A    (g forward and f backward of every region)
          all_reduce tp  2P * hidden * 4           (a parallel block's norm weights, fp32; LayerNorm: x2)
  sp on:  all_gather tp  (2R + emb + head) * A,  reduce_scatter tp  (2R + emb + head) * A,
          all_reduce tp  (2L + head) * hidden * 4   (norm-weight gradients, fp32; GPT-style: LayerNorm
          biases too, and the row-parallel biases wo and w2, 2L * hidden * 4 more); with a learned position
          table the embedding's forward reduce-scatter is an all-reduce A (`scatter_after_positions`)
  loss (stage with the head): all_reduce tp  3 * b*s*4  (max, sum of exponentials, target logit)
  pp > 1, sp off: all_gather tp  A  per boundary crossing to another pipeline rank (the receiver's forward,
          the sender's backward: Megatron's scatter/gather, `scatter_gather_stage`)
  tp > kv_heads (KV-head replication): all_reduce tp  2L * hidden*head_dim * 4  (the K and V weight
          gradients of a head, summed over the tp/kv_heads ranks holding copies of it)
Recomputed blocks run their forward collectives again in backward, but each block's last g: torch's non-reentrant
checkpoint stops once the last tensor saved for backward (the last row-parallel matmul's input) is back.

Biases (GPT-style): a column-parallel bias is split with its output features; a row-parallel one is added
once, after the sum (Megatron's RowParallelLinear). A MoE layer is one region: f before the router and the
experts, g after the weighted combine; each expert is column/row split like a dense MLP. The router weight
stays whole: its gradient, partial on each rank (the combine weights meet partial expert outputs), is summed
by an f on the weight, as SP does for norm weights (all_reduce tp  experts*hidden*4 per MoE layer), and only
TP rank 0 sends the balance loss's gradient (every rank computes the same one).
KV-head replication (grouped-query attention with tp a multiple of kv_heads, Megatron-LM's rule): rank r
holds query heads [r*heads/tp, (r+1)*heads/tp), which all read KV head r // (tp/kv_heads); each rank keeps a
copy of that head's K and V projections, and their gradients are summed over the ranks sharing it.
"""

import time
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from meshscale.models.transformer import Block, MoE, RMSNorm, Transformer, compute_dtype
from meshscale.parallel.compat import all_gather_into, all_reduce, reduce_scatter_from
from meshscale.parallel.construct import owned_slice
from meshscale.parallel.ledger import record
from meshscale.parallel.mesh import kv_copy_mesh

# Parameters left whole on every TP rank (norms, router, position table, row-parallel biases); everything
# else is a TP shard.
_REPLICATED_SUFFIXES = ("norm.weight", "norm.bias", "router.weight", "pos_embeddings.weight", "wo.bias",
                        "w2.bias", "shared_gate.weight")


def _timed(collective: str, nbytes: int, fn, *args, **kwargs) -> None:
    start = time.perf_counter()
    fn(*args, **kwargs)
    record("tp", collective, nbytes, time.perf_counter() - start)


# ---- collectives on the TP group (each one recorded with the contract's payload) ------------------------
def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous().clone()
    _timed("all_reduce", x.numel() * x.element_size(), all_reduce, x, group=group)
    return x


def _gather_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(b, s/t, ...) -> (b, s, ...), concatenating the ranks' sequence chunks in rank order."""
    t = dist.get_world_size(group)
    local = x.transpose(0, 1).contiguous()
    out = local.new_empty((t * local.shape[0], *local.shape[1:]))
    _timed("all_gather", out.numel() * out.element_size(), all_gather_into, out, local, group=group)
    return out.transpose(0, 1)


def _reduce_scatter_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(b, s, ...) partial sums -> (b, s/t, ...) of the summed sequence chunk this rank owns."""
    t = dist.get_world_size(group)
    full = x.transpose(0, 1).contiguous()
    out = full.new_empty((full.shape[0] // t, *full.shape[1:]))
    _timed("reduce_scatter", full.numel() * full.element_size(), reduce_scatter_from, out, full, group=group)
    return out.transpose(0, 1)


def _same(x: torch.Tensor, group) -> torch.Tensor:
    return x.view_as(x)


def _split_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(b, s, ...) replicated -> (b, s/t, ...), this rank's sequence chunk (no communication)."""
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    return x.narrow(1, rank * (x.shape[1] // t), x.shape[1] // t).contiguous()


class Conjugate(torch.autograd.Function):
    """A collective in forward and its conjugate in backward, over one TP group (`forward(x, group)`,
    `backward(grad, group)`; the MoE dispatcher's variable-size pair binds its sizes first)."""

    @staticmethod
    def forward(ctx, x, group, forward, backward):
        ctx.group, ctx.conjugate = group, backward
        return forward(x, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.conjugate(grad, ctx.group), None, None, None


class _Pair(NamedTuple):
    forward: Callable
    backward: Callable

    def apply(self, x: torch.Tensor, group) -> torch.Tensor:
        return Conjugate.apply(x, group, self.forward, self.backward)


# Megatron's f: the input is replicated, so its gradient is the sum of every rank's partial one.
_CopyToTP = _Pair(_same, _all_reduce)
# Megatron's g: sum the partial outputs of a row-parallel matmul.
_ReduceFromTP = _Pair(_all_reduce, _same)
# SP's f: all-gather the sequence before a column-parallel matmul; reduce-scatter its gradient.
_GatherSeq = _Pair(_gather_seq, _reduce_scatter_seq)
# SP's g: reduce-scatter the partial sums of a row-parallel matmul along the sequence.
_ReduceScatterSeq = _Pair(_reduce_scatter_seq, _gather_seq)


def _entering(sequence_parallel: bool) -> _Pair:
    """What enters a column-parallel region: f, or SP's all-gather."""
    return _GatherSeq if sequence_parallel else _CopyToTP


def _leaving(sequence_parallel: bool) -> _Pair:
    """What leaves a row-parallel region: g, or SP's reduce-scatter."""
    return _ReduceScatterSeq if sequence_parallel else _ReduceFromTP


# Megatron's scatter to the sequence-parallel region: keep this rank's chunk; all-gather the gradient.
_ScatterSeq = _Pair(_split_seq, _gather_seq)


class _ScatterToNextStage(torch.autograd.Function):
    """Megatron's scatter at a pipeline boundary (Narayanan et al. 2021, sec. 4.1): without SP the stage's
    output is replicated over TP, so each TP rank sends only its 1/t slice (b, s*h/t); the gradient comes
    back in slices and is all-gathered."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.shape = group, x.shape
        t, rank = dist.get_world_size(group), dist.get_rank(group)
        # a copy, never a view: zero-bubble schedules detach stage outputs in place
        return x.reshape(x.shape[0], t, -1)[:, rank].clone()

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(grad, ctx.group).reshape(ctx.shape), None


class _GatherFromPreviousStage(torch.autograd.Function):
    """The receiving side of the scatter: all-gather the slices over the fast TP links; the gradient is
    replicated over TP (the first block's f sums it), so each rank returns its own slice."""

    @staticmethod
    def forward(ctx, x, group, hidden):
        ctx.group = group
        return _gather_seq(x, group).reshape(x.shape[0], -1, hidden)

    @staticmethod
    def backward(ctx, grad):
        t, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.reshape(grad.shape[0], t, -1)[:, rank].contiguous(), None, None


# ---- modules ----------------------------------------------------------------------------------------
class VocabParallelEmbedding(nn.Module):
    """Each rank holds rows [lo, hi) of the table; tokens outside it look up zeros, and the sum over ranks
    (all-reduce, or reduce-scatter along the sequence with SP) completes every row. With SP and a learned
    position table the sum is an all-reduce and the sequence is scattered after the positions are added
    (`scatter_after_positions`)."""

    def __init__(self, weight: nn.Parameter, lo: int, group, sequence_parallel: bool):
        super().__init__()
        self.weight = weight
        self.lo, self.group, self.sequence_parallel = lo, group, sequence_parallel

    def forward(self, tokens):
        local = tokens - self.lo
        outside = (local < 0) | (local >= self.weight.shape[0])
        h = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        h = compute_dtype(h.masked_fill(outside.unsqueeze(-1), 0.0))  # one rank's row, zeros elsewhere: exact
        if self.sequence_parallel:
            return _ReduceScatterSeq.apply(h, self.group)
        return _ReduceFromTP.apply(h, self.group)


class GradSummedLayerNorm(nn.LayerNorm):
    """A replicated LayerNorm whose weight and bias gradients each TP rank holds only part of (its sequence
    chunk under SP; its heads' and MLP columns' share in a parallel block): both are summed over the TP group
    (f on each, as GradSummedRMSNorm does for its weight)."""

    def __init__(self, norm: nn.LayerNorm, group):
        super().__init__(norm.normalized_shape, norm.eps, device="meta")
        self.weight, self.bias = norm.weight, norm.bias
        self.group = group

    def forward(self, x):
        return nn.functional.layer_norm(x, self.normalized_shape, _CopyToTP.apply(self.weight, self.group),
                                        _CopyToTP.apply(self.bias, self.group), self.eps)


class GradSummedRMSNorm(RMSNorm):
    """A replicated RMSNorm whose weight gradient each TP rank holds only part of (its sequence chunk under
    SP; its heads' and MLP columns' share in a parallel block; Qwen3's qk-norm over each rank's heads): the
    gradient is summed over the TP group, exactly as f does for a replicated input."""

    def __init__(self, norm: RMSNorm, group):
        super().__init__(norm.weight.shape[0], norm.eps)
        self.weight = norm.weight
        self.group = group

    def forward(self, x):
        xf = x.float()
        normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return (normed * _CopyToTP.apply(self.weight, self.group)).type_as(x)  # as RMSNorm: the input's dtype


class ReplicatedKVLinear(nn.Module):
    """A copy of one KV head's K or V projection, held by each of the TP ranks whose query heads read it;
    its gradient is summed over them (f on the weight, as for the replicated norm weights under SP)."""

    def __init__(self, weight: nn.Parameter, group):
        super().__init__()
        self.weight = weight
        self.group = group

    def forward(self, x):
        return nn.functional.linear(x, _CopyToTP.apply(self.weight, self.group))


def _replicate_kv(linear: nn.Linear, rank: int, t: int, kv_heads: int, group) -> ReplicatedKVLinear:
    return ReplicatedKVLinear(owned_slice(linear.weight, 0, rank // (t // kv_heads), kv_heads), group)


def _shard(linear: nn.Linear, dim: int, rank: int, t: int) -> None:
    """Keep this rank's contiguous slice of the weight: dim 0 (output features) for a column-parallel
    matmul, dim 1 (input features) for a row-parallel one. Contiguous slices keep whole heads together,
    and whole kv-head groups with their query heads. A column-parallel bias is split the same way."""
    linear.weight = owned_slice(linear.weight, dim, rank, t)
    if dim == 0 and linear.bias is not None:
        linear.bias = owned_slice(linear.bias, 0, rank, t)


class RowParallelLinear(nn.Module):
    """A row-parallel matmul ending its region: g (or SP's reduce-scatter) on the partial products, then the
    bias, added once. Holds `weight` and `bias` under their original names. Under SP the bias meets only
    this rank's tokens, so its gradient is summed over TP (f on the bias). reduce=False: the partial products
    alone, for a parallel block that sums its branches before one g (ParallelBlock adds the bias)."""

    def __init__(self, linear: nn.Linear, rank: int, t: int, group, sequence_parallel: bool, reduce: bool = True):
        super().__init__()
        _shard(linear, 1, rank, t)
        self.weight, self.bias = linear.weight, linear.bias
        self.group, self.op = group, _leaving(sequence_parallel)
        self.bias_op = _CopyToTP if sequence_parallel else None
        self.reduce = reduce

    def forward(self, x):
        out = nn.functional.linear(x, self.weight)
        if not self.reduce:
            return out
        return self.add_bias(self.op.apply(out, self.group))

    def add_bias(self, out: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return out
        return out + (self.bias_op.apply(self.bias, self.group) if self.bias_op else self.bias)


class ParallelBlock(Block):
    """A parallel-residual block (GPT-J, GPT-NeoX, PaLM: x + attention(norm1(x)) + mlp(norm2(x))) under TP.
    Both branches read the block's input and their outputs are summed, so one f (SP: one all-gather) enters
    both and one g (SP: one reduce-scatter) leaves them with the sum of their partial products: one collective
    each way per layer where a sequential block needs two (Chowdhery et al. 2022, "PaLM", sec. 2, Parallel
    Layers; GPT-NeoX's gpt_j_residual reduces once). The norms then meet the whole input on every rank, but
    their gradients only through this rank's heads and columns, so theirs are summed (GradSummed*Norm).
    `apply_tensor_parallel` turns a dense parallel-residual Block into one (its parameters and names unchanged)."""

    tp_group: object
    tp_enter: "_Pair"
    tp_leave: "_Pair"

    def forward(self, x, cos, sin, mask=None):
        h = self.tp_enter.apply(x, self.tp_group)
        partial = self.attention(self.attention_norm(h), cos, sin, mask) + self.feed_forward(self.ffn_norm(h))
        out = self.tp_leave.apply(partial, self.tp_group)
        return x + self.feed_forward.w2.add_bias(self.attention.wo.add_bias(out))


def _shard_columns(mlp: nn.Module, rank: int, t: int) -> None:
    for column in (mlp.w1, mlp.w3):  # w3 is None in a GeLU MLP
        if column is not None:
            _shard(column, 0, rank, t)


def _shard_moe(moe: MoE, group, rank: int, t: int, sequence_parallel: bool, split_experts: bool) -> None:
    """Each expert (and the shared one) split like a dense MLP; their partial outputs meet in the combine,
    summed by the region's g. split_experts=False (etp=1): the routed experts stay whole (expert.py runs
    them on the tokens of this rank's sequence chunk)."""
    routed = list(moe.experts.values()) if split_experts else []
    for mlp in [*routed, *([moe.shared] if moe.shared is not None else [])]:
        _shard_columns(mlp, rank, t)
        _shard(mlp.w2, 1, rank, t)
    moe.router.copy_weight = lambda w: _CopyToTP.apply(w, group)
    if rank:
        moe.aux_weight = 0.0
    _enter_region(moe, group, sequence_parallel)
    _leave_region(moe, group, sequence_parallel)


def _enter_region(module: nn.Module, group, sequence_parallel: bool) -> None:
    """Input boundary of a column-parallel region: f (or the SP all-gather) on the first argument."""
    op = _entering(sequence_parallel)
    module.register_forward_pre_hook(lambda _m, args: (op.apply(args[0], group), *args[1:]))


def _leave_region(module: nn.Module, group, sequence_parallel: bool) -> None:
    """Output boundary of a row-parallel region: g (or the SP reduce-scatter)."""
    op = _leaving(sequence_parallel)
    module.register_forward_hook(lambda _m, _args, out: op.apply(out, group))


def _group_of(tp_mesh):
    return tp_mesh.get_group() if hasattr(tp_mesh, "get_group") else tp_mesh


def apply_tensor_parallel(model: Transformer, tp_mesh, sequence_parallel: bool = False,
                          split_experts: bool = True) -> Transformer:
    """Shard `model` (a whole model or one pipeline stage of it) in place over the TP group.

    tp_mesh: a 1-D DeviceMesh (e.g. mesh["tp"]), or a ProcessGroup when tp divides kv_heads. Parameter
    names do not change.
    The model then returns vocabulary-sharded logits: use `vocab_parallel_cross_entropy` as the loss.
    With SP, activations between blocks (and between pipeline stages) are sharded along the sequence.
    split_experts: split the routed experts over the TP group too (etp = tp; False: etp = 1).
    """
    group = _group_of(tp_mesh)
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    if t == 1:
        return model
    spec = model.spec
    if spec.heads % t or (spec.kv_heads % t and t % spec.kv_heads) or spec.ffn % t or spec.vocab % t:
        raise ValueError(f"tp={t} must divide heads, ffn and vocab of {spec.name}, and divide kv_heads or be a "
                         "multiple of it")
    kv_group = kv_copy_mesh(tp_mesh, spec.kv_heads)["tp_kv_copy"].get_group() if t > spec.kv_heads else None
    sp = sequence_parallel
    if sp and spec.seq % t:
        raise ValueError(f"sequence parallelism needs tp={t} to divide seq={spec.seq}")

    def norm(module, summed: bool = False):
        if not (sp or summed):
            return module
        return (GradSummedLayerNorm if isinstance(module, nn.LayerNorm) else GradSummedRMSNorm)(module, group)

    if model.tok_embeddings is not None:
        table = owned_slice(model.tok_embeddings.weight, 0, rank, t)
        positions = sp and model.pos_embeddings is not None
        model.tok_embeddings = VocabParallelEmbedding(table, rank * table.shape[0], group, sp and not positions)
        if positions:
            scatter_after_positions(model, group)
    for block in model.layers.values():
        attention, mlp = block.attention, block.feed_forward
        fused = block.parallel_residual and not isinstance(mlp, MoE)
        block.attention_norm, block.ffn_norm = (norm(n, fused) for n in (block.attention_norm, block.ffn_norm))
        kv = (attention.wk, attention.wv)
        if kv_group is not None:
            attention.wk, attention.wv = (_replicate_kv(w, rank, t, spec.kv_heads, kv_group) for w in kv)
            kv = ()
        for column in (attention.wq, *kv):
            _shard(column, 0, rank, t)
        attention.wo = RowParallelLinear(attention.wo, rank, t, group, sp, reduce=not fused)
        if attention.q_norm is not None:  # qk-norm: each rank's heads give part of the weights' gradient
            attention.q_norm, attention.k_norm = (GradSummedRMSNorm(n, group)
                                                  for n in (attention.q_norm, attention.k_norm))
        if isinstance(mlp, MoE):
            _enter_region(attention, group, sp)
            _shard_moe(mlp, group, rank, t, sp, split_experts)
            continue
        _shard_columns(mlp, rank, t)
        mlp.w2 = RowParallelLinear(mlp.w2, rank, t, group, sp, reduce=not fused)
        if fused:
            block.__class__ = ParallelBlock
            block.tp_group = group
            block.tp_enter, block.tp_leave = _entering(sp), _leaving(sp)
        else:
            _enter_region(attention, group, sp)
            _enter_region(mlp, group, sp)
    if model.norm is not None:
        model.norm = norm(model.norm)
    if model.output is not None:
        _shard(model.output, 0, rank, t)  # vocabulary-parallel head: logits stay sharded by vocabulary
        _enter_region(model.output, group, sp)
        if model.tok_embeddings is not None and model.spec.tied_embeddings:
            model.output.weight = model.tok_embeddings.weight  # the same rows of the vocabulary
    return model


def scatter_after_positions(model: Transformer, group) -> None:
    """SP with a learned position table (Megatron's LanguageModelEmbedding: it reduce-scatters the word
    embeddings only without position embeddings): the embedding is all-reduced whole, the positions added on
    every rank, and the sum scattered along the sequence before the first block; the scatter's backward
    all-gathers the gradient, so the replicated table's gradient is whole on every rank."""
    first = next(iter(model.layers.values()))
    first.register_forward_pre_hook(lambda _m, args: (_ScatterSeq.apply(args[0], group), *args[1:]))


def scatter_gather_stage(chunk: Transformer, tp_mesh, receives: bool, sends: bool) -> None:
    """Without SP, send 1/t of each stage boundary's activation per TP rank and all-gather it on arrival
    (`receives`/`sends`: the chunk's input comes from / its output goes to another pipeline rank). With SP
    the boundary is already sharded along the sequence."""
    group = _group_of(tp_mesh)
    if receives:
        chunk.register_forward_pre_hook(
            lambda _m, args: (_GatherFromPreviousStage.apply(args[0], group, chunk.spec.hidden), *args[1:]))
    if sends:
        chunk.register_forward_hook(lambda _m, _args, out: _ScatterToNextStage.apply(out, group))


# ---- loss --------------------------------------------------------------------------------------------
class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits sharded along the vocabulary (Megatron-LM, sec. 3: fusing the loss with
    the parallel head so the full (tokens x vocab) logits are never gathered). Three all-reduces of one
    number per token: the max, the sum of exponentials, the target's logit."""

    @staticmethod
    def forward(ctx, logits, targets, group):
        logits = logits.float()
        vocab_local = logits.shape[-1]
        lo = dist.get_rank(group) * vocab_local
        row_max = _all_reduce_max(logits.detach().amax(-1), group)
        shifted = logits - row_max.unsqueeze(-1)
        local = targets - lo
        outside = (local < 0) | (local >= vocab_local)
        target_logit = shifted.gather(-1, local.clamp(0, vocab_local - 1).unsqueeze(-1)).squeeze(-1)
        target_logit = _all_reduce(target_logit.masked_fill(outside, 0.0), group)
        exp = shifted.exp()
        sum_exp = _all_reduce(exp.sum(-1), group)
        loss = sum_exp.log() - target_logit
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local, outside)
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        # d(mean CE)/d logits = (softmax - onehot(target)) / tokens
        g = softmax.clone()
        onehot = (~outside).to(g.dtype)
        g.scatter_add_(-1, local.clamp(0, g.shape[-1] - 1).unsqueeze(-1), -onehot.unsqueeze(-1))
        return g * (grad / local.numel()), None, None


def _all_reduce_max(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous().clone()
    _timed("all_reduce", x.numel() * x.element_size(), all_reduce, x, op=dist.ReduceOp.MAX, group=group)
    return x


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, tp_mesh) -> torch.Tensor:
    """Mean cross-entropy of vocabulary-sharded logits (b, s, vocab/t) against global targets (b, s)."""
    group = _group_of(tp_mesh)
    if dist.get_world_size(group) == 1:
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return _VocabParallelCrossEntropy.apply(logits, targets, group)


# ---- gradient norm -----------------------------------------------------------------------------------
def is_tp_replicated(name: str) -> bool:
    """True for parameters every TP rank holds whole (norms, router, ...): count them once in a global norm."""
    return name.endswith(_REPLICATED_SUFFIXES)


def tp_duplicate(tp_rank: int, tp: int, kv_heads: int):
    """Predicate on parameter names: true for the parameters this TP rank holds a copy of that a lower TP
    rank also holds (norm weights on ranks > 0; replicated KV heads on all but the first rank sharing each),
    so a global norm counts each once."""
    kv_copy = tp > kv_heads and tp_rank % (tp // kv_heads) != 0

    def duplicate(name: str) -> bool:
        return (tp_rank > 0 and is_tp_replicated(name)) or (kv_copy and name.endswith(("wk.weight", "wv.weight")))

    return duplicate
