"""Published nccl-tests (and rccl-tests) bus-bandwidth curves against cost/collectives.py (all_reduce_perf unless
a curve names another collective; in-place or out-of-place busbw as published, float sum), and series of one
message size across node counts (SCALING). Each names its source, NCCL version and system.
Run: PYTHONPATH=src python benchmarks/nccl_curves.py [--plot docs/collectives.png]
"""

import re
import sys
from dataclasses import dataclass, replace

from meshscale.cost import collectives, comm
from meshscale.specs.cluster import load_cluster

M = 2**20


@dataclass(frozen=True)
class Curve:
    name: str
    source: str
    cluster: str  # preset whose fabric the system has
    devices: int
    points: tuple  # (MiB, busbw GB/s)
    algorithms: tuple = ()  # NCCL_ALGO forced by the run ((): NCCL's choice)
    collective: str = "all_reduce"
    domain: int = 0  # GPUs an NVLink partition holds, where the run used smaller ones than the preset's
    gpus_per_process: int = 1  # -g N: one process launched every GPU's kernel in turn (training runs one a GPU)


CURVES = (
    # Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md "NCCL Bandwidth": 8 A100-SXM4-80GB on
    # NVSwitch (the DGX A100 fabric), NCCL 2.18.5, AMD EPYC host; its script (Benchmarks/NCCLBandwidth.py at
    # 8fd0c6e, as for the H100 and H200 curves below) runs all_reduce_perf -g 8, one process for the 8 GPUs
    Curve("HGX A100 x8", "Azure ND A100 v4 results (NCCL 2.18.5)", "a100-80gb", 8,
          ((1, 36.22), (2, 53.54), (4, 71.43), (8, 89.99), (16, 109.22), (32, 132.77), (64, 166.63),
           (128, 174.18), (256, 213.87), (512, 221.58), (1024, 228.10), (2048, 230.22), (4096, 230.48),
           (8192, 231.58)), gpus_per_process=8),
    # The same part, a process per GPU as training runs (a public note's nccl-tests logs, host "thanos", 8
    # A100-SXM4-80GB, NCCL from the nvidia-nccl-cu12 wheel; public-code index document 33201577724): all_reduce_perf
    # under mpirun -np 8, out-of-place busbw. The note's -g 8 run on the same server read 7-28% lower from 1 to 512
    # MiB (8 MiB 90.3, 32 MiB 133.7, 128 MiB 180.0 GB/s) and the same from 1 GiB; Azure's -g 8 curve above lies
    # within 5% of that run from 4 to 128 MiB, as does a third (NCCL 2.19.3, -g 8, to 128 MiB: 90.8, 136.1, 181.3)
    Curve("HGX A100 x8, a process per GPU", "a public nccl-tests log (mpirun -np 8)", "a100-80gb", 8,
          ((1, 48.43), (2, 66.26), (4, 89.89), (8, 112.37), (16, 137.68), (32, 155.53), (64, 190.73),
           (128, 198.78), (256, 211.78), (512, 221.13), (1024, 227.91), (2048, 230.72), (4096, 232.81))),
    # Azure ND_H100_v5_results.md: 8 H100 SXM on NVLink4 NVSwitch (the DGX H100 fabric), NVLS, in-place, NCCL 2.18.5,
    # Intel Xeon 8480C host (its table's "33M" .. "536M" are 2^25 .. 2^29 bytes). NVLS at every size, NCCL's pick
    # from 1 MiB; its chunk cost (cost/collectives.py NVLS_CHUNK_OVERHEAD_S, the 3(n-1) fill) is read off this curve
    Curve("HGX H100 x8 (DGX H100 fabric)", "Azure ND H100 v5 results (NCCL 2.18.5)", "h100-80gb", 8,
          ((1, 43.70), (2, 81.93), (4, 128.73), (8, 172.13), (16, 234.45), (32, 295.53), (64, 361.78),
           (128, 400.61), (256, 423.38), (512, 438.46), (1024, 466.35), (2048, 472.36), (4096, 475.54),
           (8192, 478.87)), gpus_per_process=8),
    # NVIDIA/nccl#1047 (2023-10-31): reduce_scatter_perf on one H100 server, 8 GPUs, NCCL_ALGO=Ring,
    # out-of-place busbw (size: the whole input, each rank keeping an eighth)
    Curve("H100 x8 reduce-scatter, ring", "NVIDIA/nccl#1047", "h100-80gb", 8,
          ((128, 311.34), (256, 330.94), (512, 340.94), (1024, 349.36), (2048, 354.81), (4096, 357.76),
           (8192, 362.16)), ("ring",), "reduce_scatter"),
    # Azure ND_H200_v5_results.md: 8 H200 on NVLink4 NVSwitch (the DGX H100 fabric), NVLS, NCCL 2.20.5
    Curve("HGX H200 x8 (DGX H100 fabric)", "Azure ND H200 v5 results (NCCL 2.20.5)", "h200", 8,
          ((1, 52.96), (2, 88.78), (4, 138.44), (8, 181.94), (16, 240.41), (32, 300.91), (64, 368.11),
           (128, 412.45), (256, 432.24), (512, 442.72), (1024, 467.58), (2048, 472.57), (4096, 477.41),
           (8192, 479.98)), gpus_per_process=8),
    # Azure ND_GB200_v6_results.md: one GB200 tray, 4 GPUs on NVLink5, NCCL_ALGO=Ring, NCCL 2.25.1; its script
    # (Benchmarks/NVIDIA/NCCLBandwidth.py at 545c5c6) runs all_reduce_perf -g 4, one process for the 4 GPUs
    Curve("GB200 tray x4, ring", "Azure ND GB200 v6 results (NCCL 2.25.1)", "gb200-nvl72", 4,
          ((1, 80.48), (2, 110.43), (4, 146.27), (8, 253.46), (16, 331.09), (32, 422.62), (64, 550.73),
           (128, 574.19), (256, 593.53), (512, 618.74), (1024, 646.87), (2048, 666.63), (4096, 673.06),
           (8192, 679.61)), ("ring",), gpus_per_process=4),
    # coreweave/nccl-tests PR #43 (2025-02-20): one full NVL72 rack, 72 GPUs, out-of-place busbw
    Curve("GB200 NVL72 x72", "coreweave/nccl-tests#43", "gb200-nvl72", 72,
          ((512, 586.06), (1024, 681.17), (2048, 757.78), (4096, 839.16), (8192, 834.57))),
    # coreweave/nccl-tests PR #92 (2026-05-26): 2 nodes of 8 H100, NDR 400 Gb/s per GPU, 8 GiB all-reduce
    Curve("H100 2 nodes x8", "coreweave/nccl-tests#92", "h100-80gb", 16, ((8192, 440.58),)),
    # coreweave/nccl-tests README "Expected Performance" (commit bee97e7, NCCL 2.26.2): 2 NVL72 racks, 144 GPUs,
    # out-of-place busbw; first posted in PR #43 (2025-02-20), whose slurm script set NCCL_NVLS_ENABLE=1
    Curve("GB200 NVL72 x2 racks", "coreweave/nccl-tests README (NCCL 2.26.2)", "gb200-nvl72", 144,
          ((512, 493.94), (1024, 596.10), (2048, 680.30), (4096, 743.09), (8192, 793.06), (16384, 810.41))),
    # coreweave/nccl-tests PR #48 (2025-04-21; to 16 GiB in the README above): 20 NVL72 racks, 1,440 GPUs,
    # out-of-place busbw, NCCL 2.26.2 with NVLS switched off (its slurm script: NCCL_NVLS_ENABLE=0, set a week
    # before "per NV ask", commit a736384; NCCL_COLLNET_ENABLE=0), so NCCL chose between ring and tree
    Curve("GB200 NVL72 x20 racks", "coreweave/nccl-tests#48 (NCCL 2.26.2, NVLS off)", "gb200-nvl72", 1440,
          ((512, 150.95), (1024, 218.85), (2048, 286.52), (4096, 346.38), (8192, 381.48), (16384, 405.74)),
          ("ring", "tree")),
    # NVIDIA/nccl#1801 (2025-08-06): GB200 NVL72 partitions of 4 and 8 GPUs on 3 racks (InfiniBand between them),
    # NCCL 2.27.3 with NVLS off, all_reduce at 16 GiB, out-of-place busbw: ring (NCCL's pick) against tree (forced)
    Curve("GB200 3 partitions x4, ring", "NVIDIA/nccl#1801 (NCCL 2.27.3, NVLS off)", "gb200-nvl72", 12,
          ((16384, 196.72),), ("ring",), domain=4),
    Curve("GB200 3 partitions x4, tree", "NVIDIA/nccl#1801 (NCCL 2.27.3, NVLS off)", "gb200-nvl72", 12,
          ((16384, 234.43),), ("tree",), domain=4),
    Curve("GB200 3 partitions x8, ring", "NVIDIA/nccl#1801 (NCCL 2.27.3, NVLS off)", "gb200-nvl72", 24,
          ((16384, 393.66),), ("ring",), domain=8),
    Curve("GB200 3 partitions x8, tree", "NVIDIA/nccl#1801 (NCCL 2.27.3, NVLS off)", "gb200-nvl72", 24,
          ((16384, 485.68),), ("tree",), domain=8),
    # NVIDIA/nccl-tests#309 (2025-05): 4 Dell XE9680 of 8 H100, eight ConnectX-7 400 Gb/s InfiniBand NICs each, run in
    # VMware VMs with their own topology file; NCCL 2.26.2, one MPI process per GPU, NCCL's own choice of algorithm,
    # out-of-place busbw. NCCL's maintainers called its 366 GB/s "a good number" for 8 x 400G
    Curve("H100 4 nodes x8 (VMs)", "NVIDIA/nccl-tests#309 (NCCL 2.26.2)", "h100-80gb", 32,
          ((1, 24.73), (2, 21.24), (4, 53.77), (8, 74.78), (16, 125.23), (32, 172.92), (64, 224.53), (128, 262.48),
           (256, 294.16), (512, 334.58), (1024, 358.14), (2048, 361.56), (4096, 363.54), (8192, 364.93))),
    # The same thread, another cluster ("IB 400G", NICs per node not given): 8 nodes of 8 H100, no NCCL variable set
    # (its 8 MiB row, 12.98 out-of-place against 51.38 in-place, is kept as posted)
    Curve("H100 8 nodes x8", "NVIDIA/nccl-tests#309", "h100-80gb", 64,
          ((1, 17.64), (2, 28.78), (4, 40.52), (8, 12.98), (16, 87.36), (32, 129.63), (64, 184.00), (128, 227.97),
           (256, 270.31), (512, 300.51), (1024, 286.81), (2048, 319.03), (4096, 319.83), (8192, 320.70))),
    # togethercomputer/together-nccl-tests benchmarks/H100/results/20260305_220043 (0492bed): one H100 server, NCCL
    # 2.26.2, NVLS on and NCCL_ALGO unset, out-of-place busbw. One process drives all 8 GPUs (-g 8), launching each
    # GPU's kernel in turn: every call takes ~40 us or more (flat from 1 to 8 MiB), which a process per GPU does not pay
    # The same run's all_reduce_perf with NCCL_ALGO=Ring (all_reduce_ring.out): the launch floor holds to 256 KiB
    Curve("H100 x8 all-reduce, ring", "together-nccl-tests H100 (NCCL 2.26.2)", "h100-80gb", 8,
          ((1, 39.44), (2, 87.26), (4, 138.26), (8, 182.39), (16, 231.88), (32, 274.45), (64, 318.55), (128, 334.33),
           (256, 347.64), (512, 355.65), (1024, 360.07), (2048, 363.84), (4096, 366.72), (8192, 368.09)), ("ring",),
          gpus_per_process=8),
    Curve("H100 x8 all-gather", "together-nccl-tests H100 (NCCL 2.26.2)", "h100-80gb", 8,
          ((1, 21.84), (2, 36.78), (4, 85.37), (8, 154.20), (16, 211.42), (32, 232.99), (64, 279.91), (128, 298.93),
           (256, 317.84), (512, 333.92), (1024, 344.82), (2048, 350.11), (4096, 354.22), (8192, 358.21)),
          collective="all_gather", gpus_per_process=8),
    Curve("H100 x8 reduce-scatter", "together-nccl-tests H100 (NCCL 2.26.2)", "h100-80gb", 8,
          ((1, 21.01), (2, 43.15), (4, 81.65), (8, 146.72), (16, 201.77), (32, 245.77), (64, 285.72), (128, 307.19),
           (256, 326.05), (512, 336.75), (1024, 345.27), (2048, 353.40), (4096, 356.79), (8192, 362.55)),
          collective="reduce_scatter", gpus_per_process=8),
    # Azure's AI-benchmarking-guide, its AMD port (Azure_Results/ND_MI300X_v5_results.md, 2025-02): 8 MI300X on
    # Infinity Fabric, RCCL 2.22.3, in-place busbw (its "33M" .. "536M" are 2^25 .. 2^29 bytes). RCCL has no
    # tuner model here: the preset's alpha-beta link (72 us, 316.8 GB/s) is read off this curve, so it is held
    # to its own shape, not to a second system
    Curve("MI300X x8 (RCCL)", "Azure ND MI300X v5 results (RCCL 2.22.3)", "mi300x", 8,
          ((1, 22.41), (2, 43.41), (4, 82.53), (8, 131.57), (16, 171.46), (32, 230.35), (64, 266.34),
           (128, 290.81), (256, 302.80), (512, 308.89), (1024, 313.92), (2048, 315.06), (4096, 314.85),
           (8192, 316.82))),
)


@dataclass(frozen=True)
class Scaling:
    """One message size's bus bandwidth as the nodes grow: (GPUs, busbw GB/s) at `mib` MiB."""
    name: str
    source: str
    cluster: str
    mib: int
    points: tuple
    algorithms: tuple = ()
    collective: str = "all_reduce"
    gpus_per_process: int = 1
    untuned: bool = False  # run without the NIC settings its own team found its fabric needs: beyond one node,
    # its points are counted apart

    def at(self, gpus: int, busbw: float) -> Curve:
        return Curve(self.name, self.source, self.cluster, gpus, ((self.mib, busbw),), self.algorithms,
                     self.collective, gpus_per_process=self.gpus_per_process)


# Two B200 clusters of 8-GPU nodes, eight 400 Gb/s InfiniBand NICs a node in use, SHARP (CollNet) aside
# (togethercomputer/together-nccl-tests baselines/, 2026; busbw at the largest size each swept):
# - flapping-airplanes (2026-05-11_nccl_collective_scaling_report.md, 62 nodes; 64 from the 2026-05-12 report):
#   NCCL 2.28.9, one process for 8 GPUs (-g 8), 32 GiB. "NVLS" is NVLS on one node and NVLS-tree across them.
# - use3a-ss, DGX Cloud (2026-05-02_nccl_collective_scaling_report.md, its re-run table): NCCL 2.29.7, a process
#   per GPU, 16 GiB. Its rings lose 15% from 2 to 46 nodes where the other cluster's hold 388-390 GB/s to 32.
#   Its script (benchmarks/B200/collective-scaling/submit_all.sh) sets none of NCCL's InfiniBand settings
#   (NCCL_IB_QPS_PER_CONNECTION=2, NCCL_IB_AR_THRESHOLD=0, ...) that the same team's later report on the other
#   cluster (2026-07-11_nccl_collective_scaling_report.md, "Finding 2") found its rings and NVLS need: without them,
#   4 nodes ran 307 and 302 GB/s against 384 and 351 with them, where SHARP, which bypasses them, did not move;
#   use3a-ss's rings read 305-335 and its SHARP 544-548. Its ring, NVLS and all-gather series are printed but
#   counted apart beyond one node (`untuned`): the model is of a tuned fabric. Its forced tree, capped far below
#   the NICs by NCCL's per-channel rates, is counted.
# Both measure NCCL's tree (NCCL_ALGO=Tree) at 556, 335-339, then 191-196 GB/s from 4 nodes: about half of what
# a double binary tree through every NIC reaches (cost/collectives.py tree_net_busbw), and NCCL's tuner's cap on
# these releases: its search's 8 channels, one a NIC, x 2.28's Blackwell tree rates 70, 42.8, 24 GB/s
# (collectives.search_channels). The three GB200 partitions of CURVES ran 2.27.3, whose rates were 2.8x higher
# from 4 nodes, and reach their NICs' rate. Each curve is costed at the NCCL release its source names.
SCALING = (
    Scaling("B200 nodes, NCCL's pick with NVLS", "together-nccl-tests flapping-airplanes (NCCL 2.28.9)", "b200",
            32768, ((8, 844.89), (16, 723.44), (32, 389.13), (64, 390.08), (128, 390.74), (256, 389.46),
                    (496, 362.46), (512, 389.72)), ("nvls", "nvls_tree"), gpus_per_process=8),
    Scaling("B200 nodes, ring", "together-nccl-tests flapping-airplanes (NCCL 2.28.9)", "b200", 32768,
            ((8, 686.12), (16, 388.20), (32, 388.94), (64, 390.34), (128, 389.54), (256, 389.01), (496, 356.17),
             (512, 389.81)), ("ring",), gpus_per_process=8),
    Scaling("B200 nodes, tree", "together-nccl-tests flapping-airplanes (NCCL 2.28.9)", "b200", 32768,
            ((8, 556.54), (16, 338.77), (32, 191.70), (64, 194.18), (128, 195.54), (256, 195.29), (496, 195.73),
             (512, 195.90)), ("tree",), gpus_per_process=8),
    Scaling("B200 nodes, all-gather", "together-nccl-tests flapping-airplanes (NCCL 2.28.9)", "b200", 32768,
            ((8, 674.63), (16, 370.22), (32, 377.85), (64, 381.43), (128, 382.75), (256, 376.77), (496, 348.55),
             (512, 380.15)), collective="all_gather", gpus_per_process=8),
    Scaling("B200 DGX Cloud, NCCL's pick with NVLS", "together-nccl-tests use3a-ss (NCCL 2.29.7)", "b200", 16384,
            ((8, 840.8), (16, 717.2), (32, 334.7), (64, 306.8), (128, 306.4), (256, 305.2), (368, 291.4)),
            ("nvls", "nvls_tree"), untuned=True),
    Scaling("B200 DGX Cloud, ring", "together-nccl-tests use3a-ss (NCCL 2.29.7)", "b200", 16384,
            ((8, 679.0), (16, 344.7), (32, 334.8), (64, 322.6), (128, 306.3), (256, 304.4), (368, 291.4)),
            ("ring",), untuned=True),
    Scaling("B200 DGX Cloud, tree", "together-nccl-tests use3a-ss (NCCL 2.29.7)", "b200", 16384,
            ((16, 335.2), (32, 190.7), (64, 192.6), (128, 193.4), (256, 193.5), (368, 193.2)), ("tree",)),
    Scaling("B200 DGX Cloud, all-gather", "together-nccl-tests use3a-ss (NCCL 2.29.7)", "b200", 16384,
            ((8, 673.6), (16, 342.9), (32, 323.9), (64, 311.5), (128, 304.9), (256, 302.3), (368, 293.3)),
            collective="all_gather", untuned=True),
)


def predicted(curve: Curve, mib: float) -> tuple[float, str]:
    """(bus bandwidth GB/s, algorithm/protocol) the model gives one call of `mib` MiB."""
    cluster = load_cluster(curve.cluster)
    release = re.search(r"NCCL (\d+\.\d+)", curve.source)  # the run's NCCL (Blackwell's tuner rows moved in 2.28)
    if release:
        cluster = cluster.with_software(nccl=release.group(1))
    if curve.domain:
        cluster = replace(cluster, tiers=(replace(cluster.tiers[0], size=curve.domain), *cluster.tiers[1:]))
    link = comm.group_link(cluster, curve.devices, curve.devices, 1)
    fabric = comm.nccl_fabric(link, curve.devices)
    if fabric is None:  # not NCCL's model: the link's alpha-beta one
        t, name = comm.collective_time(curve.collective, mib * M, 1, curve.devices, link), "alpha-beta"
    else:
        t, option = collectives.best(curve.collective, fabric, mib * M, curve.algorithms)
        name = f"{option[0]}/{option[1]}"
    return collectives.wire_factor(curve.collective, curve.devices) * mib * M / t / 1e9, name


def errors(curve: Curve) -> list[tuple]:
    """[(MiB, measured GB/s, predicted GB/s, error, algorithm/protocol)]."""
    out = []
    for mib, measured in curve.points:
        busbw, option = predicted(curve, mib)
        out.append((mib, measured, busbw, busbw / measured - 1, option))
    return out


def scaling_errors(series: Scaling) -> list[tuple]:
    """[(GPUs, measured GB/s, predicted GB/s, error, algorithm/protocol)] of a series."""
    return [(gpus, *errors(series.at(gpus, busbw))[0][1:]) for gpus, busbw in series.points]


def report(c: Curve | Scaling, held: str, rows: list[tuple], unit: str) -> None:
    """Print one curve or series: its header (what was held, its worst error) and a line per point."""
    worst = max(abs(e) for *_, e, _ in rows)
    launch = f", one process for {c.gpus_per_process} GPUs" if c.gpus_per_process > 1 else ""
    untuned = isinstance(c, Scaling) and c.untuned
    apart = "; set apart between nodes: run without its InfiniBand settings" if untuned else ""
    print(f"\n{c.name} ({c.collective}, {held}{launch}, {c.source}): worst {worst:.0%}{apart}")
    for x, measured, busbw, err, option in rows:
        print(f"  {x:6d} {unit} measured {measured:7.1f}  model {busbw:7.1f} GB/s  {err:+6.1%}  {option}")


def within(limit: float = 0.15, untuned: bool = False) -> tuple[int, int]:
    """(points within `limit`, points) over every curve's sizes from 1 MiB and every series run as its fabric
    needs: the issue's target; `untuned`: over the series counted apart instead."""
    rows = [] if untuned else [r for c in CURVES for r in errors(c) if r[0] >= 1]
    for s in SCALING:
        node = load_cluster(s.cluster).tiers[0].size
        rows += [r for r in scaling_errors(s) if (s.untuned and r[0] > node) == untuned]
    return sum(abs(r[3]) <= limit for r in rows), len(rows)


if __name__ == "__main__":
    for curve in CURVES:
        report(curve, f"{curve.devices} GPUs", errors(curve), "MiB ")
    for series in SCALING:
        report(series, f"{series.mib} MiB", scaling_errors(series), "GPUs")
    print("\n{} of {} points within 15% (every curve from 1 MiB, every series run with its fabric's settings);"
          " {} of {} more from a run without them".format(*within(), *within(untuned=True)))
    if "--plot" in sys.argv:
        from meshscale.plots import _pyplot, _save
        plt = _pyplot()
        panels = len(CURVES) + len(SCALING)
        fig, axes = plt.subplots(-(-panels // 5), 5, figsize=(20, 3.5 * -(-panels // 5)))
        for ax, c in zip(axes.flat, CURVES):
            sizes = [2**i * M for i in range(15)]
            rows = [(s, predicted(c, s / M)[0]) for s in sizes]
            ax.plot([s for s, _ in rows], [g for _, g in rows], "-", label="model")
            ax.plot([m * M for m, _ in c.points], [g for _, g in c.points], "x", label="nccl-tests")
            ax.set_xscale("log", base=2), ax.set_title(f"{c.name} ({c.devices})", fontsize=9)
            ax.set_xlabel("bytes"), ax.set_ylabel("busbw GB/s"), ax.legend(fontsize=7)
        for ax, series in zip(axes.flat[len(CURVES):], SCALING):
            rows = scaling_errors(series)
            ax.plot([g for g, *_ in rows], [p for _, _, p, *_ in rows], "-", label="model")
            ax.plot([g for g, *_ in rows], [m for _, m, *_ in rows], "x", label="nccl-tests")
            ax.set_xscale("log", base=2), ax.set_title(f"{series.name} ({series.mib // 1024} GiB)", fontsize=9)
            ax.set_xlabel("GPUs"), ax.set_ylabel("busbw GB/s"), ax.legend(fontsize=7)
        for ax in axes.flat[panels:]:
            ax.axis("off")
        _save(fig, sys.argv[sys.argv.index("--plot") + 1])
