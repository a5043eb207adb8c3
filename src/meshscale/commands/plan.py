"""`meshscale plan`: search every hybrid layout, rank by predicted step time (or cost), explain the winner."""

import math
import shlex

from rich.table import Table

from meshscale.commands.predict import (add_batch_arguments, add_emit_arguments, add_goodput_arguments,
                                        add_model_arguments, goodput_line, goodput_of, json_line, print_emitted,
                                        resolve_inputs)
from meshscale.commands.progress import progress
from meshscale.commands.report import band_cell, footnotes, make_console
from meshscale.cost.bands import band_text
from meshscale.errors import UserError
from meshscale.export import emit
from meshscale.plan.explain import explain, rejected
from meshscale.plan.search import parse_fix, search, search_within
from meshscale.specs.layout import Layout, trainer_refusal


def add_arguments(p):
    add_model_arguments(p)
    p.add_argument("--cluster", required=True, help="preset name or JSON/TOML ClusterSpec")
    p.add_argument("--devices", type=int, help="device count (default: the cluster preset's)")
    add_batch_arguments(p)
    p.add_argument("--precision", default="bf16",
                   help="bf16 (16 B/param), bf16-pure (8 B/param), fp8, mxfp8 (Blackwell), fp32")
    p.add_argument("--top", type=int, default=5, help="how many layouts to show")
    p.add_argument("--memory-headroom", type=float, default=0.1, help="fraction of HBM kept free (default 0.1)")
    p.add_argument("--objective", choices=("time", "cost"), default="time",
                   help="time: fastest step; cost: fewest dollars per step, also trying 1/2, 1/4, 1/8 of the devices")
    p.add_argument("--allow-cross-tp", action="store_true", help="let TP span beyond the fast (NVLink) domain")
    p.add_argument("--fix", help="search only layouts with these values, e.g. pp=1,tp=8 or zero=3,schedule=1f1b")
    add_emit_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_goodput_arguments(p)


def run(args) -> int:
    fix = parse_fix(args.fix) if args.fix is not None else {}
    model, cluster, devices, batch = resolve_inputs(args)
    if args.top < 1:
        raise UserError(f"--top must be at least 1, got {args.top}")
    if not 0 <= args.memory_headroom < 1:
        raise UserError(f"--memory-headroom must be in [0, 1), got {args.memory_headroom}")
    counts = [devices]
    if args.objective == "cost":
        if not cluster.price_per_device_hour:
            raise UserError(f"cluster {cluster.name} has no price_per_device_hour; use --objective time")
        counts += [devices // k for k in (2, 4, 8) if devices % k == 0]
    with progress(None, f"searching the layouts of {devices:,} devices"):
        plans = [(n, search(model, cluster, n, batch, args.precision, top=args.top, headroom=args.memory_headroom,
                            cross_tp=args.allow_cross_tp, fix=fix)) for n in counts]
    plan = plans[0][1]
    if args.objective == "cost":
        plan = _merge_by_cost(plans, cluster, args.top)
    if not plan.ranked:
        need, where = min((p.smallest for _, p in plans), key=lambda s: s[0])
        if fix and not where:
            raise UserError(f"no layout of {devices} devices has --fix {args.fix} and splits {batch} sequences of "
                            f"{model.seq} tokens; relax --fix or change the batch or the device count")
        if not where:
            raise UserError(f"no layout of {devices} devices splits {batch} sequences of {model.seq} tokens "
                            "(dp must divide the batch, cp the sequence); change the batch or the device count")
        raise UserError(f"nothing fits: the smallest memory per device any layout needs is {need / 1e9:,.1f} GB "
                        f"(at {where}), but {cluster.name} offers "
                        f"{cluster.hbm_bytes * (1 - args.memory_headroom) / 1e9:,.1f} GB "
                        f"after {args.memory_headroom:.0%} headroom; add devices or pick a larger accelerator")
    win_devices = plan.ranked[0].devices
    good = goodput_of(args, plan.ranked[0])  # of the winner
    extra = {**plan.to_dict(), **({"goodput": good.to_dict()} if good else {})}
    if args.emit == "torchrun":
        command = emit_torchrun(args, model, cluster, plan.ranked[0], batch, fix, plan)
        print(json_line({**extra, "emit": {"framework": "torchrun", "command": command}}) if args.json else command)
        return 0
    if args.emit:
        print_emitted(args, _emit_framework(args, model, cluster, plan, batch, fix), extra)
        return 0
    if args.json:
        print(json_line(extra))
        return 0
    with progress(None, "explaining the choice"):
        why = explain(plan, model, cluster, win_devices, batch, args.precision, args.memory_headroom)
    _print_human(plan, why, rejected(plan), cluster)
    if good:
        print(goodput_line(good))
    return 0


def _emit_framework(args, model, cluster, plan, batch: int, fix: dict):
    return emit(args.emit, model, cluster, Layout.parse(plan.ranked[0].layout), batch, args.precision, args.steps,
                args.data, headroom=args.memory_headroom, cross_tp=args.allow_cross_tp, fix=fix)


def _merge_by_cost(plans, cluster, top):
    """Rank layouts from every device count by dollars per step (devices x price x step time)."""
    dollars = lambda p: p.devices * cluster.price_per_device_hour * p.step_time_s / 3600  # noqa: E731
    merged = sorted((p for _, plan in plans for p in plan.ranked), key=dollars)
    best = plans[0][1]
    best.ranked, best.rejected = merged[:top], merged[top:top + 3]
    best.evaluated = sum(p.evaluated for _, p in plans)
    best.enumerated = sum(p.enumerated for _, p in plans)
    best.objective = "cost"
    return best


def emit_torchrun(args, model, cluster, winner, batch: int, fix: dict, plan=None) -> str:
    """The torchrun line for the winner or, when the trainer cannot run it yet, for the best layout of `plan`'s
    pool it can run (a `#` line above says why, so the output still pastes into a shell; without a plan, refused)."""
    if cluster.torus:
        raise UserError(f"--emit torchrun: meshscale train runs on torch.distributed (GPUs or CPUs); {cluster.name} "
                        "is a TPU slice, use --emit maxtext")
    reason = trainer_refusal(Layout.parse(winner.layout), model)
    if reason is None:
        return torchrun_command(args, cluster, winner.devices, winner.layout, batch)
    if trainer_refusal(Layout(), model) or plan is None:
        raise UserError(f"--emit torchrun: {reason or trainer_refusal(Layout(), model)}")
    # the shape filter prunes the search; the full rule (sp, zero, schedule per model family) picks among the top
    trainable = search_within(plan, model, cluster, winner.devices, batch, args.precision, args.memory_headroom,
                              where=lambda tp, pp, cp, dp, ep: cp == 1 and model.vocab % tp == 0, fix=fix,
                              cross_tp=args.allow_cross_tp, top=64)
    runs = [p for p in trainable if trainer_refusal(Layout.parse(p.layout), model) is None]
    if not runs:
        raise UserError(f"--emit torchrun: the winner {winner.layout} cannot be trained yet ({reason}) and no "
                        "layout the trainer runs fits; add devices or lower the batch")
    best = runs[0]
    return (f"# {winner.layout} is predicted fastest ({winner.step_time_s * 1e3:,.1f} ms) but meshscale train "
            f"cannot run it yet ({reason}); the fastest layout it runs ({best.step_time_s * 1e3:,.1f} ms):\n"
            + torchrun_command(args, cluster, best.devices, best.layout, batch))


def torchrun_command(args, cluster, devices: int, layout: str, batch: int) -> str:
    """torchrun line for `meshscale train`: one process per device, nodes of the fast-domain size."""
    per_node = min(devices, cluster.tiers[0].size or devices)
    nodes = math.ceil(devices / per_node)
    rdzv = " --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500" if nodes > 1 else ""
    seq = f" --seq {args.seq}" if args.seq else ""
    data = f" --data {shlex.quote(args.data)}" if args.data else ""
    return (f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{rdzv} -m meshscale train --model {args.model} "
            f"--layout {layout} --global-batch {batch}{seq} --precision {args.precision} --steps {args.steps}{data}")


def _print_human(plan, lines, losers, cluster):
    console = make_console()
    console.print(f"searched {plan.enumerated:,} layouts ({plan.fitting:,} fit in memory), costed {plan.evaluated:,} "
                  f"in full, in {plan.seconds:.2f} s; objective: {plan.objective}")
    t = Table(title=f"top {len(plan.ranked)} layouts", title_justify="left")
    for col in ("#", "layout", "memory / HBM", "step", "band", "MFU", "tokens/s", "bound"):
        t.add_column(col, justify="left" if col in ("layout", "bound") else "right", overflow="fold")
    for i, p in enumerate(plan.ranked, 1):
        mem = p.memory_per_device_bytes["total"]
        t.add_row(str(i), p.layout, f"{mem / 1e9:,.1f} / {cluster.hbm_bytes / 1e9:,.0f} GB",
                  f"{p.step_time_s * 1e3:,.1f} ms", band_cell(p.band), f"{p.mfu:.1%}", f"{p.tokens_per_s:,.0f}",
                  p.bound)
    console.print(t)
    if plan.ranked:
        console.print(f"error band: {band_text(plan.ranked[0].band)}")
    for line in footnotes([(f"#{i}", p.band) for i, p in enumerate(plan.ranked, 1)]):
        console.print(line)
    console.print("[bold]Why[/]")
    for line in lines:
        console.print(f"- {line}")
    if losers:
        console.print("[bold]Nearest alternatives (best of other parallel shapes)[/]")
        for layout, reason in losers[:5]:
            console.print(f"- {layout}: {reason}")
