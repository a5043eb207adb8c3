"""`meshscale budget`: the cluster, device count and layout that train a token count by a deadline, with
days, dollars, energy and ETTR, and the Pareto front of time against cost."""

import math

from rich.table import Table

from meshscale.commands.counts import binary_count, decimal_amount, positive_number
from meshscale.commands.predict import add_model_arguments, add_restart_argument, json_line, model_at_seq
from meshscale.commands.progress import progress
from meshscale.commands.report import make_console
from meshscale.cost.bands import band_text
from meshscale.cost.goodput import DEFAULT_CHECKPOINT_BANDWIDTH, LLAMA3_MTBF_HOURS, check_inputs
from meshscale.errors import UserError
from meshscale.outputs import check_outputs
from meshscale.plan.budget import Candidate, choose, options, pairs
from meshscale.plan.scaling import parse_devices
from meshscale.plots import budget_plot
from meshscale.specs.cluster import load_cluster


def add_arguments(p):
    add_model_arguments(p)
    p.add_argument("--tokens", required=True, type=decimal_amount, help="tokens to train on, e.g. 15T or 2e12")
    p.add_argument("--deadline-days", required=True, type=positive_number, help="wall-clock days the run may take")
    p.add_argument("--cluster", required=True, action="append", metavar="NAME[:PRICE[:MTBF]]",
                   help="a candidate: preset or ClusterSpec file, its $/device-hour (default: its list price) and "
                        f"MTBF in hours per device (default: Llama 3's {LLAMA3_MTBF_HOURS:,.0f}); repeat for more")
    p.add_argument("--global-batch-tokens", required=True, type=binary_count, help="tokens per optimizer step")
    p.add_argument("--devices", help="device counts to try, 64,128,256 or 64..16384 (default: doubling from one "
                                     "node or 64-chip slice up to --max-devices)")
    p.add_argument("--max-devices", type=int, default=16384, help="largest count tried by default (16384)")
    p.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    p.add_argument("--precision", default="bf16", help="bf16, bf16-pure, fp8, mxfp8, fp32")
    p.add_argument("--checkpoint-bandwidth", type=positive_number, default=DEFAULT_CHECKPOINT_BANDWIDTH,
                   help="bytes/s per device to storage (default: Llama 3's 2 TB/s over 16,384 GPUs)")
    add_restart_argument(p)
    p.add_argument("--plot", metavar="FILE.png", help="draw days against dollars with the Pareto front")
    p.add_argument("--overwrite", action="store_true", help="allow replacing an existing --plot file")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def candidate(text: str):
    name, *rest = text.split(":")
    if len(rest) > 2:
        raise UserError(f"--cluster {text!r}: give NAME, NAME:PRICE or NAME:PRICE:MTBF_HOURS")
    try:
        numbers = [float(x) for x in rest]
    except ValueError:
        raise UserError(f"--cluster {text!r}: price and MTBF must be numbers (NAME:PRICE:MTBF_HOURS)") from None
    cluster = load_cluster(name)
    price = numbers[0] if numbers else cluster.price_per_device_hour
    mtbf = numbers[1] if len(numbers) > 1 else LLAMA3_MTBF_HOURS
    if numbers and not 0 < price < math.inf:
        raise UserError(f"--cluster {text!r}: the price must be a positive number of dollars per device-hour")
    if not price > 0:
        raise UserError(f"--cluster {text!r}: {cluster.name} has no list price; give one as {name}:PRICE")
    check_inputs(mtbf, 1.0)
    return Candidate(cluster, price, mtbf)


def run(args) -> int:
    check_outputs(args, "plot")  # before any work
    model = model_at_seq(args)
    candidates = [candidate(text) for text in args.cluster]
    counts = parse_devices(args.devices) if args.devices else None
    if args.max_devices <= 0:
        raise UserError(f"--max-devices must be positive, got {args.max_devices}")
    if args.global_batch_tokens <= 0 or args.global_batch_tokens % model.seq:
        raise UserError(f"--global-batch-tokens {args.global_batch_tokens} must be a positive multiple of the "
                        f"sequence length {model.seq}")
    with progress(len(pairs(candidates, counts, args.max_devices)), "planning") as planned:
        opts = options(model, candidates, args.tokens, args.global_batch_tokens, args.deadline_days, counts,
                       args.max_devices, args.precision, args.checkpoint_bandwidth, args.restart_seconds, planned)
    best = choose(opts)
    if args.plot:
        budget_plot(opts, args.deadline_days, f"{model.name}, {args.tokens:.3g} tokens", args.plot)
    if args.json:
        print(json_line({"choice": best.to_dict(), "options": [o.to_dict() for o in opts]}))
        return 0
    _print(opts, best, model, args)
    return 0


def _p90(band: dict) -> str:
    return f"±{band['p90_abs_error']:.1%}" if band["runs"] else "unknown"


def _with_range(o, value: float | None, fmt: str) -> str:
    if value is None:
        return ""
    rng = o.range_of(value)
    if rng is None:
        return fmt.format(value)
    high = fmt.format(rng[1]) if rng[1] != math.inf else "any"
    return f"{fmt.format(value)}\n{fmt.format(rng[0])}-{high}"


def _print(opts, best, model, args) -> None:
    console = make_console()
    t = Table(title=f"Pareto front of days against dollars: {model.name}, {args.tokens:.3g} tokens, "
                    f"{args.global_batch_tokens:,} tokens a step", title_justify="left")
    for col in ("cluster", "devices", "layout", "step\np90 band", "ETTR\nband", "days\np90 range", "dollars\np90 range",
                "energy MWh\np90 range", "deadline"):
        t.add_column(col, justify="left" if col in ("cluster", "layout") else "right")
    for o in (o for o in opts if o.pareto):
        t.add_row(o.cluster, f"{o.devices:,}", o.layout, f"{o.step_time_s * 1e3:,.0f} ms\n{_p90(o.band)}",
                  f"{o.ettr:.1%}\nnone", _with_range(o, o.days, "{:,.1f}"), _with_range(o, o.dollars, "{:,.0f}"),
                  _with_range(o, o.energy_mwh, "{:,.1f}"), o.deadline)
    console.print(t)
    for b in {band_text(o.band) for o in opts if o.pareto}:
        console.print(f"error band: {b}")
    console.print("days, dollars and energy: as predicted, and the range they lie in if the step time errs as far as "
                  "the band's p90; ETTR has no band (it follows from the MTBF and checkpoint bandwidth given)")
    verdict = ("the cheapest that meets" if best.meets_deadline else
               "none meets the deadline; the fastest misses")
    console.print(f"choice ({verdict} {args.deadline_days:g} days): {best.devices:,} x {best.cluster}, layout "
                  f"{best.layout}: {best.days:,.1f} days, ${best.dollars:,.0f}, ETTR {best.ettr:.1%}"
                  + ("" if best.energy_mwh is None else f", {best.energy_mwh:,.1f} MWh")
                  + ("; at risk: the band's p90 runs past the deadline" if best.deadline == "at risk" else ""))
