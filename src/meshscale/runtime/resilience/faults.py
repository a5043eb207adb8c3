"""Fault injection, for tests and demos: one environment variable describes what goes wrong, where and when.

    MESHSCALE_FAULT="kill@step=7,rank=1"            SIGKILL rank 1 when it starts step 7
    MESHSCALE_FAULT="raise@step=3"                   rank 0 raises at step 3
    MESHSCALE_FAULT="hang@step=5,rank=1"             rank 1 stops making progress (sleeps) at step 5
    MESHSCALE_FAULT="slow@step=2,rank=1,factor=3"    rank 1 becomes a straggler from step 2 on (3x its step)
    MESHSCALE_FAULT="nan@step=4,rank=1"              rank 1's loss turns NaN at step 4 (its gradients follow)
    MESHSCALE_FAULT="nan@step=4,rank=1,param=3"      rank 1's gradient of local parameter 3 turns NaN
    MESHSCALE_FAULT="nan@step=4,rank=1,times=2"      ... and again when the step is replayed (persistent)
    MESHSCALE_FAULT="bitflip@step=6,rank=1,bit=30"   rank 1 flips one bit of one parameter after step 6
    MESHSCALE_FAULT="slowsave@step=3,rank=1,seconds=20"  rank 1 spends 20 s more in the save after step 3
    MESHSCALE_FAULT="spike@step=30,factor=20"        rank 0's loss (so its gradients) x 20 at step 30

`param` is an index among the rank's local parameters or a parameter name (e.g. `norm.weight`).
Several faults are separated by ';'. A fault fires in the first attempt of a run only (`attempt=N` picks
another restart), so a run restarted after an injected crash does not crash again at the same step.
"""

import os
import signal
import time
from dataclasses import dataclass

from meshscale.errors import UserError

KINDS = ("kill", "raise", "hang", "slow", "nan", "bitflip", "slowsave", "spike")
ENV = "MESHSCALE_FAULT"
_NUMBERS = {"step": int, "rank": int, "attempt": int, "times": int, "factor": float, "bit": int, "seconds": float}


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int = 0
    attempt: int = 0
    factor: float = 2.0  # slow: the step takes this many times as long; spike: the loss is multiplied by it
    bit: int = 30  # bitflip: which bit of the float32 (30: the exponent's top bit, a large change)
    param: int | str | None = None  # bitflip (default 0), nan (default: the loss): index or name
    times: int = 1  # nan: how many runs of the step it fires in (a replay runs the step again)
    seconds: float = 0.0  # slowsave: the time added to the save

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
            if not sep or (key not in _NUMBERS and key != "param"):
                raise UserError(f"{ENV}: {pair!r} in {item!r} is not one of step=, rank=, attempt=, times=, "
                                "factor=, bit=, seconds=, param=")
            if key == "param":
                values[key] = int(raw) if raw.isdigit() else raw
                continue
            try:
                values[key] = _NUMBERS[key](raw)
            except ValueError:
                raise UserError(f"{ENV}: {key} must be a number, got {raw!r} in {item!r}") from None
        if "step" not in values:
            raise UserError(f"{ENV}: {item!r} needs step=N (example: {kind}@step=7,rank=1)")
        faults.append(Fault(kind, **values))
    return faults


def from_env(environ=os.environ) -> list[Fault]:
    return parse(environ.get(ENV, ""))


def _pick(named_params: list, which: int | str) -> tuple:
    """(name, parameter) by index among `named_params` or by name."""
    if isinstance(which, int):
        return named_params[which % len(named_params)]
    for name, p in named_params:
        if name == which:
            return name, p
    raise UserError(f"{ENV}: no parameter named {which!r} on this rank; names look like "
                    f"{named_params[0][0]!r} (or give an index)")


def _local(p):
    data = p.data
    return data.to_local() if hasattr(data, "to_local") else data


class Injector:
    """The faults meant for this rank in this attempt; the trainer asks at each step which ones fire."""

    def __init__(self, faults: list[Fault], rank: int, attempt: int | None = None):
        if attempt is None:  # torchelastic counts restarts of the worker group
            attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.faults = [f for f in faults if f.rank == rank and f.attempt == attempt]
        self.rank = rank
        self._runs: dict[Fault, int] = {}  # how often each nan fault's step has started
        self._nan: list[Fault] = []  # the nan faults firing in the run of the step under way
        self._scale = 1.0  # a spike's factor in the step under way
        self._flipped: set[Fault] = set()  # bit flips fire once, even when a rollback reruns their step

    def due(self, step: int, kind: str) -> Fault | None:
        """The fault of `kind` that fires at `step` (slow: every step from its own on)."""
        for f in self.faults:
            if f.kind == kind and (f.step == step or (kind == "slow" and step >= f.step)):
                return f
        return None

    def at_step_start(self, step: int) -> None:
        """Process-level faults: die, raise or stop making progress as this step (or its replay) begins;
        and arm the NaN faults of this run of the step."""
        if self.due(step, "kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.due(step, "raise"):
            raise RuntimeError(f"failure injected by {ENV} at step {step} on rank {self.rank}")
        if self.due(step, "hang"):
            while True:  # a stuck rank: alive, silent, never reaching its next collective
                time.sleep(3600)
        self._nan = []
        spike = self.due(step, "spike")
        self._scale = spike.factor if spike else 1.0
        for f in self.faults:
            if f.kind == "nan" and f.step == step:
                self._runs[f] = self._runs.get(f, 0) + 1
                if self._runs[f] <= f.times:
                    self._nan.append(f)

    def straggle(self, step: int, elapsed_s: float) -> None:
        """A straggler: stretch this rank's step to `factor` times what it took."""
        fault = self.due(step, "slow")
        if fault:
            time.sleep(max(0.0, (fault.factor - 1) * elapsed_s))

    def slow_save(self, step: int) -> None:
        """A slow disk: the save after `step` takes `seconds` longer on this rank."""
        fault = self.due(step, "slowsave")
        if fault:
            time.sleep(fault.seconds)

    def corrupt_loss(self, loss):
        """NaN the loss when a loss NaN fault is armed, scale it by a spike's factor; backward then carries it
        into the gradients."""
        return loss * float("nan") if any(f.param is None for f in self._nan) else loss * self._scale

    def wrap_loss(self, loss_fn):
        """`loss_fn`, corrupted by this rank's loss NaN and spike faults (unchanged when it has none)."""
        if not any((f.kind == "nan" and f.param is None) or f.kind == "spike" for f in self.faults):
            return loss_fn
        return lambda logits, targets: self.corrupt_loss(loss_fn(logits, targets))

    def arm_gradients(self, named_params: list) -> None:
        """Hook the parameters named by gradient NaN faults. Register before any gradient check: tensor hooks
        run in registration order, so the check sees the corrupted gradient before the reduce does."""
        for fault in self.faults:
            if fault.kind != "nan" or fault.param is None:
                continue
            name, p = _pick(named_params, fault.param)
            if hasattr(p, "to_local"):
                raise UserError(f"{ENV}: a gradient NaN (param=) needs a layout with zero<3 (FSDP computes "
                                f"gradients of gathered copies); use nan@step={fault.step} for the loss")
            p.register_hook(lambda grad, f=fault: grad * float("nan") if f in self._nan else None)

    def flip_bit(self, step: int, named_params: list) -> str | None:
        """Flip one bit of one float32 parameter element in place (silent data corruption); returns what was
        flipped, for the log."""
        import torch

        fault = self.due(step, "bitflip")
        if not fault or not named_params or fault in self._flipped:
            return None
        self._flipped.add(fault)
        name, p = _pick(named_params, 0 if fault.param is None else fault.param)
        data = _local(p)
        if data.dtype != torch.float32 or data.numel() == 0:
            raise UserError(f"{ENV}: bitflip needs a float32 parameter, {name} is {data.dtype}")
        flat = data.view(-1).view(torch.int32)
        flat[0] ^= (1 << fault.bit) if fault.bit < 31 else -(1 << 31)
        return f"bit {fault.bit} of element 0 of {name} flipped on rank {self.rank} ({ENV})"

