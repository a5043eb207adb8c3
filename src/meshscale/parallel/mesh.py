"""The device meshes, all of them built here (as torchtitan's ParallelDims owns its mesh): every layout gets
all four dimensions, named and ordered pp, dp, cp, tp (TP innermost, inside the fast domain), size-1
dimensions included, so each parallelism finds its axis by name whatever else is on.

Its sub-meshes: the data-parallel family works over every rank that holds the same parameters, dp x cp
(context-parallel ranks hold the same weights and see different tokens): `replica_mesh` flattens them into
one dimension, and `hybrid_mesh` cuts that into (replicate, shard) for hybrid sharding. Expert parallelism
has its own (pp, edp, ep, etp) view of the same ranks, each stage's tp*cp*dp ranks folded as Megatron-Core
folds them (`expert_mesh`, specs.layout.expert_mesh_shape), and tensor parallelism with fewer KV
heads than ranks groups the ranks holding copies of one head (`kv_copy_mesh`). Checkpoints describe where
pieces of a tensor live with meshes that have no process groups (`describing_mesh` over `holder_grid`).

Sub-group creation is a collective, so every mesh is built once per process and reused; `forget_meshes`
drops them all together. A sub-mesh is found again by the ranks of the mesh it was cut from, never by that
mesh object's id(): `mesh["tp"]` is a new object at every call, and a freed one's id is soon another's, so
an id key hits on some ranks and misses on others, and the ranks that miss wait in a sub-group creation the
others never join."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshscale.specs.layout import Layout, expert_mesh_shape

MESH_DIMS = ("pp", "dp", "cp", "tp")
EXPERT_DIMS = ("pp", "edp", "ep", "etp")

_meshes: dict = {}


def _cached(key, make) -> DeviceMesh:
    if key not in _meshes:
        _meshes[key] = make()
    return _meshes[key]


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    shape = tuple(getattr(layout, d) for d in MESH_DIMS)
    if dist.get_world_size() != layout.devices:
        raise ValueError(f"layout {layout} needs {layout.devices} processes, the group has "
                         f"{dist.get_world_size()}")
    return _cached(shape, lambda: init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS))


def from_every_rank(obj) -> list:
    """`obj` as each rank of the world holds it, in rank order ([obj] outside a process group)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _of(mesh: DeviceMesh, *what) -> tuple:
    """A cache key for a sub-mesh of `mesh`: the same on every rank that holds an equal mesh, whatever object."""
    return (mesh.mesh_dim_names, tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()), *what)


def forget_meshes() -> None:
    """Drop the cached meshes before the process groups are destroyed: a mesh keeps its groups (and their
    worker threads) alive, and threads still alive when the interpreter finalises abort the process."""
    _meshes.clear()


def replica_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The dp x cp ranks as one 1-D mesh (mesh["dp"] itself when cp is 1), created once per mesh."""
    if mesh["cp"].size() == 1:
        return mesh["dp"]
    return _cached(_of(mesh, "dp_cp"), lambda: mesh["dp", "cp"]._flatten("dp_cp"))


def hybrid_mesh(mesh: DeviceMesh, shard: int) -> DeviceMesh:
    """(replicate, shard): groups of `shard` consecutive dp x cp ranks share one copy of the sharded state;
    the dp*cp/shard groups are replicas of each other."""
    flat = replica_mesh(mesh)
    return _cached(_of(mesh, "hsdp", shard),
                   lambda: flat._unflatten(0, (flat.size() // shard, shard), ("replicate", "shard")))


def expert_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The (pp, edp, ep, etp) mesh over the same ranks as the main mesh (specs.layout.expert_mesh_shape)."""
    shape = expert_mesh_shape(layout)
    ranks = torch.arange(layout.devices).reshape(shape)
    return _cached(("expert", shape), lambda: DeviceMesh(device_type, ranks, mesh_dim_names=EXPERT_DIMS))


def kv_copy_mesh(tp_mesh: DeviceMesh, kv_heads: int) -> DeviceMesh:
    """(tp_kv, tp_kv_copy): the TP ranks cut into kv_heads groups of consecutive ranks that hold copies of
    the same KV head."""
    t = tp_mesh.size()
    return _cached(_of(tp_mesh, "kv", kv_heads),
                   lambda: tp_mesh._unflatten(0, (kv_heads, t // kv_heads), ("tp_kv", "tp_kv_copy")))


def holder_grid(layout: Layout, expert: bool) -> torch.Tensor:
    """The global ranks holding a piece or a copy of this rank's dense (or routed-expert) tensors, as a
    (data-parallel ranks, tp) grid: this rank's pipeline stage (and expert-parallel rank) of the main mesh's
    (pp, dp, cp, tp) order, or the expert mesh's (pp, edp, ep, etp) order (its etp ranks in the tp place)."""
    rank = dist.get_rank()
    if expert:
        ranks = torch.arange(layout.devices).reshape(expert_mesh_shape(layout))
        pp, _, ep, _ = (ranks == rank).nonzero()[0].tolist()
        return ranks[pp, :, ep, :]
    ranks = torch.arange(layout.devices).reshape(layout.pp, layout.dp * layout.cp, layout.tp)
    return ranks[(ranks == rank).nonzero()[0, 0]]


def describing_mesh(grid: torch.Tensor, device_type: str) -> DeviceMesh:
    """A mesh over `grid`'s ranks without process groups: it only says where the pieces of a tensor are
    (DCP's placements), so building it costs no collective and every rank may build different ones."""
    key = ("describing", tuple(grid.shape), tuple(grid.flatten().tolist()), device_type)
    return _cached(key, lambda: DeviceMesh(device_type, grid, _init_backend=False))
