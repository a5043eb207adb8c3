"""Every picture: written as a PNG of a sensible size that is not blank."""

import os
import subprocess
import sys

import pytest

from meshscale.cli import main
from meshscale.errors import UserError
from meshscale.runtime.loop.config import load_config, resolve
from test_collectives import NCCL_LOG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_picture(path, min_px=300):
    plt = pytest.importorskip("matplotlib.pyplot")
    image = plt.imread(path)  # PNG as floats in [0, 1]
    h, w = image.shape[:2]
    assert h >= min_px and w >= min_px and os.path.getsize(path) < 1_000_000
    assert image[..., :3].std() > 0.05  # not blank: lines, bars and text on white


def test_scaling_timeline_memory_and_collective_plots(tmp_path, capsys):
    scale, timeline, memory, curve = (str(tmp_path / f) for f in ("s.png", "t.png", "m.png", "c.png"))
    (tmp_path / "nccl.log").write_text(NCCL_LOG)
    main(["scale", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "128..512",
          "--global-batch-tokens", "4194304", "--mtbf-hours", "50000", "--plot", scale])
    main(["simulate", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "64", "--layout",
          "dp=16,zero=1,pp=4,schedule=zb", "--global-batch", "64", "--straggler", "20:1.5", "--plot", timeline])
    main(["predict", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "64", "--layout", "fsdp=64",
          "--global-batch", "64", "--plot", memory])
    main(["collectives", "--cluster", "h100-80gb", "--measured", str(tmp_path / "nccl.log"), "--plot", curve])
    capsys.readouterr()
    for path in (scale, timeline, memory, curve):
        assert_picture(path)


def test_a_planning_picture_never_replaces_a_file_and_needs_its_directory(tmp_path, capsys):
    """predict, scale, simulate, collectives and budget check --plot (and simulate's --trace) before any work:
    an existing file is kept unless --overwrite, a missing directory is one line, exit 2."""
    existing = tmp_path / "mine.png"
    existing.write_bytes(b"the user's own file")
    base = ["--model", "llama2-7b", "--cluster", "h100-80gb"]
    commands = [
        ["predict", *base, "--devices", "8", "--layout", "dp=8", "--global-batch", "8"],
        ["scale", *base, "--devices", "8..16", "--global-batch-tokens", "1M"],
        ["simulate", *base, "--devices", "8", "--layout", "pp=2,dp=4", "--global-batch", "8"],
        ["collectives", "--cluster", "h100-80gb", "--devices", "8"],
        ["budget", *base, "--tokens", "1e11", "--deadline-days", "30", "--global-batch-tokens", "1M"],
    ]
    for command in commands:
        for flag in ("--plot", "--trace") if command[0] == "simulate" else ("--plot",):
            for path, message in ((existing, "already exists; choose a new name or pass --overwrite"),
                                  (tmp_path / "no" / "x.png", "does not exist or is not a directory")):
                with pytest.raises(SystemExit) as end:
                    main([*command, flag, str(path)])
                err = capsys.readouterr().err
                assert end.value.code == 2 and message in err and err.count("\n") == 1, (command, flag, err)
    assert existing.read_bytes() == b"the user's own file"
    main([*commands[0], "--plot", str(existing), "--overwrite"])
    capsys.readouterr()
    assert_picture(str(existing))


def test_train_plot(tmp_path):
    path = tmp_path / "train.png"
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    r = subprocess.run([sys.executable, "-m", "meshscale", "train", "--model", "tiny", "--steps", "3",
                        "--val-batches", "1", "--plot", str(path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert_picture(str(path))
    with pytest.raises(UserError, match="already exists"):  # never overwritten silently
        resolve(load_config(None, {"plot": str(path)}), 1)
