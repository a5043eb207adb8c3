"""Preemption: SIGTERM or SIGINT (what SLURM and Kubernetes send a job before they kill it, and Ctrl-C) and
--time-limit (like Megatron's --exit-duration-in-mins) end a run at a step boundary, with a checkpoint.

The signal handler only notes the signal; in every step the ranks agree, in the step's control all-reduce
(guards.Control), whether any of them was signalled or passed the deadline, so every rank
finishes the same step, saves it and stops together. A second signal ends the process at once (exit 128 +
signal number), for a user who will not wait.

Exit code EXIT_PREEMPTED (75, sysexits' EX_TEMPFAIL: "try again later") with one line: the run stopped early
at a step boundary; rerun the same command to resume from the checkpoint it saved. Under the local
launcher the workers exit 0 (a failure would be restarted) and leave the line in MESHSCALE_STATUS_FILE,
which the launcher prints and turns into the exit code.

Under the local launcher the workers keep SIGTERM's default action: torchelastic sends SIGTERM to stop them
after another worker failed, and a Python handler would only run once the collective the worker waits in
returns, which with a dead peer is never. The launcher instead passes its own SIGTERM/SIGINT on as SIGUSR1
(FORWARDED), with the original signal's name in the file MESHSCALE_PREEMPT_FILE names.
"""

import json
import os
import signal
import threading
import time

EXIT_PREEMPTED = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEADLINE_ENV = "MESHSCALE_DEADLINE"  # absolute time (epoch seconds) set once by the first process of a run
STATUS_ENV = "MESHSCALE_STATUS_FILE"  # where a worker of the local launcher leaves its stop line
FORWARDED = signal.SIGUSR1  # the local launcher's preemption request to its workers
PREEMPT_ENV = "MESHSCALE_PREEMPT_FILE"  # set by the local launcher: the name of the signal it received


class Preempted(Exception):
    """Every rank finished its step and saved (when the run has a --checkpoint-dir); the message is the line."""


def set_deadline(time_limit: float) -> None:
    """Fix the deadline in the environment once, where the run starts: a worker restarted by the launcher
    keeps the job's deadline instead of starting its own clock."""
    if time_limit and DEADLINE_ENV not in os.environ:
        os.environ[DEADLINE_ENV] = repr(time.time() + time_limit)


class Preemption:
    """Notes SIGTERM/SIGINT while installed (a context manager) and says this rank's request (`code`); the
    step's control all-reduce makes it every rank's."""

    def __init__(self, time_limit: float):
        """time_limit: seconds from now, unless the job's deadline is already in the environment (0: none)."""
        self.signal: str | None = None
        deadline = os.environ.get(DEADLINE_ENV)
        self.deadline = float(deadline) if deadline else (time.time() + time_limit if time_limit else None)
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # Python delivers signals there only
            mine = (FORWARDED,) if os.environ.get(PREEMPT_ENV) else SIGNALS
            self._previous = {s: signal.signal(s, self._on_signal) for s in mine}
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _on_signal(self, signum: int, frame) -> None:
        if self.signal is not None:  # the second one: no more waiting
            os._exit(128 + signum)
        self.signal = launcher_signal() if signum == FORWARDED else signal.Signals(signum).name

    def code(self) -> int:
        """This rank's request: 0 none, 1 + the signal's index in SIGNALS, or len(SIGNALS) + 1 for the deadline."""
        if self.signal is not None:
            return 1 + SIGNALS.index(getattr(signal, self.signal))
        if self.deadline is not None and time.time() >= self.deadline:
            return len(SIGNALS) + 1
        return 0


def reason(code: int) -> str | None:
    """The highest `Preemption.code` of the ranks as the stop's reason (None: go on)."""
    if code == 0:
        return None
    return SIGNALS[code - 1].name if code <= len(SIGNALS) else "time limit"


def launcher_signal() -> str:
    """The name of the signal the local launcher received (FORWARDED to its workers)."""
    try:
        with open(os.environ[PREEMPT_ENV]) as f:
            return f.read().strip() or "SIGTERM"
    except (OSError, KeyError):
        return "SIGTERM"


def stop_line(reason: str, step: int, saved, time_limit: float) -> str:
    why = f"--time-limit {time_limit:g} s reached" if reason == "time limit" else f"{reason} received"
    if saved is None:
        return (f"{why}: stopped after {step} steps; nothing saved (no --checkpoint-dir), exit code "
                f"{EXIT_PREEMPTED}")
    return (f"{why}: stopped after {step} steps and saved {saved}; run the same command to resume "
            f"(exit code {EXIT_PREEMPTED})")


def leave_status(line: str, code: int = EXIT_PREEMPTED) -> None:
    """A local launcher's worker: leave the line and the run's exit code for the launcher (rank 0 only calls
    this)."""
    path = os.environ.get(STATUS_ENV)
    if path:
        with open(path, "w") as f:
            json.dump({"line": line, "code": code}, f)


def read_status(path: str) -> tuple[str, int] | None:
    """(line, exit code) a worker left, or None."""
    try:
        with open(path) as f:
            status = json.load(f)
        return status["line"], int(status.get("code", EXIT_PREEMPTED))
    except (OSError, ValueError, KeyError):
        return None
