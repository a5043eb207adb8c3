"""The training loop of one rank: build the model from the seed, apply the layout, and run optimizer
steps of gradient-accumulated micro-batches, recording metrics and every collective."""

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshscale.runtime.config import Resolved
from meshscale.runtime.data import TokenData, load_tokens, rank_microbatches
from meshscale.runtime.ledger import CommLedger
from meshscale.runtime.metrics import MetricsLog, current_rss_bytes, peak_memory_bytes
from meshscale.runtime.model import build_model
from meshscale.runtime.optim import build_optimizer, clip_gradients, lr_at, set_lr


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _all_mean(value: torch.Tensor, group, world: int) -> float:
    if world > 1:
        dist.all_reduce(value, group=group)  # control scalar (loss), not part of the ledger
    return float(value) / world


def train(run: Resolved, device: torch.device, tokens=None, log: bool = True) -> dict:
    """Run `run` on this rank (inside an initialised process group when the layout has >1 device).
    Returns per-step metrics rows, the final validation loss and the comm ledger's per-step summaries."""
    from meshscale.parallel.apply import apply_layout
    from meshscale.parallel.mesh import build_mesh

    cfg, spec, layout = run.config, run.spec, run.layout
    multi = layout.devices > 1
    mesh = build_mesh(layout, device.type) if multi else None
    dp_rank = mesh["dp"].get_local_rank() if multi else 0
    dp_group = mesh["dp"].get_group() if multi else None
    is_logger = (dist.get_rank() if multi else 0) == 0 and log

    ledger = CommLedger()
    baseline = current_rss_bytes() if device.type == "cpu" else 0
    model = build_model(spec, cfg.seed, device)
    strategy = apply_layout(model, layout, mesh, ledger, cfg.precision, cfg.bucket_mb)
    optimizer = build_optimizer(strategy.optim_params(), cfg.lr, cfg.weight_decay)
    data = TokenData(load_tokens(cfg.data) if tokens is None else tokens, spec.seq, cfg.seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
    m = layout.microbatches(cfg.global_batch)
    metrics = MetricsLog(cfg.steps, cfg.metrics_out, is_logger, cfg.overwrite, cfg.log_every)

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        batch = batch.to(device)
        with autocast:
            logits = strategy.model(batch[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, spec.vocab), batch[:, 1:].reshape(-1))

    def run_step(step: int) -> dict:
        start = time.perf_counter()
        ledger.begin_step(step)
        lr = lr_at(step, cfg.steps, cfg.lr, cfg.min_lr, cfg.warmup)
        set_lr(optimizer, lr)
        micro = rank_microbatches(data.global_batch(step, cfg.global_batch), dp_rank, layout.dp, layout.mbs)
        loss_sum = torch.zeros((), device=device)
        for i, mb in enumerate(micro):
            with strategy.accumulate(last=i == m - 1):
                loss = loss_of(mb) / m  # equal-sized micro-batches: the mean of means is the batch mean
                loss.backward()
            loss_sum += loss.detach()
        grad_norm = clip_gradients(strategy, cfg.clip)
        optimizer.step()
        strategy.after_step()
        loss_value = _all_mean(loss_sum, dp_group, layout.dp)
        elapsed = time.perf_counter() - start
        return {"step": step, "loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                "tokens_per_s": cfg.global_batch * spec.seq / elapsed, "step_time_s": elapsed,
                "peak_memory_bytes": peak_memory_bytes(device, baseline)}

    with ledger.active():  # code without a ledger handle (TP functions) records through it
        for step in range(cfg.steps):
            metrics.log(run_step(step))
    val_loss = evaluate(strategy, data, cfg, layout, dp_rank, dp_group, loss_of, device)
    metrics.close()
    peaks = torch.tensor([peak_memory_bytes(device, baseline)], dtype=torch.int64, device=device)
    if multi:
        gathered = [torch.zeros_like(peaks) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, peaks)  # once, after training: not step traffic
        peaks = torch.cat(gathered)
    return {"rows": metrics.rows, "val_loss": val_loss, "peak_memory_per_rank": peaks.tolist(),
            "comm": [ledger.summary(s) for s in range(cfg.steps)], "records": ledger.records}


@torch.no_grad()
def evaluate(strategy, data: TokenData, cfg, layout, dp_rank: int, dp_group, loss_of, device) -> float:
    """Mean loss over `val_batches` held-out global batches (each rank its slice, then averaged)."""
    strategy.model.eval()
    total = 0.0
    for i in range(cfg.val_batches):
        rows = rank_microbatches(data.global_batch(i, cfg.global_batch, "val"), dp_rank, layout.dp, layout.mbs)
        total += sum(float(loss_of(mb)) for mb in rows) / len(rows)
    strategy.model.train()
    return _all_mean(torch.tensor(total / cfg.val_batches, device=device), dp_group, layout.dp)
