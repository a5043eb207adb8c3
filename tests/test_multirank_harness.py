import pytest

from multirank import run_ranks


def _sum_ranks(rank, world):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def _fail_on_rank1(rank, world):
    import torch.distributed as dist

    if rank == 1:
        raise RuntimeError("boom on purpose")
    dist.barrier()


def test_all_reduce_over_real_gloo_ranks():
    assert run_ranks(3, _sum_ranks) == [6.0, 6.0, 6.0]


def test_failure_in_one_rank_is_reported_not_hung():
    # The error arrives as soon as rank 1 has imported torch and raised; the timeout only bounds a real hang,
    # so it leaves room for spawning two torch processes on a loaded 2-core machine (60 s was not enough).
    with pytest.raises(AssertionError, match="boom on purpose"):
        run_ranks(2, _fail_on_rank1, timeout=300)


def _pid_and_probe(rank, world, leak):
    import os

    import torch.distributed as dist

    dist.barrier()  # the group the pool joined is still usable
    seen = os.environ.get("MULTIRANK_PROBE")
    if leak:
        os.environ["MULTIRANK_PROBE"] = "leaked"
    return os.getpid(), seen


def test_ranks_are_reused_across_calls_without_leaking_state_and_replaced_after_a_failure():
    first = run_ranks(2, _pid_and_probe, True)
    second = run_ranks(2, _pid_and_probe, False)
    assert [pid for pid, _ in first] == [pid for pid, _ in second]  # the same processes
    assert [seen for _, seen in second] == [None, None]  # the first call's environment did not stay
    with pytest.raises(AssertionError, match="boom on purpose"):
        run_ranks(2, _fail_on_rank1, timeout=300)
    third = run_ranks(2, _pid_and_probe, False)
    assert not {pid for pid, _ in third} & {pid for pid, _ in first}  # a fresh pool after the failure
