"""Bytes a checkpoint writes: every parameter and optimizer state exactly once.

torch.distributed.checkpoint (DCP) saves each shard once and its default save planner de-duplicates
tensors that several ranks hold (replicas over DP, TP-replicated norms), spreading them over the ranks
that hold them. So the job writes one copy of the weights plus Adam's two fp32 moments, and each device
writes its stage's share divided over the dp*cp ranks that hold that stage's parameters.

Which copy of the weights: where mixed precision keeps an fp32 master (ZeRO sec. 3.1, Rajbhandari et al.
2020: 2 + 12 bytes/param), the master is the state and the 16-bit working copy is re-derived from it, so a
checkpoint holds 4 + 8 bytes/param, as torchtitan's DCP checkpoints of FSDP2 mixed precision do (FSDP2's
parameters are the fp32 shards). Measured on our runtime (tests/test_checkpoint.py): a DCP checkpoint
holds exactly 12 bytes/param of tensors at fp32 and at bf16 (autocast over fp32 parameters). Without a
master (bf16-pure) the 16-bit weights themselves are saved, with their 16-bit moments: 2 + 4.
"""

from dataclasses import replace

from meshscale.cost.memory import PRECISIONS, busiest_rank, trained_params_on_rank
from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec


ADAM_MOMENTS = 8  # two fp32 moments per parameter (Kingma & Ba 2015); beyond them, "optimizer" holds a master


def bytes_per_param(precision: str) -> int:
    b = PRECISIONS[precision]
    has_master = b["optimizer"] > ADAM_MOMENTS
    return b["optimizer"] if has_master else b["params"] + b["optimizer"]


def checkpoint_bytes(model: ModelSpec, layout: Layout, precision: str = "bf16") -> tuple[float, float]:
    """(bytes the busiest device writes, bytes the whole job writes) for one checkpoint: under LoRA the adapters
    and their optimizer state alone (the frozen base is the checkpoint the run started from; NeMo and HF PEFT save
    the adapters)."""
    per_param = bytes_per_param(precision)
    total = model.trained_param_count() * per_param
    # A TP rank's share of its stage, experts counted whole: EP splits them over ep of the dp*cp ranks, whose
    # dp*cp/ep replicas then share the writing; everything else is shared by all dp*cp replicas.
    held = trained_params_on_rank(model, replace(layout, ep=1, etp=0), busiest_rank(model, layout))
    return held * per_param / (layout.dp * layout.cp), total
