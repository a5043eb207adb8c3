"""Hugging Face config.json -> ModelSpec, one reader per `model_type`.

Every field a config holds is either read into the ModelSpec, or known to leave the model's math alone
(`INERT`: bookkeeping, generation settings, dropout, which meshscale does not train with). Anything else is
refused in one line: a field we do not know might change the math, and a plan or a run of the wrong model
is worse than none. Configs written by transformers 4.x (rope_theta, rope_scaling) and 5.x (rope_parameters)
are both read.
"""

import json

from meshscale.errors import UserError

# Fields any model_type may carry that change neither the plan nor the forward pass.
INERT = frozenset("""
    _name_or_path architectures auto_map model_type transformers_version torch_dtype dtype use_cache
    initializer_range bos_token_id eos_token_id pad_token_id sep_token_id decoder_start_token_id
    output_attentions output_hidden_states return_dict id2label label2id problem_type chunk_size_feed_forward
    is_encoder_decoder is_decoder tokenizer_class prefix task_specific_params finetuning_task torchscript
    use_bfloat16 pruned_heads tf_legacy_loss output_router_logits _attn_implementation attn_implementation
    max_length min_length do_sample early_stopping num_beams num_beam_groups diversity_penalty temperature top_k
    top_p typical_p repetition_penalty length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size
    bad_words_ids num_return_sequences output_scores return_dict_in_generate forced_bos_token_id
    forced_eos_token_id remove_invalid_values exponential_decay_length_penalty suppress_tokens
    begin_suppress_tokens cross_attention_hidden_size tie_encoder_decoder add_cross_attention
    attention_dropout hidden_dropout resid_pdrop embd_pdrop attn_pdrop classifier_dropout
    summary_type summary_use_proj summary_activation summary_proj_to_labels summary_first_dropout
    pretraining_tp cache_implementation reorder_and_upcast_attn ep_size
""".split())
# pretraining_tp: Llama's sliced matmuls, the same sums in another order. reorder_and_upcast_attn: GPT-2's fp32
# scores, a precision choice. ep_size: DeepSeek's inference sharding hint.

_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "an object",
          list: "a list"}


class Fields:
    """A config's fields, each read at most once and type-checked; `finish` refuses whatever was not read."""

    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source
        self.read: set[str] = set()

    def get(self, key: str, kind: type, default=None):
        """The value of `key` (null counts as absent), or `default`; default ... means required."""
        self.read.add(key)
        value = self.data.get(key)
        if value is None:
            if default is ...:
                raise UserError(f"{self.source}: the config lacks {key!r}, which a {self.data['model_type']} "
                                "config must give")
            return default
        ok = (isinstance(value, (int, float) if kind is float else kind)
              and (kind is bool or not isinstance(value, bool)))
        if not ok:
            raise UserError(f"{self.source}: {key} must be {_KINDS[kind]}, got {value!r}")
        return float(value) if kind is float else value

    def either(self, keys: tuple, kind: type, default=None):
        """The first of several names a field has had (GPT-2's n_positions / n_ctx)."""
        values = [self.get(k, kind) for k in keys]
        return next((v for v in values if v is not None), default)

    def only(self, key: str, allowed, why: str):
        """A field meshscale supports at its default value(s) alone."""
        value = self.data.get(key)
        self.read.add(key)
        if value is not None and value not in allowed:
            raise UserError(f"{self.source}: {key}={json.dumps(value)} is not supported ({why}); "
                            f"meshscale supports {' or '.join(json.dumps(a) for a in allowed)}")

    def refuse(self, key: str, why: str):
        raise UserError(f"{self.source}: {key}={json.dumps(self.data.get(key))} is not supported ({why})")

    def finish(self):
        left = sorted(set(self.data) - self.read - INERT)
        if left:
            raise UserError(f"{self.source}: field(s) {', '.join(left)} of model_type {self.data['model_type']} are "
                            "not ones meshscale maps and may change the model's math; remove them if they do not")


# ---- pieces shared by several model types ----------------------------------------------------------------

def _rope(f: Fields) -> dict:
    """rope_theta, the scaling and the rotated share of each head, from 4.x's rope_theta/rope_scaling/
    partial_rotary_factor (GPT-NeoX: rotary_emb_base/rotary_pct) or 5.x's rope_parameters, which holds all."""
    params = {**f.get("rope_parameters", dict, {}), **f.get("rope_scaling", dict, {})}
    theta = params.pop("rope_theta", None) or f.either(("rope_theta", "rotary_emb_base"), float, 10000.0)
    fraction = params.pop("partial_rotary_factor", None) or f.either(
        ("partial_rotary_factor", "rotary_pct"), float, 1.0)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind not in ("default", "linear", "llama3", "yarn", "longrope", "dynamic"):
        raise UserError(f"{f.source}: rope scaling {kind!r} is not supported; meshscale reads default, linear, "
                        "llama3, yarn, longrope and dynamic")
    needs = {"linear": ("factor",), "llama3": ("factor", "original_max_position_embeddings")}.get(kind, ())
    for key in needs:
        if key not in params:
            raise UserError(f"{f.source}: {kind} rope scaling needs {key!r}")
    numbers = [("rope_theta", theta), ("partial_rotary_factor", fraction)] + [
        (key, params[key]) for key in ("factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings") if key in params]
    for key, value in numbers:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise UserError(f"{f.source}: {key} must be a number, got {value!r}")
    out: dict[str, float | str] = {"rope_theta": float(theta), "rotary_fraction": float(fraction)}
    if kind != "default":
        out["rope_scaling"] = json.dumps({"rope_type": kind, **params}, sort_keys=True)
    return out


def _gated(f: Fields, key: str, default: str = "silu") -> str:
    act = f.get(key, str, default)
    gated = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}
    if act not in gated:
        raise UserError(f"{f.source}: {key}={act!r} is not supported; meshscale's gated MLPs take silu "
                        "(SwiGLU) or gelu_pytorch_tanh (GeGLU)")
    return gated[act]


def _shape(f: Fields) -> dict:
    """The sizes every Llama-shaped model_type gives under the same names."""
    heads = f.get("num_attention_heads", int, ...)
    return dict(
        layers=f.get("num_hidden_layers", int, ...), hidden=f.get("hidden_size", int, ...), heads=heads,
        kv_heads=f.get("num_key_value_heads", int, heads), ffn=f.get("intermediate_size", int, ...),
        vocab=f.get("vocab_size", int, ...), seq=f.get("max_position_embeddings", int, 4096),
        head_dim=f.get("head_dim", int, 0))


def _decoder(f: Fields, eps_default: float = 1e-6, tied_default: bool = False, act: str = "silu") -> dict:
    """The fields of a Llama-shaped decoder that every such model_type has."""
    return dict(**_shape(f), norm_eps=f.get("rms_norm_eps", float, eps_default),
                tied_embeddings=f.get("tie_word_embeddings", bool, tied_default),
                mlp=_gated(f, "hidden_act", act), **_rope(f))


def _no_sliding(f: Fields):
    """Qwen's use_sliding_window (off in every published Qwen2/3 config): the window and the layers it
    spares are read only with it."""
    f.only("use_sliding_window", (False,), "Qwen's per-layer sliding window is not implemented")
    for key in ("sliding_window", "max_window_layers"):
        f.get(key, int)
    _layer_types(f, "full_attention")


def _layer_types(f: Fields, want: str):
    if any(t != want for t in f.get("layer_types", list, [])):
        f.refuse("layer_types", f"meshscale reads {f.data['model_type']} with {want} in every layer")


def _window(f: Fields) -> dict:
    """One sliding window for every layer (Mistral 7B v0.1, Phi-3), or none."""
    window = f.get("sliding_window", int, 0)
    _layer_types(f, "sliding_attention" if window else "full_attention")
    return {"sliding_window": window} if window else {}


def _sparse_layers(f: Fields, layers: int) -> dict:
    """Qwen-MoE's MoE layers: (i + 1) % decoder_sparse_step == 0, bar mlp_only_layers; meshscale's rule
    (i - first_dense_layers) % moe_every == 0 says the same with first_dense_layers = step - 1, and also
    takes a leading run of dense layers at step 1."""
    step = f.get("decoder_sparse_step", int, 1)
    dense = f.get("mlp_only_layers", list, [])
    if step < 1:
        f.refuse("decoder_sparse_step", "it must be at least 1")
    if dense and (step != 1 or dense != list(range(len(dense)))):
        f.refuse("mlp_only_layers", "meshscale takes dense layers only as a leading run 0..k-1 with "
                 "decoder_sparse_step 1")
    return {"first_dense_layers": len(dense) or step - 1, "moe_every": step} if layers else {}


def _router(f: Fields, norm_default: bool) -> dict:
    return {"norm_topk": f.get("norm_topk_prob", bool, norm_default),
            "aux_loss_coef": f.get("router_aux_loss_coef", float, 0.001)}


# ---- one reader per model_type ---------------------------------------------------------------------------

def _llama(f: Fields) -> dict:
    f.only("attention_bias", (False,), "biases on q, k, v and o together are not implemented")
    f.only("mlp_bias", (False,), "MLP biases without GPT-style LayerNorm are not implemented")
    return {**_decoder(f), **_window(f)}


def _mixtral(f: Fields) -> dict:
    kw = {**_decoder(f, eps_default=1e-5), **_window(f)}
    f.only("router_jitter_noise", (0, 0.0), "the router takes no noise")
    return {**kw, "experts": f.get("num_local_experts", int, ...), "top_k": f.get("num_experts_per_tok", int, 2),
            "norm_topk": True, "aux_loss_coef": f.get("router_aux_loss_coef", float, 0.001)}


def _qwen2(f: Fields) -> dict:
    _no_sliding(f)
    return {**_decoder(f), "qkv_bias": True}


def _qwen2_moe(f: Fields) -> dict:
    kw = _qwen2(f)
    f.only("qkv_bias", (True,), "Qwen2-MoE's q, k, v always carry biases")
    experts, expert_ffn = f.get("num_experts", int, ...), f.get("moe_intermediate_size", int, ...)
    shared = f.get("shared_expert_intermediate_size", int, 0)
    if shared % expert_ffn:
        f.refuse("shared_expert_intermediate_size", f"meshscale's shared expert is a whole number of "
                 f"moe_intermediate_size ({expert_ffn}) wide")
    return {**kw, "experts": experts, "top_k": f.get("num_experts_per_tok", int, ...), "expert_ffn": expert_ffn,
            "shared_experts": shared // expert_ffn, "shared_expert_gate": bool(shared),
            **_sparse_layers(f, kw["layers"]), **_router(f, False)}


def _qwen3(f: Fields) -> dict:
    f.only("attention_bias", (False,), "Qwen3 publishes no biases")
    _no_sliding(f)
    return {**_decoder(f), "qk_norm": True}


def _qwen3_moe(f: Fields) -> dict:
    kw = _qwen3(f)
    experts = f.either(("num_experts", "num_local_experts"), int)
    if not experts:
        raise UserError(f"{f.source}: the config lacks 'num_experts', which a qwen3_moe config must give")
    return {**kw, "experts": experts, "top_k": f.get("num_experts_per_tok", int, ...),
            "expert_ffn": f.get("moe_intermediate_size", int, ...), **_sparse_layers(f, kw["layers"]),
            **_router(f, False)}


def _phi3(f: Fields) -> dict:
    f.get("original_max_position_embeddings", int)  # longrope's switch point, read with the scaling
    f.only("attention_bias", (False,), "Phi-3 publishes no biases")
    return {**_decoder(f, eps_default=1e-5), **_window(f)}


def _deepseek_v3(f: Fields) -> dict:
    """Planned only (the runtime model has no multi-head latent attention). The router's sigmoid scores,
    group-limited choice and scale change no shape the planner costs; the multi-token-prediction modules (not in
    the 671B the paper counts) are costed on the head's pipeline rank."""
    kw = _decoder(f)
    for key, kind in (("routed_scaling_factor", float), ("n_group", int), ("topk_group", int),
                      ("scoring_func", str), ("topk_method", str),
                      ("seq_aux", bool), ("aux_loss_alpha", float), ("rope_interleave", bool), ("qk_head_dim", int)):
        f.get(key, kind)
    f.only("attention_bias", (False,), "DeepSeek-V3 publishes no biases")
    freq, first = f.get("moe_layer_freq", int, 1), f.get("first_k_dense_replace", int, 0)
    if first % freq:
        f.refuse("moe_layer_freq", "meshscale's MoE layers are every moe_layer_freq-th after the dense ones")
    return {**kw, "head_dim": f.get("qk_nope_head_dim", int, 128), "rope_head_dim": f.get("qk_rope_head_dim", int, 64),
            "v_head_dim": f.get("v_head_dim", int, 128), "kv_lora_rank": f.get("kv_lora_rank", int, ...),
            "q_lora_rank": f.get("q_lora_rank", int, 0), "experts": f.get("n_routed_experts", int, ...),
            "top_k": f.get("num_experts_per_tok", int, ...), "expert_ffn": f.get("moe_intermediate_size", int, ...),
            "shared_experts": f.get("n_shared_experts", int, 0), "first_dense_layers": first, "moe_every": freq,
            "norm_topk": f.get("norm_topk_prob", bool, True), "mtp_layers": f.get("num_nextn_predict_layers", int, 0)}


def _deepseek_v2(f: Fields) -> dict:
    """DeepSeek-V2's config is V3's without the multi-token prediction and with softmax routing; planned only."""
    f.only("mlp_bias", (False,), "DeepSeek-V2 publishes no biases")
    return _deepseek_v3(f)


def _gpt_oss(f: Fields) -> dict:
    """Planned only (the runtime model has no attention sinks, no clamped SwiGLU and no biases on the output
    projection, the experts and the router). What the planner costs: GQA attention with q, k, v biases, a window
    in every other layer, MoE layers of num_local_experts SwiGLU experts; the sinks (a logit per head), the
    clamp and the biases are element-wise work and 0.03% of the parameters, left out."""
    kw = _decoder(f, eps_default=1e-5)
    f.only("attention_bias", (True,), "GPT-OSS's attention carries biases")
    top_k = f.get("num_experts_per_tok", int, ...)
    if f.get("experts_per_token", int, top_k) != top_k:  # OpenAI's own name for it
        f.refuse("experts_per_token", f"it differs from num_experts_per_tok ({top_k})")
    for key, kind in (("swiglu_limit", float), ("swiglu_alpha", float), ("initial_context_length", int)):
        f.get(key, kind)  # the clamp and its gain, and YaRN's original length (in the rope scaling too)
    types = f.get("layer_types", list, [])
    if types and types != ["sliding_attention", "full_attention"] * (kw["layers"] // 2):
        f.refuse("layer_types", "meshscale reads GPT-OSS's alternation, sliding then full attention")
    return {**kw, "qkv_bias": True, "sliding_window": f.get("sliding_window", int, ...), "full_attention_every": 2,
            "attention_sinks": True, "experts": f.get("num_local_experts", int, ...), "top_k": top_k,
            "norm_topk": True, "aux_loss_coef": f.get("router_aux_loss_coef", float, 0.001)}


def _nemotron(f: Fields) -> dict:
    """NVIDIA's Nemotron-4 (NemotronForCausalLM): an MLP of up and down projections around a squared ReLU, and
    LayerNorm1P, a LayerNorm whose gain g is stored as g - 1 (the same function, so planned and trained as a
    LayerNorm; models/hf_weights.py adds the 1 back), with no biases on the linear layers and RoPE on part of each
    head."""
    if f.get("hidden_act", str, "relu2") != "relu2":
        f.refuse("hidden_act", "Nemotron's MLP is the squared ReLU (relu2)")
    f.only("attention_bias", (False,), "Nemotron-4 publishes no biases")
    f.only("mlp_bias", (False,), "Nemotron-4 publishes no biases")
    return {**_shape(f), "norm_eps": f.get("norm_eps", float, 1e-5), "mlp": "relu2", "norm": "layernorm",
            "tied_embeddings": f.get("tie_word_embeddings", bool, False), **_rope(f)}


def _llama4(f: Fields) -> dict:
    """Planned only (the runtime model has no chunked attention). Llama 4's text model: every
    interleave_moe_layer_step-th layer MoE (num_local_experts SwiGLU experts of intermediate_size, top-1, and one
    shared expert as wide), the others dense of intermediate_size_mlp; chunked attention of attention_chunk_size
    in the layers layer_types calls chunked, full attention every no_rope_layer_interval-th (those without RoPE).
    Element-wise and left out: the weightless L2 norm of q and k (use_qk_norm), the queries' temperature tuning,
    the rotation the full layers skip."""
    kw = _decoder(f, eps_default=1e-5)
    f.only("attention_bias", (False,), "Llama 4 publishes no biases")
    f.only("router_jitter_noise", (0, 0.0), "the router takes no noise")
    step, layers = f.get("interleave_moe_layer_step", int, 1), kw["layers"]
    moe = list(range(step - 1, layers, step))
    if step < 1 or f.get("moe_layers", list, moe) != moe:
        f.refuse("moe_layers", f"meshscale reads Llama 4's MoE layers as every interleave_moe_layer_step-th ({step})")
    every, chunk = f.get("no_rope_layer_interval", int, 4), f.get("attention_chunk_size", int, 0)
    rope = [0 if (i + 1) % every == 0 else 1 for i in range(layers)]
    if f.get("no_rope_layers", list, rope) != rope:
        f.refuse("no_rope_layers", f"meshscale reads Llama 4's layers without RoPE as every {every}th")
    kinds = ["chunked_attention" if chunk and r else "full_attention" for r in rope]
    if f.get("layer_types", list, kinds) != kinds:
        f.refuse("layer_types", f"meshscale reads Llama 4's chunked layers with every {every}th attending to all")
    for key, kind in (("use_qk_norm", bool), ("for_llm_compressor", bool), ("floor_scale", float),
                      ("attn_scale", float)):  # the q/k norm and query scales are element-wise; a quantizer's hint
        f.get(key, kind)
    f.read.add("attn_temperature_tuning")  # true, or a number in the first published configs: a query scale
    window = {"sliding_window": chunk, "full_attention_every": every, "chunked_attention": True} if chunk else {}
    return {**kw, "ffn": f.get("intermediate_size_mlp", int, kw["ffn"]), "expert_ffn": kw["ffn"],
            "experts": f.get("num_local_experts", int, ...), "top_k": f.get("num_experts_per_tok", int, 1),
            "shared_experts": 1, "first_dense_layers": step - 1, "moe_every": step, "norm_topk": False,
            "aux_loss_coef": f.get("router_aux_loss_coef", float, 0.001), **window}


def _gpt2(f: Fields) -> dict:
    hidden = f.get("n_embd", int, ...)
    act = f.get("activation_function", str, "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        f.refuse("activation_function", "GPT-2's MLP is the tanh GeLU (gelu_new)")
    f.only("scale_attn_weights", (True,), "attention scores are scaled by 1/sqrt(head_dim)")
    f.only("scale_attn_by_inverse_layer_idx", (False,), "scores are not scaled per layer")
    f.get("n_ctx", int)  # n_positions' old name
    return dict(layers=f.get("n_layer", int, ...), hidden=hidden, heads=f.get("n_head", int, ...),
                ffn=f.get("n_inner", int, 4 * hidden), vocab=f.get("vocab_size", int, ...),
                seq=f.either(("n_positions", "n_ctx"), int, 1024), mlp="gelu", biases=True, learned_positions=True,
                norm_eps=f.get("layer_norm_epsilon", float, 1e-5),
                tied_embeddings=f.get("tie_word_embeddings", bool, True))


def _gpt_neox(f: Fields) -> dict:
    act = f.get("hidden_act", str, "gelu")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        f.refuse("hidden_act", "GPT-NeoX's MLP is a GeLU")
    f.only("attention_bias", (True,), "GPT-NeoX's attention carries biases")
    return dict(layers=f.get("num_hidden_layers", int, ...), hidden=f.get("hidden_size", int, ...),
                heads=f.get("num_attention_heads", int, ...), ffn=f.get("intermediate_size", int, ...),
                vocab=f.get("vocab_size", int, ...), seq=f.get("max_position_embeddings", int, 2048),
                mlp="gelu-erf" if act == "gelu" else "gelu", biases=True,
                parallel_residual=f.get("use_parallel_residual", bool, True),
                norm_eps=f.get("layer_norm_eps", float, 1e-5),
                tied_embeddings=f.get("tie_word_embeddings", bool, False), **_rope(f))


def _gemma(f: Fields, version: int) -> dict:
    """Planned only (the runtime model has no Gemma block: norms after attention and the MLP, (1 + w) norm
    weights, the embedding scaled by sqrt(hidden), soft-capped logits). Soft-capping and the query scale are
    element-wise and change no shape the planner costs."""
    # hidden_act: what old Gemma configs carry beside hidden_activation
    kw = _decoder(f, tied_default=True, act="gelu_pytorch_tanh")
    kw["mlp"] = _gated(f, "hidden_activation", "gelu_pytorch_tanh") if "hidden_activation" in f.data else kw["mlp"]
    kw.pop("rope_scaling", None)  # Gemma 3's local/global pair is costed the same
    for key, kind in (("query_pre_attn_scalar", float), ("final_logit_softcapping", float),
                      ("attn_logit_softcapping", float), ("rope_local_base_freq", float),
                      ("sliding_window_pattern", int), ("_sliding_window_pattern", int)):
        f.get(key, kind)
    f.only("attention_bias", (False,), "Gemma publishes no biases")
    f.only("use_bidirectional_attention", (False,), "meshscale trains causal decoders")
    every = 2 if version == 2 else f.either(("sliding_window_pattern", "_sliding_window_pattern"), int, 6)
    types = f.get("layer_types", list, [])
    expected = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(kw["layers"])]
    if types and types != expected:
        f.refuse("layer_types", f"meshscale reads Gemma's pattern of one full-attention layer every {every}")
    return {**kw, "sliding_window": f.get("sliding_window", int, 4096), "full_attention_every": every,
            "sandwich_norms": True, "qk_norm": version == 3}


READERS = {
    "llama": _llama, "mistral": _llama, "mixtral": _mixtral, "qwen2": _qwen2, "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "deepseek_v2": _deepseek_v2, "deepseek_v3": _deepseek_v3,
    "phi3": _phi3, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "gpt_oss": _gpt_oss, "nemotron": _nemotron,
    "llama4_text": _llama4, "gemma2": lambda f: _gemma(f, 2), "gemma3_text": lambda f: _gemma(f, 3),
}
# Multimodal wrappers whose text model sits in text_config without a model_type of its own.
TEXT_CONFIG_TYPES = {"gemma3": "gemma3_text", "llama4": "llama4_text"}


def is_hf_config(data: dict) -> bool:
    return "model_type" in data or "text_config" in data or "num_hidden_layers" in data


def model_fields(data: dict, source: str) -> dict:
    """ModelSpec keyword arguments (all but name) for a Hugging Face config."""
    outer = data.get("model_type")
    if isinstance(data.get("text_config"), dict):  # a multimodal model: plan its language model
        data = dict(data["text_config"])
        data.setdefault("model_type", TEXT_CONFIG_TYPES.get(str(outer), outer))
        source = f"{source} (text_config)"
    kind = data.get("model_type")
    if kind not in READERS:
        got = f"model_type {kind!r}" if kind else "no model_type"
        raise UserError(f"{source}: {got} is not supported; meshscale reads {', '.join(sorted(READERS))}")
    f = Fields(data, source)
    # The stored weights' format (DeepSeek-V3's fp8 blocks): a plan's precision is --precision's, and
    # --init-from refuses quantized weights.
    f.get("quantization_config", dict)
    kw = READERS[kind](f)
    f.finish()
    return kw


# ---- the other way: the config.json that reads back as a ModelSpec (meshscale export --to hf) ---------------

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel",
                 "gpt_neox": "GPTNeoXForCausalLM", "nemotron": "NemotronForCausalLM"}


def hf_type(spec) -> str:
    """The model_type whose architecture is `spec`'s (to_hf_config checks that it reads back the same)."""
    if spec.learned_positions:
        return "gpt2"
    if spec.biases:
        return "gpt_neox"
    if spec.mlp == "relu2":
        return "nemotron"
    if spec.is_moe:
        return "qwen3_moe" if spec.qk_norm else "qwen2_moe" if spec.qkv_bias else "mixtral"
    if spec.qk_norm or spec.qkv_bias:
        return "qwen3" if spec.qk_norm else "qwen2"
    return "phi3" if spec.rotary_fraction < 1 else "mistral" if spec.sliding_window else "llama"


def to_hf_config(spec) -> dict:
    """A Hugging Face config.json (transformers 4.x spelling, which 5.x reads too) of `spec`; a spec no
    supported model_type expresses is one line naming the fields that would differ."""
    kind = hf_type(spec)
    if kind == "gpt2":
        config = {"n_embd": spec.hidden, "n_layer": spec.layers, "n_head": spec.heads, "n_inner": spec.ffn,
                  "n_positions": spec.seq, "activation_function": "gelu_new", "layer_norm_epsilon": spec.norm_eps}
    else:
        config = {"hidden_size": spec.hidden, "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
                  "intermediate_size": spec.ffn, "max_position_embeddings": spec.seq, "rope_theta": spec.rope_theta}
        if spec.rope_scaling:
            config["rope_scaling"] = json.loads(spec.rope_scaling)
    if kind == "gpt_neox":
        config.update(hidden_act="gelu" if spec.mlp == "gelu-erf" else "gelu_new", layer_norm_eps=spec.norm_eps,
                      rotary_pct=spec.rotary_fraction, use_parallel_residual=spec.parallel_residual)
    elif kind == "nemotron":
        config.update(num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, norm_eps=spec.norm_eps,
                      hidden_act="relu2", partial_rotary_factor=spec.rotary_fraction)
    elif kind != "gpt2":
        config.update(num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, rms_norm_eps=spec.norm_eps,
                      hidden_act="silu")
    if kind in ("mistral", "phi3") and spec.sliding_window:
        config["sliding_window"] = spec.sliding_window
    if kind == "phi3":
        config["partial_rotary_factor"] = spec.rotary_fraction
    if spec.is_moe:
        experts = "num_local_experts" if kind == "mixtral" else "num_experts"
        config.update({experts: spec.experts, "num_experts_per_tok": spec.top_k,
                       "router_aux_loss_coef": spec.aux_loss_coef})
    if kind in ("qwen2_moe", "qwen3_moe"):
        config.update(moe_intermediate_size=spec.expert_ffn, norm_topk_prob=spec.norm_topk,
                      decoder_sparse_step=spec.moe_every,
                      mlp_only_layers=list(range(spec.first_dense_layers)) if spec.moe_every == 1 else [])
    if kind == "qwen2_moe":
        config["shared_expert_intermediate_size"] = spec.shared_experts * spec.expert_ffn
    config = {"model_type": kind, "architectures": [ARCHITECTURES[kind]], "vocab_size": spec.vocab,
              "tie_word_embeddings": spec.tied_embeddings, **config}
    back = type(spec)(name=spec.name, **model_fields(config, "export"))
    differ = [f"{k}={getattr(back, k)!r} (not {getattr(spec, k)!r})" for k in spec.__dataclass_fields__
              if getattr(back, k) != getattr(spec, k)]
    if differ:
        raise UserError(f"model {spec.name}: no Hugging Face model_type meshscale writes has its architecture "
                        f"(as {kind} it would read back with {', '.join(differ)})")
    return config


__all__ = ["READERS", "INERT", "model_fields", "is_hf_config", "to_hf_config", "hf_type"]
