"""Apply a Layout to a built model, on one DeviceMesh (pp, dp, cp, tp; TP innermost), in this order:

  1. pipeline split: this PP rank's chunks (copies of the model keeping their own layers),
  2. tensor (and sequence) parallelism on each chunk over mesh["tp"],
  3. context parallelism on each chunk over mesh["cp"]: ring attention and this rank's RoPE positions,
  4. activation recompute (it wraps the block forwards and the attention core, TP collectives and CP ring
     included, so they rerun),
  5. the data-parallel family over the dp x cp ranks (they hold the same parameters) on each chunk: DDP
     (our bucketed all-reduce after the schedule inside a pipeline), our ZeRO-1/2 over the chunk's local
     (TP-sharded) parameters, or FSDP2 on its blocks and root.

What the trainer runs is said torch-free in specs.layout: `trainer_refusal` (not built yet: EP) and
`pipeline_refusal` (cannot be made correct; the planner never emits those)."""

from contextlib import ExitStack

import torch
import torch.distributed as dist

from meshscale.errors import UserError
from meshscale.specs.layout import Layout, trainer_refusal


def check_runtime(layout: Layout, model) -> None:
    reason = trainer_refusal(layout, model)
    if reason:
        raise UserError(f"layout {layout}: {reason}")


class Parallel:
    """This rank's part of the model with the layout applied: `chunks` [(stage index, module the pipeline
    or the loop calls)], one data-parallel strategy per chunk, and the optimizer-facing operations over
    all of them. Without a pipeline there is one chunk, `model`."""

    def __init__(self, chunks: list, strategies: list, layout: Layout, mesh, duplicate):
        """duplicate(name): the parameter is a copy another TP rank also counts in the gradient norm."""
        self.chunks, self.strategies, self.layout, self.mesh = chunks, strategies, layout, mesh
        self.model = chunks[0][1]
        self._skip = duplicate

    def accumulate(self, last: bool):
        stack = ExitStack()
        for s in self.strategies:
            stack.enter_context(s.accumulate(last))
        return stack

    def optim_params(self) -> list:
        return [p for s in self.strategies for p in s.optim_params()]

    def grad_sq_norm(self) -> torch.Tensor:
        """Squared norm of the whole model's gradient, identical to one device: each rank sums its TP shards
        (replicated norm weights on TP rank 0 only, a replicated KV head on the first rank holding it), then the sum runs over TP, PP and, when gradients are
        sharded, the shard group (control scalars, not ledger traffic)."""
        total = sum(s.local_grad_sq(self._skip) for s in self.strategies).float()
        groups = [self.mesh[a].get_group() for a in ("tp", "pp") if getattr(self.layout, a) > 1]
        if self.strategies[0].sharded:
            groups.append(self.strategies[0].group)
        for group in groups:
            dist.all_reduce(total, group=group)
        return total

    def after_step(self) -> None:
        for s in self.strategies:
            s.after_step()


def apply_layout(model, layout: Layout, mesh, ledger, precision: str = "fp32", bucket_mb: float = 1.0) -> Parallel:
    from meshscale.parallel.recompute import apply_recompute

    check_runtime(layout, model.spec)
    if mesh is not None:
        ledger.name_mesh(mesh)
    if layout.pp > 1:
        from meshscale.parallel.pipeline import pipeline_chunks

        chunks = pipeline_chunks(model, layout, mesh["pp"].get_local_rank())
    else:
        chunks = [(0, model)]
    wrapped, strategies = [], []
    for stage, module in chunks:
        if layout.tp > 1:
            from meshscale.parallel.tensor import apply_tensor_parallel, scatter_gather_stage

            apply_tensor_parallel(module, mesh["tp"], layout.sp)
            if layout.pp > 1 and not layout.sp:
                from meshscale.parallel.pipeline import crosses_ranks

                scatter_gather_stage(module, mesh["tp"], *crosses_ranks(stage, layout))
        if layout.cp > 1:
            from meshscale.parallel.context import apply_context_parallel

            apply_context_parallel(module, mesh["cp"])
        apply_recompute(module, layout.recompute)
        strategy = _data_parallel(module, layout, mesh, ledger, precision, bucket_mb)
        wrapped.append((stage, strategy.model))
        strategies.append(strategy)
    from meshscale.parallel.tensor import tp_duplicate

    tp_rank = mesh["tp"].get_local_rank() if mesh is not None else 0
    return Parallel(wrapped, strategies, layout, mesh, tp_duplicate(tp_rank, layout.tp, model.spec.kv_heads))


def _data_parallel(module, layout: Layout, mesh, ledger, precision: str, bucket_mb: float):
    """The data-parallel strategy for one chunk (see data_parallel.Local for its interface), over the
    dp x cp ranks that hold the same parameters."""
    from meshscale.parallel.data_parallel import DDP, Local, PipelinedDDP
    from meshscale.parallel.mesh import hybrid_mesh, replica_mesh

    if layout.dp * layout.cp == 1:
        return Local(module)
    dp_mesh = replica_mesh(mesh)
    ledger.name_group(dp_mesh.get_group(), "dp")
    if layout.zero == 0:
        return (PipelinedDDP if layout.pp > 1 else DDP)(module, dp_mesh, ledger, bucket_mb)
    replicate = None
    if layout.replicas > 1:  # hybrid sharding: ZeRO within each shard group, replicas across them
        dp_mesh = hybrid_mesh(mesh, layout.shard_size)
        replicate = dp_mesh["replicate"]
        for dim in ("replicate", "shard"):
            ledger.name_group(dp_mesh[dim].get_group(), "dp")
    if layout.zero in (1, 2):
        from meshscale.parallel.zero import Zero

        shard = dp_mesh["shard"] if replicate is not None else dp_mesh
        return Zero(module, shard, ledger, layout.zero, bucket_mb, replicate)
    from meshscale.parallel.fsdp import FSDP

    return FSDP(module, dp_mesh, ledger, precision)
