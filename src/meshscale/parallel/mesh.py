"""The device mesh: every layout gets all four dimensions, named and ordered pp, dp, cp, tp (TP
innermost, inside the fast domain), size-1 dimensions included, so each parallelism finds its axis
by name whatever else is on."""

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshscale.specs.layout import Layout

MESH_DIMS = ("pp", "dp", "cp", "tp")

_meshes: dict = {}


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """One mesh per shape per process (sub-group creation is a collective, so reuse it)."""
    shape = tuple(getattr(layout, d) for d in MESH_DIMS)
    if shape not in _meshes:
        if dist.get_world_size() != layout.devices:
            raise ValueError(f"layout {layout} needs {layout.devices} processes, the group has "
                             f"{dist.get_world_size()}")
        _meshes[shape] = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)
    return _meshes[shape]


def forget_meshes() -> None:
    """Drop the cached meshes before the process groups are destroyed: a mesh keeps its groups (and their
    worker threads) alive, and threads still alive when the interpreter finalises abort the process."""
    _meshes.clear()
