"""TensorBoard event files, a W&B offline run and torch profiler traces written by `meshscale train`, read
back: each step's measured values as the JSONL has them, the prediction beside them."""

import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import meshscale

ROOT = Path(__file__).parent.parent
STEPS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install '.[test]')")
    pytest.importorskip("wandb", reason="wandb is not installed (pip install '.[test]')")
    out = tmp_path_factory.mktemp("live")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "WANDB_MODE": "offline"}
    r = subprocess.run([sys.executable, "-m", "meshscale", "train", "--model", "tiny", "--steps", str(STEPS),
                        "--global-batch", "4", "--device", "cpu", "--metrics-out", str(out / "m.jsonl"),
                        "--tensorboard", str(out / "tb"), "--wandb", str(out / "wb"), "--profile", "1-2",
                        "--profile-dir", str(out / "prof")], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]
    predicted = meshscale.predict("tiny", "local-cpu", "dp=1", global_batch=4, precision="fp32", devices=1)
    return out, rows, predicted


def test_tensorboard_events_hold_measured_beside_predicted(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, rows, predicted = run
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    for key in ("loss", "grad_norm", "step_time_s", "peak_memory_bytes"):
        got = [(e.step, e.value) for e in events.Scalars(f"train/{key}")]
        assert got == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in rows]
    assert [e.value for e in events.Scalars("predicted/step_time_s")] == [pytest.approx(predicted.step_time_s)] * STEPS
    assert [e.value for e in events.Scalars("predicted/peak_memory_bytes")] == \
        [pytest.approx(predicted.memory_per_device_bytes["total"])] * STEPS
    mfu = [e.value for e in events.Scalars("train/mfu")]  # the same FLOPs over the measured time
    assert mfu == [pytest.approx(predicted.mfu * predicted.step_time_s / r["step_time_s"], rel=1e-5) for r in rows]


def wandb_history(path: str) -> list[dict]:
    """The history records of a W&B run file: a ':W&B' header, then LevelDB's log format (32 KiB blocks of
    records with a 7-byte header: CRC, length, type FULL/FIRST/MIDDLE/LAST) holding W&B's Record protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, part, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's zero padding
            pos += left
            continue
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            part = b""
            if record.WhichOneof("record_type") == "history":
                out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return out


def test_wandb_offline_run_holds_measured_beside_predicted(run):
    out, rows, predicted = run
    (path,) = glob.glob(str(out / "wb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    history = wandb_history(path)
    assert [h["_step"] for h in history] == [r["step"] for r in rows]
    assert [h["train/loss"] for h in history] == [pytest.approx(r["loss"]) for r in rows]
    assert all(h["predicted/step_time_s"] == pytest.approx(predicted.step_time_s) for h in history)
    assert all(h["train/comm_bytes"] == h["predicted/comm_bytes"] == 0 for h in history)  # one rank: nothing sent


def test_profiler_traces_the_chosen_steps(run):
    out, _, _ = run
    assert sorted(p.name for p in (out / "prof").iterdir()) == ["step1-rank0.json", "step2-rank0.json"]
    trace = json.loads((out / "prof" / "step1-rank0.json").read_text())
    assert any(e.get("name", "").startswith("aten::mm") for e in trace["traceEvents"])


def test_bad_profile_steps_are_one_line(capsys):
    from meshscale.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["train", "--model", "tiny", "--steps", "4", "--profile", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "--profile" in err[0]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here: the snapshot runs")
def test_memory_snapshot_on_cpu_is_refused_before_the_start(capsys, tmp_path):
    from meshscale.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["train", "--model", "tiny", "--steps", "4", "--memory-snapshot", "1-2", "--memory-snapshot-dir",
              str(tmp_path / "mem")])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "--memory-snapshot records the CUDA" in err[0]
    assert not (tmp_path / "mem").exists()


def test_memory_snapshot_files_are_checked_before_the_start(tmp_path):
    """What a GPU run checks first (the CUDA path itself runs in benchmarks/gpu_check.py): the steps, a folder
    that can be written, and no snapshot already there unless --overwrite."""
    from dataclasses import replace

    from meshscale.errors import UserError
    from meshscale.runtime.loop.config import TrainConfig
    from meshscale.runtime.measure.live import check_snapshot_files, snapshot_path

    cfg = TrainConfig(steps=4, memory_snapshot="1-2", memory_snapshot_dir=str(tmp_path / "new" / "mem"))
    check_snapshot_files(cfg, world=2)  # a folder still to be made under a writable one
    with pytest.raises(UserError, match=r"--memory-snapshot '4': give steps in \[0, 4\)"):
        check_snapshot_files(replace(cfg, memory_snapshot="4"), world=2)
    taken = snapshot_path(tmp_path, 1, 2, 1)
    assert taken.name == "steps1-2-rank1.pickle"
    taken.write_bytes(b"keep me")
    with pytest.raises(UserError, match="already exists"):
        check_snapshot_files(replace(cfg, memory_snapshot_dir=str(tmp_path)), world=2)
    check_snapshot_files(replace(cfg, memory_snapshot_dir=str(tmp_path), overwrite=True), world=2)
    assert taken.read_bytes() == b"keep me"
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is not a writable folder"):
        check_snapshot_files(replace(cfg, memory_snapshot_dir=str(tmp_path / "file" / "mem")), world=1)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # root writes anywhere
        with pytest.raises(UserError, match="is not a writable folder"):
            check_snapshot_files(replace(cfg, memory_snapshot_dir=str(locked / "mem")), world=1)


@pytest.mark.parametrize("compile_blocks", [False, True])
def test_a_runs_prediction_costs_our_runtime_whatever_the_cluster_files_software(compile_blocks, tmp_path):
    """train --predict on a GPU preset with Megatron-Core's software and its switches on: torch's framework and
    our gradient buckets, element-wise operators fused only under --compile, ZeRO-1/2 gathers of the fp32
    parameters, none of Megatron-Core's switches (our runtime has none of them; left on they would be refused
    with torch), MoE tokens dispatched by torch's all-to-all as our runtime does; the rest of the preset (its
    kernels, links) as the file says."""
    from meshscale.runtime.loop.config import TrainConfig
    from meshscale.runtime.measure.live import run_cluster
    from meshscale.specs.cluster import FRAMEWORK_SWITCHES, load_cluster

    switches = (*FRAMEWORK_SWITCHES, "cuda_graphs")
    path = tmp_path / "megatron.toml"
    path.write_text('base = "h100-80gb"\n[software]\nmoe_dispatcher = "hybridep"\nfp8_scaling = "delayed"\n'
                    'adam_moments = "bf16"\n' + "".join(f"{k} = true\n" for k in switches))
    preset = load_cluster(str(path))
    assert preset.software.fused_elementwise and not preset.software.param_gather_fp32
    assert all(getattr(preset.software, k) for k in switches)
    cluster = run_cluster(TrainConfig(model="tiny", cluster=str(path), compile=compile_blocks, bucket_mb=1.0))
    sw = cluster.software
    assert (sw.framework, sw.grad_bucket_params, sw.fused_elementwise, sw.param_gather_fp32) == \
        ("torch", 2**18, compile_blocks, True)
    assert not any(getattr(sw, k) for k in switches)
    assert (preset.software.moe_dispatcher, sw.moe_dispatcher) == ("hybridep", "alltoall")
    assert (preset.fp8_scaling, cluster.fp8_scaling) == ("delayed", "current")
    assert (preset.software.adam_moments, sw.adam_moments) == ("bf16", "fp32")
    assert cluster.tiers == preset.tiers
