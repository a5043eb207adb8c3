"""The GPU path, checked on a CUDA machine (run by hand; on a machine without CUDA it says why and exits 0).

1. Parity sample on NCCL: `tiny` trained by the real trainer on 2-4 GPUs under a few layouts (DDP, FSDP2, TP,
   a pipeline) against the same run on one GPU; TF32 off, so fp32 runs differ only by reduction order.
   With one GPU: that GPU against the CPU.
2. One GPU's MFU on a llama3-8b-shaped block stack (its hidden size, heads, KV heads, SwiGLU width and
   vocabulary; --layers of its blocks) in bf16 with fp32 master weights, against the cost model's
   prediction (meshscale.cost.predict on the matching cluster preset with our runtime's software, as
   `train --predict` costs a run), and the allocator's peak memory against the predicted memory per device.
3. `meshscale train --memory-snapshot 1-2` on one GPU through the CLI: the snapshot pickle is written, holds the
   allocator's segments and the recorded allocations (what pytorch.org/memory_viz draws), and a second run
   with the same folder is refused in one line instead of overwriting it.
4. A checkpoint resume on one GPU: `tiny` resumed from its step-2 checkpoint continues as the uninterrupted run
   did (the fused AdamW's state, step count included, back on the device).

    PYTHONPATH=src python benchmarks/gpu_check.py [--layers 4] [--seq 4096] [--steps 6]
"""

import argparse
import dataclasses
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.multiprocessing as mp

PARITY_STEPS = 4
PARITY_LAYOUTS = {2: ["dp=2", "dp=2,zero=3", "tp=2", "pp=2,mbs=1"],
                  4: ["dp=4", "dp=2,zero=3,tp=2", "tp=2,pp=2,mbs=1", "dp=2,pp=2,schedule=zbv,mbs=1"]}
PRESET_BY_NAME = (("H200", "h200"), ("H100", "h100-80gb"), ("A100", "a100-80gb"), ("B200", "b200"))


def skip_reason() -> str | None:
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA"
    if not torch.cuda.is_available():
        return "torch has CUDA but sees no GPU (CUDA_VISIBLE_DEVICES, driver)"
    return None


def _exact_fp32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _run(layout: str, world: int, **overrides):
    from meshscale.runtime.loop.config import TrainConfig, resolve

    overrides = {"device": "cuda", **overrides}
    return resolve(TrainConfig(model="tiny", layout=layout, steps=PARITY_STEPS, global_batch=8, val_batches=1,
                               **overrides), world)


def _parity_rank(rank: int, world: int, init_file: str, layouts: list, queue) -> None:
    import torch.distributed as dist

    from meshscale.runtime.loop.trainer import train

    _exact_fp32()
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    out = {}
    for layout in layouts:
        rows = train(_run(layout, world), torch.device("cuda", rank), log=False)["rows"]
        out[layout] = [r["loss"] for r in rows]
    queue.put((rank, out))
    dist.destroy_process_group()


def parity() -> bool:
    from meshscale.runtime.loop.trainer import train

    _exact_fp32()
    reference = [r["loss"] for r in train(_run("", 1), torch.device("cuda", 0), log=False)["rows"]]
    world = max(w for w in (1, 2, 4) if w <= torch.cuda.device_count())  # PARITY_LAYOUTS has 2 and 4 (3 GPUs: 2)
    if world < 2:
        cpu = [r["loss"] for r in train(_run("", 1, device="cpu"), torch.device("cpu"), log=False)["rows"]]
        results = {"1 GPU vs CPU": (reference, cpu)}
    else:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        with tempfile.TemporaryDirectory() as tmp:
            procs = [ctx.Process(target=_parity_rank, args=(r, world, os.path.join(tmp, "pg"),
                                                           PARITY_LAYOUTS[world], queue)) for r in range(world)]
            for p in procs:
                p.start()
            per_rank = dict(queue.get(timeout=1800) for _ in procs)
            for p in procs:
                p.join()
        results = {f"{layout} on {world} GPUs (NCCL)": (losses, reference) for layout, losses in per_rank[0].items()}
    ok = True
    print(f"parity ({PARITY_STEPS} steps of tiny, fp32, TF32 off; relative loss difference, limit 1e-4)")
    for name, (got, want) in results.items():
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
        ok &= worst <= 1e-4
        print(f"  {name:<45} worst {worst:.2e}  {'ok' if worst <= 1e-4 else 'DIFFERS'}")
    return ok


def cluster_preset() -> str:
    name = torch.cuda.get_device_name(0)
    return next((preset for key, preset in PRESET_BY_NAME if key in name), "h100-80gb")


def block_stack(layers: int, seq: int, steps: int, compile_blocks: bool = False) -> None:
    from meshscale.cost import predict
    from meshscale.runtime.loop.config import Resolved, TrainConfig
    from meshscale.runtime.loop.trainer import train
    from meshscale.runtime.measure.live import run_cluster
    from meshscale.specs.layout import Layout
    from meshscale.specs.model import load_model

    spec = dataclasses.replace(load_model("llama3-8b"), layers=layers, name=f"llama3-8b-{layers}-blocks").with_seq(seq)
    layout = Layout.parse("", devices=1).resolve_mbs(1)
    preset = cluster_preset()
    config = TrainConfig(model="llama3-8b", steps=steps, global_batch=1, seq=seq, precision="bf16", device="cuda",
                         val_batches=1, sdc_check_every=0, warmup=1, compile=compile_blocks, cluster=preset)
    cluster = run_cluster(config)  # the preset with our runtime's software, as `train --predict` costs it
    prediction = predict(spec, cluster, layout, 1, "bf16")
    memory = prediction.memory_per_device_bytes["total"]
    if memory > torch.cuda.get_device_properties(0).total_memory:
        print(f"block stack: {layers} blocks at seq {seq} are predicted to need {memory / 2**30:.1f} GiB, more than "
              "this GPU has; lower --layers or --seq")
        return
    torch.cuda.reset_peak_memory_stats()
    rows = train(Resolved(config, spec, layout), torch.device("cuda", 0), log=False)["rows"]
    step = statistics.median(r["step_time_s"] for r in rows[1:])
    peak = max(r["peak_memory_bytes"] for r in rows)
    mfu = prediction.model_flops_per_step / (step * cluster.peak_flops("bf16"))
    print(f"\n{spec.name} ({spec.param_count() / 1e9:.2f}B parameters, seq {seq}, bf16"
          f"{', --compile' if compile_blocks else ''}, one "
          f"{torch.cuda.get_device_name(0)}; cost model on {preset} with the runtime's software)")
    print(f"  step time  measured {step * 1e3:8.1f} ms   predicted {prediction.step_time_s * 1e3:8.1f} ms   "
          f"ratio {step / prediction.step_time_s:.2f}")
    print(f"  MFU        measured {mfu:8.1%}      predicted {prediction.mfu:8.1%}")
    print(f"  peak mem   measured {peak / 2**30:8.2f} GiB  predicted {memory / 2**30:8.2f} GiB  "
          f"ratio {peak / memory:.2f}")


def resume(device: str = "cuda") -> bool:
    """`tiny` trained PARITY_STEPS steps saving a checkpoint each, then resumed from its step-2 checkpoint: the
    resumed steps' losses equal the uninterrupted run's to 1e-6 (a GPU's atomics may reorder a sum). On a GPU
    the optimizer is torch's fused AdamW, whose step count a checkpoint must put back on the device."""
    from meshscale.runtime.loop.trainer import train
    from meshscale.runtime.resilience.checkpoint import step_dir

    _exact_fp32()
    target = torch.device(device, 0) if device == "cuda" else torch.device(device)

    def losses(folder: str) -> list:
        run = _run("", 1, device=device, checkpoint_dir=folder, checkpoint_every=1, keep=3)
        return [r["loss"] for r in train(run, target, log=False)["rows"]]

    with tempfile.TemporaryDirectory() as tmp:
        full = losses(os.path.join(tmp, "full"))
        shutil.copytree(step_dir(os.path.join(tmp, "full"), 2), step_dir(os.path.join(tmp, "once"), 2))
        once = losses(os.path.join(tmp, "once"))
    worst = max(abs(a - b) / abs(b) for a, b in zip(once, full[2:])) if len(once) == len(full) - 2 else float("inf")
    ok = worst <= 1e-6
    print(f"\nresume from a step-2 checkpoint ({device}): {len(once)} steps, worst relative loss difference "
          f"{worst:.2e}: {'ok' if ok else 'DIFFERS'}")
    return ok


def memory_snapshot() -> bool:
    with tempfile.TemporaryDirectory() as folder:
        args = [sys.executable, "-m", "meshscale", "train", "--model", "tiny", "--steps", "4", "--device", "cuda",
                "--memory-snapshot", "1-2", "--memory-snapshot-dir", folder]
        first = subprocess.run(args, capture_output=True, text=True, timeout=600)
        path = os.path.join(folder, "steps1-2-rank0.pickle")
        if first.returncode != 0 or not os.path.exists(path):
            print(f"memory snapshot: FAILED (exit {first.returncode}): {first.stderr[-2000:]}")
            return False
        with open(path, "rb") as f:
            snap = pickle.load(f)
        allocs = sum(e["action"] == "alloc" for trace in snap["device_traces"] for e in trace)
        again = subprocess.run(args, capture_output=True, text=True, timeout=600)
        refused = again.returncode == 2 and "already exists" in again.stderr
        ok = bool(snap["segments"]) and allocs > 0 and refused
        print(f"\nmemory snapshot: {os.path.getsize(path) / 2**20:.1f} MiB, {len(snap['segments'])} segments, "
              f"{allocs} allocations recorded over steps 1-2; a second run "
              f"{'is refused' if refused else 'was NOT refused'}: {'ok' if ok else 'FAILED'}")
        return ok


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4, help="llama3-8b blocks in the stack (default 4)")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--skip-parity", action="store_true")
    p.add_argument("--compile", action="store_true", help="the block stack with torch.compile per block too")
    args = p.parse_args()
    reason = skip_reason()
    if reason:
        print(f"gpu_check: skipped: {reason}; nothing to measure here")
        return 0
    ok = True if args.skip_parity else parity()
    ok = memory_snapshot() and ok
    ok = resume() and ok
    block_stack(args.layers, args.seq, args.steps)
    if args.compile:
        block_stack(args.layers, args.seq, args.steps, compile_blocks=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
