"""Scaling studies: the planner's best layout at each device count, and what each added device buys.

Strong scaling holds the global batch, so the batch per device shrinks as devices grow and, below a
strategy's critical batch (cost/critical.py), its communication stops hiding behind compute; weak scaling
holds the tokens per device. Each row is the winner of the same search `meshscale plan` runs.
"""

import re
from dataclasses import dataclass, field

from meshscale.cost import predict
from meshscale.cost.goodput import DEFAULT_CHECKPOINT_BANDWIDTH, of_prediction
from meshscale.errors import UserError
from meshscale.plan.explain import components, ms
from meshscale.plan.search import search
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import Layout, check_against
from meshscale.specs.model import ModelSpec


@dataclass
class Row:
    devices: int
    layout: str
    global_batch: int  # sequences
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    mfu: float
    efficiency: float  # tokens/s per device against the smallest device count's
    marginal_tokens_per_s_per_device: float | None  # (tokens/s gained) / (devices added) since the last row
    exposed_comm_fraction: float
    usd_per_million_tokens: float | None
    joules_per_token: float | None
    change: str = ""  # why the winning layout differs from the previous row's, or ""
    goodput: dict = field(default_factory=dict)
    band: dict = field(default_factory=dict)  # the error band of the winner's category (cost/bands.py)

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        if not self.goodput:
            del out["goodput"]
        return out


def parse_devices(text: str) -> list[int]:
    """"64,128,256" or "64..16384" (doubling). The counts must be positive and strictly increasing."""
    text = text.replace(" ", "")
    m = re.fullmatch(r"(\d+)\.\.(\d+)", text)
    try:
        if m:
            lo, hi = int(m[1]), int(m[2])
            counts = [lo] if lo > 0 else []
            while counts and counts[-1] * 2 <= hi:
                counts.append(counts[-1] * 2)
            if lo <= 0 or hi <= lo:
                counts = []
        else:
            counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if not counts or any(n <= 0 for n in counts):
        raise UserError(f"--devices {text!r}: give positive counts like 64,128,256 or a doubling range 64..16384")
    if any(b <= a for a, b in zip(counts, counts[1:])):
        raise UserError(f"--devices {text!r} must be strictly increasing (e.g. 128,256,512)")
    return counts


def batch_at(model: ModelSpec, devices: int, global_batch_tokens: int | None, tokens_per_device: int | None) -> int:
    """Global batch in sequences: fixed (strong) or tokens_per_device x devices (weak)."""
    tokens = global_batch_tokens if global_batch_tokens is not None else (tokens_per_device or 0) * devices
    if tokens <= 0 or tokens % model.seq:
        what = "--global-batch-tokens" if global_batch_tokens is not None else "--tokens-per-device x devices"
        raise UserError(f"{what} = {tokens} must be a positive multiple of the sequence length {model.seq}")
    return tokens // model.seq


def joules_per_token(cluster: ClusterSpec, pred) -> float | None:
    """Board power while kernels run (compute, exposed communication, optimizer), idle power in the bubble
    (the power model of specs/cluster.py POWER_W)."""
    if not cluster.board_power_w:
        return None
    idle = pred.bubble_s
    watts = (cluster.board_power_w * (pred.step_time_s - idle) + cluster.idle_power_w * idle) / pred.step_time_s
    return watts * pred.devices / pred.tokens_per_s


def scale(model: ModelSpec, cluster: ClusterSpec, counts: list[int], global_batch_tokens: int | None = None,
          tokens_per_device: int | None = None, precision: str = "bf16", top: int = 1,
          mtbf_hours: float | None = None, checkpoint_bandwidth: float = DEFAULT_CHECKPOINT_BANDWIDTH,
          restart_s: float | None = None, planned=None) -> list[Row]:
    """One row per device count, in increasing order; `planned(done, label)` is told as each count is
    planned."""
    rows: list[Row] = []
    winners: list = []
    for done, n in enumerate(counts):
        if planned:
            planned(done, f"{n:,} devices")
        batch = batch_at(model, n, global_batch_tokens, tokens_per_device)
        plan = search(model, cluster, n, batch, precision, top=top)
        if not plan.ranked:
            raise UserError(f"no layout of {n} devices fits {model.name} with {batch} sequences of {model.seq} "
                            "tokens; start the device list higher or change the batch")
        win = plan.ranked[0]
        first = rows[0] if rows else None
        per_device = win.tokens_per_s / n
        price = cluster.price_per_device_hour
        row = Row(
            devices=n, layout=win.layout, global_batch=batch, step_time_s=win.step_time_s,
            tokens_per_s=win.tokens_per_s, tokens_per_s_per_device=per_device, mfu=win.mfu,
            efficiency=per_device / first.tokens_per_s_per_device if first else 1.0,
            marginal_tokens_per_s_per_device=((win.tokens_per_s - rows[-1].tokens_per_s) / (n - rows[-1].devices)
                                              if rows else None),
            exposed_comm_fraction=win.exposed_comm_s / win.step_time_s,
            usd_per_million_tokens=n * price / 3600 / win.tokens_per_s * 1e6 if price else None,
            joules_per_token=joules_per_token(cluster, win),
            change=why_changed(model, cluster, winners[-1], win, batch, precision) if winners else "",
            band=win.band)
        if mtbf_hours is not None:
            good = of_prediction(win, mtbf_hours, checkpoint_bandwidth, restart_s)
            row.goodput = {**good.to_dict(), "tokens_per_s": win.tokens_per_s * good.ettr}
        rows.append(row)
        winners.append(win)
    return rows


def _shape(layout: str) -> tuple:
    lay = Layout.parse(layout)
    return lay.tp, lay.pp, lay.cp, lay.ep, lay.zero, lay.shard, lay.schedule if lay.pp > 1 else ""


def why_changed(model, cluster, before, after, batch: int, precision: str) -> str:
    """One line when the winner's parallel shape changed: what the previous shape would cost now, where it
    loses most (plan/explain's step components), and which side of its critical batch it sits on."""
    if _shape(before.layout) == _shape(after.layout):
        return ""
    old = Layout.parse(before.layout)
    rest = old.tp * old.pp * old.cp
    if after.devices % rest:
        return f"{before.layout} cannot be placed on {after.devices} devices"
    kept = Layout.parse(",".join(f"{k}={v}" for k, v in old.to_dict().items() if k not in ("dp", "mbs")),
                        after.devices)
    try:
        check_against(kept, model, batch)
        pred = predict(model, cluster, kept, batch, precision)
    except UserError as e:
        return f"the previous shape no longer applies ({e})"
    if not pred.fits:
        return f"{kept} no longer fits in memory"
    diff = {k: v - components(after).get(k, 0.0) for k, v in components(pred).items()}
    worst = max(diff, key=lambda k: diff[k])
    r = pred.regime
    side = (f"; {r['strategy']} at {r['per_device_tokens']:,.0f} tokens per device vs a critical batch of "
            f"{r['critical_tokens']:,.0f}" if r.get("critical_tokens") else "")
    return f"{kept} would take {ms(pred.step_time_s)} (+{ms(pred.step_time_s - after.step_time_s)}, " \
           f"{worst} {ms(diff[worst])} longer){side}"
