"""What every data-parallel strategy (Local, DDP, PipelinedDDP, Zero, FSDP, ExpertSplit and the experts'
own) offers the loop and the checkpoint, so they drive any of them without knowing which: the loop
accumulates, steps the parameters the optimizer owns, sums the local gradient norm and ends the step; the
checkpoint asks for the tensors a strategy holds, per parameter name, and how loaded values go back; the
silent-data-corruption check asks which ranks hold copies of which."""

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import torch

MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's per-parameter state

# {parameter name: {"param": tensor, "exp_avg": tensor, "exp_avg_sq": tensor}}, and the function that writes
# values loaded into those tensors back where the strategy keeps them (nothing to do when they are the live ones)
Held = tuple[dict[str, dict[str, torch.Tensor]], Callable[[], None]]


@runtime_checkable
class Strategy(Protocol):
    model: torch.nn.Module  # what the forward calls (DDP's wrapper, or the module itself)
    module: torch.nn.Module  # the unwrapped module, with the model's parameter names
    sharded: bool  # local_grad_sq is this rank's shard only: the caller sums it over the shard group

    def accumulate(self, last: bool) -> AbstractContextManager:
        """Around one micro-batch's forward and backward; the gradient sync happens on the last."""

    def optim_params(self) -> list:
        """The tensors the optimizer steps (the parameters, or ZeRO's fp32 master shards)."""

    def local_grad_sq(self, skip: Callable[[str], bool]) -> torch.Tensor:
        """Sum of squared gradients this rank holds, leaving out the parameters `skip(name)` is true for."""

    def after_step(self) -> None:
        """After the optimizer step: drop gradients, refresh parameters from their owners."""

    def replicas(self) -> list:
        """(axis, process group, [(name, parameter)], whether their optimizer state is a copy too) for each group
        of ranks holding copies of this strategy's parameters: what the silent-data-corruption check compares."""

    def checkpoint_state(self, optimizer: torch.optim.Optimizer) -> Held:
        """Each owned parameter and its AdamW moments, whole over the data-parallel ranks (or FSDP2's
        DTensor shard), and the write-back to run after loading into them."""


def local_part(t: torch.Tensor) -> torch.Tensor:
    """What this rank holds of `t`: a DTensor's local shard (FSDP2's parameters and gradients), else `t`."""
    return t.to_local() if hasattr(t, "to_local") else t


def live_state(named: list, optimizer: torch.optim.Optimizer) -> Held:
    """The state of strategies that keep each parameter and its moments as live tensors: nothing to write back."""
    held = {name: {"param": p.detach(), **{k: optimizer.state[p][k] for k in MOMENTS}} for name, p in named}
    return held, lambda: None
