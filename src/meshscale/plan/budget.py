"""Budget: which cluster, how many devices and which layout train `tokens` tokens by a deadline, for how
many dollars and how much energy, with failures priced in.

For each candidate cluster and device count, the planner's best layout gives the step time; the job then
needs ceil(tokens / batch tokens) steps, and only ETTR of its wall time trains (cost/goodput.py: Daly's
checkpoint interval against the cluster's MTBF), so
    days = steps x step time / ETTR / 86400,   dollars = devices x $/device-hour x days x 24,
    energy = joules per token (plan/scaling.py's power model) x tokens / ETTR (lost work burns power too).
Days, dollars and energy are each proportional to the step time, so each carries the step time's error band
(cost/bands.py) as the range its true value lies in if the prediction errs no more than the band's p90. ETTR
carries none: it follows from the MTBF and checkpoint bandwidth given, which no validation run measured.
"""

import math
from dataclasses import asdict, dataclass

from meshscale.cost import bands
from meshscale.cost.goodput import DEFAULT_CHECKPOINT_BANDWIDTH, of_prediction
from meshscale.errors import UserError
from meshscale.plan.scaling import batch_at, joules_per_token
from meshscale.plan.search import search
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.model import ModelSpec


@dataclass(frozen=True)
class Candidate:
    cluster: ClusterSpec
    price_per_device_hour: float
    mtbf_hours: float  # per device


@dataclass
class Option:
    cluster: str
    devices: int
    layout: str
    step_time_s: float
    steps: int
    ettr: float
    days: float
    dollars: float
    energy_mwh: float | None  # None where the cluster has no power figures
    meets_deadline: bool
    band: dict  # the step time's error band, which days, dollars and energy share
    deadline_days: float
    pareto: bool = False  # no other option is both faster and cheaper

    def range_of(self, value: float | None) -> tuple[float, float] | None:
        """A step-time-proportional figure's range at the band's p90 (None: no band, or no figure)."""
        return None if value is None else bands.measured_range(value, self.band)

    @property
    def deadline(self) -> str:
        """"met", "at risk" (met as predicted, missed at the band's slow end), "missed", or "met, band
        unknown" where the category has no validation runs."""
        if not self.meets_deadline:
            return "missed"
        rng = self.range_of(self.days)
        if rng is None:
            return "met, band unknown"
        return "met" if rng[1] <= self.deadline_days else "at risk"

    def to_dict(self) -> dict:
        ranges = {f"{k}_range": (list(r) if (r := self.range_of(getattr(self, k))) else None)
                  for k in ("days", "dollars", "energy_mwh")}
        return {**asdict(self), **ranges, "deadline": self.deadline, "ettr_band": None}


def default_counts(cluster: ClusterSpec, max_devices: int) -> list[int]:
    """Doubling from one fast domain (a node, or a 64-chip TPU slice) up to max_devices."""
    n = min(cluster.fast_domain, 64)
    out = []
    while n <= max_devices:
        out.append(n)
        n *= 2
    return out


def pairs(candidates: list[Candidate], counts: list[int] | None, max_devices: int) -> list[tuple[Candidate, int]]:
    """Every (candidate, device count) `options` plans: `counts`, else doubling from each cluster's fast domain."""
    return [(cand, n) for cand in candidates for n in counts or default_counts(cand.cluster, max_devices)]


def options(model: ModelSpec, candidates: list[Candidate], tokens: float, global_batch_tokens: int,
            deadline_days: float, counts: list[int] | None = None, max_devices: int = 16384,
            precision: str = "bf16", checkpoint_bandwidth: float = DEFAULT_CHECKPOINT_BANDWIDTH,
            restart_s: float | None = None, planned=None) -> list[Option]:
    """Every (cluster, device count) whose best layout fits, with its days, dollars, energy and ETTR; the
    Pareto front of days against dollars marked. `planned(done, label)` is told as each pair is planned."""
    if not 0 < tokens < math.inf or not deadline_days > 0:
        raise UserError(f"--tokens and --deadline-days must be positive numbers, got {tokens:g} and "
                        f"{deadline_days:g}")
    steps = math.ceil(tokens / global_batch_tokens)
    out = []
    for done, (cand, n) in enumerate(pairs(candidates, counts, max_devices)):
        if planned:
            planned(done, f"{n:,} x {cand.cluster.name}")
        batch = batch_at(model, n, global_batch_tokens, None)
        plan = search(model, cand.cluster, n, batch, precision, top=1)
        if not plan.ranked:
            continue
        win = plan.ranked[0]
        ettr = of_prediction(win, cand.mtbf_hours, checkpoint_bandwidth, restart_s).ettr
        if ettr <= 0:
            continue  # fails faster than it can checkpoint: never finishes
        days = steps * win.step_time_s / ettr / 86400
        joules = joules_per_token(cand.cluster, win)
        out.append(Option(cand.cluster.name, n, win.layout, win.step_time_s, steps, ettr, days,
                          n * cand.price_per_device_hour * days * 24,
                          joules * tokens / ettr / 3.6e9 if joules else None, days <= deadline_days,
                          win.band, deadline_days))
    if not out:
        raise UserError(f"no candidate fits {model.name} with {global_batch_tokens:,} tokens a step at any device "
                        "count tried; add larger counts or clusters")
    for o in out:
        o.pareto = not any(p.days <= o.days and p.dollars <= o.dollars and (p.days, p.dollars) != (o.days, o.dollars)
                           for p in out)
    return sorted(out, key=lambda o: (o.days, o.dollars))


def choose(opts: list[Option]) -> Option:
    """The cheapest option that meets the deadline, else the fastest."""
    meeting = [o for o in opts if o.meets_deadline]
    return min(meeting, key=lambda o: o.dollars) if meeting else min(opts, key=lambda o: o.days)
