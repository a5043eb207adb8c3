"""Activation recompute (Chen et al. 2016; Korthikanti et al. 2022, sec. 5 for "selective").

  full:      keep only each block's input; rerun the whole block in backward.
  selective: rerun only the attention core (RoPE, score, softmax, weighted sum): the part whose
             activations grow with seq^2 per head yet which costs no weight matmul to redo.

The module tree and parameter names are left alone (we replace the forward callables), so
initialisation, FSDP wrapping and checkpoints see the same model.
"""

from functools import partial

from torch.utils.checkpoint import checkpoint


def _checkpointed(fn):
    return partial(checkpoint, fn, use_reentrant=False)


def apply_recompute(model, mode: str) -> None:
    if mode == "none":
        return
    for block in model.layers.values():
        if mode == "full":
            block.forward = _checkpointed(block.forward)
        elif mode == "selective":
            block.attention.core = _checkpointed(block.attention.core)
        else:
            raise ValueError(f"unknown recompute mode {mode!r}")
