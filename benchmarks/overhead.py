"""meshscale's trainer against a bare torch loop on the same model, on local gloo ranks: tokens/s of each.

The bare loops are what a user would write with torch's own pieces: the same Transformer and initial weights,
AdamW with the same settings, the same global batch and micro-batches per rank, and
  dp=1        a plain loop,                        dp=2        DistributedDataParallel (bucket_cap_mb 25),
  dp=2,zero=3 FSDP2 fully_shard per block + root,  tp=2        DTensor parallelize_module (Megatron's split of
                                                               attention and MLP; embedding and head whole),
  pp=2        torch.distributed.pipelining, the layout's schedule over the same two stage modules,
each step: forward, backward (no_sync until the last micro-batch under DDP), clip_grad_norm to 1.0 (over every
stage's gradients under pp), optimizer step, zero_grad. meshscale runs `train` as a user does (guards, watchdog,
the replica check every 50 steps, metrics, its data loader). A step's time is the interval between the ends of
consecutive steps (so the first step, with its one-off costs, is never timed); each run reports the median; runs
alternate meshscale, bare, bare, meshscale, ... over `--rounds`. The table shows each side's median over rounds
and, as meshscale/bare, the median over rounds of the ratio within a round.

    PYTHONPATH=src python benchmarks/overhead.py [--models tiny,small] [--steps 8] [--rounds 3]
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

CASES = ("dp=1", "dp=2", "dp=2,zero=3", "tp=2", "pp=2")
BATCH = 8


def _resolved(model: str, layout: str, steps: int):
    from meshscale.runtime.loop.config import TrainConfig, resolve

    return resolve(TrainConfig(model=model, layout=layout, steps=steps, global_batch=BATCH, val_batches=1),
                   1 if layout == "dp=1" else 2)


def meshscale_step_times(run) -> list:
    """The trainer as `train` runs it; a timestamp where each step's row is written (the loop's last act)."""
    from meshscale.runtime.loop.data import load_tokens
    from meshscale.runtime.loop.trainer import Training

    t = Training(run, torch.device("cpu"), load_tokens(None)[: 1 << 20], log=False)
    stamps, log = [], t.metrics.log

    def stamped(row):
        log(row)
        stamps.append(time.perf_counter())

    t.metrics.log = stamped
    t.run()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def _clip(params: list, max_norm: float, pp: bool) -> None:
    """torch's clip_grad_norm_, split by kind: a model with both DTensor (TP, FSDP2) and plain gradients; under
    a pipeline the squared norm is summed over the stages first, as torchtitan's clip_grad_norm_ does (each
    stage holds only its own parameters' gradients)."""
    from torch.distributed.tensor import DTensor
    from torch.nn.utils import get_total_norm

    grads = [p.grad for p in params if p.grad is not None]
    kinds = [[g for g in grads if isinstance(g, DTensor)], [g for g in grads if not isinstance(g, DTensor)]]
    norms = [get_total_norm(k) for k in kinds if k]
    total = torch.stack([n.full_tensor() if isinstance(n, DTensor) else n for n in norms]).norm()
    if pp:
        total = total ** 2
        dist.all_reduce(total)
        total = total.sqrt()
    total = float(total)
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)


def bare_step_times(run) -> list:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    from meshscale.models.transformer import build_model
    from meshscale.parallel.pipeline import SCHEDULE_CLASSES, pipeline_chunks

    cfg, spec, layout = run.config, run.spec, run.layout
    m = layout.microbatches(BATCH)
    world = layout.devices
    model = build_model(spec, cfg.seed)
    rows = BATCH // layout.dp
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, spec.vocab, (rows, spec.seq + 1), generator=gen) for _ in range(cfg.steps)]
    schedule = None
    if layout.pp > 1:
        stage_index, chunk = pipeline_chunks(model, layout, dist.get_rank())[0]
        model = chunk
        from torch.distributed.pipelining import PipelineStage

        stage = PipelineStage(chunk, stage_index, layout.pp, torch.device("cpu"))
        schedule = SCHEDULE_CLASSES[layout.schedule](
            stage, m, loss_fn=lambda out, tgt: F.cross_entropy(out.flatten(0, 1), tgt.flatten()) / m,
            scale_grads=False)
    elif layout.tp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel()}
        for block in model.layers.values():
            parallelize_module(block, mesh, plan)
    elif layout.zero == 3:
        for block in model.layers.values():
            fully_shard(block)
        fully_shard(model)
    params = list(model.parameters())
    forward = DistributedDataParallel(model, bucket_cap_mb=25) if layout.dp > 1 and layout.zero == 0 else model
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=cfg.weight_decay)
    stamps = []
    for batch in batches:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        if schedule is not None:
            if dist.get_rank() == 0:
                schedule.step(inputs)
            else:
                schedule.step(target=targets, losses=[])
        else:
            for i, (x, y) in enumerate(zip(inputs.chunk(m), targets.chunk(m))):
                sync = forward.no_sync() if forward is not model and i < m - 1 else _nothing()
                with sync:
                    loss = F.cross_entropy(forward(x).flatten(0, 1), y.flatten()) / m
                    loss.backward()
        _clip(params, cfg.clip, schedule is not None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps, stamps[1:])]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _medians(model: str, layout: str, steps: int, rounds: int) -> tuple:
    """(meshscale, bare) medians over rounds of each run's median step time, alternating which goes first, and
    the median over rounds of bare's time / meshscale's within the round: a ratio of neighbours, which drifts in
    the machine's speed (other load, frequency) move together."""
    run = _resolved(model, layout, steps)
    ours, bare = [], []
    for r in range(rounds):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            if which == 0:
                ours.append(statistics.median(meshscale_step_times(run)))
            else:
                bare.append(statistics.median(bare_step_times(run)))
            if dist.is_initialized():
                dist.barrier()
    ratio = statistics.median(b / o for o, b in zip(ours, bare))
    return statistics.median(ours), statistics.median(bare), ratio, run


def _rank(rank: int, world: int, init_file: str, args, queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    for model in args.models.split(","):
        for layout in args.cases.split(";"):
            if (layout == "dp=1") != (world == 1):
                continue
            ours, bare, ratio, run = _medians(model, layout, args.steps, args.rounds)
            if rank == 0:
                queue.put((model, layout, BATCH * run.spec.seq / ours, BATCH * run.spec.seq / bare, ratio))
    queue.put(None)
    if world > 1:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--cases", default=";".join(CASES), help="layouts, ';'-separated")
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first is not timed)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    print(f"{'model':<6} {'layout':<12} {'meshscale tok/s':>15} {'bare torch tok/s':>16} {'meshscale/bare':>14}",
          flush=True)
    for world in (1, 2):
        queue = ctx.Queue()
        with tempfile.TemporaryDirectory() as tmp:
            init = os.path.join(tmp, "pg")
            procs = [ctx.Process(target=_rank, args=(r, world, init, args, queue)) for r in range(world)]
            for p in procs:
                p.start()
            done = 0
            while done < world:
                item = queue.get(timeout=3600)
                if item is None:
                    done += 1
                    continue
                model, layout, ours, bare, ratio = item
                print(f"{model:<6} {layout:<12} {ours:>15,.0f} {bare:>16,.0f} {ratio:>14.3f}", flush=True)
            for p in procs:
                p.join()


if __name__ == "__main__":
    main()
