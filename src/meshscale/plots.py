"""PNG pictures (matplotlib, Agg backend, no display): scaling curves, a simulated step's timeline, memory
per device, and a training run's loss with predicted vs measured step time. matplotlib is imported only
when a picture is asked for."""

import math
import sys


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    _pyplot().close(fig)
    print(f"wrote {path}", file=sys.stderr)


def scaling_plot(rows, mode: str, title: str, path: str) -> None:
    """Tokens/s (and goodput-adjusted tokens/s) and scaling efficiency against devices; each winning layout
    written where it starts."""
    plt = _pyplot()
    fig, (ax, eff) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=(3, 2))
    n = [r.devices for r in rows]
    ax.plot(n, [r.tokens_per_s for r in rows], "o-", label="predicted tokens/s")
    ax.plot(n, [rows[0].tokens_per_s_per_device * d for d in n], "--", color="grey",
            label="linear from the first count")
    if rows[0].goodput:
        ax.plot(n, [r.goodput["tokens_per_s"] for r in rows], "s-", label="x ETTR (goodput)")
    for r in rows:
        if r is rows[0] or r.change:  # where a new layout wins
            first = r is rows[0]
            ax.annotate(r.layout.replace(",schedule=", ",").replace(",mbs=1", ""), (r.devices, r.tokens_per_s),
                        fontsize=6, xytext=(4, -12) if first else (-4, 6), textcoords="offset points",
                        ha="left" if first else "right")
    ax.set_xscale("log", base=2), ax.set_yscale("log", base=2)
    ax.set_ylabel("tokens/s"), ax.set_title(f"{mode} scaling: {title}"), ax.legend(fontsize=8)
    eff.plot(n, [100 * r.efficiency for r in rows], "o-", label="efficiency vs the first count")
    eff.plot(n, [100 * r.mfu for r in rows], "^-", label="MFU")
    eff.plot(n, [100 * r.exposed_comm_fraction for r in rows], "v-", label="exposed communication")
    eff.set_xscale("log", base=2), eff.set_ylim(0, 105)
    eff.set_xlabel("devices"), eff.set_ylabel("%"), eff.legend(fontsize=8)
    _save(fig, path)


def timeline_plot(result, path: str) -> None:
    """Gantt chart of a simulated step: per pipeline rank, compute (F/B/W) and the comm stream beneath it."""
    plt = _pyplot()
    colours = {"F": "tab:blue", "B": "tab:orange", "I": "tab:olive", "W": "tab:green", "tp": "tab:red",
               "opt": "tab:purple", "send": "tab:cyan", "fsdp": "tab:brown", "sync": "tab:grey"}
    rows = sorted({(e.replica, e.rank) for e in result.events})
    fig, ax = plt.subplots(figsize=(10, 0.5 * 2 * len(rows) + 1.2))
    bars = {}  # (y, kind) -> [(start ms, width ms)]: one broken_barh per row and kind keeps big steps fast
    for e in result.events:
        y = 2 * rows.index((e.replica, e.rank)) + (0 if e.stream == "compute" else 1)
        bars.setdefault((y, e.kind), []).append((e.start * 1e3, (e.end - e.start) * 1e3))
    for (y, kind), spans in bars.items():
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colours.get(kind, "tab:grey"), edgecolor="black",
                       linewidth=0.1)
    names = [f"pp {r}" + (" (straggler replica)" if rep else "") for rep, r in rows]
    ax.set_yticks([2 * i + k for i in range(len(rows)) for k in (0, 1)],
                  [f"{n} {s}" for n in names for s in ("compute", "comm")], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(f"simulated step {result.step_time_s * 1e3:,.1f} ms, bubble {result.bubble_fraction:.1%}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), fontsize=7, ncol=len(colours), loc="upper right")
    _save(fig, path)


def memory_plot(pred, path: str) -> None:
    """Stacked bar of one device's memory (parameters, gradients, optimizer, activations) against HBM."""
    plt = _pyplot()
    mem = pred.memory_per_device_bytes
    fig, ax = plt.subplots(figsize=(5, 5))
    bottom = 0.0
    for key in ("frozen", "params", "grads", "optimizer", "activations", "gathered"):
        if key == "frozen" and not mem.get(key):  # LoRA's frozen weights alone
            continue
        ax.bar(0, mem[key] / 1e9, bottom=bottom, label=f"{key} {mem[key] / 1e9:,.1f} GB", width=0.5)
        bottom += mem[key] / 1e9
    ax.axhline(pred.hbm_bytes / 1e9, color="red", linestyle="--", label=f"HBM {pred.hbm_bytes / 1e9:,.0f} GB")
    ax.set_xticks([0], [pred.layout.replace(",", "\n", 3)], fontsize=7)
    ax.set_ylabel("GB per device"), ax.legend(fontsize=8)
    ax.set_title(f"{pred.model} on {pred.devices} x {pred.cluster}", fontsize=9)
    _save(fig, path)


def training_plot(rows: list[dict], predicted_step_s: float | None, path: str) -> None:
    """Loss per step above measured step time, with the cost model's prediction as a line."""
    plt = _pyplot()
    fig, (loss, step) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    steps = [r["step"] for r in rows]
    loss.plot(steps, [r["loss"] for r in rows], "o-")
    loss.set_ylabel("loss")
    step.plot(steps, [r["step_time_s"] * 1e3 for r in rows], "o-", label="measured")
    if predicted_step_s:
        step.axhline(predicted_step_s * 1e3, color="red", linestyle="--", label="predicted")
    step.set_xlabel("step"), step.set_ylabel("step time (ms)"), step.legend(fontsize=8)
    _save(fig, path)


def collective_plot(rows: list[dict], title: str, path: str, measured: list[tuple] = ()) -> None:
    """Bus bandwidth against message size (nccl-tests' view), with measured (bytes, GB/s) points if given."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-", label="model")
    if measured:
        ax.plot([b for b, _ in measured], [g for _, g in measured], "x", label="nccl-tests")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)"), ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title, fontsize=9), ax.legend(fontsize=8)
    _save(fig, path)


def budget_plot(options, deadline_days: float, title: str, path: str) -> None:
    """Days against dollars for every (cluster, devices) option, each with its error band (days and dollars
    both scale with the step time, so the band's p90 is a segment along the diagonal); the Pareto front
    joined, the deadline drawn."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for cluster in dict.fromkeys(o.cluster for o in options):
        mine = [o for o in options if o.cluster == cluster]
        dots = ax.scatter([o.days for o in mine], [o.dollars for o in mine], label=cluster, s=18)
        for o in mine:
            ax.annotate(f"{o.devices:,}", (o.days, o.dollars), fontsize=6, xytext=(3, 3), textcoords="offset points")
            days, dollars = o.range_of(o.days), o.range_of(o.dollars)
            if days and dollars and math.isfinite(days[1]):
                ax.plot(days, dollars, color=dots.get_facecolor()[0], lw=1.5, alpha=0.5)
    front = sorted((o for o in options if o.pareto), key=lambda o: o.days)
    ax.plot([o.days for o in front], [o.dollars for o in front], "k--", lw=1, label="Pareto front")
    ax.axvline(deadline_days, color="red", lw=1, label=f"deadline ({deadline_days:g} days)")
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel("days (wall clock, failures included)"), ax.set_ylabel("dollars")
    ax.set_title(f"{title}; segments: the error band's p90"), ax.legend(fontsize=8)
    _save(fig, path)
