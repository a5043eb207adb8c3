"""Why the winner won, in the seeds' terms: memory, critical batch sizes, the fast domain, the bubble."""

from meshscale.cost import bands, critical
from meshscale.cost.comm import group_link
from meshscale.cost.memory import PRECISIONS, optimizer_bytes, params_on_rank, trained_params_on_rank, weight_bytes
from meshscale.plan.search import Plan, fastest_where, search_within
from meshscale.specs.layout import Layout
from meshscale.units import si_bytes

# The slowest a covered layout may be and still be named as the winner's alternative: past twice the winner's
# step it is no alternative, and proving none exists could mean costing the whole pool.
COVERED_WITHIN = 2.0


def ms(x: float) -> str:
    return f"{x * 1e3:,.1f} ms"


def components(pred) -> dict:
    """The step's terms, summing to its time as predict adds them: the devices' compute, their wait on the host
    issuing it (host wait), bubble, optimizer, each axis's collective (what shows of it plus what it slows the
    compute it hides behind, its interference_s), and the step's small control all-reduces
    (cost.step.control_seconds: the rest of the exposed communication)."""
    parts = {"compute": pred.kernels_s, "host wait": pred.host_wait_s, "bubble": pred.bubble_s,
             "optimizer": pred.optimizer_s}
    for e in pred.comm:
        key = f"{e['axis']} {e['collective']}"
        parts[key] = parts.get(key, 0.0) + e["exposed_s"] + e["interference_s"]
    parts["control"] = pred.exposed_comm_s - sum(e["exposed_s"] + e["interference_s"] for e in pred.comm)
    return parts


def explain(plan: Plan, model, cluster, devices: int, global_batch: int, precision: str = "bf16",
            headroom: float = 0.1) -> list[str]:
    win = plan.ranked[0]
    layout = Layout.parse(win.layout, devices)
    capacity = cluster.hbm_bytes * (1 - headroom)
    tokens = global_batch * model.seq
    per_device = tokens / devices
    lines = [_fixed(plan)] if plan.fixed else []
    lines += [f"Winner {win.layout}: {ms(win.step_time_s)} per step, MFU {win.mfu:.1%}, "
             f"{win.memory_per_device_bytes['total'] / 1e9:,.1f} of {cluster.hbm_bytes / 1e9:,.0f} GB per device; "
             f"{_dominant(win)}."]
    lines.append(_covered(plan, model, win))
    lines.append(_pure_dp(model, cluster, devices, global_batch, precision, capacity, per_device, headroom, plan))
    lines.append(_pure_fsdp(model, cluster, devices, global_batch, precision, headroom, per_device, win, plan))
    lines.append(_why_tp(model, cluster, devices, global_batch, precision, headroom, layout, win, plan))
    lines.append(_across_nodes(model, cluster, layout, win, global_batch, precision))
    r = win.regime
    if r.get("critical_tokens"):
        lines.append(f"Critical batch: {r['strategy']} is compute-bound above {r['critical_tokens']:,.0f} tokens per "
                     f"device; this batch gives {r['per_device_tokens']:,.0f} ({r['side']} side).")
    return [line for line in lines if line]


def _covered(plan: Plan, model, win) -> str:
    """Where the winner rests on mechanisms no validation run used, the fastest layout that rests on none."""
    if not win.band.get("unvalidated"):
        return ""
    alt = fastest_where(plan, lambda layout: not bands.unvalidated(layout, model.seq),
                        lambda pred: not pred.band["unvalidated"], COVERED_WITHIN * win.step_time_s)
    head = f"The winner rests on what no run of the validation set used ({'; '.join(win.band['unvalidated'])})"
    if alt is None:
        return (f"{head}, and no layout that fits avoids it at up to {COVERED_WITHIN:g}x the winner's step time: "
                "its prediction is unchecked there.")
    gap = alt.step_time_s / win.step_time_s - 1
    median = win.band.get("median_abs_error")
    advice = (f": inside the band's median error ({median:.1%}), so prefer it unless you have measured those terms"
              if median and gap <= median else "")
    return (f"{head}. The fastest layout the set covers, {alt.layout}, is predicted {gap:+.1%} slower "
            f"({ms(alt.step_time_s)}){advice}.")


def _fixed(plan: Plan) -> str:
    values = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in plan.fixed.items())
    return (f"Fixed by --fix: {values}; only layouts with these values were searched "
            f"({plan.enumerated:,} of them), so the winner is the best of the rest.")


def rejected(plan: Plan) -> list[tuple[str, str]]:
    """The best layout of each runner-up parallel shape and the part of the step where it lost most."""
    win = plan.ranked[0]
    base = components(win)
    out = []
    for alt in plan.rejected:
        diff = {k: v - base.get(k, 0.0) for k, v in components(alt).items()}
        worst = max(diff, key=lambda k: diff[k])
        out.append((alt.layout, f"+{ms(alt.step_time_s - win.step_time_s)}: {worst} {ms(diff[worst])} longer"))
    return out


def _dominant(pred) -> str:
    parts = sorted(components(pred).items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{k} {v / pred.step_time_s:.0%}" for k, v in parts[:3] if v > 0)
    return f"time goes to {shown}"


def _pure_dp(model, cluster, devices, batch, precision, capacity, per_device, headroom, plan) -> str:
    b, weights = PRECISIONS[precision], weight_bytes(cluster, precision)
    # under LoRA the frozen weights hold their value alone; gradients and optimizer state are the adapters'
    per_param = (b["params"] if model.lora else weights) + b["grads"] + b["optimizer"]
    frozen = model.param_count() if model.lora else 0
    state = frozen * weights + model.trained_param_count() * per_param
    if state > capacity:
        held = "the frozen weights + the adapters' params, grads and optimizer" if model.lora else \
            f"params + grads + optimizer ({per_param} B/param)"
        return (f"Pure DP is rejected for memory: every replica holds {held} = {si_bytes(state)} "
                f"against {si_bytes(capacity)} usable HBM per device.")
    if batch % devices:
        return f"Pure DP cannot split {batch} sequences over {devices} devices (it needs dp to divide the batch)."
    # the best replicated layout (every device a whole copy, zero=0), with the plan's other fixed values
    found = search_within(plan, model, cluster, devices, batch, precision, headroom,
                          where=lambda tp, pp, cp, dp, ep: tp == pp == cp == ep == 1,
                          fix={**_except(plan.fixed, "tp", "pp", "dp", "cp", "ep", "zero", "shard"), "zero": 0})
    if not found:
        return "Pure DP (a whole replica on every device) has no layout that fits."
    pred = found[0]
    crit = pred.regime.get("critical_tokens") or 0
    side = "below" if per_device < crit else "above"
    return (f"Pure DP ({pred.layout}) fits ({si_bytes(pred.memory_per_device_bytes['total'])}) with {per_device:,.0f} "
            f"tokens per device, {side} its critical batch {crit:,.0f} (C/W); predicted {ms(pred.step_time_s)}.")


def _pure_fsdp(model, cluster, devices, batch, precision, headroom, per_device, win, plan) -> str:
    if devices == 1:
        return ""
    sub = search_within(plan, model, cluster, devices, batch, precision, headroom,
                        where=lambda tp, pp, cp, dp, ep: tp == 1 and pp == 1 and ep == 1,
                        fix={**_except(plan.fixed, "tp", "pp", "dp", "cp", "ep", "zero"), "zero": 3})
    fsdp = [p for p in sub if "zero=3" in p.layout]
    if not fsdp:
        return "Pure FSDP (tp=pp=1 over every device) has no layout that fits or divides the batch."
    p = fsdp[0]
    comm_total = sum(e["time_s"] for e in p.comm)
    w = group_link(cluster, devices, devices, 1).raw_bandwidth
    crit = critical.dp_critical(cluster.peak_flops_bf16, w)
    verdict = ("communication-bound" if comm_total > p.compute_s else "compute-bound")
    batch_vs = f"{per_device:,.0f} tokens per device vs its critical batch C/W = {crit:,.0f}"
    if p.step_time_s > win.step_time_s:
        return (f"Pure FSDP ({p.layout}) fits ({si_bytes(p.memory_per_device_bytes['total'])}) but is {verdict}: its "
                f"collectives take {ms(comm_total)} against {ms(p.compute_s)} of compute; {batch_vs}; predicted "
                f"{ms(p.step_time_s)} vs the winner's {ms(win.step_time_s)}.")
    other = _best_other(model, cluster, devices, batch, precision, headroom, win, plan)
    return (f"Pure FSDP wins: its collectives ({ms(comm_total)}) run behind {ms(p.compute_s)} of compute, "
            f"{ms(p.exposed_comm_s)} left exposed; {batch_vs}; {other}.")


def _best_other(model, cluster, devices, batch, precision, headroom, win, plan) -> str:
    """When pure FSDP wins, the best layout that is genuinely different: one with TP, PP or EP (from the
    plan's alternatives, the best of the runner-up shapes, when one of them is; else searched)."""
    other = lambda layout: layout.tp > 1 or layout.pp > 1 or layout.ep > 1  # noqa: E731
    found = [p for p in plan.rejected if other(Layout.parse(p.layout, devices))]
    if not found:
        found = search_within(plan, model, cluster, devices, batch, precision, headroom,
                              where=lambda tp, pp, cp, dp, ep: other(Layout(tp=tp, pp=pp, ep=ep)),
                              fix=_except(plan.fixed, "tp", "pp", "dp", "cp", "ep"))
    if not found:
        return "no layout with TP, PP or EP fits"
    alt = found[0]
    base = components(win)
    diff = {k: v - base.get(k, 0.0) for k, v in components(alt).items()}
    worst = max(diff, key=lambda k: diff[k])
    return (f"the best layout with TP, PP or EP, {alt.layout}, is predicted {ms(alt.step_time_s)} "
            f"(+{ms(alt.step_time_s - win.step_time_s)}, most of it {worst}: {ms(diff[worst])} longer)")


def _except(fixed: dict, *keys) -> dict:
    """The --fix values that still apply to a comparison which sets `keys` itself."""
    return {k: v for k, v in fixed.items() if k not in keys}


def _why_tp(model, cluster, devices, batch, precision, headroom, layout, win, plan) -> str:
    tp = layout.tp
    tier = next((e["tier"] for e in win.comm if e["axis"] == "tp"), None)
    domain = cluster.tiers[0].name
    neighbours = []
    for other in sorted({max(1, tp // 2), tp * 2} - {tp}):
        sub = search_within(plan, model, cluster, devices, batch, precision, headroom, cross_tp=True, shapes=1,
                            where=lambda t, pp, cp, dp, ep, o=other: t == o, fix=_except(plan.fixed, "tp", "dp"))
        if sub:  # its time only
            neighbours.append(f"tp={other} at best {ms(sub[0].step_time_s)}")
        else:
            neighbours.append(f"tp={other} fits nowhere")
    cap = critical.max_tp(cluster.peak_flops_bf16, model.ffn, cluster.tiers[0].bandwidth)
    where = f"inside the {domain} domain" if tier == domain or tp == 1 else f"across tiers ({tier})"
    head = f"TP={tp} stays {where}" if tp > 1 else "No TP: the other axes fit the model and keep devices busy"
    return (f"{head}; neighbours: {', '.join(neighbours)}. TP stays compute-bound up to about F*W/C = {cap:,.0f}-way "
            f"over the fast links.")


def _across_nodes(model, cluster, layout, win, batch, precision) -> str:
    parts = []
    if layout.pp > 1:
        parts.append(f"PP={layout.pp} ({layout.schedule}, {win.microbatches} micro-batches) splits the layers, "
                     f"leaving a {win.bubble_fraction:.1%} bubble")
    if layout.zero:
        b = PRECISIONS[precision]
        p, trained = params_on_rank(model, layout, 0), trained_params_on_rank(model, layout, 0)
        adapters = trained if model.lora else 0.0  # LoRA's, beside the frozen weights
        state_bytes = b["grads"] + optimizer_bytes(cluster, precision, layout.zero)
        full = p * weight_bytes(cluster, precision) + trained * state_bytes + adapters * b["params"]
        mem = win.memory_per_device_bytes
        state = mem["params"] + mem["grads"] + mem["optimizer"] + mem["frozen"]
        parts.append(f"ZeRO-{layout.zero} over dp*cp = {layout.dp * layout.cp} ranks cuts the model state from "
                     f"{si_bytes(full)} to {si_bytes(state)} per device")
    if layout.cp > 1:
        parts.append(f"CP={layout.cp} splits each {model.seq}-token sequence so {batch} sequences cover "
                     f"{layout.dp * layout.cp} data-parallel ranks")
    if not parts:
        return ""
    return "; ".join(parts) + "."
