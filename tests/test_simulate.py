"""`meshscale simulate`: the runtime's schedule orders, the closed-form bubbles, agreement with predict,
stragglers, the Chrome trace and bad input."""

import json
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from meshscale.cli import main
from meshscale.cost import predict
from meshscale.cost.kernels import Passes
from meshscale.cost.pipeline import bubble_ratio, makespan, schedule_bubble, steady
from meshscale.cost.schedule import pass_seconds, rank_orders
from meshscale.cost.step import chunk_passes, distinct_rank_passes, pipeline_passes
from meshscale.runtime.measure.trace import chrome_trace
from meshscale.sim import engine
from meshscale.sim.measured import gaps, read_trace, replay
from meshscale.sim.step import simulate
from meshscale.specs.cluster import PRESETS as CLUSTERS, Software
from meshscale.specs.layout import Layout
from meshscale.specs.model import PRESETS as MODELS
from meshscale.specs.placement import stage_owner

SHAPES = [(s, v) for s, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3), ("zb", 1),
                              ("zbv", 2), ("dualpipev", 2))]


def _valid(schedule, pp, m):
    return not ((schedule in ("interleaved", "zb") and m % pp) or (schedule == "dualpipev" and m < 2 * pp))


def _torch_orders(schedule, pp, vpp, m):
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    kind = {S._ComputationType.FORWARD: "F", S._ComputationType.FULL_BACKWARD: "B",
            S._ComputationType.BACKWARD_INPUT: "I", S._ComputationType.BACKWARD_WEIGHT: "W"}

    def flat(actions):
        out = []
        for a in actions:
            if a is not None and a.sub_actions:
                out += flat(a.sub_actions)
            elif a is not None and a.computation_type in kind:
                out.append((a.stage_index, kind[a.computation_type], a.microbatch_index))
        return tuple(out)

    if schedule in ("gpipe", "1f1b"):
        cls = S.ScheduleGPipe if schedule == "gpipe" else S.Schedule1F1B
        order = cls._get_pipeline_order(SimpleNamespace(_num_stages=pp, _n_microbatches=m))
        return tuple(flat(order[r]) for r in range(pp))
    cls = {"interleaved": S.ScheduleInterleaved1F1B, "zb": S.ScheduleInterleavedZeroBubble,
           "zbv": S.ScheduleZBVZeroBubble, "dualpipev": S.ScheduleDualPipeV}[schedule]
    rounds = max(1, m // pp)  # the attributes the schedules' constructors set before building the orders
    fake = SimpleNamespace(pp_group_size=pp, n_local_stages=vpp, _n_microbatches=m, num_stages=pp * vpp,
                           microbatches_per_round=m // rounds)
    return tuple(flat(cls._calculate_single_rank_operations(fake, r)) for r in range(pp))


@pytest.mark.parametrize("schedule,vpp", SHAPES)
def test_orders_are_torchs(schedule, vpp):
    for pp in (2, 3, 4, 8):
        for m in (pp, 2 * pp, 3 * pp, 4 * pp + 1, 16):
            if not _valid(schedule, pp, m):
                continue
            ours, theirs = rank_orders(schedule, pp, vpp, m), _torch_orders(schedule, pp, vpp, m)
            if schedule == "1f1b":
                # torch's descriptive Schedule1F1B order numbers the last rank's forwards from 1; the loop it
                # executes (Schedule1F1B._step_microbatches) runs F0 first, as ours does
                ours, theirs = ours[:-1], theirs[:-1]
            assert ours == theirs, (schedule, pp, m)


def _unit_bubble(schedule, pp, vpp, m, f=1.0, b=1.0, w=1.0):
    """Idle over busy time of a pipeline of equal ranks whose passes take f, b, w, no communication."""
    v_shape = schedule in ("zbv", "dualpipev")
    unit = {"F": f, "B": b + w, "I": b, "W": w}
    run = engine.run(rank_orders(schedule, pp, vpp, m), lambda s: stage_owner(s, pp, v_shape),
                     lambda r, s, k, mb: (unit[k] / vpp, 0.0), lambda a, b: 0.0)
    return (max(p.end for p in run.passes) - (f + b + w) * m) / ((f + b + w) * m)


# F, B, W of a micro-batch: equal, and unequal with W <= F <= B as the kernels give (attention in F and B only)
PASSES = ((1.0, 1.0, 1.0), (0.33, 0.41, 0.26), (0.3, 0.45, 0.25), (0.25, 0.6, 0.15))


@pytest.mark.parametrize("schedule,vpp", SHAPES)
def test_bubble_equals_closed_form(schedule, vpp):
    """cost/pipeline.py's closed forms are the idle time of the orders torch runs, for equal and unequal F, B,
    W: at m = p too, where torch's ZB-V idles twice Qi et al.'s (p-1)/(6m), and for DualPipeV; and so is the
    longest path predict takes through even chunks."""
    for f, b, w in PASSES:
        for pp in (2, 4, 8):
            for m in sorted({pp, pp + 1, 3 * pp // 2, 2 * pp - 1, 2 * pp, 4 * pp, 8 * pp}):
                if not _valid(schedule, pp, m):
                    continue
                closed = schedule_bubble(schedule, pp, vpp, m, f, b, w)
                assert _unit_bubble(schedule, pp, vpp, m, f, b, w) == pytest.approx(closed, rel=0.01), (f, b, w, pp, m)
                chunks = [Passes(f / vpp, b / vpp, w / vpp)] * (pp * vpp)
                path = bubble_ratio(Layout(pp=pp, vpp=vpp, schedule=schedule), m, chunks)
                assert path == pytest.approx(_unit_bubble(schedule, pp, vpp, m, f, b, w), rel=1e-9, abs=1e-12)


AGREE = [("llama2-7b", "fsdp=128", 128, 256), ("llama2-7b", "dp=64,tp=2,sp=true", 128, 256),
         ("llama2-7b", "dp=32,zero=1,pp=4,schedule=zb", 128, 256),
         ("llama2-70b", "tp=8,pp=4,schedule=interleaved,vpp=5,recompute=selective", 512, 512),
         ("llama2-70b", "dp=16,zero=2,tp=8,pp=4,schedule=gpipe", 512, 512),
         ("llama2-70b", "dp=32,zero=3,pp=2,vpp=8,schedule=interleaved,cp=2,mbs=1", 128, 1024),
         ("llama2-70b", "dp=4,zero=1,tp=8,pp=4,schedule=dualpipev", 128, 256),
         ("llama3-405b", "tp=8,pp=16,zero=1,schedule=1f1b", 16384, 2048),
         ("llama3-405b", "tp=8,pp=8,zero=1,schedule=zbv", 8192, 2048),
         ("llama3-405b", "tp=8,pp=8,zero=1,schedule=zbv", 512, 64),  # m = p
         ("llama2-70b", "dp=4,zero=1,tp=8,pp=4,schedule=zbv", 128, 24),  # p < m < 2p - 1
         ("gpt3-175b", "tp=8,pp=8,recompute=full", 1024, 1536),
         ("mixtral-8x7b", "dp=16,zero=1,ep=8,tp=2,pp=2", 64, 256)]
SOFTWARE = (Software(),  # the defaults
            Software(grad_reduce_overlap=False, param_gather_overlap=False, fsdp_prefetch=False,
                     pp_comm_overlap=False),  # all off
            Software(tp_comm_overlap=True, ep_comm_overlap=True),  # all on
            Software(framework="torch"))  # DDP's buckets, FSDP2's units and copy-out


def test_predict_computes_from_the_chunks_the_simulator_runs():
    """predict's compute is m x the slowest rank's sum of chunk_passes (dense and MoE layers, the head on the
    last chunk), for looped and V placements."""
    cluster = CLUSTERS["h100-80gb"]
    for model, text, devices, batch in (("deepseek-v3", "tp=8,pp=8,ep=8,schedule=zbv", 512, 512),
                                        ("llama2-70b", "tp=8,pp=4,vpp=5,schedule=interleaved", 128, 128)):
        layout = Layout.parse(text, devices).resolve_mbs(batch)
        slowest = max(sum((chunk_passes(MODELS[model], cluster, layout, c) for c in range(layout.stages)
                           if stage_owner(c, layout.pp, layout.schedule == "zbv") == r), Passes()).total
                      for r in range(layout.pp))
        pred = predict(MODELS[model], cluster, layout, batch)
        assert pred.compute_s == pytest.approx(pred.microbatches * slowest, rel=1e-12)
        assert pipeline_passes(MODELS[model], cluster, layout)[0].total == pytest.approx(slowest, rel=1e-12)


@pytest.mark.parametrize("model,layout,devices,batch", AGREE)
def test_step_agrees_with_predict(model, layout, devices, batch):
    """With the default overlap switches, with every overlap off and with every overlap on."""
    for software in SOFTWARE:
        cluster = replace(CLUSTERS["h100-80gb"], software=software)
        sim = simulate(MODELS[model], cluster, Layout.parse(layout, devices), batch)
        pred = predict(MODELS[model], cluster, Layout.parse(layout, devices), batch)
        assert sim.step_time_s == pytest.approx(pred.step_time_s, rel=0.02)
        assert sim.bubble_fraction == pytest.approx(pred.bubble_fraction, abs=0.02)
        assert len(sim.ranks) == Layout.parse(layout, devices).pp  # one representative per pipeline rank


def test_straggler_slows_the_step_and_says_who_waits():
    model, cluster = MODELS["llama2-70b"], CLUSTERS["h100-80gb"]
    layout = Layout.parse("dp=16,zero=1,tp=8,pp=4,schedule=1f1b", 512)
    healthy = simulate(model, cluster, layout, 512)
    same = simulate(model, cluster, layout, 512, stragglers={200: 1.0})
    assert same.step_time_s == pytest.approx(healthy.step_time_s)
    slow = simulate(model, cluster, layout, 512, stragglers={200: 1.5})  # pp rank 200 // 128 = 1
    assert slow.step_time_s > healthy.step_time_s * 1.2
    assert slow.healthy_step_time_s == pytest.approx(healthy.step_time_s)
    assert len(slow.ranks) == 2 * layout.pp  # the healthy replicas and the one holding the straggler
    assert any("for pp rank 1" in w for w in slow.waits)
    assert any("gradient reduction" in w for w in slow.waits)


def test_slow_link_on_a_pipeline_rank_delays_its_receivers():
    """Device 1 is pp rank 1 of the only replica: its sends and receives take 30x longer, nothing else."""
    model, cluster, layout = MODELS["llama2-7b"], CLUSTERS["h100-80gb"], Layout.parse("pp=4", 4)
    healthy = simulate(model, cluster, layout, 8)
    slow = simulate(model, cluster, layout, 8, slow_links={1: 30.0})
    send = next(e["time_s"] / e["calls"] for e in predict(model, cluster, layout, 8).comm if e["axis"] == "pp")
    # the first forward and the last backward each cross its links twice, on the critical path
    assert slow.step_time_s - healthy.step_time_s == pytest.approx(4 * 29 * send)
    assert slow.healthy_step_time_s == pytest.approx(healthy.step_time_s)
    assert any(w.startswith("pp rank 2 (replica of device 1's link) waits") and w.endswith(
        "more than in a healthy replica for pp rank 1") for w in slow.waits)
    assert simulate(model, cluster, layout, 8, slow_links={1: 1.0}).step_time_s == healthy.step_time_s


def test_slow_link_slows_its_tensor_parallel_collectives():
    """TP collectives nothing hides (tp_comm_overlap off) take twice as long on the rank whose link is 2x slower
    (the step's few latency-bound control all-reduces aside)."""
    from meshscale.cost.step import control_seconds

    model, cluster, layout = MODELS["llama2-7b"], CLUSTERS["h100-80gb"], Layout.parse("tp=8,pp=4", 32)
    healthy = simulate(model, cluster, layout, 8)
    slow = simulate(model, cluster, layout, 8, slow_links={9: 2.0})  # pp rank 1 (8 devices per stage)
    control = control_seconds(cluster, 32, layout)
    assert [r.exposed_comm_s for r in slow.ranks] == pytest.approx(
        [(r.exposed_comm_s - control) * 2 + control if i == 1 else r.exposed_comm_s
         for i, r in enumerate(healthy.ranks)])
    assert slow.step_time_s > healthy.step_time_s


@pytest.mark.parametrize("text,devices,batch,link", [("dp=32,zero=1,pp=4,schedule=1f1b", 128, 256, 70),
                                                     ("fsdp=64", 64, 64, 5)])
def test_slow_link_in_a_data_parallel_ring_slows_every_replica(text, devices, batch, link):
    """Device `link`'s data-parallel ring (the gradient reduce-scatter / FSDP gathers of its pipeline rank)
    runs 8x slower: that rank waits longer in every replica, the other pipeline ranks do not. (At 4x, 1F1B's
    drain hides most of pp rank 2's longer reduce-scatter behind the ranks before it: 9.7 ms of its 91.)"""
    model, cluster, layout = MODELS["llama2-7b"], CLUSTERS["h100-80gb"], Layout.parse(text, devices)
    healthy = simulate(model, cluster, layout, batch)
    slow = simulate(model, cluster, layout, batch, slow_links={link: 8.0})
    rank = link // (devices // layout.pp)
    assert len(slow.ranks) == 2 * layout.pp  # the healthy replicas and the one holding the link
    for i, r in enumerate(slow.ranks):
        before = healthy.ranks[i % layout.pp].exposed_comm_s
        if i % layout.pp == rank:
            assert r.exposed_comm_s > before + 0.01
        else:
            assert r.exposed_comm_s == pytest.approx(before)
    assert slow.step_time_s > healthy.step_time_s + 0.01
    assert any(w.startswith(f"pp rank {rank} of every replica waits") and f"device {link}'s link" in w
               for w in slow.waits)
    same = simulate(model, cluster, layout, batch, slow_links={link: 1.0})
    assert same.step_time_s == healthy.step_time_s
    assert [r.exposed_comm_s for r in same.ranks[:layout.pp]] == [r.exposed_comm_s for r in healthy.ranks]


def test_json_trace_and_bad_input(tmp_path, capsys):
    args = ["simulate", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "64", "--layout",
            "dp=16,zero=1,pp=4,schedule=interleaved,vpp=2", "--global-batch", "64"]
    main(args + ["--json", "--trace", str(tmp_path / "t.json")])
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] > 0 and 0 < out["bubble_fraction"] < 1
    assert all({"busy_s", "idle_s", "exposed_comm_s"} <= set(r) for r in out["ranks"])
    for r in out["ranks"]:
        assert r["busy_s"] + r["idle_s"] + r["exposed_comm_s"] == pytest.approx(out["step_time_s"])
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["pid"] for e in trace if e["ph"] == "X"} == {0, 1, 2, 3}
    assert {e["tid"] for e in trace if e["ph"] == "X"} == {0, 1, 2}  # compute, pp sends, data-parallel stream
    main(args + ["--straggler", "link:20:3", "--json"])  # pp rank 1: its sends and data-parallel ring
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] > out["healthy_step_time_s"]
    for bad in (["--straggler", "64:1.5"], ["--straggler", "3:0"], ["--straggler", "3"], ["--straggler", "link:64:2"],
                ["--straggler", "link:3:-1"], ["--straggler", "link:3"], ["--straggler", "link:x:2"]):
        with pytest.raises(SystemExit) as e:
            main(args + bad)
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().count("\n") == 0


def test_replay_of_a_trace_gives_back_its_bubble(tmp_path, capsys):
    """A trace in runtime/measure/trace.py's format, drawn from a simulated pipeline with uneven stages and gaps of
    each kind between passes (a send's delivery 0.05, 0.2 after the previous pass before a pass taking
    another rank's input, 0.1 before the others), gives back those gaps and replays to the bubble it shows."""
    layout = Layout(pp=4, schedule="1f1b", mbs=1)
    cost = [1.0, 1.0, 1.0, 1.6]  # a heavier last stage
    run = engine.run(rank_orders("1f1b", 4, 1, 8), lambda s: s,
                     lambda r, s, k, mb: (cost[s] * (1 if k == "F" else 2), 0), lambda a, b: 0.05,
                     before=lambda r, s, k, mb: 0.2 if (s > 0 if k == "F" else s < 3) else 0.1)
    events = [[{"kind": p.kind, "mb": p.mb, "stage": p.stage, "start": p.start, "end": p.end}
               for p in run.passes if p.rank == r] for r in range(4)]
    (tmp_path / "t.json").write_text(json.dumps(chrome_trace(events)))
    gap = gaps(read_trace(str(tmp_path / "t.json")), lambda s: s)
    assert (gap.posted, gap.local) == pytest.approx((0.2, 0.1))
    assert gap.delivered == pytest.approx(0.05, abs=0.005)  # a delivery that lands inside 0.2 reads shorter
    r = replay(str(tmp_path / "t.json"), layout, 8)
    assert r.simulated == pytest.approx(r.measured, abs=1e-3)
    assert r.measured[0] > 0.2 and r.measured[3] < r.measured[0]
    args = ["simulate", "--model", "tiny", "--cluster", "local-cpu", "--devices", "4", "--global-batch", "8",
            "--times-from", str(tmp_path / "t.json")]
    main(args + ["--layout", "pp=4,schedule=1f1b,mbs=1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["simulated_bubble"] == pytest.approx(r.simulated) and out["gaps_s"]["posted"] == pytest.approx(0.2)
    with pytest.raises(SystemExit) as e:  # the trace's pipeline is not this layout's
        main(args + ["--layout", "pp=2,schedule=1f1b,mbs=1"])
    assert e.value.code == 2 and "does not match --layout" in capsys.readouterr().err


def test_a_rank_that_waited_for_a_core_is_replayed_with_its_own_gaps(tmp_path):
    """The last rank of four idles 0.6 between passes where the others idle 0.1-0.2 (on shared cores, a rank
    waiting for a core): the replay charges each rank its own gaps, so the step's bubble comes back, where the
    means over all ranks would have charged that rank the others' short gaps (37.3% against 43.3%)."""
    slow = 3
    run = engine.run(rank_orders("1f1b", 4, 1, 8), lambda s: s, lambda r, s, k, mb: (1.0 if k == "F" else 2.0, 0),
                     lambda a, b: 0.05, before=lambda r, s, k, mb: 0.6 if r == slow else 0.2 if k == "B" else 0.1)
    events = [[{"kind": p.kind, "mb": p.mb, "stage": p.stage, "start": p.start, "end": p.end}
               for p in run.passes if p.rank == r] for r in range(4)]
    (tmp_path / "t.json").write_text(json.dumps(chrome_trace(events)))
    r = replay(str(tmp_path / "t.json"), Layout(pp=4, schedule="1f1b", mbs=1), 8)
    assert (r.rank_gaps[slow].local, r.rank_gaps[slow].posted) == pytest.approx((0.6, 0.6))
    assert r.rank_gaps[0].local == pytest.approx(0.1) and r.measured[0] > 0.4
    assert r.simulated == pytest.approx(r.measured, abs=1e-3)
    assert r.gaps.local < 0.6  # the all-rank mean, which alone would under-charge the slow rank


def _deepspeed_span(pp: int, m: int, f: float, b: float, send: float) -> float:
    """DeepSpeed's own TrainSchedule for `pp` stages, each send meeting its receive for `send` seconds on both
    ranks (blocking NCCL calls, as runtime/pipe/p2p.py issues them): when its last stage is done."""
    schedule = pytest.importorskip("deepspeed.runtime.pipe.schedule")
    # command -> (what it does, the stage it meets, relative, what travels) or the seconds it computes
    does = {"SendActivation": ("send", 1, "act"), "RecvActivation": ("recv", -1, "act"),
            "SendGrad": ("send", -1, "grad"), "RecvGrad": ("recv", 1, "grad"), "ForwardPass": f, "BackwardPass": b}
    ops = [[does[type(c).__name__] for cmds in schedule.TrainSchedule(m, pp, i).steps() for c in cmds
            if type(c).__name__ in does] for i in range(pp)]
    clock, at = [0.0] * pp, [0] * pp
    while any(at[i] < len(ops[i]) for i in range(pp)):
        moved = False
        for i in range(pp):
            while at[i] < len(ops[i]):
                op = ops[i][at[i]]
                if isinstance(op, float):  # a pass
                    clock[i], at[i], moved = clock[i] + op, at[i] + 1, True
                    continue
                kind, j, what = op[0], i + op[1], op[2]
                if at[j] == len(ops[j]) or ops[j][at[j]] != ("recv" if kind == "send" else "send", i - j, what):
                    break  # its partner is not there yet
                clock[i] = clock[j] = max(clock[i], clock[j]) + send
                at[i], at[j], moved = at[i] + 1, at[j] + 1, True
        assert moved, "DeepSpeed's schedule deadlocked"
    return max(clock)


def test_blocking_receives_run_as_deepspeeds_own_schedule():
    """DeepSpeed's pipeline engine blocks its ranks on every receive as on every send: the engine with
    receives_block spans DeepSpeed's TrainSchedule within two transfers, where blocking sends alone come short by
    about two transfers a micro-batch on the middle ranks."""
    f, b, send = 1.0, 2.0, 0.1
    for pp in (2, 3, 4, 8):
        for m in (pp, 2 * pp, 16):
            def span(**blocks):
                run = engine.run(rank_orders("1f1b", pp, 1, m), lambda s: s,
                                 lambda r, s, k, mb: (f if k == "F" else b, 0.0), lambda a, c: send, **blocks)
                return max(p.end for p in run.passes)
            deepspeed = _deepspeed_span(pp, m, f, b, send)
            assert abs(span(blocking=True, receives_block=True) - deepspeed) <= 2 * send + 1e-9, (pp, m)
            if pp > 2 and m == 16:
                assert deepspeed - span(blocking=True) > (m - 2) * 2 * send * 0.9, (pp, m)


def test_uneven_gpipe_is_the_flow_shop_makespan():
    """Ranks of unequal F, B (the head on the last, a lighter first): GPipe's span is m times the slowest rank's
    F+B plus one F+B of each other rank, which bubble_ratio's longest path gives."""
    pp, m = 4, 8
    ranks = [Passes(0.8, 1.2), Passes(1.0, 1.5), Passes(1.0, 1.5), Passes(1.4, 2.1)]
    run = engine.run(rank_orders("gpipe", pp, 1, m), lambda s: s,
                     lambda r, s, k, mb: (ranks[s].forward if k == "F" else ranks[s].backward, 0.0), lambda a, b: 0.0)
    span = m * ranks[3].total * (1 + bubble_ratio(Layout(pp=pp, schedule="gpipe"), m, ranks))
    assert max(p.end for p in run.passes) == pytest.approx(m * ranks[3].total + sum(r.total for r in ranks[:3]))
    assert max(p.end for p in run.passes) == pytest.approx(span)


def test_one_micro_batch_of_gpipe_takes_every_ranks_passes_end_to_end():
    """With one micro-batch GPipe runs every rank's passes one after another, so no step is shorter than their
    sum, here where the rank whose traffic shows longest (rank 1) is not the one whose passes are slowest (the
    head's, rank 15; Grace's host stretches them all). The step runs at the latter's pace."""
    model = replace(MODELS["deepseek-v2"], seq=2048)
    layout = Layout.parse("dp=8,zero=2,pp=16,schedule=gpipe,mbs=16", 128)
    pred = predict(model, CLUSTERS["gb200-nvl72"], layout, 128)
    ranks = distinct_rank_passes(model, CLUSTERS["gb200-nvl72"], layout.resolve_mbs(128))
    assert pred.microbatches == 1 and pred.comm_rank != max(ranks, key=lambda r: r[2].total)[0]
    assert pred.step_time_s >= sum(n * p.total for _, n, p in ranks)


def test_a_lighter_rank_waits_out_the_slowest_ranks_span_before_its_traffic_shows():
    """llama3-70b in FP8 on 1,024 GB200, GPipe over 32 ranks: rank 0 holds two of the 80 layers and the
    embedding, the head's rank two and the head. Rank 0's passes are the lightest, and its ZeRO-2 reduce-scatters
    of the embedding's gradients lead the step's traffic: they show once its passes have waited out the head
    rank's span and the others' fill and drain (GPipe's flow shop), not after rank 0's own compute (the step was
    620 ms, under the passes alone)."""
    model, gb200 = replace(MODELS["llama3-70b"], seq=512), CLUSTERS["gb200-nvl72"]
    layout = Layout.parse("dp=8,zero=2,pp=32,schedule=gpipe,cp=4,mbs=16", 1024)
    pred = predict(model, gb200, layout, 1024, "fp8")
    ranks = distinct_rank_passes(model, gb200, layout.resolve_mbs(1024), "fp8")
    slowest = max(p.total for _, _, p in ranks)
    assert pred.comm_rank == 0 and next(p.total for r, _, p in ranks if r == 0) < 0.7 * slowest
    passes = pred.microbatches * slowest + sum(n * p.total for _, n, p in ranks) - slowest
    shown = sum(e["exposed_s"] for e in pred.comm if e["axis"] == "dp")
    assert pred.compute_s == pytest.approx(pred.microbatches * slowest)
    assert pred.step_time_s >= passes + shown
    sim = simulate(model, gb200, layout, 1024, "fp8")
    assert sim.step_time_s == pytest.approx(pred.step_time_s, rel=0.02)


@pytest.mark.parametrize("schedule,vpp", SHAPES)
def test_the_longest_path_is_the_engines_for_uneven_chunks(schedule, vpp):
    """pipeline.makespan, which predict's bubble is, against the engine replaying torch's order with every chunk
    different (F from 0.3 to 3, B and W up to twice and 1.5 times it): exact up to 2 x `steady` micro-batches per
    rank; beyond, where it extends the path at m less a multiple of p by what the last p micro-batches add, exact
    but for the interleaved schedule, whose queues can still be settling there (within 0.5%)."""
    rng = random.Random(f"{schedule}{vpp}")
    n = steady(schedule)
    for pp in (2, 3, 5):
        for _ in range(3):
            chunks = []
            for _ in range(pp * vpp):
                f = rng.uniform(0.3, 3.0)
                chunks.append(Passes(f, f * rng.uniform(0.8, 2.0), f * rng.uniform(0.1, 1.5)))
            for m in (2 * pp, 5 * pp, 2 * n * pp + pp, 3 * n * pp + 2 * pp + 1):
                if not _valid(schedule, pp, m):
                    continue
                run = engine.run(rank_orders(schedule, pp, vpp, m), lambda s: stage_owner(s, pp, vpp == 2 and
                                                                                          schedule != "interleaved"),
                                 lambda r, s, k, mb: (pass_seconds(chunks[s], k), 0.0), lambda a, b: 0.0)
                rel = 1e-12 if m <= 2 * n * pp or schedule != "interleaved" else 5e-3
                assert makespan(schedule, pp, vpp, m, chunks) == pytest.approx(max(p.end for p in run.passes),
                                                                               rel=rel), (pp, m)


def test_dualpipev_charges_what_rank_0_idles_between_its_light_and_heavy_chunks():
    """DeepSeek-V3 on 2,048 H200 under DualPipeV (the planner's pick): rank 0 holds chunk 0 (the embedding and
    two dense layers, 35 ms a micro-batch) and chunk 31 (the head and the MTP module, 126 ms), the others two
    chunks of about 73 ms. It waits ~0.4 s while micro-batch 0's forward crosses the others' 30 chunks, and at the
    end for each of its 15 last input gradients. The closed form charged 0.26 s of bubble (the step 5.74 s, the
    simulator 7.09 s); the longest path through torch's order charges what the engine replays."""
    model, h200 = MODELS["deepseek-v3"], CLUSTERS["h200"]
    layout = Layout.parse("dp=128,zero=1,pp=16,schedule=dualpipev,ep=16,mbs=1", 2048)
    pred, sim = predict(model, h200, layout, 4096), simulate(model, h200, layout, 4096)
    lay = layout.resolve_mbs(4096)
    chunks = [chunk_passes(model, h200, lay, c) for c in range(lay.stages)]
    run = engine.run(rank_orders("dualpipev", 16, 2, 32), lambda s: stage_owner(s, 16, True),
                     lambda r, s, k, mb: (pass_seconds(chunks[s], k), 0.0), lambda a, b: 0.0)
    idle = max(p.end for p in run.passes) - sum(p.compute for p in run.passes if p.rank == 0)
    assert idle > 0.15 * pred.compute_s
    assert pred.bubble_s >= idle and pred.bubble_s > 0.15 * pred.compute_s
    assert sim.step_time_s == pytest.approx(pred.step_time_s, rel=0.1)


# Uneven pipeline ranks: the output head (on the last rank, or on rank 0 under the V schedules) makes one rank
# 8-11% slower than the others (32 layers do not split into 9 chunks); predict charged every rank its
# passes (1.6-6.4% over simulate, 6.2% under ZB-V at m = 2p), then gave rank 0 the others' idle under the V
# schedules (DualPipeV at m = 2p 5.2% over simulate).
UNEVEN = [("tp=8,pp=8,schedule=gpipe", 64, 64), ("tp=8,pp=8,schedule=1f1b", 64, 16),
          ("tp=8,pp=8,vpp=4,schedule=interleaved", 64, 64), ("tp=8,pp=3,vpp=3,schedule=interleaved", 24, 48),
          ("tp=8,pp=8,schedule=zb", 64, 64),
          ("tp=8,pp=8,schedule=zbv", 64, 64), ("tp=8,pp=8,schedule=zbv", 64, 16),  # m = 2p: rank 0's tail
          ("tp=8,pp=8,schedule=dualpipev", 64, 64), ("tp=8,pp=8,schedule=dualpipev", 64, 16)]
HEAVY_HEAD = [("tp=8,pp=8,schedule=zb", 64, 8), ("tp=8,pp=4,schedule=zb", 32, 4),  # llama3-8b: 5.4%, 3.2% before
              ("tp=8,pp=8,schedule=zbv", 64, 16), ("tp=8,pp=2,schedule=zbv", 16, 2),  # 2.4% before head_on_chain
              ("tp=8,pp=8,schedule=dualpipev", 64, 16)]


@pytest.mark.parametrize("layout,devices,batch", UNEVEN)
def test_step_agrees_with_predict_with_uneven_ranks(layout, devices, batch):
    model, cluster = MODELS["llama2-7b"], CLUSTERS["h100-80gb"]
    lay = Layout.parse(layout, devices)
    slowest, others, _ = pipeline_passes(model, cluster, lay.resolve_mbs(batch))
    assert slowest.total > 1.05 * others.total  # the ranks are uneven
    sim, pred = simulate(model, cluster, lay, batch), predict(model, cluster, lay, batch)
    assert sim.step_time_s == pytest.approx(pred.step_time_s, rel=0.02)
    assert sim.bubble_fraction == pytest.approx(pred.bubble_fraction, abs=0.02)


@pytest.mark.parametrize("layout,devices,batch", HEAVY_HEAD)
def test_step_agrees_with_predict_under_a_heavy_head(layout, devices, batch):
    """llama3-8b's 128K-token vocabulary makes the head rank 20-40% slower than the others."""
    model, cluster = MODELS["llama3-8b"], CLUSTERS["h100-80gb"]
    sim, pred = simulate(model, cluster, Layout.parse(layout, devices), batch), predict(model, cluster,
                                                                                         Layout.parse(layout, devices),
                                                                                         batch)
    assert sim.step_time_s == pytest.approx(pred.step_time_s, rel=0.02)
