"""DDP (zero=0): torch's DistributedDataParallel, whose bucketed gradient all-reduce overlaps the
backward pass. Our comm hook does the same all-reduce as torch's default hook and records it in the
ledger; `no_sync` skips it on every micro-batch but the last (gradient accumulation). Inside a pipeline,
PipelinedDDP does the same all-reduce once the schedule is done. Local (dp=1) is their common base."""

import inspect
import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from meshscale.parallel.strategy import Held, live_state


class _HookState:
    def __init__(self, group, ledger):
        self.group, self.ledger, self.world = group, ledger, dist.get_world_size(group)


def _recorded_all_reduce(state: _HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    buf.div_(state.world)  # average, as DDP's default hook does
    start = time.perf_counter()
    work = dist.all_reduce(buf, group=state.group, async_op=True)
    state.ledger.record_async("dp", "all_reduce", buf.numel() * buf.element_size(), work, start)
    return work.get_future().then(lambda fut: fut.value()[0])


class Local:
    """One data-parallel replica (dp=1): nothing to communicate. The base of the strategies that keep whole
    gradients on every rank. Implements parallel.strategy.Strategy."""

    sharded = False

    def __init__(self, model, select=None):
        """select(name): the parameters this strategy owns (default all; expert parallelism splits them)."""
        self.model = self.module = model
        self.select = select or (lambda name: True)
        self._named: list | None = None

    @contextmanager
    def accumulate(self, last: bool):
        yield

    def named_params(self) -> list:
        # Listed once, on the first call after the wrappers have replaced what they replace (FSDP2 its DTensors):
        # the optimizer holds these objects from then on, and walking the module tree costs about 1 ms of Python
        # a call on `tiny`, several calls a step.
        if self._named is None:
            self._named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad and self.select(n)]
        return self._named

    def optim_params(self) -> list:
        return [p for _, p in self.named_params()]

    def local_grad_sq(self, skip) -> torch.Tensor:
        """Sum of squared gradients of the module's parameters, leaving out those `skip(name)` is true for."""
        return sum_of_squares([p.grad for name, p in self.named_params() if p.grad is not None and not skip(name)])

    def after_step(self) -> None:
        for p in self.optim_params():
            p.grad = None

    def replicas(self) -> list:
        return []  # the only copy

    def checkpoint_state(self, optimizer) -> Held:
        return live_state(self.named_params(), optimizer)


def sum_of_squares(tensors: list) -> torch.Tensor:
    """The sum of the squares of every element, in fp32: one fused norm kernel over the list (what torch's own
    clip_grad_norm_ runs) rather than three small ones a tensor, ~0.5 ms of a `tiny` step."""
    if not tensors:
        return torch.zeros(())
    return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)).square().sum()


def grad_buckets(params: list, bucket_mb: float) -> list[list]:
    """Parameters in buckets of about `bucket_mb` MiB of fp32 gradient, in reverse registration order
    (roughly the order backward produces gradients in)."""
    limit = int(bucket_mb * 2**20) // 4
    buckets, current, size = [], [], 0
    for p in reversed(params):
        current.append(p)
        size += p.numel()
        if size >= limit:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class DDP(Local):
    def __init__(self, model, dp_mesh, ledger, bucket_mb: float, select=None):
        self.group = group = dp_mesh.get_group()
        super().__init__(model, select)
        ignored = [n for n, _ in model.named_parameters() if not self.select(n)]
        if ignored:
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
        # Buffers (RoPE tables) are computed identically on every rank: no per-step broadcast.
        no_buffer_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                          inspect.signature(DistributedDataParallel).parameters else {"broadcast_buffers": False})
        self.model = DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_mb,
                                             gradient_as_bucket_view=True, **no_buffer_sync)
        self.model.register_comm_hook(_HookState(group, ledger), _recorded_all_reduce)

    def accumulate(self, last: bool):
        return nullcontext() if last else self.model.no_sync()

    def replicas(self) -> list:
        return [("dp", self.group, self.named_params(), True)]  # parameters and moments on every replica


class PipelinedDDP(Local):
    """zero=0 inside a pipeline schedule. torch's DDP reducer expects one backward per forward and sees
    several per step there (measured on torch 2.13: an internal assert under interleaving, wrong bucket
    rebuilds under GPipe, no reduction at all for zero-bubble's split weight gradients). So this does what
    DDP does, once the schedule has run every micro-batch's backward: all-reduce the gradient in buckets,
    averaged over the DP group, one all-reduce of 4P bytes per step (the contract's zero=0 rule)."""

    def __init__(self, model, dp_mesh, ledger, bucket_mb: float, select=None, axis: str = "dp",
                 divide: int | None = None):
        """dp_mesh: the 1-D mesh of the replicas (dp x cp, or expert data parallelism's group); axis: its
        ledger axis; divide: the number of replicas the gradient averages over (default the mesh's size)."""
        super().__init__(model, select)
        self.group, self.ledger, self.axis = dp_mesh.get_group(), ledger, axis
        self.world = divide or dp_mesh.size()
        self.buckets = grad_buckets(self.optim_params(), bucket_mb)

    @contextmanager
    def accumulate(self, last: bool):
        yield
        if last:
            for bucket in self.buckets:
                self._reduce_bucket(bucket)

    def replicas(self) -> list:
        return [(self.axis, self.group, self.named_params(), True)]

    def _reduce_bucket(self, params: list) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in params]).div_(self.world)
        start = time.perf_counter()
        dist.all_reduce(flat, group=self.group)
        self.ledger.record(self.axis, "all_reduce", flat.numel() * flat.element_size(), time.perf_counter() - start)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
