"""FLOPs of one training step, counted from the model's shapes.

A matmul of (m x k) by (k x n) costs 2mkn FLOPs; backward costs twice the forward (input and weight
gradients), Kaplan et al. 2020 sec. 2.1 and Narayanan et al. 2021 (arXiv:2104.04473) sec. 5.1.
"""

from functools import lru_cache

from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec


def attention_projection_flops(model: ModelSpec) -> float:
    """Q, K, V and output projections per token, forward."""
    return 2.0 * model.attention_params()


def attended_positions(seq: int, window: int = 0, causal_skip: bool = True, chunked: bool = False) -> float:
    """Keys a query attends to, on average over a sequence of `seq`. Causal: (seq+1)/2; with a window of w < seq,
    min(t+1, w) at position t, so w - w(w-1)/(2 seq); in chunks of w (Llama 4), (t mod w) + 1, each whole chunk
    w(w+1)/2 and the rest r(r+1)/2. Fused kernels skip the masked blocks (Dao 2023, FlashAttention-2 sec. 3.1,
    the window likewise); unfused kernels compute the full s x s scores (Narayanan et al. 2021 eq. 3 counts
    those)."""
    if not causal_skip:
        return seq
    if window and window < seq and chunked:
        rest = seq % window
        return ((seq - rest) * (window + 1) / 2 + rest * (rest + 1) / 2) / seq
    if window and window < seq:
        return window - window * (window - 1) / (2 * seq)
    return (seq + 1) / 2


def attention_core_flops(model: ModelSpec, seq: int, causal_skip: bool = True, layer: int | None = None) -> float:
    """QK^T and AV per token, forward, in layer `layer` (its window), or on average over the model's layers; a
    model that is not causal attends to every position."""
    qk_dim = model.head_dim + (model.rope_head_dim if model.uses_mla else 0)
    v_dim = (model.v_head_dim or model.head_dim) if model.uses_mla else model.head_dim
    layers = range(model.layers) if layer is None else (layer,)
    skip = causal_skip and model.causal
    attended = sum(attended_positions(seq, model.attention_window(i), skip, model.attends_in_chunks)
                   for i in layers) / len(layers)
    return 2.0 * model.heads * (qk_dim + v_dim) * attended


def mlp_flops(model: ModelSpec, layer: int) -> float:
    """Per token, forward. A MoE layer runs top_k routed plus the shared experts, and the router."""
    if model.is_moe_layer(layer):
        return 2.0 * ((model.top_k + model.shared_experts) * model.expert_params() + model.hidden * model.experts)
    return 2.0 * model.mlp_matrices * model.hidden * model.ffn


def layer_flops(model: ModelSpec, layer: int, seq: int, causal_skip: bool = True) -> float:
    return (attention_projection_flops(model) + attention_core_flops(model, seq, causal_skip, layer)
            + mlp_flops(model, layer))


def logits_flops(model: ModelSpec) -> float:
    return 2.0 * model.hidden * model.vocab


def mtp_flops(model: ModelSpec, seq: int) -> float:
    """Per token, forward: the multi-token prediction modules' 2h -> h projections, layers and the shared head
    (DeepSeek-AI 2024, DeepSeek-V3 report sec. 2.2)."""
    per_module = 4.0 * model.hidden * model.hidden + layer_flops(model, model.layers - 1, seq) + logits_flops(model)
    return model.mtp_layers * per_module


@lru_cache(maxsize=256)
def forward_flops_per_token(model: ModelSpec, seq: int) -> float:
    return sum(layer_flops(model, i, seq) for i in range(model.layers)) + logits_flops(model) + mtp_flops(model, seq)


def adapter_flops(model: ModelSpec) -> float:
    """Per token, forward: the LoRA adapters' two low-rank matmuls beside each adapted matrix, every layer."""
    return 2.0 * model.layers * model.adapter_params()


def model_flops_per_step(model: ModelSpec, tokens: int) -> float:
    """Forward + backward, no recomputation: the numerator of MFU (Chowdhery et al. 2022, PaLM, app. B). Under
    LoRA the frozen weights take no gradient (Hu et al. 2021, sec. 4.2), so backward is the input gradients
    (the forward's matmuls once more, the attention core's twice) and the adapters' weight gradients."""
    forward = forward_flops_per_token(model, model.seq) + adapter_flops(model)
    if not model.lora:
        return 3.0 * forward * tokens
    core = sum(attention_core_flops(model, model.seq, layer=i) for i in range(model.layers))
    return (2.0 * forward + core + adapter_flops(model)) * tokens


def six_pt(model: ModelSpec, tokens: int) -> float:
    """The 6PT rule (Kaplan et al. 2020): 6 x active parameters x tokens, ignoring attention's seq term."""
    return 6.0 * _active_params(model) * tokens


@lru_cache(maxsize=256)
def _active_params(model: ModelSpec) -> int:
    return model.active_param_count()


def block_matmuls(model: ModelSpec) -> tuple:
    """A dense block's weight matmuls in the order they run, (in, out) widths: q, k, v, o, then gate, up,
    down (GeLU: up, down), as models/transformer.py and torchtitan's Llama run them."""
    h, q, kv, f = model.hidden, model.heads * model.head_dim, model.kv_heads * model.head_dim, model.ffn
    mlp = ((h, f), (h, f), (f, h)) if model.gated_mlp else ((h, f), (f, h))
    return ((h, q), (h, kv), (h, kv), (q, h)) + mlp


def op_recomputed_matmuls(model: ModelSpec) -> tuple:
    """recompute=op, torchtitan's op-level selective checkpointing (torchtitan/models/llama/parallelize_llama.py,
    _apply_ac_to_transformer_block): it saves the attention kernel's output and every other matmul's (the
    1st, 3rd, ...), so the 2nd, 4th, ... run again in backward, with all element-wise work."""
    return block_matmuls(model)[1::2]


@lru_cache(maxsize=1024)
def recompute_flops_per_token(model: ModelSpec, recompute: str, layers: range) -> float:
    """Extra forward work per token. Full: the whole layer again; selective and minimal: only the attention core
    (Korthikanti et al. 2022, arXiv:2205.05198, sec. 5); minimal_mlp: that and the MLP's first matmul; op: every
    other matmul; Megatron-Core's modules (Layout.recompute_modules): the attention core, a dense MLP, a MoE
    layer, its shared experts."""
    if recompute == "full":
        return sum(layer_flops(model, i, model.seq) for i in layers)
    if recompute == "op":
        return len(layers) * 2.0 * sum(i * o for i, o in op_recomputed_matmuls(model))
    # minimal_mlp: minimal's attention core and the MLP's first matmul (dense layers: specs.layout.check_against)
    first = 2.0 * model.hidden * model.mlp_in_width if recompute == "minimal_mlp" else 0.0
    modules = Layout(recompute=recompute).recompute_modules
    up = 0.0
    if "mla_up_proj" in modules:  # DeepSeek-V2 sec. 2.1.2: latent q and kv up to the heads
        v = model.v_head_dim or model.head_dim
        up = 2.0 * model.heads * (model.q_lora_rank * (model.head_dim + model.rope_head_dim)
                                  + model.kv_lora_rank * (model.head_dim + v))
    return sum(up + first + _module_mlp_flops(model, i, modules)
               + (attention_core_flops(model, model.seq, layer=i) if "core_attn" in modules else 0.0)
               for i in layers)


def _module_mlp_flops(model: ModelSpec, layer: int, modules: frozenset) -> float:
    """Forward FLOPs per token of the MLP-side recompute modules of `layer`."""
    if not model.is_moe_layer(layer):
        return mlp_flops(model, layer) if "mlp" in modules else 0.0
    if "moe" in modules:
        return mlp_flops(model, layer)
    return 2.0 * model.shared_experts * model.expert_params() if "shared_experts" in modules else 0.0
