"""`make demo`: plan `tiny` for this machine, then train it on the Python standard library's sources on 2
local processes with ZeRO-2 and two accumulated micro-batches per step (our own reduce-scatter/all-gather),
showing the loss falling, the validation loss and the communication measured beside the prediction."""

import subprocess
import sys

PLAN = ["plan", "--model", "tiny", "--cluster", "local-cpu", "--devices", "2", "--global-batch", "16", "--top", "3",
        "--precision", "fp32"]
TRAIN = ["train", "--model", "tiny", "--layout", "dp=2,zero=2,mbs=4", "--nproc", "2", "--steps", "120",
         "--global-batch", "16", "--log-every", "10"]


def meshscale(args: list[str]) -> int:
    print("$ meshscale " + " ".join(args), flush=True)
    return subprocess.call([sys.executable, "-m", "meshscale", *args])


def main() -> int:
    return meshscale(PLAN) or meshscale(TRAIN + ["--predict"])


if __name__ == "__main__":
    raise SystemExit(main())
