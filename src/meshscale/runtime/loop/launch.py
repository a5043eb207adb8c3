"""Start a checked run: in this process (one process), as N local processes through torch's own
launcher (torch.distributed.launcher, what `torchrun` runs), or as one worker of an outer torchrun.

A worker that fails writes its error to torchelastic's per-worker error file and exits; the launcher
then stops the other workers (no rank is left hanging in a collective) and we print the error of the
rank that failed first, once.
"""

import json
import logging
import os
import pickle
import sys
import tempfile
import time
import traceback
import uuid

import torch

from meshscale.errors import UserError
from meshscale.runtime.loop.config import Resolved, local_processes


def run_here(run: Resolved) -> dict:
    """Run in this process: alone, or as one worker under an outer torchrun (RANK/WORLD_SIZE set)."""
    from datetime import timedelta

    import torch.distributed as dist

    # the trainer (and the parallel wrappers under it) load in the processes that train, not in the launcher
    from meshscale.runtime.loop.trainer import pick_device, train
    from meshscale.runtime.measure.metrics import predicted, print_report

    device = pick_device(run.config.device, int(os.environ.get("LOCAL_RANK", 0)))
    torch.set_num_threads(owned_cores(local_processes(run.config)))
    if run.layout.devices > 1 and not dist.is_initialized():
        # a backstop behind the trainer's watchdog (runtime/resilience/watchdog.py), which names the stuck rank first
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=2 * run.config.timeout))
    try:
        result = train(run, device)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print_report(run, result)
            if run.config.plot:
                from meshscale.plots import training_plot
                training_plot(result["rows"], predicted(run)["step_time_s"], run.config.plot)
        return result
    finally:
        if dist.is_initialized():
            _shut_down()


def owned_cores(processes: int) -> int:
    """This process's share of the cores it may run on: torch's default intra-op thread count is every core,
    which under N local processes (or other load) oversubscribes them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // processes)


def _shut_down() -> None:
    """Destroy the process groups (NCCL communicators are released, gloo stops taking work) after dropping
    our own references to them (the cached meshes; cycles, by a collection). torch may still hold some
    (below), so a worker then ends through `exit_worker`."""
    import gc

    import torch.distributed as dist

    from meshscale.parallel.mesh import forget_meshes

    forget_meshes()
    gc.collect()
    dist.destroy_process_group()


def launch_local(run: Resolved) -> None:
    """Start run.config.nproc local workers with torch.distributed's elastic launcher and wait for them: a c10d
    rendezvous on a free port on one node; with --nnodes N, node --node-rank's share of a static rendezvous at
    --master-addr:--master-port (node 0 hosts it), as `torchrun --rdzv-backend static` does. With --max-restarts R, when a worker fails the launcher stops them all
    and starts the group again, up to R times; each new group resumes from the newest checkpoint."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # N workers share the cores
    # By default the workers reuse the rendezvous' TCP store as their process-group store; after a worker
    # is SIGKILLed the restarted group then fails to connect or hangs (torch 2.13, gloo). A store of their
    # own per attempt avoids it.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # Rank 0 hosts that store: once it exits on an error, the others' store clients print C++ warnings
    # ("recvValue failed ... Connection reset by peer") before the launcher stops them, burying the one line
    # that says what went wrong. Failures reach the user through the error files instead.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # we report failures ourselves
    with tempfile.TemporaryDirectory(prefix="meshscale-") as tmp:
        spec_file = os.path.join(tmp, "run.pkl")
        with open(spec_file, "wb") as f:
            pickle.dump(run, f)
        cfg = run.config
        rdzv = (dict(rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id=str(uuid.uuid4())) if cfg.nnodes == 1
                else dict(rdzv_backend="static", rdzv_endpoint=f"{cfg.master_addr}:{cfg.master_port}",
                          rdzv_configs={"rank": cfg.node_rank}, run_id=f"meshscale-{cfg.master_port}"))
        config = LaunchConfig(min_nodes=cfg.nnodes, max_nodes=cfg.nnodes, nproc_per_node=cfg.nproc,
                              max_restarts=cfg.max_restarts, monitor_interval=0.1, **rdzv)
        try:
            elastic_launch(config, sys.executable)("-m", "meshscale.runtime.loop.launch", spec_file)
        except ChildFailedError as e:
            raise UserError(first_failure(e)) from None


def first_failure(error) -> str:
    """The message of the rank that failed first (by our fine-grained timestamp), not of the ranks that
    died after it because a peer vanished."""
    ours = [(f.error_file_data.get("meshscale_t", float("inf")), rank, f) for rank, f in error.failures.items()
            if isinstance(f.error_file_data, dict)]
    if ours:
        _, rank, failure = min(ours, key=lambda x: (x[0], x[1]))
    else:
        rank, failure = error.get_first_failure()
    message = failure.message if isinstance(failure.message, str) else json.dumps(failure.message)
    return f"rank {rank} failed: {message}"


def _worker(spec_file: str) -> int:
    with open(spec_file, "rb") as f:
        run = pickle.load(f)
    try:
        run_here(run)
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure must reach the launcher, once
        message = str(e) if isinstance(e, UserError) else traceback.format_exc().rstrip()
        error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if error_file:
            with open(error_file, "w") as f:
                json.dump({"message": message, "timestamp": int(time.time()), "meshscale_t": time.time()}, f)
        else:
            print(f"meshscale: error: {message}", file=sys.stderr)
        return 1


def exit_worker(code: int) -> "NoReturn":  # noqa: F821
    """End a worker whose work is done without the interpreter's finalisation. torch keeps process groups
    referenced after destroy_process_group (DTensor's sharding cache holds meshes, which hold their groups;
    torch.distributed.fsdp's ShardedGradScaler holds the world group as a default argument), so their gloo
    threads still run while the interpreter tears down, and now and then that aborts a process that has
    finished ("terminate called without an active exception", SIGABRT: a non-zero exit for a good run).
    Every file a worker writes is closed by then; the standard streams and log handlers are flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_worker(_worker(sys.argv[1]))
