"""One optimizer step, simulated pass by pass from the cost model's own pieces.

Every duration comes from cost/: each pass's compute from `chunk_passes` (what `rank_passes` and so
`predict` sum, with a share of the rank's `rank_extra_passes`), each collective's time and overlap
class from the Prediction's comm entries:
  - TP/SP, EP and CP (exposed_s: what their overlap leaves) run inline: each pass carries its share, in
    proportion to its compute;
  - stage-boundary sends (the pp entry: latency + bytes / bandwidth per send) delay the receiving pass;
  - FSDP traffic ("fsdp", with fsdp_prefetch) runs on the data-parallel stream one pass ahead of compute;
  - the bucketed gradient reduction ("backward", "each_backward") starts as the last micro-batch's
    backward (all micro-batches' backwards for ZeRO-2) begins and ends at least one bucket after it;
  - then the optimizer update, then ZeRO-1/2's parameter all-gather ("forward": beside the next forward).
  Traffic whose [software] overlap switch is off ("none" on dp) runs whole after the last backward.
Pass orders are the runtime's schedules (cost/schedule.py).

Symmetry: under the cost model every DP/CP replica and every TP rank of a pipeline stage does the same
work at the same time, so one representative per pipeline rank is simulated: pp ranks, not all devices
(a 16,384-device llama3-405b layout is 16 simulated ranks). A straggler breaks the symmetry of its replica
only: that replica's pipeline is simulated beside a healthy one, and the two meet at the gradient
reduction, where the healthy replicas wait.

Stragglers: a slow device computes FACTOR times slower. A slow link makes every transfer over that device's
links take FACTOR times longer: in its own replica, the stage-boundary sends to and from its pipeline rank
and that rank's inline TP/CP/EP collectives (a ring runs at the pace of its slowest link; what their overlap
hid stays hidden only as far as the same compute covers the longer transfer); in every replica, that pipeline
rank's data-parallel traffic (FSDP gathers, the gradient reduction, ZeRO's gather), whose rings all pass
through it. (The CP and EP groups also reach into other replicas; the simulated replica, slowed on every
axis, is the slowest of them and sets the step.)
"""

import json
from collections import defaultdict
from dataclasses import dataclass, field

from meshscale.cost import predict
from meshscale.cost.comm import Overlap
from meshscale.cost.overhead import shared_cores
from meshscale.cost.schedule import inputs, output, pass_seconds, rank_orders
from meshscale.cost.step import (chunk_passes, control_seconds, exposed_seconds, rank_extra_passes,
                                 rank_passes)
from meshscale.errors import UserError
from meshscale.sim import engine
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import Layout, check_against
from meshscale.specs.model import ModelSpec
from meshscale.specs.placement import chunk_ranges, layout_ends, rank_chunks, stage_owner

INLINE_AXES = ("tp", "ep", "etp", "cp")
DATA_AXES = ("dp", "edp")  # dense gradients over dp*cp, routed experts over their own replicas (MoE)


@dataclass
class RankTime:
    name: str  # "pp rank 2" or "pp rank 2, replica with the straggler"
    busy_s: float  # compute and optimizer
    idle_s: float  # waiting on other ranks (pipeline bubble) or for the slowest replica
    exposed_comm_s: float  # collectives nothing hides: inline TP/EP/CP, FSDP waits, the gradient sync tail


@dataclass
class Simulation:
    layout: str
    devices: int
    microbatches: int
    step_time_s: float
    predicted_step_time_s: float
    bubble_s: float
    bubble_fraction: float  # bubble_s / step, as predict defines it
    ranks: list
    critical_path: list  # (rank, passes) runs, last one first
    waits: list = field(default_factory=list)  # sentences: who waited for whom, and how long
    healthy_step_time_s: float | None = None  # with stragglers: the same step without them
    events: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"layout": self.layout, "devices": self.devices, "microbatches": self.microbatches,
                "step_time_s": self.step_time_s, "predicted_step_time_s": self.predicted_step_time_s,
                "bubble_s": self.bubble_s, "bubble_fraction": self.bubble_fraction,
                "ranks": [r.__dict__ for r in self.ranks],
                "critical_path": [{"rank": r, "passes": n} for r, n in self.critical_path], "waits": self.waits,
                "healthy_step_time_s": self.healthy_step_time_s}


def parse_stragglers(items: list[str], devices: int) -> tuple[dict[int, float], dict[int, float]]:
    """"RANK:FACTOR" (device RANK computes FACTOR times slower) and "link:RANK:FACTOR" (every transfer over
    its links takes FACTOR times longer) -> ({rank: factor} of slow devices, {rank: factor} of slow links)."""
    slow: dict[int, float] = {}
    links: dict[int, float] = {}
    for item in items or []:
        link = item.startswith("link:")
        rank, sep, factor = item.removeprefix("link:").partition(":")
        try:
            r, f = int(rank), float(factor)
        except ValueError:
            raise UserError(f"--straggler {item!r}: write RANK:FACTOR or link:RANK:FACTOR, e.g. 5:1.5 (device 5 "
                            "computes 1.5x slower) or link:5:4 (its transfers take 4x longer)") from None
        if not sep or not 0 <= r < devices:
            raise UserError(f"--straggler {item!r}: rank must be in 0..{devices - 1} (the job has {devices} devices)")
        if not f > 0:
            raise UserError(f"--straggler {item!r}: the factor must be positive (1.5 = 50% slower)")
        (links if link else slow)[r] = f
    return slow, links


def simulate(model: ModelSpec, cluster: ClusterSpec, layout: Layout, global_batch: int, precision: str = "bf16",
             stragglers: dict[int, float] | None = None, slow_links: dict[int, float] | None = None) -> Simulation:
    """Simulate one step of `layout`; `stragglers` maps global device ranks to compute slow-down factors,
    `slow_links` to link slow-down factors."""
    check_against(layout, model, global_batch)
    layout = layout.resolve_mbs(global_batch)
    m = layout.microbatches(global_batch)
    pred = predict(model, cluster, layout, global_batch, precision)
    cluster = shared_cores(cluster, layout.devices)  # the machine each rank sees, as predict costs it
    stragglers, slow_links = stragglers or {}, slow_links or {}
    per_stage = layout.devices // layout.pp
    ring: defaultdict[int, float] = defaultdict(lambda: 1.0)  # pp rank -> how much slower its data-parallel rings run
    for g, factor in slow_links.items():
        ring[g // per_stage] = max(ring[g // per_stage], factor)
    seconds_for, send_for, share = _durations(model, cluster, layout, precision, pred, ring)
    orders = rank_orders(layout.schedule if layout.pp > 1 else "1f1b", layout.pp, layout.vpp, m)
    owner = lambda stage: stage_owner(stage, layout.pp, layout.v_shaped)  # noqa: E731
    pipelines = _replicas(layout, stragglers, slow_links)
    blocks = {"blocking": cluster.software.pipeline_sends_block,
              "receives_block": cluster.software.pipeline_receives_block}
    runs = [engine.run(orders, owner, seconds_for(slow, links), send_for(links), share, i, **blocks)
            for i, (_, slow, links) in enumerate(pipelines)]
    last_backward = [[max(p.end for p in run.passes if p.rank == r and p.kind != "F") for r in range(layout.pp)]
                     for run in runs]
    ends, events = _data_parallel_tail(model, cluster, layout, precision, pred, m, last_backward, ring)
    step = max(ends)
    ranks, waits = [], []
    healthy = simulate(model, cluster, layout, global_batch, precision) if stragglers or slow_links else None
    reference = None  # a replica without stragglers, to say how much more the straggling ones wait
    if healthy:
        reference = runs[0] if not pipelines[0][0] else engine.run(orders, owner, seconds_for({}, {}),
                                                                     send_for({}), share, **blocks)
    for i, ((name, _, _), run) in enumerate(zip(pipelines, runs)):
        for r in range(layout.pp):
            mine = [p for p in run.passes if p.rank == r]
            busy = sum(p.compute for p in mine) + pred.optimizer_s
            backward_end = max(lb[r] for lb in last_backward)
            exposed = sum(p.inline + p.gather_wait for p in mine) + ends[r] - backward_end - pred.optimizer_s
            ranks.append(RankTime(f"pp rank {r}" + (f", {name}" if name else ""), busy, step - busy - exposed,
                                  exposed))
            if backward_end > last_backward[i][r] + 1e-12:
                late = backward_end - last_backward[i][r]
                waits.append((late, f"pp rank {r}{' (' + name + ')' if name else ''} waits {late * 1e3:,.1f} ms at "
                                    "the gradient reduction for the slowest replica"))
        if name or not healthy:
            waits += _wait_lines(run, reference, name)
    if healthy and layout.dp * layout.cp > 1:
        waits += _ring_lines(ranks[:layout.pp], healthy.ranks, slow_links, per_stage)
    bubble = _bubble(runs[0], layout.pp)
    return Simulation(str(layout), layout.devices, m, step, pred.step_time_s, bubble, bubble / step, ranks,
                      critical_path(max(runs, key=lambda run: max(p.end for p in run.passes))),
                      [w for _, w in sorted(waits, reverse=True)[:8]],
                      healthy.step_time_s if healthy else None, events + [e for run in runs for e in run.events])


def _durations(model, cluster, layout, precision, pred, ring):
    """From the cost model: seconds_for(slow devices, slow links) -> seconds(rank, stage, kind) for the engine,
    send_for(slow links) -> the seconds of a stage-boundary send between two ranks, and the FSDP share of a
    pass (None without FSDP); `ring` slows each pipeline rank's data-parallel traffic. Keys are pp ranks."""
    chunk = [chunk_passes(model, cluster, layout, c, precision) for c in range(layout.stages)]
    # what a rank adds to its chunks' passes, an equal share on each chunk's pass
    extra = {r: rank_extra_passes(model, cluster, layout, r, precision)
             * (1 / len(rank_chunks(layout.pp, layout.stages, layout.v_shaped, r))) for r in range(layout.pp)}
    efficiency = cluster.software.overlap_efficiency
    inline = [e for e in pred.comm if e["axis"] in INLINE_AXES]
    pp_entry = next((e for e in pred.comm if e["axis"] == "pp"), None)
    send_s = pp_entry["time_s"] / pp_entry["calls"] if pp_entry else 0.0
    fsdp = sum(e["time_s"] for e in pred.comm if e["axis"] in DATA_AXES and e["overlap"] == Overlap.FSDP)
    units = [len(r) for r in chunk_ranges(model.layers, layout.stages, model.mtp_layers, layout.pp,
                                          layout_ends(layout))]

    def exposed(factor: float) -> float:  # the inline collectives at `factor` times their time (predict's rule)
        return sum(exposed_seconds(factor * e["time_s"], e["hidden_by_s"], factor * e["shown_s"], efficiency)
                   for e in inline)

    # compute slowed beside the collectives it hides (predict's interference_s): the inline ones' as long as they
    # are (a slow link's longer), the data-parallel ones'; the stage sends' is left to their own events
    inline_slowing = sum(e["interference_s"] for e in inline)
    dp_slowing = sum(e["interference_s"] for e in pred.comm if e["axis"] in DATA_AXES)

    def seconds_for(slow: dict, links: dict):
        # per rank: the inline collectives and the FSDP traffic compute cannot hide, spread over its passes
        serial = {r: exposed(links.get(r, 1.0)) + (1 - efficiency) * fsdp * ring[r]
                  + inline_slowing * links.get(r, 1.0) + dp_slowing for r in range(layout.pp)}

        def seconds(rank, stage, kind, mb):
            compute = pass_seconds(chunk[stage], kind) + pass_seconds(extra[rank], kind)
            return compute * slow.get(rank, 1.0), serial[rank] * compute / pred.compute_s
        return seconds

    def send_for(links: dict):
        return lambda a, b: send_s * max(links.get(a, 1.0), links.get(b, 1.0))

    def share(rank, stage, compute):
        return efficiency * fsdp * ring[rank] * compute / pred.compute_s, units[stage]

    return seconds_for, send_for, share if fsdp * efficiency else None


def _replicas(layout: Layout, stragglers: dict, slow_links: dict) -> list[tuple[str, dict, dict]]:
    """(name, {pp rank: compute slow-down}, {pp rank: link slow-down}) per simulated pipeline: the healthy one
    (unless every replica holds a straggler), then one per replica holding one. Mesh order pp, dp, cp, tp
    (specs/layout.py)."""
    per_stage = layout.devices // layout.pp
    slow: dict = defaultdict(lambda: ({}, {}))
    first: dict = {}
    for which, found in ((0, stragglers), (1, slow_links)):
        for g, factor in sorted(found.items()):
            replica = (g % per_stage) // layout.tp
            slow[replica][which][g // per_stage] = factor
            first.setdefault(replica, f"replica of device {g}" + ("'s link" if which else ""))
    healthy: list = [] if len(slow) == layout.dp * layout.cp else [("", {}, {})]
    return healthy + [(first[k], *slow[k]) for k in sorted(slow)]


def _data_parallel_tail(model, cluster, layout, precision, pred, m, last_backward, ring) -> tuple[list, list]:
    """Per pipeline rank, when its step ends, and the events on the way: the gradient reduction (over all
    replicas, so after the slowest one's last backward), the optimizer, then ZeRO-1/2's parameter all-gather.
    With grad_reduce_overlap the reduction's buckets run behind the last micro-batch's backward (ZeRO-2: all
    of them) and one bucket shows; with param_gather_overlap the gather runs beside the next step's first
    forward and one bucket shows. Traffic whose [software] switch is off runs whole. `ring` slows each pipeline
    rank's traffic (a slow link in its rings)."""
    dp = [e for e in pred.comm if e["axis"] in DATA_AXES and e["overlap"] != Overlap.FSDP]
    reductions = [e for e in dp if e["collective"] != "all_gather"]
    gathers = [e for e in dp if e["collective"] == "all_gather"]
    ends, events = [], []
    efficiency = cluster.software.overlap_efficiency
    control = control_seconds(cluster, layout.devices, layout)
    for r in range(layout.pp):
        passes = rank_passes(model, cluster, layout, r, precision)
        t = backward_end = max(lb[r] for lb in last_backward)
        for e in reductions:
            took = e["time_s"] * ring[r]
            end = t + took
            if e["overlap"] in (Overlap.BACKWARD, Overlap.EACH_BACKWARD):
                window = (passes.backward + passes.weight) * (m if e["overlap"] == Overlap.EACH_BACKWARD else 1)
                end = t + exposed_seconds(took, t - backward_end + window, took / e["calls"], efficiency)
            events.append(engine.Event(r, "dp", "sync", end - took, end))
            t = end
        t += control  # the gradient norm, loss and non-finite all-reduces
        events.append(engine.Event(r, "compute", "opt", t, t + pred.optimizer_s))
        t += pred.optimizer_s
        for e in gathers:
            took = e["time_s"] * ring[r]
            events.append(engine.Event(r, "dp", "gather", t, t + took))
            hidden = passes.forward if e["overlap"] == Overlap.FORWARD else 0.0
            t += exposed_seconds(took, hidden, took / e["calls"], efficiency)
        ends.append(t)
    return ends, events


def _wait_lines(run, reference, name: str) -> list[tuple[float, str]]:
    """Who waited for whom in `run`; with a `reference` (a replica without stragglers), in excess of it."""
    on = _waits(run)
    if reference is not None:
        base = _waits(reference)
        on = {k: t - base.get(k, 0.0) for k, t in on.items()}
    where = f" ({name})" if name else ""
    more = "more than in a healthy replica " if reference is not None else ""
    return [(t, f"pp rank {a}{where} waits {t * 1e3:,.1f} ms {more}for pp rank {b}") for (a, b), t in on.items()
            if t > 1e-9]


def _ring_lines(ranks: list, healthy: list, slow_links: dict, per_stage: int) -> list[tuple[float, str]]:
    """Each pipeline rank whose data-parallel rings pass through a slow link: how much longer every replica's
    rank waits on them than in the healthy step."""
    out = []
    for g, factor in sorted(slow_links.items()):
        r = g // per_stage
        extra = ranks[r].exposed_comm_s - healthy[r].exposed_comm_s
        if extra > 1e-9:
            out.append((extra, f"pp rank {r} of every replica waits {extra * 1e3:,.1f} ms more on its data-parallel "
                               f"collectives: their ring runs at the pace of device {g}'s link ({factor:g}x slower)"))
    return out


def _bubble(run: engine.PipelineRun, pp: int) -> float:
    """As predict: the pipeline's span beyond the busiest rank's own work (compute, inline collectives,
    FSDP waits)."""
    work = [sum(p.compute + p.inline + p.gather_wait for p in run.passes if p.rank == r) for r in range(pp)]
    return max(p.end for p in run.passes) - max(work)


def _waits(run: engine.PipelineRun) -> dict:
    """Seconds each rank spent waiting for each other rank's data: {(rank, on rank): seconds}."""
    on: defaultdict[tuple, float] = defaultdict(float)
    for p in run.passes:
        if p.wait_on is not None:
            on[(p.rank, p.wait_on)] += p.waited
    return on


def critical_path(run: engine.PipelineRun) -> list[tuple[int, int]]:
    """Walk back from the pass that ends last: through the data it waited for, else its rank's previous
    pass. Returns (rank, passes) runs, latest first."""
    by_key: dict = {}
    previous: dict = {}
    last_on_rank: dict = {}
    last_stage = max(q.stage for q in run.passes)
    for p in run.passes:
        by_key[output(p.stage, p.kind, p.mb)] = p
        previous[id(p)] = last_on_rank.get(p.rank)
        last_on_rank[p.rank] = p
    p = max(run.passes, key=lambda q: q.end)
    path: list = []
    while p is not None:
        if path and path[-1][0] == p.rank:
            path[-1][1] += 1
        else:
            path.append([p.rank, 1])
        if p.wait_on is not None:
            p = max((by_key[d] for d in inputs(p.stage, p.kind, p.mb, last_stage)), key=lambda q: q.end)
        else:
            p = previous[id(p)]
    return [tuple(x) for x in path]


def chrome_trace(sim: Simulation) -> dict:
    """Trace-event JSON (Perfetto): a process per simulated rank, threads for compute, stage-boundary sends
    and the data-parallel stream; microseconds."""
    threads = {"compute": 0, "pp": 1, "dp": 2}
    out = []
    replicas = sorted({e.replica for e in sim.events})
    pids: dict = {}
    for rep in replicas:
        for r in sorted({e.rank for e in sim.events}):
            pid = len(pids)
            pids[(rep, r)] = pid
            out.append({"ph": "M", "name": "process_name", "pid": pid,
                        "args": {"name": f"pp rank {r}" + (f" replica {rep}" if rep else "")}})
            for name, tid in threads.items():
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
    for e in sim.events:
        label = f"{e.kind}{e.mb} s{e.stage}" if e.mb >= 0 else e.kind
        out.append({"ph": "X", "pid": pids[(e.replica, e.rank)], "tid": threads[e.stream], "cat": e.kind,
                    "name": label, "ts": e.start * 1e6, "dur": (e.end - e.start) * 1e6})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_trace(sim: Simulation, path: str) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(sim), f)
