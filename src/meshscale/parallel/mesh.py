"""The device mesh: every layout gets all four dimensions, named and ordered pp, dp, cp, tp (TP
innermost, inside the fast domain), size-1 dimensions included, so each parallelism finds its axis
by name whatever else is on.

The data-parallel family works over every rank that holds the same parameters, dp x cp (context-parallel
ranks hold the same weights and see different tokens): `replica_mesh` flattens them into one dimension,
and `hybrid_mesh` cuts that into (replicate, shard) for hybrid sharding."""

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshscale.specs.layout import Layout

MESH_DIMS = ("pp", "dp", "cp", "tp")

_meshes: dict = {}


def cached_mesh(key, make) -> DeviceMesh:
    """The mesh `make()` builds, built once per key per process: sub-group creation is a collective, so
    every mesh is reused, and all of them are dropped together by `forget_meshes`."""
    if key not in _meshes:
        _meshes[key] = make()
    return _meshes[key]


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    shape = tuple(getattr(layout, d) for d in MESH_DIMS)
    if dist.get_world_size() != layout.devices:
        raise ValueError(f"layout {layout} needs {layout.devices} processes, the group has "
                         f"{dist.get_world_size()}")
    return cached_mesh(shape, lambda: init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS))


def from_every_rank(obj) -> list:
    """`obj` as each rank of the world holds it, in rank order ([obj] outside a process group)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def forget_meshes() -> None:
    """Drop the cached meshes before the process groups are destroyed: a mesh keeps its groups (and their
    worker threads) alive, and threads still alive when the interpreter finalises abort the process."""
    _meshes.clear()


def replica_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The dp x cp ranks as one 1-D mesh (mesh["dp"] itself when cp is 1), created once per mesh."""
    if mesh["cp"].size() == 1:
        return mesh["dp"]
    return cached_mesh((id(mesh), "dp_cp"), lambda: mesh["dp", "cp"]._flatten("dp_cp"))


def hybrid_mesh(mesh: DeviceMesh, shard: int) -> DeviceMesh:
    """(replicate, shard): groups of `shard` consecutive dp x cp ranks share one copy of the sharded state;
    the dp*cp/shard groups are replicas of each other."""
    flat = replica_mesh(mesh)
    return cached_mesh((id(mesh), "hsdp", shard),
                       lambda: flat._unflatten(0, (flat.size() // shard, shard), ("replicate", "shard")))
