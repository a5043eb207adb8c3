"""`meshscale scale`: the best layout and its throughput, cost and energy across device counts."""

from meshscale.commands.counts import binary_count
from meshscale.commands.predict import add_goodput_arguments, add_model_arguments, json_line, model_at_seq
from meshscale.commands.progress import progress
from meshscale.commands.report import band_cell, footnotes
from meshscale.cost.bands import band_text, replica_growth, replica_growth_text
from meshscale.outputs import check_outputs
from meshscale.plan.scaling import parse_devices, scale
from meshscale.plots import scaling_plot
from meshscale.specs.cluster import load_cluster


def add_arguments(p):
    add_model_arguments(p)
    p.add_argument("--cluster", required=True, help="preset name or JSON/TOML ClusterSpec")
    p.add_argument("--devices", required=True, help="increasing counts, 64,128,256, or a doubling range 64..16384")
    batch = p.add_mutually_exclusive_group(required=True)
    batch.add_argument("--global-batch-tokens", type=binary_count, help="strong scaling: the global batch held fixed")
    batch.add_argument("--tokens-per-device", type=binary_count, help="weak scaling: the tokens per device held fixed")
    p.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    p.add_argument("--precision", default="bf16",
                   help="bf16 (16 B/param), bf16-pure (8 B/param), fp8, mxfp8 (Blackwell), fp32")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw throughput and efficiency against devices")
    p.add_argument("--overwrite", action="store_true", help="allow replacing an existing --plot file")
    add_goodput_arguments(p)


def run(args) -> int:
    check_outputs(args, "plot")  # before any work
    counts = parse_devices(args.devices)
    model = model_at_seq(args)
    cluster = load_cluster(args.cluster)
    mode = "strong" if args.global_batch_tokens is not None else "weak"
    with progress(len(counts), "planning") as planned:
        rows = scale(model, cluster, counts, args.global_batch_tokens, args.tokens_per_device, args.precision,
                     mtbf_hours=args.mtbf_hours, checkpoint_bandwidth=args.checkpoint_bandwidth,
                     restart_s=args.restart_seconds, planned=planned)
    if args.plot:
        scaling_plot(rows, mode, f"{model.name} on {cluster.name}", args.plot)
    if args.json:
        print(json_line({"mode": mode, "rows": [r.to_dict() for r in rows], "band": rows[0].band,
                         "replica_growth": replica_growth()}))
        return 0
    _print_table(rows, mode, model, cluster)
    return 0


def _print_table(rows, mode, model, cluster):
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # piped: wide enough that layouts stay on one line
        console = Console(width=230)
    held = (f"global batch {rows[0].global_batch * model.seq:,} tokens" if mode == "strong"
            else f"{rows[0].global_batch * model.seq // rows[0].devices:,} tokens per device")
    t = Table(title=f"{mode} scaling of {model.name} on {cluster.name} ({held})", title_justify="left")
    cols = ["devices", "layout", "step", "band", "tokens/s", "per device", "MFU", "efficiency", "marginal",
            "exposed comm", "$/M tokens", "J/token"]
    if rows[0].goodput:
        cols += ["ETTR", "goodput tokens/s"]
    for col in cols:
        t.add_column(col, justify="left" if col == "layout" else "right", no_wrap=True)
    for r in rows:
        cells = [f"{r.devices:,}", ("* " if r.change else "") + r.layout, f"{r.step_time_s * 1e3:,.0f} ms",
                 band_cell(r.band),
                 f"{r.tokens_per_s:,.0f}", f"{r.tokens_per_s_per_device:,.0f}", f"{r.mfu:.1%}", f"{r.efficiency:.0%}",
                 "" if r.marginal_tokens_per_s_per_device is None else f"{r.marginal_tokens_per_s_per_device:,.0f}",
                 f"{r.exposed_comm_fraction:.0%}",
                 "" if r.usd_per_million_tokens is None else f"{r.usd_per_million_tokens:,.2f}",
                 "" if r.joules_per_token is None else f"{r.joules_per_token:,.2f}"]
        if r.goodput:
            cells += [f"{r.goodput['ettr']:.1%}", f"{r.goodput['tokens_per_s']:,.0f}"]
        t.add_row(*cells)
    console.print(t)
    console.print(f"error band: {band_text(rows[0].band)}")
    for line in footnotes([(f"{r.devices:,}", r.band) for r in rows]):
        console.print(line)
    console.print(replica_growth_text())
    for r in rows:
        if r.change:
            console.print(f"* at {r.devices:,} the winner changes: {r.change}")
