"""Run a function on N real gloo ranks (spawned CPU processes) and collect each rank's result.

Spawning is the expensive part of the suite, so a test passes one function that runs many cases
inside a single process group, and returns what the parent should assert on.
"""

import multiprocessing as mp
import os
import tempfile
import traceback

_TIMEOUT_S = 600


def _entry(rank, world, init_file, fn, args, queue):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        queue.put((rank, True, fn(rank, world, *args)))
    except BaseException:  # report every failure to the parent instead of hanging it
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, fn, *args, timeout: float = _TIMEOUT_S) -> list:
    """fn(rank, world, *args) runs on every rank after init_process_group; returns [result per rank].
    `fn` must be importable (defined at module level of a test module)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "pg")
        procs = [ctx.Process(target=_entry, args=(r, world, init_file, fn, args, queue)) for r in range(world)]
        for p in procs:
            p.start()
        results, errors = {}, []
        try:
            for _ in range(world):
                rank, ok, value = queue.get(timeout=timeout)
                if ok:
                    results[rank] = value
                else:
                    errors.append(f"rank {rank} failed:\n{value}")
                    break  # one failure: the others may be blocked in a collective
        finally:
            for p in procs:
                p.join(timeout=5 if errors else 30)
                if p.is_alive():
                    p.kill()
        if errors:
            raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]
