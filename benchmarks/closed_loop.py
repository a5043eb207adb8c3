"""The closed loop on this machine: train each target layout with `--predict --cluster FILE` and print
measured vs predicted step time and memory (the summary object `train` writes at the end of --metrics-out).

    python benchmarks/closed_loop.py [--cluster FILE.toml] [--models tiny,small]

Without --cluster it first runs `meshscale calibrate --nproc 2` into a temporary file, so that the machine
is measured in the same state (load, clocks) as the runs it predicts. Takes several minutes; run it by hand.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# (layout, processes); global batch 8, so dp=2 ranks get 4 sequences, the pipeline 4 micro-batches of 2.
LAYOUTS = [("dp=2,zero=0", 2), ("dp=2,zero=1", 2), ("dp=2,zero=2", 2), ("dp=2,zero=3", 2), ("tp=2", 2),
           ("pp=2,schedule=1f1b,mbs=2", 2), ("dp=2,tp=2", 4)]
STEPS = {"tiny": 20, "small": 6}


def meshscale(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "meshscale", *args], check=True, stdout=subprocess.DEVNULL)


def summary(model: str, layout: str, nproc: int, cluster: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        meshscale("train", "--model", model, "--layout", layout, "--nproc", str(nproc), "--global-batch", "8",
                  "--steps", str(STEPS.get(model, 6)), "--predict", "--cluster", cluster, "--metrics-out", metrics)
        return json.loads(Path(metrics).read_text().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", help="a `meshscale calibrate` file (default: calibrate now)")
    parser.add_argument("--models", default="tiny,small")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = args.cluster or os.path.join(tmp, "local.toml")
        if not args.cluster:
            meshscale("calibrate", "--nproc", "2", "--out", cluster)
        table(args.models.split(","), cluster)
    return 0


def table(models: list[str], cluster: str) -> None:
    print(f"{'model':<6} {'layout':<26} {'step meas.':>10} {'pred.':>9} {'ratio':>6}   "
          f"{'memory meas.':>12} {'pred.':>9} {'ratio':>6}", flush=True)
    for model in models:
        for layout, nproc in LAYOUTS:
            s = summary(model, layout, nproc, cluster)
            mib = 2**20
            print(f"{model:<6} {layout:<26} {s['step_time_s'] * 1e3:>8.1f}ms "
                  f"{s['predicted_step_time_s'] * 1e3:>7.1f}ms "
                  f"{s['step_time_s'] / s['predicted_step_time_s']:>6.2f}   "
                  f"{s['peak_memory_bytes'] / mib:>9.1f}MiB {s['predicted_memory_bytes'] / mib:>6.1f}MiB "
                  f"{s['peak_memory_bytes'] / s['predicted_memory_bytes']:>6.2f}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
