"""Tied embeddings under pipeline parallelism: the first stage looks tokens up in the table, the last stage
multiplies by it, and each holds its own copy. Like Megatron (Shoeybi et al. 2019; Narayanan et al. 2021's
embedding group), the two copies' gradients are summed once the schedule is done, before the data-parallel
reduction, so both copies take the same update and stay equal. V schedules hold both chunks on pipeline
rank 0: the sum is local. Otherwise: all_reduce pp  vocab*hidden/tp*4 bytes per step on the first and last
pipeline ranks (cost/step.py). Under zero=3 the sum is linear in FSDP2's reduce-scatter, so each rank sums
its shard of the reduced gradient once the schedule is done (1/shard of the bytes).
"""

import time
from contextlib import contextmanager

import torch.distributed as dist

from meshscale.parallel.compat import all_reduce
from meshscale.parallel.ledger import record
from meshscale.parallel.strategy import local_part
from meshscale.specs.layout import Layout

_groups: dict = {}


def _pair_group(layout: Layout):
    """This rank's group of {first stage, last stage} ranks with the same dp, cp and tp coordinates (None on
    the middle stages). Creating groups is collective: every rank calls this."""
    inner = layout.devices // layout.pp
    key = (layout.pp, inner)
    if key not in _groups:
        pairs = [[i, (layout.pp - 1) * inner + i] for i in range(inner)]
        _groups[key] = dist.new_subgroups_by_enumeration(pairs)[0]
    return _groups[key]


class TiedEmbeddings:
    """Sums the gradients of this rank's copies of the tied table (the embedding's and the head's) with the
    other end's, as a context entered inside the data-parallel strategies' `accumulate`."""

    def __init__(self, chunks: list, layout: Layout):
        self.copies = [w for _, c in chunks for w in (getattr(c.tok_embeddings, "weight", None),
                                                       getattr(c.output, "weight", None)) if w is not None]
        self.group = None if layout.v_shaped else _pair_group(layout)

    @contextmanager
    def accumulate(self, last: bool):
        yield
        if not last or not self.copies:
            return
        if self.group is None:  # both ends on this rank
            total = self.copies[0].grad + self.copies[1].grad
            for w in self.copies:
                w.grad.copy_(total)
            return
        grad = local_part(self.copies[0].grad)  # zero=3: each rank its shard, already reduced
        start = time.perf_counter()
        all_reduce(grad, group=self.group)  # torch's own, not FSDP2's tap: recorded here
        record("pp", "all_reduce", grad.numel() * grad.element_size(), time.perf_counter() - start)
