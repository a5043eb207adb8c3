"""`make demo`: the closed loop on this machine. Calibrate it (once, quickly; kept in runs/), plan `tiny` for
2 local processes on the calibrated cluster, train the plan's winner on the Python standard library's
sources, print the prediction for that very layout beside what was measured, and show the checkpoint the
run saved at its end."""

import json
import subprocess
import sys
import tempfile
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


def show_checkpoint(root: Path) -> None:
    from meshscale.runtime.resilience.checkpoint import complete

    step, path = complete(root)[-1]
    manifest = json.loads((path / "manifest.json").read_text())
    size = sum(f.stat().st_size for f in path.iterdir())
    print(f"checkpoint {path.name}: step {step}, {size / 2**20:.1f} MiB in {len(manifest['files'])} checksummed "
          f"files, layout {manifest['layout']} on {manifest['world_size']} processes (any layout can resume it)")


def main() -> int:
    try:
        if not Path(CLUSTER).exists():
            Path(CLUSTER).parent.mkdir(exist_ok=True)
            meshscale(["calibrate", "--nproc", "2", "--quick", "--out", CLUSTER])
        meshscale(PLAN + ["--top", "3"])
        with tempfile.TemporaryDirectory(prefix="meshscale-demo-") as root:
            meshscale(TRAIN + ["--layout", winner(), "--checkpoint-dir", root])
            show_checkpoint(Path(root))
    except subprocess.CalledProcessError as e:
        return e.returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
