"""Automatic restart, end to end through `meshscale train`: rank 1 SIGKILLs itself (MESHSCALE_FAULT) and
--max-restarts 1 restarts both workers, which resume from the newest checkpoint and finish with the
uninterrupted run's losses bit for bit, the metrics file continued without a step twice."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshscale.runtime.resilience.restarts import PROGRESS

ROOT = Path(__file__).resolve().parents[1]
SPEC = {"name": "tiny-odd", "layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 88, "vocab": 258,
        "seq": 32}


def _train(tmp: Path, name: str, fault: str = "") -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MESHSCALE_FAULT": fault}
    args = ["train", "--model", str(tmp / "tiny-odd.json"), "--layout", "dp=2,zero=1", "--nproc", "2",
            "--steps", "6", "--val-batches", "1", "--checkpoint-dir", str(tmp / name), "--checkpoint-every", "2",
            "--max-restarts", "1", "--metrics-out", str(tmp / f"{name}.jsonl")]
    out = subprocess.run([sys.executable, "-m", "meshscale", *args], capture_output=True, text=True, env=env,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    if fault:
        assert f"resuming from {tmp / name / 'step-00000002'} at step 2 (saved with layout dp=2,zero=1" in out.stdout
    return [json.loads(line) for line in (tmp / f"{name}.jsonl").read_text().splitlines()]


def test_a_killed_rank_is_restarted_and_the_run_finishes_with_the_same_losses(tmp_path):
    (tmp_path / "tiny-odd.json").write_text(json.dumps(SPEC))
    reference = _train(tmp_path, "uninterrupted")
    killed = _train(tmp_path, "killed", "kill@step=3,rank=1")
    assert [r["step"] for r in killed] == list(range(6))
    assert [r["loss"] for r in killed] == [r["loss"] for r in reference]


def test_restarts_that_make_no_progress_are_capped_in_one_line_and_each_restart_says_why(tmp_path):
    """A failure before the next save in every attempt: rank 1 raises in attempt 0, is SIGKILLed in the next
    ones. Attempt 1 resumes from step 2 (progress: attempt 0 started from nothing), attempt 2 from step 2
    again. One launch; with --max-no-progress-restarts 0 that restart stops the run (exit 2, one line), long
    before --max-restarts 5 is spent; each restart first names its cause (before: nothing said why)."""
    (tmp_path / "tiny-odd.json").write_text(json.dumps(SPEC))
    fault = ";".join(["raise@step=3,rank=1,attempt=0"] + [f"kill@step=3,rank=1,attempt={a}" for a in range(1, 6)])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MESHSCALE_FAULT": fault}
    args = ["train", "--model", str(tmp_path / "tiny-odd.json"), "--nproc", "2", "--steps", "6", "--val-batches",
            "1", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "2", "--max-restarts", "5",
            "--max-no-progress-restarts", "0"]
    out = subprocess.run([sys.executable, "-m", "meshscale", *args], capture_output=True, text=True, env=env,
                         timeout=600, cwd=ROOT)
    restart = "; restarting the workers from the newest checkpoint (restart {} of 5)"
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "meshscale: rank 1 failed: RuntimeError: failure injected by MESHSCALE_FAULT at step 3 on rank 1"
        + restart.format(1),
        "meshscale: rank 1 was killed by SIGKILL" + restart.format(2),
        f"meshscale: 1 restart in a row resumed from {tmp_path / 'ck' / 'step-00000002'} without a newer "
        "checkpoint being saved (--max-no-progress-restarts 0): stopped; the failure recurs before the next save "
        "(fix its cause, or save more often with --checkpoint-every)"], out.stderr[-3000:]
    assert out.stdout.count(f"resuming from {tmp_path / 'ck' / 'step-00000002'} at step 2") == 2  # attempts 1, 2
    assert [p.name for p in sorted((tmp_path / "ck").glob("step-*"))] == ["step-00000002"]
    # the count lives beside the checkpoints (an outer torchrun's restarts keep it too)
    assert [json.loads(line) for line in (tmp_path / "ck" / PROGRESS).read_text().splitlines()] == [
        {"attempt": 0, "resumed": 0}, {"attempt": 1, "resumed": 2}, {"attempt": 2, "resumed": 2}]


def test_the_count_of_restarts_survives_an_outer_launcher_and_a_new_launch_starts_it_again(tmp_path, monkeypatch):
    """Under `torchrun --max-restarts`, every attempt is a new process: nothing in memory carries the count.
    Each call here is one attempt's rank 0 (torchelastic numbers attempts in TORCHELASTIC_RESTART_COUNT)."""
    from meshscale.runtime.resilience.restarts import GaveUp, check_progress

    monkeypatch.setenv("RANK", "0")
    ck = str(tmp_path / "ck")

    def attempt(n: int, resumed: int, cap: int = 1) -> None:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(n))
        check_progress(ck, resumed, cap, f"step {resumed}")

    attempt(0, 0)
    attempt(1, 2)
    attempt(2, 2)  # one restart without progress: within the cap
    with pytest.raises(GaveUp, match="^2 restarts in a row resumed from step 2 without a newer checkpoint"):
        attempt(3, 2)
    attempt(0, 2)  # the job launched again: its first attempt is not a restart
    attempt(1, 2)


def test_a_launch_names_the_killed_rank_not_the_peer_that_lost_it(tmp_path):
    """The failure report of the last attempt, from torchelastic's failures as it builds them (ProcessFailure
    reads a rank's error file when there is one). Rank 1 was SIGKILLed; the launcher then stopped rank 0 with
    SIGTERM before it wrote an error. Before, the report named rank 0 ("rank 0 failed: Signal 15 (SIGTERM)
    received by PID 10")."""
    import signal

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from meshscale.runtime.loop.launch import first_failure

    none = str(tmp_path / "none.json")
    killed = ProcessFailure(local_rank=1, pid=11, exitcode=-signal.SIGKILL, error_file=none)
    stopped = ProcessFailure(local_rank=0, pid=10, exitcode=-signal.SIGTERM, error_file=none)
    assert first_failure(ChildFailedError("train", {1: killed, 0: stopped})) == "rank 1 was killed by SIGKILL"
    raised = tmp_path / "1.json"  # rank 1 raised: its whole error
    raised.write_text(json.dumps({"message": "Traceback ...\nValueError: bad batch", "timestamp": 1,
                                  "meshscale_t": 1.2}))
    failed = ProcessFailure(local_rank=1, pid=11, exitcode=1, error_file=str(raised))
    assert first_failure(ChildFailedError("train", {1: failed, 0: stopped})) == \
        "rank 1 failed: Traceback ...\nValueError: bad batch"


def test_only_the_latest_restarts_from_one_step_count_as_no_progress():
    from meshscale.runtime.resilience.restarts import no_progress_restarts

    assert no_progress_restarts([0]) == 0
    assert no_progress_restarts([0, 2]) == 0
    assert no_progress_restarts([0, 2, 2]) == 1
    assert no_progress_restarts([0, 0, 0]) == 2  # no checkpoint is ever reached
    assert no_progress_restarts([2, 2, 4, 4, 4]) == 2
    assert no_progress_restarts([2, 2, 4]) == 0


def test_an_error_file_is_whole_or_absent_when_its_writer_is_stopped_midway(tmp_path, monkeypatch, capsys):
    """The agent reads every error file once it has stopped the workers; a worker stopped while it wrote its
    file (here: the write raises partway) must leave none rather than one torchelastic cannot parse."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from meshscale.runtime.resilience import restarts

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))

    def stopped(obj, f):
        f.write('{"message": ')
        f.flush()
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(restarts.json, "dump", stopped)
        with pytest.raises(KeyboardInterrupt):
            restarts.leave_error("rank 1 failed", 1.5)
    assert not error_file.exists()
    ProcessFailure(local_rank=1, pid=1, exitcode=-9, error_file=str(error_file))  # torch's reader: no file, no raise

    restarts.leave_error("rank 1 failed", 1.5)
    read = ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(error_file))
    assert read.message == "rank 1 failed" and read.error_file_data["meshscale_t"] == 1.5
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]

    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    restarts.leave_error("no launcher", 2.0)
    assert capsys.readouterr().err == "meshscale: error: no launcher\n"
