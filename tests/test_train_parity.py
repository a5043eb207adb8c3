"""Parity, the judge: every data-parallel layout trains `tiny` (fp32) with the single-process loss curve
to 1e-5 relative: dp=2 and dp=4, zero 0-3, with and without gradient accumulation, with recompute.
One spawned process group per dp degree runs all of that degree's cases."""

import pytest

from multirank import run_ranks

STEPS = 5
REL = 1e-5
# (layout, what it exercises); global batch 8 sequences: dp=2 gives 4 per rank, dp=4 gives 2.
CASES = {
    2: ["zero=0", "zero=1", "zero=2", "zero=3",
        "zero=0,mbs=2", "zero=1,mbs=2", "zero=2,mbs=1", "zero=3,mbs=2",
        "zero=0,mbs=2,recompute=selective", "zero=2,mbs=2,recompute=full", "zero=3,mbs=2,recompute=full",
        "zero=3,recompute=selective"],
    4: ["zero=0", "zero=1", "zero=2", "zero=3",
        "zero=0,mbs=1", "zero=1,mbs=1", "zero=2,mbs=1", "zero=3,mbs=1,recompute=full",
        "zero=1,recompute=selective"],
}


def _run(layout: str, world: int):
    from meshscale.runtime.loop.config import TrainConfig, resolve

    return resolve(TrainConfig(layout=layout, steps=STEPS, global_batch=8, bucket_mb=0.5), world)


def _tokens():
    from meshscale.runtime.loop.data import load_tokens

    return load_tokens(None)[: 1 << 20]


def _curves(rank, world, layouts):
    import torch

    from meshscale.runtime.loop.trainer import train

    tokens = _tokens()
    out = {}
    for layout in layouts:
        result = train(_run(layout, world), torch.device("cpu"), tokens, log=False)
        out[layout] = ([r["loss"] for r in result["rows"]], result["val_loss"])
    return out


@pytest.fixture(scope="module")
def reference():
    import torch

    from meshscale.runtime.loop.trainer import train

    result = train(_run("", 1), torch.device("cpu"), _tokens(), log=False)
    return [r["loss"] for r in result["rows"]], result["val_loss"]


@pytest.mark.parametrize("world", [2, 4])
def test_loss_curves_match_single_process(world, reference):
    ref_losses, ref_val = reference
    assert ref_losses[-1] < ref_losses[0] - 0.3  # it learns; parity of a flat curve would prove little
    per_rank = run_ranks(world, _curves, CASES[world])
    for rank_result in per_rank:  # every rank reports the same (dp-averaged) loss
        assert rank_result == per_rank[0]
    for layout, (losses, val) in per_rank[0].items():
        assert len(losses) == STEPS
        for step, (got, want) in enumerate(zip(losses, ref_losses)):
            assert abs(got - want) <= REL * abs(want), f"dp={world},{layout}: step {step} loss {got} != {want}"
        assert abs(val - ref_val) <= REL * abs(ref_val), f"dp={world},{layout}: validation loss {val} != {ref_val}"
