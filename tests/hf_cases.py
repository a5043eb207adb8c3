"""Small random Hugging Face models made by the transformers library itself (nothing downloaded), one per
model_type meshscale loads, each with the fields that change the math set away from their defaults."""

import torch

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=128, max_position_embeddings=64, rms_norm_eps=1e-5)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


NAMES = ("llama", "llama-linear-tied", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3",
         "gpt2", "gpt_neox", "gpt_neox-sequential", "nemotron")


def config(name: str):
    """The transformers config of case `name` (transformers is imported only here, not where ranks import)."""
    import transformers as t

    return {
        "llama": t.LlamaConfig(**SMALL, head_dim=16, rope_parameters=LLAMA3),
        "llama-linear-tied": t.LlamaConfig(**SMALL, tie_word_embeddings=True,
                                           rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                            "factor": 4.0}),
        "mistral": t.MistralConfig(**SMALL, sliding_window=8, rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 1e6}),
        "mixtral": t.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2),
        "qwen2": t.Qwen2Config(**SMALL, tie_word_embeddings=True),
        "qwen2_moe": t.Qwen2MoeConfig(**SMALL, **MOE, num_experts=4, shared_expert_intermediate_size=64),
        "qwen3": t.Qwen3Config(**SMALL, head_dim=8),
        "qwen3_moe": t.Qwen3MoeConfig(**SMALL, **MOE, head_dim=16, num_experts=4, norm_topk_prob=True),
        "phi3": t.Phi3Config(**SMALL, sliding_window=8, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.5}),
        "gpt2": t.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0,
                             eos_token_id=0, layer_norm_epsilon=1e-4),
        "gpt_neox": t.GPTNeoXConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                    vocab_size=128, max_position_embeddings=64, bos_token_id=0, eos_token_id=0),
        "nemotron": t.NemotronConfig(**{k: v for k, v in SMALL.items() if k != "rms_norm_eps"}, norm_eps=1e-4,
                                     partial_rotary_factor=0.5, bos_token_id=0, eos_token_id=0),
        "gpt_neox-sequential": t.GPTNeoXConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                               num_attention_heads=4, vocab_size=128, max_position_embeddings=64,
                                               use_parallel_residual=False, hidden_act="gelu_new",
                                               bos_token_id=0, eos_token_id=0),
    }[name]


@torch.no_grad()
def make(config, seed: int = 0):
    """A transformers model of `config` in fp32 whose every weight (norms and biases too) is random, so a
    tensor loaded into the wrong place shows."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    for name, p in model.named_parameters():
        p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm" in name or ".ln_" in name else 0.0))
    return model


def save(config, path, seed: int = 0, shard: str | None = None):
    """make() saved with save_pretrained (in several files with an index when `shard` is a size)."""
    model = make(config, seed)
    model.save_pretrained(path, max_shard_size=shard) if shard else model.save_pretrained(path)
    return model


def tokens(vocab: int = 128, batch: int = 2, seq: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))
