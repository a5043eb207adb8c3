"""Expert parallelism: each of `ep` ranks holds experts/ep of every MoE layer's routed experts, and tokens
travel to their experts and back by all-to-all (GShard, Lepikhin et al. 2020, sec. 2.2; DeepSeek-V3 sec. 3.2).

The EP ranks are folded over each pipeline stage's tp*cp*dp ranks as Megatron-Core folds them
(specs.layout.expert_mesh_shape; Liu et al. 2025, "MoE Parallel Folding"): `etp` consecutive ranks split
each expert's matrices (column/row, as TP splits a dense MLP), an EP group is `ep` ranks etp apart, and the
ranks holding the same expert shards form the expert data-parallel group ("edp", tp*cp*dp/(ep*etp) ranks).
Dense parameters reduce their gradients over all dp*cp ranks, expert parameters over edp only; both are
averaged over dp*cp, since each dp x cp replica's tokens reach every expert exactly once.

Per MoE layer and micro-batch, dropless, each rank sends all of its top_k*tokens assignments in the dispatch
all-to-all and gets back as many in the combine; backward runs both again, reversed. What a rank receives
depends on the routing; over an EP group it receives what the group sent, so the group's mean bytes are
exactly top_k*tokens*hidden per call, the cost model's figure (cost/comm.py `expert_parallel_ops`).
"""

import math
import time
from contextlib import ExitStack, contextmanager
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from meshscale.models.transformer import moe_layers, run_experts
from meshscale.parallel.compat import all_gather_into, reduce_scatter_from
from meshscale.parallel.data_parallel import Local, PipelinedDDP, sum_of_squares
from meshscale.parallel.ledger import record
from meshscale.parallel.mesh import replica_mesh
from meshscale.parallel.precision import fsdp_policy
from meshscale.parallel.strategy import Held
from meshscale.parallel.tensor import Conjugate
from meshscale.parallel.zero import Zero
from meshscale.specs.layout import Layout, expert_mesh_shape


def is_expert_param(name: str) -> bool:
    """Routed expert weights: their gradients reduce over the expert data-parallel group only."""
    return ".experts." in name


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; backward sends the gradients back the way they came. Each call
    records the buffer it sends under axis ep."""

    @staticmethod
    def forward(ctx, x, out_splits: list, in_splits: list, group):
        ctx.splits, ctx.group = (in_splits, out_splits), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits = ctx.splits
        return _all_to_all(grad.contiguous(), in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, out_splits: list, in_splits: list, group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    start = time.perf_counter()
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    record("ep", "all_to_all", x.numel() * x.element_size(), time.perf_counter() - start)
    return out


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat((x, x.new_zeros((rows - x.shape[0], *x.shape[1:])))) if rows > x.shape[0] else x


def _gather_v(x: torch.Tensor, group, sizes: list) -> torch.Tensor:
    """All-gather pieces of `sizes` rows (one per ETP rank, in rank order), through a padded buffer on gloo.
    Recorded as the contract's all_gather: the output, sum(sizes) rows (Megatron's AllGather-V)."""
    top = max(sizes)
    if not top:  # every rank knows every size: all skip alike
        return x
    out = x.new_empty((len(sizes) * top, *x.shape[1:]))
    start = time.perf_counter()
    all_gather_into(out, _padded(x, top).contiguous(), group=group)
    record("etp", "all_gather", sum(sizes) * math.prod(x.shape[1:]) * x.element_size(), time.perf_counter() - start)
    return torch.cat([piece[:n] for piece, n in zip(out.split(top), sizes)])


def _reduce_scatter_v(x: torch.Tensor, group, sizes: list) -> torch.Tensor:
    """Sum `x` (pieces of `sizes` rows, one per ETP rank) over the group; keep this rank's piece. Recorded as
    the contract's reduce_scatter: the whole input."""
    top = max(sizes)
    if not top:
        return x
    full = torch.cat([_padded(piece, top) for piece in x.split(sizes)]).contiguous()
    out = x.new_empty((top, *x.shape[1:]))
    start = time.perf_counter()
    reduce_scatter_from(out, full, group=group)
    record("etp", "reduce_scatter", x.numel() * x.element_size(), time.perf_counter() - start)
    return out[:sizes[dist.get_rank(group)]]


class AllToAllExperts:
    """The MoE dispatcher under EP (replaces model.LocalExperts): tokens sorted by global expert go to the
    rank holding it, run through its local experts, and come back in the order they left.

    `split` = (TP rank, tp) where the TP ranks split the tokens before the dispatch (Layout.dispatch_split):
    the MoE region holds the whole sequence on every TP rank (gathered under SP), so every TP rank has the
    same tokens and routing, and each sends only the assignments of its own sequence chunk, as Megatron-Core's
    all-to-all dispatcher does (its input is the SP chunk). Where the experts are split (`etp_group`), the
    ETP ranks all-gather their arrivals and reduce-scatter the partial outputs before the combine. Each rank's
    outputs are then whole for its own chunk's assignments and zero for the rest, a partial sum over TP like
    the rest of the region, which the region's reduce-scatter (or all-reduce) completes. Without `split`
    every TP rank sends all its tokens to TP-split experts (etp = tp without SP)."""

    def __init__(self, group, local: int, split: tuple[int, int] | None = None, etp_group=None):
        self.group, self.local, self.split, self.etp_group = group, local, split, etp_group
        self.ep = dist.get_world_size(group)

    def __call__(self, xs: torch.Tensor, counts: torch.Tensor, experts, positions: torch.Tensor | None = None,
                 seq: int = 0) -> torch.Tensor:
        if self.split is None:
            return self._exchange(xs, counts, experts)
        rank, t = self.split
        mine = (positions * t // seq == rank).nonzero().squeeze(1)
        label = torch.arange(len(counts), device=xs.device).repeat_interleave(counts)
        ys = self._exchange(xs[mine], torch.bincount(label[mine], minlength=len(counts)), experts)
        return ys.new_zeros((xs.shape[0], *ys.shape[1:])).index_copy(0, mine, ys)

    def _exchange(self, xs: torch.Tensor, counts: torch.Tensor, experts) -> torch.Tensor:
        # Split sizes first: how many tokens each source sends each of my local experts (metadata, E ints).
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        send = counts.view(self.ep, self.local).sum(1).tolist()
        by_source = received.view(self.ep, self.local)
        recv = by_source.sum(1).tolist()
        tokens = _AllToAll.apply(xs, recv, send, self.group)
        if self.etp_group is not None:  # the other ETP ranks' arrivals too (sizes: metadata, ep*local ints each)
            every = [torch.empty_like(by_source) for _ in range(dist.get_world_size(self.etp_group))]
            dist.all_gather(every, by_source, group=self.etp_group)
            by_source = torch.cat(every)
            sizes = [int(b.sum()) for b in every]
            # Every ETP rank's arrivals to every ETP rank (their experts are split, so each needs all the
            # tokens); backward sums the partial input gradients and returns each rank its own.
            tokens = Conjugate.apply(tokens, self.etp_group, partial(_gather_v, sizes=sizes),
                                     partial(_reduce_scatter_v, sizes=sizes))
        # Arrivals are grouped by source, then expert: regroup by expert to run each expert once.
        label = torch.arange(self.local, device=xs.device).repeat(len(by_source)).repeat_interleave(
            by_source.reshape(-1))
        order = label.argsort(stable=True)
        ys = run_experts(tokens[order], by_source.sum(0).tolist(), list(experts.values()))
        ys = torch.empty_like(ys).index_copy(0, order, ys)
        if self.etp_group is not None:
            # The split experts' partial outputs summed, each ETP rank keeping those of its own arrivals.
            ys = Conjugate.apply(ys, self.etp_group, partial(_reduce_scatter_v, sizes=sizes),
                                 partial(_gather_v, sizes=sizes))
        return _AllToAll.apply(ys, send, recv, self.group)


def apply_expert_parallel(module, emesh: DeviceMesh, layout: Layout, tp_rank: int) -> None:
    """Keep this EP rank's experts (a contiguous block of experts/ep, by global index) in every MoE layer
    and route through the all-to-all (each TP rank dispatching its sequence chunk where the layout splits
    the tokens, Layout.dispatch_split)."""
    group, rank, ep = emesh["ep"].get_group(), emesh["ep"].get_local_rank(), emesh["ep"].size()
    split = (tp_rank, layout.tp) if layout.dispatch_split > 1 else None
    etp_group = emesh["etp"].get_group() if split and layout.expert_tp > 1 else None
    for moe in moe_layers(module):
        local = moe.n_experts // ep
        mine = {str(e) for e in range(rank * local, (rank + 1) * local)}
        for name in list(moe.experts):
            if name not in mine:
                del moe.experts[name]
        moe.dispatch = AllToAllExperts(group, local, split, etp_group)


class ExpertSplit:
    """One chunk's data-parallel strategy under EP: `dense` (the layout's DDP / ZeRO / FSDP over dp*cp) owns
    every parameter but the routed experts, `experts` owns those over the expert data-parallel group.
    A parallel.strategy.Strategy."""

    def __init__(self, dense, experts, group, edp_rank: int):
        """group: the dp x cp ranks, over which the dense parameters reduce (and are sharded, when they are)."""
        self.dense, self.experts, self.group, self.edp_rank = dense, experts, group, edp_rank
        self.model, self.module, self.sharded = dense.model, dense.module, dense.sharded

    def accumulate(self, last: bool):
        stack = ExitStack()
        stack.enter_context(self.dense.accumulate(last))
        stack.enter_context(self.experts.accumulate(last))
        return stack

    def optim_params(self) -> list:
        return self.dense.optim_params() + self.experts.optim_params()

    def local_grad_sq(self, skip) -> torch.Tensor:
        """The caller sums this over DP when `sharded`; expert gradients are whole on each expert replica (or
        sharded over them), so count them once per EP rank and, where the caller does not, sum over DP."""
        own = self.experts.sharded or self.edp_rank == 0
        experts = self.experts.local_grad_sq(skip) if own else torch.zeros(())
        dense = self.dense.local_grad_sq(skip)
        if not self.sharded:
            dist.all_reduce(experts, group=self.group)  # control scalar, not ledger traffic
        else:  # the caller sums over dp x cp: under hybrid sharding each dense shard is on every replica
            dense = dense / (dist.get_world_size(self.group) // dist.get_world_size(self.dense.group))
        return dense + experts

    def after_step(self) -> None:
        self.dense.after_step()
        self.experts.after_step()

    def replicas(self) -> list:
        return self.dense.replicas() + self.experts.replicas()

    def checkpoint_state(self, optimizer) -> Held:
        (dense, write_dense), (experts, write_experts) = (s.checkpoint_state(optimizer)
                                                          for s in (self.dense, self.experts))
        return {**dense, **experts}, lambda: (write_dense(), write_experts())


class _AveragedLocal(Local):
    """Expert gradients with no other replica (ep == dp*cp): nothing to reduce, but they still average
    over the dp*cp ranks whose tokens they saw."""

    def __init__(self, model, select, divide: int):
        super().__init__(model, select)
        self.divide = divide

    @contextmanager
    def accumulate(self, last: bool):
        yield
        if last:
            for p in self.optim_params():
                if p.grad is not None:
                    p.grad.div_(self.divide)


class _ShardedExperts(Local):
    """zero=3 for the experts: FSDP2 `fully_shard` on each expert over the expert data-parallel group, its
    gradient reduce-scatter averaged over dp*cp. Built before the dense FSDP, which then leaves them out;
    the dense strategy's ledger tap records their collectives (axis edp)."""

    sharded = True

    def __init__(self, model, edp, divide: int, precision: str):
        from torch.distributed.fsdp import fully_shard

        super().__init__(model, is_expert_param)
        mp = fsdp_policy(precision)
        for moe in moe_layers(model):
            for expert in moe.experts.values():
                unit = fully_shard(expert, mesh=edp, mp_policy=mp)
                unit.set_gradient_divide_factor(divide)
                unit.set_force_sum_reduction_for_comms(True)  # a sum, then the division (gloo has no PREMUL_SUM)

    def local_grad_sq(self, skip) -> torch.Tensor:
        return sum_of_squares([p.grad.to_local() for name, p in self.named_params()
                               if p.grad is not None and not skip(name)])


def expert_data_parallel(module, layout: Layout, mesh, emesh, ledger, bucket_mb: float, precision: str,
                         dense_strategy):
    """Wrap the layout's strategy for the dense parameters (`dense_strategy(select)`) and add the experts'
    own over the expert data-parallel group, averaged over dp*cp."""

    divide, edp = layout.dp * layout.cp, emesh["edp"]
    if edp.size() == 1:
        experts = _AveragedLocal(module, is_expert_param, divide)
    elif layout.zero == 0:
        experts = PipelinedDDP(module, edp, ledger, bucket_mb, is_expert_param, "edp", divide)
    elif layout.zero == 3:
        experts = _ShardedExperts(module, edp, divide, precision)
    else:
        experts = Zero(module, edp, ledger, layout.zero, bucket_mb, is_expert_param, axis="edp", divide=divide)
    dense = dense_strategy(lambda name: not is_expert_param(name))
    return ExpertSplit(dense, experts, replica_mesh(mesh).get_group(), edp.get_local_rank())


def ep_group_mean(per_rank: list, layout: Layout, rank: int) -> tuple[list, float]:
    """`rank`'s per-step comm summaries with its all-to-all entries (and its ETP entries, which carry the
    experts' arrivals) replaced by its EP group's mean (exactly the cost model's figure for dropless routing,
    see the module docstring; the other collectives are the same on every member), and
    the measured imbalance: the busiest member's all-to-all bytes over that mean (1.0: perfectly balanced)."""
    ranks = torch.arange(layout.devices).reshape(expert_mesh_shape(layout)).transpose(2, 3).reshape(-1, layout.ep)
    group = next(row.tolist() for row in ranks if rank in row.tolist())
    out, imbalance = [], 1.0
    for step, entries in enumerate(per_rank[rank]):
        members = [{(e["collective"], e["axis"]): e for e in per_rank[r][step]} for r in group]
        mean = []
        for e in entries:
            if e["axis"] in ("ep", "etp"):
                sent = [m[(e["collective"], e["axis"])] for m in members]
                total = sum(x["bytes"] for x in sent)
                if e["axis"] == "ep":
                    imbalance = max(x["bytes"] for x in sent) * len(group) / total
                e = {**e, "bytes": total // len(group), "time_s": sum(x["time_s"] for x in sent) / len(group)}
            mean.append(e)
        out.append(mean)
    return out, imbalance
