"""Event-driven run of one pipeline: each rank runs its passes in its schedule's order, a pass starting at
the latest of (its rank is free, its inputs arrived, its FSDP parameters are gathered).

A forward of chunk s needs the forward of chunk s-1 of the same micro-batch; an input gradient (I, or a full
backward B) of chunk s needs the forward of s and the input gradient of s+1; a weight gradient W needs the
I of its chunk. Data crossing ranks arrives after a stage-boundary send (latency + bytes / bandwidth, given
per pair of ranks: a slow link slows the sends it carries). Optionally each rank's FSDP traffic runs on its own
stream, one wrapping unit (layer) ahead of compute (FSDP's prefetch): the gather for unit u starts once the gather
for unit u-1 is done and unit u-1 has started computing; a unit computes once its gather is done.
"""

from dataclasses import dataclass, field

from meshscale.cost.schedule import inputs, output


@dataclass
class Event:
    rank: int
    stream: str  # "compute", "pp" (stage-boundary sends), "dp" (data-parallel family)
    kind: str  # F, B, I, W, tp (inline collectives), send, fsdp, sync, opt
    start: float
    end: float
    stage: int = -1
    mb: int = -1
    replica: int = 0


@dataclass
class Pass:
    rank: int
    stage: int
    kind: str
    mb: int
    start: float
    end: float  # compute, then the inline collectives
    compute: float
    inline: float
    wait_on: int | None = None  # the rank whose data this pass waited for, None if it waited on nobody
    waited: float = 0.0
    gather_wait: float = 0.0


@dataclass
class PipelineRun:
    passes: list  # Pass, in the order they ran, per rank interleaved
    events: list = field(default_factory=list)


def run(orders: tuple, owner, seconds, send, fsdp_share=None, replica: int = 0, before=None,
        blocking: bool = False, receives_block: bool = False) -> PipelineRun:
    """orders: per rank, (stage, kind, mb) tuples; owner(stage) -> rank; seconds(rank, stage, kind, mb) ->
    (compute, inline collectives); send(from rank, to rank) -> seconds of a stage-boundary send;
    fsdp_share(rank, stage, compute) -> (FSDP traffic seconds of a pass of that compute time, its wrapping
    units) (None: no FSDP); before(rank, stage, kind, mb) -> seconds its rank spends between its previous pass
    and this one, however early the inputs came (None: nothing; a measured trace's replay); blocking: a rank
    waits out each of its stage-boundary sends before its next pass (Software.pipeline_sends_block);
    receives_block: and each receive, which starts once both its send has and the rank is free (DeepSpeed's
    engine, Software.pipeline_receives_block: the transfer meets the receive it waits for)."""
    last_stage = max(a[0] for order in orders for a in order)
    done: dict = {}  # output(...) -> when it was ready
    free = [0.0] * len(orders)
    gather_end = [0.0] * len(orders)
    prev_start = [0.0] * len(orders)
    at = [0] * len(orders)
    out = PipelineRun([])
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r, order in enumerate(orders):
            while at[r] < len(order):
                stage, kind, mb = order[at[r]]
                deps = inputs(stage, kind, mb, last_stage)
                if any(d not in done for d in deps):
                    break
                if before is not None and at[r]:
                    free[r] += before(r, stage, kind, mb)
                ready, wait_on = 0.0, None
                for d in deps:
                    src = owner(d[1])
                    t = done[d] if src == r else max(done[d], free[r] if receives_block else 0.0) + send(src, r)
                    if t > ready:
                        ready, wait_on = t, (src if src != r else None)
                compute, inline = seconds(r, stage, kind, mb)
                start = max(free[r], ready)
                waited = max(0.0, ready - free[r])
                t, gather_wait = start, 0.0
                if fsdp_share is not None:  # unit by unit: gather u runs while unit u-1 computes
                    gather, units = fsdp_share(r, stage, compute)
                    first: float | None = None
                    for _ in range(units):
                        g_start = max(gather_end[r], prev_start[r])
                        gather_end[r] = g_start + gather / units
                        first = g_start if first is None else first
                        unit_start = max(t, gather_end[r])
                        gather_wait += unit_start - t
                        prev_start[r], t = unit_start, unit_start + compute / units
                    out.events.append(Event(r, "dp", "fsdp", first or 0.0, gather_end[r], stage, mb, replica))
                else:
                    prev_start[r], t = start, start + compute
                end = t + inline
                out.passes.append(Pass(r, stage, kind, mb, start, end, compute, inline,
                                       wait_on if waited else None, waited, gather_wait))
                out.events.append(Event(r, "compute", kind, start, t, stage, mb, replica))
                if inline:
                    out.events.append(Event(r, "compute", "tp", t, end, stage, mb, replica))
                target = stage + 1 if kind == "F" else stage - 1
                free[r] = end
                if kind != "W" and 0 <= target <= last_stage and owner(target) != r:
                    out.events.append(Event(r, "pp", "send", end, end + send(r, owner(target)), stage, mb, replica))
                    if blocking:
                        free[r] = out.events[-1].end
                done[output(stage, kind, mb)] = end
                at[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked: an order waits on a pass that never runs")
    return out
