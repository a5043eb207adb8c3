"""Checkpoints: the whole training state, saved with torch.distributed.checkpoint (DCP) in a form no layout
owns, so a checkpoint saved under any layout the trainer runs loads under any other.

The form. Every tensor is keyed by the unmodified model's parameter name (FQN): `model.<fqn>` for the
weight, `optim.<fqn>.exp_avg` / `.exp_avg_sq` for AdamW's moments, each a DTensor of the full parameter's
shape over the ranks that hold a piece or a copy of it, arranged as (replicas, shards, tp) (`_holders`). The
data-parallel ranks (dp x cp, or for routed experts the expert data-parallel group) are `Replicate()` (DDP,
and ZeRO-1/2 once its flat shards are gathered into per-parameter tensors), or FSDP2's own `Shard(0)` over
its shard group and `Replicate()` across hybrid-sharding replica groups (`_StridedShard` when TP already
cut dim 0, the order FSDP2 itself uses for 2-D meshes). Over tp a tensor is `Shard(d)` (d: the dim where
the local shape differs from the full one; our TP keeps plain tensors, so the shape says how it was cut),
`Replicate()` (norms), or, for a KV head copied onto tp/kv_heads ranks, `Shard(0)` over the head groups and
`Replicate()` within them. These meshes only describe where the pieces are: they are built without process
groups. Pipeline stages and expert-parallel ranks hold disjoint FQNs (each keeps the global names of its
layers and experts), so together they save the whole model. DCP writes each chunk once (replicas are
de-duplicated and spread over the ranks holding them) and loads any other cut of the same full tensors.

On disk: DIR/step-00000010/ holds DCP's files, then, written last, manifest.json: model, layout, world
size, precision, versions, step, tokens seen, data position (the batches are a function of seed and
step), and the sha256 of every other file; each rank's RNG state is in DCP's files as `rng.<rank>`.
The manifest is the commit marker: rank 0 writes it (temporary file, fsync, atomic rename) after a barrier
that follows every rank's fsynced writes, so a directory without it -- a save cut short -- never counts.

Saving is synchronous: every rank returns from `save` once the checkpoint is committed, so a crash at any
later point finds it complete, and no copy of the state waits in memory beside the live one. Its cost is
measured per save in the metrics rows (`checkpoint_save_s`).
"""

import dataclasses
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

import meshscale
from meshscale.errors import UserError
from meshscale.models.transformer import full_shapes
from meshscale.parallel.compat import all_gather_into
from meshscale.parallel.expert import ExpertSplit, is_expert_param
from meshscale.parallel.mesh import from_every_rank
from meshscale.parallel.zero import Zero
from meshscale.specs.layout import expert_mesh_shape

MANIFEST = "manifest.json"
MOMENTS = ("exp_avg", "exp_avg_sq")
_PREFIX = "step-"


# ---- the directory: no process group needed, so resolve() checks it before any process starts -----
def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{_PREFIX}{step:08d}"


def complete(root: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every committed checkpoint under root, oldest first."""
    found = []
    for d in Path(root).glob(f"{_PREFIX}*"):
        if (d / MANIFEST).is_file() and d.name[len(_PREFIX):].isdigit():
            found.append((int(d.name[len(_PREFIX):]), d))
    return sorted(found)


def read_manifest(path: Path) -> dict:
    try:
        return json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"checkpoint {path}: unreadable {MANIFEST} ({e}); delete {path} to resume from the "
                        "previous checkpoint") from None


def verify(path: Path, manifest: dict) -> None:
    """Every file the manifest lists exists and has its sha256: a truncated or altered shard is never loaded."""
    for name, digest in manifest["files"].items():
        f = path / name
        if not f.is_file():
            raise UserError(f"checkpoint {path}: file {name} is missing; delete {path} to resume from the "
                            "previous checkpoint")
        if _sha256(f) != digest:
            raise UserError(f"checkpoint {path}: {name} fails its sha256 check (truncated or altered); delete "
                            f"{path} to resume from the previous checkpoint")


def _model_fields(spec) -> dict:
    """What fixes the parameters' shapes (the preset's name and the sequence length do not)."""
    return {k: v for k, v in dataclasses.asdict(spec).items() if k not in ("name", "seq")}


def check_compatible(path: Path, manifest: dict, spec, precision: str) -> None:
    fields = type(spec).__dataclass_fields__  # a field newer than the manifest was saved at its default
    saved = {k: manifest["model"].get(k, fields[k].default) for k in fields}
    differ = [f"{k} {saved[k]} vs {v}" for k, v in _model_fields(spec).items() if saved[k] != v]
    if differ:
        raise UserError(f"checkpoint {path} holds a different model ({', '.join(differ)}; saved vs --model "
                        f"{spec.name}); use the model it was saved with or a new --checkpoint-dir")
    if manifest["precision"] != precision:
        raise UserError(f"checkpoint {path} was trained at --precision {manifest['precision']}, not {precision}; "
                        f"pass --precision {manifest['precision']} or use a new --checkpoint-dir")


def check_dir(root: str, spec, precision: str) -> tuple[int, Path] | None:
    """Every check a --checkpoint-dir allows before a process starts; returns the newest checkpoint (verified)
    or None. Changes nothing on disk."""
    p = Path(root)
    if p.exists() and not p.is_dir():
        raise UserError(f"--checkpoint-dir {root} is a file; give a directory (new or holding checkpoints)")
    existing = p if p.exists() else next(a for a in p.absolute().parents if a.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--checkpoint-dir {root}: {existing} is not writable; choose a directory you can write to")
    if not p.exists():
        return None
    strangers = sorted(c.name for c in p.iterdir() if not c.name.startswith(_PREFIX))
    if strangers:
        raise UserError(f"--checkpoint-dir {root} holds {strangers[0]}, which is not a meshscale checkpoint; "
                        "choose a new or empty directory (old checkpoints there may be deleted)")
    found = complete(p)
    if not found:
        return None
    step, path = found[-1]
    manifest = read_manifest(path)
    check_compatible(path, manifest, spec, precision)
    verify(path, manifest)
    return step, path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- the layout-free state dict ---------------------------------------------------------------------
def _ensure_optimizer_state(optimizer) -> None:
    """AdamW creates its state on the first step; a checkpoint needs it (zeros) before then too."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                for k in MOMENTS:
                    state[k] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _held(strategy, optimizer) -> tuple[dict, Callable]:
    """{fqn: {"param", "exp_avg", "exp_avg_sq"}} of one chunk as this rank holds them across DP (whole
    tensors, or FSDP2's dp-sharded DTensors), and a function writing loaded values back where the tensors
    are copies (ZeRO's gathered moments)."""

    if isinstance(strategy, ExpertSplit):  # dense and routed-expert parameters, each with its own strategy
        (dense, write_dense), (experts, write_experts) = (_held(s, optimizer)
                                                          for s in (strategy.dense, strategy.experts))
        return {**dense, **experts}, lambda: (write_dense(), write_experts())
    if isinstance(strategy, Zero):
        return _zero_held(strategy, optimizer)
    held = {name: {"param": p.detach(), **{k: optimizer.state[p][k] for k in MOMENTS}}
            for name, p in strategy.module.named_parameters() if p.requires_grad and strategy.select(name)}
    return held, lambda: None


def _zero_held(zero, optimizer) -> tuple[dict, Callable]:
    """ZeRO-1/2: parameters are whole on every rank (views into the flat buckets); the moments live in flat
    shards, so gather each bucket's moments over the shard group and view them per parameter."""

    held, gathered = {}, []
    for b in zero.buckets:
        full = {k: torch.empty_like(b.flat) for k in MOMENTS}
        for k in MOMENTS:
            all_gather_into(full[k], optimizer.state[b.shard][k], group=zero.group)
        for p in b.params:
            view = slice(b.offsets[p], b.offsets[p] + p.numel())
            held[zero._names[p]] = {"param": p.detach(), **{k: full[k][view].view_as(p) for k in MOMENTS}}
        gathered.append((b, full))

    def write_back():
        for b, full in gathered:
            mine = slice(zero.rank * b.shard_numel, (zero.rank + 1) * b.shard_numel)
            b.shard.data.copy_(b.flat[mine])  # the parameters were loaded into views of b.flat
            for k in MOMENTS:
                optimizer.state[b.shard][k].copy_(full[k][mine])

    return held, write_back


def _holders(layout, expert: bool) -> torch.Tensor:
    """The global ranks holding a piece or a copy of this rank's dense (or routed-expert) tensors, as a
    (data-parallel ranks, tp) grid: this rank's pipeline stage (and expert-parallel rank) of the main mesh's
    (pp, dp, cp, tp) order, or the expert mesh's (pp, edp, ep, tp) order."""

    rank = dist.get_rank()
    if expert:
        ranks = torch.arange(layout.devices).reshape(expert_mesh_shape(layout))
        pp, _, ep, _ = (ranks == rank).nonzero()[0].tolist()
        return ranks[pp, :, ep, :]
    ranks = torch.arange(layout.devices).reshape(layout.pp, layout.dp * layout.cp, layout.tp)
    return ranks[(ranks == rank).nonzero()[0, 0]]


_descriptions: dict = {}  # meshes without process groups, by their rank grid and device type


def _describing_mesh(grid: torch.Tensor, device_type: str):
    from torch.distributed.device_mesh import DeviceMesh

    key = (tuple(grid.shape), tuple(grid.flatten().tolist()), device_type)
    if key not in _descriptions:
        _descriptions[key] = DeviceMesh(device_type, grid, _init_backend=False)
    return _descriptions[key]


def _global(t: torch.Tensor, full_shape: tuple, holders: torch.Tensor, shard_size: int):
    """`t` (whole over the data-parallel ranks, or FSDP2's shard of it) as a DTensor of the full shape on
    the (replicas, shards, tp...) grid of its `holders`; `shard_size`: the FSDP2 shard group's size."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    fsdp = isinstance(t, DTensor)
    local = t.to_local() if fsdp else t
    # t.shape is this TP rank's whole piece (an FSDP2 DTensor reports its unsharded shape)
    cut = [d for d, (a, b) in enumerate(zip(t.shape, full_shape)) if a != b]
    tp = holders.shape[-1]
    pieces = full_shape[cut[0]] // t.shape[cut[0]] if cut else 1  # < tp: KV heads copied onto tp/pieces ranks
    grid = holders.reshape(-1, shard_size if fsdp else 1, pieces, tp // pieces)
    tp_placements = [Shard(cut[0]) if cut else Replicate(), Replicate()]
    if not fsdp:
        dp = Replicate()
    elif cut and cut[0] == 0:
        dp = _StridedShard(0, split_factor=pieces)
    else:
        dp = Shard(0)
    mesh = _describing_mesh(grid, local.device.type)
    stride = torch.empty(full_shape, device="meta").stride()
    return DTensor.from_local(local, mesh, [Replicate(), dp, *tp_placements], run_check=False,
                              shape=torch.Size(full_shape), stride=stride)


def _state_dict(run, par, optimizer, mesh) -> tuple[dict, list]:
    """The layout-free state dict of this rank, and the write-backs to run after loading into it."""

    _ensure_optimizer_state(optimizer)
    shapes, layout = full_shapes(run.spec), run.layout
    state, write_backs = {}, []
    if mesh is not None:  # (holders, FSDP2 shard group size) of dense and of routed-expert tensors
        kinds = {False: (_holders(layout, False), layout.shard_size)}
        if layout.ep > 1:
            kinds[True] = (_holders(layout, True), layout.dp * layout.cp // layout.ep)

    def describe(name, t):
        if mesh is None:
            return t
        return _global(t, shapes[name], *kinds[layout.ep > 1 and is_expert_param(name)])

    for strategy in par.strategies:
        held, write_back = _held(strategy, optimizer)
        write_backs.append(write_back)
        for name, tensors in held.items():
            state[f"model.{name}"] = describe(name, tensors["param"])
            for k in MOMENTS:
                state[f"optim.{name}.{k}"] = describe(name, tensors[k])
    rank = dist.get_rank() if dist.is_initialized() else 0
    state[f"rng.{rank}"] = torch.get_rng_state()
    return state, write_backs


def _optimizer_step(optimizer) -> float:
    steps = [s["step"] for s in optimizer.state.values() if "step" in s]
    return float(steps[0]) if steps else 0.0


# ---- save ---------------------------------------------------------------------------------------------
def due(cfg, done: int) -> bool:
    """Save after `done` steps: every checkpoint_every steps and after the last."""
    return bool(cfg.checkpoint_dir) and (done % cfg.checkpoint_every == 0 or done == cfg.steps)


def save(run, par, optimizer, mesh, step: int) -> Path:
    """Save the state after `step` optimizer steps (the next step to run is `step`) and commit it; then
    keep the newest run.config.keep complete checkpoints. Every rank calls this."""
    import torch.distributed.checkpoint as dcp

    root, multi = Path(run.config.checkpoint_dir), dist.is_initialized()
    rank = dist.get_rank() if multi else 0
    path = step_dir(root, step)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if path.exists():  # a save of this step cut short earlier: start it afresh
            shutil.rmtree(path)
    _barrier(multi)
    state, _ = _state_dict(run, par, optimizer, mesh)
    with warnings.catch_warnings():  # DCP warns that one process saves alone: that is intended
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True), no_dist=not multi)
    mine = {f.name: _sha256(f) for f in sorted(path.glob(f"__{rank}_*"))}  # each rank hashes what it wrote
    files = from_every_rank(mine)
    if rank == 0:
        digests = {name: d for per_rank in files for name, d in per_rank.items()}
        digests.update({f.name: _sha256(f) for f in path.iterdir() if not f.name.startswith("__")})
        _commit(path, {
            "step": step, "tokens_seen": step * run.config.global_batch * run.spec.seq,
            "data": {"seed": run.config.seed, "next_step": step}, "optimizer_step": _optimizer_step(optimizer),
            "model": {"name": run.spec.name, "seq": run.spec.seq, **_model_fields(run.spec)},
            "layout": str(run.layout), "world_size": run.layout.devices, "precision": run.config.precision,
            "versions": {"torch": torch.__version__, "meshscale": meshscale.__version__},
            "files": digests})
        _retain(root, run.config.keep)
    _barrier(multi)
    return path


def _commit(path: Path, manifest: dict) -> None:
    tmp = path / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MANIFEST)
    fd = os.open(path, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _retain(root: Path, keep: int) -> None:
    """Delete complete checkpoints beyond the newest `keep`, and saves cut short before the newest complete one."""
    found = complete(root)
    newest = found[-1][0]
    for _, d in found[:-keep]:
        shutil.rmtree(d)
    for d in root.glob(f"{_PREFIX}*"):
        if not (d / MANIFEST).exists() and d.name[len(_PREFIX):].isdigit() and int(d.name[len(_PREFIX):]) < newest:
            shutil.rmtree(d)


def _barrier(multi: bool) -> None:
    if multi:
        dist.barrier()


# ---- load ---------------------------------------------------------------------------------------------
def restore_latest(run, par, optimizer, mesh) -> int:
    """Load the newest complete checkpoint under run.config.checkpoint_dir into the live training state
    (parameters, AdamW moments and step, RNG state when the process count matches) and return the step to
    continue from; 0, with nothing changed, when there is none. Every rank calls this; rank 0 verifies the
    checksums first and every rank raises the same UserError if the checkpoint is unusable."""
    import torch.distributed.checkpoint as dcp

    multi = dist.is_initialized()
    rank = dist.get_rank() if multi else 0
    found = complete(run.config.checkpoint_dir) if run.config.checkpoint_dir else []
    if not found:
        return 0
    step, path = found[-1]
    problem = None
    if rank == 0:
        try:
            manifest = read_manifest(path)
            check_compatible(path, manifest, run.spec, run.config.precision)
            verify(path, manifest)
        except UserError as e:
            problem = str(e)
    problem = from_every_rank(problem)[0]
    if problem:
        raise UserError(problem)
    manifest = read_manifest(path)
    state, write_backs = _state_dict(run, par, optimizer, mesh)
    same_world = manifest["world_size"] == (dist.get_world_size() if multi else 1)
    if not same_world:
        del state[f"rng.{rank}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), no_dist=not multi)
    for write_back in write_backs:
        write_back()
    for s in optimizer.state.values():
        s["step"] = torch.tensor(manifest["optimizer_step"])
    if same_world:
        torch.set_rng_state(state[f"rng.{rank}"])
    if rank == 0:
        print(f"resuming from {path} at step {step} (saved with layout {manifest['layout']} on "
              f"{manifest['world_size']} processes)", flush=True)
    return step
