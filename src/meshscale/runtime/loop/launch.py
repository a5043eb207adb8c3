"""Start a checked run: in this process (one process), as N local processes through torch's own
launcher (torch.distributed.launcher, what `torchrun` runs), or as one worker of an outer torchrun.

A worker that fails writes its error to torchelastic's per-worker error file and exits; the launcher
then stops the other workers (no rank is left hanging in a collective) and we print the error of the
rank that failed first, once.

Workers die with their launcher: each asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG),
so a launcher killed with SIGKILL leaves no worker training unsupervised. A SIGTERM/SIGINT to the launcher
reaches the workers through torchelastic (once: they run in their own sessions), which waits for them to
finish their step and save (runtime/resilience/preemption.py).
"""

import ctypes
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid

import torch

from meshscale.errors import UserError
from meshscale.runtime.loop.config import Resolved, local_processes
from meshscale.runtime.resilience.preemption import (
    EXIT_PREEMPTED,
    FORWARDED,
    PREEMPT_ENV,
    SIGNALS,
    STATUS_ENV,
    Preempted,
    launcher_signal,
    leave_status,
    read_status,
)
from meshscale.runtime.resilience.restarts import EXIT_GAVE_UP, Failures, GaveUp, first_cause, leave_error
from meshscale.runtime.resilience.watchdog import Sections

_LAUNCHER_ENV = "MESHSCALE_LAUNCHER_PID"
_RAISED_EXIT_DELAY_S = 1.0  # 10 of the launcher's 0.1 s polls


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
                                timeout=timedelta(seconds=2 * Sections.longest_possible(run.config)))
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
    """This process's intra-op threads: OMP_NUM_THREADS where it is set (by the user, by torchrun, or by our
    launcher for its workers), else its share of the cores it may run on. torch's default is every core,
    which under N local processes (or other load) oversubscribes them: a 2-thread OpenMP region whose second
    thread is descheduled waits for it, and small kernels then take milliseconds instead of microseconds."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
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


def say_stopped(line: str, rank0: bool = True) -> None:
    """The one line of a run a signal or --time-limit stopped (preemption.Preempted), from rank 0 only."""
    if rank0:
        print(f"meshscale: {line}", file=sys.stderr, flush=True)


PORT_RACE_TRIES = 3  # launches of one node's group when its store's port was taken before rank 0 bound it


def launch_local(run: Resolved) -> int:
    """Start run.config.nproc local workers with torch.distributed's elastic launcher and wait for them: a c10d
    rendezvous on a free port on one node; with --nnodes N, node --node-rank's share of a static rendezvous at
    --master-addr:--master-port (node 0 hosts it), as `torchrun --rdzv-backend static` does. With
    --max-restarts R, when a worker fails the launcher stops them all and starts the group again, up to R
    times; each new group resumes from the newest checkpoint, and more than --max-no-progress-restarts
    restarts in a row from the same one end the run (runtime/resilience/restarts.py); each restart is
    announced in one line naming the failure that caused it. On one node, a group whose store port another
    process took before rank 0 bound it (EADDRINUSE; nothing ran) is launched again, up to PORT_RACE_TRIES. Returns
    0, EXIT_PREEMPTED when a signal or --time-limit stopped the workers after they saved, or EXIT_GAVE_UP. A second
    signal ends the launcher at once (exit 128 + the signal's number), and its workers with it."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", str(owned_cores(run.config.nproc)))  # N workers share the cores
    # By default the workers reuse the rendezvous' TCP store as their process-group store; after a worker
    # is SIGKILLed the restarted group then fails to connect or hangs (torch 2.13, gloo). A store of their
    # own per attempt avoids it.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # Rank 0 hosts that store: once it exits on an error, the others' store clients print C++ warnings
    # ("recvValue failed ... Connection reset by peer") before the launcher stops them, burying the one line
    # that says what went wrong. Failures reach the user through the error files instead.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # we report failures and signals ourselves; torchelastic's modules set their loggers' levels one by one
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="meshscale-") as tmp:
        spec_file = os.path.join(tmp, "run.pkl")
        os.environ[STATUS_ENV] = status = os.path.join(tmp, "status.json")
        os.environ[_LAUNCHER_ENV] = str(os.getpid())
        os.environ[PREEMPT_ENV] = marker = os.path.join(tmp, "preempting")
        ours = "SIGHUP,SIGQUIT"  # torchelastic's handler for these; SIGTERM and SIGINT are ours
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = ours  # what torch reads where LaunchConfig cannot say it
        handled = {"signals_to_handle": ours} if "signals_to_handle" in LaunchConfig.__dataclass_fields__ else {}
        for s in SIGNALS:
            signal.signal(s, lambda signum, frame: _preempting(marker, signum, SignalException))
        with open(spec_file, "wb") as f:
            pickle.dump(run, f)
        cfg = run.config
        logs = os.path.join(tmp, "logs")  # the workers' error files, read to say why a group failed
        Failures(logs, cfg.node_rank * cfg.nproc).install()
        rdzv = (dict(rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id=str(uuid.uuid4())) if cfg.nnodes == 1
                else dict(rdzv_backend="static", rdzv_endpoint=f"{cfg.master_addr}:{cfg.master_port}",
                          rdzv_configs={"rank": cfg.node_rank}, run_id=f"meshscale-{cfg.master_port}"))
        config = LaunchConfig(min_nodes=cfg.nnodes, max_nodes=cfg.nnodes, nproc_per_node=cfg.nproc,
                              max_restarts=cfg.max_restarts, monitor_interval=0.1,
                              logs_specs=DefaultLogsSpecs(log_dir=logs), **rdzv, **handled)
        try:
            for attempt in range(1, PORT_RACE_TRIES + 1):
                try:
                    elastic_launch(config, sys.executable)("-m", "meshscale.runtime.loop.launch", spec_file)
                    break
                except ChildFailedError as e:
                    why = first_failure(e)
                    # One node: torch picks the group's store port free, then closes it until rank 0 listens;
                    # another process can take it in between. No group formed, so nothing ran: start again.
                    if not (cfg.nnodes == 1 and "EADDRINUSE" in why and attempt < PORT_RACE_TRIES):
                        raise UserError(why) from None
        except SignalException as e:
            if read_status(status) is None:  # a second signal, or workers that could not save in time
                name = launcher_signal() if e.sigval == FORWARDED else e.sigval.name
                print(f"meshscale: {name}: stopped at once; nothing saved since the last checkpoint",
                      file=sys.stderr, flush=True)
                # at once: the interpreter's teardown after torchelastic was interrupted took 15-20 s here; the
                # workers end with this process (PR_SET_PDEATHSIG), the kernel releases the directory's lock
                shutil.rmtree(tmp, ignore_errors=True)
                os._exit(128 + getattr(signal, name))
        stopped = read_status(status)
        if stopped is not None:
            say_stopped(stopped[0])
            return stopped[1]
    return 0


def _preempting(marker: str, signum: int, raised) -> None:
    """The launcher's SIGTERM/SIGINT ends the agent's run as torchelastic's own handler does; the agent then
    sends the exception's signal to the workers and waits for them. The first is passed on as FORWARDED (a
    preemption: finish the step and save), with its name in `marker`; a second one as itself (SIGTERM's
    default action ends the workers at once)."""
    if os.path.exists(marker):
        raise raised(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
    with open(marker, "w") as f:
        f.write(signal.Signals(signum).name)
    raise raised(f"Process {os.getpid()} got signal: {signum}", sigval=FORWARDED)


def first_failure(error) -> str:
    """The failure of the rank that failed first (restarts.first_cause), not of the ranks that died after it
    because a peer vanished: its signal, or its whole error message."""
    rank, failure = error.get_first_failure()
    errors = {r: f.error_file_data for r, f in error.failures.items() if isinstance(f.error_file_data, dict)}
    return first_cause(rank, failure.exitcode, errors, whole=True)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the launcher) dies, and die now if it already has
    (it died before the request: this process was handed to another parent)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the launcher's own shutdown is all there is
        return
    if str(os.getppid()) != os.environ.get(_LAUNCHER_ENV, str(os.getppid())):
        os._exit(1)


def _worker(spec_file: str) -> int:
    die_with_parent()
    with open(spec_file, "rb") as f:
        run = pickle.load(f)
    try:
        run_here(run)
        return 0
    except (Preempted, GaveUp) as e:  # exit 0: a failure would be restarted; the launcher reports the line
        if os.environ.get("RANK") == "0":
            leave_status(str(e), EXIT_PREEMPTED if isinstance(e, Preempted) else EXIT_GAVE_UP)
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure must reach the launcher, once
        message = str(e) if isinstance(e, UserError) else traceback.format_exc().rstrip()
        raised = time.time()
        if os.environ.get("TORCHELASTIC_ERROR_FILE"):
            # A rank whose peer was killed mid-collective raises at once; were its error there as fast, the
            # launcher could take it for the cause. A peer that died first is seen meanwhile, and this rank is
            # stopped before it writes anything (restarts.first_cause).
            time.sleep(_RAISED_EXIT_DELAY_S)
        leave_error(message, raised)
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
