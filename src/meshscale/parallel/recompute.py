"""Activation recompute (Chen et al. 2016; Korthikanti et al. 2022, sec. 5 for "selective").

  full:      keep only each block's input; rerun the whole block in backward.
  selective: rerun only the attention core (RoPE, score, softmax, weighted sum): the part whose
             activations grow with seq^2 per head yet which costs no weight matmul to redo.
  op:        torchtitan's op-level selective checkpointing: keep the attention kernel's output and every
             other matmul's (the block's 1st, 3rd, ...), rerun the rest (torch's selective checkpoint API).
  minimal:   keep every weight matmul's output, rerun the attention core and the element-wise work (MaxText's
             remat_policy "minimal", JAX's checkpoint_dots_with_no_batch_dims): no matmul runs twice.

The module tree and parameter names are left alone (we replace the forward callables), so
initialisation, FSDP wrapping and checkpoints see the same model.
"""

from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)  # nn.Linear without and with a bias
_ATTENTION = (torch.ops.aten._scaled_dot_product_flash_attention.default,
              torch.ops.aten._scaled_dot_product_efficient_attention.default,
              torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)


def _checkpointed(fn):
    return partial(checkpoint, fn, use_reentrant=False)


def _every_other_matmul():
    """A fresh policy per checkpointed call; forward and recompute count their matmuls apart, so the
    rerun makes the same choices."""
    count = {False: 0, True: 0}

    def policy(ctx, func, *args, **kwargs):
        if func in _MATMULS:
            count[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if count[ctx.is_recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in _ATTENTION else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _every_matmul():
    def policy(ctx, func, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if func in _MATMULS else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_recompute(model, mode: str) -> None:
    if mode == "none":
        return
    for block in model.layers.values():
        if mode == "full":
            block.forward = _checkpointed(block.forward)
        elif mode == "selective":
            block.attention.core = _checkpointed(block.attention.core)
        elif mode == "op":
            block.forward = partial(checkpoint, block.forward, use_reentrant=False, context_fn=_every_other_matmul)
        elif mode == "minimal":
            block.forward = partial(checkpoint, block.forward, use_reentrant=False, context_fn=_every_matmul)
        else:
            raise ValueError(f"unknown recompute mode {mode!r}")
