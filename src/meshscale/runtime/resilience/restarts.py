"""Bounded recovery across restarts: a failure that comes back before the next checkpoint would restart the
worker group until --max-restarts is spent, each attempt redoing the same steps. NVIDIA's fault-tolerance
launcher (nvidia-resiliency-ext, `max_no_progress_restarts`) caps such restarts; so do we.

A restart makes no progress when it resumes from the same checkpoint (or from none) as the attempt before
it. Rank 0 of every (re)started group appends the step it resumed from to PROGRESS in the checkpoint
directory: beside the checkpoints, not in any process's memory, so the count survives the restarts of the
local launcher and of an outer `torchrun --max-restarts` alike (torchelastic numbers the attempts in
TORCHELASTIC_RESTART_COUNT; attempt 0, a new launch, starts the file again). When the trailing restarts
without progress exceed the cap, every rank stops with one line (under the local launcher: exit code 2).

The launcher also says why it restarts: `Failures` reads what torchelastic's agent logs when a worker group
fails (the first failed worker's local rank and exit code) and the worker's error file, and prints one line
per restart naming the rank, its signal or exit code, and the last line of its error.
"""

import json
import logging
import os
import signal
import sys
from pathlib import Path

from meshscale.parallel.mesh import from_every_rank

PROGRESS = "meshscale.restarts.jsonl"  # in the checkpoint directory: one JSON line per attempt of a launch
EXIT_GAVE_UP = 2


class GaveUp(Exception):
    """Every rank stops: restarting again would redo the same work. The message is the line."""


def no_progress_restarts(resumed: list[int]) -> int:
    """How many of the latest restarts resumed from the same step as the attempt before each (`resumed`: the
    step each attempt resumed from, the first attempt first)."""
    count = 0
    for before, now in zip(reversed(resumed[:-1]), reversed(resumed)):
        if now != before:
            break
        count += 1
    return count


def check_progress(checkpoint_dir: str | None, resumed_from: int, cap: int, where: str) -> None:
    """Collective, in every (re)started worker group of an elastic launcher (local or an outer torchrun):
    record where this attempt resumed (rank 0) and raise GaveUp on every rank when the restarts without
    progress exceed `cap`. `where`: what the attempt resumed from, for the line."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or not checkpoint_dir:  # no launcher restarts this process, or nothing to resume from
        return
    line = None
    if os.environ.get("RANK", "0") == "0":
        path = Path(checkpoint_dir) / PROGRESS
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w" if attempt == "0" else "a") as f:
            f.write(json.dumps({"attempt": int(attempt), "resumed": resumed_from}) + "\n")
        with open(path) as f:
            resumed = [json.loads(row)["resumed"] for row in f]
        stuck = no_progress_restarts(resumed)
        if stuck > cap:
            line = (f"{stuck} restart{'s' if stuck > 1 else ''} in a row resumed from {where} without a newer "
                    f"checkpoint being saved (--max-no-progress-restarts {cap}): stopped; the failure recurs "
                    "before the next save (fix its cause, or save more often with --checkpoint-every)")
    line = from_every_rank(line)[0]
    if line is not None:
        raise GaveUp(line)


def failure_line(rank: int, exitcode: int, message: str | None, whole: bool = False) -> str:
    """What happened to a failed worker: its signal, or its exit code and error (the last line of it, or
    all of it with `whole`). `message`: from the error file a worker writes when it raises (None: none)."""
    if message:
        return f"rank {rank} failed: {message.strip() if whole else message.strip().splitlines()[-1]}"
    if exitcode < 0:
        try:
            return f"rank {rank} was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"rank {rank} was killed by signal {-exitcode}"
    return f"rank {rank} exited with code {exitcode} without an error message"


def first_cause(first: int, exitcode: int, errors: dict[int, dict], whole: bool = False) -> str:
    """The failure that started it, as failure_line says it. `first`, `exitcode`: the rank torchelastic saw
    fail first and its exit code; `errors`: rank -> the data of the error file it wrote. A rank that died
    without writing one (a signal) is the cause when torchelastic saw it first: a rank that raises waits
    before it writes its error and exits (launch.py), so a rank whose peer vanished mid-collective is
    stopped before it says anything. Otherwise the error raised first (by its `meshscale_t`) is."""
    if "meshscale_t" not in errors.get(first, {}):
        return failure_line(first, exitcode, None)
    rank = min((e["meshscale_t"], r) for r, e in errors.items() if "meshscale_t" in e)[1]
    return failure_line(rank, 1, str(errors[rank]["message"]), whole)


def leave_error(message: str, raised: float) -> None:
    """Leave this worker's failure (`raised`: when, by time.time()) where first_cause reads it: torchelastic's
    error file, else stderr. The file appears whole or not at all: once one worker fails, the agent stops the
    others and then reads every error file there is, so a worker stopped between creating its file and
    writing it would leave an empty one, which torchelastic fails to parse (a traceback instead of the line)."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        print(f"meshscale: error: {message}", file=sys.stderr, flush=True)
        return
    partial = f"{error_file}.partial"
    with open(partial, "w") as f:
        json.dump({"message": message, "timestamp": int(raised), "meshscale_t": raised}, f)
    os.replace(partial, error_file)


class Failures(logging.Handler):
    """Says why the local launcher restarts its workers, in one line per restart. torchelastic's agent logs
    the first failed worker of a group (torch.distributed.elastic.multiprocessing.api, ERROR: "failed
    (exitcode: %s) local_rank: %s (pid: %s) of binary: %s") and then, with restarts left, that it restarts
    the group (torch.distributed.elastic.agent.server.api, INFO: "[%s] Worker group %s. %s/%s attempts left;
    will restart worker group"); the workers' error files are under `log_dir` (torchelastic's layout:
    <run>/attempt_<N>/<local rank>/error.json)."""

    LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api")

    def __init__(self, log_dir: str, first_rank: int):
        super().__init__(logging.INFO)
        self.log_dir, self.first_rank = Path(log_dir), first_rank  # first_rank: this node's local rank 0
        self.attempt = 0
        self.failed: tuple[int, int] | None = None  # (rank, exit code) torchelastic saw fail first

    def install(self) -> None:
        for name in self.LOGGERS:  # ours only: nothing of torchelastic's own reaches the terminal
            logger = logging.getLogger(name)
            for old in [h for h in logger.handlers if isinstance(h, Failures)]:  # an earlier launch's, in-process
                logger.removeHandler(old)
            logger.addHandler(self)
            logger.propagate = False
            logger.setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        msg, args = str(record.msg), record.args if isinstance(record.args, tuple) else ()
        if msg.startswith("failed (exitcode:") and len(args) >= 2:
            self.failed = (self.first_rank + int(args[1]), int(args[0]))  # (rank, exit code)
        elif msg.endswith("will restart worker group") and len(args) >= 4:  # (role, state, left, most)
            if self.failed is not None:
                print(f"meshscale: {self.cause(*self.failed)}; restarting the workers from the newest checkpoint "
                      f"(restart {int(args[3]) - int(args[2]) + 1} of {args[3]})", file=sys.stderr, flush=True)
            self.attempt, self.failed = self.attempt + 1, None

    def cause(self, rank: int, exitcode: int) -> str:
        errors = {}
        for f in self.log_dir.glob(f"*/attempt_{self.attempt}/*/error.json"):
            try:
                errors[self.first_rank + int(f.parent.name)] = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
        return first_cause(rank, exitcode, errors)
