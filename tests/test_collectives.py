"""cost/collectives.py: NCCL's algorithms and protocols against published nccl-tests curves, and
`meshscale collectives`."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshscale.cli import main
from meshscale.cost import collectives, comm
from meshscale.specs.cluster import load_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import nccl_curves  # noqa: E402

# The misses nccl_curves.py prints and no 15% assertion here holds: 20 NVL72 racks with NVLS off (-35% to +26%), H100
# nodes over InfiniBand below 8 MiB (4 nodes: -34% at 1 MiB, +42% at 2 MiB, a dip below the 1 MiB rate), and the
# 8-node cluster, which tops out at 320 GB/s where the 4-node one reaches 365 (the model 14-25% fast from 128 MiB)
MISSED = {"H100 4 nodes x8 (VMs)", "H100 8 nodes x8", "GB200 NVL72 x20 racks"}
MODELLED = [c for c in nccl_curves.CURVES if c.name not in MISSED]


@pytest.mark.parametrize("curve", MODELLED, ids=lambda c: c.name)
def test_large_messages_within_15_percent_of_nccl_tests(curve):
    """From 256 MiB up every curve we model holds within 15%; the NVLS curves of one NVLink domain, and RCCL's on 8
    MI300X (whose alpha-beta link is read off it), hold from 1 MiB (the issue's target; below 256 MiB the rings are
    fast, on A100 by up to 23% with a process per GPU and 52% with one process driving all 8 (-g 8), on a GB200 tray
    by 22%, and one process driving 8 H100 all-gathers and reduce-scatters pays ~40 us a call the model does not:
    benchmarks/nccl_curves.py prints it)."""
    from_1mib = curve.name in ("HGX H100 x8 (DGX H100 fabric)", "HGX H200 x8 (DGX H100 fabric)", "GB200 NVL72 x72",
                               "MI300X x8 (RCCL)")
    for mib, measured, busbw, err, option in nccl_curves.errors(curve):
        if mib >= 256 or from_1mib:
            assert abs(err) <= 0.15, (curve.name, mib, measured, busbw, option)


def test_b200_nodes_reach_their_nvls_and_ring_rates_on_two_clusters():
    """B200's NVLS all-reduce (840 GB/s, the preset's) on one node, and NVLS-tree between two, whose domains each
    send the whole buffer once through their eight NICs, within 1% of both clusters' nccl-tests; the faster
    fabric's rings and all-gathers within 8% to 64 nodes. (The other fabric's rings lose 15% from 2 to 46 nodes, run
    without its InfiniBand settings: nccl_curves.py prints it and counts it apart.)"""
    by_name = {s.name: nccl_curves.scaling_errors(s) for s in nccl_curves.SCALING}
    for cluster in ("B200 nodes", "B200 DGX Cloud"):
        rows = by_name[f"{cluster}, NCCL's pick with NVLS"][:2]
        assert [option for *_, option in rows] == ["nvls/Simple", "nvls_tree/Simple"]
        assert all(abs(err) <= 0.01 for *_, err, _ in rows), rows
    for name in ("B200 nodes, ring", "B200 nodes, all-gather", "B200 nodes, NCCL's pick with NVLS"):
        assert all(abs(err) <= 0.08 for *_, err, _ in by_name[name]), name


def test_a_tree_between_nodes_runs_on_one_channel_a_nic_at_nccls_per_channel_caps():
    """NCCL's tuner caps a tree at its search's channels x a per-channel rate; between HGX nodes the search gives one
    channel a 400 Gb/s NIC, undoubled (8), and from NCCL 2.28 Blackwell's caps are 70, 42.8, 24 GB/s for 1, 2 and
    more nodes: both B200 clusters' forced trees from 2 to 64 nodes within 3% (the model had them 83-93% fast at
    16 channels of uncapped NIC traffic). Before 2.28 the caps were twice Hopper's, which three GB200 partitions on
    2.27.3 never reach: their trees stay at their NICs' rate."""
    b200 = load_cluster("b200")
    fabrics = [replace(comm.group_link(b200, 8 * k, 8 * k, 1).fabric, nccl=(2, 28)) for k in (2, 4)]
    assert [collectives.search_channels(f) for f in fabrics] == [8, 8]
    assert [collectives.run_channels(f) for f in fabrics] == [16, 16]
    simple = [[o for o in collectives.options("all_reduce", f) if o[:2] == ("tree", "Simple")][0] for f in fabrics]
    assert [round(o[4] / 1e9, 1) for o in simple] == [342.4, 192.0]
    by_name = {s.name: nccl_curves.scaling_errors(s) for s in nccl_curves.SCALING}
    for name in ("B200 nodes, tree", "B200 DGX Cloud, tree"):
        rows = [r for r in by_name[name] if r[0] >= 16]
        assert all(abs(err) <= 0.03 for *_, err, _ in rows), rows
    older = replace(fabrics[1], nccl=(2, 27))
    assert collectives.per_channel(older, "tree") == (77.4, 82.8, 72.0)
    tree = [o for o in collectives.options("all_reduce", older) if o[:2] == ("tree", "Simple")][0]
    assert tree[4] > 1.9 * simple[1][4]
    by_curve = {c.name: nccl_curves.errors(c) for c in nccl_curves.CURVES}
    for name in ("GB200 3 partitions x4, tree", "GB200 3 partitions x8, tree"):
        assert all(abs(err) <= 0.01 for *_, err, _ in by_curve[name])
    ok, points = nccl_curves.within(0.15)  # 177 of 241 before trees ran at these caps
    assert ok / points >= 0.85, (ok, points)


def test_a_fabric_run_without_its_infiniband_settings_is_counted_apart_beyond_one_node():
    """DGX Cloud's B200 rings, NVLS and all-gathers were run without the NCCL InfiniBand settings the same team found
    its other B200 cluster's need (20-25% lost without them): their points between nodes, and only those, are
    counted apart from the target; its one-node points (NVLink alone) are counted and hold within 2%."""
    apart = [s for s in nccl_curves.SCALING if s.untuned]
    assert {s.name for s in apart} == {"B200 DGX Cloud, NCCL's pick with NVLS", "B200 DGX Cloud, ring",
                                       "B200 DGX Cloud, all-gather"}
    ok, points = nccl_curves.within(0.15, untuned=True)
    assert points == sum(1 for s in apart for gpus, _ in s.points if gpus > 8) == 18
    for series in apart:
        gpus, _, _, err, _ = nccl_curves.scaling_errors(series)[0]
        assert gpus == 8 and abs(err) <= 0.02
    counted, total = nccl_curves.within(0.15)
    everything = sum(len(c.points) for c in nccl_curves.CURVES) + sum(len(s.points) for s in nccl_curves.SCALING)
    below_1mib = sum(1 for c in nccl_curves.CURVES for mib, _ in c.points if mib < 1)
    assert total + points == everything - below_1mib


def test_protocol_follows_message_size_as_nccls_tuner():
    """NCCL picks by its tuner's estimate: on A100 LL, LL128 and Simple in turn; on H100 LL, then NVLS from about
    1 MiB (the tuner's constant 23 us), though NVLS's small chunks then make it slower than the tuner thinks."""
    sizes = (4096, 2**22, 2**26, 2**31)
    a100 = comm.group_link(load_cluster("a100-80gb"), 8, 8, 1).fabric
    assert [collectives.best("all_reduce", a100, s)[1][1] for s in sizes] == ["LL", "LL128", "Simple", "Simple"]
    h100 = comm.group_link(load_cluster("h100-80gb"), 8, 8, 1).fabric
    picks = [collectives.best("all_reduce", h100, s)[1][:2] for s in sizes]
    assert picks == [("ring", "LL")] + [("nvls", "Simple")] * 3
    tuner = [o for o in collectives.options("all_reduce", h100) if o[0] == "nvls"][0]
    assert collectives.best("all_reduce", h100, 2**22)[0] > tuner[2] + 2 * 7 / 8 * 2**22 / tuner[3]


def test_nvls_chunks_follow_nccls_rules():
    """computeCollChunkInfo: 16 KiB chunks under 2 chunks a channel-head pair, 32 under 8, 64 under 64, else 128;
    smaller chunks run at a lower bandwidth."""
    ops = 16 * 8
    assert [collectives.nvls_chunk(s, ops) for s in (2**20, 2**23, 2**26, 2**30)] == [16384, 32768, 65536, 131072]
    h100 = comm.group_link(load_cluster("h100-80gb"), 8, 8, 1).fabric
    rate = [2**k / collectives.nvls_seconds(h100, 2**k) for k in (22, 25, 28, 33)]
    assert rate == sorted(rate)


def test_nvls_tree_fills_its_pipeline_before_the_rate_holds():
    """NVLS-tree between domains: NCCL 2.26's chunks (128 KiB, 64 from 4 domains, smaller for small messages), and
    a fill over the domain's NVLS stages and the tree's network levels that the tuner's 79 us does not see; with
    it the 4-node H100 curve holds within 10% from 32 MiB, where the tuner's latency alone read it 31% fast."""
    h100 = load_cluster("h100-80gb")
    two, four = (comm.group_link(h100, 8 * k, 8 * k, 1).fabric for k in (2, 4))
    assert [collectives.nvls_tree_chunk(s, two) for s in (2**22, 2**24, 2**26)] == [32768, 65536, 131072]
    assert [collectives.nvls_tree_chunk(s, four) for s in (2**22, 2**26)] == [32768, 65536]
    t, option = collectives.best("all_reduce", four, 2**28)
    assert option[0] == "nvls_tree" and option[2] == pytest.approx(79e-6)
    assert t - option[2] - 2 * 31 / 32 * 2**28 / option[4] > 100e-6
    curve = next(c for c in nccl_curves.CURVES if c.name == "H100 4 nodes x8 (VMs)")
    assert all(abs(err) <= 0.10 for mib, *_, err, _ in nccl_curves.errors(curve) if mib >= 32)
    # its rate: the NVLS graph's 8 channels (a GPU each) x NCCL's per-channel NVLS-tree rate, 45.5 GB/s
    four = comm.group_link(load_cluster("h100-80gb"), 32, 32, 1).fabric
    assert [o[4] for o in collectives.options("all_reduce", four) if o[0] == "nvls_tree"] == [8 * 45.5e9]
    assert all(abs(err) <= 0.02 for mib, *_, err, _ in nccl_curves.errors(curve) if mib >= 2048)


def test_a_tree_fills_its_pipeline_up_and_down_before_the_rate_holds():
    """NCCL's tree runs its reduce and broadcast at once (runTreeSplit), so a chunk goes up the domain's chain and
    the tree and down again before the rate holds: on 20 NVL72 racks (NVLS off) 2 x (71 + 4) hops of 576,000 B,
    ~9 ms beside the tuner's 0.26 ms. With it that curve is within 36% where it was 1.4-3.4x fast; 8 H100 nodes at
    1-2 MiB (LL128's 18,000 B chunks on NCCL's 16 channels) within 15% and at 4 MiB 23%, where they were up to 76%
    fast."""
    h100 = load_cluster("h100-80gb")
    four, many = (comm.group_link(h100, 8 * k, 8 * k, 1).fabric for k in (4, 64))
    sizes = (2**20, 2**24, 2**26, 2**28, 2**30)
    assert [collectives.tree_chunk(s, four, "LL128") for s in sizes] == [18000, 72000, 72000, 288000, 576000]
    assert [collectives.tree_chunk(s, many, "LL128") for s in sizes] == [18000, 36000, 72000, 144000, 576000]
    assert collectives.tree_chunk(2**20, many, "Simple") == 524288
    racks = comm.group_link(load_cluster("gb200-nvl72"), 1440, 1440, 1).fabric
    t, option = collectives.best("all_reduce", racks, 2**29, ("ring", "tree"))
    assert option[:2] == ("tree", "LL128") and option[2] < 0.3e-3
    assert t - collectives._tuner_seconds("all_reduce", racks, 2**29, option, option[4]) > 8e-3
    by_name = {c.name: nccl_curves.errors(c) for c in nccl_curves.CURVES}
    assert all(abs(err) <= 0.36 for *_, err, _ in by_name["GB200 NVL72 x20 racks"])
    eight = {mib: err for mib, *_, err, _ in by_name["H100 8 nodes x8"] if mib <= 4}
    assert abs(eight[1]) <= 0.15 and abs(eight[2]) <= 0.15 and abs(eight[4]) <= 0.23, eight


def test_network_hops_cost_more_than_nvlink_hops():
    """A ring leaving the NVLink domain pays network latency on its inter-domain steps only."""
    h100 = load_cluster("h100-80gb")
    inside = comm.group_link(h100, 64, 8, 1).fabric
    across = comm.group_link(h100, 64, 8, 8).fabric  # one rank per node
    t_in = collectives.seconds("all_gather", inside, 8 * 1024, 1)
    t_out = collectives.seconds("all_gather", across, 8 * 1024, 1)
    assert (inside.ppn, inside.nodes, across.ppn, across.nodes) == (8, 1, 1, 8)
    assert t_out > 2 * t_in


def test_a_ring_of_sends_across_nodes_steps_at_one_nics_rate():
    """Context parallelism's K,V ring over two H100 nodes, two ranks in each (tp=4, cp=4): the pairs that cross
    the nodes send through one NIC each (~48 GB/s), so a 1 GB step takes ~21 ms, not the 96 GB/s the group's
    two NICs a node give a ring collective; inside one node the sends keep NVLink's rate."""
    h100 = load_cluster("h100-80gb")
    across = comm.group_link(h100, 16, 4, 4).fabric
    inside = comm.group_link(h100, 8, 2, 4).fabric
    assert (across.ppn, across.nodes, round(across.busbw)) == (2, 2, 96)
    assert collectives.seconds("send_recv", across, 1e9, 0) == pytest.approx(1 / across.net_busbw, rel=1e-9)
    assert collectives.seconds("send_recv", inside, 1e9, 0) == pytest.approx(1 / inside.busbw, rel=1e-9)
    assert inside.busbw > 5 * across.net_busbw


def test_a_tree_between_few_domains_sends_less_through_the_network_than_a_ring():
    """NCCL's double binary tree: the busiest domain sends its whole buffer on 2 domains, 1.5x on 3, 2x from 4 on,
    whatever the ranks inside, where a ring's ranks each send 2(n-1)/n of it. NCCL's tuner still costs a tree
    at 0.92 of the ring's rate, so at 16 GiB it keeps the ring (NVIDIA/nccl#1801) though the tree runs faster."""
    h100 = load_cluster("h100-80gb")
    nodes = [comm.group_link(h100, 8 * k, 8 * k, 1).fabric for k in (2, 3, 4, 64)]
    net = [collectives.tree_net_busbw(f) for f in nodes]
    ring = [f.ppn * f.net_busbw for f in nodes]  # a ring's bus bandwidth where its domains' NICs bind
    assert [round(t / r, 2) for t, r in zip(net, ring)] == [1.88, 1.28, 0.97, 1.0]
    gb200 = load_cluster("gb200-nvl72")
    partitions = replace(gb200, tiers=(replace(gb200.tiers[0], size=4), gb200.tiers[1]))
    three = replace(comm.group_link(partitions, 12, 12, 1).fabric, nccl=(2, 27))  # the thread's NCCL 2.27.3
    t_ring, pick = collectives.best("all_reduce", three, 2**34, ("ring", "tree"))  # NVLS off
    tree = [o for o in collectives.options("all_reduce", three) if o[:2] == ("tree", "Simple")][0]
    assert pick[:2] == ("ring", "Simple") and tree[3] < three.busbw * 1e9 < tree[4]
    assert collectives.option_seconds("all_reduce", three, 2**34, tree) < 0.85 * t_ring


def test_many_small_calls_cost_more_than_one_large_call():
    fabric = comm.group_link(load_cluster("a100-80gb"), 512, 512, 1).fabric
    one = collectives.seconds("reduce_scatter", fabric, 2**30, 1)
    many = collectives.seconds("reduce_scatter", fabric, 2**30, 1024)
    floor = collectives.seconds("reduce_scatter", fabric, 2**30, 0)
    assert floor < one < many


def test_tpu_keeps_the_torus_alpha_beta_model():
    link = comm.group_link(load_cluster("tpu-v5p"), 4096, 16, 1)
    assert link.fabric is None


def test_collectives_command_json(capsys):
    assert main(["collectives", "--cluster", "h100-80gb", "--devices", "8", "--sizes", "1M,64M,1G",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema_version"] == 1 and out["devices"] == 8
    rows = out["rows"]
    assert [r["bytes"] for r in rows] == [2**20, 2**26, 2**30]
    assert {r["collective"] for r in rows} == {"all_reduce"}
    assert rows[0]["busbw_GBps"] < rows[1]["busbw_GBps"] < rows[2]["busbw_GBps"]
    t = rows[2]["seconds"]
    assert rows[2]["busbw_GBps"] == pytest.approx(2 * 7 / 8 * 2**30 / t / 1e9)
    assert [r["algorithm"] for r in rows] == ["nvls/Simple"] * 3


def test_an_all_to_all_or_a_ring_s_sends_between_nodes_leave_through_one_rank_s_nic():
    """Off NCCL (RCCL on MI300X: the alpha-beta model) a group across nodes is a ring only for the ring
    collectives, which cross a node's boundary at its 8 NICs' rate. Of each rank's all-to-all buffer, 56/64 leaves
    its node of 8 through its own NIC; a ring's sends (context parallelism's K,V over 2 nodes) step together, each
    step waiting on the pair that crosses through one NIC. Both as NCCL's p2p does on H100 nodes."""
    gib, mi300x, h100 = 2**30, load_cluster("mi300x"), load_cluster("h100-80gb")
    nic, link = mi300x.tiers[-1], comm.group_link(mi300x, 64, 64, 1)
    seconds = comm.collective_time("all_to_all", gib, 0, 64, link)
    assert seconds == pytest.approx(56 / 64 * gib / (nic.bandwidth * nic.efficiency))
    assert seconds > 5 * comm.collective_time("all_gather", gib, 0, 64, link)
    nccl = comm.collective_time("all_to_all", gib, 0, 64, comm.group_link(h100, 64, 64, 1))
    assert nccl == pytest.approx(56 / 64 * gib / (h100.tiers[-1].bandwidth * h100.tiers[-1].efficiency), rel=0.1)
    ring = comm.collective_time("send_recv", gib, 0, 16, comm.group_link(mi300x, 16, 16, 1))
    assert ring == pytest.approx(gib / (nic.bandwidth * nic.efficiency))
    nccl_ring = comm.collective_time("send_recv", gib, 0, 16, comm.group_link(h100, 16, 16, 1))
    assert nccl_ring == pytest.approx(gib / (h100.tiers[-1].bandwidth * h100.tiers[-1].efficiency), rel=0.1)
    inside = comm.collective_time("send_recv", gib, 0, 8, comm.group_link(mi300x, 8, 8, 1))
    assert inside < ring / 4  # one node: xGMI


def test_collectives_command_names_what_runs(capsys):
    """Each size names NCCL's pick (to set beside NCCL_DEBUG=INFO or force with NCCL_ALGO): across 4 H100 nodes
    the tree with LL128 for 1 MiB, NVLS-tree for 1 GiB; where the link is not NCCL's, the alpha-beta model."""
    assert main(["collectives", "--cluster", "h100-80gb", "--devices", "32", "--sizes", "1M,1G"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith("algorithm") and lines[2].endswith("tree/LL128")
    assert lines[3].endswith("nvls_tree/Simple")
    assert main(["collectives", "--cluster", "tpu-v5e", "--devices", "256", "--sizes", "1M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"][0]["algorithm"] == "alpha-beta" and out["nccl"] is None  # no NCCL release on a TPU
    assert main(["collectives", "--cluster", "mi300x", "--devices", "16", "--sizes", "1M"]) == 0
    assert "of mi300x, alpha-beta model (predicted" in capsys.readouterr().out
    assert main(["collectives", "--cluster", "h100-80gb", "--devices", "12", "--sizes", "1M", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["algorithm"] == "alpha-beta"  # as comm costs it


@pytest.mark.parametrize("argv, words", [
    (["--sizes", "0M"], "--sizes"), (["--sizes", "12Q"], "--sizes"), (["--collective", "broadcast"], "--collective"),
    (["--devices", "1"], "--devices")])
def test_collectives_command_bad_input_is_one_line_exit_2(argv, words, capsys):
    base = ["collectives", "--cluster", "h100-80gb", "--devices", "8"]
    with pytest.raises(SystemExit) as e:
        main(base + argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


# An nccl-tests run as its binaries print it (rank lines, the test's name, out-of-place then in-place columns);
# the figures are Azure's 8-H100 all-reduce (benchmarks/nccl_curves.py), the other columns made to agree.
NCCL_LOG = """\
# nccl-tests version 2.13.8 nccl-headers=21805 nccl-library=21805
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 4 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1
#
# Using devices
""" + "".join(f"#  Rank {r:2d} Group  0 Pid  {1100 + r} on node-1 device {r:2d} [0x{r}a] NVIDIA H100 80GB HBM3\n"
              for r in range(8)) + """\
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           4             1     float     sum      -1    12.10    0.00    0.00      0    12.05    0.00    0.00      0
     1048576        262144     float     sum      -1    41.99   24.97   43.70    N/A    41.70   25.15   44.01    N/A
    67108864      16777216     float     sum      -1    324.6  206.74  361.78      0    323.9  207.19  362.58      0
  8589934592    2147483648     float     sum      -1    31393  273.63  478.87      0    31380  273.74  479.04      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 294.79
"""


def test_collectives_command_beside_a_measured_run(tmp_path, capsys):
    """--measured: the log's sizes, its ranks as --devices, its out-of-place bus bandwidth beside the model's and
    the error (predicted / measured - 1); a line of zeros (a 4-byte size) is not a point."""
    log = tmp_path / "nccl.log"
    log.write_text(NCCL_LOG)
    assert main(["collectives", "--cluster", "h100-80gb", "--measured", str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["devices"] == 8 and out["collective"] == "all_reduce"
    rows = out["rows"]
    assert [(r["bytes"], r["measured_busbw_GBps"]) for r in rows] == [(2**20, 43.70), (2**26, 361.78),
                                                                       (2**33, 478.87)]
    alone = main(["collectives", "--cluster", "h100-80gb", "--devices", "8", "--sizes", "1M,64M,8G", "--json"])
    model = json.loads(capsys.readouterr().out)["rows"]
    assert alone == 0 and [r["busbw_GBps"] for r in rows] == [r["busbw_GBps"] for r in model]
    for r in rows:
        assert r["error"] == pytest.approx(r["busbw_GBps"] / r["measured_busbw_GBps"] - 1)
    assert main(["collectives", "--cluster", "h100-80gb", "--measured", str(log)]) == 0
    text = capsys.readouterr().out
    worst = max(rows, key=lambda r: abs(r["error"]))
    assert f"worst {worst['error']:+.1%} at {worst['bytes']:,} B" in text and "measured" in text


def test_collectives_command_says_when_one_process_drove_every_gpu(tmp_path, capsys):
    """A log whose header reads nGpus 8 (or nThread x nGpus > 1) came from one process launching every GPU's
    kernel in turn, which training does not pay: the printout says so, the JSON carries the count."""
    log = tmp_path / "nccl.log"
    log.write_text(NCCL_LOG)
    assert main(["collectives", "--cluster", "h100-80gb", "--measured", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measured_gpus_per_process"] == 1
    assert main(["collectives", "--cluster", "h100-80gb", "--measured", str(log)]) == 0
    assert "one process drove" not in capsys.readouterr().out
    log.write_text(NCCL_LOG.replace("nThread 1 nGpus 1", "nThread 2 nGpus 4"))
    assert main(["collectives", "--cluster", "h100-80gb", "--measured", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measured_gpus_per_process"] == 8
    assert main(["collectives", "--cluster", "h100-80gb", "--measured", str(log)]) == 0
    assert "# one process drove 8 GPUs" in capsys.readouterr().out


def test_collectives_command_models_the_nccl_release_the_log_ran(tmp_path, capsys):
    """The header's nccl-library code (major x 10000 + minor x 100 + patch) names the release: the model takes it.
    A 4 MiB all-reduce over 4 B200 nodes: before 2.28 NCCL's tuner takes the tree (LL128 at twice Hopper's caps),
    from 2.28 its lower Blackwell caps leave NVLS-tree, about half as fast; the JSON says which release it was."""
    rows = "".join(f"#  Rank {r:2d} Group  0 Pid  {r} on node-{r // 8} device {r % 8:2d} [0x{r}a] NVIDIA B200\n"
                   for r in range(32))
    line = "4194304 1048576 float sum -1 110.0 38.13 73.87 0 110.0 38.13 73.87 0\n"
    log = tmp_path / "tree.log"
    gbps = {}
    for code, release in (("22809", "2.28"), ("22703", "2.27")):
        log.write_text(NCCL_LOG.split("#  Rank")[0].replace("21805", code) + rows + line)
        assert main(["collectives", "--cluster", "b200", "--measured", str(log), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["measured_nccl"] == out["nccl"] == release and out["devices"] == 32
        gbps[release] = out["rows"][0]["busbw_GBps"]
    assert gbps["2.27"] > 1.5 * gbps["2.28"]
    assert main(["collectives", "--cluster", "b200", "--measured", str(log)]) == 0
    assert "of b200, NCCL 2.27 (predicted" in capsys.readouterr().out


def test_collectives_command_reads_an_older_nccl_tests_log(tmp_path, capsys):
    """Releases before the root column and the test's name (NVIDIA/nccl-tests#100, 2021): 12 columns, and the
    collective must be said; an alltoall_perf run's name maps to all_to_all."""
    old = "\n".join(line.replace("     -1 ", " ") for line in NCCL_LOG.splitlines()
                    if "Collective test starting" not in line)
    log = tmp_path / "old.log"
    log.write_text(old)
    with pytest.raises(SystemExit) as e:
        main(["collectives", "--cluster", "h100-80gb", "--measured", str(log)])
    assert e.value.code == 2 and "--collective" in capsys.readouterr().err
    assert main(["collectives", "--cluster", "h100-80gb", "--measured", str(log), "--collective", "all_reduce",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["measured_busbw_GBps"] for r in rows] == [43.70, 361.78, 478.87]
    log.write_text(NCCL_LOG.replace("all_reduce_perf", "alltoall_perf"))
    assert main(["collectives", "--cluster", "h100-80gb", "--measured", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["collective"] == "all_to_all"


@pytest.mark.parametrize("log, argv, words", [
    (NCCL_LOG, ["--devices", "16"], "names 8 ranks"),
    (NCCL_LOG, ["--collective", "all_gather"], "ran all_reduce"),
    (NCCL_LOG, ["--sizes", "1M"], "--sizes"),
    (NCCL_LOG.replace("all_reduce_perf", "broadcast_perf"), [], "broadcast_perf"),
    (NCCL_LOG + NCCL_LOG, [], "2 nccl-tests runs"),
    (NCCL_LOG.replace("Rank  1 ", "Rank  0 "), [], "MPI=1"),
    ("# nThread 1 nGpus 8\nsegmentation fault\n", ["--collective", "all_reduce"], "no nccl-tests result lines"),
    (None, [], "--measured")])
def test_collectives_command_bad_measured_log_is_one_line_exit_2(tmp_path, capsys, log, argv, words):
    path = tmp_path / "run.log"
    if log is not None:
        path.write_text(log)
    with pytest.raises(SystemExit) as e:
        main(["collectives", "--cluster", "h100-80gb", "--measured", str(path)] + argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
