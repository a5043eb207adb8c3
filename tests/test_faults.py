"""Fault injection: the MESHSCALE_FAULT grammar, and which rank and attempt a fault fires in."""

import pytest
import torch

from meshscale.errors import UserError
from meshscale.runtime.resilience.faults import Fault, Injector, parse


def test_parse_kinds_ranks_and_options():
    faults = parse("kill@step=7,rank=1; slow@step=2,rank=3,factor=2.5;bitflip@step=6,bit=3,param=2;"
                   "nan@step=4,param=norm.weight,times=2")
    assert faults == [Fault("kill", 7, 1), Fault("slow", 2, 3, factor=2.5), Fault("bitflip", 6, 0, bit=3, param=2),
                      Fault("nan", 4, 0, param="norm.weight", times=2)]


@pytest.mark.parametrize("text, words", [("explode@step=1", "unknown fault"), ("kill@rank=1", "needs step=N"),
                                         ("kill@step=x", "must be a number"), ("kill@step=1,when=2", "not one of")])
def test_bad_fault_text_is_one_clear_error(text, words):
    with pytest.raises(UserError, match=words):
        parse(text)


def test_faults_fire_on_their_rank_step_and_first_attempt_only():
    faults = parse("raise@step=3,rank=1;slow@step=2,rank=1")
    assert Injector(faults, rank=0, attempt=0).faults == []
    assert Injector(faults, rank=1, attempt=1).faults == []
    live = Injector(faults, rank=1, attempt=0)
    live.at_step_start(2)
    with pytest.raises(RuntimeError, match="step 3 on rank 1"):
        live.at_step_start(3)
    assert live.due(5, "slow") and not live.due(1, "slow")


def test_bitflip_and_nan_change_exactly_what_they_name():
    named = [("a", torch.nn.Parameter(torch.ones(4))), ("b", torch.nn.Parameter(torch.ones(3)))]
    injector = Injector(parse("bitflip@step=1,param=1,bit=30;bitflip@step=3,param=a,bit=0;nan@step=2"), rank=0,
                        attempt=0)
    assert injector.flip_bit(0, named) is None
    assert "of b flipped" in injector.flip_bit(1, named)
    assert named[0][1].data.tolist() == [1, 1, 1, 1] and named[1][1].data[1:].tolist() == [1, 1]
    assert named[1][1].data[0].item() != 1.0  # 1.0 with its top exponent bit flipped
    injector.flip_bit(3, named)
    assert named[0][1].data[0].item() == 1.0 + 2 ** -23  # by name; bit 0: the last bit of the mantissa
    loss = injector.wrap_loss(lambda logits, targets: torch.tensor(1.0))
    injector.at_step_start(1)
    assert loss(None, None) == 1
    injector.at_step_start(2)
    assert torch.isnan(loss(None, None))
    injector.at_step_start(2)  # a replay of step 2: the fault fired in its one run (times=1)
    assert loss(None, None) == 1


def test_a_gradient_nan_reaches_only_its_parameter_and_repeats_times_runs():
    named = [("a", torch.nn.Parameter(torch.ones(2))), ("b", torch.nn.Parameter(torch.ones(2)))]
    injector = Injector(parse("nan@step=1,param=b,times=2"), rank=0, attempt=0)
    injector.arm_gradients(named)
    for run, step in enumerate((0, 1, 1, 1)):
        injector.at_step_start(step)
        for _, p in named:
            p.grad = None
        (named[0][1].sum() + named[1][1].sum()).backward()
        assert torch.isfinite(named[0][1].grad).all()
        assert torch.isnan(named[1][1].grad).all() == (run in (1, 2))
    with pytest.raises(UserError, match="no parameter named"):
        Injector(parse("nan@step=1,param=c"), rank=0, attempt=0).arm_gradients(named)
