"""`make demo`: the closed loop on this machine. Calibrate it (once, quickly; kept in runs/), plan `tiny` for
2 local processes on the calibrated cluster, train the plan's winner on the Python standard library's
sources, and print the prediction for that very layout beside what was measured."""

import subprocess
import sys
from pathlib import Path

CLUSTER = "runs/local-cpu.toml"
PLAN = ["plan", "--model", "tiny", "--cluster", CLUSTER, "--devices", "2", "--global-batch", "16", "--precision",
        "fp32"]
TRAIN = ["train", "--model", "tiny", "--nproc", "2", "--steps", "80", "--global-batch", "16", "--log-every", "10",
         "--predict", "--cluster", CLUSTER]


def meshscale(args: list[str], capture: bool = False) -> subprocess.CompletedProcess:
    if not capture:
        print("$ meshscale " + " ".join(args), flush=True)
    return subprocess.run([sys.executable, "-m", "meshscale", *args], check=True, text=True,
                          stdout=subprocess.PIPE if capture else None)


def winner() -> str:
    """The layout `plan --emit torchrun` runs: the winner, or the fastest one the trainer executes."""
    command = meshscale(PLAN + ["--emit", "torchrun"], capture=True).stdout.splitlines()[-1].split()
    return command[command.index("--layout") + 1]


def main() -> int:
    try:
        if not Path(CLUSTER).exists():
            Path(CLUSTER).parent.mkdir(exist_ok=True)
            meshscale(["calibrate", "--nproc", "2", "--quick", "--out", CLUSTER])
        meshscale(PLAN + ["--top", "3"])
        meshscale(TRAIN + ["--layout", winner()])
    except subprocess.CalledProcessError as e:
        return e.returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
