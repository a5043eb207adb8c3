"""Sharded construction at size, on local gloo ranks (run by hand; the machine's memory bounds the size).

1. Build time vs model size: llama-shaped models of growing depth, each rank building its FSDP share from the
   meta device (`meshscale train`'s path), beside one process building the whole model and sharding it after
   (the path before sharded construction), up to --whole-max-layers.
2. Training at size: a 1B-class llama-shaped model whose training state (fp32: 16 bytes a parameter;
   --precision bf16-pure: 8) exceeds one rank's share of the host's memory trains --steps steps under --layout;
   per rank, the process's peak resident memory above its resident memory before building, beside the cost
   model's prediction per rank.

    PYTHONPATH=src python benchmarks/sharded_build.py [--layers 20] [--layout fsdp=4] [--steps 2] [--seq 64]
                                                      [--precision fp32]
"""

import argparse
import os
import resource
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# TinyLlama-1.1B's shape (hidden 2048, 32 heads, 4 KV heads, SwiGLU 5632, vocab 32000); depth is the knob.
SHAPE = 'name = "llama-1b-class"\nhidden = 2048\nheads = 32\nkv_heads = 4\nffn = 5632\nvocab = 32000\n'


def spec_file(tmp: str, layers: int, seq: int) -> str:
    path = os.path.join(tmp, f"llama-{layers}.toml")
    with open(path, "w") as f:
        f.write(SHAPE + f"layers = {layers}\nseq = {seq}\n")
    return path


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rank(rank, world, init_file, job, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from meshscale.runtime.loop.config import TrainConfig, resolve
    from meshscale.runtime.loop.data import load_tokens
    from meshscale.runtime.loop.trainer import Training

    tokens = load_tokens(None)[: 1 << 20]
    out = []
    for model, layout, steps, seq, probe, precision in job:  # probe: the trainer's heap peak, last step
        run = resolve(TrainConfig(model=model, layout=layout, steps=max(steps, 1), global_batch=world, seq=seq,
                                  val_batches=1, sdc_check_every=0, warmup=1, predict=probe, timeout=3600,
                                  precision=precision), world)
        before = rss_bytes()
        start = time.perf_counter()
        training = Training(run, torch.device("cpu"), tokens, log=False)
        build_s = time.perf_counter() - start
        built = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
                    for _, chunk in training.par.chunks for p in chunk.parameters())
        rows = training.run()["rows"] if steps else []
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        out.append({"build_s": build_s, "built_bytes": built, "peak_bytes": peak, "losses": [r["loss"] for r in rows],
                    "probe_bytes": max((r["peak_memory_bytes"] for r in rows), default=0),
                    "params": run.spec.param_count()})
        del training
    queue.put((rank, out))
    dist.destroy_process_group()


def on_ranks(world: int, job: list) -> list:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, world, os.path.join(tmp, "pg"), job, queue)) for r in range(world)]
        for p in procs:
            p.start()
        results = dict(queue.get() for _ in procs)
        for p in procs:
            p.join()
    return [results[r] for r in range(world)]


def whole_then_shard_s(model: str, seq: int) -> float:
    """One process building every parameter (fp32, initialised), as each rank did before."""
    from meshscale.models.transformer import build_model
    from meshscale.specs.model import load_model

    start = time.perf_counter()
    build_model(load_model(model).with_seq(seq))
    return time.perf_counter() - start


def main() -> None:
    import functools
    import builtins

    builtins.print = functools.partial(print, flush=True)
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=20, help="depth of the trained model (20: 1.01e9 parameters)")
    p.add_argument("--layout", default="fsdp=4")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--sizes", default="2,5,10,20", help="depths for the build-time sweep")
    p.add_argument("--whole-max-layers", type=int, default=5)
    p.add_argument("--precision", default="fp32", help="the training recipe (fp32, bf16, bf16-pure)")
    p.add_argument("--probe", action="store_true", help="the trainer's heap probe on the last step (the profiler: "
                   "memory-hungry at this size)")
    args = p.parse_args()
    from meshscale.cost import predict
    from meshscale.cost.memory import PRECISIONS
    from meshscale.runtime.loop.config import TrainConfig, available_host_bytes, resolve
    from meshscale.specs.cluster import load_cluster

    world = 4
    layout = args.layout
    with tempfile.TemporaryDirectory() as tmp:
        print(f"build time vs size ({layout}, {world} ranks, each its share; whole: one process, every parameter)")
        print(f"{'layers':>6} {'params':>10} {'sharded build s (max rank)':>27} {'params MiB/rank':>16} "
              f"{'whole build s':>14}")
        sizes = [int(x) for x in args.sizes.split(",")]
        built = on_ranks(world, [(spec_file(tmp, n, args.seq), layout, 0, args.seq, False, args.precision)
                                 for n in sizes])
        for i, n in enumerate(sizes):
            per_rank = [r[i] for r in built]
            whole = (f"{whole_then_shard_s(spec_file(tmp, n, args.seq), args.seq):14.1f}"
                     if n <= args.whole_max_layers else f"{'-':>14}")
            print(f"{n:>6} {per_rank[0]['params'] / 1e9:>9.2f}B {max(r['build_s'] for r in per_rank):>27.1f} "
                  f"{max(r['built_bytes'] for r in per_rank) / 2**20:>16.0f} {whole}")

        model = spec_file(tmp, args.layers, args.seq)
        run = resolve(TrainConfig(model=model, layout=layout, steps=args.steps, global_batch=world, seq=args.seq,
                                  val_batches=1, precision=args.precision), world)
        pred = predict(run.spec, load_cluster("local-cpu"), run.layout, world, args.precision).memory_per_device_bytes
        state = sum(PRECISIONS[args.precision][k] for k in ("params", "grads", "optimizer")) * run.spec.param_count()
        print(f"\ntraining {run.spec.param_count() / 1e9:.2f}B parameters under {run.layout}: {args.precision} "
              f"training state "
              f"{state / 2**30:.1f} GiB, one rank's share of the host {available_host_bytes() / world / 2**30:.1f} GiB")
        trained = on_ranks(world, [(model, layout, args.steps, args.seq, args.probe, args.precision)])
        print(f"predicted per rank: {', '.join(f'{k} {v / 2**20:.0f} MiB' for k, v in pred.items())}")
        print("heap: above the heap before building, the last step's peak with --probe (the trainer's profiler probe), "
              "else the most in use after a step; RSS: the process's peak resident memory above its resident memory "
              "before building")
        print(f"{'rank':>4} {'build s':>8} {'heap MiB':>14} {'ratio':>6} {'RSS peak MiB':>13} {'ratio':>6}  losses")
        for rank, (r,) in enumerate(trained):
            print(f"{rank:>4} {r['build_s']:>8.1f} {r['probe_bytes'] / 2**20:>14.0f} "
                  f"{r['probe_bytes'] / pred['total']:>6.2f} "
                  f"{r['peak_bytes'] / 2**20:>13.0f} {r['peak_bytes'] / pred['total']:>6.2f}  "
                  f"{', '.join(f'{x:.4f}' for x in r['losses'])}")


if __name__ == "__main__":
    main()
