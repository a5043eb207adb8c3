"""Checkpoints (runtime/resilience/checkpoint.py) on real gloo ranks: exact resume under the same layout (bit for bit,
twice in a row for one), resharded resume across layouts and process counts (the loaded state equal to
what was saved, losses to 1e-5), retention, a save cut short, checksums, the cost model's size, and bad
input refused before anything changes on disk.

The model is a `tiny` variant whose vocabulary (258) does not split evenly over 4 FSDP shards, and whose
every parameter ZeRO's flat buckets cut somewhere. One spawn per process count runs all of its cases."""

import json
import os
import shutil
from pathlib import Path

import pytest

from multirank import run_ranks

STEPS = 4
REL = 1e-5
SPEC = {"name": "tiny-odd", "layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 88, "vocab": 258,
        "seq": 32}
SAME_LAYOUT = {2: ["dp=2,zero=0", "dp=2,zero=1", "dp=2,zero=2", "dp=2,zero=3", "tp=2", "pp=2,schedule=1f1b"],
               4: ["dp=2,tp=2", "pp=2,dp=2"]}
TWICE = "pp=2,schedule=1f1b"  # resumed twice in a row
ASYNC = ["dp=2,zero=0", "dp=2,zero=3"]  # also saved with --async-save: live tensors, FSDP2's DTensors


def _run(model: str, layout: str, world: int, ckpt: str, **kw):
    from meshscale.runtime.loop.config import TrainConfig, resolve

    cfg = dict(model=model, layout=layout, steps=STEPS, global_batch=8, val_batches=1, checkpoint_dir=ckpt,
               checkpoint_every=1, keep=3, bucket_mb=0.01)
    return resolve(TrainConfig(**{**cfg, **kw}), world)


def _losses(run, tokens) -> list[float]:
    import torch

    from meshscale.runtime.loop.trainer import train

    return [r["loss"] for r in train(run, torch.device("cpu"), tokens, log=False)["rows"]]


def _tokens():
    from meshscale.runtime.loop.data import load_tokens

    return load_tokens(None)[: 1 << 20]


def _copy_checkpoint(src_root: str, step: int, dst_root: str) -> None:
    """Rank 0 copies one checkpoint into a new directory; everyone waits for it."""
    import torch.distributed as dist

    from meshscale.runtime.resilience.checkpoint import step_dir

    if not dist.is_initialized() or dist.get_rank() == 0:
        shutil.copytree(step_dir(src_root, step), step_dir(dst_root, step))
    if dist.is_initialized():
        dist.barrier()


def _reload_and_save(run, dst_root: str) -> None:
    """Build the training state under `run`'s layout, load the newest checkpoint into it and save it again
    at once: the two checkpoints must hold the same full tensors."""
    from dataclasses import replace

    import torch.distributed as dist

    from meshscale.parallel.apply import apply_layout
    from meshscale.parallel.mesh import build_mesh
    from meshscale.runtime.resilience import checkpoint
    from meshscale.parallel.ledger import CommLedger
    from meshscale.models.transformer import build_model
    from meshscale.runtime.loop.optim import build_optimizer

    mesh = build_mesh(run.layout, "cpu") if run.layout.devices > 1 else None
    par = apply_layout(build_model(run.spec, 0), run.layout, mesh, CommLedger(), "fp32", run.config.bucket_mb)
    optimizer = build_optimizer(par.optim_params(), 1e-3, 0.1)
    step = checkpoint.restore_latest(run, par, optimizer, mesh)
    checkpoint.save(replace(run, config=replace(run.config, checkpoint_dir=dst_root)), par, optimizer, mesh, step)
    if dist.is_initialized():
        dist.barrier()


def _same_layout_cases(rank, world, root, model):
    """Uninterrupted runs saving every step, then resumes from their step-2 checkpoints."""
    from meshscale.runtime.resilience.checkpoint import complete

    tokens, out = _tokens(), {}
    for layout in SAME_LAYOUT[world]:
        base = os.path.join(root, _slug(layout))
        full = _losses(_run(model, layout, world, f"{base}/full"), tokens)
        _copy_checkpoint(f"{base}/full", 2, f"{base}/once")
        # ASYNC: the resumed run saves steps 3 and 4 while the next step runs; resumed again from its step 3
        once = _losses(_run(model, layout, world, f"{base}/once", async_save=layout in ASYNC), tokens)
        out[layout] = {"full": full, "once": once, "kept": [s for s, _ in complete(f"{base}/full")]}
        if layout in ASYNC:
            _copy_checkpoint(f"{base}/once", 3, f"{base}/from_async")
            out[layout]["async"] = {"kept": [s for s, _ in complete(f"{base}/once")], "dir": base,
                                    "resumed": _losses(_run(model, layout, world, f"{base}/from_async"), tokens)}
        if layout == TWICE:  # resume from a checkpoint that a resumed run wrote
            _copy_checkpoint(f"{base}/once", 3, f"{base}/twice")
            out[layout]["twice"] = _losses(_run(model, layout, world, f"{base}/twice"), tokens)
    return out


def _resharded(rank, world, root, model, cases):
    """(source directory, target layout): continue a checkpoint's step 2 under another layout, and reload its
    step 2 there and save it again."""
    tokens, out = _tokens(), {}
    for src, layout in cases:
        dst = os.path.join(root, f"{_slug(layout)}_from_{Path(src).parent.name}")
        _copy_checkpoint(src, 2, f"{dst}/resumed")
        _copy_checkpoint(src, 2, f"{dst}/reloaded")
        _reload_and_save(_run(model, layout, world, f"{dst}/reloaded"), f"{dst}/resaved")
        out[(src, layout)] = {"losses": _losses(_run(model, layout, world, f"{dst}/resumed"), tokens), "dir": dst}
    return out


def _full_state(path: Path) -> dict:
    """Every tensor of a checkpoint, whole, read in this one process."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent / (path.name + ".pt")
    dcp_to_torch_save(path, out)
    return {k: v for k, v in torch.load(out).items() if not k.startswith("rng.")}


def _assert_same_state(saved: Path, resaved: Path) -> None:
    import torch

    a, b = _full_state(saved), _full_state(resaved)
    assert a.keys() == b.keys() and any(k.startswith("optim.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _slug(layout: str) -> str:
    return layout.replace(",", "_").replace("=", "")


# World 4, per model: the uninterrupted runs, and (source run, target layout) reshardings across dp/zero/tp,
# into and out of hybrid sharding and context parallelism, KV-head copies (tp=4 > kv_heads=2) and expert
# parallelism (etp=tp and etp=1). A source "two:L" is the 2-process run of L.
FULL = {"odd": ["fsdp=4", "tp=2,pp=2"], "kv": ["tp=4"], "tiny-moe": ["dp=4,ep=2,zero=1"]}
RESHARDED = {"odd": [("fsdp=4", "dp=2,tp=2"), ("two:dp=2,zero=1", "fsdp=4"), ("fsdp=4", "dp=4,zero=3,shard=2"),
                     ("two:dp=2,zero=1", "cp=2,dp=2,zero=3")],
             "kv": [("tp=4", "cp=2,dp=2,zero=1"), ("tp=4", "dp=2,tp=2")],
             "tiny-moe": [("dp=4,ep=2,zero=1", "dp=4,ep=4,zero=3"), ("dp=4,ep=2,zero=1", "dp=2,ep=2,tp=2"),
                          ("dp=4,ep=2,zero=1", "dp=2,zero=1,tp=2,ep=2,etp=1")]}  # EP across TP, whole experts


def _source(root: str, from_two: str, layout: str) -> str:
    return f"{from_two}/{_slug(layout[4:])}/full" if layout.startswith("two:") else f"{root}/{_slug(layout)}/full"


def _four_rank_cases(rank, world, root, models, from_two):
    """World 4: the same-layout cases, the FULL runs, then the RESHARDED cases."""
    out = {"same": _same_layout_cases(rank, world, root, models["odd"]), "full": {}, "resharded": {}}
    for key, layouts in FULL.items():
        for layout in layouts:
            out["full"][layout] = _losses(_run(models[key], layout, world, _source(root, from_two, layout)), _tokens())
    for key, cases in RESHARDED.items():
        out["resharded"].update(_resharded(rank, world, root, models[key],
                                           [(_source(root, from_two, src), dst) for src, dst in cases]))
    return out


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("spec") / "tiny-odd.json"
    path.write_text(json.dumps(SPEC))
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory, model_file) -> dict:
    kv = tmp_path_factory.mktemp("spec") / "tiny-kv.json"  # tp=4 holds copies of the 2 KV heads
    kv.write_text(json.dumps({**SPEC, "name": "tiny-kv", "vocab": 256}))
    return {"odd": model_file, "kv": str(kv), "tiny-moe": "tiny-moe"}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, model_file):
    root = tmp_path_factory.mktemp("ckpt2")
    return str(root), run_ranks(2, _same_layout_cases, str(root), model_file)[0]


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory, models, two_ranks):
    root = tmp_path_factory.mktemp("ckpt4")
    return str(root), run_ranks(4, _four_rank_cases, str(root), models, two_ranks[0])[0]


def _close(a: list, b: list) -> bool:
    return len(a) == len(b) > 0 and all(abs(x - y) <= REL * abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize("world", [2, 4])
def test_resume_under_the_same_layout_is_bit_exact(world, two_ranks, four_ranks):
    results = two_ranks[1] if world == 2 else four_ranks[1]["same"]
    assert set(results) == set(SAME_LAYOUT[world])
    for layout, r in results.items():
        assert len(r["full"]) == STEPS and r["once"] == r["full"][2:], layout
        assert r["kept"] == [2, 3, 4], layout  # keep=3 of the four saves
        if layout == TWICE:
            assert r["twice"] == r["full"][3:], layout


def test_an_async_checkpoint_holds_the_state_of_its_step_and_resumes_bit_exact(two_ranks):
    """--async-save (in the runs resumed from step 2): the step after a save changes the weights while the save
    is written; the checkpoint holds the state of its own step (equal to the synchronous run's), retention works
    from the saving thread, and a resume from an async checkpoint continues bit for bit."""
    results = two_ranks[1]
    for layout in ASYNC:
        r, full = results[layout]["async"], results[layout]["full"]
        assert results[layout]["once"] == full[2:] and r["resumed"] == full[3:], layout
        assert r["kept"] == [2, 3, 4], layout
        base = Path(r["dir"])
        # step 3 was written while step 3 ran and changed the weights
        _assert_same_state(base / "full" / "step-00000003", base / "once" / "step-00000003")


def test_resharded_resume_within_four_processes(two_ranks, four_ranks):
    """Every RESHARDED case: the reloaded state, saved again under the new layout, equals the saved one, and
    the losses continue the uninterrupted source run's."""
    root, results = four_ranks
    assert len(results["resharded"]) == sum(map(len, RESHARDED.values()))
    full = {_source(root, "", layout): losses for layout, losses in results["full"].items()}
    full[_source("", two_ranks[0], "two:dp=2,zero=1")] = two_ranks[1]["dp=2,zero=1"]["full"]
    for (src, layout), r in results["resharded"].items():
        assert _close(r["losses"], full[src][2:]), (src, layout, r["losses"], full[src])
        _assert_same_state(Path(src) / "step-00000002", Path(r["dir"]) / "resaved" / "step-00000002")


def test_resharded_resume_to_fewer_processes(tmp_path, model_file, two_ranks, four_ranks):
    """tp=2,pp=2 (4 processes) -> dp=2,zero=3 (2); pp=2 (2) -> one process."""
    src4 = f"{four_ranks[0]}/tp2_pp2/full"
    (r,) = run_ranks(2, _resharded, str(tmp_path), model_file, [(src4, "dp=2,zero=3")])[0].values()
    assert _close(r["losses"], four_ranks[1]["full"]["tp=2,pp=2"][2:])
    _assert_same_state(Path(src4) / "step-00000002", Path(r["dir"]) / "resaved" / "step-00000002")

    src2 = f"{two_ranks[0]}/pp2_schedule1f1b/full"
    (one,) = _resharded(0, 1, str(tmp_path), model_file, [(src2, "dp=1")]).values()
    assert _close(one["losses"], two_ranks[1]["pp=2,schedule=1f1b"]["full"][2:])
    _assert_same_state(Path(src2) / "step-00000002", Path(one["dir"]) / "resaved" / "step-00000002")


# ---- one process: a save cut short, checksums, the cost model's size, bad input ----------------------
@pytest.fixture(scope="module")
def one_process(tmp_path_factory, model_file):
    """An uninterrupted single-process run saving every step (keep 3): its losses and checkpoint root."""
    root = tmp_path_factory.mktemp("ckpt1")
    return str(root), _losses(_run(model_file, "dp=1", 1, f"{root}/full"), _tokens())


def test_a_save_cut_short_leaves_the_previous_checkpoint_usable(tmp_path, model_file, one_process, monkeypatch):
    from meshscale.runtime.resilience import checkpoint

    root, reference = one_process
    _copy_checkpoint(f"{root}/full", 2, str(tmp_path))
    commit = checkpoint._commit

    def die_before_committing_step_3(path, manifest):
        if manifest["step"] == 3:  # every shard is on disk, the manifest is not
            raise RuntimeError("crash between the shard writes and the commit")
        commit(path, manifest)

    monkeypatch.setattr(checkpoint, "_commit", die_before_committing_step_3)
    with pytest.raises(RuntimeError, match="crash between"):
        _losses(_run(model_file, "dp=1", 1, str(tmp_path)), _tokens())
    assert (tmp_path / "step-00000003" / ".metadata").exists()
    assert [s for s, _ in checkpoint.complete(tmp_path)] == [2]
    monkeypatch.setattr(checkpoint, "_commit", commit)
    hashed, sha256 = [], checkpoint._sha256
    monkeypatch.setattr(checkpoint, "_sha256", lambda path: hashed.append(Path(path)) or sha256(path))
    assert _losses(_run(model_file, "dp=1", 1, str(tmp_path)), _tokens()) == reference[2:]
    assert [s for s, _ in checkpoint.complete(tmp_path)] == [2, 3, 4]
    # every file hashed once: step 2's by the pre-start check only (not again by the resume), 3's and 4's as saved
    assert sorted(hashed) == sorted(set(hashed)) and {p.parent.name for p in hashed} == {
        "step-00000002", "step-00000003", "step-00000004"}


@pytest.mark.parametrize("damage", ["truncate", "alter"])
def test_a_damaged_shard_is_refused_by_its_checksum(tmp_path, one_process, model_file, damage, capsys):
    from meshscale.cli import main

    _copy_checkpoint(f"{one_process[0]}/full", 2, str(tmp_path))
    shard = tmp_path / "step-00000002" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2:]
    else:
        data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as e:
        main(["train", "--model", model_file, "--steps", str(STEPS), "--checkpoint-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "__0_0.distcp fails its sha256 check" in err and "delete" in err


def test_checkpoint_size_is_what_the_cost_model_predicts(one_process, model_file):
    """The tensors DCP wrote total exactly params x (4 + 8) bytes, at fp32 and at bf16 (our parameters stay fp32
    under autocast); the files add only a small serialisation overhead per tensor."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from meshscale.cost.checkpoint import checkpoint_bytes
    from meshscale.specs.layout import Layout
    from meshscale.specs.model import load_model

    path = Path(one_process[0]) / "full" / "step-00000004"
    meta = FileSystemReader(path).read_metadata().state_dict_metadata
    tensors = {k: m for k, m in meta.items() if isinstance(m, TensorStorageMetadata) and not k.startswith("rng.")}
    payload = sum(m.size.numel() * m.properties.dtype.itemsize for m in tensors.values())
    spec = load_model(model_file)
    for precision in ("fp32", "bf16"):
        assert payload == checkpoint_bytes(spec, Layout(dp=1), precision)[1] == spec.param_count() * 12
    on_disk = sum(f.stat().st_size for f in path.glob("*.distcp"))
    assert payload < on_disk < payload + 4096 * (len(tensors) + 1)


def _tree(root: Path) -> dict:
    return {str(f.relative_to(root)): (f.stat().st_size, f.stat().st_mtime_ns) for f in root.rglob("*")}


def _bad_cases() -> list:
    """(extra arguments, what the one line must say, how to prepare the directory)."""
    def damaged_manifest(d: Path):
        (d / "step-00000002" / "manifest.json").write_text("{not json")

    def missing_shard(d: Path):
        (d / "step-00000002" / "__0_0.distcp").unlink()

    def edit_manifest(**fields):
        def edit(d: Path):
            path = d / "step-00000002" / "manifest.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
        return edit

    def stray(d: Path):
        (d / "step-00000001").write_text("notes")  # a file named like a checkpoint

    return [
        (["--keep", "1"], "--keep must be at least 2", None),
        ([], "its manifest.json says step 7, not what the directory holds", edit_manifest(step=7)),
        ([], "its manifest.json lists no DCP .metadata file", edit_manifest(files={})),
        ([], "holds step-00000001, which is not a meshscale checkpoint", stray),
        (["--checkpoint-every", "0"], "--checkpoint-every must be at least 1", None),
        (["--model", "tiny"], "holds a different model (layers 4 vs 8", None),
        (["--precision", "bf16"], "trained at --precision fp32, not bf16", None),
        (["--steps", "2"], "already reached step 2 of --steps 2", None),
        ([], "unreadable manifest.json", damaged_manifest),
        ([], "file __0_0.distcp is missing", missing_shard),
        (["--max-restarts", "1", "--checkpoint-dir", ""], "pass --checkpoint-dir DIR too", None),
        # another run's checkpoint: its settings must match, or the user says they may change
        (["--seed", "1", "--global-batch", "4"], ("saved by a run with other settings (--seed 0 -> 1; "
                                                   "--global-batch 8 -> 4)"), None),
        (["--lr", "0.001", "--data", __file__], "--data None -> ", None),
    ]


def test_bad_checkpoint_input_is_one_line_and_changes_nothing(tmp_path, one_process, model_file, capsys):
    from meshscale.cli import main

    for i, (extra, message, prepare) in enumerate(_bad_cases()):
        d = tmp_path / f"case{i}"
        _copy_checkpoint(f"{one_process[0]}/full", 2, str(d))
        if prepare:
            prepare(d)
        before = _tree(d)
        args = ["train", "--model", model_file, "--steps", str(STEPS), "--checkpoint-dir", str(d), *extra]
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and message in err, (extra, err)
        assert _tree(d) == before, extra
    _copy_checkpoint(f"{one_process[0]}/full", 2, str(tmp_path / "allowed"))
    _run(model_file, "dp=1", 1, str(tmp_path / "allowed"), seed=1, allow_config_change=True)  # accepted
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    for target, message in ((not_a_dir, "is a file"), (not_a_dir / "sub", "is not writable")):
        with pytest.raises(SystemExit):
            main(["train", "--model", model_file, "--checkpoint-dir", str(target)])
        assert message in capsys.readouterr().err
    assert not_a_dir.read_text() == "x"


@pytest.mark.parametrize("fused", [True, None])
def test_the_optimizer_state_made_before_the_first_step_is_what_torch_makes(fused):
    """A checkpoint before the first step (or a resume) makes AdamW's state itself: its step count must be the
    tensor torch's own first step makes (float32; on the parameter's device for the fused kernel, the
    trainer's on GPUs, which reads it there), for the fused and the default kernels alike, and so made it
    steps as torch's own does."""
    import torch

    from meshscale.runtime.resilience.checkpoint import _ensure_optimizer_state, step_tensor

    def adamw():
        p = torch.nn.Parameter(torch.ones(4))
        p.grad = torch.full((4,), 0.5)
        return p, torch.optim.AdamW([p], lr=0.1, fused=fused)

    (ours, ours_opt), (theirs, theirs_opt) = adamw(), adamw()
    _ensure_optimizer_state(ours_opt)
    theirs_opt.step()
    made = theirs_opt.state[theirs]["step"]
    for opt, p in ((ours_opt, ours), (theirs_opt, theirs)):
        opt.state[p]["step"] = step_tensor(opt.param_groups[0], p, 0)
        for k in ("exp_avg", "exp_avg_sq"):
            opt.state[p][k].zero_()
        p.data.fill_(1.0)
    mine = ours_opt.state[ours]["step"]
    assert (mine.dtype, mine.device) == (made.dtype, made.device) == (torch.float32, ours.device)
    ours_opt.step()
    theirs_opt.step()
    assert torch.equal(ours, theirs) and float(ours_opt.state[ours]["step"]) == 1.0
    assert step_tensor(ours_opt.param_groups[0], ours, 7).dtype == torch.float32
