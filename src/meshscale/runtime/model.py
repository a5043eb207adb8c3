"""A LLaMA-style decoder built from a ModelSpec: RMSNorm, RoPE, grouped-query attention, SwiGLU.

The model knows nothing of parallelism. Parallel wrappers are applied after construction:
  * TP shards the Linear layers in place; attention infers its local head count from the weights.
  * PP deletes the layers a stage does not own (`layers` is a ModuleDict keyed by the global index,
    so parameter names, and therefore initialisation and checkpoints, never depend on the layout),
    and sets `tok_embeddings` / `norm` / `output` to None where the stage lacks them.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from meshscale.specs.model import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Normalise in fp32 for stability under bf16 autocast.
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(head_dim: int, seq: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    # Su et al. 2021, "RoFormer", eq. 34: rotate pairs (2i, 2i+1) by position * theta^(-2i/d).
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); cos/sin: (seq, head_dim/2)."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.head_dim = spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wv = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wo = nn.Linear(spec.heads * spec.head_dim, spec.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        cos, sin = cos[:s], sin[:s]  # under SP the residual stream is sharded but attention sees all of s
        return self.wo(self.core(q, k, v, cos, sin).reshape(b, s, -1))

    def core(self, q, k, v, cos, sin):
        """The parameter-free part (RoPE, scores, softmax, weighted sum): what selective recompute reruns.
        (batch, seq, heads, head_dim) in and out."""
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if k.shape[1] != q.shape[1]:  # grouped-query attention: share each kv head among a group
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2)


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.w1 = nn.Linear(spec.hidden, spec.ffn, bias=False)  # gate
        self.w3 = nn.Linear(spec.hidden, spec.ffn, bias=False)  # up
        self.w2 = nn.Linear(spec.ffn, spec.hidden, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden)
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec.hidden)
        self.feed_forward = FeedForward(spec)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.is_moe or spec.uses_mla or spec.mlp != "swiglu":
            raise ValueError(f"the runtime model is a dense LLaMA-style decoder; {spec.name} is not one")
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.layers)})
        self.norm = RMSNorm(spec.hidden)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        cos, sin = rope_tables(spec.head_dim, spec.seq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        """Token ids (first stage) or hidden states (later pipeline stages) in; logits (last stage)
        or hidden states out."""
        h = self.tok_embeddings(tokens_or_hidden) if self.tok_embeddings is not None else tokens_or_hidden
        # Whole tables: attention slices them to its own sequence length, which under sequence
        # parallelism is longer than the (sequence-sharded) residual stream seen here.
        for block in self.layers.values():
            h = block(h, self.rope_cos, self.rope_sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


@torch.no_grad()
def init_weights(model: Transformer, seed: int) -> None:
    """Initialise from the seed alone: each parameter draws from its own generator seeded by
    (seed, parameter name), so the values never depend on the layout or on which layers exist."""
    spec = model.spec
    std = 0.02
    out_std = std / math.sqrt(2 * spec.layers)  # GPT-2 style scaling of residual projections
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
            continue
        g = torch.Generator().manual_seed(_stable_hash(f"{seed}:{name}"))
        scale = out_std if name.endswith(("wo.weight", "w2.weight")) else std
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * scale)


def _stable_hash(text: str) -> int:
    # Python's hash() is salted per process; ranks must agree, so use a fixed FNV-1a.
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


def build_model(spec: ModelSpec, seed: int = 0, device: str | torch.device = "cpu") -> Transformer:
    model = Transformer(spec).to(device)
    init_weights(model, seed)
    return model
