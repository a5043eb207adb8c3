"""Training configuration: defaults < TOML file < command-line flags, then every check that can be
made before a process starts (so bad input costs one line and exit code 2, not a crashed job)."""

import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from meshscale.cost import predict
from meshscale.data.indexed import is_indexed
from meshscale.errors import UserError
from meshscale.models import hf_weights
from meshscale.outputs import check_directory, check_new_file
from meshscale.parallel.precision import RECIPES, compile_refusal, fp8_refusal
from meshscale.runtime.loop.data import BYTE_VOCAB, check_tokens, load_tokens
from meshscale.runtime.measure import live
from meshscale.runtime.resilience.checkpoint import check_dir, check_same_run, identity, read_manifest
from meshscale.specs.cluster import is_fp8, load_cluster
from meshscale.specs.layout import Layout, check_against, check_trainable
from meshscale.specs.loading import build, read_mapping
from meshscale.specs.model import ModelSpec, load_model


@dataclass(frozen=True)
class TrainConfig:
    model: str = "tiny"
    init_from: str | None = None  # a Hugging Face save_pretrained directory: its model and weights start the run
    layout: str = ""  # empty: dp over every process
    nproc: int = 1  # processes on this node
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = ""  # the host of node 0 (needed with nnodes > 1)
    master_port: int = 29500
    steps: int = 20
    global_batch: int = 8  # sequences per optimizer step
    seq: int = 0  # 0: the model's own sequence length
    seed: int = 0
    precision: str = "fp32"
    compile: bool = False  # torch.compile each transformer block
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 5
    weight_decay: float = 0.1
    clip: float = 1.0
    bucket_mb: float = 25.0  # DDP / ZeRO gradient bucket size: torch DDP's bucket_cap_mb (and the cost model's)
    data: str | None = None  # None: the Python standard library's sources
    document_mask: bool = False  # attention within each document, positions from each one's start
    val_batches: int = 4
    log_every: int = 1  # print every n-th step (the JSONL file gets them all)
    metrics_out: str | None = None
    trace: str | None = None  # Chrome-trace JSON of the last step's pipeline runs
    tensorboard: str | None = None  # TensorBoard event files, measured beside predicted (rank 0)
    wandb: str | None = None  # a W&B run in this folder, offline unless WANDB_MODE says otherwise (rank 0)
    profile: str | None = None  # steps traced by torch.profiler, e.g. "3", "2,5", "2-4"
    profile_dir: str = "profile"  # where each traced step's Chrome trace goes, one file per rank
    memory_snapshot: str | None = None  # CUDA: steps whose allocations are recorded, e.g. "3" or "2-4"
    memory_snapshot_dir: str = "memory"  # where each rank's snapshot pickle goes (pytorch.org/memory_viz reads it)
    plot: str | None = None  # PNG: loss and measured vs predicted step time, drawn by rank 0 at the end
    overwrite: bool = False
    predict: bool = False
    cluster: str = "local-cpu"  # the ClusterSpec --predict uses (a preset or a `meshscale calibrate` file)
    device: str = "auto"  # auto: cuda when available, else cpu
    timeout: float = 300.0  # seconds without progress before a hang ends the job
    save_timeout: float = 0.0  # the same for a checkpoint save (0: derived, watchdog.Sections)
    load_timeout: float = 0.0  # ... a checkpoint load
    eval_timeout: float = 0.0  # ... the final evaluation
    on_anomaly: str = "stop"  # stop, skip or rollback, on a non-finite or spiking loss or gradient (rollback: SDC too)
    spike_sigma: float = 6.0  # spike rule: std above the trailing mean (0: off)
    sdc_check_every: int = 50  # cross-replica fingerprint check every N steps (0: off)
    replay_anomalies: bool = False  # re-run an anomalous step from a snapshot to classify it
    # checkpoints and restarts (runtime/resilience/checkpoint.py)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50  # steps between saves; the last step is always saved
    keep: int = 3  # complete checkpoints kept
    async_save: bool = False  # DCP async_save: staged in host memory, written and committed by a thread
    max_restarts: int = 0  # local launcher: restarts of the whole worker group after a failure
    max_no_progress_restarts: int = 3  # restarts in a row from the same checkpoint before the run stops
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
    verified: str | None = None  # the checkpoint whose checksums resolve() checked (checkpoint.identity)


def world_from_env() -> int | None:
    """The process count when launched by an outer torchrun, else None."""
    return int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ and "RANK" in os.environ else None


def resolve(cfg: TrainConfig, world: int) -> Resolved:
    """Every pre-launch check. `world` is the number of processes that will run the job."""

    if cfg.precision == "int8":
        raise UserError("--precision int8 is AQT's int8 training, which MaxText runs on TPUs: meshscale plans it "
                        "(predict/plan --precision int8, --emit maxtext) but trains in torch; use --precision bf16")
    if cfg.precision not in RECIPES:
        raise UserError(f"--precision must be one of {', '.join(RECIPES)}, got {cfg.precision!r}")
    for key in ("steps", "global_batch", "nproc", "nnodes", "log_every"):
        if getattr(cfg, key) < 1:
            raise UserError(f"--{key.replace('_', '-')} must be at least 1, got {getattr(cfg, key)}")
    _check_optimizer(cfg)
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
    if cfg.data is not None:
        check_tokens(load_tokens(cfg.data), spec.vocab, spec.seq, f"--data {cfg.data}")
    elif spec.vocab < BYTE_VOCAB:
        raise UserError(f"model {spec.name}: vocab {spec.vocab} is smaller than the {BYTE_VOCAB} byte values of the "
                        "default text (Python's standard library, read as bytes); give the model vocab >= "
                        f"{BYTE_VOCAB}, or pass --data of tokens it can embed")
    if cfg.document_mask:
        _check_document_mask(cfg, layout)
    if cfg.metrics_out:
        check_directory("--metrics-out", cfg.metrics_out)
    # rank 0 writes the plot and the trace: under an outer torchrun only it checks they are new
    replaceable = cfg.overwrite or os.environ.get("RANK", "0") != "0"
    if cfg.plot:
        check_new_file("--plot", cfg.plot, replaceable)
    if cfg.trace:
        if layout.pp == 1:
            raise UserError("--trace records the pipeline's forward/backward runs; it needs a layout with pp > 1")
        check_new_file("--trace", cfg.trace, replaceable)
    if cfg.predict:
        load_cluster(cfg.cluster)  # a bad --cluster file is one line now, not an error after training
    if cfg.timeout <= 0:
        raise UserError(f"--timeout must be a positive number of seconds, got {cfg.timeout:g}")
    for key in ("save_timeout", "load_timeout", "eval_timeout"):
        if getattr(cfg, key) < 0:
            raise UserError(f"--{key.replace('_', '-')} must be 0 (derived from the run's own durations) or a "
                            f"positive number of seconds, got {getattr(cfg, key):g}")
    if cfg.on_anomaly not in ("stop", "skip", "rollback"):
        raise UserError(f"--on-anomaly must be stop, skip or rollback, got {cfg.on_anomaly!r}")
    if cfg.on_anomaly == "rollback" and not cfg.checkpoint_dir:
        raise UserError("--on-anomaly rollback reloads the newest checkpoint; give --checkpoint-dir DIR")
    for key in ("spike_sigma", "sdc_check_every"):
        if getattr(cfg, key) < 0:
            raise UserError(f"--{key.replace('_', '-')} must be 0 (off) or positive, got {getattr(cfg, key)}")
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda, got {cfg.device!r}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        build = "has no CUDA" if torch.version.cuda is None else "sees no GPU"
        raise UserError(f"--device cuda: this torch ({torch.__version__}) {build}; use --device cpu (or auto)")
    if is_fp8(cfg.precision) and (why := fp8_refusal(cfg.precision, _device_type(cfg), layout.tp)):
        raise UserError(why)
    if cfg.compile and (why := compile_refusal(_device_type(cfg))):
        raise UserError(why)
    _check_nodes(cfg)
    check_fits(cfg, spec, layout)
    live.check(cfg, world)
    verified = _check_checkpoints(cfg, spec, layout)
    _check_metrics_out(cfg, verified is not None)
    return Resolved(cfg, spec, layout, verified)


def _check_optimizer(cfg: TrainConfig) -> None:
    """The schedule, AdamW, clipping and bucket numbers, before torch's own ValueError would end a worker."""
    if not (math.isfinite(cfg.lr) and cfg.lr >= 0):  # 0 is a run that must leave the weights as they were
        raise UserError(f"--lr must be 0 or a positive number, got {cfg.lr:g}")
    if not (math.isfinite(cfg.min_lr) and 0 <= cfg.min_lr <= cfg.lr):
        raise UserError(f"--min-lr must be between 0 and --lr ({cfg.lr:g}), the end of the cosine decay; "
                        f"got {cfg.min_lr:g}")
    for key in ("weight_decay", "clip"):
        value = getattr(cfg, key)
        if not (math.isfinite(value) and value >= 0):
            raise UserError(f"--{key.replace('_', '-')} must be 0 (off) or positive, got {value:g}")
    if not (math.isfinite(cfg.bucket_mb) and cfg.bucket_mb > 0):
        raise UserError(f"--bucket-mb must be a positive size in MiB (torch DDP's default 25), got {cfg.bucket_mb:g}")
    for key in ("warmup", "val_batches"):
        if getattr(cfg, key) < 0:
            raise UserError(f"--{key.replace('_', '-')} must be 0 or more, got {getattr(cfg, key)}")


def _check_document_mask(cfg: TrainConfig, layout: Layout) -> None:
    if cfg.data is None or not is_indexed(cfg.data):
        raise UserError("--document-mask needs documents: pass --data PREFIX of an indexed dataset "
                        "(meshscale data prepare writes one)")
    if layout.pp > 1 or layout.cp > 1:
        raise UserError(f"--document-mask runs without pipeline or context parallelism (layout has pp={layout.pp}, "
                        f"cp={layout.cp}): the pipeline's stages and the CP ring pass no per-token documents")


def _check_nodes(cfg: TrainConfig) -> None:
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise UserError(f"--node-rank must be in 0..{cfg.nnodes - 1} for --nnodes {cfg.nnodes}, got {cfg.node_rank}")
    if cfg.nnodes > 1 and not cfg.master_addr:
        raise UserError("--nnodes > 1 needs --master-addr, the address of node 0 that every node can reach")
    if not 0 < cfg.master_port < 65536:
        raise UserError(f"--master-port must be a TCP port (1-65535), got {cfg.master_port}")


def local_processes(cfg: TrainConfig) -> int:
    """The processes of this run on this host (they share its cores and memory)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", cfg.nproc))


def check_fits(cfg: TrainConfig, spec: ModelSpec, layout: Layout) -> None:
    """Refuse, before anything is built, a layout whose predicted memory per rank (the cost model's) exceeds
    what a rank has: the GPU's memory, or on CPU the host's available memory shared by its local processes."""
    need = predict(spec, load_cluster("local-cpu"), layout, cfg.global_batch, cfg.precision).memory_per_device_bytes
    gpu = _device_type(cfg) == "cuda"
    if gpu:
        have, where = torch.cuda.get_device_properties(0).total_memory, "the GPU's memory"
    else:
        procs, host = local_processes(cfg), available_host_bytes()
        have, where = host // procs, f"this host's available {host / 2**30:.1f} GiB shared by {procs} local process(es)"
    if need["total"] <= have:
        return
    state = need["params"] + need["grads"] + need["optimizer"] + need.get("gathered", 0.0)
    if state > have:
        fix = ("shard the training state over more devices: zero=3 (fsdp=N), tp or pp" if gpu else
               "this host cannot hold it; run on more hosts (--nnodes) with a sharded layout (fsdp=N, tp, pp) or "
               "pick a smaller model")
    else:
        fix = "lower mbs or --seq, or recompute activations (recompute=full)"
    raise UserError(f"{spec.name} under {layout} needs {need['total'] / 2**30:.1f} GiB per rank (cost model: "
                    f"{state / 2**30:.1f} GiB of weights, gradients and optimizer state, "
                    "FSDP's gathered units included, "
                    f"{need['activations'] / 2**30:.1f} GiB of activations), more than the {have / 2**30:.1f} GiB "
                    f"a rank has ({where}); {fix}")


def _device_type(cfg: TrainConfig) -> str:
    return "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"


def available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


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


def _check_checkpoints(cfg: TrainConfig, spec: ModelSpec, layout: Layout) -> str | None:
    """The checkpoint options, and the newest checkpoint in --checkpoint-dir (compatible, intact): its
    identity when the run will resume from it (the workers need not hash it again), else None."""

    if cfg.checkpoint_every < 1:
        raise UserError(f"--checkpoint-every must be at least 1 step, got {cfg.checkpoint_every}")
    if cfg.keep < 2:
        raise UserError(f"--keep must be at least 2, got {cfg.keep}: the newest checkpoint may still be being "
                        "written when older ones are deleted")
    if cfg.max_restarts < 0:
        raise UserError(f"--max-restarts must be 0 or more, got {cfg.max_restarts}")
    if cfg.max_restarts and not cfg.checkpoint_dir:
        raise UserError("--max-restarts resumes from checkpoints; pass --checkpoint-dir DIR too")
    if cfg.max_no_progress_restarts < 0:
        raise UserError(f"--max-no-progress-restarts must be 0 or more, got {cfg.max_no_progress_restarts}")
    if cfg.max_rollbacks < 1:
        raise UserError(f"--max-rollbacks must be at least 1, got {cfg.max_rollbacks}")
    if cfg.time_limit < 0:
        raise UserError(f"--time-limit must be 0 (none) or a positive number of seconds, got {cfg.time_limit:g}")
    if cfg.time_limit and not cfg.checkpoint_dir:
        raise UserError("--time-limit saves a checkpoint to resume from before it stops; pass --checkpoint-dir DIR")
    newest = check_dir(cfg.checkpoint_dir, spec, layout, cfg.precision) if cfg.checkpoint_dir else None
    if newest and newest[0] >= cfg.steps:
        raise UserError(f"checkpoint {newest[1]} already reached step {newest[0]} of --steps {cfg.steps}; raise "
                        "--steps to train on (with --allow-config-change), or use a new --checkpoint-dir")
    if newest and not cfg.allow_config_change:
        check_same_run(newest[1], read_manifest(newest[1]), cfg, spec)
    return identity(newest[1]) if newest else None


def _check_metrics_out(cfg: TrainConfig, resuming: bool) -> None:
    # Under an outer torchrun only rank 0 checks: it is the one that creates the file. A resumed run
    # continues the file of the run it resumes.
    if (cfg.metrics_out and os.environ.get("RANK", "0") == "0" and Path(cfg.metrics_out).exists()
            and not cfg.overwrite and not resuming):
        raise UserError(f"--metrics-out {cfg.metrics_out} already exists; choose a new file or pass --overwrite")


def config_fields() -> list[str]:
    return [f.name for f in fields(TrainConfig)]

