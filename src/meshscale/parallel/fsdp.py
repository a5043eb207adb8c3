"""ZeRO-3 through FSDP2 `fully_shard`: every block is its own unit (its parameters all-gathered just
before use, with prefetch, and freed after), then the root holds the embeddings, final norm and head.
On a 2-D (replicate, shard) mesh this is FSDP2's hybrid sharding: gathers and reduce-scatters within a
shard group, then an all-reduce of the reduced shard across the groups.

Under bf16 (and fp8) the gathered parameters are bf16 while the sharded masters, and the gradient
reduce-scatter, stay fp32; under bf16-pure all of them are bf16 (parallel/precision.py). FSDP2 is torch's code,
so its collectives reach the ledger through `ledger.tap()`, which wraps the torch.distributed functions it calls.
"""

from contextlib import contextmanager

import torch
from torch.distributed.fsdp import fully_shard

from meshscale.parallel.data_parallel import Local, sum_of_squares
from meshscale.parallel.precision import fsdp_policy


class FSDP(Local):
    """Local's bookkeeping of the parameters it owns (its checkpoint state is FSDP2's DTensors, this rank's
    dim-0 shard of each), with FSDP2 holding and communicating the shards."""

    sharded = True

    def __init__(self, model, dp_mesh, ledger, precision: str, select=None):
        """select(name): the parameters to shard (default all); the others stay whole on the rank and are
        another strategy's (expert parallelism's routed experts)."""
        super().__init__(model, select)
        self.ledger = ledger
        # the ranks sharing the state: the whole mesh, or its "shard" dimension under hybrid sharding
        self.group = (dp_mesh["shard"] if dp_mesh.ndim == 2 else dp_mesh).get_group()
        # under hybrid sharding the other groups hold copies of this rank's shards
        self.replicate = dp_mesh["replicate"].get_group() if dp_mesh.ndim == 2 else None
        mp = fsdp_policy(precision)
        ignored = {p for n, p in model.named_parameters() if not self.select(n)} or None
        for block in model.layers.values():
            fully_shard(block, mesh=dp_mesh, mp_policy=mp, ignored_params=ignored)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp, ignored_params=ignored)

    def replicas(self) -> list:
        return [("dp", self.replicate, self.named_params(), True)] if self.replicate is not None else []

    @contextmanager
    def accumulate(self, last: bool):
        # Gradients are reduce-scattered on every micro-batch (nobody keeps a full one).
        with self.ledger.tap():
            yield

    def local_grad_sq(self, skip) -> torch.Tensor:
        """This rank's shards only: sum the result over the DP group."""
        return sum_of_squares([p.grad.to_local() for name, p in self.named_params()
                               if p.grad is not None and not skip(name)])
