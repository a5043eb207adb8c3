"""`make demo`: train `tiny` on the Python standard library's sources on 2 local processes with ZeRO-2 and
two accumulated micro-batches per step (our own reduce-scatter/all-gather code), then show the loss falling, the validation loss and the
communication measured beside what the cost model predicts. A few minutes at most on 2 CPU cores."""

import importlib.util
import subprocess
import sys

TRAIN = ["train", "--model", "tiny", "--layout", "dp=2,zero=2,mbs=4", "--nproc", "2", "--steps", "120",
         "--global-batch", "16", "--log-every", "10"]


def main() -> int:
    args = list(TRAIN)
    if importlib.util.find_spec("meshscale.cost") is not None:
        args.append("--predict")
    else:
        print("(meshscale.cost is not on this branch: showing measured communication only)", flush=True)
    print("$ meshscale " + " ".join(args), flush=True)
    return subprocess.call([sys.executable, "-m", "meshscale", *args])


if __name__ == "__main__":
    raise SystemExit(main())
