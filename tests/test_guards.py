"""Hangs, numerical guards and silent data corruption, each provoked through MESHSCALE_FAULT on real gloo
ranks: the guard fires at the right step, names the right rank (and parameter), and every rank decides alike."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from multirank import run_ranks

ROOT = Path(__file__).resolve().parents[1]


# ---- rules, without processes --------------------------------------------------------------------------
def test_spike_rule_needs_warmup_and_flags_only_far_outliers():
    import math

    from meshscale.runtime.resilience.guards import SpikeRule

    rule = SpikeRule(sigma=6.0, window=10, warmup=5)
    values = (1.0, 1.2, 0.8, 1.1, 0.9)
    for v in values:
        assert rule.exceeded(100.0) is None  # warm-up: nothing is a spike yet
        rule.accept(v)
    logs = [math.log(v) for v in values]
    mean = sum(logs) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in logs) / 5)
    assert rule.threshold() == pytest.approx(math.exp(mean + 6 * std))  # 2.34 for values around 1 +- 15%
    assert rule.exceeded(2.3) is None and rule.exceeded(2.4) is not None
    flat = SpikeRule(sigma=6.0, window=10, warmup=3)
    for _ in range(5):
        flat.accept(2.0)
    assert flat.exceeded(2.6) is None and flat.exceeded(2.8) is not None  # std floored at 0.05: x e^0.3
    for _ in range(10):  # the window slides: old values leave
        rule.accept(10.0)
    assert rule.exceeded(12.0) is None and rule.exceeded(14.0) is not None
    assert SpikeRule(sigma=0).exceeded(1e9) is None  # off


def test_an_injected_spike_stops_a_clean_run_at_its_step(monkeypatch):
    """One process, the trainer's default rule: a loss (so gradients) x 20 at step 24 of a batch-2 run, the
    noisiest batch of benchmarks/spike_guard_sweep.py, is caught at that step and nowhere before it. (The
    gradient norm, which grows and varies through the warm-up, is not yet steady enough to call x 20 a spike.)"""
    import torch

    from meshscale.runtime.loop.config import TrainConfig, resolve
    from meshscale.runtime.loop.trainer import train
    from meshscale.runtime.resilience.guards import TrainingStopped

    monkeypatch.setenv("MESHSCALE_FAULT", "spike@step=24,factor=20")
    run = resolve(TrainConfig(steps=30, global_batch=2, seq=16, val_batches=1), 1)
    with pytest.raises(TrainingStopped, match=r"^step 24: loss spike [\d.]+ > "):
        train(run, torch.device("cpu"), log=False)


def test_one_process_finds_a_nan_gradient_by_its_norm(monkeypatch):
    """With no reduce to come before, one process has no gradient hooks (~3% of a `tiny` step): a NaN gradient
    is found by the gradient norm, at its step, and named as what it is."""
    import torch

    from meshscale.runtime.loop.config import TrainConfig, resolve
    from meshscale.runtime.loop.trainer import Training
    from meshscale.runtime.resilience.guards import TrainingStopped

    monkeypatch.setenv("MESHSCALE_FAULT", "nan@step=2,param=norm.weight")
    training = Training(resolve(TrainConfig(steps=4, seq=16, val_batches=1), 1), torch.device("cpu"), None, False)
    assert [name for name, p in training.named if p._backward_hooks] == ["norm.weight"]  # the fault's hook only
    with pytest.raises(TrainingStopped, match=r"^step 2: non-finite gradient; stopped"):
        training.run()


def test_a_gradient_norm_outlier_beside_a_steady_loss_is_no_spike():
    """Clean runs have them (benchmarks/spike_guard_sweep.py, 15 runs of 2,000 steps: the norm's largest z
    8.4-25.5, the loss's 2.8-5.2): the guard judges the loss; a norm of 36 among norms of 1-1.1 passes, a loss
    x 20 does not."""
    import torch

    from meshscale.runtime.resilience.guards import Guards

    guards = Guards([], "stop", 6.0, False, torch.device("cpu"))

    def decided(step, loss, norm):
        return guards.decide(step, guards.exchange(loss, loss, 0, torch.tensor(norm ** 2)), norm)

    for step in range(40):
        loss = torch.tensor(3.0 + 0.01 * (step % 3))
        control = decided(step, loss, 36.0 if step == 30 else 1.0 + 0.1 * (step % 2))
        assert control.anomaly is None, control.anomaly.message
        guards.healthy(control.loss)
    assert decided(40, torch.tensor(60.0), 1.0).anomaly.kind == "spike"


def test_fingerprint_sees_every_single_bit_and_majority_names_the_odd_replica():
    import torch

    from meshscale.runtime.resilience.sdc import fingerprint, outliers

    t = torch.randn(100)
    base = int(fingerprint(t))
    for bit in range(32):
        flipped = t.clone()
        flipped.view(torch.int32)[37] ^= (1 << bit) if bit < 31 else -(1 << 31)
        assert int(fingerprint(flipped)) != base
    assert outliers([5, 5, 7, 5]) == [2] and outliers([5, 5]) == [] and outliers([5, 7]) == [0, 1]


def test_hang_diagnosis_names_the_rank_behind_ahead_or_silent():
    from meshscale.runtime.resilience.watchdog import diagnose

    def beat(step, phase, calls=0, last=None, alive=100.0):
        return {"step": step, "phase": phase, "since": 80.0, "alive": alive, "calls": calls, "last": last}

    waiting = beat(3, "forward/backward", 1, "dp all_reduce")
    stuck = diagnose({0: waiting, 1: beat(3, "start")}, 100.0, 10, 5)
    assert stuck.startswith("hang: rank 1 made no progress") and "rank 0 waited at step 3 in forward/backward" in stuck
    assert "last collective dp all_reduce" in stuck
    skipped = diagnose({0: waiting, 1: beat(3, "gradient norm", 0), 2: waiting}, 100.0, 10, 5)
    assert skipped.startswith("hang: rank 1 ") and "ranks 0, 2 waited" in skipped
    silent = diagnose({0: waiting, 1: waiting, 2: beat(3, "forward/backward", 1, alive=50.0), 3: None}, 100.0, 10, 5)
    assert silent.startswith("hang: ranks 2, 3 sent no heartbeat")
    assert "none is behind" in diagnose({0: waiting, 1: waiting}, 100.0, 10, 5)


# ---- on gloo ranks ---------------------------------------------------------------------------------------
def _train(world, layout, fault="", steps=6, **options):
    """Train tiny (short sequences) under MESHSCALE_FAULT=fault; returns (rows, None) or (rows so far, the
    one-line stop message)."""
    import torch

    from meshscale.runtime.loop.config import TrainConfig, resolve
    from meshscale.runtime.resilience.guards import TrainingStopped
    from meshscale.runtime.loop.trainer import train

    os.environ["MESHSCALE_FAULT"] = fault
    cfg = TrainConfig(layout=layout, steps=steps, global_batch=4, seq=16, warmup=2, val_batches=1, **options)
    tokens = torch.randint(0, 256, (1 << 15,), generator=torch.Generator().manual_seed(0)).numpy()
    try:
        return [(r["loss"], r["anomalies"]) for r in train(resolve(cfg, world), torch.device("cpu"), tokens,
                                                           log=False)["rows"]], None
    except TrainingStopped as e:
        return None, str(e)
    finally:
        os.environ.pop("MESHSCALE_FAULT")


def _two_ranks(rank, world):
    return {
        # non-finite loss, stop: DDP and FSDP; the producing rank and the step are named
        "ddp_loss": _train(world, "dp=2", "nan@step=2,rank=1"),
        "fsdp_loss": _train(world, "dp=2,zero=3", "nan@step=3,rank=1"),
        # a gradient turned NaN before the reduce (the loss stays finite): DDP skips, ZeRO-2 stops
        "ddp_grad_skip": _train(world, "dp=2", "nan@step=2,rank=1,param=3", on_anomaly="skip"),
        "zero2_grad": _train(world, "dp=2,zero=2", "nan@step=2,rank=0,param=5"),
        # pipeline stages alone: no collective mixes gradients, so the rank's own share of the norm names it
        "pp_grad": _train(world, "pp=2", "nan@step=2,rank=1,param=3"),
        # replay: a one-off NaN is transient (the replay's step is applied), a repeated one persistent
        "transient": _train(world, "dp=2,zero=1", "nan@step=2,rank=1", replay_anomalies=True),
        "persistent": _train(world, "dp=2", "nan@step=2,rank=1,times=2", replay_anomalies=True, on_anomaly="skip"),
        "clean": _train(world, "dp=2,zero=1", steps=4),
        # bit flips in replicated tensors: two replicas are both named
        "flip_dp": _train(world, "dp=2", "bitflip@step=4,rank=1,param=layers.2.attention.wq.weight",
                          steps=12, sdc_check_every=5),
        "flip_tp": _train(world, "tp=2", "bitflip@step=1,rank=0,param=layers.0.ffn_norm.weight,bit=10",
                          steps=12, sdc_check_every=5),
    }


def test_nonfinite_guard_replay_and_two_replica_sdc_on_two_ranks():
    results = run_ranks(2, _two_ranks)
    for out in results:
        assert repr(out) == repr(results[0]), "every rank must reach the same decision"  # NaN != NaN
    out = results[0]
    assert out["ddp_loss"][1].startswith("step 2: non-finite loss on rank 1; ")
    assert out["fsdp_loss"][1].startswith("step 3: non-finite loss on rank 1; ")
    rows, _ = out["ddp_grad_skip"]
    assert [a["message"] for a in rows[2][1]] == \
        ["step 2: non-finite gradient on rank 1 before the reduce; optimizer step skipped on every rank"]
    assert all(not a for _, a in rows[3:]) and all(loss == loss for loss, _ in rows[3:])  # finite, going on
    assert out["zero2_grad"][1].startswith("step 2: non-finite gradient on rank 0 before the reduce; stopped")
    assert out["pp_grad"][1].startswith("step 2: non-finite gradient on rank 1; stopped")

    clean, _ = out["clean"]
    transient, _ = out["transient"]
    assert transient[2][1][0]["replay"] == "transient" and transient[2][1][0]["action"] == "continue"
    # the replayed step is the step itself: the run continues exactly as a clean one
    assert [loss for loss, _ in transient[:4]] == [loss for loss, _ in clean]
    persistent, _ = out["persistent"]
    assert [(a["replay"], a["action"], a["ranks"]) for a in persistent[2][1]] == [("persistent", "skip", [1])]

    assert out["flip_dp"] == (None, "step 4: silent data corruption: layers.2.attention.wq.weight differs between "
                              "its dp replicas on ranks 0, 1 (no majority: either may be the corrupted one); stopped "
                              "(a step cannot undo a corrupted replica: restart from a checkpoint)")
    assert out["flip_tp"][1].startswith("step 4: silent data corruption: layers.0.ffn_norm.weight differs between "
                                        "its tp replicas on ranks 0, 1")


def _four_ranks(rank, world):
    return {
        "flip_dp": _train(world, "dp=4", "bitflip@step=2,rank=2,param=norm.weight,bit=3", steps=8,
                          sdc_check_every=4),
        # tp=2 x dp=2: the flipped norm weight differs in its dp pair and in its tp pair; only rank 3 in both
        "flip_tp": _train(world, "dp=2,tp=2", "bitflip@step=5,rank=3,param=layers.1.attention_norm.weight,bit=0",
                          steps=8, sdc_check_every=4),
        # no false positive: 80 clean steps, parameters and optimizer state compared 20 times
        "clean": _train(world, "dp=2,tp=2", steps=80, sdc_check_every=4),
        # under EP each dp rank holds other experts: only the dense weights and the experts' own replicas compare
        "moe": _train(world, "dp=4,ep=2", steps=4, sdc_check_every=2, model="tiny-moe"),
        # the dp x cp ranks are replicas; under hybrid sharding ranks 1 and 3 hold copies of the same shard
        "flip_cp": _train(world, "dp=2,cp=2", "bitflip@step=1,rank=1,param=norm.weight,bit=3", steps=4,
                          sdc_check_every=2),
        "flip_hsdp": _train(world, "dp=4,zero=3,shard=2", "bitflip@step=1,rank=1,param=norm.weight,bit=3", steps=4,
                            sdc_check_every=2),
    }


def test_bit_flip_is_pinned_on_its_rank_and_a_clean_run_stays_clean_on_four_ranks():
    results = run_ranks(4, _four_ranks)
    for out in results:
        assert repr(out) == repr(results[0])
    out = results[0]
    assert out["flip_dp"][1].startswith("step 3: silent data corruption: norm.weight on rank 2 differs from its dp "
                                        "replicas; stopped")
    assert out["flip_tp"][1].startswith("step 7: silent data corruption: layers.1.attention_norm.weight on rank 3 "
                                        "differs from its dp/tp replicas; stopped")
    rows, stopped = out["clean"]
    assert stopped is None and len(rows) == 80 and not any(a for _, a in rows)
    rows, stopped = out["moe"]
    assert stopped is None and not any(a for _, a in rows)
    assert out["flip_cp"][1].startswith("step 1: silent data corruption: norm.weight on rank 1 differs from its dp "
                                        "replicas; stopped")
    assert out["flip_hsdp"][1].startswith("step 1: silent data corruption: norm.weight differs between its dp "
                                          "replicas on ranks 1, 3 (no majority")


def _rollback(rank, world, root):
    saved = dict(steps=8, checkpoint_every=2, on_anomaly="rollback")
    return {
        "clean": _train(world, "dp=2", steps=8),
        # a flipped replica is found by the SDC check after step 4 and repaired from the checkpoint of step 4
        "flip": _train(world, "dp=2", "bitflip@step=4,rank=1,param=norm.weight", sdc_check_every=1,
                       checkpoint_dir=f"{root}/flip", **saved),
        "clean_zero1": _train(world, "dp=2,zero=1", steps=8),
        # a NaN at step 3 goes back to the checkpoint of step 2
        "nan": _train(world, "dp=2,zero=1", "nan@step=3,rank=0", checkpoint_dir=f"{root}/nan", **saved),
        "nothing_saved": _train(world, "dp=2", "nan@step=1,rank=1", checkpoint_dir=f"{root}/none", **saved),
        # issue 21's scenario: a flip at step 1, checks every 4 steps, a save after every step: no save may hold
        # the flipped replica, so the run must end with the weights of a clean run
        "flip_between_checks": _train(world, "dp=2", "bitflip@step=1,rank=0", steps=8, checkpoint_every=1,
                                      sdc_check_every=4, on_anomaly="rollback", checkpoint_dir=f"{root}/flip1"),
        "clean_saved": _train(world, "dp=2", steps=8, checkpoint_dir=f"{root}/clean"),
        # a NaN that every rerun of step 3 brings back: three rollbacks to the checkpoint of step 2, then a stop
        "persistent": _train(world, "dp=2,zero=1", "nan@step=3,rank=0,times=10", checkpoint_dir=f"{root}/persistent",
                             **saved),
    }


def test_rollback_reloads_the_newest_checkpoint_and_finishes_like_a_clean_run(tmp_path):
    out = run_ranks(2, _rollback, str(tmp_path))[0]
    for case, clean, at, back in (("flip", "clean", 4, 4), ("nan", "clean_zero1", 3, 2)):
        rows, stopped = out[case]
        assert stopped is None
        flagged = [a for _, anomalies in rows for a in anomalies]
        assert [a["action"] for a in flagged] == ["rollback"]
        assert flagged[0]["kind"] == ("sdc" if case == "flip" else "nonfinite")
        losses = [loss for loss, _ in out[clean][0]]
        # every step before the anomaly, its own row, then the steps from the checkpoint on, bit for bit
        assert len(rows) == at + 1 + 8 - back and flagged[0]["message"].startswith(f"step {at}: ")
        assert [loss for loss, _ in rows[-(8 - back):]] == losses[back:]
    assert out["nothing_saved"][1].startswith("step 1: non-finite loss on rank 1")
    assert "no complete checkpoint" in out["nothing_saved"][1]

    rows, stopped = out["flip_between_checks"]
    flagged = [a for _, anomalies in rows for a in anomalies]
    assert stopped is None and [(a["kind"], a["action"]) for a in flagged] == [("sdc", "rollback")]
    assert flagged[0]["message"].startswith("step 1: ")  # found by the check before the save of step 2
    assert [loss for loss, _ in rows[-7:]] == [loss for loss, _ in out["clean_saved"][0][1:]]
    final, clean = (_saved_state(tmp_path / name / "step-00000008") for name in ("flip1", "clean"))
    assert final.keys() == clean.keys() and any(k.startswith("optim.") for k in final)
    for key in final:
        assert torch.equal(final[key], clean[key]), key
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "flip1").glob("step-*/manifest.json")]
    assert manifests and all(m["verified"] for m in manifests)

    assert out["persistent"][0] is None
    assert out["persistent"][1].startswith("step 3: non-finite loss on rank 0; ")
    assert out["persistent"][1].endswith(f"; rolled back to {tmp_path}/persistent/step-00000002 3 times already "
                                         "(--max-rollbacks 3): stopped, the anomaly persists")


def _saved_state(path: Path) -> dict:
    """Every tensor of a checkpoint but the RNG states, whole, read in this process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent.parent / (path.parent.name + ".pt")
    dcp_to_torch_save(path, out)
    return {k: v for k, v in torch.load(out).items() if not k.startswith("rng.")}


def _processes_tagged(tag: str) -> list[int]:
    """Our processes whose environment carries `tag` (other users' processes are not readable)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if tag.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def test_a_hung_rank_ends_the_job_naming_it_within_the_timeout():
    tag = f"MESHSCALE_TEST_HANG={os.getpid()}-{time.time()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MESHSCALE_FAULT": "hang@step=3,rank=1",
           tag.split("=")[0]: tag.split("=", 1)[1]}
    out = subprocess.run([sys.executable, "-m", "meshscale", "train", "--nproc", "2", "--steps", "20", "--seq", "16",
                          "--global-batch", "4", "--timeout", "10"], env=env, capture_output=True, text=True,
                         timeout=600, cwd=ROOT)  # never an endless wait, even on a loaded machine
    assert out.returncode == 2, out.stderr
    error = out.stderr.strip().splitlines()
    assert len(error) == 1 and "hang: rank 1 made no progress for" in error[0] and "at step 3" in error[0], out.stderr
    stalled = float(re.search(r"no progress for (\d+) s", error[0]).group(1))
    assert 10 <= stalled <= 20  # detected one timeout (plus the watchdog's interval) after rank 1 stopped
    assert _processes_tagged(tag) == []  # no worker left behind
