"""`meshscale budget`: days, dollars, energy and ETTR per (cluster, devices); the Pareto front; the choice."""

import json
import math
from dataclasses import replace

import pytest

from meshscale.cli import main
from meshscale.commands.counts import binary_count, decimal_amount
from meshscale.cost import bands
from meshscale.cost.goodput import of_prediction
from meshscale.plan.budget import Candidate, choose, options
from meshscale.plan.search import search
from meshscale.specs.cluster import load_cluster
from meshscale.specs.model import load_model

MODEL = load_model("llama2-7b")
BATCH_TOKENS = 256 * 4096


@pytest.fixture(scope="module")
def opts():
    candidates = [Candidate(load_cluster("h100-80gb"), 2.5, 50_000), Candidate(load_cluster("a100-80gb"), 1.2, 20_000)]
    return options(MODEL, candidates, 2e11, BATCH_TOKENS, deadline_days=20, counts=[16, 32, 64])


def test_each_option_is_its_plans_winner_priced_with_failures(opts):
    assert {(o.cluster, o.devices) for o in opts} == {(c, n) for c in ("h100-80gb", "a100-80gb") for n in (16, 32, 64)}
    o = next(o for o in opts if (o.cluster, o.devices) == ("a100-80gb", 32))
    win = search(MODEL, load_cluster("a100-80gb"), 32, 256, top=1).ranked[0]
    ettr = of_prediction(win, 20_000).ettr
    assert o.layout == win.layout and o.ettr == ettr < 1
    assert o.steps == math.ceil(2e11 / BATCH_TOKENS)
    assert o.days == pytest.approx(o.steps * win.step_time_s / ettr / 86400)
    assert o.dollars == pytest.approx(32 * 1.2 * o.days * 24)
    assert o.energy_mwh > 0 and o.meets_deadline == (o.days <= 20)


def test_days_dollars_and_energy_carry_the_step_times_band(opts):
    o = next(o for o in opts if (o.cluster, o.devices) == ("h100-80gb", 16))
    b = o.band
    assert b == bands.band(load_cluster("h100-80gb"), MODEL, "bf16") and b["runs"] > 0
    p = b["p90_abs_error"]
    for value in (o.days, o.dollars, o.energy_mwh):  # each proportional to the step time
        lo, hi = o.range_of(value)
        assert (lo, hi) == pytest.approx((value / (1 + p), value / (1 - p)))
        assert abs(bands.error(value, lo)) == pytest.approx(p) == abs(bands.error(value, hi))
    d = o.to_dict()
    assert d["band"] == b and d["ettr_band"] is None
    assert d["days_range"] == pytest.approx(list(o.range_of(o.days)))
    assert d["dollars_range"] == pytest.approx(list(o.range_of(o.dollars)))
    # the deadline: met with the band's slow end inside it, at risk when that end passes it, missed
    hi = o.range_of(o.days)[1]
    assert replace(o, meets_deadline=True, deadline_days=hi * 1.01).deadline == "met"
    assert replace(o, meets_deadline=True, deadline_days=(o.days + hi) / 2).deadline == "at risk"
    assert replace(o, meets_deadline=False).deadline == "missed"
    # a category with no validation runs (B200) claims no range
    unknown = replace(o, band=bands.band(load_cluster("b200"), MODEL, "bf16"), meets_deadline=True)
    assert unknown.range_of(unknown.days) is None and unknown.deadline == "met, band unknown"
    assert unknown.to_dict()["days_range"] is None


def test_pareto_front_and_choice(opts):
    front = [o for o in opts if o.pareto]
    assert front
    for o in opts:  # on the front: nothing both faster and cheaper; off it: something on it is
        better = [p for p in front if p.days <= o.days and p.dollars <= o.dollars and p is not o]
        assert bool(better) != o.pareto
    pick = choose(opts)
    meeting = [o for o in opts if o.meets_deadline]
    assert pick.meets_deadline and pick.dollars == min(o.dollars for o in meeting)
    for o in opts:
        o.meets_deadline = False
    assert choose(opts).days == min(o.days for o in opts)  # none meets it: the fastest


def test_cli_table_plot_json_and_bad_input(tmp_path, capsys):
    args = ["budget", "--model", "llama2-7b", "--tokens", "2e11", "--deadline-days", "20", "--cluster",
            "h100-80gb:2.5:50000", "--cluster", "a100-80gb", "--global-batch-tokens", str(BATCH_TOKENS),
            "--devices", "16,32"]
    main(args + ["--plot", str(tmp_path / "b.png")])
    out = capsys.readouterr().out
    assert "Pareto front" in out and "choice (the cheapest that meets 20 days)" in out
    words = " ".join(out.split())  # the console wraps long lines
    assert "p90 range" in words and "error band: H100 dense bf16" in words and "ETTR has no band" in words
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    main(args + ["--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["schema_version"] == 1 and d["choice"]["meets_deadline"] and len(d["options"]) == 4
    assert d["choice"]["band"]["runs"] > 0 and d["choice"]["deadline"] in ("met", "at risk")
    lo, hi = d["choice"]["days_range"]
    assert lo < d["choice"]["days"] < hi
    for bad, needle in (("h100-80gb:cheap", "must be numbers"), ("local-cpu", "no list price"),
                        ("h100-80gb:inf", "the price must be a positive number"),
                        ("h100-80gb:2:inf", "--mtbf-hours must be a positive number"),
                        ("h100-80gb:2:0", "--mtbf-hours must be a positive number")):
        with pytest.raises(SystemExit) as stop:
            main(["budget", "--model", "llama2-7b", "--tokens", "1e9", "--deadline-days", "1", "--cluster", bad,
                  "--global-batch-tokens", str(BATCH_TOKENS), "--devices", "16"])
        err = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(err) == 1 and needle in err[0]
    for tokens in ("inf", "0", "15Q"):  # a budget is a positive finite amount
        with pytest.raises(SystemExit) as stop:
            main(["budget", "--model", "llama2-7b", "--tokens", tokens, "--deadline-days", "1", "--cluster",
                  "h100-80gb", "--global-batch-tokens", str(BATCH_TOKENS), "--devices", "16"])
        err = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(err) == 1 and "is not a positive amount" in err[0]


def test_token_budgets_read_decimal_suffixes():
    """15T is 15 x 10^12 tokens, as budgets are written; batch sizes stay binary (4M = 4 x 2^20)."""
    assert decimal_amount("15T") == 15e12 and decimal_amount("300b") == decimal_amount("300G") == 3e11
    assert decimal_amount("2e12") == 2e12 and decimal_amount(" 1.5M ") == 1.5e6
    assert binary_count("4M") == 4 * 2**20
