"""Bounded recovery across restarts: a failure that comes back before the next checkpoint would restart the
worker group until --max-restarts is spent, each attempt redoing the same steps. NVIDIA's fault-tolerance
launcher (nvidia-resiliency-ext, `max_no_progress_restarts`) caps such restarts; so do we.

A restart makes no progress when it resumes from the same checkpoint (or from none) as the attempt before
it. Rank 0 of every (re)started group appends the step it resumed from to a file the local launcher names
(PROGRESS_ENV); when the trailing restarts without progress exceed the cap, every rank stops with one line
(exit code 2 from the launcher; the checkpoint is left as it is).
"""

import json
import os

from meshscale.parallel.mesh import from_every_rank

PROGRESS_ENV = "MESHSCALE_PROGRESS_FILE"  # set by the local launcher: one JSON line per attempt
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


def check_progress(resumed_from: int, cap: int, where: str) -> None:
    """Collective, in every (re)started worker group under the local launcher: record where this attempt
    resumed (rank 0) and raise GaveUp on every rank when the restarts without progress exceed `cap`.
    `where`: what the attempt resumed from, for the line."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    line = None
    if os.environ.get("RANK", "0") == "0":
        with open(path, "a") as f:
            f.write(json.dumps({"attempt": attempt, "resumed": resumed_from}) + "\n")
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
