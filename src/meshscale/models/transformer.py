"""A decoder built from a ModelSpec: LLaMA-style (RMSNorm, RoPE, grouped-query attention, SwiGLU), GPT-style
(LayerNorm, biases, learned positions, GeLU, tied embeddings), and mixture-of-experts layers (`MoE`), with
what the Hugging Face model types add (specs/hf.py): rope theta and scaling, partial rotary, q/k/v biases,
qk-norm, sliding-window attention, GPT-NeoX's parallel residual, Qwen2-MoE's gated shared expert, Nemotron-4's
squared ReLU and LayerNorm without biases elsewhere.

The model knows nothing of parallelism. Parallel wrappers are applied after construction:
  * TP shards the Linear layers in place; attention infers its local head count from the weights.
  * EP deletes the experts a rank does not hold (`experts` is keyed by the global expert index).
  * PP deletes the layers a stage does not own (`layers` is a ModuleDict keyed by the global index,
    so parameter names, and therefore initialisation and checkpoints, never depend on the layout),
    and sets `tok_embeddings` / `norm` / `output` to None where the stage lacks them.
"""

import json
import math

import torch
import torch.nn.functional as F
from torch import nn

from meshscale.models.init import normal_block
from meshscale.specs.model import ModelSpec, trainer_lacks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Normalise in fp32 for stability under bf16 autocast; the output in the input's dtype (an fp32 gain
        # would promote a bf16 residual stream's norm to fp32, and TP's gradient all-reduce with it).
        xf = x.float()
        return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight).type_as(x)


def rope_frequencies(spec: ModelSpec) -> torch.Tensor:
    """theta^(-2i/d) over the rotated dimensions d (Su et al. 2021, "RoFormer", eq. 34), rescaled as the
    config's rope_scaling says: "linear" divides them by the factor (position interpolation, Chen et al.
    2023); "llama3" divides only the low frequencies, blending the band between (Llama 3.1's rope scaling)."""
    dim = rotary_dims(spec)
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))
    scaling = json.loads(spec.rope_scaling) if spec.rope_scaling else {}
    kind, factor = scaling.get("rope_type"), scaling.get("factor", 1.0)
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        old = scaling["original_max_position_embeddings"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old / wavelen - low) / (high - low)).clamp(0, 1)  # 0 beyond old/low, 1 below old/high
        return (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return inv_freq


def rotary_dims(spec: ModelSpec) -> int:
    return int(spec.head_dim * spec.rotary_fraction)


def rope_tables(spec: ModelSpec, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    # in fp32, as Hugging Face's models compute them: the same angles to the last bit; on the CPU whatever the
    # default device, so a model built on the meta device keeps real tables
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device="cpu"), rope_frequencies(spec))
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); cos/sin: (seq, r/2), or (batch, seq, r/2) per token, for the first r
    dimensions, which rotate as two halves (dimension i with i + r/2, the layout Hugging Face checkpoints
    use); the rest pass through."""
    half = cos.shape[-1]
    xf = x.float()
    x1, x2, rest = xf[..., :half], xf[..., half:2 * half], xf[..., 2 * half:]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, window: int = 0):
        """window: attend to the last `window` positions only (0: all)."""
        super().__init__()
        self.head_dim, self.window = spec.head_dim, window
        self.rotary = not spec.learned_positions
        qkv_bias = spec.biases or spec.qkv_bias
        self.wq = nn.Linear(spec.hidden, spec.heads * spec.head_dim, bias=qkv_bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=qkv_bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=qkv_bias)
        self.wo = nn.Linear(spec.heads * spec.head_dim, spec.hidden, bias=spec.biases)
        # Qwen3's qk-norm: one RMSNorm over head_dim shared by every head, before RoPE
        self.q_norm = RMSNorm(spec.head_dim, spec.norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.norm_eps) if spec.qk_norm else None

    def forward(self, x, cos, sin, mask=None):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # under SP the residual stream is sharded but attention sees all of s
        cos, sin = cos[..., :s, :], sin[..., :s, :]
        return self.wo(self.core(q, k, v, cos, sin, mask).reshape(b, s, -1))

    def core(self, q, k, v, cos, sin, mask=None):
        """The parameter-free part (RoPE, scores, softmax, weighted sum): what selective recompute reruns.
        (batch, seq, heads, head_dim) in and out; `mask` (batch, 1, seq, seq), True where a query may look,
        replaces the causal one."""
        if self.rotary:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if k.shape[1] != q.shape[1]:  # grouped-query attention: share each kv head among a group
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        s = q.shape[2]
        if self.window and s > self.window:  # causal, and no further back than the window (Mistral)
            i = torch.arange(s, device=q.device)
            near = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < self.window)
            mask = near if mask is None else mask & near
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return out.transpose(1, 2)


class FeedForward(nn.Module):
    """SwiGLU (gate w1, up w3, down w2) or, for mlp="gelu" / "gelu-erf", GPT's GeLU MLP (up w1, down w2) with
    the tanh approximation (GPT-2) or the exact GeLU (GPT-NeoX); "relu2": Nemotron-4's squared ReLU (up, down)."""

    def __init__(self, spec: ModelSpec, width: int | None = None):
        super().__init__()
        width = width or spec.ffn
        self.w1 = nn.Linear(spec.hidden, width, bias=spec.biases)
        self.w3 = nn.Linear(spec.hidden, width, bias=spec.biases) if spec.gated_mlp else None
        self.w2 = nn.Linear(width, spec.hidden, bias=spec.biases)
        self.approximate = "none" if spec.mlp == "gelu-erf" else "tanh"
        self.squared_relu = spec.mlp == "relu2"

    def forward(self, x):
        if self.squared_relu:
            return self.w2(F.relu(self.w1(x)).square())
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x), approximate=self.approximate))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Router(nn.Module):
    """Softmax over the experts, top_k per token (torch.topk: ties go to the lower expert index), and the
    load-balancing loss. The router weight is left whole under TP; `copy_weight` is TP's f on it, so its
    gradient (partial on each TP rank) is summed over the group."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(spec.experts, spec.hidden))
        self.top_k, self.norm_topk = spec.top_k, spec.norm_topk
        self.copy_weight = lambda w: w
        self.sum_over_sequence = None  # context parallelism's sum of the balance statistics over the CP group

    def forward(self, x: torch.Tensor, seq: int):
        """x: (tokens, hidden), sequences of `seq` tokens back to back. Returns the top_k weights and expert
        indices (tokens, top_k) and the auxiliary loss."""
        probs = F.softmax(F.linear(x, self.copy_weight(self.weight)).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.type_as(x), experts, balance_loss(probs, experts, seq, self.sum_over_sequence)


def balance_loss(probs: torch.Tensor, experts: torch.Tensor, seq: int, sum_over_sequence=None) -> torch.Tensor:
    """Switch Transformer's load-balancing loss (Fedus et al. 2021, eq. 4-6) with GShard's top-k counting,
    per sequence as DeepSeek-V3's sequence-wise balance loss (arXiv:2412.19437, eq. 17-20):
    E/(k*T) * sum_i count_i * mean_prob_i, averaged over sequences; 1 when perfectly balanced. Per sequence
    (not per batch) so that any split of the batch over data-parallel ranks gives the same mean.
    sum_over_sequence(counts, probs, seq): where a process holds part of each sequence (context
    parallelism), the per-sequence sums over the whole sequence and its length."""
    n_experts, k = probs.shape[-1], experts.shape[-1]
    counts = F.one_hot(experts, n_experts).sum(1).view(-1, seq, n_experts).float().sum(1)
    prob_sums = probs.view(-1, seq, n_experts).sum(1)
    if sum_over_sequence is not None:
        counts, prob_sums, seq = sum_over_sequence(counts, prob_sums, seq)
    share = counts / seq * n_experts / k
    return (share * prob_sums / seq).sum(-1).mean()


class _AttachAux(torch.autograd.Function):
    """Add a loss term's gradient without adding it to the output (Megatron's MoEAuxLossAutoScaler): the
    output passes through, and backward also sends `weight` as the gradient of `aux`. Works where the loss
    is formed on another pipeline stage. Backward notes the value in `sink`: it runs once per micro-batch
    whatever extra forwards ran (recompute, a pipeline stage's shape inference)."""

    @staticmethod
    def forward(ctx, out, aux, weight: float, sink: list):
        ctx.weight, ctx.sink = weight, sink
        ctx.save_for_backward(aux)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        ctx.sink.append(aux.detach())
        return grad, torch.full_like(aux, ctx.weight), None, None


class LocalExperts:
    """Runs the tokens sorted by expert through the experts this process holds (all of them without EP;
    parallel/expert.py swaps in the all-to-all dispatcher)."""

    def __call__(self, xs: torch.Tensor, counts: torch.Tensor, experts: nn.ModuleDict,
                 positions: torch.Tensor | None = None, seq: int = 0) -> torch.Tensor:
        """positions: each assignment's token's position in its sequence of `seq` (for dispatchers that split
        the work by sequence chunk)."""
        return run_experts(xs, counts.tolist(), list(experts.values()))


def run_experts(xs: torch.Tensor, counts: list, experts: list) -> torch.Tensor:
    return torch.cat([expert(chunk) for chunk, expert in zip(xs.split(counts), experts)])


class MoE(nn.Module):
    """Mixture-of-experts MLP: routed SwiGLU experts (top_k per token) plus always-on shared experts.
    Dropless by default; with a capacity factor each expert takes at most ceil(cf * tokens * top_k / experts)
    assignments, first come first served in token order, and drops the rest (GShard, Lepikhin et al. 2020,
    sec. 2.2). The auxiliary loss reaches the gradient through `_AttachAux`, weighted by `aux_weight` (the
    trainer sets coefficient / micro-batches, as the main loss is averaged); backward keeps each micro-batch's
    value in `aux_values`."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.router = Router(spec)
        self.experts = nn.ModuleDict({str(e): FeedForward(spec, spec.expert_ffn) for e in range(spec.experts)})
        self.shared = FeedForward(spec, spec.shared_experts * spec.expert_ffn) if spec.shared_experts else None
        # Qwen2-MoE: sigmoid(x . g) scales the shared experts' output
        self.shared_gate = nn.Linear(spec.hidden, 1, bias=False) if spec.shared_expert_gate else None
        self.n_experts, self.top_k, self.capacity_factor = spec.experts, spec.top_k, spec.capacity_factor
        self.dispatch = LocalExperts()
        self.aux_weight = spec.aux_loss_coef
        self.aux_values: list = []

    def forward(self, x):
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        weights, experts, aux = self.router(flat, s)
        keep = self.kept(experts.reshape(-1))
        choice = experts.reshape(-1)[keep]
        order = keep[choice.argsort(stable=True)]  # assignments (token * top_k + j) sorted by expert
        counts = torch.bincount(choice, minlength=self.n_experts)
        xs = flat[order // self.top_k]
        if torch.is_autocast_enabled(xs.device.type):  # tokens travel in the compute dtype, as the experts' outputs
            xs = xs.to(torch.get_autocast_dtype(xs.device.type))
        ys = self.dispatch(xs, counts, self.experts, order // self.top_k % s, s)
        per_assignment = ys.new_zeros(flat.shape[0] * self.top_k, h).index_copy(0, order, ys)
        out = (per_assignment.view(-1, self.top_k, h) * weights.unsqueeze(-1)).sum(1)
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:  # the router's f under TP: the gate meets partial shared outputs
                shared = shared * torch.sigmoid(F.linear(flat, self.router.copy_weight(self.shared_gate.weight)))
            out = out + shared
        if self.training and torch.is_grad_enabled():
            out = _AttachAux.apply(out, aux, self.aux_weight, self.aux_values)
        return out.view(b, s, h)

    def kept(self, choice: torch.Tensor) -> torch.Tensor:
        """Indices of the assignments that are kept (all of them when dropless)."""
        if not self.capacity_factor:
            return torch.arange(choice.numel(), device=choice.device)
        capacity = math.ceil(self.capacity_factor * choice.numel() / self.n_experts)
        one_hot = F.one_hot(choice, self.n_experts)
        position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1  # arrival order within its expert
        return torch.nonzero(position < capacity).squeeze(1)


def moe_layers(module: nn.Module) -> list:
    return [m for m in module.modules() if isinstance(m, MoE)]


def _norm(spec: ModelSpec) -> nn.Module:
    # GPT-style models and Nemotron-4 use LayerNorm with its bias; LLaMA-style RMSNorm.
    return nn.LayerNorm(spec.hidden, eps=spec.norm_eps) if spec.layer_norm else RMSNorm(spec.hidden, spec.norm_eps)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, index: int):
        super().__init__()
        self.parallel_residual = spec.parallel_residual
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec, spec.attention_window(index))
        self.ffn_norm = _norm(spec)
        self.feed_forward = MoE(spec) if spec.is_moe_layer(index) else FeedForward(spec)

    def forward(self, x, cos, sin, mask=None):
        attention = self.attention(self.attention_norm(x), cos, sin, mask)
        if self.parallel_residual:  # GPT-NeoX: both branches read the block's input
            return x + attention + self.feed_forward(self.ffn_norm(x))
        x = x + attention
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        lacks = trainer_lacks(spec)
        if lacks:
            raise ValueError(f"the runtime model has no {lacks}; {spec.name} needs it")
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_embeddings = nn.Embedding(spec.seq, spec.hidden) if spec.learned_positions else None
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.layers)})
        self.norm = _norm(spec)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tied_embeddings:  # one table for both ends (Press & Wolf 2017)
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(spec, spec.seq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens_or_hidden: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (first stage) or hidden states (later pipeline stages) in; logits (last stage)
        or hidden states out. With `documents` (batch, seq), each token's document in a packed sequence,
        attention stays within a document and positions count from its first token: every document is
        computed as if it were alone (Megatron's reset_attention_mask and reset_position_ids)."""
        h = self.tok_embeddings(tokens_or_hidden) if self.tok_embeddings is not None else tokens_or_hidden
        # Whole tables: attention slices them to its own sequence length, which under sequence
        # parallelism is longer than the (sequence-sharded) residual stream seen here.
        positions, cos, sin, mask = slice(tokens_or_hidden.shape[1]), self.rope_cos, self.rope_sin, None
        if documents is not None:
            positions = document_positions(documents)
            cos, sin = cos[positions], sin[positions]
            mask = (documents[:, :, None] == documents[:, None, :]).tril().unsqueeze(1)
        if self.tok_embeddings is not None and self.pos_embeddings is not None:
            h = h + self.pos_embeddings.weight[positions]
        h = compute_dtype(h)
        for block in self.layers.values():
            h = block(h, cos, sin, mask)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def compute_dtype(h: torch.Tensor) -> torch.Tensor:
    """The residual stream in autocast's dtype (bf16 under --precision bf16), as Megatron keeps it: the
    activations that TP, SP and the pipeline move are 16-bit, as the cost model counts them. (Autocast alone
    would leave it fp32: the embedding and the residual additions are not autocast ops.)"""
    if torch.is_autocast_enabled(h.device.type):
        return h.to(torch.get_autocast_dtype(h.device.type))
    return h


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """(batch, seq) position of each token inside its document, from non-decreasing document ids."""
    index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return index - torch.where(starts, index, 0).cummax(1).values


def whole(name: str, p: torch.Tensor) -> tuple:
    """Where a parameter held whole sits in the global one: (the tensor to fill, its offset, the global shape)."""
    return p, (0,) * p.dim(), tuple(p.shape)


@torch.no_grad()
def init_weights(model: Transformer, seed: int, where=whole) -> None:
    """Initialise from the seed alone: every value is a function of (seed, parameter name, global index)
    (models/init.py), so it never depends on the layout, on which layers exist or on which slice a process
    holds. where(name, p) -> (tensor to fill, its offset in the global parameter, the global shape)."""
    spec = model.spec
    std = 0.02
    out_std = std / math.sqrt(2 * spec.layers)  # GPT-2 style scaling of residual projections
    for name, p in model.named_parameters():
        local, offset, shape = where(name, p)
        if name.endswith("norm.weight"):
            local.fill_(1.0)
            continue
        if name.endswith("bias"):
            local.zero_()
            continue
        if local.dim() == 1:  # a vector is one row
            local, offset, shape = local.view(1, -1), (0, *offset), (1, *shape)
        scale = out_std if name.endswith(("wo.weight", "w2.weight")) else std
        if name == "output.weight" and spec.tied_embeddings:  # a pipeline's last stage holds its own copy
            name = "tok_embeddings.weight"
        local.copy_(normal_block(f"{seed}:{name}", shape, offset, tuple(local.shape)) * scale)


def meta_model(spec: ModelSpec, device: str | torch.device = "cpu") -> Transformer:
    """The model's structure with its parameters on the meta device (no memory, no values) and its buffers on
    `device`; parallel/construct.py materialises what each rank owns."""
    with torch.device("meta"):
        model = Transformer(spec)
    for module in model.modules():
        for name, buffer in module._buffers.items():
            module._buffers[name] = buffer.to(device)
    return model


@torch.no_grad()
def materialise(model: nn.Module, seed: int, device: str | torch.device, where=whole) -> None:
    """Give the meta parameters of `model` (a built model, a pipeline chunk, with parallel wrappers applied)
    memory on `device` and their initial values, keeping the buffers and the parameters shared by two
    modules (tied embeddings) as they were."""
    buffers = [(m, n, b) for m in model.modules() for n, b in m._buffers.items() if b is not None]
    shared: dict = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(name)
    model.to_empty(device=device)
    for m, n, b in buffers:
        m._buffers[n] = b
    for first, *others in (names for names in shared.values() if len(names) > 1):
        for name in others:  # to_empty gives each module its own tensor
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, model.get_parameter(first))
    init_weights(model, seed, where)


def full_shapes(spec: ModelSpec) -> dict:
    """Every parameter's name and whole shape (a tied head's too: under a pipeline the last stage holds its
    own copy), built on the meta device (no memory)."""
    with torch.device("meta"):
        model = Transformer(spec)
        return {name: tuple(p.shape) for name, p in model.named_parameters(remove_duplicate=False)}


def build_model(spec: ModelSpec, seed: int = 0, device: str | torch.device = "cpu") -> Transformer:
    """The whole model, initialised, on one process."""
    model = meta_model(spec, device)
    materialise(model, seed, device)
    return model
