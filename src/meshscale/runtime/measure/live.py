"""Live metrics beside the JSONL file: TensorBoard event files (--tensorboard DIR) and a Weights & Biases run
(--wandb DIR, offline unless WANDB_MODE says otherwise), each step's measured values next to the cost model's
prediction for the run (step time, MFU, memory, communication bytes), so a dashboard shows both lines; and
torch profiler traces of chosen steps (--profile STEPS); on CUDA, the caching allocator's history over chosen
steps (--memory-snapshot STEPS). Rank 0 writes the metrics; every rank its trace and snapshot."""

import os
from contextlib import contextmanager, nullcontext
from pathlib import Path

from meshscale.cost import predict
from meshscale.errors import UserError
from meshscale.specs.cluster import FRAMEWORK_SWITCHES, load_cluster


def run_cluster(cfg):
    """The ClusterSpec this run's prediction is costed on: --cluster's, with our runtime's software whatever
    framework the cluster file's [software] copies: the gradient buckets it cuts (torch DDP's bucket_cap_mb =
    --bucket-mb MiB of fp32 gradient, parallel/data_parallel.grad_buckets), its element-wise operators one
    kernel each unless --compile fuses them, ZeRO-1/2 gathers of the fp32 parameters it keeps under autocast,
    MoE tokens dispatched by torch's all-to-all, FP8 scaled from each tensor's current amax (torchao's
    Float8Linear) and AdamW's moments in fp32; none of the other frameworks' switches (FRAMEWORK_SWITCHES, CUDA
    graphs) or dispatchers (DeepEP's kernels) is something it does."""
    cluster = load_cluster(cfg.cluster)
    params = max(1, int(cfg.bucket_mb * 2**20) // 4)
    others = dict.fromkeys((*FRAMEWORK_SWITCHES, "cuda_graphs"), False)
    return cluster.with_software(framework="torch", grad_bucket_params=params, fused_elementwise=cfg.compile,
                                 param_gather_fp32=True, moe_dispatcher="alltoall", fp8_scaling="current",
                                 adam_moments="fp32", **others)


MEASURED = ("loss", "aux_loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "peak_memory_bytes")


def check(cfg, world: int) -> None:
    """The live-metrics options, before any process starts: the packages they need, the steps named, and for
    a memory snapshot a GPU and files that can be written and are not there yet."""
    if cfg.tensorboard:
        _need("tensorboard", "--tensorboard")
    if cfg.wandb:
        _need("wandb", "--wandb")
    if cfg.profile:
        profile_steps(cfg.profile, cfg.steps)
    if cfg.memory_snapshot:
        import torch

        gpu = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        if not gpu:
            raise UserError("--memory-snapshot records the CUDA caching allocator; this run is on CPU (use "
                            "--profile STEPS for a CPU trace)")
        check_snapshot_files(cfg, world)


def check_snapshot_files(cfg, world: int) -> None:
    """--memory-snapshot-dir is (or can be made) a writable folder, and no rank's snapshot is there already
    unless --overwrite."""
    first, last = _window(cfg.memory_snapshot, cfg.steps)
    folder = Path(cfg.memory_snapshot_dir).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--memory-snapshot-dir {cfg.memory_snapshot_dir}: {existing} is not a writable folder")
    taken = [p for r in range(world) if (p := snapshot_path(folder, first, last, r)).exists()]
    if taken and not cfg.overwrite:
        raise UserError(f"--memory-snapshot: {taken[0]} already exists; choose another --memory-snapshot-dir or "
                        "pass --overwrite")


def snapshot_path(folder: Path, first: int, last: int, rank: int) -> Path:
    return folder / f"steps{first}-{last}-rank{rank}.pickle"


def _window(text: str, steps: int) -> tuple[int, int]:
    chosen = profile_steps(text, steps, "--memory-snapshot")
    return min(chosen), max(chosen)


def _need(package: str, flag: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise UserError(f"{flag} needs the {package} package; pip install {package}")


def profile_steps(text: str, steps: int, flag: str = "--profile") -> set[int]:
    """'3', '2,5' or '2-4' -> the steps to trace, each in [0, steps)."""
    chosen: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            chosen.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        chosen = set()
    if not chosen or min(chosen) < 0 or max(chosen) >= steps:
        raise UserError(f"{flag} {text!r}: give steps in [0, {steps}) like 3, 2,5 or 2-4")
    return chosen


def scalars(row: dict, comm_bytes: float, predicted: dict | None) -> dict[str, float]:
    """One step's values under train/ and, beside each the cost model predicts, predicted/."""
    out = {f"train/{k}": float(row[k]) for k in MEASURED if k in row}
    out["train/comm_bytes"] = comm_bytes
    if predicted:
        # MFU counts the same model FLOPs against the same peak: measured = predicted x predicted / measured time
        out["train/mfu"] = predicted["mfu"] * predicted["step_time_s"] / row["step_time_s"]
        out |= {"predicted/step_time_s": predicted["step_time_s"], "predicted/mfu": predicted["mfu"],
                "predicted/tokens_per_s": predicted["tokens_per_s"],
                "predicted/peak_memory_bytes": predicted["memory_per_device_bytes"]["total"],
                "predicted/comm_bytes": float(sum(e["bytes"] for e in predicted["comm"]))}
    return out


class LiveMetrics:
    """The writers one run asked for; `log` once per step (rank 0), `close` at the end."""

    def __init__(self, run, is_logger: bool):
        cfg = run.config
        self.tensorboard = self.wandb = None
        self.predicted = None
        if is_logger and (cfg.tensorboard or cfg.wandb):
            self.predicted = predict(run.spec, run_cluster(cfg), run.layout, cfg.global_batch,
                                     cfg.precision).to_dict()
        if is_logger and cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tensorboard = SummaryWriter(log_dir=cfg.tensorboard)
        if is_logger and cfg.wandb:
            import wandb
            Path(cfg.wandb).mkdir(parents=True, exist_ok=True)
            self.wandb = wandb.init(project="meshscale", dir=cfg.wandb, mode=os.environ.get("WANDB_MODE", "offline"),
                                    name=f"{run.spec.name} {run.layout}", reinit="finish_previous",
                                    settings=wandb.Settings(silent=True, console="off"),
                                    config={"model": run.spec.name, "layout": str(run.layout),
                                            "global_batch": cfg.global_batch, "seq": run.spec.seq,
                                            "precision": cfg.precision, "cluster": cfg.cluster})

    def log(self, row: dict, ledger) -> None:
        """`row` as the JSONL has it; `ledger` the run's CommLedger (its bytes of this step)."""
        if self.tensorboard is None and self.wandb is None:
            return
        comm = float(sum(c["bytes"] for c in ledger.summary(row["step"])))
        values = scalars(row, comm, self.predicted)
        if self.tensorboard is not None:
            for key, value in values.items():
                self.tensorboard.add_scalar(key, value, row["step"])
        if self.wandb is not None:
            self.wandb.log(values, step=row["step"])

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


class StepProfiler:
    """torch.profiler around the chosen steps: a Chrome trace per step and rank in `folder`."""

    def __init__(self, text: str | None, steps: int, folder: str, rank: int):
        self.chosen = profile_steps(text, steps) if text else set()
        self.folder, self.rank = Path(folder), rank

    def around(self, step: int):
        return self._profiled(step) if step in self.chosen else nullcontext()

    @contextmanager
    def _profiled(self, step: int):
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.folder.mkdir(parents=True, exist_ok=True)
        with profile(activities=activities, record_shapes=True) as prof:
            yield
        prof.export_chrome_trace(str(self.folder / f"step{step}-rank{self.rank}.json"))


class MemorySnapshot:
    """On CUDA, the caching allocator's history (every allocation and free, with its stack) recorded from the
    first to the last chosen step and dumped per rank as the pickle https://pytorch.org/memory_viz reads;
    torch.cuda.memory's _record_memory_history / _dump_snapshot, as PyTorch's "Understanding CUDA Memory
    Usage" guide uses them. The files were checked absent before the run started."""

    def __init__(self, text: str | None, steps: int, folder: str, rank: int):
        self.first, self.last = _window(text, steps) if text else (-1, -1)
        self.path = snapshot_path(Path(folder), self.first, self.last, rank)
        self.recording = False

    @contextmanager
    def around(self, step: int):
        import torch

        if not self.recording and self.first <= step <= self.last:  # from the first chosen step (or a resume's)
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
            self.recording = True
        yield
        if self.recording and step == self.last:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(self.path))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False
