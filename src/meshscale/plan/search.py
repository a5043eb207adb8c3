"""Exhaustive layout search with bound pruning.

Every layout (tp, pp, cp, dp, ep, etp, zero, shard, sp, schedule/vpp, mbs, recompute) is enumerated. For each
parallel shape (tp, pp, cp, dp, ep, etp) numpy scores all the remaining choices at once: memory per device
(exact, the same formulas as `predict`) and a lower bound on step time (ideal compute plus bubble; every
other term of the step is non-negative). Survivors are costed in full with `predict`, cheapest bound
first, until the bound of the next one exceeds the K-th best time found: none after it can enter the top K.
"""

import bisect
import math
import time
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from operator import itemgetter

import numpy as np

from meshscale.cost import bound, predict
from meshscale.cost.kernels import check_kernels
from meshscale.cost.memory import PRECISIONS
from meshscale.cost.step import Prediction
from meshscale.errors import UserError
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import (RECOMPUTE, RECOMPUTE_MODULES, SCHEDULES, Layout, check_against, kv_heads_fit,
                                    layout_items, minimal_recompute_built, parse_value)
from meshscale.specs.model import ModelSpec

MAX_VPP = 8
MAX_MBS = 64
ALTERNATIVES = 6  # distinct parallel shapes kept for the explanation


def runnable(layout: Layout, model: ModelSpec, global_batch: int) -> bool:
    """The one predicate every candidate passes: the Layout rules of the specs (and, later, whatever the
    runtime can execute correctly; narrow it here)."""
    try:
        check_against(layout, model, global_batch)
    except UserError:
        return False
    return True


_FIXABLE = ("dp", "zero", "tp", "sp", "pp", "vpp", "schedule", "cp", "ep", "etp", "mbs", "recompute")


def parse_fix(text: str) -> dict:
    """`--fix pp=1,tp=8` as {key: value}: the layout values every searched layout must have, read as
    Layout.parse reads them; fsdp=N stands for dp=N,zero=3."""
    fixed: dict = {}
    for key, raw in layout_items(text, "--fix"):
        for key, raw in ((("dp", raw), ("zero", "3")) if key == "fsdp" else ((key, raw),)):
            if key not in _FIXABLE:
                raise UserError(f"--fix: {key}={raw} is not key=value with a layout key ({', '.join(_FIXABLE)}, "
                                "fsdp); example: --fix pp=1,tp=8")
            value = parse_value(key, raw, "--fix")
            _check_fixable(key, value)
            if fixed.get(key, value) != value:
                raise UserError(f"--fix: {key} fixed to two values ({fixed[key]} and {value})")
            fixed[key] = value
    if not fixed:
        raise UserError("--fix needs key=value pairs, e.g. --fix pp=1,tp=8")
    return fixed


def _check_fixable(key: str, value) -> None:
    """The values plan searches: zero 0-3, other degrees from 1, schedules, and the recompute modes the bound
    covers (bound.RECOMPUTE_MODES: not op or minimal_mlp)."""
    if key in ("schedule", "recompute"):
        choices = SCHEDULES if key == "schedule" else RECOMPUTE
        if key == "recompute" and ("+" in value or value in RECOMPUTE_MODULES):  # predict's, not the search's
            raise UserError(f"--fix: plan does not search recompute modules ({value}); fix none, selective, "
                            "full or minimal, and predict the module list with --layout")
        if value not in choices:
            raise UserError(f"--fix: unknown {key} {value!r}; choose one of {', '.join(choices)}")
        if key == "recompute" and value not in bound.RECOMPUTE_MODES:  # torchtitan's and MaxText's policies
            raise UserError(f"--fix: plan does not search recompute={value}; fix none, selective, full or minimal")
    elif key != "sp" and not (0 <= value <= 3 if key == "zero" else value >= 1):
        raise UserError(f"--fix: {key} must be a whole number {'0-3' if key == 'zero' else '>= 1'}, got {value}")


def _allowed(fix: dict, key: str, value) -> bool:
    return key not in fix or fix[key] == value


@dataclass
class Plan:
    ranked: list  # Prediction, best first
    enumerated: int  # layouts scored by the vectorised bound
    fitting: int  # of those, how many fit in memory (with headroom)
    evaluated: int  # costed in full by `predict`
    seconds: float
    smallest: tuple = ()  # (bytes, layout string) of the least memory any layout needs
    objective: str = "time"
    rejected: list = field(default_factory=list)  # best layouts of the runner-up parallel shapes
    fixed: dict = field(default_factory=dict)  # the --fix values every searched layout has
    pool: "Pool | None" = field(default=None, repr=False)  # the search's scored layouts (search_within narrows them)

    def to_dict(self) -> dict:
        return {"evaluated": self.evaluated, "enumerated": self.enumerated, "fitting": self.fitting,
                "search_seconds": self.seconds, "objective": self.objective,
                "ranked": [p.to_dict() for p in self.ranked]}


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def shapes(model: ModelSpec, cluster: ClusterSpec, devices: int, global_batch: int, cross_tp: bool):
    """Parallel shapes (tp, pp, cp, dp, ep) whose degrees divide what they must. EP folds over the stage's
    tp*cp*dp ranks (specs.layout, Megatron-Core's MoE Parallel Folding): ep divides tp*cp*dp, with etp = tp
    where ep divides dp*cp, and etp = 1 (`expert_tps`)."""
    tp_cap = devices if cross_tp else min(cluster.fast_domain, 16 if cluster.torus else cluster.fast_domain)
    for tp in _divisors(devices):
        if (tp > tp_cap or model.heads % tp or not kv_heads_fit(model.kv_heads, tp) or model.ffn % tp
                or (model.is_moe and model.expert_ffn % tp)):
            continue
        for pp in _divisors(devices // tp):
            if pp > model.layers:
                continue
            for cp in _divisors(devices // (tp * pp)):
                if cp > 1 and model.seq % (2 * cp):
                    continue
                dp = devices // (tp * pp * cp)
                if global_batch % dp:
                    continue
                eps = [e for e in _divisors(tp * dp * cp) if model.experts % e == 0] if model.is_moe else [1]
                for ep in eps:
                    yield tp, pp, cp, dp, ep


def expert_tps(tp: int, cp: int, dp: int, ep: int, fix: dict) -> list[int]:
    """The expert tensor-parallel degrees searched for a shape: tp (Megatron-Core's default) where ep divides
    dp*cp, and 1 (whole experts) where the EP group must fold across TP ranks (ep does not divide dp*cp), or
    where `--fix etp=1` asks for it. etp=1 beside etp=tp on every EP shape would score 1.6-1.8x the layouts
    (mixtral-8x7b on 256, deepseek-v3 on 1,024 H100) for what --fix can ask; other divisors of tp are left
    out, the runtime builds etp as 1 or tp (specs.layout.trainer_refusal)."""
    whole = [tp] if (dp * cp) % ep == 0 else []
    return whole + [1] if tp > 1 and ep > 1 and (not whole or fix.get("etp") == 1) else whole


def _schedules(model: ModelSpec, pp: int) -> list[tuple[str, int]]:
    if pp == 1:
        return [("1f1b", 1)]
    out = [("gpipe", 1), ("1f1b", 1), ("zb", 1)]
    if 2 * pp <= model.layers:
        out += [("zbv", 2), ("dualpipev", 2)]
    out += [("interleaved", v) for v in range(2, MAX_VPP + 1) if pp * v <= model.layers]
    return out


def search(model: ModelSpec, cluster: ClusterSpec, devices: int, global_batch: int, precision: str = "bf16",
           top: int = 5, headroom: float = 0.1, cross_tp: bool = False, prune: bool = True, where=None,
           fix: dict | None = None) -> Plan:
    """Rank the layouts that fit. `where(tp, pp, cp, dp, ep)` restricts the parallel shapes (the explanation
    asks for neighbours of the winner); `fix` ({key: value}, `parse_fix`) restricts every choice inside the
    enumeration; `prune=False` costs every layout in full (to check the bound)."""
    start = time.perf_counter()
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    cluster.check_precision(precision)
    check_kernels(model, cluster)
    if (fix or {}).get("recompute") == "minimal" and not minimal_recompute_built(model):
        raise UserError(f"--fix recompute=minimal: it is built for dense models without MLA ({model.name}); fix "
                        "none, selective or full")
    pool = score(Pool(model, cluster, devices, global_batch, precision, headroom, cross_tp, where, fix or {}))
    if not len(pool.bounds):
        return Plan([], pool.enumerated, 0, 0, time.perf_counter() - start, pool.smallest, fixed=pool.fix)
    ranked, alternatives, evaluated = cost(pool, top, prune)
    return Plan(ranked, pool.enumerated, pool.fitting, evaluated, time.perf_counter() - start, pool.smallest,
                rejected=alternatives, fixed=pool.fix, pool=pool)


def search_within(plan: Plan, model: ModelSpec, cluster: ClusterSpec, devices: int, global_batch: int,
                  precision: str, headroom: float, where=None, fix: dict | None = None, cross_tp: bool = False,
                  top: int = 1, shapes: int = ALTERNATIVES) -> list:
    """The `top` layouts of `search(..., where=where, fix=fix)`: taken from the plan's pool where it holds
    every layout that search scores (their bounds and order are the same, so are the results), else searched.
    With shapes=1 it stops at the first bound that reaches the best time, which is all the caller reads then
    (equal times may then rank in another order)."""
    pool = plan.pool and _narrowed(plan.pool, (model, cluster, devices, global_batch, precision, headroom), where,
                                   fix or {}, cross_tp)
    if pool is None:
        return search(model, cluster, devices, global_batch, precision, top, headroom, cross_tp, where=where,
                      fix=fix).ranked
    return cost(pool, top, prune=True, shapes=shapes)[0] if len(pool.bounds) else []


@dataclass
class Pool:
    """A search's question, and the layouts that fit as rows of their shapes (bound.Rows), with their
    step-time bounds."""
    model: ModelSpec
    cluster: ClusterSpec
    devices: int
    global_batch: int
    precision: str
    headroom: float
    cross_tp: bool
    where: object  # None or a predicate over (tp, pp, cp, dp, ep)
    fix: dict
    scored: list = field(default_factory=list)  # (bound.Shape, bound.Rows of the layouts that fit)
    bounds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per layout, in the order of `scored`
    enumerated: int = 0
    fitting: int = 0
    smallest: tuple = (math.inf, "")  # (bytes, layout string) of the least memory any layout needs
    costed: dict = field(default_factory=dict)  # Layout -> its Prediction, None if not runnable (shared)

    @property
    def capacity(self) -> float:
        return self.cluster.hbm_bytes * (1 - self.headroom)

    @cached_property
    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """Per layout: which of `scored` holds it, and its row there."""
        sizes = [len(rows) for _, rows in self.scored]
        return np.repeat(np.arange(len(sizes)), sizes), np.concatenate([np.arange(n) for n in sizes])

    def layout(self, i: int) -> Layout:
        shape, rows = self.scored[self.index[0][i]]
        return _layout(shape, rows, self.index[1][i])


def score(pool: Pool) -> Pool:
    """Every layout's memory, and the step-time bound of those that fit (cost/bound.py), shape by shape."""
    model, cluster, precision = pool.model, pool.cluster, pool.precision
    bounds = []
    for shape in _shapes(model, cluster, pool.devices, pool.global_batch, pool.cross_tp, pool.where, pool.fix):
        rows = _rows(shape, pool.fix, minimal_recompute_built(model))
        if not len(rows):
            continue
        pool.enumerated += len(rows)
        memory = bound.memory_bytes(model, cluster, shape, rows, precision)
        ok = (memory <= pool.capacity) & bound.fills_pipeline(shape, rows)
        i_min = int(np.argmin(memory))
        if memory[i_min] < pool.smallest[0]:
            pool.smallest = (float(memory[i_min]), str(_layout(shape, rows, i_min)))
        pool.fitting += int(ok.sum())
        if ok.any():
            pool.scored.append((shape, rows[ok]))
            bounds.append(bound.step_time_bound(model, cluster, shape, rows[ok], precision))
    pool.bounds = np.concatenate(bounds) if bounds else np.zeros(0)
    return pool


def cost(pool: Pool, top: int, prune: bool, shapes: int = ALTERNATIVES) -> tuple[list, list, int]:
    """Cost the pool's layouts in full with `predict`, cheapest bound first, until the bound of the next one
    exceeds the K-th best time found (and the best time of the `shapes`-th best parallel shape). Returns the
    top K, the best of the runner-up shapes, and how many were costed."""
    best: list = []  # the top K, (rank_key, Prediction), keyed once
    by_shape: dict = {}  # the best layout of each parallel shape: the alternatives the explanation cites
    shape_times: list = []  # their step times, ascending
    evaluated = 0
    for i in np.argsort(pool.bounds, kind="stable"):
        if prune and len(best) >= top and len(by_shape) >= shapes:
            if pool.bounds[i] >= max(best[-1][1].step_time_s, shape_times[shapes - 1]):
                break
        layout, pred = _costed(pool, i)
        if pred is None:
            continue
        evaluated += 1
        if pred.memory_per_device_bytes["total"] > pool.capacity:
            continue
        key = rank_key(pred, layout)
        best = sorted(best + [(key, pred)], key=itemgetter(0))[:top]
        shape = (layout.tp, layout.pp, layout.cp, layout.dp, layout.ep, layout.etp, layout.zero, layout.shard)
        if shape not in by_shape or key < by_shape[shape][0]:
            if shape in by_shape:
                shape_times.remove(by_shape[shape][1].step_time_s)
            by_shape[shape] = key, pred
            bisect.insort(shape_times, pred.step_time_s)
    alternatives = [p for _, p in sorted(by_shape.values(), key=itemgetter(0))[1:shapes]]
    return [p for _, p in best], alternatives, evaluated


def _costed(pool: Pool, i: int) -> tuple[Layout, Prediction | None]:
    """The pool's layout `i` and its prediction (None if not runnable), costed once per pool."""
    layout = pool.layout(i)
    if layout not in pool.costed:
        pool.costed[layout] = (predict(pool.model, pool.cluster, layout, pool.global_batch, pool.precision)
                               if runnable(layout, pool.model, pool.global_batch) else None)
    return layout, pool.costed[layout]


def fastest_where(plan: Plan, keep, keep_costed=None, slowest: float = math.inf) -> Prediction | None:
    """The fastest layout of the plan's pool that `keep(layout)` accepts, and `keep_costed(prediction)` where
    given, of those whose step takes at most `slowest` seconds (None if none fits): its layouts costed cheapest
    bound first, until the next bound reaches the best time found (or `slowest`)."""
    pool, best = plan.pool, None  # best: (rank_key, Prediction)
    if pool is None:
        return None
    for i in np.argsort(pool.bounds, kind="stable"):
        if (best is not None and pool.bounds[i] >= best[1].step_time_s) or pool.bounds[i] > slowest:
            break
        layout = pool.layout(i)
        if not keep(layout):
            continue
        pred = _costed(pool, i)[1]
        if pred is None or (keep_costed is not None and not keep_costed(pred)) or pred.step_time_s > slowest:
            continue
        if pred.memory_per_device_bytes["total"] <= pool.capacity:
            key = rank_key(pred, layout)
            best = min(best, (key, pred), key=itemgetter(0)) if best else (key, pred)
    return best[1] if best else None


# --fix keys that change the choices a shape offers (bound.Shape), and so its bounds
_SHAPE_KEYS = ("schedule", "vpp", "mbs")


def _narrowed(pool: Pool, question: tuple, where, fix: dict, cross_tp: bool) -> Pool | None:
    """The pool of a search of `question` (model, cluster, devices, batch, precision, headroom) restricted by
    `where` and `fix`, cut from `pool`; None unless `pool` answered the same question unrestricted (no `where`;
    `fix` holds its fixed values and the same shape keys) over every shape that search scores."""
    if (question != (pool.model, pool.cluster, pool.devices, pool.global_batch, pool.precision, pool.headroom)
            or pool.where is not None or any(k not in fix or fix[k] != v for k, v in pool.fix.items())
            or any(fix.get(k) != pool.fix.get(k) for k in _SHAPE_KEYS)):
        return None
    if cross_tp and not pool.cross_tp:
        wanted = shapes(pool.model, pool.cluster, pool.devices, pool.global_batch, True)
        held = set(shapes(pool.model, pool.cluster, pool.devices, pool.global_batch, False))
        if any(s not in held for s in wanted if where is None or where(*s)):
            return None
    out = Pool(*question, cross_tp, where, fix, costed=pool.costed)
    bounds = []
    for (shape, rows), end in zip(pool.scored, np.cumsum([len(rows) for _, rows in pool.scored])):
        dims = (shape.tp, shape.pp, shape.cp, shape.dp, shape.ep)
        if (where is not None and not where(*dims)) or any(k in fix and fix[k] != v for k, v in zip(
                ("tp", "pp", "cp", "dp", "ep", "etp"), dims + (shape.expert_tp,))):
            continue
        keep = np.ones(len(rows), dtype=bool)
        if "zero" in fix:
            keep &= rows.zero == fix["zero"]
        if "sp" in fix:
            keep &= np.array(shape.sps)[rows.sp] == fix["sp"]
        if "recompute" in fix:
            keep &= np.array(bound.RECOMPUTE_MODES)[rows.recompute] == fix["recompute"]
        if keep.any():
            out.scored.append((shape, rows[keep]))
            bounds.append(pool.bounds[end - len(rows):end][keep])
    out.bounds = np.concatenate(bounds) if bounds else np.zeros(0)
    return out


def _shapes(model: ModelSpec, cluster: ClusterSpec, devices: int, global_batch: int, cross_tp: bool, where,
            fix: dict):
    """The bound.Shape of each parallel shape `where` and `fix` allow, with the choices `fix` allows in it."""
    for tp, pp, cp, dp, ep in shapes(model, cluster, devices, global_batch, cross_tp):
        if where is not None and not where(tp, pp, cp, dp, ep):
            continue
        if not all(_allowed(fix, k, v) for k, v in zip(("tp", "pp", "cp", "dp", "ep"), (tp, pp, cp, dp, ep))):
            continue
        per_rank = global_batch // dp
        for etp in expert_tps(tp, cp, dp, ep, fix):
            if not _allowed(fix, "etp", etp):
                continue
            yield bound.Shape(tp, pp, cp, dp, ep, global_batch,
                              schedules=tuple((n, v) for n, v in _schedules(model, pp)
                                              if _allowed(fix, "schedule", n) and _allowed(fix, "vpp", v)),
                              microbatch_sizes=tuple(b for b in _divisors(per_rank) if b <= MAX_MBS and
                                                     _allowed(fix, "mbs", b)),
                              sps=(False, True) if tp > 1 else (False,),
                              shards=tuple(_shard_sizes(cluster, tp, dp * cp)), etp=etp if etp != tp else 0)


def _rows(shape: bound.Shape, fix: dict, minimal: bool = True) -> bound.Rows:
    """Every combination of the shape's choices `fix` allows, in itertools.product's order (zero, shard, sp,
    schedule, mbs, recompute); a shard group smaller than dp*cp needs ZeRO, and recompute=minimal comes only where
    `minimal` (specs.layout.minimal_recompute_built)."""
    replicas = shape.dp * shape.cp
    zeros = [z for z in (range(4) if replicas > 1 else [0]) if _allowed(fix, "zero", z)]
    sp_idx = [i for i, sp in enumerate(shape.sps) if _allowed(fix, "sp", sp)]
    rec_idx = [i for i, r in enumerate(bound.RECOMPUTE_MODES)
               if _allowed(fix, "recompute", r) and (minimal or r != "minimal")]
    zero_shard = np.array([(z, g) for z in zeros for g in shape.shards if z > 0 or g == replicas], dtype=int)
    zero_shard = zero_shard.reshape(-1, 2)  # (zero, shard) pairs, none when --fix leaves no zero
    axes = [np.asarray(a) for a in (sp_idx, range(len(shape.schedules)), shape.microbatch_sizes, rec_idx)]
    at = np.indices([len(zero_shard)] + [len(a) for a in axes]).reshape(len(axes) + 1, -1)  # the last axis fastest
    return bound.Rows(zero_shard[at[0], 0], zero_shard[at[0], 1].astype(float), axes[0][at[1]], axes[1][at[2]],
                      axes[2][at[3]].astype(float), axes[3][at[4]], at[3])


def _shard_sizes(cluster: ClusterSpec, tp: int, replicas: int) -> list[int]:
    """ZeRO shard group sizes to try: all dp*cp ranks (first), and, when those span more than the fast
    domain, hybrid sharding with the largest group inside it (FSDP within a node or pod, replicas across
    the slow tier: PyTorch FSDP's HYBRID_SHARD, Zhao et al. 2023 sec. 3.2.2; PaLM's per-pod sharding)."""
    inside = [d for d in _divisors(replicas) if d * tp <= cluster.fast_domain]
    if replicas * tp > cluster.fast_domain and inside and max(inside) > 1:
        return [replicas, max(inside)]
    return [replicas]


def rank_key(pred: Prediction, layout: Layout) -> tuple:
    """Fastest first; on a tie, the simpler layout (fewer parallel axes, lower ZeRO stage, less memory);
    `layout` is the prediction's."""
    axes = sum(d > 1 for d in (layout.tp, layout.pp, layout.cp, layout.ep))
    return pred.step_time_s, axes, layout.zero, pred.memory_per_device_bytes["total"]


def _layout(shape: bound.Shape, rows: bound.Rows, i: int) -> Layout:
    """The Layout of row `i` of a shape."""
    z = int(rows.zero[i])
    name, v = shape.schedules[rows.schedule[i]]
    return Layout(dp=shape.dp, zero=z, shard=int(rows.shard[i]) if z else 0, tp=shape.tp, sp=shape.sps[rows.sp[i]],
                  pp=shape.pp, vpp=v, schedule=name, cp=shape.cp, ep=shape.ep, etp=shape.etp,
                  mbs=int(rows.mbs[i]), recompute=bound.RECOMPUTE_MODES[rows.recompute[i]])
