"""Hugging Face config.json files read per model_type: 34 published configs (their math fields, as on the
Hub) planned at the published parameter totals, and the refusals of what meshscale does not map."""

import dataclasses
import json

import pytest

from meshscale.errors import UserError
from meshscale.specs.model import from_hf_config, is_hf_model, load_model

L3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192, "rope_type": "llama3"}


def llama(hidden, inter, layers, heads, kv, vocab, **kw):
    return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab, "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, **kw}


def qwen(kind, hidden, inter, layers, heads, kv, vocab, **kw):
    return {"model_type": kind, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab, "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": 131072,
            "max_window_layers": 28, "max_position_embeddings": 32768, "tie_word_embeddings": False, **kw}


# DeepSeek-V2's fields beside its sizes (the Hub's config.json of DeepSeek-V2 and V2-Lite).
DEEPSEEK_V2 = {"model_type": "deepseek_v2", "vocab_size": 102400, "first_k_dense_replace": 1, "moe_layer_freq": 1,
               "n_shared_experts": 2, "num_experts_per_tok": 6, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "norm_topk_prob": False, "scoring_func": "softmax",
               "aux_loss_alpha": 0.001, "seq_aux": True, "hidden_act": "silu", "max_position_embeddings": 163840,
               "rms_norm_eps": 1e-6, "rope_theta": 10000, "ep_size": 1, "pretraining_tp": 1, "attention_bias": False,
               "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"}}

# Llama 4's text_config fields beside its experts (the Hub's Llama-4-Scout-17B-16E and Maverick-17B-128E)
LLAMA4 = {"model_type": "llama4_text", "attention_bias": False, "attention_chunk_size": 8192, "attn_scale": 0.1,
          "attn_temperature_tuning": 4, "floor_scale": 8192, "for_llm_compressor": False, "head_dim": 128,
          "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
          "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
          "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(48)], "rms_norm_eps": 1e-5,
          "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "use_qk_norm": True,
          "vocab_size": 202048, "eos_token_id": [200001, 200007, 200008]}

# Llama 4 Scout's (its card's 109B total holds the vision tower; the 17B active are the language model's)
SCOUT = {"model_type": "llama4", "vision_config": {"model_type": "llama4_vision_model"}, "text_config": {
    **LLAMA4, "num_local_experts": 16, "interleave_moe_layer_step": 1, "max_position_embeddings": 10485760,
    "moe_layers": list(range(48)), "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                    "original_max_position_embeddings": 8192, "rope_type": "llama3"}}}

# (name, config.json's fields, the published total: the Hub's safetensors count or the paper's)
CONFIGS = [
    ("Llama-2-7b", llama(4096, 11008, 32, 32, 32, 32000, max_position_embeddings=4096), 6_738_415_616),
    ("Llama-2-13b", llama(5120, 13824, 40, 40, 40, 32000, max_position_embeddings=4096), 13_015_864_320),
    ("Llama-2-70b", llama(8192, 28672, 80, 64, 8, 32000, max_position_embeddings=4096), 68_976_648_192),
    ("Llama-3.1-8B", llama(4096, 14336, 32, 32, 8, 128256, max_position_embeddings=131072, rope_theta=500000.0,
                           rope_scaling=L3_SCALING), 8_030_261_248),
    ("Llama-3.1-70B", llama(8192, 28672, 80, 64, 8, 128256, max_position_embeddings=131072, rope_theta=500000.0,
                            rope_scaling=L3_SCALING), 70_553_706_496),
    ("Llama-3.2-1B", llama(2048, 8192, 16, 32, 8, 128256, head_dim=64, tie_word_embeddings=True,
                           rope_theta=500000.0, rope_scaling={**L3_SCALING, "factor": 32.0}), 1_235_814_400),
    ("Llama-3.2-3B", llama(3072, 8192, 28, 24, 8, 128256, head_dim=128, tie_word_embeddings=True,
                           rope_theta=500000.0, rope_scaling={**L3_SCALING, "factor": 32.0}), 3_212_749_824),
    ("Mistral-7B-v0.1", {**llama(4096, 14336, 32, 32, 8, 32000), "model_type": "mistral", "sliding_window": 4096,
                         "max_position_embeddings": 32768, "rope_theta": 10000.0}, 7_241_732_096),
    ("Mixtral-8x7B", {**llama(4096, 14336, 32, 32, 8, 32000), "model_type": "mixtral", "num_local_experts": 8,
                      "num_experts_per_tok": 2, "rope_theta": 1e6, "router_aux_loss_coef": 0.02,
                      "sliding_window": None, "output_router_logits": False}, 46_702_792_704),
    ("Mixtral-8x22B", {**llama(6144, 16384, 56, 48, 8, 32000), "model_type": "mixtral", "num_local_experts": 8,
                       "num_experts_per_tok": 2, "rope_theta": 1e6, "router_aux_loss_coef": 0.001},
     140_620_634_112),
    ("Qwen2.5-0.5B", qwen("qwen2", 896, 4864, 24, 14, 2, 151936, tie_word_embeddings=True), 494_032_768),
    ("Qwen2.5-7B", qwen("qwen2", 3584, 18944, 28, 28, 4, 152064), 7_615_616_512),
    ("Qwen2.5-72B", qwen("qwen2", 8192, 29568, 80, 64, 8, 152064), 72_706_203_648),
    ("Qwen1.5-MoE-A2.7B", qwen("qwen2_moe", 2048, 5632, 24, 16, 16, 151936, num_experts=60, num_experts_per_tok=4,
                               moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                               decoder_sparse_step=1, norm_topk_prob=False), 14_315_784_192),
    ("Qwen2-57B-A14B", qwen("qwen2_moe", 3584, 18944, 28, 28, 4, 151936, num_experts=64, num_experts_per_tok=8,
                            moe_intermediate_size=2560, shared_expert_intermediate_size=20480),
     57_400_000_000),  # "57.4B"
    ("Qwen3-8B", qwen("qwen3", 4096, 12288, 36, 32, 8, 151936, head_dim=128, attention_bias=False),
     8_190_735_360),
    ("Qwen3-30B-A3B", qwen("qwen3_moe", 2048, 6144, 48, 32, 4, 151936, head_dim=128, num_experts=128,
                           num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                           decoder_sparse_step=1, mlp_only_layers=[]), 30_532_122_624),
    ("Qwen3-235B-A22B", qwen("qwen3_moe", 4096, 12288, 94, 64, 4, 151936, head_dim=128, num_experts=128,
                             num_experts_per_tok=8, moe_intermediate_size=1536, norm_topk_prob=True),
     235_093_634_560),
    # DeepSeek-V3 technical report: 671B total without the multi-token-prediction module.
    ("DeepSeek-V3", {"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
                     "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
                     "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
                     "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
                     "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc",
                     "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
                     "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid",
                     "aux_loss_alpha": 0.001, "seq_aux": True, "hidden_act": "silu", "max_position_embeddings": 163840,
                     "rms_norm_eps": 1e-6, "rope_theta": 10000, "num_nextn_predict_layers": 1, "ep_size": 1,
                     "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                      "type": "yarn"},
                     "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                             "weight_block_size": [128, 128]}}, 671_000_000_000),
    # Llama 4 Maverick's text model (the Hub's text_config; its model card: 400B total, 17B active)
    ("Llama-4-Maverick-17B-128E", {**LLAMA4, "num_local_experts": 128, "interleave_moe_layer_step": 2,
                                   "max_position_embeddings": 1048576, "moe_layers": list(range(1, 48, 2)),
                                   "use_qk_norm": False}, 400_000_000_000),
    # DeepSeek-V2 (arXiv:2405.04434) and V2-Lite model pages: 236B and 15.7B total.
    ("DeepSeek-V2", {**DEEPSEEK_V2, "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                     "n_routed_experts": 160, "num_attention_heads": 128, "num_key_value_heads": 128,
                     "num_hidden_layers": 60, "q_lora_rank": 1536, "routed_scaling_factor": 16.0, "n_group": 8,
                     "topk_group": 3, "topk_method": "group_limited_greedy"}, 236_000_000_000),
    ("DeepSeek-V2-Lite", {**DEEPSEEK_V2, "hidden_size": 2048, "intermediate_size": 10944,
                          "moe_intermediate_size": 1408, "n_routed_experts": 64, "num_attention_heads": 16,
                          "num_key_value_heads": 16, "num_hidden_layers": 27, "q_lora_rank": None,
                          "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "topk_method": "greedy"},
     15_700_000_000),
    # gpt-oss model card, Table 1: 116.83B total (as the Hub's config.json gives it, layer_types 18 x [sliding, full])
    ("gpt-oss-120b", {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
                      "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
                      "initial_context_length": 4096, "intermediate_size": 2880,
                      "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
                      "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
                      "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128,
                      "quantization_config": {"quant_method": "mxfp4"}, "rms_norm_eps": 1e-05,
                      "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "rope_type": "yarn",
                                       "original_max_position_embeddings": 4096, "truncate": False},
                      "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
                      "tie_word_embeddings": False, "vocab_size": 201088}, 116_830_000_000),
    # Nemotron-4 15B and 340B reports (arXiv:2402.16819 sec. 2, arXiv:2406.11704 sec. 2.2): 3.2B embedding +
    # 12.5B other parameters, and 9.4B + 331.6B (transformers' NemotronConfig defaults are the 15B's shape)
    ("Nemotron-4-15B", {"model_type": "nemotron", "hidden_size": 6144, "intermediate_size": 24576,
                        "num_hidden_layers": 32, "num_attention_heads": 48, "num_key_value_heads": 8,
                        "head_dim": 128, "vocab_size": 256000, "hidden_act": "relu2", "norm_eps": 1e-5,
                        "max_position_embeddings": 4096, "tie_word_embeddings": False, "attention_bias": False,
                        "mlp_bias": False, "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                                              "rope_type": "default"}}, 15_700_000_000),
    ("Nemotron-4-340B", {"model_type": "nemotron", "hidden_size": 18432, "intermediate_size": 73728,
                         "num_hidden_layers": 96, "num_attention_heads": 96, "num_key_value_heads": 8,
                         "vocab_size": 256000, "hidden_act": "relu2", "norm_eps": 1e-5, "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5, "max_position_embeddings": 4096}, 341_000_000_000),
    ("gpt2", {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_ctx": 1024,
              "vocab_size": 50257, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "summary_type": "cls_index",
              "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}}, 124_439_808),
    ("gpt2-xl", {"model_type": "gpt2", "n_embd": 1600, "n_layer": 48, "n_head": 25, "n_positions": 1024,
                 "vocab_size": 50257, "activation_function": "gelu_new"}, 1_557_611_200),
    ("pythia-6.9b", {"model_type": "gpt_neox", "hidden_size": 4096, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "intermediate_size": 16384, "vocab_size": 50432, "hidden_act": "gelu",
                     "rotary_pct": 0.25, "rotary_emb_base": 10000, "layer_norm_eps": 1e-5,
                     "max_position_embeddings": 2048, "use_parallel_residual": True, "tie_word_embeddings": False},
     6_857_302_016),
    ("gpt-neox-20b", {"model_type": "gpt_neox", "hidden_size": 6144, "num_hidden_layers": 44,
                      "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432, "hidden_act": "gelu",
                      "rotary_pct": 0.25, "rotary_emb_base": 10000, "layer_norm_eps": 1e-5,
                      "max_position_embeddings": 2048, "use_parallel_residual": True}, 20_554_567_680),
    ("Phi-3-mini-4k", {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064, "hidden_act": "silu",
                       "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
                       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "sliding_window": 2047,
                       "attention_bias": False, "tie_word_embeddings": False}, 3_821_079_552),
    ("gemma-2-2b", {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
                    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
                    "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
                    "attn_logit_softcapping": 50.0, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
                    "cache_implementation": "hybrid"}, 2_614_341_888),
    ("gemma-2-9b", {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
                    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
                    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 4096,
                    "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}, 9_241_705_984),
    ("gemma-3-1b", {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                    "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                    "vocab_size": 262144, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
                    "sliding_window": 512, "sliding_window_pattern": 6, "rope_theta": 1000000,
                    "rope_local_base_freq": 10000, "max_position_embeddings": 32768}, 999_885_952),
    # Gemma 3 report, Table 1: the 4B's language model, 675M embedding + 3,209M other parameters.
    ("gemma-3-4b", {"model_type": "gemma3", "vision_config": {"model_type": "siglip_vision_model"},
                    "mm_tokens_per_image": 256, "text_config": {
                        "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
                        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
                        "query_pre_attn_scalar": 256, "sliding_window": 1024, "rope_scaling":
                            {"factor": 8.0, "rope_type": "linear"}}}, 3_884_000_000),
]


@pytest.mark.parametrize("name, config, published", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_published_configs_count_their_published_parameters(tmp_path, name, config, published):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = load_model(str(tmp_path))  # the model directory
    assert abs(model.param_count() / published - 1) < 0.005, (name, model.param_count(), published)


def by_name(name):
    return next(c for n, c, _ in CONFIGS if n == name)


@pytest.mark.parametrize("preset, name", [("qwen3-235b-a22b", "Qwen3-235B-A22B"), ("qwen3-30b-a3b", "Qwen3-30B-A3B"),
                                          ("gpt-oss-120b", "gpt-oss-120b"), ("nemotron-4-15b", "Nemotron-4-15B"),
                                          ("nemotron-4-340b", "Nemotron-4-340B"),
                                          ("llama4-scout-17b-16e", "Llama-4-Scout-17B-16E"),
                                          ("llama4-maverick-17b-128e", "Llama-4-Maverick-17B-128E")])
def test_a_preset_is_its_published_config(preset, name):
    """A preset written by hand reads as its Hugging Face config.json does, but for its name and the
    training sequence the preset chooses (the config gives the longest context)."""
    read = from_hf_config(SCOUT if name == "Llama-4-Scout-17B-16E" else by_name(name), preset)
    assert dataclasses.replace(read, seq=load_model(preset).seq) == load_model(preset)


def test_the_math_fields_are_read():
    l31 = from_hf_config(by_name("Llama-3.1-8B"), "l31")
    assert (l31.rope_theta, l31.norm_eps, l31.kv_heads, l31.seq) == (500000.0, 1e-5, 8, 131072)
    assert json.loads(l31.rope_scaling) == L3_SCALING
    qwen3 = from_hf_config(by_name("Qwen3-30B-A3B"), "q")
    assert (qwen3.experts, qwen3.top_k, qwen3.expert_ffn, qwen3.qk_norm, qwen3.norm_topk) == (128, 8, 768, True, True)
    assert 3.2e9 < qwen3.active_param_count() < 3.4e9  # "A3B": 3.3B active
    qwen2 = from_hf_config(by_name("Qwen2.5-0.5B"), "q")
    assert qwen2.qkv_bias and qwen2.tied_embeddings and not qwen2.biases and qwen2.norm_eps == 1e-6
    moe = from_hf_config(by_name("Qwen1.5-MoE-A2.7B"), "q")
    assert (moe.shared_experts, moe.shared_expert_gate, moe.norm_topk) == (4, True, False)
    neox = from_hf_config(by_name("pythia-6.9b"), "p")
    assert (neox.mlp, neox.rotary_fraction, neox.parallel_residual, neox.biases) == ("gelu-erf", 0.25, True, True)
    gpt2 = from_hf_config(by_name("gpt2"), "g")
    assert (gpt2.mlp, gpt2.learned_positions, gpt2.tied_embeddings, gpt2.seq) == ("gelu", True, True, 1024)
    assert from_hf_config(by_name("Phi-3-mini-4k"), "p").sliding_window == 2047
    gemma = from_hf_config(by_name("gemma-3-4b"), "g")
    assert (gemma.mlp, gemma.full_attention_every, gemma.sandwich_norms, gemma.qk_norm) == ("geglu", 6, True, True)
    v3 = from_hf_config(by_name("DeepSeek-V3"), "d")
    assert (v3.first_dense_layers, v3.kv_lora_rank, v3.shared_experts, v3.mtp_layers) == (3, 512, 1, 1)
    assert 36.5e9 < v3.active_param_count() < 37.7e9  # the report's 37B activated
    v2 = from_hf_config(by_name("DeepSeek-V2"), "d")
    assert (v2.q_lora_rank, v2.experts, v2.top_k, v2.norm_topk, v2.mtp_layers) == (1536, 160, 6, False, 0)
    assert 20.5e9 < v2.active_param_count() < 22e9  # "21B activated"
    oss = from_hf_config(by_name("gpt-oss-120b"), "g")
    assert (oss.sliding_window, oss.full_attention_every, oss.attention_sinks, oss.qkv_bias) == (128, 2, True, True)
    assert (oss.experts, oss.top_k, oss.expert_ffn, oss.head_dim, oss.kv_heads) == (128, 4, 2880, 64, 8)
    scout, maverick = from_hf_config(SCOUT, "s"), from_hf_config(by_name("Llama-4-Maverick-17B-128E"), "m")
    assert (scout.moe_layers, maverick.moe_layers, maverick.first_dense_layers, maverick.ffn) == (48, 24, 1, 16384)
    assert (scout.experts, scout.top_k, scout.shared_experts, scout.expert_ffn) == (16, 1, 1, 8192)
    assert (scout.sliding_window, scout.full_attention_every, scout.chunked_attention) == (8192, 4, True)
    assert all(16.9e9 < m.active_param_count() < 17.5e9 for m in (scout, maverick))  # "17B active"
    nemotron = from_hf_config(by_name("Nemotron-4-340B"), "n")
    assert (nemotron.mlp, nemotron.norm, nemotron.layer_norm, nemotron.biases) == ("relu2", "layernorm", True, False)
    assert (nemotron.rotary_fraction, nemotron.head_dim, nemotron.tied_embeddings) == (0.5, 192, False)


def test_models_the_runtime_does_not_build_are_planned_and_refused_by_the_trainer():
    from meshscale.specs.model import trainer_lacks

    assert "attention sinks" in trainer_lacks(load_model("gpt-oss-120b"))
    assert "latent attention" in trainer_lacks(from_hf_config(by_name("DeepSeek-V2-Lite"), "d"))
    assert "chunked attention" in trainer_lacks(from_hf_config(SCOUT, "s"))
    assert trainer_lacks(load_model("nemotron-4-15b")) is None


def test_transformers_5_rope_parameters_read_as_4x_rope_fields():
    old = by_name("Llama-3.1-8B")
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {"rope_theta": 500000.0, **L3_SCALING}
    assert from_hf_config(new, "x") == from_hf_config(old, "x")
    neox = {k: v for k, v in by_name("pythia-6.9b").items() if k not in ("rotary_pct", "rotary_emb_base")}
    neox["rope_parameters"] = {"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"}
    assert from_hf_config(neox, "x") == from_hf_config(by_name("pythia-6.9b"), "x")


def test_the_planner_costs_the_counted_parameters():
    from meshscale.cost import predict
    from meshscale.cost.flops import six_pt
    from meshscale.specs.cluster import load_cluster
    from meshscale.specs.layout import Layout

    model = from_hf_config(by_name("Qwen3-30B-A3B"), "q").with_seq(4096)
    pred = predict(model, load_cluster("h100-80gb"), Layout.parse("dp=8", 8), 64, "bf16")
    assert pred.memory_per_device_bytes["params"] == 2 * model.param_count()  # bf16 weights, whole on each rank
    assert pred.six_pt_flops_per_step == six_pt(model, 64 * 4096) == 6 * model.active_param_count() * 64 * 4096


@pytest.mark.parametrize("change, needle", [
    ({"model_type": "falcon"},
     "model_type 'falcon' is not supported; meshscale reads deepseek_v2, deepseek_v3, gemma2"),
    ({"model_type": None}, "no model_type is not supported"),
    ({"hidden_size": "4096"}, "hidden_size must be an integer, got '4096'"),
    ({"rms_norm_eps": "1e-5"}, "rms_norm_eps must be a number"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings must be true or false"),
    ({"num_hidden_layers": None}, "lacks 'num_hidden_layers'"),
    ({"rope_scaling": {"rope_type": "su"}}, "rope scaling 'su' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3 rope scaling needs 'original_max_position"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "8"}}, "factor must be a number, got '8'"),
    ({"attention_bias": True}, "attention_bias=true is not supported"),
    ({"hidden_act": "relu"}, "hidden_act='relu' is not supported"),
    ({"logit_scale": 0.5}, "field(s) logit_scale of model_type llama are not ones meshscale maps"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
      "mlp_only_layers": [3]}, "mlp_only_layers=[3] is not supported"),
    ({"model_type": "mixtral", "num_local_experts": 8, "router_jitter_noise": 0.1}, "router_jitter_noise=0.1"),
    ({**by_name("gpt-oss-120b"), "experts_per_token": 8}, "experts_per_token=8 is not supported (it differs"),
    ({**by_name("gpt-oss-120b"), "layer_types": ["full_attention", "sliding_attention"] * 18},
     "layer_types=[\"full_attention\""),
    ({**by_name("gpt-oss-120b"), "attention_bias": False}, "attention_bias=false is not supported"),
    ({**by_name("DeepSeek-V2"), "mlp_bias": True}, "mlp_bias=true is not supported"),
    ({**by_name("Nemotron-4-15B"), "hidden_act": "gelu"}, "hidden_act=\"gelu\" is not supported (Nemotron's MLP"),
    ({**by_name("Nemotron-4-15B"), "mlp_bias": True}, "mlp_bias=true is not supported"),
    ({**by_name("Llama-4-Maverick-17B-128E"), "moe_layers": [0, 2]}, "moe_layers=[0, 2] is not supported"),
    ({**by_name("Llama-4-Maverick-17B-128E"), "no_rope_layers": [1] * 48}, "no_rope_layers=[1, 1"),
])
def test_what_is_not_mapped_is_one_line_exit_2(tmp_path, change, needle):
    from test_cli_predict_plan import cli

    config = {**by_name("Llama-2-7b"), **change}
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    r = cli("predict", "--model", str(tmp_path), "--cluster", "h100-80gb", "--layout", "tp=8",
            "--global-batch", "32", "--seq", "4096")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_a_directory_without_config_and_the_seq_note(tmp_path):
    from test_cli_predict_plan import cli

    with pytest.raises(UserError, match="has no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(by_name("Llama-3.1-8B")))
    assert is_hf_model(str(tmp_path)) and not is_hf_model("llama3-8b")
    r = cli("predict", "--model", str(tmp_path), "--cluster", "h100-80gb", "--devices", "64", "--layout", "tp=8",
            "--global-batch", "64", "--json")
    assert r.returncode == 0, r.stderr
    assert "sequence length 131,072 tokens, the config's max_position_embeddings" in r.stderr
    assert json.loads(r.stdout)["seq"] == 131072
    r = cli("predict", "--model", str(tmp_path), "--cluster", "h100-80gb", "--devices", "64", "--layout", "tp=8",
            "--global-batch", "64", "--json", "--seq", "8192")
    assert r.returncode == 0 and r.stderr == "", r.stderr
