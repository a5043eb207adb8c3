"""The parity matrix: every layout the planner can emit for `tiny` on 4 and 8 CPU processes (each pipeline
schedule, each zero stage with PP and TP, SP on and off) trains with the single-process loss curve to 1e-5
relative in fp32, and the comm ledger measures exactly the bytes the cost model predicts for it.

Cases come from the planner's own predicate (plan.search.runnable) and the trainer's
(specs.layout.trainer_refusal), deduplicated over mbs (1 with a pipeline, the most micro-batches; the default
without) and recompute (none; tests/test_train_parity.py and test_ledger.py cover recompute). Each world runs its
cases in two spawned process groups. World 8 is sampled (see `sampled`).

Context parallelism and hybrid sharding (`new_mechanism_cases`, sampled as its docstring says) run in their
own spawned groups, below the block marked for them. The planner's winners for a set of models and clusters,
scaled to 4 ranks (`plan_winners`), run inside the groups of their model family."""

from functools import cache
from itertools import product
from typing import NamedTuple

import pytest

from multirank import run_ranks

STEPS = 3  # enough to show a curve (the reference falls by 0.37 in 3 steps); each step costs 0.2-2 s a layout
REL = 1e-5
BATCH = 8
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1), ("zbv", 2), ("dualpipev", 2)]
WORLDS = (4, 8)


def cases(world: int) -> list[str]:
    from meshscale.plan.search import runnable
    from meshscale.specs.layout import Layout, trainer_refusal
    from meshscale.specs.model import PRESETS

    spec = PRESETS["tiny"]
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            for zero in (0, 1, 2, 3) if dp > 1 else (0,):
                for sp in (False, True) if tp > 1 else (False,):
                    for schedule, vpp in SCHEDULES if pp > 1 else [("1f1b", 1)]:
                        layout = Layout(dp=dp, zero=zero, tp=tp, sp=sp, pp=pp, vpp=vpp, schedule=schedule,
                                        mbs=1 if pp > 1 else 0)
                        if runnable(layout, spec, BATCH) and trainer_refusal(layout, spec) is None:
                            out.append(str(layout))
    return out


def sampled(world: int) -> list[str]:
    """World 4: every case. World 8: what world 4 cannot hold, TP and PP together: with dp=2, every schedule
    once, each paired with the zero stage used least so far among those it accepts (so every stage runs);
    and tp*pp = 8, every schedule once. SP and the tp/pp split alternate from one case to the next. DP-only
    and DP x PP shapes at world 8 repeat world 4's with more ranks and are left out."""
    from meshscale.specs.layout import Layout

    if world == 4:
        return cases(4)
    groups: dict = {}
    for text in cases(world):
        layout = Layout.parse(text)
        if layout.tp > 1 and layout.pp > 1:
            groups.setdefault((layout.dp > 1, layout.schedule), []).append(layout)
    out, zero_uses = [], dict.fromkeys(range(4), 0)
    for i, ((with_dp, _), options) in enumerate(groups.items()):
        if with_dp:
            zero = min({l.zero for l in options}, key=lambda z: (zero_uses[z], -z))  # constrained stages first
            zero_uses[zero] += 1
            options = [l for l in options if l.zero == zero]
        out.append(str(options[i % len(options)]))
    return out


def _run(case: str, world: int, model: str = "tiny"):
    """case: a layout, or "RECIPE:layout" for a --precision other than fp32."""
    from meshscale.runtime.loop.config import TrainConfig, resolve

    precision, layout = case.split(":") if ":" in case else ("fp32", case)
    return resolve(TrainConfig(model=model, layout=layout, steps=STEPS, global_batch=BATCH, bucket_mb=0.5,
                               val_batches=1, precision=precision), world)


def _tokens():
    from meshscale.runtime.loop.data import load_tokens

    return load_tokens(None)[: 1 << 20]


def _train_all(rank, world, layouts, model="tiny"):
    import torch

    from meshscale.runtime.loop.trainer import train

    tokens = _tokens()
    out = {}
    for layout in layouts:
        result = train(_run(layout, world, model), torch.device("cpu"), tokens, log=False)
        out[layout] = {"losses": [r["loss"] for r in result["rows"]], "val": result["val_loss"],
                       "grad_norms": [r["grad_norm"] for r in result["rows"]], "comm": result["comm"][-1]}
    return out


@pytest.fixture(scope="module")
def reference():
    return _reference("tiny")


def _reference(model: str, precision: str = "fp32") -> dict:
    import torch

    from meshscale.runtime.loop.trainer import train

    result = train(_run(f"{precision}:", 1, model), torch.device("cpu"), _tokens(), log=False)
    return {"losses": [r["loss"] for r in result["rows"]], "val": result["val_loss"],
            "grad_norms": [r["grad_norm"] for r in result["rows"]]}


@pytest.fixture(scope="module", params=WORLDS)
def measured(request):
    world = request.param
    layouts = sampled(world)
    results = {}
    for part in (layouts[0::2], layouts[1::2]):  # two spawned groups per world
        per_rank = run_ranks(world, _train_all, part)
        for rank_result in per_rank[1:]:  # every rank logs the same loss
            assert {k: v["losses"] for k, v in rank_result.items()} == \
                {k: v["losses"] for k, v in per_rank[0].items()}
        results.update(per_rank[0])
    return world, results


def test_matrix_covers_every_shape():
    from meshscale.specs.layout import Layout

    four = [Layout.parse(t) for t in cases(4)]
    assert {l.schedule for l in four if l.pp > 1} == {s for s, _ in SCHEDULES}
    assert {(l.zero, l.tp > 1, l.pp > 1) for l in four if l.dp > 1} >= \
        {(z, True, False) for z in range(4)} | {(z, False, True) for z in range(4)}
    assert any(l.sp and l.pp > 1 for l in four) and any(l.tp > 1 and not l.sp and l.pp > 1 for l in four)
    eight = [Layout.parse(t) for t in sampled(8)]
    assert {l.schedule for l in eight if l.dp == 2} == {s for s, _ in SCHEDULES}
    assert {l.zero for l in eight if l.dp == 2} == {0, 1, 2, 3}
    assert {l.schedule for l in eight if l.tp * l.pp == 8} == {s for s, _ in SCHEDULES}
    assert any(l.sp for l in eight) and any(not l.sp for l in eight)


def test_loss_curves_match_single_process(measured, reference):
    world, results = measured
    assert reference["losses"][-1] < reference["losses"][0] - 0.2  # it learns
    for layout, r in results.items():
        for step, (got, want) in enumerate(zip(r["losses"], reference["losses"])):
            assert abs(got - want) <= REL * abs(want), f"world {world} {layout}: step {step} loss {got} != {want}"
        for got, want in zip(r["grad_norms"], reference["grad_norms"]):
            assert abs(got - want) <= 1e-4 * want, f"world {world} {layout}: grad norm {got} != {want}"
        assert abs(r["val"] - reference["val"]) <= REL * reference["val"], f"world {world} {layout}: validation"


# ---- precision recipes: bf16 = fp32 master weights, bf16 autocast compute and residual stream, fp32 gradient
# reduction (DDP, ZeRO, and FSDP2's MixedPrecisionPolicy); bf16-pure = bf16 weights, gradients, reductions and
# AdamW state (parallel/precision.py). On 4 processes in one spawned group, against a single-process run of the
# same recipe, with the ledger's bytes equal to the cost model's for that recipe. Not bit for bit: the first
# step's loss is (the same forward) under DDP and ZeRO, but the ranks' fp32 gradient sum runs in another order
# than one process's micro-batch accumulation (a 1e-7 difference, as in fp32), and the next step's bf16 cast of
# the weights turns it into a whole bf16 ulp (2^-8 relative) for the elements it tips over; PP sums its
# micro-batch losses in another order; under bf16-pure the reduction itself rounds to bf16; TP rounds each
# rank's partial matmul output to bf16 before the sum; under zero=3 FSDP2 casts every parameter (norm gains,
# embedding) to bf16 where autocast keeps them fp32. Measured worst case over these layouts, 3 steps: loss
# 2.3e-5, gradient norm 5.5e-4, validation 2.1e-4 (relative).
PRECISION_CASES = ["bf16:dp=4", "bf16:dp=4,zero=1", "bf16:dp=4,zero=3", "bf16:dp=2,tp=2",
                   "bf16:dp=2,pp=2,schedule=1f1b,mbs=1", "bf16-pure:dp=4,zero=2", "bf16-pure:dp=4,zero=3"]
PRECISION_REL = {"loss": 1e-4, "grad_norm": 2e-3, "val": 5e-4}
SAME_FIRST_FORWARD = ("bf16:dp=4", "bf16:dp=4,zero=1", "bf16-pure:dp=4,zero=2", "bf16-pure:dp=4,zero=3")


@pytest.fixture(scope="module")
def precision_measured():
    return run_ranks(4, _train_all, PRECISION_CASES)[0]


def test_precision_recipes_match_single_process(precision_measured):
    references = {p: _reference("tiny", p) for p in ("bf16", "bf16-pure")}
    for case in PRECISION_CASES:
        r, want = precision_measured[case], references[case.split(":")[0]]
        if case in SAME_FIRST_FORWARD:
            assert r["losses"][0] == want["losses"][0], case
        for step, (got, ref) in enumerate(zip(r["losses"], want["losses"])):
            assert abs(got - ref) <= PRECISION_REL["loss"] * abs(ref), f"{case}: step {step} loss {got} != {ref}"
        for got, ref in zip(r["grad_norms"], want["grad_norms"]):
            assert abs(got - ref) <= PRECISION_REL["grad_norm"] * ref, f"{case}: grad norm {got} != {ref}"
        assert abs(r["val"] - want["val"]) <= PRECISION_REL["val"] * want["val"], f"{case}: validation"


def test_precision_recipes_bytes_match_the_cost_model(precision_measured):
    test_cost_model_predicts_the_measured_bytes((4, precision_measured))


def test_cost_model_predicts_the_measured_bytes(measured, model="tiny"):
    """The closed loop for TP/SP/PP(+DP): bytes per (collective, axis) of the rank the cost model describes."""
    world, results = measured
    for layout, r in results.items():
        got = {(e["collective"], e["axis"]): e["bytes"] for e in r["comm"]}
        assert got == predicted_bytes(_run(layout, world, model)), f"world {world} {layout}"


def predicted_bytes(run) -> dict:
    """The cost model's bytes per (collective, axis), summed as the ledger sums them (the forward and backward
    entries of one TP collective are apart in the prediction)."""
    from meshscale.cost import predict
    from meshscale.specs.cluster import load_cluster

    want: dict = {}
    for e in predict(run.spec, load_cluster("local-cpu"), run.layout, BATCH, run.config.precision).to_dict()["comm"]:
        if e["bytes"]:
            want[(e["collective"], e["axis"])] = want.get((e["collective"], e["axis"]), 0) + e["bytes"]
    return want


# ---- mixture of experts (tiny-moe) and GPT-style blocks (tiny-gpt) -----------------------------------------
# The layouts the issue names, on 4 processes, in one spawned group per model; 3 steps each (the dense matrix
# above covers the rest of what these share with `tiny`). Expert-parallel all-to-all bytes are the EP
# group's mean (parallel/expert.py), which equals the cost model's under dropless routing.
FAMILY_STEPS = 3
FAMILY_CASES = {
    "tiny-moe": ["dp=4,ep=2", "dp=4,ep=4", "dp=4,ep=2,zero=2", "dp=2,tp=2,ep=2",
                 "dp=2,pp=2,schedule=1f1b,ep=2,mbs=1", "dp=4,zero=3,ep=2",
                 # expert tensor parallelism as Megatron-Core folds it (etp=1: whole experts): EP over all the
                 # tp x dp ranks; EP groups across the TP pairs with the experts FSDP-sharded over dp (edp=2)
                 "dp=2,tp=2,sp=true,ep=4,etp=1", "dp=2,zero=3,tp=2,ep=2,etp=1",
                 # hybrid sharding with expert parallelism
                 "dp=4,zero=3,shard=2,ep=2", "dp=4,zero=1,shard=2,ep=2",
                 # SP with EP (each TP rank dispatches its sequence chunk); CP with MoE (the balance loss's
                 # statistics summed over CP), with EP over dp x cp, with SP around the MoE layers
                 "dp=2,tp=2,sp=true,ep=2", "dp=2,cp=2", "dp=2,zero=1,cp=2,ep=4", "dp=1,tp=2,sp=true,cp=2"],
    # every zero stage without a pipeline, every schedule with one (tied embeddings: zero 0, 1 or 3 there)
    # (SP: LayerNorm and row-parallel biases summed over TP, the position table added before the scatter)
    "tiny-gpt": ["dp=4", "dp=4,zero=2", "dp=4,zero=3", "dp=2,zero=1,tp=2", "tp=4,sp=true",
                 "dp=2,pp=2,schedule=gpipe,mbs=1", "pp=4,schedule=1f1b,mbs=1",
                 "tp=2,sp=true,pp=2,schedule=interleaved,vpp=2,mbs=1", "dp=2,zero=1,pp=2,schedule=zb,mbs=1",
                 "dp=2,zero=1,pp=2,schedule=zbv,mbs=1", "dp=2,pp=2,schedule=dualpipev,mbs=1",
                 "dp=2,zero=3,pp=2,schedule=interleaved,vpp=2,mbs=1"],  # the tied table's FSDP shards summed
}


def _family_run(model: str, layout: str, world: int):
    from meshscale.runtime.loop.config import TrainConfig, resolve

    return resolve(TrainConfig(model=model, layout=layout, steps=FAMILY_STEPS, global_batch=BATCH, bucket_mb=0.5,
                               val_batches=1), world)


def _train_family(rank, world, model, layouts):
    import torch

    from meshscale.runtime.loop.trainer import train

    tokens = _tokens()
    out = {}
    for layout in layouts:
        result = train(_family_run(model, layout, world), torch.device("cpu"), tokens, log=False)
        out[layout] = {"losses": [r["loss"] for r in result["rows"]], "val": result["val_loss"],
                       "aux": [r.get("aux_loss") for r in result["rows"]],
                       "grad_norms": [r["grad_norm"] for r in result["rows"]], "comm": result["comm"][-1],
                       "ep_imbalance": result.get("ep_imbalance")}
    return out


@pytest.fixture(scope="module", params=sorted(FAMILY_CASES))
def family(request):
    model = request.param
    reference = _train_family(0, 1, model, [""])[""]
    layouts = list(dict.fromkeys(FAMILY_CASES[model] + [w.scaled for w in plan_winners() if w.twin == model]))
    return model, reference, run_ranks(4, _train_family, model, layouts)[0]


# ---- the planner's winners run --------------------------------------------------------------------------
# `plan`'s best layout for each query (model, cluster, devices, global batch), its shape scaled to 4 ranks
# (`scale_to_four`) on the tiny twin of the model's family, runs in the spawned groups above (the twins'
# family groups; tiny's context-parallel group at world 4), with the parity and ledger checks of those tests.
WINNER_QUERIES = [("mixtral-8x7b", "h100-80gb", 128, 512), ("gpt3-175b", "h100-80gb", 512, 1536),
                  ("llama2-7b", "tpu-v5p", 256, 1024), ("llama2-13b", "a100-80gb", 32, 256),
                  ("llama2-70b", "a100-80gb", 256, 1024), ("llama3-70b", "tpu-v5p", 512, 1024)]


class Winner(NamedTuple):
    query: tuple
    layout: str  # as plan emits it
    twin: str  # the tiny model of its family
    scaled: str  # its shape on 4 ranks


def twin(model) -> str:
    return "tiny-moe" if model.is_moe else "tiny-gpt" if model.biases else "tiny"


def scale_to_four(w, model):
    """The rule: of tp, pp, cp (in that order), the first two the winner uses get degree 2; dp fills 4 ranks;
    ep is 2 (4 where the winner's is >= 4 and dp*cp is 4) when the winner uses it, etp=1 kept with tp (the EP
    group may then fold over tp when dp*cp is 1); zero, sp, the schedule,
    recompute and hybrid sharding (shard=2, where dp*cp is 4) are kept, vpp becomes 2 where it was > 1,
    mbs=1 with a pipeline. Precision: fp32 (parity)."""
    from meshscale.specs.layout import Layout

    degrees = {axis: 2 for axis in ("tp", "pp", "cp") if getattr(w, axis) > 1}
    degrees = dict(list(degrees.items())[:2])
    dp = 4 // 2 ** len(degrees)
    dc = dp * degrees.get("cp", 1)
    whole_experts = w.etp == 1 and "tp" in degrees
    ep = (4 if w.ep >= 4 and dc == 4 and model.experts % 4 == 0 else 2) if w.ep > 1 and (dc > 1 or whole_experts) \
        else 1
    pp = degrees.get("pp", 1)
    zero = w.zero if dc > 1 else 0
    return Layout(dp=dp, zero=zero, shard=2 if w.shard and dc == 4 and zero else 0, tp=degrees.get("tp", 1),
                  sp=w.sp and "tp" in degrees, pp=pp, vpp=2 if pp > 1 and w.vpp > 1 else 1,
                  schedule=w.schedule if pp > 1 else "1f1b", cp=degrees.get("cp", 1), ep=ep,
                  etp=1 if whole_experts and ep > 1 else 0,
                  mbs=1 if pp > 1 else 0, recompute=w.recompute)


@cache
def plan_winners() -> tuple:
    from meshscale.api import plan
    from meshscale.specs.layout import Layout
    from meshscale.specs.model import PRESETS

    out = []
    for query in WINNER_QUERIES:
        winner = plan(*query, top=1).ranked[0].layout
        name = twin(PRESETS[query[0]])
        out.append(Winner(query, winner, name, str(scale_to_four(Layout.parse(winner), PRESETS[name]))))
    return tuple(out)


def test_plan_winners_scale_to_runnable_layouts():
    from meshscale.plan.search import runnable
    from meshscale.specs.layout import Layout, trainer_refusal
    from meshscale.specs.model import PRESETS

    winners = plan_winners()
    assert {w.twin for w in winners} == {"tiny", "tiny-moe", "tiny-gpt"}
    for w in winners:
        layout, spec = Layout.parse(w.scaled), PRESETS[w.twin]
        assert layout.devices == 4 and runnable(layout, spec, BATCH), w
        assert trainer_refusal(layout, spec) is None, w
        winner = Layout.parse(w.layout)
        for axis in ("tp", "pp", "cp", "ep"):  # every axis the winner uses survives unless two others took 4 ranks
            kept = sum(getattr(winner, a) > 1 for a in ("tp", "pp", "cp")[:("tp", "pp", "cp", "ep").index(axis)])
            if getattr(winner, axis) > 1 and (axis == "ep" or kept < 2):
                assert getattr(layout, axis) > 1, (w, axis)


def test_plan_winners_ran(family):
    """Each MoE and GPT winner's scaled layout ran in its twin's group (whose tests check its parity and bytes);
    each dense one is a case of the world-4 groups of `tiny` (`dense_winner_cases` adds those they lack)."""
    model, _, results = family
    for w in plan_winners():
        if w.twin == model:
            assert w.scaled in results, w
    dense = set(sampled(4)) | set(new_mechanism_cases(4)) | set(dense_winner_cases())
    assert all(w.scaled in dense for w in plan_winners() if w.twin == "tiny")


def dense_winner_cases() -> list[str]:
    """The dense winners' scaled layouts that the world-4 groups of `tiny` do not already run."""
    have = set(sampled(4)) | set(new_mechanism_cases(4))
    return list(dict.fromkeys(w.scaled for w in plan_winners() if w.twin == "tiny" and w.scaled not in have))


def test_family_cases_are_runnable():
    from meshscale.plan.search import runnable
    from meshscale.specs.layout import Layout, trainer_refusal
    from meshscale.specs.model import PRESETS

    for model, layouts in FAMILY_CASES.items():
        for text in layouts:
            layout = Layout.parse(text)
            assert runnable(layout, PRESETS[model], BATCH) and trainer_refusal(layout, PRESETS[model]) is None, text


def test_family_matches_single_process(family):
    model, reference, results = family
    assert reference["losses"][-1] < reference["losses"][0]  # it learns
    for layout, r in results.items():
        for key in ("losses", "aux") if model == "tiny-moe" else ("losses",):
            for step, (got, want) in enumerate(zip(r[key], reference[key])):
                assert abs(got - want) <= REL * abs(want), f"{model} {layout}: step {step} {key} {got} != {want}"
        for got, want in zip(r["grad_norms"], reference["grad_norms"]):
            assert abs(got - want) <= 1e-4 * want, f"{model} {layout}: grad norm {got} != {want}"
        assert abs(r["val"] - reference["val"]) <= REL * reference["val"], f"{model} {layout}: validation"


def test_family_cost_model_predicts_the_measured_bytes(family):
    model, _, results = family
    for layout, r in results.items():
        run = _family_run(model, layout, 4)
        got = {(e["collective"], e["axis"]): e["bytes"] for e in r["comm"]}
        assert got == predicted_bytes(run), f"{model} {layout}"
        if run.layout.ep > 1:  # routing is data-dependent: one rank's share differs from the group mean
            assert r["ep_imbalance"] >= 1.0


# ---- context parallelism and hybrid sharding ----------------------------------------------------------
def new_mechanism_candidates(world: int) -> list:
    """Every layout with cp > 1 the planner can emit for `tiny` on `world` processes and the trainer runs, and
    every hybrid-sharded one (shard < dp*cp) the validator and the trainer accept: the planner tries hybrid
    sharding only where the dp*cp ranks span beyond the fast domain, which one CPU host never does."""
    from meshscale.plan.search import runnable
    from meshscale.specs.layout import Layout, trainer_refusal
    from meshscale.specs.model import PRESETS

    spec = PRESETS["tiny"]
    out = []
    for cp, tp, pp in product((1, 2, 4, 8), (1, 2, 4), (1, 2, 4)):
        if world % (cp * tp * pp):
            continue
        dp = world // (cp * tp * pp)
        for zero, shard in product(range(4), (0, 2, 4)):
            if (cp == 1 and not shard) or (shard and (zero == 0 or shard >= dp * cp or (dp * cp) % shard)):
                continue
            for sp in (False, True) if tp > 1 else (False,):
                for schedule, vpp in SCHEDULES if pp > 1 else [("1f1b", 1)]:
                    layout = Layout(dp=dp, zero=zero, shard=shard, tp=tp, sp=sp, pp=pp, vpp=vpp, schedule=schedule,
                                    cp=cp, mbs=1 if pp > 1 else 0)
                    if runnable(layout, spec, BATCH) and trainer_refusal(layout, spec) is None:
                        out.append(layout)
    return out


def new_mechanism_cases(world: int) -> list[str]:
    """A deterministic sample of `new_mechanism_candidates`: in their order, a layout is kept when it brings
    something not yet covered: a parallel shape (which of dp, tp, sp, pp, hybrid sharding are on, and the cp
    degree), a zero stage with and without hybrid sharding, or a pipeline schedule. World 8 adds only what
    world 4 cannot hold, three of tp, pp, cp and hybrid sharding at once: each such combination once, at the
    highest zero stage it accepts (FSDP inside a pipeline and with TP)."""
    out, covered = [], set()
    candidates = new_mechanism_candidates(world)
    for layout in sorted(candidates, key=lambda l: -l.zero) if world == 8 else candidates:
        hybrid = layout.shard > 0
        if world == 8:
            on = (layout.tp > 1, layout.pp > 1, layout.cp > 1, hybrid)
            if sum(on) < 3:
                continue
            keys = {("shape", *on)}
        else:
            keys = {("shape", layout.dp > 1, layout.tp > 1, layout.sp, layout.pp > 1, layout.cp, hybrid),
                    ("zero", layout.zero, hybrid), ("schedule", layout.schedule if layout.pp > 1 else None)}
        if keys - covered:
            covered |= keys
            out.append(str(layout))
    return out


@pytest.fixture(scope="module", params=WORLDS)
def new_measured(request):
    world = request.param
    layouts = new_mechanism_cases(world)
    if world == 4:
        layouts += dense_winner_cases()
    results = {}
    for part in (layouts[0::2], layouts[1::2]):
        per_rank = run_ranks(world, _train_all, part)
        results.update(per_rank[0])
    return world, results


def test_new_mechanism_sample_covers_the_issue_list():
    four = set(new_mechanism_cases(4))
    for required in ("dp=2,cp=2", "dp=1,cp=4", "dp=1,tp=2,sp=true,cp=2", "dp=2,zero=3,cp=2",
                     "dp=1,pp=2,schedule=1f1b,cp=2,mbs=1", "dp=4,zero=3,shard=2", "dp=4,zero=1,shard=2"):
        assert required in four or required.replace(",mbs=1", "") in four, required
    assert {s for s, _ in SCHEDULES} <= {Layout_of(t).schedule for t in four if Layout_of(t).pp > 1}
    assert {Layout_of(t).zero for t in four} == {0, 1, 2, 3}


def Layout_of(text: str):
    from meshscale.specs.layout import Layout

    return Layout.parse(text)


def test_new_mechanisms_match_single_process(new_measured, reference):
    test_loss_curves_match_single_process(new_measured, reference)


def test_new_mechanisms_bytes_match_the_cost_model(new_measured):
    test_cost_model_predicts_the_measured_bytes(new_measured)


# ---- KV-head replication: tp a multiple of kv_heads, on `tiny` with 2 KV heads (configs/tiny-kv2.toml) ---
# (at world 4 only: KV copies need tp=4, and the world-8 samples above already compose TP with FSDP)
KV_CASES = ["dp=1,tp=4", "dp=1,tp=4,sp=true"]


@pytest.fixture(scope="module")
def tiny_kv2():
    from pathlib import Path

    return str(Path(__file__).parents[1] / "configs" / "tiny-kv2.toml")


@pytest.fixture(scope="module")
def kv_measured(tiny_kv2):
    return 4, run_ranks(4, _train_all, KV_CASES, tiny_kv2)[0]


@pytest.fixture(scope="module")
def kv_reference(tiny_kv2):
    return _reference(tiny_kv2)


def test_kv_replication_matches_single_process(kv_measured, kv_reference):
    test_loss_curves_match_single_process(kv_measured, kv_reference)


def test_kv_replication_bytes_match_the_cost_model(kv_measured, tiny_kv2):
    test_cost_model_predicts_the_measured_bytes(kv_measured, tiny_kv2)
