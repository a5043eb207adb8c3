"""`meshscale check`: a running torchtitan or Megatron-LM job's log beside the prediction for its config."""

import math
from pathlib import Path

from rich.table import Table

from meshscale.check import check
from meshscale.commands.predict import json_line
from meshscale.commands.report import make_console
from meshscale.cost import bands
from meshscale.cost.bands import band_text, unvalidated_text
from meshscale.errors import UserError
from meshscale.specs.cluster import load_cluster
from meshscale.specs.model import load_model


def add_arguments(p):
    p.add_argument("--log", required=True, help="the job's training log (torchtitan or Megatron-LM step lines)")
    p.add_argument("--config", required=True, help="the job's config: torchtitan job TOML, or a file of "
                                                     "Megatron-LM arguments (its launch script will do)")
    p.add_argument("--cluster", required=True, help="preset name or JSON/TOML ClusterSpec")
    p.add_argument("--devices", type=int, help="device count (Megatron-LM's arguments do not hold it)")
    p.add_argument("--model", help="preset or ModelSpec file (default: the model the config names or spells out)")
    p.add_argument("--framework", choices=("torchtitan", "megatron"), help="default: read from the log")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    if args.devices is not None and args.devices <= 0:
        raise UserError(f"--devices must be positive, got {args.devices}")
    result = check(_read(args.log, "--log"), _read(args.config, "--config"), load_cluster(args.cluster),
                   args.devices, load_model(args.model) if args.model else None, args.framework)
    if args.json:
        print(json_line(result.to_dict()))
        return 0
    _print(result)
    return 0


def _read(path: str, flag: str) -> str:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"{flag} {path}: no such file")
    return file.read_text(errors="replace")


def _print(result) -> None:
    console = make_console()
    pred = result.prediction
    console.print(f"{result.framework} job: {pred.model} on {pred.devices} x {pred.cluster}, layout "
                  f"[bold]{pred.layout}[/], {pred.global_batch} x {pred.seq} tokens a step; "
                  f"{result.measured.steps} step lines read" +
                  (f"; NCCL {result.nccl}, as the log names it" if result.nccl else ""))
    table = Table(title="measured vs predicted", title_justify="left")
    for col in ("", "measured", "predicted", "band (p90)", "measured / predicted", "in band"):
        table.add_column(col, justify="right" if col else "left")
    for r in result.rows:
        table.add_row(r.name, _fmt(r.measured, r.unit), _fmt(r.predicted, r.unit), _range(r), f"{r.ratio:.2f}x",
                      _verdict(r))
    console.print(table)
    console.print(f"error band: {band_text(pred.band)}; it covers step times (and the rates they set), not memory")
    if pred.band.get("unvalidated"):
        console.print(f"† {unvalidated_text(pred.band)}")
    terms = sorted(result.breakdown.items(), key=lambda kv: -kv[1])[:4]
    console.print(f"differs most: [bold]{result.worst.name}[/] ({result.worst.ratio:.2f}x); the predicted step is "
                  + ", ".join(f"{name} {t * 1e3:,.1f} ms" for name, t in terms if t > 0))
    if result.proposal is None:
        console.print(f"no layout {result.framework} expresses is predicted 3% faster than this one")
        return
    p = result.proposal
    console.print(f"proposed: [bold]{p.layout}[/], predicted {p.step_time_s * 1e3:,.1f} ms (now "
                  f"{pred.step_time_s * 1e3:,.1f} ms); at this job's measured/predicted ratio, "
                  f"{result.expected_step_s * 1e3:,.1f} ms a step")
    for line in result.diff:
        console.print(line, markup=False, highlight=False)


def _range(r) -> str:
    rng = r.measured_range
    if r.band is None:
        return "none"
    if rng is None:
        return "unknown"
    return f"{_fmt(rng[0], r.unit)} - {_fmt(rng[1], r.unit) if rng[1] != math.inf else 'any'}"


def _verdict(r) -> str:
    if r.within is None:
        return ""
    if r.within == "outside":
        return f"no ({abs(bands.error(r.predicted, r.measured, r.rate)):.0%} off)"
    return f"yes ({r.within})"


def _fmt(x: float, unit: str) -> str:
    if unit == "s":
        return f"{x * 1e3:,.1f} ms"
    if unit == "B":
        return f"{x / 2**30:,.1f} GiB"
    return f"{x:,.1f}"
