"""Per-step time of each parallelism mechanism against the same processes without it, on this machine:
context parallelism, hybrid sharding, KV-head copies and expert parallelism.

    python benchmarks/mechanisms.py [--repeats 3] [--steps 12]

Each pair trains both layouts alternately `--repeats` times (so drifting load hits both alike) and prints
the median over repeats of each run's median step time (the first 2 steps, warm-up, left out). Takes a few
minutes; run it by hand on an otherwise idle machine.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# (what is measured, model, processes, layout with the mechanism, the same processes without it)
PAIRS = [("context parallelism", "tiny", 2, "cp=2", "dp=2"),
         ("context parallelism + FSDP", "tiny", 4, "cp=2,dp=2,zero=3", "dp=4,zero=3"),
         ("hybrid sharding, zero=3", "tiny", 4, "dp=4,zero=3,shard=2", "dp=4,zero=3"),
         ("hybrid sharding, zero=1", "tiny", 4, "dp=4,zero=1,shard=2", "dp=4,zero=1"),
         ("KV-head copies (tp=4 > 2 KV heads)", "configs/tiny-kv2.toml", 4, "tp=4", "dp=2,tp=2"),
         ("expert parallelism", "tiny-moe", 2, "dp=2,ep=2", "dp=2")]


def median_step(model: str, layout: str, nproc: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "m.jsonl"
        subprocess.run([sys.executable, "-m", "meshscale", "train", "--model", model, "--layout", layout,
                        "--nproc", str(nproc), "--global-batch", "8", "--steps", str(steps),
                        "--metrics-out", str(metrics)], check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        return statistics.median(r["step_time_s"] for r in rows if "step" in r and r["step"] >= 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    print(f"{'mechanism':<36} {'with':<22} {'ms':>7}   {'without':<14} {'ms':>7}  ratio", flush=True)
    for name, model, nproc, with_it, without in PAIRS:
        times = {with_it: [], without: []}
        for _ in range(args.repeats):
            for layout in times:
                times[layout].append(median_step(model, layout, nproc, args.steps))
        a, b = (statistics.median(times[x]) * 1e3 for x in (with_it, without))
        print(f"{name:<36} {with_it:<22} {a:>7.1f}   {without:<14} {b:>7.1f}  {a / b:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
