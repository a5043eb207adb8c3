"""`make demo`: plan `tiny` for this machine, then train it on the Python standard library's sources on 2
local processes with ZeRO-2 and two accumulated micro-batches per step (our own reduce-scatter/all-gather),
showing the loss falling, the validation loss and the communication measured beside the prediction, and
the checkpoint the run saved at its end."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

PLAN = ["plan", "--model", "tiny", "--cluster", "local-cpu", "--devices", "2", "--global-batch", "16", "--top", "3",
        "--precision", "fp32"]
TRAIN = ["train", "--model", "tiny", "--layout", "dp=2,zero=2,mbs=4", "--nproc", "2", "--steps", "120",
         "--global-batch", "16", "--log-every", "10"]


def meshscale(args: list[str]) -> int:
    print("$ meshscale " + " ".join(args), flush=True)
    return subprocess.call([sys.executable, "-m", "meshscale", *args])


def show_checkpoint(root: Path) -> None:
    from meshscale.runtime.checkpoint import complete

    step, path = complete(root)[-1]
    manifest = json.loads((path / "manifest.json").read_text())
    size = sum(f.stat().st_size for f in path.iterdir())
    print(f"checkpoint {path.name}: step {step}, {size / 2**20:.1f} MiB in {len(manifest['files'])} checksummed "
          f"files, layout {manifest['layout']} on {manifest['world_size']} processes (any layout can resume it)")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="meshscale-demo-") as root:
        code = meshscale(PLAN) or meshscale(TRAIN + ["--predict", "--checkpoint-dir", root])
        if code == 0:
            show_checkpoint(Path(root))
        return code


if __name__ == "__main__":
    raise SystemExit(main())
