"""Sharded construction: the model is built on the meta device (models.transformer.meta_model), the layout is
applied to that structure (pipeline chunks, EP's experts, TP slices, FSDP2 shards: shapes only), and only then
does each rank give memory and values to what it owns (`materialise_owned`). Values come from
models/init.py, a function of (seed, name, global index), so every layout starts from the single-process
weights bit for bit, and no rank ever holds more than its share.

A TP slice remembers where it sits in the global parameter (`owned_slice` sets `origin` on it); FSDP2 turns
parameters into DTensors, which know their own shard's offset but drop such attributes, so `origins` is read
before the data-parallel strategy wraps the chunk.
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from meshscale.models.transformer import materialise


def owned_slice(param: torch.Tensor, dim: int, index: int, parts: int) -> nn.Parameter:
    """Part `index` of `parts` equal parts of `param` along `dim`, as a new parameter that records its offset
    in the global one (composed with `param`'s own, if it is a slice already)."""
    size = param.shape[dim] // parts
    offset, shape = origin(param)
    out = nn.Parameter(param.detach().narrow(dim, index * size, size).clone())
    out.origin = (tuple(o + (index * size if d == dim else 0) for d, o in enumerate(offset)), shape)
    return out


def origin(param: torch.Tensor) -> tuple:
    """(offset, global shape) of a parameter in the single-process model."""
    return getattr(param, "origin", ((0,) * param.dim(), tuple(param.shape)))


def origins(module: nn.Module) -> dict:
    return {name: origin(p) for name, p in module.named_parameters()}


def has_meta(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters())


def materialise_owned(module: nn.Module, seed: int, device, known: dict) -> None:
    """Allocate and initialise the parts of `module`'s parameters this rank holds. known: `origins(module)`
    from before a data-parallel wrapper replaced its parameters."""

    def where(name: str, p: torch.Tensor) -> tuple:
        offset, shape = known[name]
        if not isinstance(p, DTensor):
            return p, offset, shape
        local = p.to_local()
        local_shape, shard_offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        assert tuple(local_shape) == tuple(local.shape), (name, local_shape, local.shape)
        return local, tuple(o + s for o, s in zip(offset, shard_offset)), shape

    materialise(module, seed, device, where)
