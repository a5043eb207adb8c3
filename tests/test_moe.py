"""Mixture-of-experts pieces on one process: routing, capacity, the balance loss, the EP rules and the cost
model's EP terms. Multi-rank parity and bytes: tests/test_train_matrix.py (tiny-moe)."""

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from meshscale.errors import UserError
from meshscale.models.transformer import MoE, balance_loss, build_model
from meshscale.specs.layout import Layout, check_against, trainer_refusal
from meshscale.specs.model import PRESETS

SPEC = PRESETS["tiny-moe"]


def _moe(spec=SPEC) -> MoE:
    model = build_model(spec, seed=3)
    return model.layers[str(spec.first_dense_layers)].feed_forward


def test_layers_follow_the_spec():
    model = build_model(SPEC)
    kinds = [isinstance(model.layers[str(i)].feed_forward, MoE) for i in range(SPEC.layers)]
    assert kinds == [SPEC.is_moe_layer(i) for i in range(SPEC.layers)] == [False, True, True, True]
    assert sum(p.numel() for p in model.parameters()) == SPEC.param_count()


def test_balance_loss_is_one_when_balanced_and_per_sequence():
    e, k, seq = 4, 2, 8
    uniform = torch.full((2 * seq, e), 1 / e)
    experts = torch.tensor([[i % e, (i + 1) % e] for i in range(2 * seq)])
    assert balance_loss(uniform, experts, seq).item() == pytest.approx(1.0)
    skewed = torch.softmax(torch.randn(2 * seq, e, generator=torch.Generator().manual_seed(0)), -1)
    top = skewed.topk(k, -1).indices
    halves = [balance_loss(skewed[i * seq:(i + 1) * seq], top[i * seq:(i + 1) * seq], seq) for i in range(2)]
    # the mean over sequences: any split of the batch gives the same mean
    assert balance_loss(skewed, top, seq).item() == pytest.approx(sum(halves).item() / 2)


def test_dropless_keeps_every_assignment_and_capacity_drops():
    x = torch.randn(2, SPEC.seq, SPEC.hidden, generator=torch.Generator().manual_seed(1))
    dropless = _moe()
    n = x.shape[0] * x.shape[1] * SPEC.top_k
    assert dropless.kept(torch.zeros(n, dtype=torch.long)).numel() == n
    capped = _moe(replace(SPEC, capacity_factor=1.0))
    choice = torch.zeros(n, dtype=torch.long)  # everyone wants expert 0: it takes n/experts, first come
    kept = capped.kept(choice)
    assert kept.tolist() == list(range(n // SPEC.experts))
    with torch.no_grad():  # same weights; a tight capacity drops routed outputs, a loose one none
        capped.capacity_factor = 0.25
        assert not torch.allclose(capped(x), dropless(x))
        capped.capacity_factor = float(SPEC.experts)
        assert torch.allclose(capped(x), dropless(x))


def test_router_is_deterministic_and_weights_normalised():
    moe = _moe()
    x = torch.randn(64, SPEC.hidden, generator=torch.Generator().manual_seed(2))
    w1, e1, _ = moe.router(x, 64)
    w2, e2, _ = moe.router(x.clone(), 64)
    assert torch.equal(e1, e2) and torch.allclose(w1.sum(-1), torch.ones(64))


def test_ep_rules():
    for text, message in (("dp=4,ep=3", "divide the expert count"), ("dp=2,ep=4", r"divide tp\*cp\*dp")):
        with pytest.raises(UserError, match=message):
            check_against(Layout.parse(text), SPEC)
    with pytest.raises(UserError, match="dense"):
        check_against(Layout.parse("dp=2,ep=2"), PRESETS["tiny"])
    assert trainer_refusal(Layout.parse("dp=2,ep=2,zero=3"), SPEC) is None
    # SP around MoE layers with and without EP, CP with MoE, SP with GPT blocks (tests/test_train_matrix.py runs them)
    for text, model in (("dp=2,tp=2,sp=true,ep=2", SPEC), ("dp=2,tp=2,sp=true", SPEC), ("dp=2,cp=2", SPEC),
                        ("dp=2,tp=2,sp=true", PRESETS["tiny-gpt"])):
        assert trainer_refusal(Layout.parse(text), model) is None, text
    # learned position embeddings under CP are still not built
    assert trainer_refusal(Layout.parse("cp=2"), PRESETS["tiny-gpt"])
    for text in ("dp=4,zero=1,shard=2", "dp=4,zero=1,shard=2,ep=2", "dp=4,zero=3,shard=2,ep=2"):
        assert trainer_refusal(Layout.parse(text), SPEC) is None, text


def test_etp_rules_follow_megatron_core():
    """etp (Megatron-Core's --expert-tensor-parallel-size, default tp) and EP folded over the stage's tp*cp*dp
    ranks: ep*etp must divide tp*cp*dp; etp=tp is the canonical default; the runtime builds etp as 1 or tp."""
    from meshscale.specs.layout import expert_mesh_shape

    folded = Layout.parse("dp=2,tp=2,ep=4,etp=1")
    assert str(folded) == "dp=2,tp=2,ep=4,etp=1" and Layout.parse(str(folded)) == folded
    assert (folded.expert_tp, folded.edp, folded.dispatch_split) == (1, 1, 2)
    assert Layout.parse("dp=2,tp=2,ep=2,etp=2") == Layout.parse("dp=2,tp=2,ep=2")  # etp=tp: the default
    assert str(Layout.parse("dp=2,tp=2,ep=2,etp=2")) == "dp=2,tp=2,ep=2"
    # (pp, edp, ep, etp): etp innermost, then ep, then the expert data-parallel group (Megatron's tp-ep-dp order)
    ranks = torch.arange(4).reshape(expert_mesh_shape(Layout.parse("dp=2,tp=2,ep=2,etp=1")))
    assert ranks[0, :, :, 0].tolist() == [[0, 1], [2, 3]]  # EP groups span the TP pairs; edp: {0, 2}, {1, 3}
    assert expert_mesh_shape(Layout.parse("dp=4,tp=2,ep=2")) == (1, 2, 2, 2)  # etp=tp: EP over dp as before
    check_against(folded, SPEC)
    check_against(Layout.parse("dp=16,tp=2,ep=32,etp=1"), PRESETS["deepseek-v3"])  # the example
    for text, model, message in (("dp=16,tp=2,ep=32", PRESETS["deepseek-v3"], r"ep\*etp = 32\*2 must divide"),
                                 ("dp=2,tp=2,ep=8,etp=1", SPEC, r"must divide tp\*cp\*dp = 4")):
        with pytest.raises(UserError, match=message):
            check_against(Layout.parse(text), model)
    with pytest.raises(UserError, match="add ep or drop etp"):
        Layout.parse("dp=2,tp=2,etp=1")
    assert trainer_refusal(folded, SPEC) is None
    assert "built as 1 or tp" in trainer_refusal(Layout.parse("tp=4,ep=2,etp=2,dp=2"), SPEC)


def test_cost_model_etp_terms():
    """Expert tensor parallelism in the cost model: experts split by ep*etp, the all-to-all of each TP rank's
    sequence chunk over ep ranks etp apart, the ETP gather/reduce-scatter of the arrivals, the experts'
    gradient over tp*cp*dp/(ep*etp) ranks, and the grouped GEMMs' shapes."""
    from meshscale.cost import comm, predict
    from meshscale.cost.kernels import layer_gemms
    from meshscale.cost.memory import expert_params_on_rank
    from meshscale.cost.step import _axis_group
    from meshscale.specs.cluster import load_cluster

    tokens, moe, h, k, act = 2 * SPEC.seq, SPEC.moe_layers, SPEC.hidden, SPEC.top_k, 4
    whole = Layout.parse("dp=2,tp=2,ep=2,etp=1")
    split = Layout.parse("dp=2,tp=2,sp=true,ep=2")
    assert expert_params_on_rank(SPEC, whole, 0) == moe * SPEC.experts * SPEC.expert_params() / 2
    assert expert_params_on_rank(SPEC, split, 0) == moe * SPEC.experts * SPEC.expert_params() / 4
    (a2a,) = comm.expert_parallel_ops(SPEC, whole, tokens, act, moe, 1)
    assert a2a.bytes == 4 * moe * k * tokens / 2 * h * act  # each TP rank sends its half of the tokens
    assert comm.expert_tensor_parallel_ops(SPEC, whole, tokens, act, moe, 1) == []
    gather, scatter = comm.expert_tensor_parallel_ops(SPEC, split, tokens, act, moe, 1)
    assert (gather.collective, gather.bytes) == ("all_gather", 2 * moe * 2 * k * tokens / 2 * h * act)
    assert scatter.bytes == gather.bytes
    assert comm.expert_tensor_parallel_ops(SPEC, Layout.parse("dp=2,tp=2,ep=2"), tokens, act, moe, 1) == []
    assert _axis_group(whole, "ep") == (2, 1) and _axis_group(whole, "edp") == (2, 2)
    assert _axis_group(split, "ep") == (2, 2) and _axis_group(split, "etp") == (2, 1)
    entries = predict(SPEC, load_cluster("local-cpu"), whole, 8, "fp32").comm
    assert [e["bytes"] for e in entries if e["axis"] == "edp"] == [4 * expert_params_on_rank(SPEC, whole, 0)]
    # grouped GEMMs: etp=1 keeps the whole expert width and gathers no arrivals (half the tokens per expert)
    layer = SPEC.first_dense_layers
    up_whole = layer_gemms(SPEC, layer, whole, tokens)[-2 if not SPEC.shared_experts else -4]
    up_split = layer_gemms(SPEC, layer, split, tokens)[-2 if not SPEC.shared_experts else -4]
    assert up_whole.n == 2 * up_split.n and 2 * up_whole.m == up_split.m


def test_bad_ep_is_one_line_exit_2_before_any_process_starts():
    r = subprocess.run([sys.executable, "-m", "meshscale", "train", "--model", "tiny", "--layout", "dp=2,ep=2",
                        "--nproc", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "dense" in r.stderr


def test_cost_model_ep_terms():
    from meshscale.cost import comm, predict
    from meshscale.cost.step import _axis_group
    from meshscale.specs.cluster import load_cluster

    layout = Layout.parse("dp=4,ep=2")
    tokens, m, moe = 2 * SPEC.seq, 1, SPEC.moe_layers
    (op,) = comm.expert_parallel_ops(SPEC, layout, tokens, 4, moe, m)
    assert (op.collective, op.bytes, op.calls) == ("all_to_all", 4 * moe * SPEC.top_k * tokens * SPEC.hidden * 4,
                                                   4 * moe)
    assert _axis_group(layout, "ep") == (2, 1) and _axis_group(layout, "edp") == (2, 2)
    entries = predict(SPEC, load_cluster("local-cpu"), layout, 8, "fp32").comm
    experts = moe * SPEC.experts * SPEC.expert_params() / 2
    edp = [e for e in entries if e["axis"] == "edp"]
    assert [e["bytes"] for e in edp] == [4 * experts]  # their gradient all-reduce over the 2 replicas
