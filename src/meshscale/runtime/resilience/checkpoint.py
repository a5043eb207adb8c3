"""Checkpoints: the whole training state, saved with torch.distributed.checkpoint (DCP) in a form no layout
owns, so a checkpoint saved under any layout the trainer runs loads under any other.

The form. Every tensor is keyed by the unmodified model's parameter name (FQN): `model.<fqn>` for the
weight, `optim.<fqn>.exp_avg` / `.exp_avg_sq` for AdamW's moments, each a DTensor of the full parameter's
shape over the ranks that hold a piece or a copy of it, arranged as (replicas, shards, tp)
(`parallel.mesh.holder_grid`). The data-parallel ranks (dp x cp, or for routed experts the expert
data-parallel group) are `Replicate()` (DDP, and ZeRO-1/2 once its flat shards are gathered into
per-parameter tensors), or FSDP2's own `Shard(0)` over its shard group and `Replicate()` across
hybrid-sharding replica groups (`_StridedShard` when TP already cut dim 0, the order FSDP2 itself uses for
2-D meshes). Over tp a tensor is `Shard(d)` (d: the dim where
the local shape differs from the full one; our TP keeps plain tensors, so the shape says how it was cut),
`Replicate()` (norms), or, for a KV head copied onto tp/kv_heads ranks, `Shard(0)` over the head groups and
`Replicate()` within them. These meshes only describe where the pieces are: they are built without process
groups. Pipeline stages and expert-parallel ranks hold disjoint FQNs (each keeps the global names of its
layers and experts), so together they save the whole model. DCP writes each chunk once (replicas are
de-duplicated and spread over the ranks holding them) and loads any other cut of the same full tensors.

On disk: DIR/step-00000010/ holds DCP's files, then, written last, manifest.json: model, layout, world
size, precision, versions, step, tokens seen, data position (the batches are a function of seed and
step), the run's settings a resume must keep (`RUN_FIELDS`), whether it was verified, and the sha256 of
every other file; each rank's RNG state is in DCP's files as `rng.<rank>`.
The manifest is the commit marker: rank 0 writes it (temporary file, fsync, atomic rename) after a barrier
that follows every rank's fsynced writes, so a directory without it -- a save cut short -- never counts.

Verified checkpoints. When the run has replicas to compare (runtime/resilience/sdc.py), the cross-replica
check runs on the state each save writes, before it is written: a corrupted replica stops or rolls back the
run instead of being saved, and the manifest says `verified`. A rollback goes to the newest verified
checkpoint (one a bit flip could have reached before any check saw it never counts), and retention never
deletes that one.

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
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

import meshscale
from meshscale.cost.checkpoint import checkpoint_bytes
from meshscale.errors import UserError
from meshscale.models.transformer import full_shapes
from meshscale.parallel.expert import is_expert_param
from meshscale.parallel.mesh import describing_mesh, from_every_rank, holder_grid
from meshscale.parallel.strategy import MOMENTS
from meshscale.runtime.resilience.lock import LOCK
from meshscale.runtime.resilience.restarts import PROGRESS

MANIFEST = "manifest.json"
_PREFIX = "step-"


# ---- the directory: no process group needed, so resolve() checks it before any process starts -----
def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{_PREFIX}{step:08d}"


def complete(root: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every committed checkpoint under root, oldest first."""
    found = []
    for d in Path(root).glob(f"{_PREFIX}*"):
        if _step_dir_name(d) and (d / MANIFEST).is_file():
            found.append((int(d.name[len(_PREFIX):]), d))
    return sorted(found)


def read_manifest(path: Path) -> dict:
    try:
        return json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"checkpoint {path}: unreadable {MANIFEST} ({e}); delete {path} to resume from the "
                        "previous checkpoint") from None


def verify(path: Path, manifest: dict) -> None:
    """The manifest is this directory's (its step, DCP's metadata among its files), and every file it lists
    exists and has its sha256: an edited manifest or a truncated or altered shard is never loaded."""
    step, files = manifest.get("step"), manifest.get("files")
    what = (f"says step {step}" if step != int(path.name[len(_PREFIX):]) else
            None if isinstance(files, dict) and ".metadata" in files else "lists no DCP .metadata file")
    if what:
        raise UserError(f"checkpoint {path}: its {MANIFEST} {what}, not what the directory holds (edited or "
                        f"copied?); delete {path} to resume from the previous checkpoint")
    for name, digest in files.items():
        f = path / name
        if not f.is_file():
            raise UserError(f"checkpoint {path}: file {name} is missing; delete {path} to resume from the "
                            "previous checkpoint")
        if _sha256(f) != digest:
            raise UserError(f"checkpoint {path}: {name} fails its sha256 check (truncated or altered); delete "
                            f"{path} to resume from the previous checkpoint")


def identity(path: Path) -> str:
    """A checkpoint as verified: its directory and its manifest's modification time. resolve() hashes the
    checkpoint a run resumes from before any process starts; the workers then load it without hashing it
    again (a checkpoint they find under another identity, e.g. after a restart, they verify)."""
    return f"{path.absolute()}@{(path / MANIFEST).stat().st_mtime_ns}"


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


# what fixes the batches a step sees and the learning rate it applies: resuming under other values is another run
RUN_FIELDS = {"seed": "--seed", "global_batch": "--global-batch", "seq": "--seq", "data": "--data", "lr": "--lr",
              "min_lr": "--min-lr", "warmup": "--warmup", "steps": "--steps"}  # the cosine decay spans --steps


def run_fields(cfg, spec) -> dict:
    """The run's values of RUN_FIELDS, as the manifest records them (data: its absolute path and size)."""
    values = {k: getattr(cfg, k) for k in RUN_FIELDS if k not in ("seq", "data")}
    values["seq"] = spec.seq
    values["data"] = None
    if cfg.data is not None:
        data = Path(cfg.data).absolute()
        files = [data] if data.is_file() else sorted(f for f in data.rglob("*") if f.is_file())
        values["data"] = f"{data} ({sum(f.stat().st_size for f in files)} bytes)"
    return values


def check_same_run(path: Path, manifest: dict, cfg, spec) -> None:
    """Refuse to resume a checkpoint under another seed, batch, sequence length, data or LR schedule."""
    saved, now = manifest.get("run"), run_fields(cfg, spec)
    if saved is None:  # written before the manifest recorded them
        return
    changed = [f"{RUN_FIELDS[k]} {saved.get(k)} -> {now[k]}" for k in RUN_FIELDS if saved.get(k) != now[k]]
    if changed:
        raise UserError(f"checkpoint {path} was saved by a run with other settings ({'; '.join(changed)}); "
                        "resume with the same ones, pass --allow-config-change to continue anyway, or use a new "
                        "--checkpoint-dir")


def check_dir(root: str, spec, layout, precision: str) -> tuple[int, Path] | None:
    """Every check a --checkpoint-dir allows before a process starts; returns the newest checkpoint (verified)
    or None. Changes nothing on disk."""
    p = Path(root)
    if p.exists() and not p.is_dir():
        raise UserError(f"--checkpoint-dir {root} is a file; give a directory (new or holding checkpoints)")
    existing = p if p.exists() else next(a for a in p.absolute().parents if a.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--checkpoint-dir {root}: {existing} is not writable; choose a directory you can write to")
    check_space(existing, spec, layout, precision)
    if not p.exists():
        return None
    strangers = sorted(c.name for c in p.iterdir() if c.name not in (LOCK, PROGRESS) and not _step_dir_name(c))
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


def check_space(directory: Path, spec, layout, precision: str) -> None:
    """Refuse a directory whose filesystem cannot hold one more checkpoint (its size from the cost model:
    weights and AdamW moments at the run's precision), before anything is trained."""
    needed, free = checkpoint_bytes(spec, layout, precision)[1], shutil.disk_usage(directory).free
    if free < needed:
        raise UserError(f"--checkpoint-dir: a checkpoint of {spec.name} at --precision {precision} takes "
                        f"{_amount(needed)} and {directory} has {_amount(free)} free; free space or choose a "
                        "directory on another filesystem")


@contextmanager
def failing_cleanly(path: Path, step: int, run):
    """Around a save: a failure to write its files (a full disk, a quota, a file-size limit, an I/O error)
    becomes one line, after the save's directory is removed; it never committed, so the checkpoints before it
    are intact. DCP reports a rank's error on every rank (CheckpointException), so every rank gets here."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except (OSError, CheckpointException) as e:
        cause = e if isinstance(e, OSError) else _write_failure(e)
        if cause is None:
            raise
        shutil.rmtree(path, ignore_errors=True)
        before = complete(path.parent)
        kept = (f"the checkpoint of step {before[-1][0]} is intact" if before else "there is no earlier checkpoint")
        free = _amount(shutil.disk_usage(path.parent).free)
        needed = checkpoint_bytes(run.spec, run.layout, run.config.precision)[1]
        raise UserError(f"saving the checkpoint of step {step} to {path.parent} failed ({_reason(cause)}; {free} "
                        f"free there); its partial files were removed and {kept}; make room (a checkpoint takes "
                        f"{_amount(needed)}) or choose another --checkpoint-dir, then run the same command to resume"
                        ) from None


def _write_failure(e) -> BaseException | None:
    """The error of a rank whose writing of its files failed, or None (a failure of another kind: a bug to
    show whole). torch.save reports a failed write of its zip container as a RuntimeError, not an OSError."""
    failures = list(e.failures.values())
    for exc, trace in failures:
        if isinstance(exc, OSError):
            return exc
    return next((exc for exc, trace in failures if any(f.name == "_write_item" for f in trace or ())), None)


def _reason(cause: BaseException) -> str:
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"


def _amount(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


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
                state["step"] = step_tensor(group, p, 0)
                for k in MOMENTS:
                    state[k] = torch.zeros_like(p, memory_format=torch.preserve_format)


def step_tensor(group: dict, p: torch.Tensor, value: float) -> torch.Tensor:
    """AdamW's step count as torch keeps it (torch.optim.adamw's _init_group): a float32 scalar, on the
    parameter's device for the fused and capturable kernels, which read it there, on the CPU otherwise."""
    on_device = group.get("fused") or group.get("capturable")
    return torch.tensor(float(value), dtype=torch.float32, device=p.device if on_device else "cpu")


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
    mesh = describing_mesh(grid, local.device.type)
    stride = torch.empty(full_shape, device="meta").stride()
    return DTensor.from_local(local, mesh, [Replicate(), dp, *tp_placements], run_check=False,
                              shape=torch.Size(full_shape), stride=stride)


def _state_dict(run, par, optimizer, mesh) -> tuple[dict, list]:
    """The layout-free state dict of this rank, and the write-backs to run after loading into it."""

    _ensure_optimizer_state(optimizer)
    shapes, layout = full_shapes(run.spec), run.layout
    state, write_backs = {}, []
    if mesh is not None:  # (holders, FSDP2 shard group size) of dense and of routed-expert tensors
        kinds = {False: (holder_grid(layout, False), layout.shard_size)}
        if layout.ep > 1:
            kinds[True] = (holder_grid(layout, True), layout.edp)

    def describe(name, t):
        if mesh is None:
            return t
        return _global(t, shapes[name], *kinds[layout.ep > 1 and is_expert_param(name)])

    for strategy in par.strategies:
        held, write_back = strategy.checkpoint_state(optimizer)
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


def save(run, par, optimizer, mesh, step: int, verified: bool = False) -> Path:
    """Save the state after `step` optimizer steps (the next step to run is `step`) and commit it; then
    keep the newest run.config.keep complete checkpoints and the newest verified one. Every rank calls this.
    verified: the cross-replica check passed on this very state (written in the manifest)."""
    import torch.distributed.checkpoint as dcp

    path, state, record = _begin(run, par, optimizer, mesh, step, verified)
    with failing_cleanly(path, step, run), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # DCP warns that one process saves alone: that is intended
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True), no_dist=not dist.is_initialized())
        _finish(path, record, run.config.keep, None)
    return path


class AsyncSaver:
    """--async-save: DCP's async_save. `save` returns once the state is staged: copied into host memory
    (DCP's stager allocates fresh CPU tensors and copies into them), so the next optimizer step may change the
    weights; a thread then writes the copy, hashes it and commits the manifest, which is written only once
    every rank's files are complete. At most one save is in flight: the next one, a rollback, the end of the
    run and a preemption first wait for it (`wait`). Its collectives run on a gloo group of their own, used by
    that thread only, so they never interleave with the training loop's.
    Constructing it is collective (the group)."""

    def __init__(self, keep: int):
        from concurrent.futures import ThreadPoolExecutor

        self.keep = keep
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        # DCP's thread warns that one process saves alone (no_dist): intended, as in `save`
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="meshscale-checkpoint")
        self.pending = None  # the Future of the save in flight
        self.write_s: float | None = None  # the last finished save's time from staging to commit

    def save(self, run, par, optimizer, mesh, step: int, verified: bool = False) -> Path:
        import time

        import torch.distributed.checkpoint as dcp

        self.wait()
        started = time.perf_counter()
        path, state, record = _begin(run, par, optimizer, mesh, step, verified)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            upload = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True),
                                    process_group=self.group, no_dist=self.group is None)

        def finish() -> None:
            with failing_cleanly(path, step, run):
                upload.result()
                _finish(path, record, self.keep, self.group)
            self.write_s = time.perf_counter() - started

        self.pending = self.pool.submit(finish)
        return path

    def wait(self) -> None:
        """Until the save in flight is committed on this rank; its error, if it failed, is raised here."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self, wait: bool = True) -> None:
        """wait=False after an error: a save in flight whose peers died would never finish."""
        if wait:
            self.wait()
        self.pool.shutdown(wait=wait)


def _begin(run, par, optimizer, mesh, step: int, verified: bool) -> tuple[Path, dict, dict]:
    """A save's directory (made afresh), this rank's state dict and the manifest's record of the state, taken
    now: before the next optimizer step changes it."""
    root, multi = Path(run.config.checkpoint_dir), dist.is_initialized()
    path = step_dir(root, step)
    if not multi or dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if path.exists():  # a save of this step cut short earlier: start it afresh
            shutil.rmtree(path)
    _barrier(multi)
    state, _ = _state_dict(run, par, optimizer, mesh)
    record = {
        "step": step, "tokens_seen": step * run.config.global_batch * run.spec.seq,
        "data": {"seed": run.config.seed, "next_step": step}, "optimizer_step": _optimizer_step(optimizer),
        "model": {"name": run.spec.name, "seq": run.spec.seq, **_model_fields(run.spec)},
        "layout": str(run.layout), "world_size": run.layout.devices, "precision": run.config.precision,
        "versions": {"torch": torch.__version__, "meshscale": meshscale.__version__},
        "run": run_fields(run.config, run.spec), "verified": verified}
    return path, state, record


def _finish(path: Path, record: dict, keep: int, group) -> None:
    """After every rank's DCP files are written: each rank hashes its own, rank 0 commits the manifest with
    every digest and applies retention; every rank returns after the commit. `group`: the process group
    (None: the default one, or no process group)."""
    multi = dist.is_initialized()
    rank = dist.get_rank() if multi else 0
    mine = {f.name: _sha256(f) for f in sorted(path.glob(f"__{rank}_*"))}  # each rank hashes what it wrote
    files = [mine]
    if multi:
        files = [None] * dist.get_world_size(group)
        dist.all_gather_object(files, mine, group=group)
    if rank == 0:
        digests = {name: d for per_rank in files for name, d in per_rank.items()}
        digests.update({f.name: _sha256(f) for f in path.iterdir() if not f.name.startswith("__")})
        _commit(path, {**record, "files": digests})
        _retain(path.parent, keep)
    if multi:
        dist.barrier(group=group)


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
    """Delete complete checkpoints beyond the newest `keep` but the newest verified one (what a rollback
    needs), and saves cut short before the newest complete one."""
    found = complete(root)
    newest = found[-1][0]
    anchor = newest_verified(found)
    for _, d in found[:-keep]:
        if d != anchor:
            shutil.rmtree(d)
    for d in root.glob(f"{_PREFIX}*"):
        if _step_dir_name(d) and not (d / MANIFEST).exists() and int(d.name[len(_PREFIX):]) < newest:
            shutil.rmtree(d)


def _step_dir_name(d: Path) -> bool:
    """A directory named like a save (step-NNNNNNNN): any other entry is not ours to read or delete."""
    return d.name.startswith(_PREFIX) and d.name[len(_PREFIX):].isdigit() and d.is_dir()


def newest_verified(found: list[tuple[int, Path]]) -> Path | None:
    """The newest of `found` whose manifest says the cross-replica check passed on the state it holds."""
    for _, path in reversed(found):
        try:
            if json.loads((path / MANIFEST).read_text()).get("verified"):
                return path
        except (OSError, ValueError):
            continue
    return None


def _barrier(multi: bool) -> None:
    if multi:
        dist.barrier()


# ---- load ---------------------------------------------------------------------------------------------
def restore_latest(run, par, optimizer, mesh, verified_only: bool = False) -> int:
    """Load the newest complete checkpoint under run.config.checkpoint_dir (the newest verified one with
    `verified_only`) into the live training state (parameters, AdamW moments and step, RNG state when the
    process count matches) and return the step to continue from; 0, with nothing changed, when there is
    none. Every rank calls this; rank 0 verifies the checksums first and every rank raises the same
    UserError if the checkpoint is unusable."""
    import torch.distributed.checkpoint as dcp

    multi = dist.is_initialized()
    rank = dist.get_rank() if multi else 0
    found = complete(run.config.checkpoint_dir) if run.config.checkpoint_dir else []
    if verified_only:  # every rank reads the same manifests: the same choice everywhere
        anchor = newest_verified(found)
        found = [(s, p) for s, p in found if p == anchor]
    if not found:
        return 0
    step, path = found[-1]
    problem = None
    if rank == 0:
        try:
            manifest = read_manifest(path)
            check_compatible(path, manifest, run.spec, run.config.precision)
            if identity(path) != run.verified:  # hashed once: by resolve(), or here
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
    for group in optimizer.param_groups:
        for p in group["params"]:
            if "step" in optimizer.state.get(p, {}):
                optimizer.state[p]["step"] = step_tensor(group, p, manifest["optimizer_step"])
    if same_world:
        torch.set_rng_state(state[f"rng.{rank}"])
    if rank == 0:
        print(f"resuming from {path} at step {step} (saved with layout {manifest['layout']} on "
              f"{manifest['world_size']} processes)", flush=True)
    return step
