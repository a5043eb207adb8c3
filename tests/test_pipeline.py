"""Pipeline schedules against a single device: loss and every gradient of one step for `tiny` in fp32 on real
gloo ranks, alone and composed with tensor/sequence parallelism; stage cutting; PP send bytes."""

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from meshscale.parallel.pipeline import PipelineRunner, pipeline_chunks, schedule_refusal
from meshscale.parallel.tensor import apply_tensor_parallel, vocab_parallel_cross_entropy
from meshscale.parallel.ledger import CommLedger
from meshscale.runtime.measure.trace import analytic_bubble, chrome_trace, measured_bubble
from meshscale.models.transformer import build_model
from meshscale.errors import UserError
from meshscale.specs.layout import Layout, check_against, split_layers, trainer_refusal
from meshscale.specs.model import PRESETS
from tests.multirank import run_ranks
from tests.test_tensor_parallel import ROW_PARALLEL, rel_err

SPEC = PRESETS["tiny"]
BATCH = 8  # sequences per step; mbs=1 gives 8 micro-batches


def batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SPEC.vocab, (BATCH, SPEC.seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def reference():
    model = build_model(SPEC, seed=0)
    tokens, targets = batch()
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def expected_send_bytes(layout: Layout, pp_rank: int, m: int) -> int:
    """Each micro-batch sends its activation forward and its gradient backward across every chunk boundary
    whose two chunks sit on different ranks; count the sends this rank makes."""
    owner = {}
    for r in range(layout.pp):
        for _, s in [(None, s) for s in _stages(layout, r)]:
            owner[s] = r
    seq = SPEC.seq // (layout.tp if layout.sp else 1)
    act = seq * SPEC.hidden * 4  # mbs=1, fp32
    sends = 0
    for s in _stages(layout, pp_rank):
        sends += s + 1 < layout.stages and owner[s + 1] != pp_rank
        sends += s > 0 and owner[s - 1] != pp_rank
    return sends * m * act


def _stages(layout, r):
    from meshscale.specs.placement import rank_chunks
    return rank_chunks(layout.pp, layout.stages, layout.v_shaped, r)


def pp_case(layout: Layout, pp_group, tp_group, ref_loss, ref_grads, dp_mesh=None) -> dict:
    """dp_mesh: FSDP2 over it, each DP replica taking its half of the batch."""
    pp_rank = dist.get_rank(pp_group)
    t = dist.get_world_size(tp_group) if tp_group is not None else 1
    tp_rank = dist.get_rank(tp_group) if tp_group is not None else 0
    chunks = pipeline_chunks(build_model(SPEC, seed=0), layout, pp_rank)
    if dp_mesh is not None:
        from torch.distributed.fsdp import fully_shard
        for _, module in chunks:
            for block in module.layers.values():
                fully_shard(block, mesh=dp_mesh)
            fully_shard(module, mesh=dp_mesh)
    if t > 1:
        for _, module in chunks:
            apply_tensor_parallel(module, tp_group, sequence_parallel=layout.sp)

        def loss_fn(logits, targets):
            return vocab_parallel_cross_entropy(logits, targets, tp_group)
    else:
        def loss_fn(logits, targets):
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    m = layout.microbatches(BATCH)
    runner = PipelineRunner(chunks, layout, pp_group, loss_fn, m)
    tokens, targets = batch()
    if dp_mesh is not None:
        mine = slice(dp_mesh.get_local_rank() * BATCH // 2, (dp_mesh.get_local_rank() + 1) * BATCH // 2)
        tokens, targets = tokens[mine], targets[mine]
    with CommLedger().active() as ledger:
        loss = runner.step(tokens, targets)
    assert (loss is not None) == runner.has_last
    loss = torch.zeros(()) if loss is None else loss
    dist.all_reduce(loss, group=pp_group)  # the last stage's loss, onto every PP rank to be checked there
    grad_err, names = 0.0, []
    for _, module in chunks:
        for name, p in module.named_parameters():
            expect = ref_grads[name]
            if t > 1 and not name.endswith("norm.weight"):
                expect = expect.chunk(t, dim=1 if name.endswith(ROW_PARALLEL) else 0)[tp_rank]
            grad = p.grad.full_tensor() if dp_mesh is not None else p.grad
            grad_err = max(grad_err, rel_err(grad, expect))
            names.append(name)
    assert {(e["axis"], e["collective"]) for e in ledger.records} <= {("pp", "send_recv"), ("tp", "all_reduce"),
                                                                      ("tp", "all_gather"), ("tp", "reduce_scatter")}
    sent = sum(e["bytes"] for e in ledger.records if e["axis"] == "pp")
    kinds = {k: sum(e["kind"] == k for e in runner.events) for k in "FBW"}
    if dp_mesh is not None:  # the step's loss is this replica's; the reference is the whole batch's
        dist.all_reduce(loss, group=dp_mesh.get_group())
        loss = loss / dp_mesh.size()
    return {"loss_err": abs(loss.item() - ref_loss) / ref_loss, "grad_err": grad_err, "names": names,
            "sent": sent, "expected_sent": expected_send_bytes(layout, pp_rank, m), "kinds": kinds,
            "events": runner.events, "span": runner.step_span}


# Gradients of every parameter, per schedule, at the building-block level. tests/test_train_matrix.py runs
# each schedule again through the trainer at pp=2 and 4, with TP/SP and every zero stage.
PP_LAYOUTS = [f"pp=4,dp=1,mbs=1,schedule={s}" for s in ("gpipe", "1f1b", "zb", "zbv", "dualpipev")]
PP_LAYOUTS += ["pp=2,dp=1,mbs=1,schedule=interleaved,vpp=4", "pp=4,dp=1,mbs=1,schedule=interleaved,vpp=2"]
# uneven first and last ranks (Megatron-Core --decoder-first/last-pipeline-num-layers): cuts 1|2|2|3 and 1|3|1|3
PP_LAYOUTS += ["pp=4,dp=1,mbs=1,schedule=1f1b,first=1,last=3",
               "pp=2,dp=1,mbs=1,schedule=interleaved,vpp=2,first=2,last=6"]
TP_PP_LAYOUTS = ["pp=2,tp=2,sp=true,dp=1,mbs=1,schedule=zbv"]
FSDP_PP_LAYOUTS = ["pp=2,dp=2,zero=3,mbs=1,schedule=interleaved,vpp=2"]


def pp_matrix(rank, world, layouts):
    torch.manual_seed(0)
    ref_loss, ref_grads = reference()
    # Mesh (pp, tp) over 4 ranks, tp innermost; every rank creates every group in the same order.
    pp_of = {2: [dist.new_group([0, 1]), dist.new_group([2, 3])], 4: [dist.new_group([0, 1, 2, 3])]}
    pp_outer = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # pp=2 with tp=2: ranks r and r+2
    tp_inner = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    from torch.distributed.device_mesh import init_device_mesh
    pp_dp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    results = {}
    for text in layouts:
        layout = Layout.parse(text)
        if layout.dp > 1:
            results[text] = pp_case(layout, pp_dp["pp"].get_group(), None, ref_loss, ref_grads, pp_dp["dp"])
        elif layout.tp > 1:
            results[text] = pp_case(layout, pp_outer[rank % 2], tp_inner[rank // 2], ref_loss, ref_grads)
        else:
            group = pp_of[layout.pp][rank // layout.pp if layout.pp == 2 else 0]
            results[text] = pp_case(layout, group, None, ref_loss, ref_grads)
    return results


@pytest.mark.parametrize("layouts", [PP_LAYOUTS + TP_PP_LAYOUTS + FSDP_PP_LAYOUTS])
def test_pipeline_schedules_match_single_device(layouts):
    results = run_ranks(4, pp_matrix, layouts)
    for text in layouts:
        layout = Layout.parse(text)
        per_rank = [r[text] for r in results]
        for rank, r in enumerate(per_rank):
            case = f"{text} rank {rank}"
            assert r["loss_err"] < 1e-5, (case, r)
            assert r["grad_err"] < 1e-5, (case, r)
            assert r["sent"] == r["expected_sent"], (case, r["sent"], r["expected_sent"])
            # one F and one B per micro-batch per chunk; zero-bubble schedules split W off the B (DualPipeV
            # only for some micro-batches: it runs full backwards where nothing is left to fill)
            runs = layout.microbatches(BATCH) * layout.vpp
            assert r["kinds"]["F"] == r["kinds"]["B"] == runs, (case, r["kinds"])
            if layout.schedule in ("zb", "zbv"):
                assert r["kinds"]["W"] == runs, (case, r["kinds"])
            elif layout.schedule == "dualpipev":
                assert 0 < r["kinds"]["W"] < runs, (case, r["kinds"])
            else:
                assert r["kinds"]["W"] == 0, (case, r["kinds"])
        check_trace(layout, per_rank)
        # every parameter of the model lives on exactly one pipeline rank of each TP/DP replica
        replica = [per_rank[r]["names"] for r in range(4) if r % 2 == 0] if layout.tp > 1 or layout.dp > 1 else \
            [per_rank[r]["names"] for r in range(layout.pp)]
        owned = sorted(n for names in replica for n in names)
        assert owned == sorted(n for n, _ in build_model(SPEC).named_parameters()), text


def test_split_layers_even_with_leftovers_inside():
    assert split_layers(8, 2) == [range(0, 4), range(4, 8)]
    # the first and last ranks' layers given: theirs spread over their chunks (rank r holds r, r + pp, ...)
    assert split_layers(8, 4, pp=4, first=1, last=3) == [range(0, 1), range(1, 3), range(3, 5), range(5, 8)]
    assert split_layers(8, 4, pp=2, first=2, last=6) == [range(0, 1), range(1, 4), range(4, 5), range(5, 8)]
    assert split_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert split_layers(10, 4) == [range(0, 2), range(2, 5), range(5, 8), range(8, 10)]
    for layers in range(1, 20):
        for chunks in range(1, layers + 1):
            ranges = split_layers(layers, chunks)
            assert [i for r in ranges for i in r] == list(range(layers))
            sizes = [len(r) for r in ranges]
            assert max(sizes) - min(sizes) <= 1, (layers, chunks, sizes)
            if chunks > 2:  # the chunks also holding the embedding or the head are never the heavier ones
                assert max(sizes[0], sizes[-1]) <= min(sizes[1:-1]), (layers, chunks, sizes)


def test_the_embedding_and_the_loss_counted_as_layers():
    """embedding_layer and loss_layer (Megatron-Core's --account-for-embedding/loss-in-pipeline-split): the
    first or last chunk holds a transformer layer fewer, multi-token prediction modules ride with the loss
    outside the cut, and each pipeline rank builds the layers the cut gives it."""
    assert split_layers(7, 2, pp=2, embedding=True) == [range(0, 3), range(3, 7)]
    assert split_layers(7, 2, pp=2, loss=True) == [range(0, 4), range(4, 7)]
    assert split_layers(61, 21, 1, 21, embedding=True, loss=True)[-1] == range(59, 61)  # 2 layers + the MTP
    model = build_model(replace(SPEC, layers=7), seed=0)
    for text, cut in (("pp=2,mbs=1", [[0, 1, 2, 3], [4, 5, 6]]),
                      ("pp=2,embedding_layer=true,mbs=1", [[0, 1, 2], [3, 4, 5, 6]])):
        chunks = [chunk for rank in range(2) for _, chunk in pipeline_chunks(model, Layout.parse(text), rank)]
        assert [[int(name) for name in chunk.layers] for chunk in chunks] == cut, text
        assert chunks[0].tok_embeddings is not None and chunks[1].tok_embeddings is None
        assert chunks[1].output is not None and chunks[0].output is None


def test_refusals_name_the_reason():
    assert schedule_refusal(Layout.parse("pp=4,schedule=dualpipev"), 4) == \
        ("schedule=dualpipev needs at least 2*pp = 8 micro-batches per step, got 4; "
                                                                     "raise the batch or lower mbs")
    assert "divisible by pp=4" in schedule_refusal(Layout.parse("pp=4,vpp=2,schedule=interleaved"), 6)
    assert "divisible by pp=2" in schedule_refusal(Layout.parse("pp=2,schedule=zb"), 5)
    assert schedule_refusal(Layout.parse("pp=4,schedule=1f1b"), 4) is None
    assert "wrong weight gradients" in schedule_refusal(Layout.parse("pp=2,dp=2,zero=3,schedule=zbv"), 4)
    # torch's split backward reruns a checkpointed block for its weight gradients too (measured: 1.6-10x)
    for schedule in ("zb", "zbv", "dualpipev"):
        assert "again for its weight gradients" in schedule_refusal(
            Layout.parse(f"pp=2,schedule={schedule},recompute=full"), 8)
        assert schedule_refusal(Layout.parse(f"pp=2,schedule={schedule},recompute=selective"), 8) is None
    assert schedule_refusal(Layout.parse("pp=2,schedule=1f1b,recompute=full"), 8) is None
    with pytest.raises(UserError, match="dualpipev needs at least 2\\*pp = 4"):
        check_against(Layout.parse("pp=2,mbs=1,schedule=dualpipev"), SPEC, global_batch=2)
    # the cost model pads the vocabulary for any tp; the trainer's vocabulary-parallel head needs tp | vocab
    odd = replace(SPEC, heads=6, kv_heads=3, ffn=174, vocab=256)
    check_against(Layout.parse("tp=3"), odd)
    assert "must divide the vocabulary (256)" in trainer_refusal(Layout.parse("tp=3"), odd)


def check_trace(layout: Layout, per_rank: list[dict]) -> None:
    """One row per rank; within a rank, compute runs never overlap and lie inside the step."""
    trace = chrome_trace([r["events"] for r in per_rank])["traceEvents"]
    assert {e["pid"] for e in trace} == set(range(len(per_rank)))
    for r in per_rank:
        runs = sorted(r["events"], key=lambda e: e["start"])
        assert all(a["end"] <= b["start"] for a, b in zip(runs, runs[1:]))
        assert r["span"][0] <= runs[0]["start"] and runs[-1]["end"] <= r["span"][1]
        assert 0.0 <= measured_bubble(r["events"], r["span"]) < 1.0
    assert sum(e["ph"] == "X" for e in trace) == sum(len(r["events"]) for r in per_rank)


def test_analytic_bubble():
    assert analytic_bubble("1f1b", 4, 8) == pytest.approx((3 / 8) / (1 + 3 / 8))
    assert analytic_bubble("interleaved", 4, 8, vpp=2) == pytest.approx((3 / 16) / (1 + 3 / 16))
    assert analytic_bubble("zb", 4, 8) < analytic_bubble("1f1b", 4, 8)
    assert analytic_bubble("gpipe", 1, 8) == 0.0
