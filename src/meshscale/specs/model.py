"""ModelSpec: the shape of a decoder-only transformer, dense or mixture-of-experts.

Field names are the JSON names. Parameter counts follow directly from the shapes (see
`param_count`), which is how the presets are checked against their published sizes.
"""

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from meshscale.errors import UserError
from meshscale.specs.loading import build, hash_once, read_spec_file


MLPS = ("swiglu", "geglu", "gelu", "gelu-erf", "relu2")
# The matrices each of NeMo's PEFT target_modules adapts, by Megatron-Core's names (nemo/collections/nlp/parts/
# peft_config.py); linear_qkv and linear_fc1 split their outputs over TP, linear_proj and linear_fc2 their inputs
LORA_TARGETS = {"attention": ("linear_qkv", "linear_proj"), "qkv": ("linear_qkv",), "mlp": ("linear_fc1", "linear_fc2"),
                "all": ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")}
LORA_MODULES = tuple(LORA_TARGETS)
COLUMN_PARALLEL = ("linear_qkv", "linear_fc1")
NORMS = ("", "layernorm", "rmsnorm")
GATED_MLPS = ("swiglu", "geglu")  # gate, up and down matrices; the others have up and down


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq: int = 2048
    kv_heads: int = 0  # 0 means heads (multi-head attention); fewer means grouped-query attention
    head_dim: int = 0  # 0 means hidden // heads
    # "swiglu"/"geglu": 3 matrices (gate, up, down) with SiLU / tanh-GeLU gates (Llama / Gemma);
    # "gelu"/"gelu-erf": 2 (up, down) with the tanh / exact GeLU (GPT-2 / GPT-NeoX); "relu2": 2 with the squared
    # ReLU (So et al. 2021, "Primer", sec. 3; Nemotron-4)
    mlp: str = "swiglu"
    # "layernorm" (mean and variance, a gain and a bias) or "rmsnorm" (a gain); "": LayerNorm where the linear
    # layers carry biases (GPT-style), RMSNorm where they do not (LLaMA-style). Nemotron-4: LayerNorm, no biases.
    norm: str = ""
    tied_embeddings: bool = False
    learned_positions: bool = False  # GPT-style absolute position table (seq x hidden) instead of RoPE
    biases: bool = False  # GPT-style biases on every linear layer (and LayerNorm, unless `norm` says otherwise)
    qkv_bias: bool = False  # biases on q, k and v alone (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3)
    norm_eps: float = 1e-5
    parallel_residual: bool = False  # GPT-NeoX: x + attn(norm1(x)) + mlp(norm2(x))
    sandwich_norms: bool = False  # Gemma 2/3: norms after attention and the MLP too (4 per layer)
    rope_theta: float = 10000.0
    rope_scaling: str = ""  # Hugging Face's rope scaling as sorted JSON (rope_type, factor, ...); "" for none
    rotary_fraction: float = 1.0  # the share of each head's dimensions RoPE rotates (GPT-NeoX: 0.25)
    sliding_window: int = 0  # attend to the last n positions only; 0: to all
    full_attention_every: int = 0  # with a window, every n-th layer attends to all (Gemma 2: 2, Gemma 3: 6)
    # Llama 4's chunked attention: a query attends to the earlier positions of its own aligned block of
    # sliding_window positions, not to the last sliding_window ones
    chunked_attention: bool = False
    # False: every query attends to every position of its sequence (an encoder's attention; MaxText's flash
    # kernel ran so in October 2023, layers.py at 5ebcd67f: causal = False), so no block is skipped
    causal: bool = True
    attention_sinks: bool = False  # GPT-OSS: a learned logit per head joins each softmax (no value, no cost)
    # Mixture of experts (experts == 0: dense).
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0  # 0 means ffn
    shared_experts: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE: a sigmoid gate (hidden -> 1) scales the shared experts' output
    first_dense_layers: int = 0  # DeepSeek keeps its first layers dense
    moe_every: int = 1  # every n-th layer after those is MoE (1: all of them)
    norm_topk: bool = True  # renormalise the top_k routing weights to sum to 1 (Mixtral, DeepSeek-V3)
    capacity_factor: float = 0.0  # 0: dropless; else each expert takes at most cf*tokens*top_k/experts
    aux_loss_coef: float = 0.01  # weight of the load-balancing loss (Switch Transformer's alpha)
    # Multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank == 0 means ordinary attention.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0
    # Multi-token prediction depth (DeepSeek-V3 sec. 2.2; Megatron-Core --mtp-num-layers): each module projects
    # [norm(h); norm(embedding of the next token)] from 2h to h, runs one more layer like the model's last and the
    # shared output head and loss; it trains beside the main model and sits with the head's pipeline rank.
    mtp_layers: int = 0
    # LoRA fine-tuning (Hu et al. 2021, arXiv:2106.09685, sec. 4): every weight frozen, and beside each matrix W
    # (out x in) of `lora_modules` a trained B A of rank `lora_rank` (B: out x r, A: r x in), y = W x + B A x.
    # "attention": the fused QKV and the output projection (NeMo's target "attention"); "qkv": the fused QKV alone
    # (NeMo's attention_qkv, its default target); "mlp": a dense layer's MLP matrices (gate and up fused, down);
    # "all": attention and mlp. 0: every parameter trains.
    lora_rank: int = 0
    lora_modules: str = "attention"
    lora_dropout: float = 0.0  # dropout on each adapter's input (HF PEFT's default 0; MLPerf's LoRA runs 0.1)
    # Sequence packing (fine-tuning): each sequence holds samples of about this many tokens, each attending only
    # within itself (Megatron-Core's PackedSeqParams, Transformer Engine's THD format with cu_seqlens; NeMo's packed
    # SFT and PEFT data). Attention is then causal blocks of this length; every other kernel sees every token.
    # For samples of varied length give the mean of the squared lengths over the mean length, which the blocks'
    # attention work follows. 0: a sequence attends across itself (one document, or a pack without boundaries).
    packed_samples: int = 0

    __hash__ = hash_once

    def __post_init__(self):
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim == 0:
            if self.heads > 0 and self.hidden % self.heads:
                raise UserError(f"model {self.name}: hidden ({self.hidden}) must be a multiple of heads "
                                f"({self.heads}), or give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // max(self.heads, 1))
        if self.experts and self.expert_ffn == 0:
            object.__setattr__(self, "expert_ffn", self.ffn)
        self.validate()

    def validate(self):
        for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq"):
            if getattr(self, key) <= 0:
                raise UserError(f"model {self.name}: {key} must be a positive integer, got {getattr(self, key)}")
        if self.mtp_layers < 0:
            raise UserError(f"model {self.name}: mtp_layers must be >= 0 (0: no multi-token prediction), "
                            f"got {self.mtp_layers}")
        if self.mlp not in MLPS:
            raise UserError(f"model {self.name}: mlp must be one of {', '.join(MLPS)}, got {self.mlp!r}")
        if self.chunked_attention and not self.sliding_window:
            raise UserError(f"model {self.name}: chunked_attention needs sliding_window, the chunk's length")
        if not 0 <= self.packed_samples < self.seq:
            raise UserError(f"model {self.name}: packed_samples must be a sample length in tokens shorter than the "
                            f"sequence ({self.seq}), or 0 for none; got {self.packed_samples}")
        if self.packed_samples and (self.sliding_window or not self.causal):
            raise UserError(f"model {self.name}: packed samples are costed for causal attention without a sliding "
                            f"window; set packed_samples to 0")
        if not self.causal and self.sliding_window:
            raise UserError(f"model {self.name}: a sliding_window looks back only; with causal = false give none")
        if self.norm not in NORMS:
            raise UserError(f"model {self.name}: norm must be layernorm or rmsnorm (or left out: LayerNorm with "
                            f"biases, RMSNorm without), got {self.norm!r}")
        if self.heads % self.kv_heads:
            raise UserError(f"model {self.name}: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.experts:
            if not 0 < self.top_k <= self.experts:
                raise UserError(f"model {self.name}: top_k must be in 1..experts ({self.experts}), got {self.top_k}")
            if self.capacity_factor < 0:
                raise UserError(f"model {self.name}: capacity_factor must be >= 0 (0: dropless), "
                                f"got {self.capacity_factor}")
        elif self.top_k or self.shared_experts:
            raise UserError(f"model {self.name}: top_k/shared_experts need experts > 0")
        self._validate_lora()

    def _validate_lora(self):
        if self.lora_rank < 0:
            raise UserError(f"model {self.name}: lora_rank must be >= 0 (0: every parameter trains), "
                            f"got {self.lora_rank}")
        if self.lora_modules not in LORA_MODULES:
            raise UserError(f"model {self.name}: lora_modules must be one of {', '.join(LORA_MODULES)}, "
                            f"got {self.lora_modules!r}")
        if not 0 <= self.lora_dropout < 1:
            raise UserError(f"model {self.name}: lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not self.lora_rank:
            return
        if self.uses_mla or self.mtp_layers:
            raise UserError(f"model {self.name}: LoRA is costed on ordinary attention without MTP modules; "
                            "this model has multi-head latent attention or MTP (set lora_rank to 0)")
        if self.is_moe and self.lora_modules not in ("attention", "qkv"):
            raise UserError(f"model {self.name}: LoRA adapters on MoE experts are not costed; "
                            "use lora_modules = \"attention\" or \"qkv\"")

    # ---- shape helpers -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def lora(self) -> bool:
        """Whether this is a LoRA fine-tuning: the base frozen, only the adapters train."""
        return self.lora_rank > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def layer_norm(self) -> bool:
        """Whether the norms are LayerNorms (with a bias each), not RMSNorms."""
        return self.norm == "layernorm" or (not self.norm and self.biases)

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in GATED_MLPS

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def mlp_in_width(self) -> int:
        """The output width of the dense MLP's first matmul: gate and up side by side where it is gated."""
        return (2 if self.gated_mlp else 1) * self.ffn

    @property
    def attends_in_chunks(self) -> bool:
        """Whether a query attends to the earlier positions of its own block (`attention_window` long): Llama 4's
        chunked attention, or a packed sample."""
        return self.chunked_attention or self.packed_samples > 0

    def attention_window(self, i: int) -> int:
        """Layer i's attention window (0: all positions): a packed sample's length; else the sliding window, except
        every full_attention_every-th layer (Gemma 2 and GPT-OSS alternate, Gemma 3 has one full layer in 6)."""
        if self.packed_samples:
            return self.packed_samples
        every = self.full_attention_every
        return 0 if every and (i + 1) % every == 0 else self.sliding_window

    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe and i >= self.first_dense_layers and (i - self.first_dense_layers) % self.moe_every == 0

    @property
    def moe_layers(self) -> int:  # is_moe_layer's count: every moe_every-th layer after the first dense ones
        if not self.is_moe or self.layers <= self.first_dense_layers:
            return 0
        return -(-(self.layers - self.first_dense_layers) // self.moe_every)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    # ---- parameter counts -----------------------------------------------------------------
    def attention_params(self) -> int:
        h, a, d = self.hidden, self.heads, self.head_dim
        if self.uses_mla:
            # DeepSeek-V2 (arXiv:2405.04434) sec. 2.1.2: low-rank q and joint kv compression, decoupled RoPE key.
            v = self.v_head_dim or d
            q = h * a * (d + self.rope_head_dim) if not self.q_lora_rank else (
                h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * a * (d + self.rope_head_dim))
            kv = h * (self.kv_lora_rank + self.rope_head_dim) + self.kv_lora_rank + self.kv_lora_rank * a * (d + v)
            return q + kv + a * v * h
        qkvo = h * a * d * 2 + h * self.kv_heads * d * 2
        bias = (a * d + 2 * self.kv_heads * d) * (self.biases or self.qkv_bias) + h * self.biases
        return qkvo + bias

    def dense_mlp_params(self) -> int:
        bias = (self.ffn * (self.mlp_matrices - 1) + self.hidden) if self.biases else 0
        return self.mlp_matrices * self.hidden * self.ffn + bias

    def expert_params(self) -> int:
        """One routed (or shared) expert."""
        return self.mlp_matrices * self.hidden * self.expert_ffn

    def moe_mlp_params(self) -> int:
        gate = self.hidden if self.shared_expert_gate else 0
        return (self.experts + self.shared_experts) * self.expert_params() + self.hidden * self.experts + gate

    def norm_params(self) -> int:
        # two norms per layer, four with sandwich norms; LayerNorm has a bias too; qk-norm: one head_dim each
        per_norm = self.hidden * (2 if self.layer_norm else 1)
        return per_norm * (4 if self.sandwich_norms else 2) + (2 * self.head_dim if self.qk_norm else 0)

    def embedding_params(self) -> int:
        table = self.vocab * self.hidden
        pos = self.seq * self.hidden if self.learned_positions else 0
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        final_norm = self.hidden * (2 if self.layer_norm else 1)
        return table + pos + head + final_norm

    def layer_params(self, i: int) -> int:
        mlp = self.moe_mlp_params() if self.is_moe_layer(i) else self.dense_mlp_params()
        return self.attention_params() + mlp + self.norm_params()

    def param_count(self) -> int:
        mlp = self.moe_layers * self.moe_mlp_params() + self.dense_layers * self.dense_mlp_params()
        return self.embedding_params() + self.layers * (self.attention_params() + self.norm_params()) + mlp

    def active_param_count(self) -> int:
        """Parameters touched per token: routed experts count top_k of `experts` times."""
        if not self.is_moe:
            return self.param_count()
        idle = (self.experts - self.top_k) * self.expert_params()
        return self.param_count() - self.moe_layers * idle

    @property
    def lora_targets(self) -> tuple:
        """The names of each layer's matrices that carry a LoRA adapter (LORA_TARGETS), none without LoRA."""
        return LORA_TARGETS[self.lora_modules] if self.lora else ()

    def lora_matrices(self) -> tuple:
        """The (in, out) widths of `lora_targets`, in their order."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        widths = {"linear_qkv": (self.hidden, q + 2 * kv), "linear_proj": (q, self.hidden),
                  "linear_fc1": (self.hidden, self.mlp_in_width), "linear_fc2": (self.ffn, self.hidden)}
        return tuple(widths[t] for t in self.lora_targets)

    def adapter_params(self) -> int:
        """One layer's LoRA adapter parameters: r x (in + out) for each adapted matrix."""
        return sum(self.lora_rank * (i + o) for i, o in self.lora_matrices())

    def trained_param_count(self) -> int:
        """The parameters the optimizer updates: the adapters under LoRA, else all of them."""
        return self.layers * self.adapter_params() if self.lora else self.param_count()

    def with_seq(self, seq: int) -> "ModelSpec":
        return replace(self, seq=seq)

    def to_dict(self) -> dict:
        return asdict(self)


def _llama(name, layers, hidden, heads, kv_heads, ffn, vocab, seq, **kw) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn,
                     vocab=vocab, seq=seq, mlp="swiglu", **kw)


# Shapes from each model's published config (Hugging Face config.json or the paper's table).
PRESETS: dict[str, ModelSpec] = {
    # Tiny models sized for CPU runs: every TP degree up to 4 divides heads/kv_heads/ffn/vocab,
    # and 8 layers allow pp*vpp up to 8.
    "tiny": _llama("tiny", 8, 64, 8, 4, 176, 256, 64),
    "small": _llama("small", 8, 256, 8, 4, 688, 256, 256),
    # MoE twins: 8 experts (so ep up to 8 divides them), top-2, one shared expert, the first layer dense.
    "tiny-moe": _llama("tiny-moe", 4, 64, 8, 4, 176, 256, 64, experts=8, top_k=2, expert_ffn=64,
                       shared_experts=1, first_dense_layers=1),
    "small-moe": _llama("small-moe", 8, 256, 8, 4, 688, 256, 256, experts=8, top_k=2, expert_ffn=256,
                        shared_experts=1, first_dense_layers=1),
    # GPT-style twin: LayerNorm and biases, GeLU MLP, learned positions, tied embeddings.
    "tiny-gpt": ModelSpec(name="tiny-gpt", layers=8, hidden=64, heads=8, ffn=256, vocab=256, seq=64, mlp="gelu",
                          tied_embeddings=True, learned_positions=True, biases=True),
    # Touvron et al. 2023, "Llama 2", Table 1 / HF configs.
    "llama2-7b": _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    "llama2-13b": _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    # Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3.
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    # Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1.
    "gpt3-175b": ModelSpec(name="gpt3-175b", layers=96, hidden=12288, heads=96, ffn=49152, vocab=50257,
                           seq=2048, mlp="gelu", tied_embeddings=True, learned_positions=True, biases=True),
    # Parmar et al. 2024, "Nemotron-4 15B Technical Report" (arXiv:2402.16819), sec. 2 and Table 1, and NVIDIA
    # 2024, "Nemotron-4 340B Technical Report" (arXiv:2406.11704), sec. 2.2 and Table 1: squared-ReLU MLP of 4x
    # hidden, no biases, untied embeddings, GQA with 8 KV heads, RoPE; LayerNorm (Nemotron-4-340B-Base's
    # model_config.yaml: normalization layernorm1p, rotary_percentage 0.5, which the 15B shares).
    "nemotron-4-15b": ModelSpec(name="nemotron-4-15b", layers=32, hidden=6144, heads=48, kv_heads=8, ffn=24576,
                                vocab=256000, seq=4096, mlp="relu2", norm="layernorm", rotary_fraction=0.5),
    "nemotron-4-340b": ModelSpec(name="nemotron-4-340b", layers=96, hidden=18432, heads=96, kv_heads=8,
                                 ffn=73728, vocab=256000, seq=4096, mlp="relu2", norm="layernorm",
                                 rotary_fraction=0.5),
    # Jiang et al. 2024, "Mixtral of Experts", Table 1.
    "mixtral-8x7b": _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, experts=8, top_k=2),
    # Qwen Team 2025, "Qwen3 Technical Report", Table 2, and its HF config.json: every layer MoE (128 experts of
    # 1536, top-8, no shared expert), QK-norm, GQA 64/4 heads of 128 (235B total, 22B active).
    "qwen3-235b-a22b": _llama("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 4096, head_dim=128,
                              experts=128, top_k=8, expert_ffn=1536, qk_norm=True, norm_eps=1e-6,
                              rope_theta=1e6, aux_loss_coef=0.001),
    # The same report's Table 2 and Qwen3-30B-A3B's HF config.json: 48 layers of 128 experts of 768, top-8, GQA 32/4
    # heads of 128 (30.5B total, 3.3B active).
    "qwen3-30b-a3b": _llama("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 4096, head_dim=128, experts=128, top_k=8,
                            expert_ffn=768, qk_norm=True, norm_eps=1e-6, rope_theta=1e6, aux_loss_coef=0.001),
    # OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", Table 1, and its HF config.json: 36 layers, 128
    # experts of 2880, top-4, GQA 64/8 heads of 64, a window of 128 in every other layer, trained at 4096 tokens
    # (initial_context_length) before YaRN extended it (116.8B total, 5.1B active).
    "gpt-oss-120b": _llama("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, 4096, head_dim=64, experts=128, top_k=4,
                           qkv_bias=True, sliding_window=128, full_attention_every=2, attention_sinks=True,
                           rope_theta=150000.0, aux_loss_coef=0.9, rope_scaling=json.dumps(
                               {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "rope_type": "yarn",
                                "original_max_position_embeddings": 4096, "truncate": False}, sort_keys=True)),
    # Meta 2025, Llama 4 Scout and Maverick, their HF config.json text_config: 48 layers, GQA 40/8 heads of 128,
    # top-1 routed experts of 8192 beside one shared expert as wide, in every layer (Scout, 16 experts) or every
    # other (Maverick, 128 experts; dense layers of 16384); chunked attention of 8192 but in every 4th layer
    # (107.8B and 400.7B parameters in the language model, 17.2B active). Trained at 8192 here: the chunk
    # (Meta states no pre-training length).
    "llama4-scout-17b-16e": _llama("llama4-scout-17b-16e", 48, 5120, 40, 8, 16384, 202048, 8192, head_dim=128,
                                   experts=16, top_k=1, expert_ffn=8192, shared_experts=1, norm_topk=False,
                                   rope_theta=500000.0, sliding_window=8192, full_attention_every=4,
                                   chunked_attention=True, aux_loss_coef=0.001, rope_scaling=json.dumps(
                                       {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                        "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                                       sort_keys=True)),
    "llama4-maverick-17b-128e": _llama("llama4-maverick-17b-128e", 48, 5120, 40, 8, 16384, 202048, 8192,
                                       head_dim=128, experts=128, top_k=1, expert_ffn=8192, shared_experts=1,
                                       first_dense_layers=1, moe_every=2, norm_topk=False, rope_theta=500000.0,
                                       sliding_window=8192, full_attention_every=4, chunked_attention=True,
                                       aux_loss_coef=0.001),
    # DeepSeek-AI 2024, "DeepSeek-V2" (arXiv:2405.04434), sec. 3.1.2, and its HF config.json (the first layer's
    # dense FFN, 12288): MLA, every layer but the first MoE with 2 shared and 160 routed experts of 1536, top-6
    # (236B total, 21B active).
    "deepseek-v2": _llama("deepseek-v2", 60, 5120, 128, 128, 12288, 102400, 4096, head_dim=128, experts=160,
                          top_k=6, expert_ffn=1536, shared_experts=2, first_dense_layers=1, q_lora_rank=1536,
                          kv_lora_rank=512, rope_head_dim=64, v_head_dim=128),
    # DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sec. 4.2 (671B total, 37B active).
    "deepseek-v3": _llama("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 4096, head_dim=128,
                          experts=256, top_k=8, expert_ffn=2048, shared_experts=1, first_dense_layers=3,
                          q_lora_rank=1536, kv_lora_rank=512, rope_head_dim=64, v_head_dim=128, mtp_layers=1),
}


def from_hf_config(cfg: dict, name: str, source: str | None = None) -> ModelSpec:
    """A Hugging Face config.json's model (specs/hf.py reads it per model_type)."""
    from meshscale.specs import hf

    return ModelSpec(name=name, **hf.model_fields(cfg, source or name))


# The rope scalings the runtime model applies (specs/hf.py reads more, for planning).
RUNTIME_ROPE_SCALINGS = ("linear", "llama3")


def trainer_lacks(spec: ModelSpec) -> str | None:
    """What of `spec` the runtime model does not build (it is planned all the same), or None."""
    if spec.lora:
        return "LoRA adapters (lora_rank; it trains every parameter)"
    if spec.packed_samples:
        return "packed samples (packed_samples; its attention spans each whole sequence)"
    if spec.uses_mla:
        return "multi-head latent attention (MLA)"
    if spec.mtp_layers:
        return "multi-token prediction (MTP) module"
    if spec.sandwich_norms:
        return "Gemma block (norms after attention and the MLP, (1 + w) norms, soft-capped logits)"
    if spec.mlp == "geglu":
        return "GeGLU MLP"
    if spec.attention_sinks:
        return "GPT-OSS block (attention sinks, clamped SwiGLU, biased experts)"
    if spec.chunked_attention:
        return "Llama 4 block (chunked attention, layers without RoPE, the router's weight on the experts' input)"
    if not spec.causal:
        return "attention without a causal mask (causal = false; it trains next-token prediction)"
    kind = json.loads(spec.rope_scaling)["rope_type"] if spec.rope_scaling else None
    if kind and kind not in RUNTIME_ROPE_SCALINGS:
        return f"{kind} rope scaling (it applies {' and '.join(RUNTIME_ROPE_SCALINGS)})"
    return None


def _config_path(name_or_path: str) -> str:
    """A model directory stands for its config.json."""
    if Path(name_or_path).is_dir():
        path = Path(name_or_path) / "config.json"
        if not path.is_file():
            raise UserError(f"model directory {name_or_path} has no config.json; pass a directory saved by "
                            "transformers' save_pretrained, a config.json, or a preset")
        return str(path)
    return name_or_path


def is_hf_model(name_or_path: str) -> bool:
    """Whether --model names a Hugging Face config (whose seq is its max_position_embeddings)."""
    if name_or_path in PRESETS:
        return False
    from meshscale.specs import hf

    return hf.is_hf_config(read_spec_file(_config_path(name_or_path), PRESETS, "model"))


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name, a meshscale JSON/TOML ModelSpec, or a Hugging Face config.json or model directory."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    from meshscale.specs import hf

    path = _config_path(name_or_path)
    data = read_spec_file(path, PRESETS, "model")
    if hf.is_hf_config(data):
        return from_hf_config(data, data.get("_name_or_path") or name_or_path, path)
    data.setdefault("name", name_or_path)
    return build(ModelSpec, data, name_or_path)


__all__ = ["ModelSpec", "PRESETS", "load_model", "from_hf_config", "is_hf_model", "trainer_lacks"]
