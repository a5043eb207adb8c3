"""Replay a measured pipeline step: the F/B/W duration of every pass in a `meshscale train --trace` Chrome
trace (runtime/trace.py), fed through the same schedule orders, beside the bubble the trace itself shows.
Each pass keeps its own measured duration, not a mean: a pipeline's span is a max over paths, and averaging
the durations first would understate it.

The gaps between passes are measured from the trace too (`gaps`). Both bubbles are in the trace's own form
(runtime/trace.py measured_bubble): per pipeline rank, the fraction of the step (first pass start to last
pass end, over all ranks) its rank spent outside F/B/W.
"""

import json
from dataclasses import dataclass

from meshscale.errors import UserError
from meshscale.sim import engine
from meshscale.sim.schedule import rank_orders, stage_owner
from meshscale.specs.layout import V_SCHEDULES, Layout


def gaps(events: list[dict], owner) -> tuple[float, float]:
    """What this machine spends between passes, from the trace: (the stage-boundary send, the median delay
    from a pass ending on one rank to the pass that waited for its output starting on another; the time
    between two passes of one rank when nothing was awaited: receive posting, the sends a rank waits on,
    the schedule's own bookkeeping)."""
    end = {(e["kind"] == "F", e["stage"], e["mb"]): e["end"] for e in events if e["kind"] in "FB"}
    sends, between = [], []
    for rank in {e["rank"] for e in events}:
        mine = sorted((e for e in events if e["rank"] == rank), key=lambda e: e["start"])
        for before, e in zip(mine, mine[1:]):
            source = e["stage"] - 1 if e["kind"] == "F" else e["stage"] + 1
            sent = end.get((e["kind"] == "F", source, e["mb"])) if e["kind"] in "FB" else None
            if sent is not None and owner(source) != rank and before["end"] < sent:
                sends.append(e["start"] - sent)
            else:
                between.append(e["start"] - before["end"])
    median = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0.0  # noqa: E731
    return median(sends), median(between)


@dataclass
class Replay:
    measured: list  # bubble per pipeline rank, from the trace
    simulated: list  # the same, simulated from the trace's pass durations


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
    v_shape = layout.schedule in V_SCHEDULES
    owner = lambda s: stage_owner(s, layout.pp, v_shape)  # noqa: E731
    send_s, between_s = gaps(events, owner)

    def seconds(rank, stage, kind, mb):  # the time between passes counts as idle, as in the measured bubble
        return sum(took.get((stage, k, mb), 0.0) for k in kinds[kind]), between_s

    run = engine.run(rank_orders(layout.schedule, layout.pp, layout.vpp, m), owner, seconds, lambda a, b: send_s)
    span = max(p.end for p in run.passes)
    simulated = [1 - sum(p.compute for p in run.passes if p.rank == r) / span for r in range(layout.pp)]
    t0, t1 = min(e["start"] for e in events), max(e["end"] for e in events)
    measured = [1 - sum(e["end"] - e["start"] for e in events if e["rank"] == r) / (t1 - t0) for r in range(layout.pp)]
    return Replay(measured, simulated)
