"""Run a function on N real gloo ranks (spawned CPU processes) and collect each rank's result.

Spawning is the expensive part of the suite (a rank spends ~5 s of CPU importing torch and the trainer
before it runs anything), so the ranks of a world size outlive a call: `run_ranks` hands its function to
a pool of N processes that joined one gloo process group when they started, and the next call of that
world size (from any test module on this pytest worker) reuses them. A call that fails or times out tears
its pool down (the other ranks may be blocked in a collective); the next call starts a fresh one. Each
call runs with the environment and working directory the rank had before it.
"""

import atexit
import multiprocessing as mp
import os
import queue as queues
import tempfile
import traceback

_TIMEOUT_S = 600
_MAX_RANKS = 12  # live pool processes per pytest worker (~0.4 GB each): a new world size evicts the oldest beyond it


def _serve(rank, world, init_file, jobs, results):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        return
    parent = os.getppid()
    try:
        while (job := _next_job(jobs, parent)) is not None:
            fn, args = job
            env, cwd = dict(os.environ), os.getcwd()
            try:
                results.put((rank, True, fn(rank, world, *args)))
            except BaseException:  # report every failure to the parent instead of hanging it
                results.put((rank, False, traceback.format_exc()))
            finally:
                os.environ.clear()
                os.environ.update(env)
                os.chdir(cwd)
    finally:
        dist.destroy_process_group()


def _next_job(jobs, parent: int):
    """The next job, or None when the parent says so or has died (a pytest worker that ended without
    closing its pools must not leave ranks waiting forever)."""
    while True:
        try:
            return jobs.get(timeout=5)
        except queues.Empty:
            if os.getppid() != parent:
                return None


class _Pool:
    def __init__(self, world: int):
        ctx = mp.get_context("spawn")
        self.world, self._tmp = world, tempfile.TemporaryDirectory()
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(world)]
        init_file = os.path.join(self._tmp.name, "pg")
        self.procs = [ctx.Process(target=_serve, args=(r, world, init_file, self.jobs[r], self.results))
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def run(self, fn, args, timeout: float) -> tuple[dict, list]:
        for q in self.jobs:
            q.put((fn, args))
        results, errors = {}, []
        while len(results) < self.world:
            try:
                rank, ok, value = self.results.get(timeout=timeout)
            except queues.Empty:
                errors.append(f"no result from ranks {sorted(set(range(self.world)) - set(results))} "
                              f"within {timeout:.0f} s")
                break
            if not ok:
                errors.append(f"rank {rank} failed:\n{value}")
                break  # one failure: the others may be blocked in a collective
            results[rank] = value
        return results, errors

    def close(self, kill: bool) -> None:
        if not kill:
            for q in self.jobs:
                q.put(None)
        for p in self.procs:
            p.join(timeout=1 if kill else 30)
            if p.is_alive():
                p.kill()
                p.join()
        self._tmp.cleanup()


_POOLS: dict[int, _Pool] = {}  # world size -> live pool, oldest first


def _pool(world: int) -> _Pool:
    if world not in _POOLS:
        while _POOLS and sum(_POOLS) + world > _MAX_RANKS:
            _POOLS.pop(next(iter(_POOLS))).close(kill=False)
        _POOLS[world] = _Pool(world)
    return _POOLS[world]


@atexit.register
def close_all() -> None:
    """Stop every pool (tests/conftest.py calls it when the session ends)."""
    while _POOLS:
        _POOLS.popitem()[1].close(kill=False)


def run_ranks(world: int, fn, *args, timeout: float = _TIMEOUT_S) -> list:
    """fn(rank, world, *args) runs on every rank of a gloo group of `world` processes; returns [result per
    rank]. `fn` must be importable (defined at module level of a test module); `timeout` bounds the wait for
    each rank's result."""
    pool = _pool(world)
    results, errors = pool.run(fn, args, timeout)
    if errors:
        _POOLS.pop(world).close(kill=True)
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]
