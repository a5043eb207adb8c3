"""What a checkpoint costs a run, through `meshscale train` on local gloo ranks: the step time a save adds,
synchronous vs --async-save, and the time from a (re)start to the first step with and without a checkpoint
to resume from.

Save cost. Three runs of the same steps: no checkpoints, synchronous saves every --every steps, async saves
every --every steps. Each row's wall time is its step_time_s plus the checkpoint_save_s the step waited
for; a save's cost is (total wall of the run with saves - total of the run without) / saves, over every
step but the last (whose save the run always waits for). That includes what an async save's thread takes
from the steps it overlaps (two cores shared here: it competes with training). Also printed: the median
time a step blocks on a save (checkpoint_save_s: the whole save when synchronous, the copy into host
memory when async) and the median time an async save takes until it is committed (checkpoint_write_s).

Restart time. The time from launching `meshscale train` to its first metrics row: fresh (no checkpoint),
and resuming from the synchronous run's last checkpoint (the launcher verifies its checksums, the ranks
load it). Their difference is what resuming adds to a start.

    PYTHONPATH=src nice python benchmarks/checkpoint_save.py [--model small] [--nproc 2] [--steps 41]
        [--every 10] [--layout dp=2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _train(out: Path, name: str, args, *extra: str) -> tuple[list[dict], float]:
    """Run to the end; (metrics rows, seconds from launch to the first row)."""
    metrics = out / f"{name}.jsonl"
    cmd = [sys.executable, "-m", "meshscale", "train", "--model", args.model, "--nproc", str(args.nproc),
           "--layout", args.layout, "--val-batches", "1", "--log-every", "1000", "--metrics-out", str(metrics),
           "--sdc-check-every", "0", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None:
        if first is None and metrics.exists() and metrics.read_text().strip():
            first = time.perf_counter() - start
        time.sleep(0.02)
    if proc.returncode != 0:
        sys.exit(f"{name}: exit {proc.returncode}: {proc.stderr.read()[-2000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()], first or float("nan")


def _wall(rows: list[dict]) -> float:
    return sum(r["step_time_s"] + r.get("checkpoint_save_s", 0.0) for r in rows[:-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--layout", default="dp=2")
    p.add_argument("--steps", type=int, default=41)
    p.add_argument("--every", type=int, default=10)  # an async save waits for the one before it
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        steps = ["--steps", str(args.steps)]
        base, fresh = _train(out, "none", args, *steps)
        runs = {}
        for mode in ("sync", "async"):
            extra = ["--async-save"] if mode == "async" else []
            runs[mode] = _train(out, mode, args, *steps, "--checkpoint-dir", str(out / mode), "--checkpoint-every",
                                str(args.every), *extra)[0]
        state = sum(f.stat().st_size for f in (out / "sync" / f"step-{args.steps:08d}").glob("__*"))
        saves = {m: sum("checkpoint_save_s" in r for r in rows[:-1]) for m, rows in runs.items()}
        print(f"{args.model}, layout {args.layout} on {args.nproc} local gloo ranks, {args.steps} steps, a save "
              f"every {args.every} ({state / 2**20:.1f} MiB of DCP files per checkpoint)")
        print(f"  median step without saves: {statistics.median(r['step_time_s'] for r in base[1:-1]):.3f} s")
        for mode, rows in runs.items():
            blocked = statistics.median(r["checkpoint_save_s"] for r in rows[:-1] if "checkpoint_save_s" in r)
            cost = (_wall(rows) - _wall(base)) / saves[mode]
            line = (f"  {mode:>5}: step blocked {blocked:.3f} s per save (median); run's extra wall per save "
                    f"{cost:+.3f} s")
            written = [r["checkpoint_write_s"] for r in rows if "checkpoint_write_s" in r]
            if written:
                line += f"; staged-to-committed {statistics.median(written):.3f} s (median)"
            print(line)
        _, resumed = _train(out, "resumed", args, "--steps", str(args.steps + 2), "--checkpoint-dir",
                            str(out / "sync"), "--allow-config-change")
        print(f"  launch to first step: fresh {fresh:.2f} s, resuming from step {args.steps} {resumed:.2f} s "
              f"(resume adds {resumed - fresh:+.2f} s)")


if __name__ == "__main__":
    main()
