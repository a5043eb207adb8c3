"""Goodput under failures, measured against its prediction: a long `meshscale train` run with --async-save
checkpoints and --max-restarts, whose workers this script SIGKILLs at the times of a Poisson process (mean
time between failures --mtbf seconds: exponential gaps, one random worker each time), then stopped with
SIGTERM after --duration seconds (it saves and exits 75).

Measured (the script timestamps every metrics row as it appears, polling the file):
- w: the wall time of a step without a save or a failure (the median gap between consecutive rows), which
  includes what the loop does around the step (logging, the preemption all-reduce) and the share of the
  cores an async save's thread takes;
- wall: from the start of the first step to the end of the last one logged;
- useful: (steps that count, each once) x w, the time a run without failures or checkpoints would take;
- ETTR = useful / wall (Kokolis et al. 2024, arXiv:2410.21680, sec. V: effective training time ratio);
- the inputs of the prediction, from the same run: the checkpoint interval tau (--checkpoint-every x w),
  the save time delta (median gap of a step that saved, minus w), the restart time R (from a kill to the
  start of the first step of the restarted group: relaunch, rendezvous, load), and the MTBF.
Predicted: cost/goodput.py's `ettr(tau, delta, R, M)` (Young 1974 / Daly 2006, first order in 1/M) with
M = --mtbf, and with M = the realised mean gap between kills.

    PYTHONPATH=src nice python benchmarks/goodput_soak.py [--duration 1500] [--mtbf 300] [--every 40]
        [--nproc 2] [--model tiny] [--seed 0]
"""

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _workers(launcher: int) -> list[int]:
    """The launcher's worker processes (its children running the worker module)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher and b"meshscale.runtime.loop.launch" in cmd:
            found.append(int(d.name))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=1500.0)
    p.add_argument("--mtbf", type=float, default=300.0, help="mean seconds between injected kills")
    p.add_argument("--every", type=int, default=40, help="--checkpoint-every (an async write should fit in it)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="tiny")
    p.add_argument("--seed", type=int, default=0, help="of the kill times")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from meshscale.cost.goodput import ettr

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "soak.jsonl"
        cmd = [sys.executable, "-m", "meshscale", "train", "--model", args.model, "--nproc", str(args.nproc),
               "--steps", "1000000", "--val-batches", "1", "--log-every", "100000", "--metrics-out", str(metrics),
               "--checkpoint-dir", str(Path(tmp) / "ck"), "--checkpoint-every", str(args.every), "--async-save",
               "--max-restarts", "1000", "--max-no-progress-restarts", "1000", "--sdc-check-every", "0"]
        launcher = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen: dict[int, tuple[float, dict]] = {}  # step -> (when its row appeared, row): the last run of it
        gaps, saved_gaps, last = [], [], None  # wall between consecutive rows of one attempt
        restarts, kills, lines = [], [], []
        started = end = next_kill = None
        while launcher.poll() is None:
            now = time.time()
            current = (metrics.read_text() if metrics.exists() else "").split("\n")[:-1]  # complete lines
            kept = 0  # a restart truncates the file to the rows before its checkpoint, then appends
            while kept < min(len(lines), len(current)) and lines[kept] == current[kept]:
                kept += 1
            for line in current[kept:]:
                row = json.loads(line)
                begun = now - row["step_time_s"]
                if kills and begun > kills[-1] and (not restarts or restarts[-1][0] < kills[-1]):
                    restarts.append((kills[-1], begun))  # the first step begun after the latest kill
                if last is not None and row["step"] == last[1] + 1 and not (kills and last[0] < kills[-1]):
                    (saved_gaps if "checkpoint_save_s" in row else gaps).append(now - last[0])
                last = (now, row["step"])
                seen[row["step"]] = (now, row)
                started = started or begun
            lines = current
            if started is not None and next_kill is None:
                next_kill = now + rng.expovariate(1 / args.mtbf)
            if next_kill is not None and now >= next_kill:
                victims = _workers(launcher.pid)
                if victims:
                    os.kill(rng.choice(victims), signal.SIGKILL)
                    kills.append(now)
                next_kill = now + rng.expovariate(1 / args.mtbf)
            if started is not None and now - started > args.duration and end is None:
                end = max(t for t, _ in seen.values())
                launcher.send_signal(signal.SIGTERM)
            time.sleep(0.05)
        err = launcher.stderr.read() if launcher.stderr else ""
        if launcher.returncode not in (75, 128 + signal.SIGTERM):  # SIGTERM mid-restart: out at once
            sys.exit(f"soak run ended with exit {launcher.returncode}: {err[-2000:]}")
    rows = [row for t, row in seen.values() if t <= end]
    step = statistics.median(gaps)
    useful, wall = len(rows) * step, end - started
    writes = [r["checkpoint_write_s"] for r in rows if "checkpoint_write_s" in r]
    tau, delta = args.every * step, statistics.median(saved_gaps) - step
    restart = statistics.median(first - kill for kill, first in restarts) if restarts else float("nan")
    in_time = [k for k in kills if k <= end]
    realised = wall / len(in_time) if in_time else float("inf")
    measured = useful / wall
    print(f"{args.model} on {args.nproc} gloo ranks, --async-save every {args.every} steps, kills at MTBF "
          f"{args.mtbf:g} s for {wall:.0f} s: {len(in_time)} kills, {len(restarts)} restarts, {len(rows)} steps")
    print(f"  step {step:.3f} s (median wall between rows; step_time_s median "
          f"{statistics.median(r['step_time_s'] for r in rows):.3f} s): tau {tau:.1f} s; save delta {delta:.3f} s "
          "(median; "
          f"write to commit {statistics.median(writes) if writes else float('nan'):.2f} s in the background); "
          f"restart R {restart:.1f} s (median kill -> first step)")
    for name, mtbf in (("--mtbf", args.mtbf), ("realised", realised)):
        predicted = ettr(tau, delta, restart, mtbf)
        off = f"{100 * (measured - predicted) / predicted:+.1f}%" if predicted > 0 else "no useful time predicted"
        print(f"  ETTR measured {measured:.3f}; predicted (cost/goodput.ettr, M = {name} {mtbf:.0f} s) "
              f"{predicted:.3f}: {off}")


if __name__ == "__main__":
    main()
