"""The training loop of one rank: build the model from the seed, apply the layout, and run optimizer
steps of gradient-accumulated micro-batches, recording metrics and every collective."""

import time
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshscale.runtime.config import Resolved
from meshscale.runtime.data import TokenData, load_tokens, rank_microbatches
from meshscale.runtime.faults import Injector, from_env
from meshscale.runtime.ledger import CommLedger
from meshscale.runtime.metrics import MetricsLog, current_rss_bytes, peak_memory_bytes
from meshscale.runtime.model import build_model
from meshscale.runtime.optim import build_optimizer, clip_gradients, lr_at, set_lr


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


class DataShard(NamedTuple):
    """Which part of each global batch this rank trains on: its DP rows, its CP positions."""
    dp_rank: int
    dp: int
    cp_rank: int
    cp: int

    def of(self, mbs: int) -> tuple:
        """The arguments of `rank_microbatches` after the batch."""
        return self.dp_rank, self.dp, mbs, self.cp_rank, self.cp


def _all_mean(value: torch.Tensor, group, world: int) -> float:
    if world > 1:
        dist.all_reduce(value, group=group)  # control scalar (loss), not part of the ledger
    return float(value) / world


def loss_function(tp_group):
    """Mean next-token cross-entropy of (b, s, vocab) logits, or of vocabulary-sharded ones under TP."""
    if tp_group is None:
        return lambda logits, targets: F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    from meshscale.parallel.tensor import vocab_parallel_cross_entropy

    return lambda logits, targets: vocab_parallel_cross_entropy(logits, targets, tp_group)


class AccumulatedStep:
    """One optimizer step's forward and backward without a pipeline: gradient accumulation over this DP
    rank's micro-batches, the data-parallel strategy syncing after the last."""

    def __init__(self, par, loss_fn, autocast, device):
        self.par, self.loss_fn, self.autocast, self.device = par, loss_fn, autocast, device

    def loss(self, mb: tuple) -> torch.Tensor:
        inputs, targets = (t.to(self.device) for t in mb)
        with self.autocast:
            logits = self.par.model(inputs)
        return self.loss_fn(logits, targets)

    def __call__(self, micro: list) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for i, mb in enumerate(micro):
            with self.par.accumulate(last=i == len(micro) - 1):
                loss = self.loss(mb) / len(micro)  # equal-sized micro-batches: the mean of means is the batch mean
                loss.backward()
            total += loss.detach()
        return total

    def evaluate(self, micro: list) -> torch.Tensor:
        return sum(self.loss(mb).detach() for mb in micro) / len(micro)


class PipelineStep:
    """One optimizer step through the pipeline: the runner owns micro-batching, the schedule and backward;
    the data-parallel strategies sync once the schedule is done."""

    def __init__(self, par, layout, mesh, loss_fn, m: int, autocast, device):
        from meshscale.parallel.pipeline import PipelineRunner

        self.par, self.autocast, self.device = par, autocast, device
        self.runner = PipelineRunner(par.chunks, layout, mesh["pp"], loss_fn, m, device)

    def __call__(self, micro: list) -> torch.Tensor:
        inputs, targets = (torch.cat(t).to(self.device) for t in zip(*micro))
        with self.par.accumulate(last=True), self.autocast:
            return self.runner.step(inputs, targets)

    def evaluate(self, micro: list) -> torch.Tensor:
        inputs, targets = (torch.cat(t).to(self.device) for t in zip(*micro))
        with self.autocast:
            return self.runner.evaluate(inputs, targets)


def train(run: Resolved, device: torch.device, tokens=None, log: bool = True) -> dict:
    """Run `run` on this rank (inside an initialised process group when the layout has >1 device).
    Returns per-step metrics rows, the final validation loss, the comm ledger's per-step summaries (of the
    rank the cost model describes) and, with a pipeline, the last step's trace."""
    from meshscale.parallel.apply import apply_layout
    from meshscale.parallel.mesh import build_mesh, replica_mesh

    cfg, spec, layout = run.config, run.spec, run.layout
    multi = layout.devices > 1
    mesh = build_mesh(layout, device.type) if multi else None
    # Each dp x cp rank's loss is the mean over its own tokens, an equal share: the batch loss is their mean.
    dp_group = replica_mesh(mesh).get_group() if multi else None
    mine = DataShard(mesh["dp"].get_local_rank(), layout.dp, mesh["cp"].get_local_rank(), layout.cp) if multi \
        else DataShard(0, 1, 0, 1)
    is_logger = (dist.get_rank() if multi else 0) == 0 and log

    ledger = CommLedger()
    baseline = current_rss_bytes() if device.type == "cpu" else 0
    model = build_model(spec, cfg.seed, device)
    par = apply_layout(model, layout, mesh, ledger, cfg.precision, cfg.bucket_mb)
    optimizer = build_optimizer(par.optim_params(), cfg.lr, cfg.weight_decay)
    data = TokenData(load_tokens(cfg.data) if tokens is None else tokens, spec.seq, cfg.seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
    m = layout.microbatches(cfg.global_batch)
    loss_fn = loss_function(mesh["tp"].get_group() if layout.tp > 1 else None)
    step_fn = (PipelineStep(par, layout, mesh, loss_fn, m, autocast, device) if layout.pp > 1
               else AccumulatedStep(par, loss_fn, autocast, device))
    metrics = MetricsLog(cfg.steps, cfg.metrics_out, is_logger, cfg.overwrite, cfg.log_every)
    faults = Injector(from_env(), dist.get_rank() if multi else 0)

    def run_step(step: int) -> dict:
        faults.at_step_start(step)
        start = time.perf_counter()
        ledger.begin_step(step)
        lr = lr_at(step, cfg.steps, cfg.lr, cfg.min_lr, cfg.warmup)
        set_lr(optimizer, lr)
        micro = rank_microbatches(data.global_batch(step, cfg.global_batch), *mine.of(layout.mbs))
        loss = step_fn(micro)
        grad_norm = clip_gradients(par, cfg.clip)
        optimizer.step()
        par.after_step()
        loss_value = _all_mean(loss, dp_group, layout.dp * layout.cp)
        elapsed = time.perf_counter() - start
        return {"step": step, "loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                "tokens_per_s": cfg.global_batch * spec.seq / elapsed, "step_time_s": elapsed,
                "peak_memory_bytes": peak_memory_bytes(device, baseline)}

    with ledger.active():  # code without a ledger handle (TP functions) records through it
        for step in range(cfg.steps):
            metrics.log(run_step(step))
    val_loss = evaluate(step_fn, par, data, cfg, layout, mine, dp_group, device)
    metrics.close()
    summaries = [ledger.summary(s) for s in range(cfg.steps)]
    result = {"rows": metrics.rows, "val_loss": val_loss, "comm": summaries, "records": ledger.records}
    if multi:  # once, after training: not step traffic
        result["comm"] = _gather(summaries)[described_rank(run)]
        if layout.pp > 1:
            result["bubble"] = pipeline_trace(run, step_fn.runner, m)
    result["peak_memory_per_rank"] = _gather(peak_memory_bytes(device, baseline)) if multi else \
        [peak_memory_bytes(device, baseline)]
    return result


def _gather(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def described_rank(run: Resolved) -> int:
    """The global rank whose traffic the cost model predicts: the first rank of its busiest pipeline stage."""
    from meshscale.cost.memory import busiest_rank

    layout = run.layout
    return busiest_rank(run.spec, layout) * layout.dp * layout.cp * layout.tp


def pipeline_trace(run: Resolved, runner, m: int) -> dict:
    """Gather the last step's F/B/W runs of the first rank of each pipeline stage, write them as a Chrome
    trace (rank 0, with --trace), and return the measured bubble per PP rank beside the predicted one."""
    from meshscale.runtime.trace import analytic_bubble, measured_bubble, write_chrome_trace

    layout = run.layout
    per_rank = _gather((runner.events, runner.step_span))
    stride = layout.dp * layout.cp * layout.tp
    stages = [per_rank[r * stride] for r in range(layout.pp)]
    if run.config.trace and dist.get_rank() == 0:
        write_chrome_trace(run.config.trace, [events for events, _ in stages])
    return {"measured": [measured_bubble(events, span) for events, span in stages],
            "predicted": analytic_bubble(layout.schedule, layout.pp, m, layout.vpp)}


@torch.no_grad()
def evaluate(step_fn, par, data: TokenData, cfg, layout, mine, dp_group, device) -> float:
    """Mean loss over `val_batches` held-out global batches (each dp x cp rank its share, then averaged)."""
    for _, module in par.chunks:
        module.eval()
    total = 0.0
    for i in range(cfg.val_batches):
        rows = rank_microbatches(data.global_batch(i, cfg.global_batch, "val"), *mine.of(layout.mbs))
        total += float(step_fn.evaluate(rows))
    for _, module in par.chunks:
        module.train()
    return _all_mean(torch.tensor(total / cfg.val_batches, device=device), dp_group, layout.dp * layout.cp)
