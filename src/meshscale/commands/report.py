"""Human-readable tables of a Prediction (shared by predict and plan)."""

from rich.console import Console
from rich.table import Table

from meshscale.cost.bands import HOST_WAIT_FLOOR, band_text, unvalidated_text
from meshscale.units import si_bytes


def band_cell(band: dict) -> str:
    """The band beside a figure: its category's median and p90 |error| on the validation set; a dagger where the
    layout rests on what no run of the set used (`footnotes`)."""
    dagger = " †" if band.get("unvalidated") else ""
    if not band.get("runs"):
        return "no band" + dagger
    return f"±{band['median_abs_error']:.1%} (p90 ±{band['p90_abs_error']:.1%}){dagger}"


def footnotes(rows: list[tuple[str, dict]]) -> list[str]:
    """The footnotes of the rows marked with a dagger, (label, band) each: a line per distinct set of the
    mechanisms no validation run used."""
    groups: dict = {}
    for label, band in rows:
        if band.get("unvalidated"):
            groups.setdefault(tuple(band["unvalidated"]), []).append(label)
    return [f"† {', '.join(labels)}: outside the validation set: {'; '.join(u)}" for u, labels in groups.items()]


def ms(x: float) -> str:
    return f"{x * 1e3:,.2f} ms"


def make_console() -> Console:
    """Rich console; 120 columns when piped so that tables are not truncated."""
    console = Console()
    return console if console.is_terminal else Console(width=120)


def print_prediction(pred, console: Console | None = None) -> None:
    console = console or make_console()
    console.print(f"[bold]{pred.model}[/] on {pred.devices} x {pred.cluster}, layout [bold]{pred.layout}[/], "
                  f"{pred.global_batch} x {pred.seq} tokens per step, {pred.microbatches} micro-batch(es) "
                  f"per DP rank, {pred.precision}" + (f", {pred.trained}" if pred.trained != "all" else "")
                  + (f", samples of {pred.packed_samples:,} tokens packed" if pred.packed_samples else ""))
    t = Table(title="step time", title_justify="left")
    t.add_column("part"), t.add_column("time", justify="right"), t.add_column("share", justify="right")
    rows = [("compute", pred.compute_s)]
    if pred.host_wait_s:  # a GPU whose host issues its kernels slower than it runs them (cost/step.py host_bound)
        rows.append(("  of which waiting on the host", pred.host_wait_s))
    rows += [("exposed communication", pred.exposed_comm_s), ("pipeline bubble", pred.bubble_s),
             ("optimizer update", pred.optimizer_s)]
    for name, v in rows:
        t.add_row(name, ms(v), f"{v / pred.step_time_s:.1%}")
    t.add_row("[bold]step[/]", f"[bold]{ms(pred.step_time_s)}[/]", band_cell(pred.band))
    console.print(t)
    console.print(f"error band: {band_text(pred.band)}")
    if pred.band.get("unvalidated"):
        console.print(f"† {unvalidated_text(pred.band)}")
    if pred.comm:
        c = Table(title="communication per device per step", title_justify="left")
        # slows compute: what the compute it hides behind loses to its kernels (cost/comm.py sm_share)
        for col in ("axis", "collective", "bytes", "calls", "group", "tier", "time", "exposed", "slows compute"):
            c.add_column(col, justify="left" if col in ("axis", "collective", "tier") else "right")
        for e in pred.comm:
            c.add_row(e["axis"], e["collective"], si_bytes(e["bytes"], 2), str(e["calls"]), str(e["group"]),
                      e["tier"], ms(e["time_s"]), ms(e["exposed_s"]), ms(e["interference_s"]))
        console.print(c)
    mem = pred.memory_per_device_bytes
    title = f"memory per device (HBM {si_bytes(pred.hbm_bytes, 2)})"
    m = Table(title=title, title_justify="left", min_width=len(title))  # the title on one line
    m.add_column("kind"), m.add_column("bytes", justify="right")
    for k in ("frozen", "params", "grads", "optimizer", "activations", "gathered"):
        if mem.get(k) or k not in ("gathered", "frozen"):  # ZeRO-3's unsharded units; LoRA's frozen weights
            m.add_row(k, si_bytes(mem[k], 2))
    m.add_row("[bold]total[/]", f"[bold]{si_bytes(mem['total'], 2)}[/] "
              + ("fits" if pred.fits else "[red]DOES NOT FIT[/]"))
    console.print(m)
    console.print(f"checkpoint: {si_bytes(pred.checkpoint_bytes_per_device, 2)} per device, "
                  f"{si_bytes(pred.checkpoint_bytes_total, 2)} in all (weights and optimizer states, each written "
                  "once)")
    console.print(f"MFU {pred.mfu:.1%} (HFU {pred.hfu:.1%}), {pred.tokens_per_s:,.0f} tokens/s; model FLOPs "
                  f"{pred.model_flops_per_step:.3e} per step (6PT rule: {pred.six_pt_flops_per_step:.3e})")
    console.print(bound_sentence(pred), markup=False)


def bound_sentence(pred) -> str:
    r = pred.regime
    why = f"{pred.bound}-bound"
    comm_total = sum(e["time_s"] for e in pred.comm)
    if pred.bound == "memory":
        why += (f": needs {si_bytes(pred.memory_per_device_bytes['total'], 2)} per device, HBM holds "
                f"{si_bytes(pred.hbm_bytes, 2)}")
    elif pred.bound == "communication":
        why += (f": {ms(pred.exposed_comm_s)} of collectives stay exposed (of {ms(comm_total)}) against "
                f"{ms(pred.compute_s)} of compute")
    elif pred.bound == "bubble":
        why += f": the pipeline idles {pred.bubble_fraction:.0%} of the step"
    elif pred.bound == "host":
        why += f": the devices wait {ms(pred.host_wait_s)} on the host issuing {ms(pred.kernels_s)} of kernels"
    else:
        why += (f": compute {ms(pred.compute_s)}; collectives take {ms(comm_total)}, "
                f"{ms(pred.exposed_comm_s)} of it exposed")
    if pred.host_wait_s >= HOST_WAIT_FLOOR * pred.step_time_s:
        why += (f"; the devices wait on their host {pred.host_wait_s / pred.step_time_s:.0%} of the step (its "
                "launches, a MoE layer's token counts; [software] cuda_graphs = true captures the layers' launches)")
    if r.get("critical_tokens"):
        why += (f". {r['strategy']}: {r['per_device_tokens']:,.0f} tokens per device vs a critical batch of "
                f"{r['critical_tokens']:,.0f} ({r['side']} side of the roofline)")
    return why + "."
