"""Ring attention (parallel/context.py) against one device's causal attention: outputs and the gradients of
q, k and v, with grouped-query heads, at cp=2 and cp=4, on real gloo ranks; and the bytes it sends."""

import pytest

from multirank import run_ranks

SEQ, HEADS, KV_HEADS, DIM = 16, 4, 2, 8


def _reference(seed: int):
    """Full-sequence q, k, v, an upstream gradient, and one device's output and input gradients."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, h, SEQ, DIM, generator=g, dtype=torch.float64)
               for h in (HEADS, KV_HEADS, KV_HEADS))
    grad = torch.randn(2, HEADS, SEQ, DIM, generator=g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    groups = HEADS // KV_HEADS
    out = F.scaled_dot_product_attention(leaves[0], leaves[1].repeat_interleave(groups, 1),
                                         leaves[2].repeat_interleave(groups, 1), is_causal=True)
    out.backward(grad)
    return (q, k, v, grad), out.detach(), [t.grad for t in leaves]


def _ring_cases(rank, world):
    import torch.distributed as dist

    from meshscale.parallel.context import _RingAttention
    from meshscale.parallel.context import cp_positions
    from meshscale.parallel.ledger import CommLedger

    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    out = {}
    for cp, group in ((2, pairs[rank // 2]), (4, dist.group.WORLD)):
        (q, k, v, grad), want, want_grads = _reference(seed=cp)
        pos = cp_positions(SEQ, dist.get_rank(group), cp)
        leaves = [t[:, :, pos].clone().requires_grad_() for t in (q, k, v)]
        ledger = CommLedger()
        with ledger.active():
            got = _RingAttention.apply(*leaves, group)
            got.backward(grad[:, :, pos])
        errors = [(got.detach() - want[:, :, pos]).abs().max().item()]
        errors += [(t.grad - w[:, :, pos]).abs().max().item() for t, w in zip(leaves, want_grads)]
        out[cp] = {"errors": errors, "sends": [(r["axis"], r["collective"], r["bytes"]) for r in ledger.records]}
    return out


@pytest.fixture(scope="module")
def ring():
    return run_ranks(4, _ring_cases)


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_matches_one_device(ring, cp):
    for rank, result in enumerate(ring):
        assert max(result[cp]["errors"]) < 1e-10, f"cp={cp} rank {rank}: {result[cp]['errors']}"


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_sends_kv_forward_and_kv_plus_their_gradients_backward(ring, cp):
    block = 2 * 2 * (SEQ // cp) * KV_HEADS * DIM * 8  # K and V, batch 2, this rank's tokens, fp64
    for result in ring:
        assert result[cp]["sends"] == [("cp", "send_recv", block)] * (3 * (cp - 1))
