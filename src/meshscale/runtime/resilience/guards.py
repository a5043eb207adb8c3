"""Numerical guards, checked every step after backward and before the optimizer applies the gradients.

Non-finite guard: each rank flags a non-finite local loss, and a non-finite gradient as autograd produces it
on that rank (a tensor hook on every parameter fires before the gradient is accumulated, so before DDP's
bucket all-reduce or ZeRO's reduce-scatter mixes the ranks): the producing rank is known. FSDP2 computes
gradients of gathered copies the hooks do not see; there the local loss and the reduced gradient norm are
checked. Where no collective mixes gradients during backward (pipeline stages alone), the hooks are not
needed: each rank's share of the squared norm, before the sum over stages, is its own.

Spike guard: a loss is a spike when, after `warmup` healthy steps, its log lies more than `sigma` standard
deviations above the mean of the logs of the last `window` healthy values (SpikeRule). ZClip (Kumar et al.
2025) detects gradient-norm spikes with such a z-score (of raw values, EMA statistics); PaLM (Chowdhery et
al. 2022, sec. 5.1) and OPT-175B (Zhang et al. 2022, sec. 2.5 and its logbook) handled the loss spikes they
saw by skipping batches or rolling back. The gradient norm is not held to the rule: clean runs have norm
outliers whose loss stays in line (benchmarks/spike_guard_sweep.py on tiny, lr 3e-3, 2,000 steps, batch 2, 8
and 64, seeds 0-4: the norm's largest z was 8.4-25.5, the loss's 2.8-5.2), so a norm rule that caught real
spikes would stop clean runs. Clipping is the remedy for an exploding norm (Pascanu et al. 2013,
"On the difficulty of training recurrent neural networks", sec. 3.2; ZClip, Kumar et al. 2025, clips on such
a z-score rather than stopping); a non-finite norm is caught by the non-finite guard.

Every rank puts its flags into one all-reduce over all ranks (a control tensor, not ledger traffic), so every
rank reaches the same decision, returned as an `Anomaly` whose `action` the trainer carries out. The same
all-reduce carries the step's other control values (`Control`): each rank's share of the mean loss, its
preemption code and its share of the squared gradient norm, so a step makes one control all-reduce where
Megatron-LM makes one per group the gradient is split over, one for the loss and one for found_inf.
"""

import copy
import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from meshscale.errors import UserError
from meshscale.parallel.strategy import local_part


class TrainingStopped(UserError):
    """The run stopped on an anomaly: reported like bad input, one line and exit code 2."""


@dataclass
class Anomaly:
    step: int
    kind: str  # "nonfinite", "spike" or "sdc"
    message: str  # one line naming the step, the rank(s) and what was seen
    ranks: list
    action: str  # "stop", "skip", "rollback", or "continue" (a clean replay's result was applied)
    replay: str | None = None  # "transient" or "persistent" with --replay-anomalies

    def line(self) -> str:
        replay = {"transient": "; replay clean (transient): the replayed step was applied",
                  "persistent": "; replay reproduced it (persistent)"}.get(self.replay, "")
        action = {"skip": "; optimizer step skipped on every rank",
                  "rollback": "; every rank reloads the newest checkpoint and continues from it",
                  "stop": "; stopped (a step cannot undo a corrupted replica: restart from a checkpoint)"
                  if self.kind == "sdc" else "; stopped (--on-anomaly skip skips such steps instead)"}
        action = action.get(self.action, "")
        return f"{self.message}{replay}{action}"

    def row(self) -> dict:
        return {"kind": self.kind, "message": self.line(), "ranks": self.ranks, "action": self.action,
                "replay": self.replay}


class Control(NamedTuple):
    """What the step's control all-reduce gives every rank alike."""
    loss: float  # the sum of the ranks' loss shares: the global mean loss
    stop: int  # the highest preemption code of any rank (0: go on)
    anomaly: "Anomaly | None"


class GradProbe:
    """Whether this rank's own gradient contributions were finite, summed as autograd produces them."""

    def __init__(self, params: list):
        self.sums: list = []
        for p in params:
            if not hasattr(p, "to_local"):  # FSDP2's sharded parameters never see a backward
                p.register_hook(self._observe)

    def _observe(self, grad: torch.Tensor) -> None:
        # NaN and Inf survive a sum: one reduction per gradient, in fp32, and nothing else in the hook (it runs
        # for every parameter on every micro-batch: ~2 us a call is ~4% of a `tiny` step)
        self.sums.append(grad.detach().sum(dtype=torch.float32))

    def take(self) -> bool:
        """True when a non-finite gradient was seen since the last call."""
        bad = bool(self.sums) and not bool(torch.isfinite(torch.stack(self.sums).sum()))
        self.sums = []
        return bad


@dataclass
class SpikeRule:
    """log(value) > mean + sigma * max(std, 0.05) of the logs of the last `window` healthy values, after
    `warmup` of them. Logs, because losses and gradient norms vary by factors: with a small batch the norm's
    noise alone doubles it now and then, and a z-score of raw values would call that a spike; the 0.05 floor
    (5%) keeps a flat history from turning noise into spikes. Defaults: 6 sigma over 100 steps."""
    sigma: float = 6.0
    window: int = 100
    warmup: int = 20

    def __post_init__(self):
        self.history: deque = deque(maxlen=self.window)

    def _stats(self) -> tuple[float, float] | None:
        """(mean, floored std) of the logs in the window; None during the warm-up."""
        if len(self.history) < self.warmup:
            return None
        n = len(self.history)
        mean = sum(self.history) / n
        return mean, max(math.sqrt(sum((v - mean) ** 2 for v in self.history) / n), 0.05)

    def threshold(self) -> float | None:
        stats = self._stats()
        return None if self.sigma <= 0 or stats is None else math.exp(stats[0] + self.sigma * stats[1])

    def z(self, value: float) -> float | None:
        """How many (floored) std the log of `value` lies above the window's mean; None during the warm-up."""
        stats = self._stats()
        return None if stats is None else (math.log(max(value, 1e-30)) - stats[0]) / stats[1]

    def exceeded(self, value: float) -> float | None:
        """The threshold `value` exceeds, or None."""
        limit = self.threshold()
        return limit if limit is not None and value > limit else None

    def accept(self, value: float) -> None:
        self.history.append(math.log(max(value, 1e-30)))


class Guards:
    """The non-finite and spike guards of one rank; `exchange` is collective over every rank."""

    def __init__(self, params: list, on_anomaly: str, spike_sigma: float, multi: bool, device: torch.device,
                 mixed: bool = True):
        """mixed: whether collectives sum gradients across ranks before the norm (Parallel.mixes_gradients).
        Only then do hooks on `params` watch each rank's own gradients; otherwise each rank's share of the
        squared norm, taken before any sum, names the rank (hooks on every parameter and micro-batch cost ~2%
        of a `tiny` pipeline step). One process has no other rank to name: its gradient norm says it all."""
        self.probe = GradProbe(params) if multi and mixed else None
        self.device = device
        self.on_anomaly = on_anomaly
        self.loss_rule = SpikeRule(spike_sigma)
        self.multi = multi
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if multi else (0, 1)

    def exchange(self, local_loss: torch.Tensor | None, loss_share: torch.Tensor, stop: int,
                 local_grad_sq: torch.Tensor) -> torch.Tensor:
        """The step's one control all-reduce, collective over every rank: each rank fills its own row and every
        rank gets all of them, on the CPU, as a (world, 5) tensor of [non-finite local loss, non-finite
        gradient seen by the probe, share of the global mean loss, preemption code, share of the squared
        gradient norm]. local_loss: the loss this rank computed, before any averaging (None: it computes none,
        e.g. a pipeline stage before the last); local_grad_sq: this rank's share of the squared gradient norm,
        before any sum over ranks (Parallel.local_grad_sq)."""
        rows = torch.zeros(self.world, 5, device=self.device)  # on the device: NCCL reduces only those
        bad_loss = local_loss is not None and not bool(torch.isfinite(local_loss.detach()).all())
        bad_grad = self.probe is not None and self.probe.take()
        rows[self.rank, :2] = torch.tensor([bad_loss, bad_grad], dtype=torch.float32)
        rows[self.rank, 2], rows[self.rank, 3] = loss_share.detach().float(), stop
        rows[self.rank, 4] = local_grad_sq
        if self.multi:
            dist.all_reduce(rows)
        return rows.cpu()

    def decide(self, step: int, rows: torch.Tensor, grad_norm: float) -> Control:
        """What every rank does after step `step`, from the rows `exchange` returned and the gradient norm."""
        loss = float(rows[:, 2].sum())
        return Control(loss, int(rows[:, 3].max()), self._anomaly_in(step, rows, loss, grad_norm))

    def _anomaly_in(self, step: int, flags: torch.Tensor, loss: float, grad_norm: float) -> Anomaly | None:
        # the spike rules see the same global values and history on every rank: every rank flags alike
        loss_limit = self.loss_rule.exceeded(loss)
        ranks = [[r for r in range(self.world) if flags[r, k] > 0] for k in range(2)]
        if self.multi and self.probe is None:  # no collective mixed the gradients: each share is its rank's own
            ranks[1] = [r for r in range(self.world) if not math.isfinite(flags[r, 4])]
        if ranks[0] or ranks[1] or not math.isfinite(grad_norm):
            parts = [f"non-finite loss on rank {_names(ranks[0])}"] if ranks[0] else []
            if ranks[1]:
                where = " before the reduce" if self.probe is not None else ""  # else no rank's was mixed in
                parts.append(f"non-finite gradient on rank {_names(ranks[1])}{where}")
            if not parts:
                parts.append("non-finite gradient norm, though no rank's local loss or gradient was non-finite "
                             "before the reduce (under zero=3 gradients are only seen reduced)" if self.multi else
                             "non-finite gradient")
            return self._anomaly(step, "nonfinite", "; ".join(parts), sorted(set(ranks[0] + ranks[1])) or
                                 ([] if self.multi else [0]))
        if loss_limit is not None:
            rule = self.loss_rule
            return self._anomaly(step, "spike", f"loss spike {loss:.4g} > {loss_limit:.4g} ({rule.sigma:g} std above "
                                 f"its mean over the last {len(rule.history)} healthy steps, in logs)",
                                 list(range(self.world)))
        return None

    def _anomaly(self, step: int, kind: str, what: str, ranks: list) -> Anomaly:
        return Anomaly(step, kind, f"step {step}: {what}", ranks, self.on_anomaly)

    def healthy(self, loss: float) -> None:
        """Add an applied step's loss to the spike rule's history."""
        self.loss_rule.accept(loss)


def _names(ranks: list) -> str:
    return ", ".join(str(r) for r in ranks)


class Snapshot:
    """This rank's pre-step state for a replay: parameters, optimizer state and RNG (--replay-anomalies)."""

    def __init__(self, tensors: list, optimizer: torch.optim.Optimizer):
        self.saved = [(t, local_part(t.detach()).clone()) for t in tensors]
        self.optim = copy.deepcopy(optimizer.state_dict())
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for t, saved in self.saved:
                local_part(t.detach()).copy_(saved)
        optimizer.load_state_dict(copy.deepcopy(self.optim))
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
