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
from itertools import product

import numpy as np

from meshscale.cost import comm, flops, predict
from meshscale.cost.memory import PRECISIONS, _params_per_rank, activation_bytes_per_layer
from meshscale.cost.step import Prediction, _slowest_stage, elementwise_seconds
from meshscale.errors import UserError
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import RECOMPUTE, Layout, check_against, kv_heads_fit
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

    def to_dict(self) -> dict:
        return {"evaluated": self.evaluated, "enumerated": self.enumerated, "fitting": self.fitting,
                "search_seconds": self.seconds, "objective": self.objective,
                "ranked": [p.to_dict() for p in self.ranked]}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


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
           top: int = 5, headroom: float = 0.1, cross_tp: bool = False, prune: bool = True, where=None) -> Plan:
    """Rank the layouts that fit. `where(tp, pp, cp, dp, ep)` restricts the parallel shapes (the explanation
    asks for neighbours of the winner); `prune=False` costs every layout in full (to check the bound)."""
    start = time.perf_counter()
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    capacity = cluster.hbm_bytes * (1 - headroom)
    bytes_ = PRECISIONS[precision]
    rate = cluster.peak_flops(precision) * cluster.matmul_efficiency
    enumerated = fitting = 0
    smallest = (math.inf, "")
    bounds, keys = [], []
    for tp, pp, cp, dp, ep in shapes(model, cluster, devices, global_batch, cross_tp):
        if where is not None and not where(tp, pp, cp, dp, ep):
            continue
        per_rank = global_batch // dp
        mbs_opts = [b for b in _divisors(per_rank) if b <= MAX_MBS]
        scheds = _schedules(model, pp)
        zeros = range(4) if dp * cp > 1 else [0]
        sps = (False, True) if tp > 1 else (False,)
        shards = _shard_sizes(cluster, tp, dp * cp)
        grid = np.array([row for row in product(zeros, shards, range(len(sps)), range(len(scheds)), mbs_opts,
                                                range(3)) if row[0] or row[1] == dp * cp], dtype=float)
        z, shard, s_i, k_i, mbs, r_i = grid.T
        k_i, s_i, r_i, z = k_i.astype(int), s_i.astype(int), r_i.astype(int), z.astype(int)
        enumerated += len(grid)
        m = per_rank / mbs
        names = [n for n, _ in scheds]
        v = np.array([vv for _, vv in scheds], dtype=float)[k_i]
        is_v = np.array([n in ("zbv", "dualpipev") for n in names])[k_i]
        # Memory: parameters, gradients, optimizer (ZeRO over the shard group), then activations in flight.
        p_std = max(_params_per_rank(model, tp, ep, pp, pp, False))
        p_v = max(_params_per_rank(model, tp, ep, pp, 2 * pp, True)) if pp > 1 and 2 * pp <= model.layers else p_std
        params = np.where(is_v, p_v, p_std)
        static = params * (bytes_["params"] / np.where(z >= 3, shard, 1) + bytes_["grads"] / np.where(z >= 2, shard, 1)
                           + bytes_["optimizer"] / np.where(z >= 1, shard, 1))
        scale = bytes_["compute"] / 2
        per_token = np.array([[activation_bytes_per_layer(model, Layout(tp=tp, sp=sp, recompute=r), 1,
                                                          cluster.fused_attention)
                               for r in RECOMPUTE] for sp in sps]) * scale
        rebuild = np.array([activation_bytes_per_layer(model, Layout(tp=tp, sp=sp, recompute="selective"), 1)
                            for sp in sps]) * scale
        tokens = mbs * model.seq / cp
        inflight = _inflight(names, k_i, pp, v, m)
        acts = (per_token[s_i, r_i] * model.layers / pp * inflight + np.where(r_i == 2, rebuild[s_i], 0.0)
                + 4 * model.vocab / tp) * tokens
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
        # critical path) x (1 + bubble ratio) + the ZeRO-1/2 parameter all-gather; latencies dropped.
        stage = np.array([[_work(model, pp, pp * vv, n in ("zbv", "dualpipev"), r, cluster.fused_attention)
                           for r in RECOMPUTE] for n, vv in scheds])
        compute = per_rank * model.seq * stage[k_i, r_i] / (tp * cp) / rate
        compute = compute + per_rank * np.array([[elementwise_seconds(
            model, cluster, Layout(tp=tp, sp=sp, recompute=r, pp=pp), model.seq / cp, bytes_["compute"])
            for r in RECOMPUTE] for sp in sps])[s_i, r_i]
        shape = (model, cluster, devices, tp, pp, cp, dp, ep, per_rank, bytes_["compute"], rate)
        floor_r = np.array([_floor_tp_cp(*shape, r) for r in RECOMPUTE])
        floor_k = np.array([_floor_pp(*shape, n, vv) for n, vv in scheds])
        def over_shard(collective, nbytes):  # bandwidth time over each row's shard group
            full, hybrid = (_time_no_latency(cluster, devices, collective, nbytes, g, tp) for g in (shards + shards)[:2])
            return np.where(shard == shards[0], full, hybrid)

        gather = over_shard("all_gather", 4 * p_std) if dp * cp > 1 else 0.0
        ratio = _bubble(names, k_i, pp, v, m)
        bound = (compute + floor_r[r_i] + floor_k[k_i]) * (1 + ratio) + np.where((z == 1) | (z == 2), gather, 0.0)
        if dp * cp > 1:  # gradient reduction not hidden by backward (zero 0-2) or FSDP traffic beyond compute
            grads = over_shard("reduce_scatter", 4 * p_std)
            backward = compute * 2 / 3
            fsdp = m * (grads + over_shard("all_gather", 2 * bytes_["compute"] * p_std))
            unhidden = np.select([z == 0, z == 1, z == 2], [2 * grads - backward / m, grads - backward / m,
                                                             m * grads - backward], fsdp - compute)
            bound = bound + np.maximum(unhidden, 0.0)
        for i in np.flatnonzero(ok):
            bounds.append(bound[i])
            keys.append((tp, pp, cp, dp, ep, z[i], int(shard[i]), sps[s_i[i]], scheds[k_i[i]], int(mbs[i]),
                         RECOMPUTE[r_i[i]]))
    if not keys:
        return Plan([], enumerated, 0, 0, time.perf_counter() - start, smallest)

    order = np.argsort(np.array(bounds), kind="stable")
    best: list[Prediction] = []  # the top K
    by_shape: dict = {}  # the best layout of each parallel shape: the alternatives the explanation cites
    evaluated = 0
    for i in order:
        if prune and len(best) >= top and len(by_shape) >= ALTERNATIVES:
            cutoff = max(best[-1].step_time_s, sorted(p.step_time_s for p in by_shape.values())[ALTERNATIVES - 1])
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
        best = sorted(best + [pred], key=rank_key)[:top]
        shape = (tp, pp, cp, dp, ep, int(z), layout.shard)
        if shape not in by_shape or rank_key(pred) < rank_key(by_shape[shape]):
            by_shape[shape] = pred
    alternatives = sorted(by_shape.values(), key=rank_key)[1:ALTERNATIVES]
    return Plan(best, enumerated, fitting, evaluated, time.perf_counter() - start, smallest,
                rejected=alternatives)


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


def _work(model, pp, chunks, v_shape, recompute, fused) -> float:
    fwd, _, extra = _slowest_stage(model, pp, chunks, v_shape, recompute, fused)
    return 3 * fwd + extra


def _time_no_latency(cluster, devices, collective, nbytes, size, stride) -> float:
    return comm.collective_time(collective, nbytes, 0, size, comm.group_link(cluster, devices, size, stride))


def _floor_tp_cp(model, cluster, devices, tp, pp, cp, dp, ep, per_rank, act_bytes, rate, recompute) -> float:
    """Bandwidth time of TP, EP and unhidden CP traffic for the whole step on the lightest rank."""
    layout = Layout(dp=dp, tp=tp, cp=cp, ep=ep, recompute=recompute)
    tokens = per_rank * model.seq / cp
    n_layers = model.layers // pp
    t = sum(_time_no_latency(cluster, devices, c, b, tp, 1)
            for c, b, _, _ in comm.tensor_parallel_ops(model, layout, tokens, act_bytes, n_layers, False, False, 1))
    moe = model.moe_layers // pp
    t += sum(_time_no_latency(cluster, devices, c, b, ep, tp)
             for c, b, _, _ in comm.expert_parallel_ops(model, layout, tokens, act_bytes, moe, 1))
    for c, b, _, _ in comm.context_parallel_ops(model, layout, tokens, act_bytes, n_layers, 1):
        core = flops.attention_core_flops(model, model.seq, cluster.fused_attention) * n_layers
        attention = per_rank * model.seq * core * (3 + (recompute != "none")) / (tp * cp) / rate
        t += max(0.0, _time_no_latency(cluster, devices, c, b, cp, tp) - attention)
    return t


def _floor_pp(model, cluster, devices, tp, pp, cp, dp, ep, per_rank, act_bytes, rate, schedule, vpp) -> float:
    if pp == 1:
        return 0.0
    layout = Layout(dp=dp, tp=tp, cp=cp, pp=pp, vpp=vpp, schedule=schedule)
    ops = comm.pipeline_ops(model, layout, per_rank * model.seq / cp, act_bytes, 1)
    return sum(_time_no_latency(cluster, devices, c, b, 2, tp * cp * dp) for c, b, _, _ in ops)


def _inflight(names, k_i, pp, v, m):
    """Vectorised `memory.inflight_microbatches`."""
    if pp == 1:
        return np.ones_like(m)
    sched = np.array(names)[k_i]
    base = np.minimum(m, pp)
    out = np.where(sched == "gpipe", m, base)
    out = np.where(sched == "interleaved", base * (1 + (pp - 1) / (pp * v)), out)
    return np.where(sched == "dualpipev", np.minimum(m, pp + 1), out)


def _bubble(names, k_i, pp, v, m):
    """Vectorised `pipeline.bubble_ratio`."""
    if pp == 1:
        return np.zeros_like(m)
    sched = np.array(names)[k_i]
    out = (pp - 1) / m
    out = np.where(sched == "interleaved", (pp - 1) / (v * m), out)
    out = np.where(np.isin(sched, ("zb", "dualpipev")), (pp - 1) / (3 * m), out)
    return np.where(sched == "zbv", (pp - 1) / (6 * m), out)


def _layout(tp, pp, cp, dp, ep, z, shard, sp, sched, mbs, r) -> str:
    name, v = sched
    return str(Layout(dp=dp, zero=int(z), shard=int(shard) if z else 0, tp=tp, sp=sp, pp=pp, vpp=v,
                      schedule=name, cp=cp, ep=ep, mbs=int(mbs), recompute=RECOMPUTE[int(r)]))
