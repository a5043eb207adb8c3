"""Pipeline parallelism: cut the model into stages by layers, place them on the PP ranks, and run one
training step under a torch.distributed.pipelining schedule.

The model is cut into pp*vpp chunks. Rank r holds chunks r, r+pp, r+2pp, ... (looped placement, as the
interleaved 1F1B of Narayanan et al. 2021, sec. 2.2, needs), or chunks r and 2pp-1-r for the V-shaped
schedules (ZB-V, Qi et al. 2023, sec. 6; DualPipeV, DeepSeek-V3 report sec. 3.2.1), so that the first
and last chunk share rank 0.
"""

import copy
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from meshscale.models.transformer import Transformer
from meshscale.parallel.ledger import record
from meshscale.specs.layout import Layout, pipeline_refusal
from meshscale.specs.placement import chunk_ranges, head_rank, layout_ends, rank_chunks, stage_owner

try:  # both exist in torch 2.11 and 2.13; guarded so an older torch refuses them instead of failing to import
    from torch.distributed.pipelining import ScheduleDualPipeV, ScheduleZBVZeroBubble
except ImportError:  # pragma: no cover
    ScheduleDualPipeV = ScheduleZBVZeroBubble = None

# "zb" is ZB-H1 (Qi et al. 2023, sec. 3.1): torch's interleaved zero-bubble schedule with one stage per rank.
SCHEDULE_CLASSES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved": ScheduleInterleaved1F1B,
    "zb": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}


def schedule_refusal(layout: Layout, n_microbatches: int) -> str | None:
    """Why this runtime cannot run `layout`'s pipeline with `n_microbatches`, or None if it can: the
    torch-free rules the Layout validator applies (`pipeline_refusal`), and the schedule's presence in torch."""
    if layout.pp > 1 and SCHEDULE_CLASSES[layout.schedule] is None:
        return f"schedule={layout.schedule} needs a newer torch (torch.distributed.pipelining lacks it)"
    return pipeline_refusal(layout, n_microbatches)


# ---- cutting the model -------------------------------------------------------------------------------
def crosses_ranks(stage: int, layout: Layout) -> tuple[bool, bool]:
    """(input comes from another PP rank, output goes to another PP rank) for chunk `stage`; the turn of
    a V keeps two chunks on one rank."""
    def owner(s):
        return stage_owner(s, layout.pp, layout.v_shaped)
    return (stage > 0 and owner(stage - 1) != owner(stage),
            stage < layout.stages - 1 and owner(stage + 1) != owner(stage))


def pipeline_chunks(model: Transformer, layout: Layout, pp_rank: int) -> list[tuple[int, Transformer]]:
    """This rank's chunks as (stage index, module): copies of `model` keeping only their own layers (by
    their global names) and the embedding / final norm and head where they belong. Apply TP and data
    parallelism to each module afterwards, then hand them to `PipelineRunner`."""
    n_chunks = layout.stages
    ranges = chunk_ranges(model.spec.layers, n_chunks, 0, layout.pp, layout_ends(layout))
    chunks = []
    for stage in rank_chunks(layout.pp, n_chunks, layout.v_shaped, pp_rank):
        chunk = copy.deepcopy(model)
        keep = {str(i) for i in ranges[stage]}
        for name in list(chunk.layers):
            if name not in keep:
                del chunk.layers[name]
        if stage != 0:
            chunk.tok_embeddings = chunk.pos_embeddings = None
        if stage != n_chunks - 1:
            chunk.norm, chunk.output = None, None
        chunks.append((stage, chunk))
    return chunks


# ---- one stage, timed --------------------------------------------------------------------------------
class TimedStage(PipelineStage):
    """A PipelineStage that notes when each micro-batch's forward (F), backward (B: full, or input-gradient
    only under zero-bubble schedules) and weight-gradient (W) ran, and records every activation or gradient
    it sends as PP send_recv bytes."""

    def __init__(self, module: nn.Module, stage_index: int, num_stages: int, device, group, events: list):
        super().__init__(module, stage_index, num_stages, device, group=group)
        self.events = events

    def _timed(self, kind: str, chunk_id: int, fn, *args, **kwargs):
        start = time.time()
        out = fn(*args, **kwargs)
        self.events.append({"kind": kind, "mb": chunk_id, "stage": self.stage_index, "start": start,
                            "end": time.time()})
        return out

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        return self._timed("F", fwd_chunk_id, super().forward_one_chunk, fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        return self._timed("B", bwd_chunk_id, super().backward_one_chunk, bwd_chunk_id, *args, **kwargs)

    def backward_weight_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        return self._timed("W", bwd_chunk_id, super().backward_weight_one_chunk, bwd_chunk_id, *args, **kwargs)

    def get_fwd_send_ops(self, fwd_chunk_id):
        return _recorded(super().get_fwd_send_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id):
        return _recorded(super().get_bwd_send_ops(bwd_chunk_id))


def _recorded(ops: list) -> list:
    for op in ops:
        record("pp", "send_recv", op.tensor.numel() * op.tensor.element_size())
    return ops


# ---- the runner --------------------------------------------------------------------------------------
class PipelineRunner:
    """Runs one optimizer step's forward and backward through the pipeline.

    chunks: this rank's (stage index, module) pairs from `pipeline_chunks` (after TP / FSDP are applied).
    loss_fn(output, target) -> mean loss of one micro-batch; gradients are divided by n_microbatches, so
    they are those of the mean loss over the whole batch. `step` returns that mean loss where the last stage runs,
    `evaluate` on every PP rank.
    After a step, `events` holds this rank's timed F/B/W records and `step_span` its (start, end).
    """

    def __init__(self, chunks: list[tuple[int, nn.Module]], layout: Layout, pp_mesh, loss_fn,
                 n_microbatches: int, device: torch.device | str = "cpu"):
        reason = schedule_refusal(layout, n_microbatches)
        if reason:
            raise ValueError(reason)
        self.group = pp_mesh.get_group() if hasattr(pp_mesh, "get_group") else pp_mesh
        self.layout = layout
        self.events: list = []
        self.step_span = (0.0, 0.0)
        device = torch.device(device)
        self.stages = [TimedStage(module, index, layout.stages, device, self.group, self.events)
                       for index, module in chunks]
        schedule_cls = SCHEDULE_CLASSES[layout.schedule]
        # Each micro-batch's loss is divided by m inside autograd (rather than torch scaling .grad after the
        # step), so the gradients are those of the batch mean whatever data-parallel wrapper holds them:
        # ZeRO-2 reduce-scatters (and frees) every micro-batch's gradient before torch could scale it.
        self.n_microbatches = n_microbatches
        self.loss_fn = loss_fn

        def scaled_loss(output, target):
            return loss_fn(output, target) / n_microbatches

        stages = self.stages[0] if layout.schedule in ("gpipe", "1f1b") else self.stages
        self.schedule = schedule_cls(stages, n_microbatches, loss_fn=scaled_loss, scale_grads=False)
        self.has_first = any(s.is_first for s in self.stages)
        self.has_last = any(s.is_last for s in self.stages)
        self.loss_src = dist.get_global_rank(self.group, head_rank(layout))
        self.owner = {stage: stage_owner(stage, layout.pp, layout.v_shaped) for stage in range(layout.stages)}

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """tokens, targets: this DP replica's batch (n_microbatches * mbs sequences); every PP rank passes
        them, and only the ranks holding the first or last stage use them. Returns the batch's mean loss on the
        rank holding the last stage, None on the others (the trainer folds it into a collective it makes
        anyway, so the step sends it nowhere)."""
        self.events.clear()
        losses: list = []
        args = (tokens,) if self.has_first else ()
        kwargs = {"target": targets, "losses": losses} if self.has_last else {}
        start = time.time()
        self.schedule.step(*args, **kwargs)
        self.step_span = (start, time.time())
        return torch.stack(losses).sum().detach() if self.has_last else None

    @torch.no_grad()
    def evaluate(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of a batch, forward only: the chunks run in stage order, each rank sending its chunk's
        output (in fp32) to the rank holding the next chunk. Nothing to overlap, so no schedule."""
        me = dist.get_rank(self.group)
        modules = {s.stage_index: s.submod for s in self.stages}
        spec = getattr(next(iter(modules.values())), "module", next(iter(modules.values()))).spec
        b, s, tp = tokens.shape[0], tokens.shape[1], self.layout.tp
        # what crosses a rank boundary: an SP shard, a TP slice (tensor.scatter_gather_stage) or all of it
        shape = (b, s * spec.hidden // tp) if tp > 1 and not self.layout.sp else (b, s // tp, spec.hidden)
        x, loss = tokens, torch.zeros((), device=tokens.device)
        for stage in range(self.layout.stages):
            if self.owner[stage] != me:
                continue
            receives, sends = crosses_ranks(stage, self.layout)
            if receives:
                x = torch.empty(shape, dtype=torch.float32, device=tokens.device)
                dist.recv(x, src=dist.get_global_rank(self.group, self.owner[stage - 1]), group=self.group)
            x = modules[stage](x)
            if stage == self.layout.stages - 1:
                loss = self.loss_fn(x, targets).detach()
            elif sends:
                dist.send(x.float().contiguous(), dst=dist.get_global_rank(self.group, self.owner[stage + 1]),
                          group=self.group)
        # bookkeeping, not training traffic: one number so that every rank has the loss
        dist.broadcast(loss, src=self.loss_src, group=self.group)
        return loss
