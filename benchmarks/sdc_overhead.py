"""Cost of the cross-replica SDC check (runtime/resilience/sdc.py) against the training step, on local gloo ranks.

For each layout: the median step time of a real training run without the check, and the median time of one
check (fingerprints of every replicated parameter and optimizer tensor, an all-gather per replica group and
the agreement all-reduce) on the same model after a step; the overhead at `--every N` is check / (N * step).

    PYTHONPATH=src python benchmarks/sdc_overhead.py [--model tiny] [--every 50] [--steps 30] [--nproc 2]
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LAYOUTS = ("dp={n}", "dp={n},zero=1", "tp={n}")


def _rank(rank: int, world: int, init_file: str, args, queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from meshscale.parallel.apply import apply_layout
    from meshscale.parallel.mesh import build_mesh
    from meshscale.runtime.loop.config import TrainConfig, resolve
    from meshscale.parallel.ledger import CommLedger
    from meshscale.models.transformer import build_model
    from meshscale.runtime.loop.optim import build_optimizer
    from meshscale.runtime.resilience.sdc import ReplicaCheck
    from meshscale.runtime.loop.trainer import train

    for text in LAYOUTS:
        run = resolve(TrainConfig(model=args.model, layout=text.format(n=world), steps=args.steps,
                                  sdc_check_every=0, val_batches=1), world)
        rows = train(run, torch.device("cpu"), log=False)["rows"]
        step = statistics.median(r["step_time_s"] for r in rows[1:])
        par = apply_layout(build_model(run.spec), run.layout, build_mesh(run.layout, "cpu"), CommLedger())
        optimizer = build_optimizer(par.optim_params(), 1e-3, 0.0)
        for p in par.optim_params():  # one update, so the optimizer state the check compares exists
            p.grad = torch.zeros_like(p)
        optimizer.step()
        check = ReplicaCheck(par, optimizer)
        times = []
        for i in range(args.repeats):
            dist.barrier()
            start = time.perf_counter()
            assert check.run(i) is None
            times.append(time.perf_counter() - start)
        if rank == 0:
            queue.put((str(run.layout), step, statistics.median(times),
                       sum(len(check.tensors(named, state)) for _, _, named, state in check.groups)))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--every", type=int, default=50, help="check interval to report the overhead for")
    parser.add_argument("--steps", type=int, default=30, help="training steps timed per layout")
    parser.add_argument("--repeats", type=int, default=20, help="checks timed per layout")
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, args.nproc, os.path.join(tmp, "pg"), args, queue))
                 for r in range(args.nproc)]
        for p in procs:
            p.start()
        print(f"{'layout':<22}{'tensors':>8}{'step ms':>10}{'check ms':>10}  overhead at every {args.every}")
        for _ in LAYOUTS:
            layout, step, check, tensors = queue.get(timeout=1800)
            print(f"{layout:<22}{tensors:>8}{step * 1e3:>10.1f}{check * 1e3:>10.2f}  "
                  f"{100 * check / (args.every * step):.3f}%")
        for p in procs:
            p.join()


if __name__ == "__main__":
    main()
