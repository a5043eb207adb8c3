"""Host time of Megatron-Core's layers, in torch.nn.Linear forwards: the figures behind cost/overhead.py's
LAYER_HOST (run by hand; needs megatron-core, which `make test` installs).

An eager framework's step takes at least as long as its host needs to issue it. Megatron-Core's layers are
built here as its GPT layer spec builds them (`get_gpt_layer_local_spec`: the torch-only modules, since
Transformer Engine needs a GPU), on one gloo rank, with tensors so small that their kernels take next to no
time: what is timed is the host's own work (Python, autograd, the dispatcher). Each layer's forward, and its
forward + backward, is divided by one torch.nn.Linear forward timed the same way, so the figure is a count of
Linear-forward equivalents that carries to another host: cost/overhead.py multiplies it by that host's
measured Linear forward (TransformerEngine issue #2053: 13.5 us on DGX H100's Xeon, 37.1 on GB200's Grace).

- dense: self-attention (RoPE) and a SwiGLU MLP;
- moe: the same attention and a MoELayer (top-k router with the auxiliary load-balancing loss, the all-to-all
  dispatcher, as Megatron-Core's MoE runs use it) with two local experts, less one SwiGLU MLP: the local spec
  runs its experts one by one (SequentialMLP), where a GPU run's grouped GEMM modules run them all at once;
- router: the MoE layer's top-k router with its auxiliary loss alone (what CUDA graphs can capture of a dropless
  MoE layer beside its attention; its dispatch, experts and combine stay eager);
- root: the embedding, final norm, output layer and vocab-parallel cross-entropy (LanguageModelEmbedding,
  RMSNorm, ColumnParallelLinear, vocab_parallel_cross_entropy), once a micro-batch on the first and last ranks;
- linear, norm: one ColumnParallelLinear and one RMSNorm call, the units of recompute's reruns;
- mla_extra: what multi-latent attention (DeepSeek-V3's) adds, which the local spec cannot build (its core
  attention is Transformer Engine's): its q and kv down- and up-projections and their two norms in place of one
  QKV projection, three more ColumnParallelLinear and two RMSNorm calls, each timed alone.

A CPU build of torch has no CUDA streams, which the all-to-all dispatcher creates in its constructor and the
router's gating asks for a device of, nor a CUDA random state for attention dropout: stand-ins that do nothing
replace them (the dispatcher's copy to host then runs inline; the wait itself is what cost/step.py host_bound
charges).

    PYTHONPATH=src python benchmarks/host_calls.py [--json out.json] [--repeats 500] [--runs 3]
"""

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
import warnings

import torch
import torch.distributed as dist

HIDDEN, TOKENS = 64, 16  # small enough that every kernel is a few microseconds on one CPU core


class _NoStream:
    """What the MoE dispatcher asks of torch.cuda on a CPU build: streams and events that do nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: self if name == "record_event" else None


def _cpu_stand_ins():
    torch.cuda.Stream = torch.cuda.Event = _NoStream
    torch.cuda.current_stream = lambda *a, **k: _NoStream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.current_device = lambda: "cpu"
    import megatron.core.transformer.moe.moe_utils as moe_utils
    moe_utils.te_general_gemm = None  # the router's gating GEMM falls back to torch
    from megatron.core import tensor_parallel
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()  # no CUDA RNG here


def _setup():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29561"), RANK="0",
                      WORLD_SIZE="1")
    dist.init_process_group("gloo")
    torch.set_num_threads(1)  # the host's one launching thread; no intra-op pool waking for tiny tensors
    _cpu_stand_ins()
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(1, 1)


def _layer(experts: int = 0):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer
    kw = dict(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=2 * HIDDEN, bf16=False,
              params_dtype=torch.float32, use_cpu_initialization=True, add_bias_linear=False,
              gated_linear_unit=True, normalization="RMSNorm")
    if experts:
        kw.update(num_moe_experts=experts, moe_router_topk=2, moe_ffn_hidden_size=HIDDEN,
                  moe_token_dispatcher_type="alltoall", moe_aux_loss_coeff=1e-3,
                  moe_router_load_balancing_type="aux_loss")
    spec = get_gpt_layer_local_spec(num_experts=experts or None, normalization="RMSNorm")
    return TransformerLayer(TransformerConfig(**kw), spec.submodules)


def _rotary():
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    return RotaryEmbedding(HIDDEN // 4, rotary_percent=1.0)(TOKENS)


def _best_seconds(fn, repeats: int) -> float:
    """The fastest of five rounds of `repeats` calls, per call: the host's own time, least disturbed."""
    fn()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        rounds.append((time.perf_counter() - start) / repeats)
    return min(rounds)


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")),
                        platform.machine())
    return platform.machine()


def _timed(forward, repeats: int) -> tuple[float, float]:
    """(forward, backward) seconds of one call of `forward`, which returns a tensor to differentiate."""
    f = _best_seconds(forward, repeats)
    return f, _best_seconds(lambda: forward().sum().backward(), repeats) - f


def _passes(layer, rotary, repeats: int) -> tuple[float, float]:
    """`_timed` of a TransformerLayer on TOKENS tokens."""
    x = torch.randn(TOKENS, 1, HIDDEN, requires_grad=True)
    causal = torch.ones(1, 1, TOKENS, TOKENS).triu(1).bool()  # Megatron's default mask is made on "cuda"
    return _timed(lambda: layer(x, attention_mask=causal, rotary_pos_emb=rotary)[0], repeats)


def measure(repeats: int) -> dict:
    linear, x = torch.nn.Linear(HIDDEN, HIDDEN, bias=False), torch.randn(TOKENS, HIDDEN)
    unit_before = _best_seconds(lambda: linear(x), 10 * repeats)
    import megatron.core
    out = {"tokens": TOKENS, "hidden": HIDDEN, "torch": torch.__version__,
           "megatron_core": megatron.core.__version__, "host": _cpu_name()}
    dense = _passes(_layer(), _rotary(), repeats)
    moe_layer = _layer(experts=2)
    moe = _passes(moe_layer, _rotary(), repeats)
    router = _module_passes(moe_layer.mlp.router, repeats)
    mlp, column, norm = (_module_passes(m, repeats) for m in _modules())
    root = _root_passes(repeats)
    # the unit timed before and after, the faster kept: a busy spell while it ran must not shrink every ratio
    unit = min(unit_before, _best_seconds(lambda: linear(x), 10 * repeats))
    out["linear_forward_us"] = unit * 1e6
    out["linears"] = {
        "dense": [t / unit for t in dense],
        "root": [t / unit for t in root],
        "router": [t / unit for t in router],
        "linear": [t / unit for t in column],
        "norm": [t / unit for t in norm],
        "mla_extra": [(3 * a + 2 * b) / unit for a, b in zip(column, norm)],
        # two experts run one by one, less one of them: one MLP's modules stand for the grouped experts'
        "moe": [(t - m) / unit for t, m in zip(moe, mlp)],
        "mlp": [t / unit for t in mlp],
    }
    return out


def _modules():
    """A SwiGLU MLP, a ColumnParallelLinear and an RMSNorm as Megatron-Core's local spec builds them."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=2 * HIDDEN,
                               bf16=False, params_dtype=torch.float32, use_cpu_initialization=True,
                               add_bias_linear=False, gated_linear_unit=True, normalization="RMSNorm")
    init = config.init_method
    return (MLP(config, get_gpt_layer_local_spec().submodules.mlp.submodules),
            ColumnParallelLinear(HIDDEN, HIDDEN, config=config, init_method=init, bias=False),
            WrappedTorchNorm(config, HIDDEN))


def _root_passes(repeats: int) -> tuple[float, float]:
    """(forward, backward) seconds of the embedding, final norm, output layer and loss on TOKENS tokens."""
    from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
    mlp, head, norm = _modules()
    embedding = LanguageModelEmbedding(mlp.config, 2 * HIDDEN, TOKENS, position_embedding_type="rope")
    tokens, positions = torch.randint(0, 2 * HIDDEN, (1, TOKENS)), torch.arange(TOKENS)[None]
    target = torch.randint(0, HIDDEN, (TOKENS, 1))

    def forward():
        logits = head(norm(embedding(tokens, positions)))[0]
        return vocab_parallel_cross_entropy(logits, target)

    return _timed(forward, repeats)


def _module_passes(module, repeats: int) -> tuple[float, float]:
    """`_timed` of one call of `module`, which returns a tuple: an MLP's (output, bias), the router's (probs,
    routing map), a ColumnParallelLinear's (output, bias); an RMSNorm its output."""
    x = torch.randn(TOKENS, 1, HIDDEN, requires_grad=True)

    def forward():
        y = module(x)
        return y[0] if isinstance(y, tuple) else y

    return _timed(forward, repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3, help="whole measurements; each figure is their median")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    _setup()
    runs = [measure(args.repeats) for _ in range(args.runs)]
    out = {**runs[0], "runs": args.runs, "linear_forward_us": statistics.median(r["linear_forward_us"] for r in runs),
           "linears": {k: [statistics.median(r["linears"][k][i] for r in runs) for i in (0, 1)]
                       for k in runs[0]["linears"]}}
    print(f"torch {out['torch']}, one torch.nn.Linear forward ({TOKENS} x {HIDDEN}): "
          f"{out['linear_forward_us']:.1f} us on this host")
    print(f"{'Megatron-Core, local spec':34s} {'forward':>9s} {'backward':>9s}   (torch.nn.Linear forwards)")
    for name, (f, b) in out["linears"].items():
        print(f"{name:34s} {f:9.1f} {b:9.1f}")
    if args.json:
        with open(args.json, "x") as fh:  # never over a recorded scan
            json.dump(out, fh, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
