"""Context parallelism: ring attention over the CP group, with the load-balanced causal layout.

Each sequence is cut into 2*cp chunks and CP rank i holds chunks i and 2cp-1-i (`cp_positions`),
so every rank does the same causal work (Megatron-LM / TransformerEngine context parallelism). Everything
but attention is position-wise and runs on the local tokens unchanged; RoPE follows each token's global
position because the rank's RoPE tables are re-indexed by those positions.

Attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): the K,V block of every rank
travels the ring, one hop per step, sent and received by point-to-point ops that run while the block in
hand is attended. Partial results merge with the online-softmax rule (Milakov & Gimelshein 2018;
FlashAttention-2, Dao 2023, sec. 3.1): out = sum_j exp(lse_j - lse) out_j, lse = logsumexp_j lse_j.
Backward recomputes each block's probabilities from the saved lse (FlashAttention-2 alg. 2) while K,V go
round the ring again, and each block's dK,dV follow it, accumulating, until they reach their owner.

Per layer and micro-batch each rank sends its K,V block (2 * tokens * kv_heads/tp * head_dim values):
cp-1 times in forward, cp-1 times in backward, and cp-1 dK,dV blocks of the same size; a recomputed
forward (selective or full recompute) sends its cp-1 again. Each send is one ledger record on axis cp.

Which key block a query chunk sees, with rank i holding (lo_i, hi_i) = chunks (i, 2cp-1-i), and the
block of rank j:  j == i: causal over the whole local block (positions increase along it);
j < i: every query sees chunk j (all earlier), none sees chunk 2cp-1-j (all later);
j > i: only chunk hi_i sees rank j's block, all of it.
"""

import time

import torch
import torch.distributed as dist

from meshscale.models.transformer import apply_rope, moe_layers
from meshscale.parallel.ledger import record


def cp_positions(seq: int, cp_rank: int, cp: int) -> torch.Tensor:
    """Token positions of a context-parallel rank: of 2*cp equal chunks, chunks cp_rank and 2cp-1-cp_rank
    (the load-balanced causal layout: early and late chunks paired, so causal attention work is even)."""
    chunk = seq // (2 * cp)
    ids = torch.arange(seq)
    return torch.cat((ids[cp_rank * chunk:(cp_rank + 1) * chunk], ids[(2 * cp - 1 - cp_rank) * chunk:][:chunk]))


def _exchange(tensor: torch.Tensor, group, tag: int) -> tuple[torch.Tensor, list]:
    """Send `tensor` to the next CP rank and receive the previous rank's into a new buffer (async)."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    nxt, prv = dist.get_global_rank(group, (rank + 1) % cp), dist.get_global_rank(group, (rank - 1) % cp)
    tensor = tensor.contiguous()
    out = torch.empty_like(tensor)
    ops = [dist.P2POp(dist.isend, tensor, nxt, group, tag), dist.P2POp(dist.irecv, out, prv, group, tag)]
    return out, (dist.batch_isend_irecv(ops), time.perf_counter(), tensor.numel() * tensor.element_size())


def _finish(pending) -> None:
    works, start, nbytes = pending
    for w in works:
        w.wait()
    record("cp", "send_recv", nbytes, time.perf_counter() - start)


def _visible(src: int, rank: int, s: int) -> tuple[slice, slice]:
    """(query rows, key columns) of `rank`'s s tokens and of the K,V block from CP rank `src` that attend to
    each other (the module docstring's table); the own block (src == rank) is causal within."""
    if src == rank:
        return slice(0, s), slice(0, s)
    if src < rank:
        return slice(0, s), slice(0, s // 2)  # every query, the keys of the early chunk
    return slice(s // 2, s), slice(0, s)  # the late chunk's queries, every key


def _expand(kv: torch.Tensor, groups: int) -> torch.Tensor:
    """(b, kv_heads, s, d) -> (b, heads, s, d): grouped-query attention shares each K,V head."""
    return kv.repeat_interleave(groups, dim=1) if groups > 1 else kv


def _fold(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """Gradient of `_expand`: sum over the query heads that shared a K,V head."""
    if groups == 1:
        return grad
    b, h, s, d = grad.shape
    return grad.view(b, h // groups, groups, s, d).sum(2)


def _scores(q, k, scale, causal: bool) -> torch.Tensor:
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return s


class _RingAttention(torch.autograd.Function):
    """q (b, heads, s, d), k and v (b, kv_heads, s, d); returns (b, heads, s, d). The math runs in fp32 at
    least (bf16 inputs are upcast, autocast is off inside); what travels keeps the inputs' dtype."""

    @staticmethod
    @torch.autocast("cpu", enabled=False)
    @torch.autocast("cuda", enabled=False)
    def forward(ctx, q, k, v, group):
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        groups, scale, s = q.shape[1] // k.shape[1], q.shape[-1] ** -0.5, q.shape[2]
        dtype = torch.promote_types(q.dtype, torch.float32)
        qf = q.to(dtype)
        out = torch.zeros_like(qf)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=dtype, device=q.device)
        kv = torch.stack((k, v))
        for step in range(cp):
            pending = _exchange(kv, group, 0) if step < cp - 1 else None
            rows, keys = _visible((rank - step) % cp, rank, s)
            kb, vb = (_expand(t.to(dtype), groups) for t in kv)
            scores = _scores(qf[:, :, rows], kb[:, :, keys], scale, causal=step == 0)
            blk_lse = scores.logsumexp(-1)
            blk_out = (scores - blk_lse.unsqueeze(-1)).exp() @ vb[:, :, keys]
            new_lse = torch.logaddexp(lse[:, :, rows], blk_lse)
            out[:, :, rows] = (out[:, :, rows] * (lse[:, :, rows] - new_lse).exp().unsqueeze(-1)
                               + blk_out * (blk_lse - new_lse).exp().unsqueeze(-1))
            lse[:, :, rows] = new_lse
            if pending is not None:
                kv, works = pending
                _finish(works)
        ctx.group = group
        ctx.save_for_backward(q, k, v, out, lse)
        return out.to(q.dtype)

    @staticmethod
    @torch.autocast("cpu", enabled=False)
    @torch.autocast("cuda", enabled=False)
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        groups, scale, s = q.shape[1] // k.shape[1], q.shape[-1] ** -0.5, q.shape[2]
        dtype = out.dtype
        qf, do = q.to(dtype), grad_out.to(dtype)
        delta = (do * out).sum(-1)  # rowsum(dO * O), FlashAttention-2 alg. 2 line 4
        dq = torch.zeros_like(qf)
        kv = torch.stack((k, v))
        own = None  # dK,dV of this rank's own block from its own queries, kept until it comes home
        incoming = None  # the exchange bringing the dK,dV of the next block from the previous rank
        for step in range(cp):
            pending = _exchange(kv, group, 0) if step < cp - 1 else None
            rows, keys = _visible((rank - step) % cp, rank, s)
            kb, vb = (_expand(t.to(dtype), groups) for t in kv)
            p = (_scores(qf[:, :, rows], kb[:, :, keys], scale, causal=step == 0)
                 - lse[:, :, rows].unsqueeze(-1)).exp()
            d_o = do[:, :, rows]
            dp = d_o @ vb[:, :, keys].transpose(-1, -2)
            ds = p * (dp - delta[:, :, rows].unsqueeze(-1))
            dq[:, :, rows] += ds @ kb[:, :, keys] * scale
            dkv = torch.zeros((2, *kb.shape), dtype=dtype, device=q.device)
            dkv[0][:, :, keys] = ds.transpose(-1, -2) @ qf[:, :, rows] * scale
            dkv[1][:, :, keys] = p.transpose(-1, -2) @ d_o
            dkv = torch.stack([_fold(t, groups) for t in dkv])
            if step == 0:
                own = dkv
            else:
                if incoming is not None:  # the block's dK,dV from the ranks it visited before this one
                    travelling, works = incoming
                    _finish(works)
                    dkv = dkv + travelling.to(dtype)
                incoming = _exchange(dkv.to(k.dtype), group, 1)
            if pending is not None:
                kv, works = pending
                _finish(works)
        if incoming is not None:  # this rank's block, back from its trip round the ring
            travelling, works = incoming
            _finish(works)
            own = own + travelling.to(dtype)
        return dq.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype), None


class RingAttentionCore:
    """Drop-in for Attention.core: RoPE with the rank's re-indexed tables, then ring attention."""

    def __init__(self, group):
        self.group = group

    def __call__(self, q, k, v, cos, sin, mask=None):
        if mask is not None:  # `train` refuses --document-mask with cp > 1 before any process starts
            raise ValueError("ring attention is causal over the whole sequence; it takes no document mask")
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return _RingAttention.apply(q, k, v, self.group).transpose(1, 2)


class _SumStatistics(torch.autograd.Function):
    """The MoE balance loss's per-sequence statistics (expert counts and router probabilities, (b, experts)
    each) summed over the CP group in one all-reduce; the gradient of the probabilities' sum passes back
    unchanged to this rank's own tokens' probabilities."""

    @staticmethod
    def forward(ctx, counts, prob_sums, group):
        both = torch.cat((counts, prob_sums.float())).contiguous()
        start = time.perf_counter()
        dist.all_reduce(both, group=group)
        record("cp", "all_reduce", both.numel() * both.element_size(), time.perf_counter() - start)
        return both[:len(counts)].clone(), both[len(counts):].to(prob_sums.dtype, copy=True)

    @staticmethod
    def backward(ctx, _counts, grad):
        return None, grad, None


def _balance_over_sequence(group):
    cp = dist.get_world_size(group)

    def sum_over_sequence(counts, prob_sums, seq):
        return (*_SumStatistics.apply(counts, prob_sums, group), seq * cp)

    return sum_over_sequence


def apply_context_parallel(model, cp_mesh) -> None:
    """Give `model` (a whole model or one pipeline chunk) ring attention over the CP group and the RoPE
    tables of this rank's token positions. Parameters are untouched. MoE layers sum their balance loss's
    statistics over the CP group (the loss is per whole sequence), and their balance loss's gradient weighs
    cp times more: each CP rank's reaches only its own tokens, and data parallelism averages over dp x cp."""
    group = cp_mesh.get_group()
    for moe in moe_layers(model):
        moe.router.sum_over_sequence = _balance_over_sequence(group)
        moe.aux_weight *= dist.get_world_size(group)
    positions = cp_positions(model.spec.seq, dist.get_rank(group), dist.get_world_size(group))
    for name in ("rope_cos", "rope_sin"):
        table = getattr(model, name)[positions]
        delattr(model, name)  # a plain attribute from now on: DDP would broadcast a buffer from rank 0
        setattr(model, name, table)
    core = RingAttentionCore(group)
    for block in model.layers.values():
        block.attention.core = core
