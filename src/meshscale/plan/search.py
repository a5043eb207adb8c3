"""Exhaustive layout search with bound pruning.

Every layout (tp, pp, cp, dp, ep, zero, shard, sp, schedule/vpp, mbs, recompute) is enumerated. For each
parallel shape (tp, pp, cp, dp, ep) numpy scores all the remaining choices at once: memory per device
(exact, the same formulas as `predict`) and a lower bound on step time (ideal compute plus bubble; every
other term of the step is non-negative). Survivors are costed in full with `predict`, cheapest bound
first, until the bound of the next one exceeds the K-th best time found: none after it can enter the top K.
"""

import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from operator import itemgetter

import numpy as np

from meshscale.cost import comm, predict
from meshscale.cost.kernels import Passes, attention_core_seconds, counted_seconds, kernel_shape
from meshscale.cost.memory import (PRECISIONS, _expert_params_per_rank, _held, _params_per_rank,
                                   activation_bytes_per_layer, busiest_rank, expert_params_on_rank, params_on_rank,
                                   rebuilt_layer_bytes, root_params_on_rank, stage_layers, zero_copy_bytes)
from meshscale.cost.pipeline import head_on_chain, schedule_bubble, v_tail
from meshscale.cost.step import (Prediction, chunk_kinds, elementwise_seconds, grad_reduce_bytes, param_gather_bytes,
                                  rank_kinds)
from meshscale.errors import UserError
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import RECOMPUTE, SCHEDULES, V_SCHEDULES, Layout, check_against, kv_heads_fit
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


_FIXABLE = ("dp", "zero", "tp", "sp", "pp", "vpp", "schedule", "cp", "ep", "mbs", "recompute")


def parse_fix(text: str) -> dict:
    """`--fix pp=1,tp=8` as {key: value}: the layout values every searched layout must have."""
    fixed: dict = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, _, raw = item.partition("=")
        key, raw = key.strip(), raw.strip().lower()
        if key == "fsdp":
            fixed.update(parse_fix(f"dp={raw},zero=3"))
            continue
        if key not in _FIXABLE or not raw:
            raise UserError(f"--fix: {item!r} is not key=value with a layout key ({', '.join(_FIXABLE)}, fsdp); "
                            "example: --fix pp=1,tp=8")
        if key == "sp":
            if raw not in ("true", "false", "1", "0"):
                raise UserError(f"--fix: sp must be true or false, got {raw!r}")
            value = raw in ("true", "1")
        elif key in ("schedule", "recompute"):
            choices = SCHEDULES if key == "schedule" else RECOMPUTE
            if raw not in choices:
                raise UserError(f"--fix: unknown {key} {raw!r}; choose one of {', '.join(choices)}")
            if raw == "op":  # torchtitan's policy, for predict and train; its tp=1, dense-only rule stays out
                raise UserError("--fix: plan does not search recompute=op; fix none, selective or full")
            value = raw
        else:
            if not raw.isdigit() or int(raw) < (0 if key == "zero" else 1) or (key == "zero" and int(raw) > 3):
                raise UserError(f"--fix: {key} must be a whole number {'0-3' if key == 'zero' else '>= 1'}, got {raw!r}")
            value = int(raw)
        if fixed.get(key, value) != value:
            raise UserError(f"--fix: {key} fixed to two values ({fixed[key]} and {value})")
        fixed[key] = value
    if not fixed:
        raise UserError("--fix needs key=value pairs, e.g. --fix pp=1,tp=8")
    return fixed


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

    def to_dict(self) -> dict:
        return {"evaluated": self.evaluated, "enumerated": self.enumerated, "fitting": self.fitting,
                "search_seconds": self.seconds, "objective": self.objective,
                "ranked": [p.to_dict() for p in self.ranked]}


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def shapes(model: ModelSpec, cluster: ClusterSpec, devices: int, global_batch: int, cross_tp: bool):
    """Parallel shapes (tp, pp, cp, dp, ep) whose degrees divide what they must."""
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
                eps = [e for e in _divisors(dp * cp) if model.experts % e == 0] if model.is_moe else [1]
                for ep in eps:
                    yield tp, pp, cp, dp, ep


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
    fix = fix or {}
    start = time.perf_counter()
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    cluster.check_precision(precision)
    capacity = cluster.hbm_bytes * (1 - headroom)
    bytes_ = PRECISIONS[precision]
    enumerated = fitting = 0
    smallest = (math.inf, "")
    bounds, keys = [], []
    for tp, pp, cp, dp, ep in shapes(model, cluster, devices, global_batch, cross_tp):
        if where is not None and not where(tp, pp, cp, dp, ep):
            continue
        if not all(_allowed(fix, k, v) for k, v in zip(("tp", "pp", "cp", "dp", "ep"), (tp, pp, cp, dp, ep))):
            continue
        per_rank = global_batch // dp
        mbs_opts = [b for b in _divisors(per_rank) if b <= MAX_MBS and _allowed(fix, "mbs", b)]
        scheds = [(n, v) for n, v in _schedules(model, pp) if _allowed(fix, "schedule", n) and
                  _allowed(fix, "vpp", v)]
        zeros = [z for z in (range(4) if dp * cp > 1 else [0]) if _allowed(fix, "zero", z)]
        sps = (False, True) if tp > 1 else (False,)
        sp_idx = [i for i, sp in enumerate(sps) if _allowed(fix, "sp", sp)]
        rec_idx = [i for i, r in enumerate(RECOMPUTE) if r != "op" and _allowed(fix, "recompute", r)]
        shards = _shard_sizes(cluster, tp, dp * cp)
        axes = (zeros, shards, sp_idx, range(len(scheds)), mbs_opts, rec_idx)  # rows in itertools.product's order
        grid = np.stack(np.meshgrid(*(np.asarray(a, dtype=float) for a in axes), indexing="ij"), -1).reshape(-1, 6)
        grid = grid[(grid[:, 0] > 0) | (grid[:, 1] == dp * cp)]  # a shard group smaller than dp*cp needs ZeRO
        if not len(grid):
            continue
        z, shard, s_i, k_i, mbs, r_i = grid.T
        k_i, s_i, r_i, z = k_i.astype(int), s_i.astype(int), r_i.astype(int), z.astype(int)
        enumerated += len(grid)
        m = per_rank / mbs
        names = [n for n, _ in scheds]
        is_v = np.array([n in ("zbv", "dualpipev") for n in names])[k_i]
        # Memory: parameters, gradients, optimizer (ZeRO over the shard group), then activations in flight.
        # (routed experts shard over their dp*cp/ep replicas: memory.zero_held)
        p_std, e_std = _busiest(model, tp, ep, pp, pp, False)
        p_v, e_v = _busiest(model, tp, ep, pp, 2 * pp, True) if pp > 1 and 2 * pp <= model.layers else (p_std, e_std)
        params, experts = np.where(is_v, p_v, p_std), np.where(is_v, e_v, e_std)
        dense = params - experts
        copies = np.select([z == 1, z == 2], [zero_copy_bytes(precision, 1), zero_copy_bytes(precision, 2)], 0)
        static = sum(b * (dense / np.where(z >= stage, shard, 1) + experts / np.where(z >= stage, dp * cp // ep, 1))
                     for b, stage in ((bytes_["params"], 3), (bytes_["grads"], 2), (bytes_["optimizer"] + copies, 1)))
        scale = bytes_["compute"] / 2
        eager = not cluster.software.fused_elementwise
        per_token = np.array([[activation_bytes_per_layer(model, Layout(tp=tp, sp=sp, recompute=r), 1,
                                                          cluster.fused_attention, eager)
                               for r in RECOMPUTE] for sp in sps]) * scale
        rebuild = np.array([rebuilt_layer_bytes(model, tp, sp, 1, cluster.fused_attention, eager)
                            for sp in sps]) * scale
        tokens = mbs * model.seq / cp
        mbs_i = np.searchsorted(mbs_opts, mbs)
        held = np.array([[_held(model.layers, pp, v, n, n in V_SCHEDULES and pp > 1, per_rank // b) for b in mbs_opts]
                         for n, v in scheds])[k_i, mbs_i]
        logits = np.where(is_v | (pp == 1), 4 * model.vocab / tp, 0.0)  # the head on the first rank
        acts = (per_token[s_i, r_i] * held + np.where(r_i == 2, rebuild[s_i], 0.0) + logits) * tokens
        total = static + acts
        ok = total <= capacity
        if pp > 1:  # all schedules but GPipe need at least pp micro-batches in flight
            ok &= (m >= pp) | (np.array([n == "gpipe" for n in names])[k_i])
        i_min = int(np.argmin(total))
        if total[i_min] < smallest[0]:
            smallest = (float(total[i_min]), _layout(tp, pp, cp, dp, ep, z[i_min], shard[i_min], sps[s_i[i_min]],
                                                     scheds[k_i[i_min]], mbs[i_min], r_i[i_min]))
        fitting += int(ok.sum())
        if not ok.any():
            continue
        # Lower bound: (compute of the slowest stage + the bandwidth part of the collectives that sit on the
        # critical path) x (1 + bubble ratio) + the ZeRO-1/2 parameter all-gather; latencies dropped. Compute
        # is predict's own: the kernels' F, B, W of the slowest rank plus its element-wise work (a third of it
        # in the forward), less the per-kernel overheads.
        kernels = _pipeline_passes(model, cluster, tp, pp, cp, ep, scheds, mbs_opts, precision)
        kernels = kernels[k_i, mbs_i, r_i]
        elementwise = mbs * np.array([[elementwise_seconds(
            model, cluster, Layout(tp=tp, sp=sp, recompute=r, pp=pp), model.seq / cp, bytes_["compute"])
            for r in RECOMPUTE] for sp in sps])[s_i, r_i]
        f, b, w = (kernels[:, 0, i] + elementwise * share for i, share in enumerate((1 / 3, 2 / 3, 0)))
        f_o, b_o, w_o = (kernels[:, 1, i] + elementwise * share for i, share in enumerate((1 / 3, 2 / 3, 0)))
        compute = m * (f + b + w)
        forward = m * f  # what is left of a micro-batch once its backward has started
        shape = (model, cluster, devices, tp, pp, cp, dp, ep, per_rank, bytes_["compute"], precision)
        layouts = [Layout(dp=dp, tp=tp, pp=pp, vpp=vv, schedule=n, cp=cp, ep=ep) for n, vv in scheds]
        owned = [[len(stage_layers(model, lay, r)) for r in range(pp)] for lay in layouts]
        fewest, most = min(map(min, owned)), max(map(max, owned))
        floor_cp = np.array([_floor_cp(*shape, r, fewest, most) for r in RECOMPUTE])
        floor_tp = {n: np.array([_floor_tp(*shape, r, n) for r in RECOMPUTE]) for n in {min(o) for o in owned}}
        floor_r = np.array([floor_tp[min(o)] + floor_cp for o in owned])  # per schedule x recompute
        floor_k = np.array([_floor_pp(*shape, n, vv) for n, vv in scheds])
        # per schedule, the busiest rank's parameters and those of its root unit: what predict charges over
        # dp*cp (under EP the routed experts reduce over their own, smaller group: left out of the bound)
        busy = [busiest_rank(model, lay) for lay in layouts]
        p_k = np.array([params_on_rank(model, lay, r) - (expert_params_on_rank(model, lay, r) if ep > 1 else 0.0)
                        for lay, r in zip(layouts, busy)])[k_i]
        root_k = np.array([root_params_on_rank(model, lay, r) for lay, r in zip(layouts, busy)])[k_i]

        def per_byte(collective):  # seconds per byte over each row's shard group
            full, hybrid = (_time_no_latency(cluster, devices, collective, 1.0, g, tp) for g in (shards * 2)[:2])
            return np.where(shard == shards[0], full, hybrid)

        ag, rs = per_byte("all_gather"), per_byte("reduce_scatter")
        update = param_gather_bytes(cluster.software, precision)
        gather = ag * update * p_k if not cluster.software.param_gather_overlap else 0.0
        ratio = _bubble(scheds, k_i, pp, m, f_o, b_o, w_o) * (f_o + b_o + w_o) / (f + b + w)
        # a V whose rank 0 is the slowest: predict's pipeline.bubble_ratio with the V's ends, less ZB-V's warm-up;
        # ZB-H1: the others' span, below predict's whichever rank is the slowest
        v_first = np.array([n in V_SCHEDULES for n in names])[k_i] & (kernels[:, 2, 1] == 1)
        beyond = ratio + (f_o + b_o + w_o) / (f + b + w) - 1
        if v_first.any():
            zbv = np.array([n == "zbv" for n in names])[k_i]
            last = Passes(kernels[:, 4, 0] + elementwise / 6, kernels[:, 4, 1] + elementwise / 3)  # half of it
            beyond = np.where(v_first & zbv, beyond + head_on_chain("zbv", Passes(f_o, b_o), last) / (m * (f + b + w)),
                              beyond)
            first = Passes(0.0, kernels[:, 3, 1] + elementwise / 3, kernels[:, 3, 2])  # B: 2/3 of half of it
            tail = np.where(zbv,
                            v_tail(pp, Passes(0.0, b_o), first, Passes(weight=kernels[:, 4, 2]), np.maximum),
                            (pp - 1) * (b_o - w_o) / 2)
            ratio = np.where(v_first, np.maximum(tail / compute, beyond), ratio)
        ratio = np.where(np.array([n == "zb" for n in names])[k_i], beyond, ratio)
        sends = np.maximum(floor_k[k_i] - m * kernels[:, 2, 0], 0.0)  # what the slowest rank's lead leaves
        bound = (compute + floor_r[k_i, r_i] + sends) * (1 + ratio) + np.where((z == 1) | (z == 2), gather, 0.0)
        if dp * cp > 1:  # gradient reduction not hidden by backward (zero 0-2) or FSDP traffic beyond compute
            grads = rs * grad_reduce_bytes(cluster.software, precision) * p_k
            backward = compute - forward
            # ZeRO-3 (comm.data_parallel_ops): without a pipeline each micro-batch gathers the blocks twice and
            # the root once and reduce-scatters the gradient; inside one, every forward gathers the blocks, all
            # backwards gather them once more, and the gradient is reduce-scattered once.
            blocks = p_k - root_k
            if pp == 1:
                fsdp = m * (grads + ag * bytes_["compute"] * (2 * blocks + root_k))
            else:
                fsdp = grads + ag * bytes_["compute"] * ((m + 1) * blocks + root_k)
            unhidden = np.select([z == 0, z == 1, z == 2], [2 * grads - backward / m, grads - backward / m,
                                                             m * grads - backward], fsdp - compute)
            bound = bound + np.maximum(unhidden, 0.0)
        for i in np.flatnonzero(ok):
            bounds.append(bound[i])
            keys.append((tp, pp, cp, dp, ep, z[i], int(shard[i]), sps[s_i[i]], scheds[k_i[i]], int(mbs[i]),
                         RECOMPUTE[r_i[i]]))
    if not keys:
        return Plan([], enumerated, 0, 0, time.perf_counter() - start, smallest, fixed=fix)

    order = np.argsort(np.array(bounds), kind="stable")
    best: list = []  # the top K, (rank_key, Prediction), keyed once
    by_shape: dict = {}  # the best layout of each parallel shape: the alternatives the explanation cites
    evaluated = 0
    for i in order:
        if prune and len(best) >= top and len(by_shape) >= ALTERNATIVES:
            cutoff = max(best[-1][1].step_time_s,
                         sorted(p.step_time_s for _, p in by_shape.values())[ALTERNATIVES - 1])
            if bounds[i] >= cutoff:
                break
        tp, pp, cp, dp, ep, z, sh, sp, (sched, v), mbs, rec = keys[i]
        layout = Layout(dp=dp, zero=int(z), shard=sh if z else 0, tp=tp, sp=sp, pp=pp, vpp=v, schedule=sched,
                        cp=cp, ep=ep, mbs=mbs, recompute=rec)
        if not runnable(layout, model, global_batch):
            continue
        pred = predict(model, cluster, layout, global_batch, precision)
        evaluated += 1
        if pred.memory_per_device_bytes["total"] > capacity:
            continue
        key = rank_key(pred)
        best = sorted(best + [(key, pred)], key=itemgetter(0))[:top]
        shape = (tp, pp, cp, dp, ep, int(z), layout.shard)
        if shape not in by_shape or key < by_shape[shape][0]:
            by_shape[shape] = key, pred
    alternatives = [p for _, p in sorted(by_shape.values(), key=itemgetter(0))[1:ALTERNATIVES]]
    return Plan([p for _, p in best], enumerated, fitting, evaluated, time.perf_counter() - start, smallest,
                rejected=alternatives, fixed=fix)


def _shard_sizes(cluster: ClusterSpec, tp: int, replicas: int) -> list[int]:
    """ZeRO shard group sizes to try: all dp*cp ranks (first), and, when those span more than the fast
    domain, hybrid sharding with the largest group inside it (FSDP within a node or pod, replicas across
    the slow tier: PyTorch FSDP's HYBRID_SHARD, Zhao et al. 2023 sec. 3.2.2; PaLM's per-pod sharding)."""
    inside = [d for d in _divisors(replicas) if d * tp <= cluster.fast_domain]
    if replicas * tp > cluster.fast_domain and inside and max(inside) > 1:
        return [replicas, max(inside)]
    return [replicas]


def rank_key(pred: Prediction) -> tuple:
    """Fastest first; on a tie, the simpler layout (fewer parallel axes, lower ZeRO stage, less memory)."""
    layout = Layout.parse(pred.layout)
    axes = sum(d > 1 for d in (layout.tp, layout.pp, layout.cp, layout.ep))
    return pred.step_time_s, axes, layout.zero, pred.memory_per_device_bytes["total"]


def _time_no_latency(cluster, devices, collective, nbytes, size, stride) -> float:
    return comm.collective_time(collective, nbytes, 0, size, comm.group_link(cluster, devices, size, stride))


def _floor_tp(model, cluster, devices, tp, pp, cp, dp, ep, per_rank, act_bytes, precision, recompute,
              fewest) -> float:
    """Bandwidth time of the TP traffic for the whole step on the lightest rank (`fewest` layers; with layers
    not divisible by the chunks that is fewer than layers / pp). EP all-to-alls are left out: another
    micro-batch's compute may hide them (dualpipev, ep_comm_overlap)."""
    if tp == 1:
        return 0.0
    # SP's all-gathers and reduce-scatters take the bandwidth time of the all-reduces without SP; only the
    # unhidden ones count (the small all-reduces are left out: SP adds its norm gradients to them)
    layout = Layout(dp=dp, tp=tp, sp=True, cp=cp, ep=ep, recompute=recompute)
    tokens = per_rank * model.seq / cp
    sw = cluster.software
    hidden = {"gemm": sw.tp_comm_overlap, "wgrad": sw.tp_comm_overlap or sw.tp_wgrad_overlap}
    return sum(_time_no_latency(cluster, devices, c, b, tp, 1)
               for c, b, _, o in comm.tensor_parallel_ops(model, layout, tokens, act_bytes, fewest, False, False, 1)
               if c != "all_reduce" and not hidden.get(o, False))


def _floor_cp(model, cluster, devices, tp, pp, cp, dp, ep, per_rank, act_bytes, precision, recompute, fewest,
              most) -> float:
    """The CP ring time the attention cannot hide: the ring of the rank with the `fewest` layers against the
    attention of the `most`. A fused kernel's time is linear in the tokens, so it does not depend on mbs; the
    batched GEMMs of unfused attention are not, and get no CP term."""
    if cp == 1 or not cluster.fused_attention:
        return 0.0
    layout = Layout(dp=dp, tp=tp, cp=cp, ep=ep, recompute=recompute, mbs=1)
    f, b = attention_core_seconds(model, cluster, layout, model.seq / cp, precision)
    attention = per_rank * most * (f + b + (f if recompute != "none" else 0.0))
    tokens = per_rank * model.seq / cp
    ring = sum(_time_no_latency(cluster, devices, c, nbytes, cp, tp)
               for c, nbytes, _, _ in comm.context_parallel_ops(model, layout, tokens, act_bytes, fewest, 1))
    return max(0.0, ring - attention)


def _floor_pp(model, cluster, devices, tp, pp, cp, dp, ep, per_rank, act_bytes, precision, schedule,
              vpp) -> float:
    if pp == 1:
        return 0.0
    layout = Layout(dp=dp, tp=tp, cp=cp, pp=pp, vpp=vpp, schedule=schedule)
    quietest = min(range(pp), key=lambda r: comm.pipeline_sends(layout, r))  # predict costs one rank's sends
    ops = comm.pipeline_ops(model, layout, per_rank * model.seq / cp, act_bytes, 1, quietest)
    return sum(_time_no_latency(cluster, devices, c, b, 2, tp * cp * dp) for c, b, _, _ in ops)


def _bubble(scheds, k_i, pp, m, f, b, w):
    """Each row's `pipeline.schedule_bubble` with its F, B, W: predict's bubble ratio, over arrays."""
    out = np.zeros_like(m)
    for k, (name, v) in enumerate(scheds):
        rows = k_i == k
        out[rows] = schedule_bubble(name, pp, v, m[rows], f[rows], b[rows], w[rows], np.maximum, np.minimum)
    return out


@lru_cache(maxsize=256)
def _unit_columns(model: ModelSpec) -> list[int]:
    """Which of (a dense layer, a MoE layer, the head) the model has."""
    return [c for c, present in enumerate((model.dense_layers > 0, model.is_moe, True)) if present]


@lru_cache(maxsize=4096)
def _unit_passes(model, cluster, tp, cp, ep, mbs, precision) -> np.ndarray:
    """F, B, W of one dense layer, one MoE layer and the head (those the model has) per recompute mode: an
    array (recompute, kinds, 3), shared by every shape with these tp, cp, ep and mbs (so read only)."""
    kinds = [((1, 0, False), (0, 1, False), (0, 0, True))[c] for c in _unit_columns(model)]
    unit = np.zeros((len(RECOMPUTE), len(kinds), 3))
    for r, recompute in enumerate(RECOMPUTE):
        shape = kernel_shape(Layout(tp=tp, cp=cp, ep=ep, dp=ep, mbs=mbs, recompute=recompute))
        for i, kind in enumerate(kinds):
            p = counted_seconds(model, cluster, shape, *kind, precision)
            unit[r, i] = p.forward, p.backward, p.weight
    unit.flags.writeable = False
    return unit


def _pipeline_passes(model, cluster, tp, pp, cp, ep, scheds, mbs_opts, precision) -> np.ndarray:
    """The kernels' F, B, W of one micro-batch on the slowest pipeline rank, their mean over the other ranks and
    the slowest rank's lead, as predict's pipeline_passes charges them (less the element-wise work, alike on
    every rank), per schedule x mbs x recompute: an array (schedules, mbs, recompute, 5, 3), the lead in
    [..., 2, 0], 1 where rank 0 is the slowest in [..., 2, 1], the first and last chunks' F, B, W in [..., 3]
    and [..., 4]. A rank's (and a chunk's) time is linear in its dense layers, MoE layers and head."""
    columns = _unit_columns(model)
    unit = np.stack([_unit_passes(model, cluster, tp, cp, ep, mbs, precision) for mbs in mbs_opts])
    placements = {}  # (chunks, V-shaped) -> the (slowest, mean of the others, lead, ends) its schedules share
    out = np.zeros((len(scheds), len(mbs_opts), len(RECOMPUTE), 5, 3))
    for k, (name, v) in enumerate(scheds):
        key = (pp * v, name in V_SCHEDULES and pp > 1)
        if key not in placements:
            kinds_n = np.array(rank_kinds(model, pp, *key), dtype=float)
            per_rank = np.einsum("ni,jrip->njrp", kinds_n[:, columns], unit)
            totals, count = per_rank.sum(-1), kinds_n[:, -1]
            top = totals.argmax(0)
            slowest = np.take_along_axis(per_rank, top[None, :, :, None], 0)[0]
            if pp == 1:
                placements[key] = slowest, slowest, 0.0, 0.0, 0.0, 0.0
            else:
                mean = (np.einsum("n,njrp->jrp", count, per_rank) - slowest) / (pp - 1)
                others = np.where(np.arange(len(count))[:, None, None] == top, -np.inf, totals).max(0)
                lead = np.where(count[top] > 1, 0.0, totals.max(0) - others)
                ends = [np.einsum("i,jrip->jrp", np.array(chunk_kinds(model, pp * v)[c], dtype=float)[columns], unit)
                        for c in (0, pp * v - 1)]  # the first and last chunks, rank 0's under a V
                placements[key] = slowest, mean, lead, (top == 0) * 1.0, *ends
        out[k, :, :, 0], out[k, :, :, 1], out[k, :, :, 2, 0], out[k, :, :, 2, 1], out[k, :, :, 3], out[k, :, :, 4] = \
            placements[key]
    return out


def _busiest(model, tp, ep, pp, chunks, v_shape) -> tuple[float, float]:
    """(parameters, routed expert parameters) of the pipeline rank holding the most (memory.busiest_rank)."""
    per_rank = _params_per_rank(model, tp, ep, pp, chunks, v_shape)
    rank = max(range(pp), key=per_rank.__getitem__)
    return per_rank[rank], (_expert_params_per_rank(model, tp, ep, pp, chunks, v_shape)[rank] if ep > 1 else 0.0)


def _layout(tp, pp, cp, dp, ep, z, shard, sp, sched, mbs, r) -> str:
    name, v = sched
    return str(Layout(dp=dp, zero=int(z), shard=int(shard) if z else 0, tp=tp, sp=sp, pp=pp, vpp=v,
                      schedule=name, cp=cp, ep=ep, mbs=int(mbs), recompute=RECOMPUTE[int(r)]))
