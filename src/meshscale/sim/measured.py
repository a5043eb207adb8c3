"""Replay a measured pipeline step: the F/B/W duration of every pass in a `meshscale train --trace` Chrome
trace (runtime/measure/trace.py), fed through the same schedule orders, beside the bubble the trace itself shows.
Each pass keeps its own measured duration, not a mean: a pipeline's span is a max over paths, and averaging
the durations first would understate it.

What a rank spends between passes is measured from the trace too (`gaps`), in three kinds, since they
differ by up to tenfold: a pass whose input from another rank came after its rank was free starts a send's
delivery after that input was made; one whose input was made while its rank was still busy starts after its
rank's previous pass plus a delivery that only then begins (gloo moves a message once its receive is
posted, which torch's schedules do after the rank's previous pass); a pass with no input from another rank
starts after its rank's own bookkeeping. Each kind is charged its mean, not its median: a rank's idle is the
sum of its gaps, and on shared cores (4 ranks on 2) a long tail of them is a rank waiting for a core. The two
kinds spent on a rank's own time (after its previous pass) are that rank's means, since the rank waiting for
a core is one rank, not all; a delivery is a message's, and takes the mean over all ranks (a rank receives
few, so one late message would weigh on every receive of its own).
Both bubbles are in the trace's own form (runtime/measure/trace.py measured_bubble): per pipeline rank, the fraction
of the step (first pass start to last pass end, over all ranks) its rank spent outside F/B/W.
"""

import json
import statistics
from dataclasses import dataclass, replace

from meshscale.cost.schedule import inputs, output, rank_orders
from meshscale.errors import UserError
from meshscale.sim import engine
from meshscale.specs.layout import Layout
from meshscale.specs.placement import stage_owner


@dataclass
class Gaps:
    """Mean seconds from what a pass waited for to its start (see the module docstring)."""
    delivered: float  # from the other rank's pass that made its input, when that came after its rank was free
    posted: float  # from its rank's previous pass, when its input from another rank was already made
    local: float  # from its rank's previous pass, when it has no input from another rank


KINDS = ("delivered", "posted", "local")


def gap_samples(events: list[dict], owner) -> dict:
    """Per pipeline rank, the trace's gaps of each kind: {rank: {kind: [seconds]}}; owner(stage) -> the pipeline
    rank holding it. A "delivered" gap is its receiving rank's."""
    last = max(e["stage"] for e in events)
    made = {output(e["stage"], e["kind"], e["mb"]): e["end"] for e in events}
    out: dict = {}
    for rank in sorted({e["rank"] for e in events}):
        kinds: dict = out.setdefault(rank, {k: [] for k in KINDS})
        mine = sorted((e for e in events if e["rank"] == rank), key=lambda e: e["start"])
        for before, e in zip(mine, mine[1:]):
            sent = [made[d] for d in from_others(e["stage"], e["kind"], e["mb"], rank, owner, last) if d in made]
            if not sent:
                kinds["local"].append(e["start"] - before["end"])
            elif max(sent) > before["end"]:
                kinds["delivered"].append(e["start"] - max(sent))
            else:
                kinds["posted"].append(e["start"] - before["end"])
    return out


def mean_gaps(samples: list[dict], fallback: Gaps | None = None) -> Gaps:
    """The mean of each kind over these ranks' samples; a kind none of them has takes `fallback`'s (or 0)."""
    def mean(kind):
        values = [v for s in samples for v in s[kind]]
        return statistics.mean(values) if values else getattr(fallback, kind) if fallback else 0.0
    return Gaps(**{k: mean(k) for k in KINDS})


def gaps(events: list[dict], owner) -> Gaps:
    """The trace's gaps of each kind over all ranks (see the module docstring)."""
    return mean_gaps(list(gap_samples(events, owner).values()))


def from_others(stage: int, kind: str, mb: int, rank: int, owner, last: int) -> list:
    """The inputs of a pass (cost.schedule.inputs; a traced "B" is an input-gradient pass) that another rank makes."""
    return [d for d in inputs(stage, kind, mb, last) if owner(d[1]) != rank]


@dataclass
class Replay:
    measured: list  # bubble per pipeline rank, from the trace
    simulated: list  # the same, simulated from the trace's pass durations
    gaps: Gaps  # the trace's gaps over all ranks
    rank_gaps: dict  # pipeline rank -> the Gaps it was charged (its own posted and local, `gaps`' delivery)


def read_trace(path: str) -> list[dict]:
    """The complete events of a train trace: {"rank", "kind", "stage", "mb", "start", "end"} in seconds."""
    try:
        with open(path) as f:
            data = json.load(f)
        events = [{"rank": e["pid"], "kind": e["cat"], "stage": e["args"]["stage"], "mb": e["args"]["microbatch"],
                   "start": e["ts"] / 1e6, "end": (e["ts"] + e["dur"]) / 1e6}
                  for e in data["traceEvents"] if e.get("ph") == "X"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--times-from {path}: not a meshscale train --trace file ({e})") from None
    if not events:
        raise UserError(f"--times-from {path}: the trace holds no forward/backward runs")
    return events


def replay(path: str, layout: Layout, m: int) -> Replay:
    events = read_trace(path)
    if max(e["rank"] for e in events) + 1 != layout.pp or max(e["stage"] for e in events) + 1 != layout.stages:
        raise UserError(f"--times-from {path}: the trace's pipeline does not match --layout {layout} "
                        f"(pp={layout.pp}, {layout.stages} chunks); pass the layout it was trained with")
    took = {(e["stage"], e["kind"], e["mb"]): e["end"] - e["start"] for e in events}
    # The trace names an input-gradient pass "B" too; a full backward is B plus W where W is traced apart.
    kinds = {"F": ("F",), "I": ("B",), "W": ("W",), "B": ("B",)}
    owner = lambda s: stage_owner(s, layout.pp, layout.v_shaped)  # noqa: E731
    samples = gap_samples(events, owner)
    overall = mean_gaps(list(samples.values()))
    gap = {r: replace(mean_gaps([s], overall), delivered=overall.delivered) for r, s in samples.items()}

    def seconds(rank, stage, kind, mb):
        return sum(took.get((stage, k, mb), 0.0) for k in kinds[kind]), 0.0

    def before(rank, stage, kind, mb):  # idle, as in the measured bubble
        mine = gap[rank]
        return mine.posted if from_others(stage, kind, mb, rank, owner, layout.stages - 1) else mine.local

    run = engine.run(rank_orders(layout.schedule, layout.pp, layout.vpp, m), owner, seconds,
                     lambda a, b: overall.delivered, before=before)
    span = max(p.end for p in run.passes)
    simulated = [1 - sum(p.compute for p in run.passes if p.rank == r) / span for r in range(layout.pp)]
    t0, t1 = min(e["start"] for e in events), max(e["end"] for e in events)
    measured = [1 - sum(e["end"] - e["start"] for e in events if e["rank"] == r) / (t1 - t0) for r in range(layout.pp)]
    return Replay(measured, simulated, overall, gap)
