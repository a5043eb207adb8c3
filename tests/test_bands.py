"""Error bands (cost/bands.py): the stored table is what benchmarks/published.py computes from the current
model, and predict, plan and scale carry their category's band, in words and in JSON."""

import json

from meshscale.cost import predict
from meshscale.cost.bands import (BANDS, COVERAGE, CP_FEWEST_TOKENS, FEW_RUNS, HOST_WAIT_MOST, PIPELINED,
                                  REPLICA_GROWTH, SOURCE, band, band_text, category, unvalidated, unvalidated_text)
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import load_model
from test_cli_predict_plan import cli
from test_cost_published import load_published


def test_stored_bands_equal_what_the_script_computes_now():
    """Fails whenever a change to the model moves a category's errors: rerun
    `PYTHONPATH=src python benchmarks/published.py --write-bands` and commit the table with the change."""
    computed = load_published().computed_bands()
    assert computed == BANDS
    assert load_published().computed_bands(pipelined=True) == PIPELINED
    assert load_published().computed_replica_growth() == REPLICA_GROWTH
    assert load_published().computed_coverage() == (COVERAGE, CP_FEWEST_TOKENS, HOST_WAIT_MOST)
    assert sum(runs for runs, *_ in BANDS.values()) == len(list(load_published().runs()))
    assert f"{sum(runs for runs, *_ in BANDS.values())} published runs" in SOURCE


def test_the_readme_shows_the_stored_bands():
    """The front page's accuracy table is the stored one (rewrite it with the bands)."""
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for name, (runs, median, p90, signed) in BANDS.items():
        assert f"| {name} | {runs} | {median:.1%} | {p90:.1%} | {signed:+.1%} |" in readme, name
    assert f"the {sum(runs for runs, *_ in BANDS.values())} published runs" in readme


def test_categories_follow_hardware_kind_and_precision():
    h100, a100 = load_cluster("h100-80gb"), load_cluster("a100-80gb")
    dense, moe = load_model("llama3-8b"), load_model("mixtral-8x7b")
    assert category(h100, dense, "fp8") == "H100 dense fp8"
    assert category(h100, moe, "bf16-pure") == "H100 MoE bf16"
    assert category(load_cluster("tpu-v5p"), dense, "bf16") == "TPU v5p dense bf16"
    b = band(a100, dense, "bf16")
    assert (b["runs"], b["median_abs_error"], b["p90_abs_error"], b["mean_signed_error"]) == BANDS["A100 dense bf16"]
    assert b["median_abs_error"] <= b["p90_abs_error"]
    none = band(load_cluster("b200"), dense, "bf16")
    assert none["runs"] == 0 and none["median_abs_error"] is None
    assert "no validation runs" in band_text(none)
    fp8 = band(h100, dense, "fp8")
    assert ("too slow" in band_text(fp8)) == (fp8["mean_signed_error"] >= 0)
    assert "too slow" in band_text(dict(fp8, mean_signed_error=0.04))
    assert "too fast" in band_text(band(h100, dense, "bf16"))  # the bf16 runs are predicted fast on average
    assert "too few runs" not in band_text(fp8)  # 28 runs
    assert "too few runs" in band_text(dict(band(h100, dense, "fp8"), runs=2))
    pred = predict(dense, a100, Layout.parse("dp=8,mbs=1", 8), 8)
    assert pred.band == b and pred.to_dict()["band"] == b


def test_predict_plan_scale_print_and_emit_the_band():
    args = ["--model", "llama3-8b", "--cluster", "a100-80gb", "--global-batch", "64"]
    r = cli("predict", *args, "--devices", "16", "--layout", "dp=16", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["band"]["category"] == "A100 dense bf16"
    r = cli("predict", *args, "--devices", "16", "--layout", "dp=16")
    assert f"error band: A100 dense bf16, {BANDS['A100 dense bf16'][0]} runs" in r.stdout
    r = cli("plan", *args, "--devices", "16", "--json")
    assert r.returncode == 0, r.stderr
    assert all(p["band"]["runs"] == BANDS["A100 dense bf16"][0] for p in json.loads(r.stdout)["ranked"])
    r = cli("scale", *args[:4], "--devices", "8,16", "--global-batch-tokens", str(64 * 8192), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["band"]["category"] == "A100 dense bf16" and all(row["band"] == d["band"] for row in d["rows"])
    series, measured, predicted = REPLICA_GROWTH
    assert d["replica_growth"]["series"] == series and d["replica_growth"]["measured_per_doubling"] == measured
    r = cli("scale", *args[:4], "--devices", "8,16", "--global-batch-tokens", str(64 * 8192))
    assert "error band: A100 dense bf16" in r.stdout
    assert f"in {series} published series" in r.stdout and f"{measured:+.1%} per doubling" in r.stdout


def test_a_pipelined_layout_carries_its_categorys_pipelined_band():
    """A pipelined layout's band adds the band its category's pipelined runs earned (they err apart from the
    others, docs/accuracy.md), in words and in JSON; a flat layout, or a category with fewer than FEW_RUNS
    pipelined runs, adds none."""
    a100, model = load_cluster("a100-80gb"), load_model("llama3-70b")
    piped = band(a100, model, "bf16", Layout.parse("dp=2,tp=8,pp=4,mbs=1", 64))
    runs, median, p90, bias = PIPELINED["A100 dense bf16"]
    assert runs >= FEW_RUNS and piped["pipelined"] == {"runs": runs, "median_abs_error": median,
                                                        "p90_abs_error": p90, "mean_signed_error": bias}
    assert f"its {runs} pipelined runs: median {median:.1%}, p90 {p90:.1%}, bias {bias:+.1%}" in band_text(piped)
    flat = band(a100, model, "bf16", Layout.parse("dp=8,tp=8,mbs=1", 64))
    assert flat["pipelined"] is None and "pipelined" not in band_text(flat)
    few = [k for k, (n, *_) in PIPELINED.items() if n < FEW_RUNS and k.startswith("H100 dense bf16")]
    assert few and band(load_cluster("h100-80gb"), model, "bf16", Layout.parse("tp=8,pp=8", 64))["pipelined"] is None
    r = cli("predict", "--model", "llama3-70b", "--cluster", "a100-80gb", "--devices", "64", "--global-batch", "64",
            "--layout", "dp=2,tp=8,pp=4,mbs=1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["band"]["pipelined"]["runs"] == runs


def test_a_layout_resting_on_what_no_validation_run_used_says_so():
    """The band lists the layout's mechanisms no run of the set used (COVERAGE) and context-parallel chunks
    shorter than any run's; a layout of the set's own mechanisms lists none, and prints nothing more."""
    h100, model = load_cluster("h100-80gb"), load_model("llama3-70b")
    seen = Layout.parse("dp=2,zero=1,tp=8,pp=4,vpp=2,schedule=interleaved,mbs=1,recompute=full", 64)
    assert unvalidated(seen, 8192) == [] and unvalidated_text(band(h100, model, "bf16", seen)) == ""
    assert CP_FEWEST_TOKENS == 4096 and "schedule=zbv" not in COVERAGE
    assert unvalidated(Layout.parse("tp=8,pp=4,schedule=zbv,cp=2", 64), 8192) == ["schedule=zbv"]
    assert unvalidated(Layout.parse("tp=8,cp=4", 64), 8192) == [
        "cp=4 at 2,048 tokens a rank where the set's fewest is 4,096"]
    assert unvalidated(Layout.parse("tp=8,pp=2,offload=2,recompute=mlp", 64), 8192) == ["offload", "recompute=mlp"]
    pred = predict(model, h100, Layout.parse("tp=8,pp=4,schedule=zbv", 64), 64)
    assert pred.band["unvalidated"] == ["schedule=zbv"] and "schedule=zbv" in unvalidated_text(pred.band)
    r = cli("predict", "--model", "llama3-70b", "--cluster", "h100-80gb", "--devices", "64", "--global-batch", "64",
            "--layout", "tp=8,pp=4,schedule=zbv", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["band"]["unvalidated"] == ["schedule=zbv"]


def test_a_step_spent_waiting_on_the_host_is_outside_the_validation_set():
    """No run of the set waited on its host more than HOST_WAIT_MOST of its step: a prediction whose devices wait
    longer (and at least HOST_WAIT_FLOOR) says its band may not hold; the same layout with the layers' launches
    captured in CUDA graphs waits far less and says nothing of the host."""
    from meshscale.cost.bands import HOST_WAIT_FLOOR

    layout = Layout.parse("dp=4,zero=1,cp=2,mbs=1", 8)
    assert HOST_WAIT_MOST < HOST_WAIT_FLOOR
    assert unvalidated(layout, 8192, HOST_WAIT_FLOOR) == []
    assert unvalidated(layout, 8192, 0.25) == [
        f"the devices wait on their host 25% of the step, where no run of the set waited over {HOST_WAIT_MOST:.1%}"]
    model, gb200 = load_model("llama3-8b"), load_cluster("gb200-nvl72")
    eager = predict(model, gb200, layout, 128, "fp8")
    share = eager.host_wait_s / eager.step_time_s
    assert share > HOST_WAIT_FLOOR and eager.band["unvalidated"] == [
        f"the devices wait on their host {share:.0%} of the step, where no run of the set waited over "
        f"{HOST_WAIT_MOST:.1%}"]
    graphs = gb200.with_software(cuda_graphs=True)
    captured = predict(model, graphs, layout, 128, "fp8")
    assert captured.host_wait_s < HOST_WAIT_FLOOR * captured.step_time_s and captured.band["unvalidated"] == []
    assert predict(model, load_cluster("b200"), layout, 128, "fp8").band["unvalidated"] == []
