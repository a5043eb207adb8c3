"""Goodput under failures: Young/Daly checkpoint interval, ETTR, and the --mtbf-hours flags."""

import json
import math

import pytest

from meshscale.cli import main
from meshscale.cost import predict
from meshscale.cost.goodput import LLAMA3_MTBF_HOURS, daly_interval, ettr, goodput, of_prediction
from meshscale.specs.cluster import PRESETS as CLUSTERS
from meshscale.specs.layout import Layout
from meshscale.specs.model import PRESETS as MODELS


def test_daly_interval_tends_to_young_and_maximises_ettr():
    save, mtbf = 10.0, 3600.0
    young = math.sqrt(2 * save * mtbf)
    assert daly_interval(save, mtbf) == pytest.approx(young, rel=0.05)  # first order when save << MTBF
    assert daly_interval(3 * mtbf, mtbf) == mtbf  # Daly: the MTBF once a save takes longer than 2 MTBF
    best = ettr(daly_interval(save, mtbf), save, 300.0, mtbf)
    for k in (0.5, 0.8, 1.25, 2.0):
        assert ettr(k * daly_interval(save, mtbf), save, 300.0, mtbf) < best


def test_ettr_falls_with_devices_and_slower_storage():
    small = goodput(1e9, 1e11, 1024, LLAMA3_MTBF_HOURS)
    big = goodput(1e9, 1e13, 16384, LLAMA3_MTBF_HOURS)
    slow = goodput(1e9, 1e13, 16384, LLAMA3_MTBF_HOURS, bandwidth=1e7)
    assert 0 < slow.ettr < big.ettr < small.ettr < 1
    assert big.interval_s < small.interval_s  # failures come more often: checkpoint more often
    assert big.restart_s > big.save_s


def test_llama3_405b_on_16k_gpus_keeps_most_of_the_machine():
    """Llama 3 (Dubey et al. 2024, sec. 3.3.4) reports over 90% effective training time with 419 interruptions
    in 54 days; with its own MTBF and storage bandwidth the model lands in the same range."""
    pred = predict(MODELS["llama3-405b"], CLUSTERS["h100-80gb"], Layout.parse("tp=8,pp=16,zero=1", 16384), 2048)
    g = of_prediction(pred, LLAMA3_MTBF_HOURS)
    assert g.checkpoint_bytes_total == pytest.approx(MODELS["llama3-405b"].param_count() * 12)  # fp32 master + Adam
    assert 0.85 < g.ettr < 0.99


PREDICT = ["predict", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "64", "--layout", "fsdp=64",
           "--global-batch", "64", "--json"]


def test_predict_and_plan_report_goodput_only_when_asked(capsys):
    main(PREDICT)
    assert "goodput" not in json.loads(capsys.readouterr().out)
    main(PREDICT + ["--mtbf-hours", "50000", "--checkpoint-bandwidth", "1e9"])
    g = json.loads(capsys.readouterr().out)["goodput"]
    assert set(g) == {"checkpoint_bytes_per_device", "checkpoint_bytes_total", "save_s", "interval_s", "restart_s",
                      "ettr"}
    assert g["save_s"] == pytest.approx(g["checkpoint_bytes_per_device"] / 1e9)
    main(["plan", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "64", "--global-batch", "64",
          "--top", "1", "--mtbf-hours", "50000"])
    assert "ETTR" in capsys.readouterr().out


@pytest.mark.parametrize("flag", [["--mtbf-hours", "0"], ["--mtbf-hours", "100", "--checkpoint-bandwidth", "-1"]])
def test_bad_goodput_input_is_one_line_exit_2(flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(PREDICT + flag)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not a positive number" in err


def test_lost_work_with_async_saves_matches_a_simulated_timeline():
    """Steps of 0.25 s, a save every 40 (staging 0.5 s in the step), each committed 1.5 s after it starts
    writing; kills at random times: the work lost is the wall since the newest committed checkpoint's save.
    The mean over many kills is cost/goodput's S / 2 + W (S / 2 alone with synchronous saves)."""
    import random

    from meshscale.cost.goodput import expected_lost_work

    step, every, stage, write = 0.25, 40, 0.5, 1.5
    segment = every * step + stage
    rng = random.Random(0)
    lost = []
    for _ in range(20000):
        t = rng.uniform(10 * segment, 11 * segment)  # a kill, well after the first checkpoints
        saved = (t // segment) * segment  # the newest save's point (its staging done)
        committed = saved if t - saved >= write else saved - segment
        lost.append(t - committed)
    mean = sum(lost) / len(lost)
    assert mean == pytest.approx(expected_lost_work(every * step, stage, write), rel=0.02)
    assert expected_lost_work(every * step, stage) == segment / 2
    assert ettr(10.0, 0.5, 20.0, 300.0, write_s=1.5) < ettr(10.0, 0.5, 20.0, 300.0)


def test_a_measured_restart_time_replaces_the_default(capsys):
    """--restart-seconds (a soak's measured restart) takes the place of the 5-minute relaunch plus the load, in
    predict, plan and scale alike; a shorter restart keeps more of the wall time."""
    main(PREDICT + ["--mtbf-hours", "50000"])
    default = json.loads(capsys.readouterr().out)["goodput"]
    main(PREDICT + ["--mtbf-hours", "50000", "--restart-seconds", "40"])
    measured = json.loads(capsys.readouterr().out)["goodput"]
    assert default["restart_s"] > 300 and measured["restart_s"] == 40
    assert measured["ettr"] > default["ettr"]
    main(["scale", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "64,128", "--tokens-per-device",
          "8192", "--mtbf-hours", "50000", "--restart-seconds", "40", "--json"])
    assert {row["goodput"]["restart_s"] for row in json.loads(capsys.readouterr().out)["rows"]} == {40}


@pytest.mark.parametrize("command", [PREDICT + ["--mtbf-hours", "100"],
                                     ["budget", "--model", "llama2-7b", "--tokens", "1e9", "--deadline-days", "9",
                                      "--cluster", "h100-80gb", "--global-batch-tokens", "1048576"]])
def test_a_bad_restart_time_or_checkpoint_bandwidth_is_one_line_exit_2(command, capsys):
    """Negative, infinite or not-a-number: refused before any work, whether --mtbf-hours uses them or not."""
    bad = [("--restart-seconds", v, "is not zero or more seconds") for v in ("-5", "nan", "inf")]
    bad += [("--checkpoint-bandwidth", v, "is not a positive number") for v in ("0", "nan", "inf")]
    for flag, value, needle in bad:
        with pytest.raises(SystemExit) as e:
            main(command + [flag, value])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and flag in err and needle in err, err
