"""`meshscale check` on log excerpts in torchtitan's and Megatron-LM's documented step-line formats."""

import json
import math
from pathlib import Path

import pytest

from meshscale.check import Row, check
from meshscale.check.logs import GiB, MiB
from meshscale.cli import main
from meshscale.cost import predict
from meshscale.export import adapted
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model

DATA = Path(__file__).parent / "data"


def files(stem, config_suffix):
    return (DATA / f"{stem}.log").read_text(), (DATA / f"{stem}{config_suffix}").read_text()


def test_torchtitan_log_and_toml():
    log, config = files("torchtitan_llama3_8b", ".toml")
    result = check(log, config, load_cluster("h100-80gb"), devices=8)
    assert result.framework == "torchtitan" and result.prediction.model == "llama3-8b"
    # the TOML's layout: FSDP over the 8 devices left over, 2 sequences per device, op-level recompute
    assert result.prediction.layout == "dp=8,zero=3,mbs=2,recompute=op" and result.prediction.global_batch == 16
    m = result.measured
    assert m.steps == 3  # step 1 carries start-up and is left out
    assert m.tokens_per_s_per_device == 5104  # the median tps, ANSI colours stripped
    assert math.isclose(m.step_time_s, 16 * 8192 / (5104 * 8))  # tps is per device
    assert m.memory_bytes == 61.53 * GiB
    rows = {r.name: r for r in result.rows}
    assert rows["step time"].predicted == result.prediction.step_time_s
    assert result.worst.name in ("step time", "memory per device")
    assert abs(math.log(result.worst.ratio)) == max(abs(math.log(rows[k].ratio))
                                                   for k in ("step time", "memory per device"))
    _proposal_is_a_faster_expressible_layout(result, "torchtitan")
    _rows_carry_the_band(result)


def test_megatron_log_and_arguments():
    log, config = files("megatron_llama2_7b", ".sh")
    result = check(log, config, load_cluster("h100-80gb"), devices=16)
    assert result.framework == "megatron"
    assert result.prediction.layout == "dp=8,zero=1,tp=2,sp=true,mbs=1" and result.prediction.global_batch == 128
    m = result.measured
    assert m.steps == 3 and m.step_time_s == pytest.approx(5.8217)  # median of iterations 20-40
    assert m.tflops_per_device == 211.6 and m.memory_bytes == 38121.77 * MiB
    assert math.isclose(m.tokens_per_s_per_device, 128 * 4096 / 5.8217 / 16)
    # the model is the one the arguments spell out: Llama 2 7B's shapes, so its preset's FLOPs and memory
    preset = predict(load_model("llama2-7b"), load_cluster("h100-80gb"), Layout.parse(result.prediction.layout),
                     128, "bf16")
    assert result.prediction.model_flops_per_step == preset.model_flops_per_step
    assert result.prediction.memory_per_device_bytes == preset.memory_per_device_bytes
    _proposal_is_a_faster_expressible_layout(result, "megatron")
    _rows_carry_the_band(result)
    assert any(line.startswith(("-    --", "+    --")) for line in result.diff)  # in Megatron-LM's own terms


def test_the_logs_nccl_release_is_the_one_predicted():
    """NCCL's banner (NCCL_DEBUG=INFO) names the job's release, which the prediction takes: from 2.28 a Blackwell
    collective holds 16 thread blocks, not 32, so compute beside the data-parallel collectives loses less of the
    GPU; on H100 the release changes nothing. A log without the banner keeps the cluster's release."""
    log, config = files("megatron_llama2_7b", ".sh")
    banner = "node-1:12:12 [0] NCCL INFO NCCL version {}+cuda12.8\n"
    plain = check(log, config, load_cluster("b200"), devices=16)
    older = check(banner.format("2.27.3") + log, config, load_cluster("b200"), devices=16)
    newer = check(banner.format("2.28.9") + log, config, load_cluster("b200"), devices=16)
    assert (plain.nccl, older.nccl, newer.nccl) == ("", "2.27", "2.28")
    assert older.prediction.step_time_s == plain.prediction.step_time_s
    assert newer.prediction.step_time_s < plain.prediction.step_time_s
    assert newer.to_dict()["nccl"] == "2.28" and plain.to_dict()["nccl"] is None
    h100 = [check(banner.format(v) + log, config, load_cluster("h100-80gb"), devices=16) for v in ("2.21.5", "2.29.7")]
    assert h100[0].prediction.step_time_s == h100[1].prediction.step_time_s


def _rows_carry_the_band(result):
    """Step time and the rates it sets carry the prediction's band; memory, which it does not cover, none."""
    band = result.prediction.band
    assert band["category"] == "H100 dense bf16" and band["runs"] > 0
    p = band["p90_abs_error"]
    for r in result.rows:
        if r.name == "memory per device":
            assert r.band is None and r.measured_range is None and r.within is None
            continue
        assert r.band == band
        lo, hi = r.measured_range
        if r.rate:
            assert (lo, hi) == pytest.approx((r.predicted * (1 - p), r.predicted * (1 + p)))
        else:
            assert (lo, hi) == pytest.approx((r.predicted / (1 + p), r.predicted / (1 - p)))
        assert (lo <= r.measured <= hi) == (r.within != "outside")


def test_within_the_band_as_the_validation_table_counts_error():
    """Error is predicted/measured - 1 of a time, measured/predicted - 1 of a rate; the verdict is the smallest
    radius of the band (median, p90) that holds it."""
    band = {"runs": 5, "median_abs_error": 0.03, "p90_abs_error": 0.06}
    for measured, verdict in ((1.02, "median"), (0.98, "median"), (1.05, "p90"), (0.95, "p90"), (1.10, "outside"),
                              (0.90, "outside")):
        assert Row("step time", "s", measured, 1.0, band).within == verdict
    assert Row("tokens/s per device", "", 95.0, 100.0, band, rate=True).within == "p90"
    assert Row("tokens/s per device", "", 98.0, 100.0, band, rate=True).within == "median"
    assert Row("step time", "s", 1.0, 1.0, {"runs": 0}).within is None
    d = Row("step time", "s", 1.05, 1.0, band).to_dict()
    assert d["within_band"] == "p90" and d["error"] == pytest.approx(1 / 1.05 - 1)
    assert d["band_range"] == pytest.approx([1 / 1.06, 1 / 0.94])


def _proposal_is_a_faster_expressible_layout(result, framework):
    if result.proposal is None:
        return
    p = result.proposal
    assert p.step_time_s < 0.97 * result.prediction.step_time_s and p.fits and p.devices == result.prediction.devices
    shape = Layout.parse(p.layout)
    assert adapted(framework, shape, None) == (shape, [])
    scale = result.measured.step_time_s / result.prediction.step_time_s
    assert result.expected_step_s == pytest.approx(p.step_time_s * scale)
    assert result.diff[:2] == ["--- now", "+++ proposed"] and len(result.diff) > 2


def test_cli_table_json_and_bad_input(capsys, tmp_path):
    args = ["check", "--log", str(DATA / "megatron_llama2_7b.log"), "--config", str(DATA / "megatron_llama2_7b.sh"),
            "--cluster", "h100-80gb", "--devices", "16"]
    main(args)
    out = capsys.readouterr().out
    assert "measured vs predicted" in out and "differs most:" in out
    words = " ".join(out.split())  # the console wraps long lines
    assert "in band" in words and "no (50% off)" in words and "error band: H100 dense bf16" in words
    main(args + ["--json"])
    d = json.loads(capsys.readouterr().out)
    assert (d["schema_version"] == 1 and d["framework"] == "megatron"
            and d["worst"] in ("step time", "memory per device"))
    rows = {r["name"]: r for r in d["rows"]}
    assert rows["step time"]["within_band"] == "outside" and rows["step time"]["band"]["runs"] > 0
    assert rows["memory per device"]["band"] is None and rows["memory per device"]["within_band"] is None
    bad = tmp_path / "empty.log"
    bad.write_text("nothing to see\n")
    for argv, needle in ((args[:2] + [str(bad)] + args[3:], "no torchtitan step lines"),
                         (args[:-2], "--devices"),
                         (args[:2] + [str(tmp_path / "missing.log")] + args[3:], "no such file")):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(err) == 1 and needle in err[0]
