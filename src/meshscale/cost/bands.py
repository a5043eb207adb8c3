"""Error bands: how far `predict` was from the measured step times of benchmarks/published.py's validation
set, per category (hardware x dense/MoE x precision): the median and 90th percentile of |error| and the mean
signed error (negative: predicted too fast). Every predict, plan and scale figure carries its category's band;
`scale` also says how the step grew, measured and predicted, where the set's runs differ only in data parallelism;
a pipelined layout also carries the band of its category's pipelined runs, which the set shows to err apart.
A band covers the mechanisms the set's runs used: a layout resting on one no run used (a zero-bubble V schedule,
context-parallel chunks shorter than any run's, a step spent largely waiting on the host) is predicted by terms the
set never judged, and says so.

The table is data computed by a script, never typed: `PYTHONPATH=src python benchmarks/published.py
--write-bands` rewrites it from the current model, and tests/test_bands.py fails when it no longer equals what
the script computes (so it cannot go stale). Categories without runs have no band: say so, claim nothing.
"""

import math

from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import RECOMPUTE, Layout
from meshscale.specs.model import ModelSpec

# --- written by benchmarks/published.py --write-bands; do not edit by hand -----------------------------
SOURCE = 'benchmarks/published.py --write-bands, 208 published runs up to 2024, 2026-12-02'
# "hardware kind precision": (runs, median |error|, p90 |error|, mean signed error)
BANDS: dict[str, tuple[int, float, float, float]] = {
    'A100 dense bf16': (41, 0.0496, 0.1007, -0.0409),
    'B200 dense fp8': (2, 0.0932, 0.1509, -0.0932),
    'H100 MoE bf16': (2, 0.0552, 0.0865, -0.0552),
    'H100 dense bf16': (40, 0.0414, 0.1379, -0.0372),
    'H100 dense fp8': (56, 0.0399, 0.1118, -0.0282),
    'H200 dense fp8': (5, 0.0198, 0.1225, -0.0436),
    'H800 MoE bf16': (1, 0.0245, 0.0245, -0.0245),
    'H800 MoE fp8': (1, 0.0243, 0.0243, -0.0243),
    'TPU v4 dense bf16': (7, 0.0495, 0.0685, -0.0516),
    'TPU v5e dense bf16': (24, 0.05, 0.1331, -0.0421),
    'TPU v5p dense bf16': (16, 0.0982, 0.1829, -0.0593),
    'TPU v5p dense int8': (7, 0.0651, 0.0731, 0.0056),
    'TPU v6e MoE bf16': (1, 0.0254, 0.0254, -0.0254),
    'TPU v6e MoE int8': (1, 0.2102, 0.2102, -0.2102),
    'TPU v6e dense int8': (4, 0.0754, 0.0832, -0.0766),
}
# the same of each category's pipelined runs (pp > 1)
PIPELINED: dict[str, tuple[int, float, float, float]] = {
    'A100 dense bf16': (19, 0.0832, 0.1174, -0.0767),
    'B200 dense fp8': (1, 0.0356, 0.0356, -0.0356),
    'H100 MoE bf16': (2, 0.0552, 0.0865, -0.0552),
    'H100 dense bf16': (2, 0.0344, 0.0568, -0.0344),
    'H100 dense fp8': (32, 0.0405, 0.1153, -0.0467),
    'H800 MoE bf16': (1, 0.0245, 0.0245, -0.0245),
    'H800 MoE fp8': (1, 0.0243, 0.0243, -0.0243),
}
# runs differing only in data-parallel size: (series, median step growth a doubling, measured, predicted)
REPLICA_GROWTH: tuple[int, float, float] = (31, 0.021, 0.0022)
# mechanisms the runs rest on (`mechanisms`): how many runs used each; the fewest tokens a context-parallel rank held
COVERAGE: dict[str, int] = {
    'cp': 20, 'ep': 4, 'recompute=full': 75, 'recompute=layernorm': 2, 'recompute=minimal': 13,
    'recompute=minimal_mlp': 3, 'recompute=mla_up_proj': 2, 'recompute=op': 3, 'recompute=selective': 12,
    'schedule=1f1b': 4, 'schedule=dualpipev': 1, 'schedule=interleaved': 52, 'schedule=zb': 1, 'shard': 43,
    'zero=1': 75, 'zero=2': 6, 'zero=3': 110,
}
CP_FEWEST_TOKENS: int = 4096
# the largest share of its step any run's devices waited on their host (cost/step.py host_wait_s)
HOST_WAIT_MOST: float = 0.0067
# --- end of written part ------------------------------------------------------------------------------


# Below this many runs a category's median and p90 are single errors, not a spread (issue 18 asks the bias
# only of categories with >= 3 runs): the text says so.
FEW_RUNS = 3
# A host wait worth naming: from this share of the step predict's sentence names it, and one longer than every
# run's is flagged only from here (less moves a step under most categories' median error)
HOST_WAIT_FLOOR = 0.05


def category(cluster: ClusterSpec, model: ModelSpec, precision: str) -> str:
    """"hardware kind precision" of a prediction: the accelerator's family ("H100-SXM5-80GB" -> "H100",
    "TPU v5p"), dense or MoE, and bf16 for every 16-bit recipe (bf16-pure differs in memory, not time)."""
    hardware = cluster.accelerator.split("-")[0]
    kind = "MoE" if model.is_moe else "dense"
    return f"{hardware} {kind} {'bf16' if precision.startswith('bf16') else precision}"


def mechanisms(layout: Layout) -> tuple[str, ...]:
    """What a layout's step rests on beyond data and tensor parallelism, in the layout's own words: its pipeline
    schedule, ZeRO stage, hybrid sharding, context and expert parallelism (and expert TP), recompute (a module
    list by module) and activation offload."""
    out = [f"schedule={layout.schedule}"] if layout.pp > 1 else []
    out += [f"zero={layout.zero}"] if layout.zero else []
    out += [key for key, on in (("shard", layout.shard), ("cp", layout.cp > 1), ("ep", layout.ep > 1),
                                ("etp", layout.etp), ("offload", layout.offload)) if on]
    if layout.recompute in RECOMPUTE:
        out += [f"recompute={layout.recompute}"] if layout.recompute != "none" else []
    else:
        out += [f"recompute={m}" for m in sorted(layout.recompute_modules)]
    return tuple(out)


def pipelined(key: str, layout: Layout | None) -> dict | None:
    """The band of the category's pipelined runs (PIPELINED) for a pipelined layout, where it has FEW_RUNS or
    more: the set's pipelined runs err apart from its others (docs/accuracy.md, "Pipelined runs"), so the
    category's band alone would hide that."""
    entry = _entry(PIPELINED, key)
    return entry if layout is not None and layout.pp > 1 and entry["runs"] >= FEW_RUNS else None


def _entry(table: dict, key: str) -> dict:
    """A stored table's row as a band states it (runs 0 and None elsewhere where the table has none)."""
    runs, median, p90, bias = table.get(key, (0, None, None, None))
    return {"runs": runs, "median_abs_error": median, "p90_abs_error": p90, "mean_signed_error": bias}


def unvalidated(layout: Layout, seq: int, host_share: float = 0.0) -> list[str]:
    """The layout's mechanisms that no run of the validation set used, context-parallel chunks shorter than
    the shortest any run had (ring attention's steps then cost what no run measured), and a wait on the host
    (`host_share` of the step) longer than any run's: the host's per-call times then decide the step, and no
    run checked them."""
    out = [m for m in mechanisms(layout) if m not in COVERAGE]
    tokens = seq // layout.cp
    if layout.cp > 1 and "cp" in COVERAGE and tokens < CP_FEWEST_TOKENS:
        out.append(f"cp={layout.cp} at {tokens:,} tokens a rank where the set's fewest is {CP_FEWEST_TOKENS:,}")
    if host_share > max(HOST_WAIT_MOST, HOST_WAIT_FLOOR):
        out.append(f"the devices wait on their host {host_share:.0%} of the step, where no run of the set waited "
                   f"over {HOST_WAIT_MOST:.1%}")
    return out


def band(cluster: ClusterSpec, model: ModelSpec, precision: str, layout: Layout | None = None,
         host_share: float = 0.0) -> dict:
    """The band a prediction carries: its category, and the runs, median, p90 and mean signed error that
    category earned (runs 0 and None elsewhere where the validation set has none); with `layout` (and the share
    of the step its devices wait on their host), what of it the set never used (`unvalidated`) and, for a
    pipelined one, the band of the category's pipelined runs (`pipelined`; None otherwise)."""
    key = category(cluster, model, precision)
    return {"category": key, **_entry(BANDS, key),
            "unvalidated": unvalidated(layout, model.seq, host_share) if layout else [],
            "pipelined": pipelined(key, layout), "source": SOURCE}


def unvalidated_text(b: dict) -> str:
    """One line for people where the layout rests on what the validation set never used, else ""."""
    if not b.get("unvalidated"):
        return ""
    return (f"outside the validation set: {'; '.join(b['unvalidated'])}; no published run checks these terms, "
            "so the band may not hold")


def replica_growth() -> dict:
    """What the validation set says of adding data-parallel replicas at the same work per device: the series of
    runs that differ only in their data-parallel size, and the median growth of their step per doubling of the
    devices, measured and as `predict` gives it (`benchmarks/published.py --data-parallel`)."""
    series, measured, predicted = REPLICA_GROWTH
    return {"series": series, "measured_per_doubling": measured, "predicted_per_doubling": predicted,
            "source": SOURCE}


def replica_growth_text() -> str:
    """One line for people, under `scale`'s table."""
    g = replica_growth()
    return (f"adding replicas: in {g['series']} published series at the same work per device the step grew a median "
            f"{g['measured_per_doubling']:+.1%} per doubling of the devices, where the model gives "
            f"{g['predicted_per_doubling']:+.1%}: read the largest counts as optimistic")


def band_text(b: dict) -> str:
    """One line for people: `A100 dense bf16, 19 runs: median 3.0%, p90 10.2%, bias +0.4%`."""
    if not b["runs"]:
        return f"{b['category']}: no validation runs in this category; accuracy unknown"
    runs = f"{b['runs']} run{'s' if b['runs'] > 1 else ''}"
    few = "; too few runs to trust" if b["runs"] < FEW_RUNS else ""
    pp = f"; its {b['pipelined']['runs']} pipelined runs: {_spread(b['pipelined'])}" if b.get("pipelined") else ""
    return (f"{b['category']}, {runs}: {_spread(b)} ({'too fast' if b['mean_signed_error'] < 0 else 'too slow'} "
            f"on average{few}){pp}")


def _spread(entry: dict) -> str:
    """`median 3.0%, p90 10.2%, bias +0.4%` of a band's row."""
    return (f"median {entry['median_abs_error']:.1%}, p90 {entry['p90_abs_error']:.1%}, "
            f"bias {entry['mean_signed_error']:+.1%}")


def measured_range(predicted: float, b: dict, rate: bool = False) -> tuple[float, float] | None:
    """Where a measured value lies if the prediction errs no more than the band's p90. The table's error is
    |predicted/measured - 1| of a time, so a time's measured value is predicted/(1 +- p90); a rate (tokens/s,
    TFLOP/s: work over that time) is predicted x (1 -+ p90). None where the category has no runs."""
    if not b.get("runs"):
        return None
    p = b["p90_abs_error"]
    if rate:
        return predicted * max(0.0, 1 - p), predicted * (1 + p)
    return predicted / (1 + p), (predicted / (1 - p) if p < 1 else math.inf)


def error(predicted: float, measured: float, rate: bool = False) -> float:
    """The prediction's error as the validation table counts it: predicted/measured - 1 of a time (of a rate,
    measured/predicted - 1, the same error of the time behind it)."""
    return measured / predicted - 1 if rate else predicted / measured - 1


def within(predicted: float, measured: float, b: dict, rate: bool = False) -> str | None:
    """"median" or "p90" (the smallest of the band's two radii that holds the error), "outside", or None
    where the category has no runs."""
    if not b.get("runs"):
        return None
    e = abs(error(predicted, measured, rate))
    return "median" if e <= b["median_abs_error"] else "p90" if e <= b["p90_abs_error"] else "outside"
