"""Bytes a checkpoint writes: every parameter and optimizer state exactly once.

torch.distributed.checkpoint (DCP) saves each shard once and its default save planner de-duplicates
tensors that several ranks hold (replicas over DP, TP-replicated norms), spreading them over the ranks
that hold them. So the job writes the model's weights as held plus the optimizer states (Rajbhandari et al.
2020, ZeRO sec. 3.1: 2 + 12 bytes/param in mixed precision; fp32 keeps 4 + 8), and each device writes its
stage's share divided over the dp*cp ranks that hold that stage's parameters.
"""

from dataclasses import replace

from meshscale.cost.memory import PRECISIONS, busiest_rank, params_on_rank
from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec


def bytes_per_param(precision: str) -> int:
    b = PRECISIONS[precision]
    return b["params"] + b["optimizer"]


def checkpoint_bytes(model: ModelSpec, layout: Layout, precision: str = "bf16") -> tuple[float, float]:
    """(bytes the busiest device writes, bytes the whole job writes) for one checkpoint."""
    per_param = bytes_per_param(precision)
    total = model.param_count() * per_param
    # A TP rank's share of its stage, experts counted whole: EP splits them over ep of the dp*cp ranks, whose
    # dp*cp/ep replicas then share the writing; everything else is shared by all dp*cp replicas.
    held = params_on_rank(model, replace(layout, ep=1), busiest_rank(model, layout))
    return held * per_param / (layout.dp * layout.cp), total
