"""What production clusters do to a job, through `meshscale train` as a scheduler runs it: preemption by
SIGTERM (saved, exit 75, resumed bit for bit), a save slower than --timeout (not a hang), a second signal
(out at once), --time-limit, a launcher
killed with SIGKILL (no worker survives it), a second job on the same checkpoint directory (refused in one
line), and a resume under other settings (refused, naming them)."""

import json
import os
import signal
import subprocess
import sys
import time
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
    assert _rows(tmp_path / "clean.jsonl")[-1]["checkpoint_save_s"] >= 14

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
