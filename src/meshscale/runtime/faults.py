"""Fault injection, for tests and demos: one environment variable describes what goes wrong, where and when.

    MESHSCALE_FAULT="kill@step=7,rank=1"            SIGKILL rank 1 when it starts step 7
    MESHSCALE_FAULT="raise@step=3"                   rank 0 raises at step 3
    MESHSCALE_FAULT="hang@step=5,rank=1"             rank 1 stops making progress (sleeps) at step 5
    MESHSCALE_FAULT="slow@step=2,rank=1,factor=3"    rank 1 becomes a straggler from step 2 on (3x its step)
    MESHSCALE_FAULT="nan@step=4,rank=1"              rank 1's loss turns NaN at step 4
    MESHSCALE_FAULT="bitflip@step=6,rank=1,bit=30"   rank 1 flips one bit of one parameter at step 6

Several faults are separated by ';'. A fault fires in the first attempt of a run only (`attempt=N` picks
another restart), so a run restarted after an injected crash does not crash again at the same step.
"""

import os
import signal
import time
from dataclasses import dataclass

from meshscale.errors import UserError

KINDS = ("kill", "raise", "hang", "slow", "nan", "bitflip")
ENV = "MESHSCALE_FAULT"


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int = 0
    attempt: int = 0
    factor: float = 2.0  # slow: the step takes this many times as long
    bit: int = 30  # bitflip: which bit of the float32 (30: the exponent's top bit, a large change)
    param: int = 0  # bitflip: index of the parameter among the rank's local parameters

    def __str__(self) -> str:
        return f"{self.kind}@step={self.step},rank={self.rank}"


def parse(text: str) -> list[Fault]:
    """Faults from the variable's text; bad text is a UserError naming the form."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        kind, _, args = item.partition("@")
        if kind not in KINDS:
            raise UserError(f"{ENV}: unknown fault {kind!r} in {item!r}; kinds: {', '.join(KINDS)} "
                            "(example: kill@step=7,rank=1)")
        values: dict = {}
        for pair in filter(None, args.split(",")):
            key, sep, raw = pair.partition("=")
            if not sep or key not in ("step", "rank", "attempt", "factor", "bit", "param"):
                raise UserError(f"{ENV}: {pair!r} in {item!r} is not one of step=, rank=, attempt=, factor=, "
                                "bit=, param=")
            try:
                values[key] = float(raw) if key == "factor" else int(raw)
            except ValueError:
                raise UserError(f"{ENV}: {key} must be a number, got {raw!r} in {item!r}") from None
        if "step" not in values:
            raise UserError(f"{ENV}: {item!r} needs step=N (example: {kind}@step=7,rank=1)")
        faults.append(Fault(kind, **values))
    return faults


def from_env(environ=os.environ) -> list[Fault]:
    return parse(environ.get(ENV, ""))


class Injector:
    """The faults meant for this rank in this attempt; the trainer asks at each step which ones fire."""

    def __init__(self, faults: list[Fault], rank: int, attempt: int | None = None):
        if attempt is None:  # torchelastic counts restarts of the worker group
            attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.faults = [f for f in faults if f.rank == rank and f.attempt == attempt]
        self.rank = rank

    def due(self, step: int, kind: str) -> Fault | None:
        """The fault of `kind` that fires at `step` (slow: every step from its own on)."""
        for f in self.faults:
            if f.kind == kind and (f.step == step or (kind == "slow" and step >= f.step)):
                return f
        return None

    def at_step_start(self, step: int) -> None:
        """Process-level faults: die, raise or stop making progress as this step begins."""
        if self.due(step, "kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.due(step, "raise"):
            raise RuntimeError(f"failure injected by {ENV} at step {step} on rank {self.rank}")
        if self.due(step, "hang"):
            while True:  # a stuck rank: alive, silent, never reaching its next collective
                time.sleep(3600)

    def straggle(self, step: int, elapsed_s: float) -> None:
        """A straggler: stretch this rank's step to `factor` times what it took."""
        fault = self.due(step, "slow")
        if fault:
            time.sleep(max(0.0, (fault.factor - 1) * elapsed_s))

    def corrupt_loss(self, step: int, loss):
        """NaN the loss at `step` (the gradients follow from it)."""
        return loss * float("nan") if self.due(step, "nan") else loss

    def flip_bit(self, step: int, params: list) -> str | None:
        """Flip one bit of one float32 parameter element in place (silent data corruption); returns what was
        flipped, for the log."""
        import torch

        fault = self.due(step, "bitflip")
        if not fault or not params:
            return None
        p = params[fault.param % len(params)]
        data = p.data if not hasattr(p.data, "to_local") else p.data.to_local()
        if data.dtype != torch.float32 or data.numel() == 0:
            raise UserError(f"{ENV}: bitflip needs a float32 parameter, parameter {fault.param} is {data.dtype}")
        flat = data.view(-1).view(torch.int32)
        flat[0] ^= (1 << fault.bit) if fault.bit < 31 else -(1 << 31)
        return f"bit {fault.bit} of element 0 of local parameter {fault.param % len(params)}"
