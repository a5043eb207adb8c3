"""Apply a Layout to a built model, on one DeviceMesh (pp, dp, cp, tp; TP innermost), in this order:

  1. pipeline split: this PP rank's chunks (copies of the model keeping their own layers), then expert
     parallelism: each keeps its EP rank's experts (parallel/expert.py),
  2. tensor (and sequence) parallelism on each chunk over mesh["tp"],
  3. context parallelism on each chunk over mesh["cp"]: ring attention and this rank's RoPE positions,
  4. activation recompute (it wraps the block forwards and the attention core, TP collectives and CP ring
     included, so they rerun up to the block's last saved tensor: torch's checkpoint stops there, before the
     block's last TP g), then the precision recipe's parameter dtype and float8 layers (precision.py),
  5. the data-parallel family over the dp x cp ranks (they hold the same parameters) on each chunk: DDP
     (our bucketed all-reduce after the schedule inside a pipeline), our ZeRO-1/2 over the chunk's local
     (TP-sharded) parameters, or FSDP2 on its blocks and root; under EP the routed experts get their own
     strategy over the expert data-parallel group (expert.expert_data_parallel).

What the trainer runs is said torch-free in specs.layout: `trainer_refusal` (not built yet) and
`pipeline_refusal` (cannot be made correct; the planner never emits those)."""

from contextlib import ExitStack

import torch
import torch.distributed as dist

from meshscale.parallel.construct import has_meta, materialise_owned, origins
from meshscale.parallel.context import apply_context_parallel
from meshscale.parallel.data_parallel import DDP, Local, PipelinedDDP
from meshscale.parallel.expert import apply_expert_parallel, expert_data_parallel
from meshscale.parallel.fsdp import FSDP
from meshscale.parallel.mesh import expert_mesh, hybrid_mesh, replica_mesh
from meshscale.parallel.pipeline import crosses_ranks, pipeline_chunks
from meshscale.parallel.precision import apply_precision, compile_blocks
from meshscale.parallel.recompute import apply_recompute
from meshscale.parallel.tensor import apply_tensor_parallel, scatter_gather_stage, tp_duplicate
from meshscale.parallel.tied import TiedEmbeddings
from meshscale.parallel.zero import Zero
from meshscale.specs.layout import Layout, check_trainable


class Parallel:
    """This rank's part of the model with the layout applied: `chunks` [(stage index, module the pipeline
    or the loop calls)], one data-parallel strategy per chunk, and the optimizer-facing operations over
    all of them. Without a pipeline there is one chunk, `model`."""

    def __init__(self, chunks: list, strategies: list, layout: Layout, mesh, duplicate):
        """duplicate(name): the parameter is a copy another TP rank also counts in the gradient norm."""
        self.chunks, self.strategies, self.layout, self.mesh = chunks, strategies, layout, mesh
        self.model = chunks[0][1]
        self.tied = None
        if layout.pp > 1 and self.model.spec.tied_embeddings:
            self.tied = TiedEmbeddings(chunks, layout)
        # the head's copy of a tied table counts once, as the embedding's
        self._skip = (lambda name: duplicate(name) or name == "output.weight") if self.tied else duplicate
        self.norm_ranks = norm_ranks(layout, strategies[0]) if mesh is not None else [0]

    def accumulate(self, last: bool):
        stack = ExitStack()
        for s in self.strategies:
            stack.enter_context(s.accumulate(last))
        if self.tied is not None:  # entered last, leaves first: summed before the strategies reduce
            stack.enter_context(self.tied.accumulate(last))
        return stack

    def optim_params(self) -> list:
        return [p for s in self.strategies for p in s.optim_params()]

    @property
    def mixes_gradients(self) -> bool:
        """Whether a collective sums gradients across ranks before the step's gradient norm is taken (a
        data-parallel reduce, TP's norm-weight all-reduce, a tied table's two copies): only then is a bad
        gradient's origin lost by that time."""
        return self.layout.dp * self.layout.cp > 1 or self.layout.tp > 1 or self.tied is not None

    @torch.no_grad()  # DTensor.to_local() skips its autograd function then: ~10 us less a FSDP2 gradient
    def local_grad_sq(self) -> torch.Tensor:
        """This rank's share of the squared gradient norm (its TP shards, replicated norm weights on TP rank 0
        only, a replicated KV head on the first rank holding it), before any sum over ranks."""
        return sum(s.local_grad_sq(self._skip) for s in self.strategies).float()

    def grad_sq_norm(self, shares: torch.Tensor | None = None) -> torch.Tensor:
        """Squared norm of the whole model's gradient, identical to one device: the sum of the `norm_ranks`'
        shares. shares: every rank's `local_grad_sq` by global rank, as the step's control all-reduce gathers
        them (runtime.resilience.guards); without it, one all-reduce here gathers them (control values, not
        ledger traffic)."""
        if shares is None:
            local = self.local_grad_sq()
            if self.mesh is None:
                return local
            shares = torch.zeros(dist.get_world_size(), device=local.device)
            shares[dist.get_rank()] = local
            dist.all_reduce(shares)
        return shares[self.norm_ranks].sum()

    def after_step(self) -> None:
        for s in self.strategies:
            s.after_step()


def norm_ranks(layout: Layout, strategy) -> list[int]:
    """The global ranks whose `local_grad_sq` shares add up to the whole gradient's squared norm, this rank's
    among them: its pipeline stages and TP ranks, over the data-parallel ranks of its shard group when
    `strategy` shards gradients (else its own alone: the other replicas hold the same gradient). The mesh's
    rank order is (pp, dp, cp, tp), as parallel.mesh builds it."""
    grid = torch.arange(layout.devices).reshape(layout.pp, layout.dp * layout.cp, layout.tp)
    members = dist.get_process_group_ranks(strategy.group) if strategy.sharded else [dist.get_rank()]
    replicas = sorted({int((grid == r).nonzero()[0, 1]) for r in members})
    return sorted(grid[:, replicas, :].flatten().tolist())


def apply_layout(model, layout: Layout, mesh, ledger, precision: str = "fp32", bucket_mb: float = 25.0,
                 load=None, seed: int = 0, device=None, compile: bool = False) -> Parallel:
    """model: built (models.transformer.build_model), or its meta structure (meta_model), in which case each
    rank materialises only what it owns, initialised from `seed`, on `device` (parallel/construct.py).
    load(module, tp_rank, tp): fills a chunk's parameters (its tensor-, pipeline- and expert-parallel
    pieces, under their global names) before data parallelism copies or shards them (--init-from).
    compile: torch.compile each block (--compile)."""
    check_trainable(layout, model.spec)
    tp_rank = mesh["tp"].get_local_rank() if mesh is not None else 0
    meta = has_meta(model)
    # FSDP2 shards meta parameters, then each rank fills its shards; loaded weights are read before it shards
    late = layout.zero == 3 and layout.dp * layout.cp > 1 and load is None
    if layout.pp > 1:
        chunks = pipeline_chunks(model, layout, mesh["pp"].get_local_rank())
    else:
        chunks = [(0, model)]
    emesh = None
    if layout.ep > 1:
        emesh = expert_mesh(layout, mesh.device_type)
        for axis in ("ep", "edp", "etp"):
            if emesh[axis].size() > 1:
                ledger.name_group(emesh[axis].get_group(), axis)
        for _, module in chunks:
            apply_expert_parallel(module, emesh, layout, tp_rank)
    if mesh is not None:  # after EP's: where torch shares one group between dims, the main mesh's name wins
        ledger.name_mesh(mesh)
    wrapped, strategies = [], []
    for stage, module in chunks:
        if layout.tp > 1:
            apply_tensor_parallel(module, mesh["tp"], layout.sp, split_experts=layout.expert_tp > 1)
            if layout.pp > 1 and not layout.sp:
                scatter_gather_stage(module, mesh["tp"], *crosses_ranks(stage, layout))
        if layout.cp > 1:
            apply_context_parallel(module, mesh["cp"])
        apply_recompute(module, layout.recompute)
        apply_precision(module, precision)
        if compile:
            compile_blocks(module)
        known = origins(module)
        if meta and not late:
            materialise_owned(module, seed, device, known)
        if load is not None:
            load(module, tp_rank, layout.tp)
        if emesh is not None:
            def dense(select, module=module):
                return _data_parallel(module, layout, mesh, ledger, precision, bucket_mb, select)

            strategy = expert_data_parallel(module, layout, mesh, emesh, ledger, bucket_mb, precision, dense)
        else:
            strategy = _data_parallel(module, layout, mesh, ledger, precision, bucket_mb)
        if meta and late:
            materialise_owned(module, seed, device, known)
        wrapped.append((stage, strategy.model))
        strategies.append(strategy)

    return Parallel(wrapped, strategies, layout, mesh, tp_duplicate(tp_rank, layout.tp, model.spec.kv_heads))


def _data_parallel(module, layout: Layout, mesh, ledger, precision: str, bucket_mb: float, select=None):
    """The data-parallel strategy for one chunk (see data_parallel.Local for its interface), over the
    dp x cp ranks that hold the same parameters and the parameters `select(name)` picks (default all)."""

    if layout.dp * layout.cp == 1:
        return Local(module, select)
    dp_mesh = whole = replica_mesh(mesh)
    ledger.name_group(dp_mesh.get_group(), "dp")
    if layout.zero == 0:
        return (PipelinedDDP if layout.pp > 1 else DDP)(module, dp_mesh, ledger, bucket_mb, select)
    replicate = None
    if layout.replicas > 1:  # hybrid sharding: ZeRO within each shard group, replicas across them
        dp_mesh = hybrid_mesh(mesh, layout.shard_size)
        replicate = dp_mesh["replicate"]
        for dim in ("replicate", "shard"):
            ledger.name_group(dp_mesh[dim].get_group(), "dp")
    if layout.zero in (1, 2):
        shard = dp_mesh["shard"] if replicate is not None else dp_mesh
        return Zero(module, shard, ledger, layout.zero, bucket_mb, select, replicate, whole=whole)

    return FSDP(module, dp_mesh, ledger, precision, select)
