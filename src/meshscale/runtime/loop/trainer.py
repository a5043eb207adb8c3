"""The training loop of one rank: build the model from the seed, apply the layout, and run optimizer
steps of gradient-accumulated micro-batches, recording metrics and every collective."""

import os
import time
from collections import Counter
from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshscale.cost import predict
from meshscale.models import hf_weights
from meshscale.models.transformer import full_shapes, meta_model, moe_layers
from meshscale.parallel.apply import apply_layout
from meshscale.parallel.expert import ep_group_mean
from meshscale.parallel.ledger import CommLedger
from meshscale.parallel.mesh import build_mesh, from_every_rank, replica_mesh
from meshscale.parallel.pipeline import PipelineRunner
from meshscale.parallel.precision import autocast as precision_autocast
from meshscale.parallel.tensor import vocab_parallel_cross_entropy
from meshscale.runtime.loop.config import Resolved
from meshscale.runtime.loop.data import Corpus, TokenData, load_corpus, rank_microbatches
from meshscale.runtime.loop.optim import build_optimizer, clip_gradients, lr_at, set_lr
from meshscale.runtime.measure.live import LiveMetrics, MemorySnapshot, StepProfiler, run_cluster
from meshscale.runtime.measure.metrics import MemoryProbe, MetricsLog, heap_bytes, memory_bytes
from meshscale.runtime.measure.trace import analytic_bubble, measured_bubble, write_chrome_trace
from meshscale.runtime.resilience import checkpoint
from meshscale.runtime.resilience.faults import Injector, from_env
from meshscale.runtime.resilience.guards import Guards, Snapshot, TrainingStopped
from meshscale.runtime.resilience.preemption import Preempted, Preemption, reason, stop_line
from meshscale.runtime.resilience.restarts import check_progress
from meshscale.runtime.resilience.sdc import ReplicaCheck
from meshscale.runtime.resilience.watchdog import Sections, Watchdog


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

    return lambda logits, targets: vocab_parallel_cross_entropy(logits, targets, tp_group)


class AccumulatedStep:
    """One optimizer step's forward and backward without a pipeline: gradient accumulation over this DP
    rank's micro-batches, the data-parallel strategy syncing after the last."""

    def __init__(self, par, loss_fn, autocast, device):
        self.par, self.loss_fn, self.autocast, self.device = par, loss_fn, autocast, device

    def loss(self, mb: tuple) -> torch.Tensor:
        inputs, targets, *documents = (t.to(self.device) for t in mb)  # documents: with --document-mask
        with self.autocast:
            logits = self.par.model(inputs, *documents)
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
    return Training(run, device, tokens, log).run()


class Training:
    """One rank's training run: the model with its layout applied, the optimizer, and what watches over the
    steps (guards, cross-replica check, watchdog, fault injection, checkpoints, memory probe)."""

    def __init__(self, run: Resolved, device: torch.device, tokens, log: bool):
        self.resolved, self.device, self.log = run, device, log
        self.cfg, self.spec, self.layout = cfg, spec, layout = run.config, run.spec, run.layout
        self.multi = multi = layout.devices > 1
        self.mesh = mesh = build_mesh(layout, device.type) if multi else None
        # Each dp x cp rank's loss is the mean over its own tokens, an equal share: the batch loss is their mean.
        self.dp_group = replica_mesh(mesh).get_group() if multi else None
        self.mine = (DataShard(mesh["dp"].get_local_rank(), layout.dp, mesh["cp"].get_local_rank(), layout.cp)
                     if multi else DataShard(0, 1, 0, 1))
        self.is_logger = (dist.get_rank() if multi else 0) == 0 and log

        self.ledger = CommLedger()
        corpus = load_corpus(cfg.data) if tokens is None else Corpus(tokens)
        self.data = TokenData(corpus.tokens, spec.seq, cfg.seed, corpus.bounds)
        if device.type == "cpu":
            _import_setup()
        self.baseline = heap_bytes() if device.type == "cpu" else 0  # the corpus is not the model's memory
        par = self.par = apply_layout(meta_model(spec, device), layout, mesh, self.ledger, cfg.precision,
                                      cfg.bucket_mb, _weights_from(cfg.init_from, spec), cfg.seed, device,
                                      cfg.compile)
        self.optimizer = build_optimizer(par.optim_params(), cfg.lr, cfg.weight_decay)
        autocast = precision_autocast(cfg.precision, device)
        self.m = m = layout.microbatches(cfg.global_batch)
        self.faults = Injector(from_env(), dist.get_rank() if multi else 0)
        loss_fn = self.faults.wrap_loss(loss_function(mesh["tp"].get_group() if layout.tp > 1 else None))
        self.step_fn = (PipelineStep(par, layout, mesh, loss_fn, m, autocast, device) if layout.pp > 1
                        else AccumulatedStep(par, loss_fn, autocast, device))
        self.moe = [layer for _, chunk in par.chunks for layer in moe_layers(chunk)]
        for layer in self.moe:  # the main loss is averaged over the micro-batches, so is the balance loss
            layer.aux_weight /= m
        self.sections = Sections(cfg)
        self.watchdog = (Watchdog(dist.distributed_c10d._get_default_store(), dist.get_rank(),
                                  dist.get_world_size(), self.sections, self.ledger) if multi else None)
        self.live = LiveMetrics(run, self.is_logger)
        self.profiler = StepProfiler(cfg.profile, cfg.steps, cfg.profile_dir, dist.get_rank() if multi else 0)
        self.snapshot = MemorySnapshot(cfg.memory_snapshot, cfg.steps, cfg.memory_snapshot_dir,
                                       dist.get_rank() if multi else 0)  # CUDA only: checked before the start
        self.named = [(name, p) for s in par.strategies for name, p in s.module.named_parameters()]
        self.faults.arm_gradients(self.named)  # before the guards' hooks, so they see the corrupted gradient
        self.guards = Guards([p for _, p in self.named], cfg.on_anomaly, cfg.spike_sigma, multi, device,
                             par.mixes_gradients)
        replicas = (ReplicaCheck(par, self.optimizer, cfg.on_anomaly == "rollback")
                    if multi and cfg.sdc_check_every else None)
        self.replicas = replicas if replicas and replicas.groups else None  # no tensor has a replica
        self.state = list({id(t): t for t in [p for _, p in self.named] + par.optim_params()}.values())
        # On CPU the allocator's peak inside a step needs the profiler: the last step runs under it when the
        # memory is reported (--predict, --metrics-out).
        self.probe = (MemoryProbe(self.baseline) if device.type == "cpu" and (cfg.predict or cfg.metrics_out)
                      else None)
        self.preemption = Preemption(cfg.time_limit)
        self.stop_code = 0  # the step's control all-reduce sets it
        self.rollbacks: Counter = Counter()  # per checkpoint directory
        self.saver = (checkpoint.AsyncSaver(cfg.keep) if cfg.async_save and cfg.checkpoint_dir else None)
        # last: the watchdog watches from the load on, and stops again if what follows it fails
        self.first_step = self.load(lambda: checkpoint.restore_latest(run, par, self.optimizer, mesh))
        try:
            check_progress(cfg.checkpoint_dir, self.first_step, cfg.max_no_progress_restarts,
                           str(checkpoint.step_dir(cfg.checkpoint_dir, self.first_step)) if self.first_step
                           else "step 0 (no checkpoint yet)")
            restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
            self.metrics = MetricsLog(cfg.steps, cfg.metrics_out, self.is_logger, cfg.overwrite, cfg.log_every,
                                      resume_at=self.first_step if self.first_step or restarted else None)
        except BaseException:
            self.stop_watchdog()
            raise

    def beat(self, step: int, phase: str) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(step, phase)

    def load(self, restore, step: int = -1) -> int:
        """Run `restore` (a checkpoint load: the step to continue from) as the watchdog's "load" section,
        starting the watchdog for the first one; it stops again if this load fails (no training follows)."""
        if self.watchdog is not None and step < 0:
            self.watchdog.__enter__()
        self.beat(step, "load")
        started = time.perf_counter()
        try:
            back = restore()
        except BaseException:
            if step < 0:
                self.stop_watchdog()
            raise
        self.sections.observed("load", time.perf_counter() - started)
        return back

    def stop_watchdog(self) -> None:
        if self.watchdog is not None:
            self.watchdog.__exit__(None, None, None)

    def run(self) -> dict:
        cfg, layout = self.cfg, self.layout
        try:
            with nullcontext() if self.watchdog is None else self.watchdog, self.preemption:
                with self.ledger.active():  # code without a ledger handle (TP functions) records through it
                    self.steps()
                self.beat(cfg.steps, "evaluate")  # not step traffic: outside the ledger
                val_loss = evaluate(self.step_fn, self.par, self.data, cfg, layout, self.mine, self.dp_group,
                                    self.device)
        finally:
            if self.saver is not None:
                self.saver.close(wait=False)  # after an error; a finished run waited for its last save
            self.metrics.close()
            self.live.close()
        summaries = [self.ledger.summary(s) for s in range(self.first_step, cfg.steps)]
        result = {"rows": self.metrics.rows, "val_loss": val_loss, "comm": summaries,
                  "records": self.ledger.records}
        if self.multi:  # once, after training: not step traffic
            per_rank, described = from_every_rank(summaries), described_rank(self.resolved)
            result["comm"] = per_rank[described]
            if layout.ep > 1:
                result["comm"], result["ep_imbalance"] = ep_group_mean(per_rank, layout, described)
            if layout.pp > 1:
                result["bubble"] = pipeline_trace(self.resolved, self.step_fn.runner, self.m)
        peak = max(r["peak_memory_bytes"] for r in self.metrics.rows)
        result["peak_memory_per_rank"] = from_every_rank(peak)
        return result

    def steps(self) -> None:
        """Run the steps from the first one not yet done; an anomaly stops, or rolls back to a checkpoint."""
        cfg, step = self.cfg, self.first_step
        while step < cfg.steps:
            if self.probe is not None and step == cfg.steps - 1 and step not in self.profiler.chosen:
                with self.probe.step():
                    row, anomalies = self.step(step)
                row = dict(row, peak_memory_bytes=self.probe.peak, memory_probe=True)
            else:
                # one profiler at a time: a traced step has no probe (and the probe is CPU's, the snapshot CUDA's)
                with self.profiler.around(step), self.snapshot.around(step):
                    row, anomalies = self.step(step)
            actions = {a.action: a for a in anomalies}
            if "stop" in actions:
                self.metrics.log(row)
                raise TrainingStopped(actions["stop"].line())
            if "rollback" in actions:
                self.metrics.log(row)  # the rows of the steps run again follow it in the file
                step = self.roll_back(actions["rollback"])
                continue
            stop = reason(self.stop_code) if step + 1 < cfg.steps else None  # the last step just ends
            saved = None
            if checkpoint.due(cfg, step + 1) or (stop and cfg.checkpoint_dir):
                self.check_before_save(step, row)
                self.beat(step, "save")  # its own timeout (watchdog.Sections): a save may outlast a step
                saving = time.perf_counter()
                self.faults.slow_save(step)
                save = checkpoint.save if self.saver is None else self.saver.save
                saved = save(self.resolved, self.par, self.optimizer, self.mesh, step + 1, row["sdc_check"])
                row["checkpoint_save_s"] = time.perf_counter() - saving  # what the step waited for
                self.sections.observed("save", row["checkpoint_save_s"])
            if self.saver is not None and self.saver.write_s is not None:  # an async save finished
                row["checkpoint_write_s"], self.saver.write_s = self.saver.write_s, None
            self.metrics.log(row)
            self.live.log(row, self.ledger)
            step += 1
            if stop:
                self.wait_for_save(step)
                raise Preempted(stop_line(stop, step, saved, cfg.time_limit))
        self.wait_for_save(step)

    def wait_for_save(self, step: int) -> None:
        if self.saver is not None:
            self.beat(step, "save")
            self.saver.wait()

    def check_before_save(self, step: int, row: dict) -> None:
        """The replica check on the state about to be saved, when self.step has not run it: a corrupted
        replica is never the one written."""
        if self.replicas is None or row["sdc_check"]:
            return
        self.beat(step, "sdc check")
        found = self.replicas.run(step)
        row["sdc_check"] = True
        if found is not None:
            row["anomalies"].append(found.row())
            self.metrics.log(row)
            raise TrainingStopped(f"{found.message}; stopped without saving the corrupted replica")

    def forward_backward(self, step: int, micro: list) -> tuple:
        layout = self.layout
        self.beat(step, "forward/backward")
        loss = self.step_fn(micro)  # None on a pipeline stage before the last
        # one control all-reduce: the guards' flags, the mean loss (the tp ranks of each dp x cp replica's last
        # stage hold its loss: the sum of loss / (devices / pp) over them is the mean of the replicas'), the
        # preemption request and each rank's share of the squared gradient norm, taken before any sum over ranks
        share = torch.zeros((), device=self.device) if loss is None else loss / (layout.devices // layout.pp)
        self.beat(step, "guards")
        rows = self.guards.exchange(loss, share, self.preemption.code(), self.par.local_grad_sq())
        self.beat(step, "gradient norm")
        grad_norm = clip_gradients(self.par, self.cfg.clip, rows[:, 4])
        control = self.guards.decide(step, rows, grad_norm)
        self.stop_code = control.stop
        return control.loss, grad_norm, control.anomaly

    def step(self, step: int) -> tuple[dict, list]:
        """One optimizer step (replayed once on an anomaly with --replay-anomalies): its metrics row and the
        anomalies found."""
        cfg, layout, par, faults = self.cfg, self.layout, self.par, self.faults
        self.beat(step, "start")
        faults.at_step_start(step)
        start = time.perf_counter()
        self.ledger.begin_step(step)
        lr = lr_at(step, cfg.steps, cfg.lr, cfg.min_lr, cfg.warmup)
        set_lr(self.optimizer, lr)
        micro = microbatches(self.data, step, cfg, layout, self.mine)
        snapshot = Snapshot(self.state, self.optimizer) if cfg.replay_anomalies else None
        loss_value, grad_norm, anomaly = self.forward_backward(step, micro)
        if anomaly is not None and snapshot is not None:  # same data, state and RNG: does it happen again?
            snapshot.restore(self.optimizer)
            par.after_step()  # drop the step's gradients (ZeRO: re-gather the restored shards)
            faults.at_step_start(step)
            loss_value, grad_norm, again = self.forward_backward(step, micro)
            anomaly.replay = "persistent" if again else "transient"
            if again is None:
                anomaly.action = "continue"
        if anomaly is None or anomaly.action == "continue":
            self.beat(step, "optimizer")
            self.optimizer.step()
            self.guards.healthy(loss_value)
        par.after_step()
        anomalies = [anomaly] if anomaly else []
        flipped = faults.flip_bit(step, self.named)
        if flipped and self.log:
            print(f"step {step:>4}  fault: {flipped}", flush=True)
        # every checkpoint is checked before it is written: a corrupted replica is never the one saved
        checked = self.replicas is not None and ((step + 1) % cfg.sdc_check_every == 0
                                                 or checkpoint.due(cfg, step + 1))
        if checked:
            self.beat(step, "sdc check")
            anomalies += filter(None, [self.replicas.run(step)])
        faults.straggle(step, time.perf_counter() - start)
        elapsed = time.perf_counter() - start
        extra = ({"aux_loss": balance_loss_value(self.moe, self.mesh, self.dp_group, layout, self.m)}
                 if self.spec.is_moe else {})
        return {"step": step, "loss": loss_value, **extra, "lr": lr, "grad_norm": grad_norm,
                "tokens_per_s": cfg.global_batch * self.spec.seq / elapsed, "step_time_s": elapsed,
                "peak_memory_bytes": memory_bytes(self.device, self.baseline), "sdc_check": checked,
                "anomalies": [a.row() for a in anomalies]}, anomalies

    def roll_back(self, anomaly) -> int:
        """Reload the newest complete checkpoint (verified by the replica check, when the run has one) into
        every rank's live state; the step to go on from."""
        cfg, verified = self.cfg, self.replicas is not None
        self.wait_for_save(anomaly.step)  # the save in flight may be the newest checkpoint
        found = checkpoint.complete(cfg.checkpoint_dir)
        target = checkpoint.newest_verified(found) if verified else (found[-1][1] if found else None)
        if target is None:
            which = "complete checkpoint verified by the replica check" if verified else "complete checkpoint"
            raise TrainingStopped(f"{anomaly.message}; no {which} in {cfg.checkpoint_dir} to roll back to yet "
                                  "(save more often with --checkpoint-every)")
        if self.rollbacks[target] >= cfg.max_rollbacks:  # what the checkpoint holds brings the anomaly back
            raise TrainingStopped(f"{anomaly.message}; rolled back to {target} {self.rollbacks[target]} times "
                                  f"already (--max-rollbacks {cfg.max_rollbacks}): stopped, the anomaly persists")
        self.rollbacks[target] += 1
        back = self.load(lambda: checkpoint.restore_latest(self.resolved, self.par, self.optimizer, self.mesh,
                                                           verified), anomaly.step)
        self.ledger.forget_from(back)
        if self.is_logger:
            print(f"rolled back to the checkpoint of step {back} after: {anomaly.message}", flush=True)
        return back


def _weights_from(root: str | None, spec):
    """--init-from's loader for apply_layout: each rank reads its own pieces of the safetensors."""
    if root is None:
        return None
    shapes = full_shapes(spec)
    return lambda module, tp_rank, tp: hf_weights.load(module, root, spec, shapes, tp_rank, tp)


def _import_setup() -> None:
    """Import what setting up a run imports lazily (torch.optim's first optimizer pulls in torch._dynamo,
    about 20 MiB of Python heap; the profiler), so that the heap baseline holds code and the memory
    measured above it is the run's. The parallel wrappers are imported with this module."""
    import torch.profiler  # noqa: F401

    build_optimizer([torch.zeros(1, requires_grad=True)], 0.0, 0.0)


def balance_loss_value(moe: list, mesh, dp_group, layout, m: int) -> float:
    """The step's load-balancing loss (before its coefficient): summed over the MoE layers, each averaged over
    the step's m micro-batches (the last m values: on its first step torch's pipeline stage backpropagates one
    extra pass on the last stage), the layers summed over PP and averaged over dp x cp (control scalars, not ledger
    traffic)."""
    total = torch.zeros(())
    for layer in moe:
        total += torch.stack(layer.aux_values[-m:]).mean()
        layer.aux_values.clear()
    if layout.pp > 1:
        dist.all_reduce(total, group=mesh["pp"].get_group())
    return _all_mean(total, dp_group, layout.dp * layout.cp)


def described_rank(run: Resolved) -> int:
    """The global rank whose traffic the cost model predicts: the first rank of the pipeline stage its step
    waits for (Prediction.comm_rank)."""
    layout, cfg = run.layout, run.config
    stage = predict(run.spec, run_cluster(cfg), layout, cfg.global_batch, cfg.precision).comm_rank
    return stage * layout.dp * layout.cp * layout.tp


def pipeline_trace(run: Resolved, runner, m: int) -> dict:
    """Gather the last step's F/B/W runs of the first rank of each pipeline stage, write them as a Chrome
    trace (rank 0, with --trace), and return the measured bubble per PP rank beside the predicted one."""

    layout = run.layout
    per_rank = from_every_rank((runner.events, runner.step_span))
    stride = layout.dp * layout.cp * layout.tp
    stages = [per_rank[r * stride] for r in range(layout.pp)]
    if run.config.trace and dist.get_rank() == 0:
        write_chrome_trace(run.config.trace, [events for events, _ in stages])
    return {"measured": [measured_bubble(events, span) for events, span in stages],
            "predicted": analytic_bubble(layout.schedule, layout.pp, m, layout.vpp)}


def microbatches(data: TokenData, step: int, cfg, layout, mine: DataShard, split: str = "train") -> list:
    """This rank's micro-batches of the global batch of `step`, with their tokens' documents under
    --document-mask."""
    documents = data.global_documents(step, cfg.global_batch, split) if cfg.document_mask else None
    return rank_microbatches(data.global_batch(step, cfg.global_batch, split), *mine.of(layout.mbs),
                             documents=documents)


@torch.no_grad()
def evaluate(step_fn, par, data: TokenData, cfg, layout, mine, dp_group, device) -> float:
    """Mean loss over `val_batches` held-out global batches (each dp x cp rank its share, then averaged)."""
    for _, module in par.chunks:
        module.eval()
    total = 0.0
    for i in range(cfg.val_batches):
        total += float(step_fn.evaluate(microbatches(data, i, cfg, layout, mine, "val")))
    for _, module in par.chunks:
        module.train()
    return _all_mean(torch.tensor(total / cfg.val_batches, device=device), dp_group, layout.dp * layout.cp)
