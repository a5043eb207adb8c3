"""Training configuration: defaults < TOML file < command-line flags, then every check that can be
made before a process starts (so bad input costs one line and exit code 2, not a crashed job)."""

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from meshscale.errors import UserError
from meshscale.models import hf_weights
from meshscale.runtime.loop.data import check_tokens, load_tokens
from meshscale.runtime.resilience.checkpoint import check_dir, check_same_run, read_manifest
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout, check_against, check_trainable
from meshscale.specs.loading import build, read_mapping
from meshscale.specs.model import ModelSpec, load_model


@dataclass(frozen=True)
class TrainConfig:
    model: str = "tiny"
    init_from: str | None = None  # a Hugging Face save_pretrained directory: its model and weights start the run
    layout: str = ""  # empty: dp over every process
    nproc: int = 1
    steps: int = 20
    global_batch: int = 8  # sequences per optimizer step
    seq: int = 0  # 0: the model's own sequence length
    seed: int = 0
    precision: str = "fp32"
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 5
    weight_decay: float = 0.1
    clip: float = 1.0
    bucket_mb: float = 1.0  # DDP / ZeRO gradient bucket size
    data: str | None = None  # None: the Python standard library's sources
    val_batches: int = 4
    log_every: int = 1  # print every n-th step (the JSONL file gets them all)
    metrics_out: str | None = None
    trace: str | None = None  # Chrome-trace JSON of the last step's pipeline runs
    plot: str | None = None  # PNG: loss and measured vs predicted step time, drawn by rank 0 at the end
    overwrite: bool = False
    predict: bool = False
    cluster: str = "local-cpu"  # the ClusterSpec --predict uses (a preset or a `meshscale calibrate` file)
    device: str = "auto"  # auto: cuda when available, else cpu
    timeout: float = 300.0  # seconds without progress before a hang ends the job
    on_anomaly: str = "stop"  # stop, skip or rollback, on a non-finite or spiking loss or gradient (rollback: SDC too)
    spike_sigma: float = 6.0  # spike rule: std above the trailing mean (0: off)
    sdc_check_every: int = 50  # cross-replica fingerprint check every N steps (0: off)
    replay_anomalies: bool = False  # re-run an anomalous step from a snapshot to classify it
    # checkpoints and restarts (runtime/resilience/checkpoint.py)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50  # steps between saves; the last step is always saved
    keep: int = 3  # complete checkpoints kept
    max_restarts: int = 0  # local launcher: restarts of the whole worker group after a failure
    max_rollbacks: int = 3  # --on-anomaly rollback: reloads of one checkpoint before the run stops
    time_limit: float = 0.0  # seconds: then save and stop at a step boundary (0: none)
    allow_config_change: bool = False  # resume although seed, batch, seq, data or LR schedule changed


def load_config(path: str | None, overrides: dict) -> TrainConfig:
    """Defaults, then the TOML file (top level or a [train] table), then non-None overrides."""
    values: dict = {}
    if path:
        data = read_mapping(path)
        values.update(data.get("train", data))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return build(TrainConfig, values, path or "train options")


@dataclass(frozen=True)
class Resolved:
    """A checked config with what it implies: the model (at the run's seq) and the full layout."""
    config: TrainConfig
    spec: ModelSpec
    layout: Layout


def world_from_env() -> int | None:
    """The process count when launched by an outer torchrun, else None."""
    return int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ and "RANK" in os.environ else None


def resolve(cfg: TrainConfig, world: int) -> Resolved:
    """Every pre-launch check. `world` is the number of processes that will run the job."""

    if cfg.precision not in ("fp32", "bf16"):
        raise UserError(f"--precision must be fp32 or bf16, got {cfg.precision!r}")
    for key in ("steps", "global_batch", "nproc"):
        if getattr(cfg, key) < 1:
            raise UserError(f"--{key.replace('_', '-')} must be at least 1, got {getattr(cfg, key)}")
    spec = _model(cfg)
    if cfg.seq:
        spec = spec.with_seq(cfg.seq)
    layout = Layout.parse(cfg.layout, devices=world)
    check_trainable(layout, spec)
    per_rank = cfg.global_batch // layout.dp
    if cfg.global_batch % layout.dp:
        raise UserError(f"global batch {cfg.global_batch} does not split over dp={layout.dp}; "
                        f"use a multiple of {layout.dp}")
    layout = layout.resolve_mbs(cfg.global_batch)
    if layout.mbs > per_rank:
        raise UserError(f"layout: mbs={layout.mbs} exceeds the {per_rank} sequences each DP rank gets "
                        f"(global batch {cfg.global_batch} / dp={layout.dp}); lower mbs")
    check_against(layout, spec, cfg.global_batch)
    if cfg.data is not None and not Path(cfg.data).exists():
        raise UserError(f"--data {cfg.data}: no such file or directory; pass a text file, a directory of "
                        "text files, or a .bin token file")
    if cfg.data is not None:
        check_tokens(load_tokens(cfg.data), spec.vocab, spec.seq, f"--data {cfg.data}")
    if cfg.metrics_out and not Path(cfg.metrics_out).absolute().parent.is_dir():
        raise UserError(f"--metrics-out {cfg.metrics_out}: directory {Path(cfg.metrics_out).parent} does not exist")
    if cfg.plot:
        if not Path(cfg.plot).absolute().parent.is_dir():
            raise UserError(f"--plot {cfg.plot}: directory {Path(cfg.plot).parent} does not exist")
        if os.environ.get("RANK", "0") == "0" and Path(cfg.plot).exists() and not cfg.overwrite:
            raise UserError(f"--plot {cfg.plot} already exists; choose a new file or pass --overwrite")
    if cfg.trace:
        if layout.pp == 1:
            raise UserError("--trace records the pipeline's forward/backward runs; it needs a layout with pp > 1")
        if not Path(cfg.trace).absolute().parent.is_dir():
            raise UserError(f"--trace {cfg.trace}: directory {Path(cfg.trace).parent} does not exist")
        if os.environ.get("RANK", "0") == "0" and Path(cfg.trace).exists() and not cfg.overwrite:
            raise UserError(f"--trace {cfg.trace} already exists; choose a new file or pass --overwrite")
    if cfg.predict:
        load_cluster(cfg.cluster)  # a bad --cluster file is one line now, not an error after training
    if cfg.timeout <= 0:
        raise UserError(f"--timeout must be a positive number of seconds, got {cfg.timeout:g}")
    if cfg.on_anomaly not in ("stop", "skip", "rollback"):
        raise UserError(f"--on-anomaly must be stop, skip or rollback, got {cfg.on_anomaly!r}")
    if cfg.on_anomaly == "rollback" and not cfg.checkpoint_dir:
        raise UserError("--on-anomaly rollback reloads the newest checkpoint; give --checkpoint-dir DIR")
    for key in ("spike_sigma", "sdc_check_every"):
        if getattr(cfg, key) < 0:
            raise UserError(f"--{key.replace('_', '-')} must be 0 (off) or positive, got {getattr(cfg, key)}")
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda, got {cfg.device!r}")
    resuming = _check_checkpoints(cfg, spec)
    _check_metrics_out(cfg, resuming)
    return Resolved(cfg, spec, layout)


def _model(cfg: TrainConfig) -> ModelSpec:
    """--model; with --init-from, the directory's model (--model, if given, must have its shapes), its
    weights checked to be ones meshscale loads."""
    if not cfg.init_from:
        return load_model(cfg.model)
    if not Path(cfg.init_from).is_dir():
        raise UserError(f"--init-from {cfg.init_from}: not a directory; pass one written by transformers' "
                        "save_pretrained")
    spec = load_model(cfg.init_from)
    hf_weights.model_type(cfg.init_from)
    hf_weights.Safetensors(cfg.init_from)
    if cfg.model != TrainConfig.model and replace(load_model(cfg.model), name=spec.name, seq=spec.seq) != spec:
        raise UserError(f"--model {cfg.model} is not the model in --init-from {cfg.init_from}; leave --model out "
                        "or name the same architecture")
    return spec


def _check_checkpoints(cfg: TrainConfig, spec: ModelSpec) -> bool:
    """The checkpoint options, and the newest checkpoint in --checkpoint-dir (compatible, intact); True
    when the run will resume from one."""

    if cfg.checkpoint_every < 1:
        raise UserError(f"--checkpoint-every must be at least 1 step, got {cfg.checkpoint_every}")
    if cfg.keep < 2:
        raise UserError(f"--keep must be at least 2, got {cfg.keep}: the newest checkpoint may still be being "
                        "written when older ones are deleted")
    if cfg.max_restarts < 0:
        raise UserError(f"--max-restarts must be 0 or more, got {cfg.max_restarts}")
    if cfg.max_restarts and not cfg.checkpoint_dir:
        raise UserError("--max-restarts resumes from checkpoints; pass --checkpoint-dir DIR too")
    if cfg.max_rollbacks < 1:
        raise UserError(f"--max-rollbacks must be at least 1, got {cfg.max_rollbacks}")
    if cfg.time_limit < 0:
        raise UserError(f"--time-limit must be 0 (none) or a positive number of seconds, got {cfg.time_limit:g}")
    if cfg.time_limit and not cfg.checkpoint_dir:
        raise UserError("--time-limit saves a checkpoint to resume from before it stops; pass --checkpoint-dir DIR")
    newest = check_dir(cfg.checkpoint_dir, spec, cfg.precision) if cfg.checkpoint_dir else None
    if newest and newest[0] >= cfg.steps:
        raise UserError(f"checkpoint {newest[1]} already reached step {newest[0]} of --steps {cfg.steps}; raise "
                        "--steps to train on (with --allow-config-change), or use a new --checkpoint-dir")
    if newest and not cfg.allow_config_change:
        check_same_run(newest[1], read_manifest(newest[1]), cfg, spec)
    return newest is not None


def _check_metrics_out(cfg: TrainConfig, resuming: bool) -> None:
    # Under an outer torchrun only rank 0 checks: it is the one that creates the file. A resumed run
    # continues the file of the run it resumes.
    if (cfg.metrics_out and os.environ.get("RANK", "0") == "0" and Path(cfg.metrics_out).exists()
            and not cfg.overwrite and not resuming):
        raise UserError(f"--metrics-out {cfg.metrics_out} already exists; choose a new file or pass --overwrite")


def config_fields() -> list[str]:
    return [f.name for f in fields(TrainConfig)]

