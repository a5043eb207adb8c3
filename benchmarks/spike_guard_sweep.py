"""False positives of the spike guard (runtime/resilience/guards.py, SpikeRule) on clean runs: `tiny` trained
in one process for --steps steps at every (global batch, seed, lr) of the grid, the guard off, its loss and
gradient-norm series kept (--out, one JSON line per run: a rerun skips the runs already there); then the
guard's rule, the trainer's own SpikeRule objects at the trainer's settings, replayed over each series.

With the guard off the series is the one a guarded run produces until the guard's first alarm, so a series
without an alarm is a run the guard lets finish. Per run and series: the first step the rule would call a
spike, and the margin, the largest z = (log value - mean) / max(std, floor) seen, against --spike-sigma. A
loss alarm is a false positive (nothing was injected). The same rule over the gradient norm is shown for the
record: the trainer never acts on it (guards.py: clean runs have norm outliers; clipping bounds what they do).

    PYTHONPATH=src nice python benchmarks/spike_guard_sweep.py [--steps 2000] [--batches 2,8,64]
        [--seeds 0,1,2,3,4] [--lrs 0.003,0.001] [--out spike_series.jsonl]
"""

import argparse
import json
import math
import os
from pathlib import Path


def _series(steps: int, batch: int, seed: int, lr: float) -> dict:
    import torch

    from meshscale.runtime.loop.config import TrainConfig, resolve
    from meshscale.runtime.loop.trainer import train

    run = resolve(TrainConfig(model="tiny", steps=steps, global_batch=batch, seed=seed, lr=lr, min_lr=lr / 10,
                              spike_sigma=0, sdc_check_every=0, val_batches=1), 1)
    rows = train(run, torch.device("cpu"), log=False)["rows"]
    return {"batch": batch, "seed": seed, "lr": lr, "steps": steps,
            "loss": [r["loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows]}


def replay(values: list[float], sigma: float) -> tuple[int | None, float]:
    """(the first step the rule calls a spike or None, the largest z it saw) for one series."""
    from meshscale.runtime.resilience.guards import SpikeRule

    rule, first, peak = SpikeRule(sigma), None, -math.inf
    for step, value in enumerate(values):
        z = rule.z(value)
        if z is not None:
            peak = max(peak, z)
            if z > sigma and first is None:
                first = step
        rule.accept(value)  # a false alarm skipped nothing here: the run goes on as it did
    return first, peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batches", default="2,8,64")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--lrs", default="0.003,0.001")
    p.add_argument("--spike-sigma", type=float, default=None, help="default: the trainer's (TrainConfig)")
    p.add_argument("--out", default="spike_series.jsonl")
    args = p.parse_args()
    import torch

    from meshscale.runtime.loop.config import TrainConfig

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    sigma = TrainConfig.spike_sigma if args.spike_sigma is None else args.spike_sigma
    out = Path(args.out)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    have = {(r["batch"], r["seed"], r["lr"], r["steps"]) for r in done}
    for seed in map(int, args.seeds.split(",")):
        for lr in map(float, args.lrs.split(",")):
            for batch in map(int, args.batches.split(",")):
                if (batch, seed, lr, args.steps) not in have:
                    series = _series(args.steps, batch, seed, lr)
                    with open(out, "a") as f:
                        f.write(json.dumps(series) + "\n")
                    done.append(series)
    alarms = {"loss": 0, "grad_norm": 0}
    print(f"spike rule at {sigma:g} sigma over {len(done)} clean runs of tiny (nproc 1, --clip 1):")
    print(f"{'batch':>5} {'seed':>4} {'lr':>7} {'steps':>5}  {'loss: alarm, max z':>20}  "
          f"{'grad norm (not acted on)':>24}")
    for r in sorted(done, key=lambda r: (r["batch"], r["lr"], r["seed"])):
        cells = []
        for key in ("loss", "grad_norm"):
            first, peak = replay(r[key], sigma)
            alarms[key] += first is not None
            cells.append(f"{'step ' + str(first) if first is not None else 'none'}, {peak:.2f}")
        print(f"{r['batch']:>5} {r['seed']:>4} {r['lr']:>7g} {r['steps']:>5}  {cells[0]:>20}  {cells[1]:>24}")
    print(f"false positives (loss alarms on clean runs): {alarms['loss']} of {len(done)} runs; the same rule over "
          f"the gradient norm, which the trainer does not apply, would have fired in {alarms['grad_norm']}")


if __name__ == "__main__":
    main()
