"""The planner: the seed's Problem 3, pure DP for small models, nothing-fits, the fast domain, the bound."""

import importlib
from dataclasses import replace

import numpy as np
import pytest

from meshscale.cost import bound, predict
from meshscale.cost.kernels import Passes
from meshscale.cost.pipeline import schedule_bubble

from meshscale.errors import UserError
from meshscale.plan.search import search
from meshscale.plan.explain import components, explain, rejected
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec, load_model

from boundcheck import bounds_and_memory_hold  # noqa: E402

search_mod = importlib.import_module("meshscale.plan.search")  # the module (the package exports the function)

H100 = load_cluster("h100-80gb")


@pytest.fixture(scope="module")
def problem3():
    """Seed 003, Problem 3: LLaMA-2 13B, 3M-token batch at 32K context, TPU v5p 16x16x16."""
    model, cluster = load_model("llama2-13b").with_seq(32768), load_cluster("tpu-v5p")
    plan = search(model, cluster, 4096, 3145728 // 32768)
    return plan, explain(plan, model, cluster, 4096, 96)


def test_problem3_winner_pairs_4way_tp_with_1024way_sharding(problem3):
    plan, _ = problem3
    win = Layout.parse(plan.ranked[0].layout, 4096)
    # 4096 / 4 = 1024 ranks share the batch (X_opt ~ 1333 rounds to 1024). 96 whole 32K sequences cannot
    # cover 1024 ranks by dp alone, so cp (and a short pipeline) take part of that axis.
    assert win.tp == 4 and win.cp > 1
    assert plan.ranked[0].fits and plan.evaluated < plan.enumerated


def test_problem3_without_a_pipeline_is_fsdp_times_tp():
    """The seed's answer proper: with no pipeline the winner shards parameters (ZeRO-3) across the data
    axis and splits matrices with TP inside the ICI domain. (With one, torch's zero-bubble schedules,
    which the runtime cannot combine with FSDP2, win by their smaller bubble.) `plan --fix pp=1`."""
    model, cluster = load_model("llama2-13b").with_seq(32768), load_cluster("tpu-v5p")
    plan = search(model, cluster, 4096, 96, fix=search_mod.parse_fix("pp=1"))
    win = Layout.parse(plan.ranked[0].layout, 4096)
    assert win.zero == 3 and win.tp in (4, 8)
    assert all(Layout.parse(p.layout).pp == 1 for p in plan.ranked + plan.rejected)


def test_problem3_explanation_rejects_pure_dp_for_memory_and_pure_fsdp_as_comm_bound(problem3):
    _, lines = problem3
    text = "\n".join(lines)
    assert "Pure DP is rejected for memory" in text
    fsdp = next(line for line in lines if line.startswith("Pure FSDP"))
    assert "communication-bound" in fsdp and "850" in fsdp  # 768 tokens/chip < 850 (3-axis FSDP)
    assert "235" in text  # the FSDP+TP critical batch the winner clears


def test_when_pure_fsdp_wins_it_is_compared_with_a_different_strategy():
    # on H100 as preset, FSDP's per-micro-batch traffic takes its SMs' share from the compute it hides behind and
    # ZeRO-1 with PP2 wins; where collectives take nothing from GEMMs (overlap_slowdown 0) pure FSDP does
    h100 = replace(H100, overlap_slowdown=0.0)
    model = load_model("llama2-13b")
    plan = search(model, h100, 8, 64)
    win = Layout.parse(plan.ranked[0].layout, 8)
    assert (win.tp, win.pp, win.ep, win.zero) == (1, 1, 1, 3)
    line = next(line for line in explain(plan, model, h100, 8, 64) if "FSDP" in line)
    assert line.startswith("Pure FSDP wins") and plan.ranked[0].layout not in line
    other = line.split("the best layout with TP, PP or EP, ")[1].split(", is predicted")[0]
    alt = Layout.parse(other, 8)
    assert alt.tp > 1 or alt.pp > 1 or alt.ep > 1
    assert predict(model, h100, alt, 64).step_time_s > plan.ranked[0].step_time_s


def test_small_model_with_large_batch_picks_pure_dp():
    gpt2 = ModelSpec(name="gpt2-125m", layers=12, hidden=768, heads=12, ffn=3072, vocab=50257, seq=1024,
                     mlp="gelu", tied_embeddings=True, learned_positions=True, biases=True)
    plan = search(gpt2, H100, 8, 512)
    win = Layout.parse(plan.ranked[0].layout, 8)
    assert (win.dp, win.tp, win.pp, win.cp) == (8, 1, 1, 1)


def test_tp_stays_inside_nvlink_unless_allowed():
    model = load_model("gpt3-175b")  # 96 heads: tp=16 is possible, and would cross DGX nodes
    plan = search(model, H100, 64, 256)
    for p in plan.ranked:
        assert Layout.parse(p.layout, 64).tp <= 8
        assert all(e["tier"] == "nvlink" for e in p.comm if e["axis"] == "tp")
    wide = search(model, H100, 64, 256, cross_tp=True, where=lambda tp, pp, cp, dp, ep: tp == 16)
    assert wide.ranked and all(e["tier"] == "nvlink+ib" for e in wide.ranked[0].comm if e["axis"] == "tp")
    assert wide.ranked[0].step_time_s > plan.ranked[0].step_time_s


def test_nothing_fits_reports_the_smallest_need():
    plan = search(load_model("llama3-405b"), H100, 8, 8)
    assert not plan.ranked
    need, layout = plan.smallest
    # tp=8 and zero=3 both cut the 16 bytes a parameter 8 ways; FSDP2 also holds its gathered units, so tp=8
    assert need > 0.9 * H100.hbm_bytes and "tp=8" in layout


def test_pruning_keeps_the_exhaustive_ranking():
    model, cpu = load_model("tiny"), load_cluster("local-cpu")
    fast = search(model, cpu, 8, 32, top=5)
    full = search(model, cpu, 8, 32, top=5, prune=False)
    assert [p.layout for p in fast.ranked] == [p.layout for p in full.ranked]
    assert fast.evaluated < full.evaluated


def test_pruning_keeps_the_exhaustive_ranking_on_an_accelerator():
    """The bound must stay below the shape-aware prediction with pipelines, FSDP and CP in play."""
    model, v5e = load_model("llama2-7b"), load_cluster("tpu-v5e")
    fast = search(model, v5e, 16, 64, top=5)
    full = search(model, v5e, 16, 64, top=5, prune=False)
    assert [p.layout for p in fast.ranked] == [p.layout for p in full.ranked]


def test_pruning_keeps_the_exhaustive_ranking_with_experts():
    """FSDP with EP: the routed experts' gradients reduce over their own group, which the bound must not charge
    over dp (it did, pruning the true winner)."""
    model, fix = load_model("mixtral-8x7b"), search_mod.parse_fix("zero=3,ep=8,pp=1")
    fast = search(model, H100, 16, 64, top=3, fix=fix)
    full = search(model, H100, 16, 64, top=3, fix=fix, prune=False)
    assert [p.layout for p in fast.ranked] == [p.layout for p in full.ranked]
    assert fast.evaluated < full.evaluated


def test_the_fastest_layout_a_predicate_keeps_is_the_exhaustive_searchs():
    """fastest_where walks the pool by bound and stops once the bound passes its best: the same layout as the
    fastest kept one of every layout costed in full."""
    model, cpu = load_model("tiny"), load_cluster("local-cpu")
    plan = search(model, cpu, 8, 32, top=3)
    full = search(model, cpu, 8, 32, top=3, prune=False).pool
    for keep in (lambda layout: layout.pp > 1 and layout.schedule == "1f1b", lambda layout: layout.cp == 2):
        kept = [(search_mod.rank_key(p, layout), p) for layout, p in full.costed.items()
                if p is not None and keep(layout) and p.memory_per_device_bytes["total"] <= full.capacity]
        assert kept and search_mod.fastest_where(plan, keep).layout == min(kept, key=lambda kp: kp[0])[1].layout
    # a predicate on the costed prediction too: the fastest dp=8 layout is dropped, the next one kept
    fastest = search_mod.fastest_where(plan, lambda layout: layout.dp == 8)
    kept = [(search_mod.rank_key(p, layout), p) for layout, p in full.costed.items()
            if p is not None and layout.dp == 8 and p.memory_per_device_bytes["total"] <= full.capacity
            and p.step_time_s > fastest.step_time_s]
    second = search_mod.fastest_where(plan, lambda layout: layout.dp == 8,
                                      lambda pred: pred.step_time_s > fastest.step_time_s)
    assert kept and second.layout == min(kept, key=lambda kp: kp[0])[1].layout != fastest.layout
    assert search_mod.fastest_where(plan, lambda layout: layout.tp > 8) is None
    # a ceiling on the step: the same layout where it is under it, none where the fastest kept is over it
    dp8 = lambda layout: layout.dp == 8  # noqa: E731
    assert search_mod.fastest_where(plan, dp8, slowest=fastest.step_time_s).layout == fastest.layout
    assert search_mod.fastest_where(plan, dp8, slowest=fastest.step_time_s * 0.999) is None


def test_a_winner_outside_the_validation_set_names_the_fastest_layout_inside_it():
    """llama3-8b on 16 TPU v5e wins with 2,048-token context-parallel chunks, shorter than any validation run's:
    its band lists that, and the explanation names the fastest layout whose band lists nothing, no faster."""
    model, v5e = load_model("llama3-8b"), load_cluster("tpu-v5e")
    plan = search(model, v5e, 16, 16)
    win = plan.ranked[0]
    assert any(u.startswith("cp=") for u in win.band["unvalidated"])
    line = next(x for x in explain(plan, model, v5e, 16, 16) if x.startswith("The winner rests on"))
    alt = line.split("The fastest layout the set covers, ")[1].split(", is predicted")[0]
    pred = predict(model, v5e, Layout.parse(alt, 16), 16)
    assert not pred.band["unvalidated"] and pred.step_time_s >= win.step_time_s
    fixed = search(model, v5e, 16, 16, fix=search_mod.parse_fix("cp=4"))  # every layout searched is outside
    assert any("no layout that fits avoids it" in x for x in explain(fixed, model, v5e, 16, 16))


def test_the_bound_holds_where_the_host_bounds_the_step():
    """On Grace a small MoE model's passes wait for the host that issues them; the bound takes the host's floor
    too (else it prunes nothing), and stays below every prediction."""
    model, gb200 = load_model("small-moe"), load_cluster("gb200-nvl72")
    full = search(model, gb200, 8, 32, top=3, prune=False)
    pool = full.pool
    costed = [(b, pool.costed.get(pool.layout(i))) for i, b in enumerate(pool.bounds)]
    costed = [(b, pred) for b, pred in costed if pred is not None]
    assert costed and all(b <= pred.step_time_s * (1 + 1e-9) for b, pred in costed)
    no_host = replace(gb200, host_linear_s=0.0)
    best = full.ranked[0]
    assert best.step_time_s > predict(model, no_host, Layout.parse(best.layout), 32).step_time_s  # host-bound
    fast = search(model, gb200, 8, 32, top=3)
    assert [p.layout for p in fast.ranked] == [p.layout for p in full.ranked]
    assert fast.evaluated < full.evaluated / 4


def _bounds_over_predictions(model, cluster, devices, batch, fix) -> dict:
    """Each layout's bound over its prediction, of every layout `fix` leaves (costed in full)."""
    pool = search(model, cluster, devices, batch, prune=False, fix=search_mod.parse_fix(fix)).pool
    out = {}
    for i, b in enumerate(pool.bounds):
        pred = pool.costed.get(pool.layout(i))
        if pred is not None:
            out[pool.layout(i)] = (b / pred.step_time_s, pred)
    return out


def test_the_host_floor_carries_the_bubble_and_the_traffic_a_stretched_pass_cannot_hide():
    """Where hosts bound the passes (llama3-8b on Grace, 4 micro-batches of 1,024 tokens a rank), the bound
    charges the bubble of the host-stretched passes (GPipe, 1F1B, interleaved: it sat 5-20% under predict).
    Where they stretch the passes that ring attention hides behind and FSDP's traffic outlasts them (deepseek-v2,
    cp=64, ZeRO-3), the CP floor takes the longest stretch (it sat 4.4% over predict, an invalid bound)."""
    gb200 = load_cluster("gb200-nvl72")
    dense = replace(load_model("llama3-8b"), seq=1024)
    ratios = _bounds_over_predictions(dense, gb200, 32, 128, "pp=8,dp=4,mbs=1,recompute=none")
    even = {lay: r for lay, (r, pred) in ratios.items() if lay.schedule in ("gpipe", "1f1b", "interleaved")}
    assert all(pred.host_wait_s > 0.5 * pred.step_time_s for _, pred in ratios.values())  # the premise
    assert len(even) >= 10 and all(0.93 < r <= 1 + 1e-9 for r in even.values())
    assert all(r <= 1 + 1e-9 for r, _ in ratios.values())
    moe = replace(load_model("deepseek-v2"), seq=2048)
    ratios = _bounds_over_predictions(moe, gb200, 128, 128, "dp=1,zero=3,tp=2,cp=64,mbs=32,recompute=full,pp=1")
    fsdp_longer = [pred for _, pred in ratios.values()
                   if sum(e["time_s"] for e in pred.comm if e["axis"] == "dp") > pred.compute_s > pred.kernels_s]
    assert fsdp_longer and all(r <= 1 + 1e-9 for r, _ in ratios.values())


def test_the_bound_charges_the_expert_traffic_predict_shows():
    """Mixtral on 16 H100 with EP: the bound's all-to-all floor is predict's exposed all-to-all where nothing hides
    it, at most that where another micro-batch's compute may ([software] ep_comm_overlap, dualpipev) or expert TP
    adds its gathers; its floor of
    the experts' own gradient reduction, with no backward to hide behind, at most that traffic's time in predict;
    and every bound stays below its prediction, DeepEP's dispatcher and a routing imbalance included."""
    model = load_model("mixtral-8x7b")
    for software in ({}, {"ep_comm_overlap": True}, {"moe_dispatcher": "deepep", "moe_imbalance": 1.3}):
        cluster = H100.with_software(**software)
        reduced = []  # the experts' gradient floor, nothing hidden, and that traffic's time in predict
        for fix in ("zero=3,ep=8,pp=1", "zero=2,ep=2,pp=1", "zero=1,ep=4,pp=2"):
            full = search(model, cluster, 16, 64, top=3, fix=search_mod.parse_fix(fix), prune=False)
            pool, hidden = full.pool, cluster.software.ep_comm_overlap
            for shape, rows in pool.scored:
                placed, m = bound.placements(model, shape), shape.per_rank / rows.mbs
                floor = bound.expert_parallel_floor(model, cluster, shape, rows, placed.fewest_moe, 2, m)
                edp = bound.expert_data_parallel_floor(cluster, shape, rows.zero, placed.fewest_experts[rows.schedule],
                                                       m, np.zeros(len(rows)), "bf16")
                for i in range(len(rows)):
                    layout = search_mod._layout(shape, rows, i)
                    pred = pool.costed.get(layout)
                    if pred is None or layout.pp > 1:  # the ledger is one rank's; the floor the lightest's
                        continue
                    exposed = sum(e["exposed_s"] for e in pred.comm if e["axis"] in ("ep", "etp"))
                    # expert TP's gathers count at their bandwidth time; the all-to-alls exactly where nothing hides
                    exact = not (hidden or layout.schedule == "dualpipev" or any(e["axis"] == "etp" for e in pred.comm))
                    assert floor[i] > 0 and (floor[i] == pytest.approx(exposed, rel=1e-9) if exact else
                                             floor[i] <= exposed * (1 + 1e-9)), layout
                    reduced.append((float(np.asarray(edp)[i] if np.ndim(edp) else edp),
                                    sum(e["time_s"] for e in pred.comm if e["axis"] == "edp")))
            costed = [(b, pool.costed.get(pool.layout(i))) for i, b in enumerate(pool.bounds)]
            assert all(b <= p.step_time_s * (1 + 1e-9) for b, p in costed if p is not None), (software, fix)
            fast = search(model, cluster, 16, 64, top=3, fix=search_mod.parse_fix(fix))
            assert [p.layout for p in fast.ranked] == [p.layout for p in full.ranked]
        assert any(f > 0 for f, _ in reduced) and all(f <= e * (1 + 1e-9) for f, e in reduced)


def test_the_search_folds_expert_parallelism_over_tp():
    """EP groups folded over tp x dp (ep=4 on dp=2 x tp=2) are searched with whole experts (etp=1); etp=1 where
    ep divides dp*cp only when --fix asks. Their bounds stay below predict and their memory is predict's."""
    model, cpu = load_model("tiny-moe"), load_cluster("local-cpu")
    folded = search(model, cpu, 4, 8, "fp32", top=3, fix=search_mod.parse_fix("tp=2,ep=4"), prune=False)
    assert folded.ranked and {Layout.parse(p.layout).etp for p in folded.ranked} == {1}
    pool = folded.pool
    for i, b in enumerate(pool.bounds):
        layout, pred = pool.layout(i), pool.costed.get(pool.layout(i))
        if pred is not None:
            assert b <= pred.step_time_s * (1 + 1e-9), (layout, b, pred.step_time_s)
    shape, rows = pool.scored[0]
    memory = bound.memory_bytes(model, cpu, shape, rows, "fp32")
    for i in range(len(rows)):
        want = predict(model, cpu, search_mod._layout(shape, rows, i), 8, "fp32").memory_per_device_bytes["total"]
        assert memory[i] == pytest.approx(want, rel=1e-9)
    plain = search(model, cpu, 4, 8, "fp32", top=50, fix=search_mod.parse_fix("tp=2,dp=2,ep=2"))
    assert {Layout.parse(p.layout).etp for p in plain.ranked} == {0}
    whole = search(model, cpu, 4, 8, "fp32", top=5, fix=search_mod.parse_fix("tp=2,dp=2,ep=2,etp=1"))
    assert whole.ranked and {Layout.parse(p.layout).etp for p in whole.ranked} == {1}


def test_the_bound_counts_zero3_units_as_predict_does_for_each_framework():
    """ZeRO-3's gathered units in the bound's memory are predict's, whether the framework holds the root unit
    gathered (torch) or not (the TPU presets' framework): the two differ, by at least the root."""
    model, v5e = load_model("llama2-7b"), load_cluster("tpu-v5e")
    totals = {}
    for framework in ("torch", "megatron-core"):
        cluster = v5e.with_software(framework=framework)
        found = search(model, cluster, 16, 64, top=3, fix=search_mod.parse_fix("zero=3,tp=1,pp=1"), prune=False)
        shape, rows = found.pool.scored[0]
        memory = bound.memory_bytes(model, cluster, shape, rows, "bf16")
        layout = search_mod._layout(shape, rows, 0)
        assert memory[0] == pytest.approx(predict(model, cluster, layout, 64).memory_per_device_bytes["total"])
        totals[framework] = memory[0]
    root = 2 * 2 * model.vocab * model.hidden  # embedding and head, bf16, gathered with its gradient
    assert totals["torch"] - totals["megatron-core"] >= root * 0.99


def test_the_bound_holds_with_a_multi_token_prediction_module():
    """An MTP module (on the head's rank, a layer of the last chunk in the cut) in the bound as in predict:
    every bound below its prediction, and the bound's memory predict's, over pipelines, V schedules included."""
    model, cpu = replace(load_model("tiny-moe"), mtp_layers=1), load_cluster("local-cpu")
    found = search(model, cpu, 4, 8, "fp32", top=3, fix=search_mod.parse_fix("pp=2"), prune=False)
    costed = bounds_and_memory_hold(model, cpu, found.pool, 8, "fp32")
    assert any(Layout.parse(pred.layout).v_shaped for _, pred in costed)


def test_one_predicate_narrows_the_candidates(monkeypatch):
    model = load_model("llama3-8b")
    plan = search(model, H100, 16, 64)
    zero = Layout.parse(plan.ranked[0].layout, 16).zero
    real = search_mod.runnable
    monkeypatch.setattr(search_mod, "runnable", lambda layout, m, b: layout.zero != zero and real(layout, m, b))
    narrowed = search_mod.search(model, H100, 16, 64)
    assert narrowed.ranked and all(Layout.parse(p.layout, 16).zero != zero for p in narrowed.ranked)


def test_alternatives_name_why_they_lost(problem3):
    plan, _ = problem3
    reasons = rejected(plan)
    assert reasons and all("ms longer" in r for _, r in reasons)
    assert len({Layout.parse(p.layout, 4096).tp for p in plan.rejected} | {4}) >= 1


def test_step_components_add_up_to_the_step():
    """The parts the explanation compares (components) sum to predict's step time, collectives' interference
    and the control all-reduces included, so an alternative's named loss is its real largest one: at least its
    share of the gap (it once said "+20.6 ms: bubble 0.0 ms longer" of a layout without a pipeline)."""
    plan = search(load_model("llama3-8b"), H100, 16, 64, top=3)
    win = plan.ranked[0]
    for pred in plan.ranked + plan.rejected:
        assert sum(components(pred).values()) == pytest.approx(pred.step_time_s, rel=1e-12)
    assert len(plan.rejected) >= 3
    for alt, (layout, reason) in zip(plan.rejected, rejected(plan)):
        diff = {k: v - components(win).get(k, 0.0) for k, v in components(alt).items()}
        worst = max(diff, key=lambda k: diff[k])
        assert sum(diff.values()) == pytest.approx(alt.step_time_s - win.step_time_s, abs=1e-12)
        assert diff[worst] >= (alt.step_time_s - win.step_time_s) / len(diff) > 0
        assert layout == alt.layout and f": {worst} " in reason


def test_vectorised_bubble_is_the_closed_form():
    """The bound's array form of `pipeline.schedule_bubble` equals the scalar one, at equal and unequal F, B, W."""
    scheds = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4), ("zb", 1), ("zbv", 2),
              ("dualpipev", 2)]
    for pp in (1, 2, 4, 8):
        k_i = np.repeat(np.arange(len(scheds)), 40)
        m = np.tile(np.arange(pp, pp + 40), len(scheds)).astype(float)
        for fbw in ((1.0, 1.0, 1.0), (1.0, 1.5, 0.7), (0.3, 0.5, 0.2)):
            f, b, w = (np.full_like(m, x) for x in fbw)
            got = bound.schedule_bubbles(scheds, k_i, pp, m, f, b, w)
            want = [schedule_bubble(n, pp, vv if pp > 1 else 1, int(mm), *fbw)
                    for (n, vv), mm in zip((scheds[k] for k in k_i), m)]
            assert got == pytest.approx(want)


def test_when_plain_dp_wins_pure_fsdp_is_still_described_as_fsdp():
    """Without FSDP prefetch its gathers show, so plain DP wins; the pure-FSDP line must still name a zero=3
    layout (the comparison fixes zero=3, not just tp=pp=1)."""
    model, cpu = load_model("tiny"), load_cluster("local-cpu")
    cluster = cpu.with_software(fsdp_prefetch=False)
    plan = search(model, cluster, 2, 16, "fp32")
    assert Layout.parse(plan.ranked[0].layout, 2).zero != 3
    line = next(line for line in explain(plan, model, cluster, 2, 16, "fp32") if line.startswith("Pure FSDP"))
    assert "zero=3" in line and "no layout" not in line


def test_the_planner_searches_minimal_recompute_for_dense_models_only():
    """recompute=minimal (MaxText's remat policy) is searched like none, selective and full for dense models; a
    MoE model is never offered it, and fixing it for one is a one-line error."""
    plan = search(load_model("llama3-70b"), load_cluster("tpu-v5p"), 256, 512, top=3,
                  fix=search_mod.parse_fix("recompute=minimal"))
    assert plan.ranked and all(Layout.parse(p.layout).recompute == "minimal" for p in plan.ranked)
    moe = load_model("mixtral-8x7b")
    with pytest.raises(UserError, match="built for dense models without MLA"):
        search(moe, H100, 64, 256, fix=search_mod.parse_fix("recompute=minimal"))
    pool = search(moe, H100, 64, 256, top=3).pool
    modes = {bound.RECOMPUTE_MODES[r] for _, rows in pool.scored for r in rows.recompute}
    assert "minimal" not in modes and {"none", "full"} <= modes


def test_the_bound_follows_the_longest_path_where_ranks_are_uneven():
    """llama2-70b on 512 GB200 over 64 pipeline ranks: 80 layers leave 16 ranks two layers and 48 one, and under
    1F1B the slowest is rank 1, whose fill and drain cross one rank where the closed form's cross 63. The bound
    charged that form and sat up to 16% over predict's longest path. It charges each rank's own path
    (`bound.path_floor`: the chunks before it, its passes, and under full backwards the chain back down), never
    above predict and, where the bubble is deep, a median 89% of it under 1F1B (81% with the last rank's path
    alone) and 86% under ZB-H1 over 32 ranks (73% with the forms alone), so the search costs fewer in full."""
    model, gb200 = load_model("llama2-70b"), load_cluster("gb200-nvl72")
    for fix, tight in (("pp=64,schedule=1f1b", 0.86), ("pp=32,schedule=zb", 0.83)):
        ratios = _bounds_over_predictions(model, gb200, 512, 512, fix)
        assert len(ratios) >= 10 and all(r <= 1 + 1e-9 for r, _ in ratios.values())
        deep = [r for r, pred in ratios.values() if pred.bubble_s > 0.2 * pred.step_time_s]
        assert len(deep) >= 10 and np.median(deep) > tight, fix
