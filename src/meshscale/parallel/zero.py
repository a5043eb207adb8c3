"""ZeRO stages 1 and 2 (Rajbhandari et al. 2020, "ZeRO", sec. 5.1-5.2), our own code.

Parameters live in flat buckets of their dtype (fp32, or bf16 under bf16-pure), each padded to a multiple of
the DP degree; every parameter is a view into its bucket. Rank r owns slice r of each bucket: its optimizer
updates that slice (a master shard with its own Adam state), then an all-gather of each bucket refreshes
every parameter.

  stage 1: full gradients accumulate in flat per-bucket buffers over the micro-batches; after the last
           one each bucket is reduce-scattered once.
  stage 2: when backward has produced a bucket's gradients (post-accumulate-grad hooks), the bucket is
           reduce-scattered at once, on every micro-batch, into the owner's shard gradient and the
           full gradients are freed: no rank ever holds the whole gradient.

Hybrid sharding (`replicate`): the scheme runs within each shard group, and once the step's gradients are
reduce-scattered, each rank all-reduces its shard gradient with the ranks holding the same shard in the
other groups (one all-reduce of 1/shard of the gradient per step).

(torch's ZeroRedundancyOptimizer all-reduces then broadcasts, which is not this scheme.)
"""

import time
import weakref
from contextlib import contextmanager

import torch
import torch.distributed as dist

from meshscale.parallel.compat import all_gather_into, reduce_scatter_from
from meshscale.parallel.data_parallel import grad_buckets
from meshscale.parallel.strategy import MOMENTS, Held


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Bucket:
    def __init__(self, params: list, world: int, rank: int):
        self.params = params
        numel = sum(p.numel() for p in params)
        self.shard_numel = -(-numel // world)
        self.flat = torch.zeros(self.shard_numel * world, dtype=params[0].dtype, device=params[0].device)
        self.offsets, offset = {}, 0
        for p in params:  # each parameter becomes a view into the bucket
            n = p.numel()
            self.flat[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = self.flat[offset:offset + n].view_as(p)
            self.offsets[p] = offset
            offset += n
        mine = slice(rank * self.shard_numel, (rank + 1) * self.shard_numel)
        self.shard = torch.nn.Parameter(self.flat[mine].clone())  # the master shard
        self.shard.grad = torch.zeros_like(self.shard)
        self.grad_flat = None
        self.ready = 0

    def new_grad_flat(self) -> torch.Tensor:
        self.grad_flat = torch.zeros_like(self.flat)
        return self.grad_flat

    def grad_view(self, p) -> torch.Tensor:
        offset = self.offsets[p]
        return self.grad_flat[offset:offset + p.numel()].view_as(p)


class Zero:
    """A parallel.strategy.Strategy."""

    sharded = True

    def __init__(self, model, dp_mesh, ledger, stage: int, bucket_mb: float, select=None, replicate=None,
                 axis: str = "dp", divide: int | None = None, whole=None):
        """dp_mesh: the 1-D mesh of the ranks sharing the state; replicate: (HSDP) the 1-D mesh of the ranks
        holding the same shard in the other groups, and whole: the 1-D mesh of all of them (the parameters are
        whole on every one); select/axis/divide: as data_parallel.PipelinedDDP (expert parallelism's
        parameter split)."""
        assert stage in (1, 2)
        self.model = self.module = model
        self.stage, self.ledger, self.axis = stage, ledger, axis
        self.group = dp_mesh.get_group()
        self.replicate = replicate.get_group() if replicate is not None else None
        self.world, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        self.divide = divide or self.world * (replicate.size() if replicate is not None else 1)
        self.copies = (whole or dp_mesh).get_group()
        self.select = select = select or (lambda name: True)
        params = [p for n, p in model.named_parameters() if p.requires_grad and select(n)]
        self.buckets = [_Bucket(g, self.world, self.rank) for g in grad_buckets(params, bucket_mb)]
        self._pending: list = []
        self._names = {p: name for name, p in model.named_parameters()}
        self._mask = None
        if stage == 1:  # gradients accumulate straight into the flat buffers
            for b in self.buckets:
                b.new_grad_flat()
                for p in b.params:
                    p.grad = b.grad_view(p)
        else:
            self._bucket_of = {p: b for b in self.buckets for p in b.params}
            # The hook reaches us through a weak reference: a bound method held by the parameter's C++
            # gradient accumulator is a cycle the garbage collector cannot see, which would keep this object
            # and its process group alive until the interpreter's teardown.
            me = weakref.ref(self)
            for p in self._bucket_of:
                p.register_post_accumulate_grad_hook(lambda param: me()._on_grad(param))

    # ---- gradients ---------------------------------------------------------------------
    def _reduce_scatter(self, bucket: _Bucket) -> None:
        out = torch.empty_like(bucket.shard)
        start = time.perf_counter()
        work = reduce_scatter_from(out, bucket.grad_flat, group=self.group, async_op=True)
        self._pending.append((work, start, out, bucket, bucket.grad_flat))

    def _drain(self) -> None:
        """Wait for the launched reduce-scatters; add each result to its owner's shard gradient."""
        for work, start, out, bucket, grad_flat in self._pending:
            work.wait()
            self.ledger.record(self.axis, "reduce_scatter", _nbytes(grad_flat), time.perf_counter() - start)
            bucket.shard.grad.add_(out, alpha=1.0 / self.divide)
        self._pending.clear()  # drops stage 2's full-gradient buffers

    def _on_grad(self, p) -> None:  # stage 2: post-accumulate-grad hook
        bucket = self._bucket_of[p]
        if bucket.grad_flat is None:
            bucket.new_grad_flat()
        bucket.grad_view(p).copy_(p.grad)
        p.grad = None  # free the full gradient right away
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._reduce_scatter(bucket)
            bucket.grad_flat, bucket.ready = None, 0

    @contextmanager
    def accumulate(self, last: bool):
        yield
        if self.stage == 1 and last:
            for b in self.buckets:
                self._reduce_scatter(b)
        self._drain()
        if last and self.replicate is not None:
            self._reduce_replicas()

    def _reduce_replicas(self) -> None:
        launched = [(dist.all_reduce(b.shard.grad, group=self.replicate, async_op=True), time.perf_counter(), b)
                    for b in self.buckets]
        for work, start, b in launched:
            work.wait()
            self.ledger.record("dp", "all_reduce", _nbytes(b.shard.grad), time.perf_counter() - start)

    # ---- update ------------------------------------------------------------------------
    def optim_params(self) -> list:
        return [b.shard for b in self.buckets]

    def local_grad_sq(self, skip) -> torch.Tensor:
        """This rank's shards only (sum the result over the DP group), leaving out the elements of the
        parameters `skip(name)` is true for (a flat shard mixes parameters, so mask them)."""
        if self._mask is None:
            self._mask = [self._shard_mask(b, skip) for b in self.buckets]
        return sum(((b.shard.grad.float() * m).pow(2).sum() for b, m in zip(self.buckets, self._mask)), torch.zeros(()))

    def _shard_mask(self, bucket: _Bucket, skip) -> torch.Tensor:
        mask = torch.ones_like(bucket.flat)
        for p in bucket.params:
            if skip(self._names[p]):
                mask[bucket.offsets[p]:bucket.offsets[p] + p.numel()] = 0.0
        return mask[self.rank * bucket.shard_numel:(self.rank + 1) * bucket.shard_numel].clone()  # not the whole

    def after_step(self) -> None:
        launched = []
        for b in self.buckets:
            start = time.perf_counter()
            launched.append((all_gather_into(b.flat, b.shard.detach(), group=self.group, async_op=True), start, b))
        for work, start, b in launched:
            work.wait()
            self.ledger.record(self.axis, "all_gather", _nbytes(b.flat), time.perf_counter() - start)
        for b in self.buckets:
            b.shard.grad.zero_()
            if self.stage == 1:
                b.grad_flat.zero_()

    def replicas(self) -> list:
        """The parameters, whole on every rank after the step's all-gather; the moments are sharded."""
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad and self.select(n)]
        return [(self.axis, self.copies, named, False)]

    # ---- checkpoint --------------------------------------------------------------------
    def checkpoint_state(self, optimizer) -> Held:
        """Parameters are whole on every rank (views into the flat buckets); the moments live in flat shards,
        so gather each bucket's moments over the shard group and view them per parameter. The write-back
        copies the loaded parameters and moments into this rank's master shard and its state."""
        held, gathered = {}, []
        for b in self.buckets:
            full = {k: torch.empty_like(b.flat) for k in MOMENTS}
            for k in MOMENTS:
                all_gather_into(full[k], optimizer.state[b.shard][k], group=self.group)
            for p in b.params:
                view = slice(b.offsets[p], b.offsets[p] + p.numel())
                held[self._names[p]] = {"param": p.detach(), **{k: full[k][view].view_as(p) for k in MOMENTS}}
            gathered.append((b, full))

        def write_back():
            for b, full in gathered:
                mine = slice(self.rank * b.shard_numel, (self.rank + 1) * b.shard_numel)
                b.shard.data.copy_(b.flat[mine])  # the parameters were loaded into views of b.flat
                for k in MOMENTS:
                    optimizer.state[b.shard][k].copy_(full[k][mine])

        return held, write_back
