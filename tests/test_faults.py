"""Fault injection: the MESHSCALE_FAULT grammar, and which rank and attempt a fault fires in."""

import pytest
import torch

from meshscale.errors import UserError
from meshscale.runtime.faults import Fault, Injector, parse


def test_parse_kinds_ranks_and_options():
    faults = parse("kill@step=7,rank=1; slow@step=2,rank=3,factor=2.5;bitflip@step=6,bit=3,param=2")
    assert faults == [Fault("kill", 7, 1), Fault("slow", 2, 3, factor=2.5), Fault("bitflip", 6, 0, bit=3, param=2)]


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
    params = [torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(3))]
    injector = Injector(parse("bitflip@step=1,param=1,bit=30;nan@step=2"), rank=0, attempt=0)
    assert injector.flip_bit(0, params) is None
    assert injector.flip_bit(1, params) is not None
    assert params[0].data.tolist() == [1, 1, 1, 1] and params[1].data[1:].tolist() == [1, 1]
    assert params[1].data[0].item() != 1.0  # 1.0 with its top exponent bit flipped
    assert torch.isnan(injector.corrupt_loss(2, torch.tensor(1.0))) and injector.corrupt_loss(1, torch.tensor(1.0)) == 1
