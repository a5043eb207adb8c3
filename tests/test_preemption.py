"""What production clusters do to a job, through `meshscale train` as a scheduler runs it: preemption by
SIGTERM (saved, exit 75, resumed bit for bit), a save slower than --timeout (not a hang), a second signal
(out at once), --time-limit, a launcher
killed with SIGKILL (no worker survives it), a second job on the same checkpoint directory (refused in one
line), a disk that fills during a save (one line, nothing lost), and a resume under other settings (refused,
naming them)."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest

from test_guards import _processes_tagged

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--seq", "16", "--global-batch", "4", "--val-batches", "1", "--log-every", "1000"]


def _start(tmp: Path, name: str, *extra: str, fault: str = "") -> tuple[subprocess.Popen, str]:
    """`meshscale train` in the background, its environment tagged so its workers can be found by pid."""
    tag = f"{os.getpid()}-{name}-{time.time()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MESHSCALE_FAULT": fault, "MESHSCALE_TEST_TAG": tag}
    args = [sys.executable, "-m", "meshscale", "train", *COMMON, "--checkpoint-dir", str(tmp / name),
            "--metrics-out", str(tmp / f"{name}.jsonl"), *extra]
    return subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), \
        f"MESHSCALE_TEST_TAG={tag}"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for_rows(proc: subprocess.Popen, path: Path, n: int) -> None:
    """Until the run has logged n steps (it is training), never longer than the suite's patience."""
    deadline = time.time() + 600
    while len(_rows(path)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.2)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def _gone(tag: str, within: float = 30.0) -> bool:
    deadline = time.time() + within
    while _processes_tagged(tag) and time.time() < deadline:
        time.sleep(0.2)
    return not _processes_tagged(tag)


def test_sigterm_saves_every_rank_and_the_same_command_resumes_bit_exact(tmp_path):
    run = ["--nproc", "2", "--layout", "dp=2,zero=1", "--steps", "40", "--checkpoint-every", "1000"]
    # the reference run's one save takes 14 s longer on rank 1 than its --timeout: a save has its own timeout
    clean, _ = _start(tmp_path, "clean", *run, "--timeout", "10", fault="slowsave@step=39,rank=1,seconds=14")
    code, _, err = _finish(clean)
    assert code == 0 and err == "", err  # before: "hang: ... stopped after --timeout 10 s"
    # rank 0 logs the save as it waited for rank 1's, less however much later than rank 1 it began: over --timeout
    assert _rows(tmp_path / "clean.jsonl")[-1]["checkpoint_save_s"] > 10

    proc, tag = _start(tmp_path, "preempted", *run, fault="slow@step=0,rank=1,factor=4")
    _wait_for_rows(proc, tmp_path / "preempted.jsonl", 3)
    proc.send_signal(signal.SIGTERM)
    code, _, err = _finish(proc)
    lines = err.strip().splitlines()
    assert code == 75 and len(lines) == 1, err
    step = int(lines[0].split("stopped after ")[1].split()[0])
    assert 3 <= step < 40
    assert lines[0] == (f"meshscale: SIGTERM received: stopped after {step} steps and saved "
                        f"{tmp_path / 'preempted' / f'step-{step:08d}'}; run the same command to resume (exit code 75)")
    assert _gone(tag)

    resumed, _ = _start(tmp_path, "preempted", *run)
    code, out, err = _finish(resumed)
    assert code == 0, err
    assert f"resuming from {tmp_path / 'preempted' / f'step-{step:08d}'} at step {step}" in out
    rows, reference = _rows(tmp_path / "preempted.jsonl"), _rows(tmp_path / "clean.jsonl")
    assert [r["step"] for r in rows] == list(range(40))
    assert [r["loss"] for r in rows] == [r["loss"] for r in reference]


def test_a_second_signal_ends_the_run_at_once_and_its_workers_with_it(tmp_path):
    # from step 1 on, rank 0 takes 100 times as long per step (the others wait for it): signals arrive mid-step
    proc, tag = _start(tmp_path, "twice", "--nproc", "2", "--steps", "400", "--timeout", "3600",
                       fault="slow@step=1,rank=0,factor=100")
    _wait_for_rows(proc, tmp_path / "twice.jsonl", 1)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    code, _, err = _finish(proc)
    assert time.time() - sent < 20
    assert code == 128 + signal.SIGTERM and err.strip().splitlines() == \
        ["meshscale: SIGTERM: stopped at once; nothing saved since the last checkpoint"], err
    assert _gone(tag)


def test_killing_the_launcher_with_sigkill_leaves_no_worker(tmp_path):
    proc, tag = _start(tmp_path, "orphans", "--nproc", "2", "--steps", "100000")
    metrics = tmp_path / "orphans.jsonl"
    _wait_for_rows(proc, metrics, 2)
    workers = [pid for pid in _processes_tagged(tag) if pid != proc.pid]
    assert len(workers) >= 2  # the two ranks (and nothing of ours is left from before)
    proc.kill()
    proc.wait()
    logged = len(_rows(metrics))
    # unsupervised workers trained on for 10-15 s here before; the kernel ends them with their launcher
    assert _gone(tag, within=5), f"workers left training: {_processes_tagged(tag)}"
    time.sleep(2)
    assert len(_rows(metrics)) <= logged + 1  # at most the step that was being logged


def test_time_limit_saves_and_exits_75(tmp_path):
    proc, _ = _start(tmp_path, "limited", "--steps", "100000", "--time-limit", "2")
    code, _, err = _finish(proc)
    lines = err.strip().splitlines()
    assert code == 75 and len(lines) == 1 and lines[0].startswith("meshscale: --time-limit 2 s reached: stopped "
                                                                  "after "), err
    step = int(lines[0].split("stopped after ")[1].split()[0])
    assert (tmp_path / "limited" / f"step-{step:08d}" / "manifest.json").exists()
    assert len(_rows(tmp_path / "limited.jsonl")) == step


def test_a_second_run_on_a_locked_directory_is_refused_naming_the_holder(tmp_path):
    first, _ = _start(tmp_path, "shared", "--steps", "100000")
    _wait_for_rows(first, tmp_path / "shared.jsonl", 1)
    second = subprocess.run([sys.executable, "-m", "meshscale", "train", *COMMON, "--checkpoint-dir",
                             str(tmp_path / "shared")], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    first.kill()
    first.communicate()
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert f"is in use by another run (pid {first.pid} on " in lines[0]


def test_a_held_directory_is_refused_before_its_checkpoints_are_read(tmp_path):
    """The probe `train` makes before it reads --checkpoint-dir: refused while a run holds it (whatever that run
    saved meanwhile), nothing created where there is no directory, free once the holder lets go."""
    from meshscale.errors import UserError
    from meshscale.runtime.resilience.lock import DirLock, refuse_if_held

    refuse_if_held(str(tmp_path / "none"))
    assert not (tmp_path / "none").exists()
    with DirLock(str(tmp_path / "held")):
        with pytest.raises(UserError, match=rf"is in use by another run \(pid {os.getpid()} on "):
            refuse_if_held(str(tmp_path / "held"))
    refuse_if_held(str(tmp_path / "held"))


Usage = namedtuple("Usage", "total used free")  # shutil.disk_usage's fields


def _full_disk():
    """In the child: writes past 1 MiB fail as on a full disk (the kernel's file-size limit, with SIGXFSZ
    ignored so that write() returns EFBIG instead of killing the process); inherited by the workers."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


@pytest.mark.parametrize("mode", [(), ("--async-save",)], ids=["sync", "async"])
def test_a_save_the_disk_cannot_hold_is_one_line_and_loses_nothing(tmp_path, mode):
    """A save whose writes fail (rank 1's and rank 0's alike: each writes a shard of `tiny`'s 5 MB) ends the
    run in one line, removes the partial step directory and leaves the checkpoint before it; the same command
    resumes from that one once there is room."""
    d = tmp_path / "ckpt"
    base = [sys.executable, "-m", "meshscale", "train", *COMMON, "--nproc", "2", "--layout", "dp=2",
            "--checkpoint-dir", str(d), "--checkpoint-every", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def train(steps: str, *extra, limited: bool = False):
        return subprocess.run([*base, "--steps", steps, *extra], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=600, preexec_fn=_full_disk if limited else None)

    assert train("2").returncode == 0
    full = train("4", "--allow-config-change", *mode, limited=True)
    lines = full.stderr.strip().splitlines()
    assert full.returncode == 2 and len(lines) == 1, full.stderr
    # the cause as torch met it: EFBIG, or torch.save's zip writer finding its file shorter than it wrote
    assert f"saving the checkpoint of step 4 to {d} failed (" in lines[0], lines[0]
    assert "free there); its partial files were removed and the checkpoint of step 2 is intact" in lines[0]
    assert sorted(p.name for p in d.glob("step-*")) == ["step-00000002"]
    again = train("4", "--allow-config-change")
    assert again.returncode == 0, again.stderr
    assert (d / "step-00000004" / "manifest.json").exists()


def test_a_directory_without_room_for_one_checkpoint_is_refused_before_training(tmp_path, monkeypatch):
    """Too little room for one checkpoint (the cost model's size) is refused before anything trains."""
    from meshscale.errors import UserError
    from meshscale.runtime.resilience import checkpoint
    from meshscale.specs.layout import Layout
    from meshscale.specs.model import load_model

    spec, layout = load_model("tiny"), Layout(dp=1)
    checkpoint.check_space(tmp_path, spec, layout, "fp32")  # this disk has room for a few MB
    free = checkpoint.checkpoint_bytes(spec, layout, "fp32")[1] - 1
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: Usage(free + 1, 1, free))  # a fuller disk
    with pytest.raises(UserError, match=r"a checkpoint of tiny at --precision fp32 takes [\d.]+ MiB and .* has "
                                        r"[\d.]+ MiB free"):
        checkpoint.check_space(tmp_path, spec, layout, "fp32")

