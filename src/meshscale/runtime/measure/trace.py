"""Pipeline trace: each rank's timed forward (F), backward (B) and weight-gradient (W) runs of one step,
written as Chrome-trace JSON (chrome://tracing, Perfetto) with one row per rank, and the bubble fraction
measured from them beside the analytic one.

Events are dicts {"kind", "mb", "stage", "start", "end"} in seconds (wall clock, as PipelineRunner.events
holds them); gather them to one rank (e.g. dist.gather_object) before writing.
"""

import json

from meshscale.cost.pipeline import bubble_ratio
from meshscale.specs.layout import Layout


def measured_bubble(events: list[dict], span: tuple[float, float]) -> float:
    """Idle fraction of one rank's step: 1 - (time spent computing F/B/W) / (step wall time)."""
    total = span[1] - span[0]
    busy = sum(e["end"] - e["start"] for e in events)
    return max(0.0, 1.0 - busy / total) if total > 0 else 0.0


def analytic_bubble(schedule: str, pp: int, microbatches: int, vpp: int = 1) -> float:
    """Idle fraction of the step predicted for equal F, B (and W) times (cost/pipeline.py's closed forms),
    in the same idle/total form as `measured_bubble`: the bubble-to-work ratio r becomes r / (1 + r)."""
    if pp == 1:
        return 0.0
    ratio = bubble_ratio(Layout(pp=pp, vpp=vpp, schedule=schedule), microbatches)
    return ratio / (1 + ratio)


def chrome_trace(per_rank_events: list[list[dict]]) -> dict:
    """Trace-event JSON: one process row per PP rank, one complete ("X") event per F/B/W run, in
    microseconds from the earliest event."""
    starts = [e["start"] for events in per_rank_events for e in events]
    origin = min(starts) if starts else 0.0
    names = {"F": "forward", "B": "backward", "W": "weight-grad"}
    trace = []
    for rank, events in enumerate(per_rank_events):
        trace.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"pp rank {rank}"}})
        for e in events:
            trace.append({"ph": "X", "pid": rank, "tid": 0, "cat": e["kind"],
                          "name": f"{e['kind']}{e['mb']} (stage {e['stage']})",
                          "ts": (e["start"] - origin) * 1e6, "dur": (e["end"] - e["start"]) * 1e6,
                          "args": {"kind": names[e["kind"]], "microbatch": e["mb"], "stage": e["stage"]}})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def write_chrome_trace(path: str, per_rank_events: list[list[dict]]) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(per_rank_events), f)
