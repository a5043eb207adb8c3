"""Hang detection: every rank's heartbeat in the c10d store, and a watchdog thread that ends the rank when its
training loop has made no progress for --timeout seconds.

The training loop marks its progress (`beat(step, phase)`), loading and saving checkpoints and evaluating
included; a daemon thread publishes it once per interval,
with the number of collectives the comm ledger recorded in this step and the last of them. A rank that has not
moved for `timeout` seconds (it is stuck, or it waits in a collective a stuck peer never joins) reads every
rank's heartbeat, names the rank that is behind or silent and where the others wait, writes that one line as
its error, and exits; the launcher then stops every worker. A save, a load or the evaluation may take longer
than a step: each has its own timeout (Sections). The process group's own timeout is set longer (2x the
longest) as a backstop, so the watchdog's diagnosis is what the user sees.
"""

import json
import os
import threading
import time
from collections import Counter

from meshscale.runtime.resilience.restarts import leave_error

PHASES = ("load", "start", "forward/backward", "gradient norm", "guards", "optimizer", "sdc check", "save",
          "evaluate")
SECTION_FLOOR_S = 600.0  # a section's derived timeout never falls below torch's default process-group timeout


class Sections:
    """How long each phase may go without progress. A step's phases: --timeout. Save, load and evaluate are
    sections with their own timeouts, since one of them can legitimately take longer than a step: the flag
    (--save-timeout, --load-timeout, --eval-timeout) when given, else derived from what this run observed:
    max(--timeout, SECTION_FLOOR_S, 5 x the section's longest duration so far)."""

    FLAGS = {"save": "save_timeout", "load": "load_timeout", "evaluate": "eval_timeout"}

    def __init__(self, cfg):
        self.step = cfg.timeout
        self.given = {phase: getattr(cfg, key) for phase, key in self.FLAGS.items()}
        self.longest: dict[str, float] = {}

    def limit(self, phase: str) -> tuple[float, str]:
        """(seconds, the flag that sets them) for `phase`."""
        if phase not in self.FLAGS:
            return self.step, "--timeout"
        flag = "--" + self.FLAGS[phase].replace("_", "-")
        if self.given[phase]:
            return self.given[phase], flag
        return max(self.step, SECTION_FLOOR_S, 5 * self.longest.get(phase, 0.0)), f"{flag} (derived)"

    def observed(self, phase: str, seconds: float) -> None:
        self.longest[phase] = max(self.longest.get(phase, 0.0), seconds)

    @staticmethod
    def longest_possible(cfg) -> float:
        """The longest any phase may stall before the watchdog reports it, as far as known before the run
        (a derived section timeout may grow past it): what the process group's own timeout must exceed."""
        return max(cfg.timeout, SECTION_FLOOR_S, *(getattr(cfg, key) for key in Sections.FLAGS.values()))


class Watchdog:
    def __init__(self, store, rank: int, world: int, sections: Sections, ledger):
        import torch.distributed as dist

        self.store = dist.PrefixStore("meshscale/heartbeat/", store)
        self.rank, self.world, self.sections, self.ledger = rank, world, sections, ledger
        self.interval = min(1.0, sections.step / 10)
        self._state = (-1, "start", time.time())  # (step, phase, since): replaced whole, read by the thread
        self._base = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meshscale-watchdog", daemon=True)

    def __enter__(self):
        if not self._thread.is_alive():  # started early (to watch the load) or here
            self._publish()
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def beat(self, step: int, phase: str) -> None:
        if step != self._state[0]:
            self._base = len(self.ledger.records)  # where this step's collectives begin
        self._state = (step, phase, time.time())

    def _heartbeat(self) -> dict:
        step, phase, since = self._state
        records = self.ledger.records
        calls = len(records) - self._base
        last = f"{records[-1]['axis']} {records[-1]['collective']}" if calls > 0 else None
        return {"step": step, "phase": phase, "since": since, "alive": time.time(), "calls": calls, "last": last}

    def _publish(self) -> None:
        self.store.set(str(self.rank), json.dumps(self._heartbeat()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._publish()
            except (RuntimeError, OSError):  # the store is gone: the job is ending
                return
            limit, flag = self.sections.limit(self._state[1])
            if time.time() - self._state[2] > limit:
                self._fail(self._diagnose(limit, flag))

    def _diagnose(self, limit: float, flag: str) -> str:
        beats = {}
        for r in range(self.world):
            try:
                beats[r] = json.loads(self.store.get(str(r))) if self.store.check([str(r)]) else None
            except (RuntimeError, OSError):
                beats[r] = None
        return diagnose(beats, time.time(), limit, 5 * self.interval, flag)

    def _fail(self, message: str) -> None:
        """Report like a failing worker (the launcher shows the first one, once) and end this process: the
        main thread may be blocked in a collective that never returns."""
        leave_error(message, time.time())
        os._exit(1)


def _progress(beat: dict) -> tuple:
    return beat["step"], PHASES.index(beat["phase"]), beat["calls"]


def _where(beat: dict) -> str:
    last = f", last collective {beat['last']}" if beat["last"] else ""
    return f"step {beat['step']} in {beat['phase']}{last}"


def _ranks(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def diagnose(beats: dict, now: float, timeout: float, stale_s: float, flag: str = "--timeout") -> str:
    """One line naming the stuck rank(s) from every rank's last heartbeat (None: never published).

    Silent ranks (no heartbeat for `stale_s`: dead or frozen) are stuck. Otherwise ranks are ordered by
    progress (step, phase, collectives this step): the ranks off the strict majority are stuck (behind: never
    reached the collective the others wait in; ahead: skipped one); with no majority, those furthest behind."""
    silent = [r for r, b in beats.items() if b is None or now - b["alive"] > stale_s]
    alive = {r: b for r, b in beats.items() if r not in silent}
    if silent:
        stuck, why = silent, "sent no heartbeat for more than the timeout (dead or frozen)"
    else:
        counts = Counter(_progress(b) for b in alive.values())
        common, n = counts.most_common(1)[0]
        if len(counts) == 1:
            stuck, why = [], ""
        elif n * 2 > len(alive):
            stuck = [r for r, b in alive.items() if _progress(b) != common]
        else:
            behind = min(counts)
            stuck = [r for r, b in alive.items() if _progress(b) == behind]
        if stuck:
            b = alive[stuck[0]]
            why = f"made no progress for {now - b['since']:.0f} s at {_where(b)}"
    others = [r for r in alive if r not in stuck]
    if not stuck:
        b = alive[others[0]]
        return (f"hang: no rank made progress for more than {flag} {timeout:g} s, all at {_where(b)}; "
                "none is behind the others (a collective or computation that never finishes)")
    waiting = f"; {_ranks(others)} waited at {_where(alive[others[0]])}" if others else ""
    setting = flag.split()[0]
    return (f"hang: {_ranks(stuck)} {why}{waiting}; stopped after {flag} {timeout:g} s "
            f"(raise {setting} if this phase legitimately takes longer)")
