"""`meshscale train`: check everything, then run here, as N local processes, or as one worker of an
outer torchrun."""

import os
import sys
from contextlib import nullcontext
from typing import get_type_hints

from meshscale.runtime.loop.config import TrainConfig, config_fields, load_config, resolve, world_from_env
from meshscale.specs.model import is_hf_model

_HELP = {
    "config": "TOML file of train options (top level or a [train] table); flags override it",
    "model": "model preset, ModelSpec file, or Hugging Face config.json / model directory (default tiny; with "
             "--init-from, its model)",
    "init_from": "start from the weights of this Hugging Face model directory (save_pretrained's safetensors, "
                 "sharded or not); each rank reads only its pieces",
    "layout": "layout string, e.g. dp=2,zero=2 or fsdp=2 (dp fills the processes when left out)",
    "nproc": "processes to start on this node through torch.distributed's launcher (default 1)",
    "nnodes": "nodes of the run (default 1); run the same command on each with its --node-rank",
    "node_rank": "this node's index, 0..nnodes-1 (node 0 hosts the rendezvous)",
    "master_addr": "address of node 0, reachable from every node (needed with --nnodes > 1)",
    "master_port": "TCP port of the rendezvous on node 0 (default 29500)",
    "steps": "optimizer steps", "global_batch": "sequences per optimizer step",
    "seq": "sequence length (default: the model's)", "seed": "initialisation and data seed",
    "precision": "fp32; bf16 (bf16 compute, fp32 master weights and gradient reductions); bf16-pure (bf16 "
                 "weights, gradients and AdamW state); fp8 (bf16 + torchao float8 linears, GPUs of compute "
                 "capability 8.9+); mxfp8 (bf16 + torchao block-scaled float8 linears, Blackwell GPUs)",
    "lr": "peak learning rate", "min_lr": "final learning rate of the cosine decay",
    "warmup": "linear warm-up steps", "weight_decay": "AdamW weight decay", "clip": "gradient-norm clip (0: off)",
    "bucket_mb": "gradient bucket size in MiB (DDP, ZeRO; default 25, torch DDP's)",
    "data": "indexed dataset PREFIX (PREFIX.bin + PREFIX.idx from `meshscale data prepare`), text file, directory "
            "of text files, or .bin of raw token ids (default: Python's standard library)",
    "val_batches": "global batches of held-out text for the final validation loss",
    "log_every": "print every n-th step",
    "metrics_out": "write one JSON object per step to this new file",
    "trace": "write the last step's pipeline forward/backward runs as Chrome-trace JSON to this new file "
             "(pp > 1) and print the measured bubble beside the predicted one",
    "tensorboard": "write TensorBoard event files here, each step's measured values beside the prediction",
    "wandb": "write a Weights & Biases run in this folder (offline unless WANDB_MODE says otherwise), measured "
             "beside predicted",
    "profile": "trace these steps with torch.profiler, e.g. 3, 2,5 or 2-4 (Chrome traces in --profile-dir)",
    "profile_dir": "folder of --profile's traces, one file per step and rank (default ./profile)",
    "memory_snapshot": "on CUDA, record the caching allocator's history from the first to the last of these steps "
                       "(e.g. 3 or 2-4) and write a snapshot per rank for pytorch.org/memory_viz",
    "memory_snapshot_dir": "folder of --memory-snapshot's pickles, one per rank (default ./memory)",
    "plot": "draw the loss and the measured vs predicted step time as a PNG in this new file",
    "device": "auto, cpu or cuda",
    "cluster": "ClusterSpec that --predict uses: a preset or a file from `meshscale calibrate` (default local-cpu)",
    "timeout": "seconds a rank may make no progress before the job ends naming the stuck rank (default 300)",
    "save_timeout": "seconds a checkpoint save may take (default 0: the larger of --timeout, 600 and 5x the longest "
                    "save so far)",
    "load_timeout": "seconds a checkpoint load may take (default 0: derived as for --save-timeout)",
    "eval_timeout": "seconds the final evaluation may take (default 0: derived as for --save-timeout)",
    "on_anomaly": "stop (default), skip the optimizer step, or rollback to the newest checkpoint on a non-finite "
                  "or spiking loss or gradient (rollback also on silent data corruption)",
    "spike_sigma": "a loss whose log is this many std above its mean over the last "
                   "100 healthy steps is a spike (default 6; 0: off)",
    "sdc_check_every": "compare replicas' bit fingerprints every N steps (default 50; 0: off)",
    "checkpoint_dir": "save checkpoints here (DCP, any layout reloads them) and resume from the newest one",
    "checkpoint_every": "steps between checkpoints (default 50; the last step is always saved)",
    "keep": "complete checkpoints to keep, at least 2 (default 3)",
    "max_restarts": "restart all local workers this many times after a failure, resuming from the newest "
                    "checkpoint (needs --checkpoint-dir; under an outer torchrun use torchrun --max-restarts)",
    "max_no_progress_restarts": "stop (exit 2) after this many restarts in a row that resumed from the same "
                                "checkpoint as the attempt before (default 3)",
    "max_rollbacks": "--on-anomaly rollback reloads one checkpoint at most this many times, then stops (default 3)",
    "time_limit": "seconds of training, then every rank finishes its step, saves and exits with code 75 "
                  "(as on SIGTERM/SIGINT; rerun to resume; needs --checkpoint-dir)",
    "overwrite": "allow replacing --metrics-out, --trace and --plot",
    "predict": "print the cost model's prediction beside what was measured",
    "document_mask": "attention stays within each document and positions restart at each one "
                     "(needs an indexed dataset; not with pp or cp)",
    "compile": "torch.compile each transformer block (inductor; on CPU it needs a C++ compiler)",
    "replay_anomalies": "re-run an anomalous step from a pre-step snapshot: transient or persistent",
    "async_save": "save checkpoints with DCP's async_save: the step waits only for a copy of the state "
                  "in host memory (one more copy of it there); a thread writes and commits it",
    "allow_config_change": "resume although the seed, batch, sequence length, data or LR schedule differ from "
                           "the checkpoint's",
}


def add_arguments(parser) -> None:
    """One flag per TrainConfig field, typed as the field is: a bool is a switch, int and float parse as such,
    everything else is a string the config checks."""
    types = get_type_hints(TrainConfig)
    for name in config_fields():
        flag, kind = "--" + name.replace("_", "-"), types[name]
        if kind is bool:
            parser.add_argument(flag, action="store_true", default=None, help=_HELP.get(name))
        else:
            parser.add_argument(flag, type=kind if kind in (int, float) else str, default=None, help=_HELP.get(name))
    parser.add_argument("--config", default=None, help=_HELP["config"])


def _note_seq(cfg, spec) -> None:
    """A Hugging Face config's own length is its max_position_embeddings: say so when training at it."""
    if not cfg.seq and is_hf_model(cfg.init_from or cfg.model):
        print(f"meshscale: note: sequence length {spec.seq:,} tokens, the config's max_position_embeddings; "
              "pass --seq to train at another", file=sys.stderr)


def run(args) -> int:
    """0 when the run finished; 75 (preemption.EXIT_PREEMPTED) when a signal or --time-limit stopped it
    after saving, to be resumed by the same command."""
    from meshscale.runtime.loop import launch
    from meshscale.runtime.resilience import faults
    from meshscale.runtime.resilience.lock import refuse_if_held
    from meshscale.runtime.resilience.preemption import EXIT_PREEMPTED, Preempted, set_deadline
    from meshscale.runtime.resilience.restarts import GaveUp

    faults.from_env()  # a malformed MESHSCALE_FAULT is bad input: one line before any process starts
    overrides = {name: getattr(args, name, None) for name in config_fields()}
    cfg = load_config(args.config, overrides)
    outer = world_from_env()
    rank0 = os.environ.get("RANK") == "0"
    # the process that holds the directory's lock for the run: rank 0 under an outer torchrun, else the launcher
    # (node 0's under --nnodes); it checks the lock before anything reads the directory
    held = cfg.checkpoint_dir if (rank0 if outer is not None else cfg.node_rank == 0) else None
    if held:
        refuse_if_held(held)
    if outer is not None:  # one worker of an outer torchrun: every process checks, then trains
        checked = resolve(cfg, outer)
        try:
            with _locked(held):
                launch.run_here(checked)
        except Preempted as e:
            launch.say_stopped(str(e), rank0)
            launch.exit_worker(EXIT_PREEMPTED)
        except GaveUp as e:  # exit 0: torchrun would restart a failed worker, to fail the same way again
            launch.say_stopped(str(e), rank0)
        launch.exit_worker(0)
    world = cfg.nproc * cfg.nnodes
    checked = resolve(cfg, world)
    _note_seq(cfg, checked.spec)
    set_deadline(cfg.time_limit)
    with _locked(held):  # until the run ends
        if world > 1:
            return launch.launch_local(checked)
        try:
            launch.run_here(checked)
        except Preempted as e:
            launch.say_stopped(str(e))
            return EXIT_PREEMPTED
    return 0


def _locked(checkpoint_dir: str | None):
    from meshscale.runtime.resilience.lock import DirLock

    return DirLock(checkpoint_dir) if checkpoint_dir else nullcontext()
