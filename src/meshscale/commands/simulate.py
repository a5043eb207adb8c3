"""`meshscale simulate`: one optimizer step, pass by pass: bubble, stragglers, critical path, timeline."""

from rich.table import Table

from meshscale.commands.predict import (add_goodput_arguments, add_step_arguments, goodput_line, json_line,
                                        resolve_inputs)
from meshscale.commands.report import make_console, ms
from meshscale.cost import predict
from meshscale.cost.goodput import goodput
from meshscale.outputs import check_outputs
from meshscale.plots import timeline_plot
from meshscale.sim.measured import replay
from meshscale.sim.step import parse_stragglers, simulate, write_trace
from meshscale.specs.layout import Layout, check_against


def add_arguments(p):
    add_step_arguments(p)
    p.add_argument("--straggler", action="append", metavar="[link:]RANK:FACTOR",
                   help="device RANK computes FACTOR times slower, e.g. 17:1.3; with link:, every transfer over its "
                        "links (pipeline sends, its share of TP/CP/EP and data-parallel rings) takes FACTOR times "
                        "longer, e.g. link:17:4 (repeatable)")
    p.add_argument("--trace", metavar="FILE.json", help="write the simulated step as Chrome-trace JSON (Perfetto)")
    p.add_argument("--plot", metavar="FILE.png", help="draw the simulated step's timeline as a PNG")
    p.add_argument("--overwrite", action="store_true", help="allow replacing an existing --trace or --plot file")
    p.add_argument("--times-from", metavar="TRACE",
                   help="replay the F/B/W durations of a `meshscale train --trace` file and compare bubbles")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_goodput_arguments(p)


def run(args) -> int:
    check_outputs(args, "trace", "plot")  # before any work
    model, cluster, devices, batch = resolve_inputs(args)
    layout = Layout.parse(args.layout, devices)
    if args.times_from:
        return _replay(args, layout, model, batch)
    stragglers, slow_links = parse_stragglers(args.straggler, devices)
    sim = simulate(model, cluster, layout, batch, args.precision, stragglers, slow_links)
    good = None
    if args.mtbf_hours is not None:
        pred = predict(model, cluster, layout, batch, args.precision)
        good = goodput(pred.checkpoint_bytes_per_device, pred.checkpoint_bytes_total, devices, args.mtbf_hours,
                       args.checkpoint_bandwidth, args.restart_seconds)
    if args.trace:
        write_trace(sim, args.trace)
    if args.plot:
        timeline_plot(sim, args.plot)
    if args.json:
        print(json_line({**sim.to_dict(), **({"goodput": good.to_dict()} if good else {})}))
        return 0
    _print(sim)
    if good:
        print(goodput_line(good))
    return 0


def _print(sim):
    console = make_console()
    console.print(f"simulated step of {sim.layout} on {sim.devices} devices, {sim.microbatches} micro-batch(es): "
                  f"[bold]{ms(sim.step_time_s)}[/] (predict: {ms(sim.predicted_step_time_s)}), bubble "
                  f"{ms(sim.bubble_s)} = {sim.bubble_fraction:.1%} of the step")
    if sim.healthy_step_time_s:
        extra = sim.step_time_s - sim.healthy_step_time_s
        console.print(f"the straggler(s) cost {ms(extra)} ({extra / sim.healthy_step_time_s:.1%}) over the healthy "
                      f"step of {ms(sim.healthy_step_time_s)}")
    t = Table(title="per simulated rank (each stands for every TP rank and DP/CP replica of its stage)",
              title_justify="left")
    for col in ("rank", "busy", "idle", "exposed comm"):
        t.add_column(col, justify="left" if col == "rank" else "right")
    for r in sim.ranks:
        t.add_row(r.name, ms(r.busy_s), ms(r.idle_s), ms(r.exposed_comm_s))
    console.print(t)
    path = " <- ".join(f"pp rank {rank} ({n} pass{'es' if n > 1 else ''})" for rank, n in sim.critical_path[:12])
    more = " <- ..." if len(sim.critical_path) > 12 else ""
    console.print(f"critical path, from the last pass back: {path}{more}")
    for line in sim.waits:
        console.print(f"- {line}")


def _replay(args, layout, model, batch) -> int:
    check_against(layout, model, batch)
    layout = layout.resolve_mbs(batch)
    r = replay(args.times_from, layout, layout.microbatches(batch))
    if args.json:
        print(json_line({"measured_bubble": r.measured, "simulated_bubble": r.simulated, "gaps_s": vars(r.gaps),
                          "rank_gaps_s": [vars(r.rank_gaps[k]) for k in sorted(r.rank_gaps)]}))
        return 0
    g = r.gaps
    print(f"between passes (trace means over all ranks): {g.delivered * 1e3:.2f} ms from an input made on another "
          f"rank, {g.posted * 1e3:.2f} ms after the previous pass where that input was already made, "
          f"{g.local * 1e3:.2f} ms before a pass with no input from another rank")
    for rank, (meas, sim) in enumerate(zip(r.measured, r.simulated)):
        own = r.rank_gaps[rank]
        print(f"pp rank {rank}: measured bubble {meas:.1%}, simulated from its F/B/W times {sim:.1%} (its own: "
              f"{own.posted * 1e3:.2f} ms after its previous pass, {own.local * 1e3:.2f} ms before one without input)")
    return 0
