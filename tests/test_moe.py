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
    for text, message in (("dp=4,ep=3", "divide the expert count"), ("dp=2,ep=4", r"divide dp\*cp")):
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
