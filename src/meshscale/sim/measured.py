"""Replay a measured pipeline step: the F/B/W durations of a `meshscale train --trace` Chrome trace
(runtime/trace.py) fed through the same schedule orders, beside the bubble the trace itself shows.

Both bubbles are in the trace's own form (runtime/trace.py measured_bubble): per pipeline rank, the
fraction of the step (first pass start to last pass end, over all ranks) its rank spent outside F/B/W.
"""

import json
from collections import defaultdict
from dataclasses import dataclass

from meshscale.errors import UserError
from meshscale.sim import engine
from meshscale.sim.schedule import rank_orders, stage_owner
from meshscale.specs.layout import V_SCHEDULES, Layout


@dataclass
class Replay:
    measured: list  # bubble per pipeline rank, from the trace
    simulated: list  # the same, simulated with the trace's mean durations


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
    durations = defaultdict(list)
    for e in events:
        durations[(e["stage"], e["kind"])].append(e["end"] - e["start"])
    mean = {k: sum(v) / len(v) for k, v in durations.items()}
    # The trace names an input-gradient pass "B" too; a full backward is B plus W where W is traced apart.
    kinds = {"F": ("F",), "I": ("B",), "W": ("W",), "B": ("B",)}

    def seconds(rank, stage, kind):
        return sum(mean.get((stage, k), 0.0) for k in kinds[kind]), 0.0

    v_shape = layout.schedule in V_SCHEDULES
    run = engine.run(rank_orders(layout.schedule, layout.pp, layout.vpp, m),
                     lambda s: stage_owner(s, layout.pp, v_shape), seconds, 0.0)
    span = max(p.end for p in run.passes)
    simulated = [1 - sum(p.compute for p in run.passes if p.rank == r) / span for r in range(layout.pp)]
    t0, t1 = min(e["start"] for e in events), max(e["end"] for e in events)
    measured = [1 - sum(e["end"] - e["start"] for e in events if e["rank"] == r) / (t1 - t0) for r in range(layout.pp)]
    return Replay(measured, simulated)
