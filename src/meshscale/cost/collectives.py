"""Collectives as NCCL runs them: ring and tree all-reduce, ring all-gather / reduce-scatter, NVLink SHARP
(NVLS, NVLS-tree), and all-to-all as grouped point-to-point, each in NCCL's three protocols.

NCCL picks, per call, the (algorithm, protocol) its tuner predicts fastest, time = latency + bytes /
bandwidth (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel and ncclTopoGetAlgoTime). We take the same
structure and constants, those of NCCL 2.20.5 (v2.20.5-1, the release of the DGX H100 measurements below;
Blackwell's rows from master 5067397c, 2026, before 2.28 v2.27.7's): a base latency per algorithm and protocol,
a latency per hop that depends on what the hop crosses (an NVLink hop is not a network hop; inter-domain ring
steps pay the network's), protocol bandwidth ceilings (LL moves 8 data bytes in 16 and is capped per GPU
generation, LL128 120 in 128, per-channel caps), the tree's and NVLS's shapes. Departures, each from nccl-tests:
- the bus bandwidth of a link is nccl-tests' measured ceiling (specs/cluster.py: bandwidth x efficiency),
  not NCCL's topology-search estimate, and NVLS's is its own measured ceiling (ClusterSpec.nvls_bandwidth);
- NVLS runs in chunks (`nvls_seconds`): NCCL picks it by the tuner's constant 23 us, but its time grows with the
  chunk NCCL cuts the message into and with the ranks the pipeline fills over (~40 us on 8 H100 at 1 MiB,
  ~550 us on 72 GB200 at 512 MiB); NVLS-tree between domains likewise, in NCCL 2.26's chunks (`nvls_tree_seconds`);
- a tree's pipeline fills over its chain and levels, up and down, before its rate holds (`tree_seconds`): ~50 us on
  4 H100 nodes at 1-4 MiB, 0.1-0.2 ms on 16-512 nodes at 16-32 MiB, ~9 ms on 20 NVL72 racks with NVLS off;
- NCCL's tree is as fast as its tuner's cap between nodes: its search's channels (one a NIC) x the per-channel
  rate, as two B200 clusters measure it; Blackwell's rates are the release's ([software] nccl: 2.28 lowered them).
Where this misses the curves (benchmarks/nccl_curves.py) is stated there and in the README.

Pure Python, no torch; used by cost/comm.py for GPU clusters (ClusterSpec.gpu_arch set).
"""

from dataclasses import dataclass
from functools import lru_cache

# ---- NCCL's tuner constants (src/graph/tuning.cc, ncclTunerConstantsDefaults), microseconds and GB/s -------
PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LATENCY_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
HOP_LATENCY_US = {  # hwLatencies[hw][algorithm][protocol]
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0), "nvls_tree": (0, 0, 14.0)},
}
# per GPU generation, indexed by nodes (1, 2, >2); LL's cap is by GPU type on one node, by host CPU across
# nodes (llMaxBws rows: Intel-or-other / AMD)
LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (87.7, 22.5, 19.0),
             "blackwell": (282.0, 90.0, 70.0)}
LL_MAX_BW_HOST = {"intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0)}
RING_LL128_PER_CHANNEL = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3, "hopper": (36.7,) * 3,
                          "blackwell": (40.0,) * 3}
TREE_LL128_PER_CHANNEL = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3, "hopper": (36.7, 36.7, 29.0),
                          "blackwell": (55.6, 31.67, 20.0)}
TREE_PER_CHANNEL = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
                    "blackwell": (70.0, 42.8, 24.0)}
# NVLS-tree's per-channel rates (in the tuner from 2.28) multiply the NVLS graph's channels, one a GPU of the
# domain up to 32 (search.cc: maxChannels = min(NCCL_MAX_NVLS_ARITY, GPUs)): 8 x 45.5 = 364 GB/s, where 4 H100
# nodes on 2.26.2 measure 365 (NVIDIA/nccl-tests#309); 8 x 57.7 = 462 on two, which measure 441.
NVLS_TREE_PER_CHANNEL = {"hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)}
# Blackwell's rows before NCCL 2.28 (v2.27.7 tuning.cc: twice Hopper's). 2.28.3 lowered them to those above as it
# cut Blackwell's thread blocks a collective from 32 to 16 (its release notes: "Decreased max CTA count from 32 to
# 16 on Blackwell ... may cause some perf drop"); two B200 clusters on 2.28.9 and 2.29.7 run NCCL's tree at the
# new rows (benchmarks/nccl_curves.py SCALING), GB200 partitions on 2.27.3 above them (CURVES).
BLACKWELL_BEFORE_2_28 = {"ring_ll128": (73.4,) * 3, "tree_ll128": (73.4, 73.4, 58.0), "tree": (77.4, 82.8, 72.0)}
# Trees' measured shortfall at medium sizes, by log2(bytes / 64) (treeCorrectionFactor)
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9))
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "arm": 1.0}  # getNetOverhead: a network post per ring step
# NVLS (src/transport/nvls.cc, NVLS_NCHANNELS_SM90 / _SM100; NVLS_NCHANNELS 16 in v2.18) runs on its own channels, and
# cuts each channel's share into chunks of at most 128 KiB, smaller for smaller messages (src/enqueue.cc,
# computeCollChunkInfo's NVLS rules, the same from v2.18.5 to v2.25).
NVLS_CHANNELS = {"hopper": 16, "blackwell": 32}
NVLS_MAX_CHUNK = 128 * 1024
NVLS_ARITY = 32  # NCCL_MAX_NVLS_ARITY (src/include/device.h): GPUs an NVLS graph's channels start from
NVLS_BASE_LATENCY_US = 23.0  # baseLat[NVLS][Simple]: what the tuner charges, and the kernel's fixed cost
# Measured on Azure's 8 H100 (benchmarks/nccl_curves.py, NVLS from 1 MiB to 8 GiB): between its 16 KiB-chunk
# sizes (1-4 MiB, 300 GB/s) and its 128 KiB ones (1-8 GiB, 480) the bandwidth follows a fixed cost of 0.37 us a
# chunk on each channel (the 32 and 64 KiB sizes then read 383 and 443 against 385 and 450 measured), and the
# fixed cost beyond 23 us is 3(n-1) chunk times: the reduce-scatter, reduction and broadcast stages of n-1 peers
# each filling before the rate holds (21 chunks on 8 ranks; 72 GB200 ranks at 32-64 KiB chunks agree within 7%).
NVLS_CHUNK_OVERHEAD_S = 0.37e-6
# The data a tree moves per step of its protocol's buffer (src/init.cc DEFAULT_*BUFFSIZE / NCCL_STEPS, 8 steps):
# LL 64 KiB of which half is flags, LL128 614,400 B of which 15/16 is data, Simple 4 MiB / 8
TREE_CHUNK = {"LL": 32768, "LL128": 576000, "Simple": 524288}
# A channel's share below which NCCL runs a ring or tree on fewer channels (src/enqueue.cc topoGetAlgoInfo: its
# threads x NCCL_*_THREAD_THRESHOLD, LL 512 x 8, LL128 640 x 8, Simple 512 x 64 bytes)
CHANNEL_MIN_BYTES = {"LL": 4096, "LL128": 5120, "Simple": 32768}
# Channels NCCL opens for collectives on these systems (NCCL_DEBUG=INFO "coll channels" on DGX A100 / H100 /
# B200 and GB200 trays): inside one NVLink domain the per-channel caps above scale with them (search_channels).
CHANNELS = {"volta": 12, "ampere": 24, "hopper": 24, "blackwell": 32}
FROM_HOPPER = ("hopper", "blackwell")  # compute capability 9.0 on: NCCL's `ccMin > 80` and `minCompCap >= 90`


def collective_blocks(arch: str, release: tuple) -> int:
    """Thread blocks a ring or tree collective holds, one a channel: CHANNELS, and 16 on Blackwell from NCCL 2.28
    (its release notes: "Decreased max CTA count from 32 to 16 on Blackwell. SM overhead is decreased by 50%")."""
    return 16 if arch == "blackwell" and release >= (2, 28) else CHANNELS[arch]


@dataclass(frozen=True)
class Fabric:
    """What NCCL's tuner needs to know about the ranks of one group: its GPU generation and host CPU, the ranks
    per NVLink domain (`ppn`) and the domains (`nodes`), the per-hop kind inside a domain, the bus bandwidth
    (GB/s) of the group's ring (nccl-tests' measured ceiling for this link) and NVLS's where the domain has
    NVLink SHARP (0: none)."""
    arch: str
    ppn: int
    nodes: int
    busbw: float  # GB/s
    nvls_busbw: float = 0.0  # GB/s
    net_busbw: float = 0.0  # GB/s per rank through the network (all-to-all's outside share); 0: busbw
    intra_busbw: float = 0.0  # GB/s of the NVLink domain, where `busbw` is the network's share; 0: busbw
    intra: str = "nvlink"
    host: str = "intel"
    nccl: tuple = (2, 27)  # the NCCL release, (major, minor): Blackwell's tuner rows changed in 2.28

    @property
    def ranks(self) -> int:
        return self.ppn * self.nodes


def per_channel(fabric: Fabric, algorithm: str) -> tuple:
    """NCCL's per-channel bandwidth caps (GB/s; 1, 2, more domains) of "ring_ll128", "tree_ll128" or "tree" for
    the fabric's GPUs and NCCL release."""
    if fabric.arch == "blackwell" and fabric.nccl < (2, 28):
        return BLACKWELL_BEFORE_2_28[algorithm]
    return {"ring_ll128": RING_LL128_PER_CHANNEL, "tree_ll128": TREE_LL128_PER_CHANNEL,
            "tree": TREE_PER_CHANNEL}[algorithm][fabric.arch]


def search_channels(fabric: Fabric) -> int:
    """The channels NCCL's topology search gives a ring or tree, which its tuner multiplies by the per-channel
    caps (ncclTopoTuneModel: graphs[a]->nChannels x perChMax*Bw). Inside one domain, CHANNELS. Between domains one
    a NIC (a NIC a GPU on these systems), doubled (src/graph/search.cc ncclTopoDupChannels) unless the GPUs are
    newer than Ampere, a channel runs under 50 GB/s (400 Gb/s NICs: the search's 48) and there are more than 4;
    at most 32 (MAXCHANNELS / 2). So 8 between HGX H100 or B200 nodes, where NCCL's tree runs at 8 x its 2.28
    Blackwell caps: 342 and 192 GB/s against 335-339 and 191-196 measured on two and more B200 nodes (and 8 x
    70 = 560 against 556 on one, where NCCL_DEBUG's 32 channels leave the model's tree at 622)."""
    if fabric.nodes == 1:
        return CHANNELS[fabric.arch]
    undoubled = fabric.arch in FROM_HOPPER and (fabric.net_busbw or fabric.busbw) < 50 and fabric.ppn > 4
    return min(32, fabric.ppn if undoubled else 2 * fabric.ppn)


def run_channels(fabric: Fabric) -> int:
    """The channels a ring or tree runs on: the search's, doubled between domains from Hopper on while under 16
    (src/graph/connect.cc: "Use 4 compute channels per search channel to reach peak BW"), so 16 on HGX nodes."""
    channels = search_channels(fabric)
    if fabric.nodes > 1 and fabric.arch in FROM_HOPPER and channels < 16:
        return 2 * channels
    return channels


def p2p_blocks(fabric: Fabric) -> int:
    """Thread blocks one rank's send/recv pair holds (one per channel; src/graph/paths.cc at v2.20.5-1,
    ncclTopoGetNchannels and ncclTopoComputeP2pChannels): NCCL gives every peer of a communicator the fewest
    channels any of its peers gets, 2 for a peer across the network (NCCL_NCHANNELS_PER_NET_PEER's default,
    one NIC's worth), its whole p2p channel count (CHANNELS rounded up to a power of two) between NVLink
    peers. A ring or pipeline rank sends to one peer and receives from another."""
    channels = 1 << (CHANNELS[fabric.arch] - 1).bit_length()
    per_peer = 2 if fabric.nodes > 1 else channels
    return min(channels, 2 * per_peer)


def _index(nodes: int) -> int:
    return min(nodes, 3) - 1


def _steps(collective: str, n: int) -> int:
    return 2 * (n - 1) if collective == "all_reduce" else n - 1


@lru_cache(maxsize=65536)
def options(collective: str, fabric: Fabric) -> tuple:
    """((algorithm, protocol, latency s, bus bandwidth B/s by the tuner, bus bandwidth B/s it runs at), ...) NCCL's
    tuner considers for `collective` on `fabric` (ncclTopoTuneModel). Bus bandwidth as nccl-tests reports it:
    algorithm bandwidth x its collective's factor (2(n-1)/n for all-reduce, (n-1)/n for all-gather /
    reduce-scatter). The two bandwidths differ only for trees between domains."""
    f, n = fabric, fabric.ranks
    i, ch = _index(f.nodes), search_channels(f)
    ll_cap = LL_MAX_BW[f.arch][i] if f.nodes == 1 else LL_MAX_BW_HOST["amd" if f.host == "amd" else "intel"][i]
    nsteps = _steps(collective, n)
    inter_steps = 0 if f.nodes == 1 else 2 * f.nodes if collective == "all_reduce" else f.nodes - 1
    out = []
    for p, proto in enumerate(PROTOCOLS):
        # ring: every step crosses one hop; the inter-domain ones cost a network hop, the others an NVLink
        # hop (at least the network post overhead once the ring leaves the domain)
        net_post = 0.0 if f.nodes == 1 else NET_OVERHEAD_US[f.host] * (3 if proto == "Simple" else 1)
        intra = max(HOP_LATENCY_US[f.intra]["ring"][p], net_post)
        inter = HOP_LATENCY_US["net"]["ring"][p]
        lat = BASE_LATENCY_US["ring"][p] + (nsteps - inter_steps) * intra + inter_steps * inter
        ll = .25 if (f.nodes > 1 or collective == "all_reduce") else 1 / 3
        bw = {"LL": min(ll_cap, f.busbw * ll),
              "LL128": min(f.busbw * (.7 if f.ppn < 2 else .92), ch * per_channel(f, "ring_ll128")[i]),
              "Simple": f.busbw}[proto]
        if proto == "Simple" and collective == "all_reduce" and f.nodes > 1:
            lat *= 1.4 if f.arch != "volta" else 1.9  # "plateau effect of ring" (ncclTopoGetAlgoTime)
        out.append(("ring", proto, lat * 1e-6, bw * 1e9, bw * 1e9))
        if collective != "all_reduce":
            continue
        # tree (double binary tree between domains, a chain inside): up and down, 2 x (chain + log2 levels)
        lat = BASE_LATENCY_US["tree"][p] + 2 * ((f.ppn - 1) * HOP_LATENCY_US[f.intra]["tree"][p]
                                                + _log2i(f.nodes) * HOP_LATENCY_US["net"]["tree"][p])
        # NCCL's tuner takes a tree to run at 0.92 of the NVLink (up to 2 domains) or the network (more) rate of
        # its channels; what the network lets it reach depends on how many domains it spans (tree_net_busbw)
        tuner = (f.intra_busbw if f.nodes <= 2 and f.intra_busbw else f.busbw) * .92
        real = min(_tree_domain_busbw(f), tree_net_busbw(f)) if f.nodes > 1 else tuner
        tuner, real = (_tree_protocol(proto, min(bw, ch * per_channel(f, "tree")[i]), f, ll_cap) for bw in
                       (tuner, real))
        out.append(("tree", proto, lat * 1e-6, tuner * 1e9, real * 1e9))
    if collective == "all_reduce" and f.nvls_busbw and f.ppn > 2:
        # NVLS: multimem reduce and broadcast through the switch, off for two GPUs or fewer (src/transport/nvls.cc,
        # ncclNvlsInit). One domain: the tuner's constant latency (what NCCL picks by; nvls_seconds says what it
        # then takes).
        if f.nodes == 1:
            out.append(("nvls", "Simple", NVLS_BASE_LATENCY_US * 1e-6, f.nvls_busbw * 1e9, f.nvls_busbw * 1e9))
        else:  # NVLS inside each domain, a tree between them (two domains: both trees' links, master's rule);
            # the tuner's latency: 23 us for NVLink, 14 a tree level up and down (nvls_tree_seconds: what it takes)
            lat = NVLS_BASE_LATENCY_US + 2 * _log2i(f.nodes) * HOP_LATENCY_US["net"]["nvls_tree"][2]
            bw = min(f.nvls_busbw, tree_net_busbw(f), min(f.ppn, NVLS_ARITY) * NVLS_TREE_PER_CHANNEL[f.arch][i])
            out.append(("nvls_tree", "Simple", lat * 1e-6, bw * 1e9, bw * 1e9))
    return tuple(out)


def _tree_protocol(proto: str, bw: float, f: Fabric, ll_cap: float) -> float:
    """A tree's bus bandwidth (GB/s) in `proto`, from its Simple one."""
    i, ch = _index(f.nodes), search_channels(f)
    return {"LL": min(bw / 3.8, ll_cap),
            "LL128": min(bw * (7 / 9 if f.nodes == 1 else 120 / 128), ch * per_channel(f, "tree_ll128")[i]),
            "Simple": bw}[proto]


def _tree_domain_busbw(fabric: Fabric) -> float:
    """The bus bandwidth (GB/s) a tree reaches over the NVLink domain's links: 0.92 of them, as NCCL's tuner."""
    return (fabric.intra_busbw or fabric.busbw) * .92


def tree_net_busbw(fabric: Fabric) -> float:
    """The bus bandwidth (GB/s) the network lets a tree all-reduce between NVLink domains reach. Each domain sends
    through its ranks' NICs (ppn x net_busbw); of its all-reduce's A bytes, each of NCCL's two binary trees
    carries half, and a domain sends a half to its parent and to each child (src/graph/trees.cc, ncclGetDtree):
    the busiest domain sends A on 2 domains, 1.5 A on 3 (a chain each way), 2 A from 4 on (a parent and two
    children in one tree, a parent in the other). Bus bandwidth is A x 2(n-1)/n: so 2 domains reach twice a
    ring's, whose every rank sends 2(n-1)/n A whatever the domains (NVIDIA/nccl#812; on GB200 partitions of 4
    and 8 GPUs on 3 racks, tree 234 and 486 GB/s against ring 197 and 394, NVIDIA/nccl#1801)."""
    load = {2: 1.0, 3: 1.5}.get(fabric.nodes, 2.0)
    return wire_factor("all_reduce", fabric.ranks) * fabric.ppn * (fabric.net_busbw or fabric.busbw) / load


def _log2i(n: int) -> int:
    return max(int(n).bit_length() - 1, 0)


def wire_factor(collective: str, n: int) -> float:
    """Bus bytes per byte of the message (nccl-tests' busbw / algbw)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    return (n - 1) / n if n > 1 else 0.0


def option_seconds(collective: str, fabric: Fabric, nbytes: float, option: tuple) -> float:
    """One call of `nbytes` (the buffer the collective operates on) by one (algorithm, protocol)."""
    if option[0] == "nvls":
        return nvls_seconds(fabric, nbytes)
    if option[0] == "nvls_tree":
        return nvls_tree_seconds(fabric, nbytes, option)
    if option[0] == "tree":
        return tree_seconds(fabric, nbytes, option)
    return _tuner_seconds(collective, fabric, nbytes, option, option[4])


def _tuner_seconds(collective: str, fabric: Fabric, nbytes: float, option: tuple, bw: float = 0.0) -> float:
    """NCCL's own estimate of an option (ncclTopoGetAlgoTime): latency + bytes / bandwidth, trees corrected; at
    `bw` B/s rather than the tuner's if given."""
    algo, proto, lat = option[:3]
    bw = bw or option[3]
    wire = wire_factor(collective, fabric.ranks) * nbytes
    if algo == "tree":
        log = _log2i(int(nbytes) >> 6)
        if log < len(TREE_CORRECTION[0]):
            bw *= TREE_CORRECTION[PROTOCOLS.index(proto)][log]
    return lat + wire / bw


def best(collective: str, fabric: Fabric, nbytes: float, algorithms: tuple = ()) -> tuple[float, tuple]:
    """(seconds, (algorithm, protocol, ...)) of the option NCCL's tuner picks for one call, among
    `algorithms` if given (NCCL_ALGO)."""
    pick = min((_tuner_seconds(collective, fabric, nbytes, o), o) for o in options(collective, fabric)
               if not algorithms or o[0] in algorithms)[1]
    return option_seconds(collective, fabric, nbytes, pick), pick


def nvls_chunk(nbytes: float, concurrent: int) -> int:
    """The chunk NCCL moves NVLS's data in: 128 KiB, halved to 64, 32 and 16 KiB for messages under 64, 8 and 2
    chunks on each of the `concurrent` channel x head pairs (computeCollChunkInfo)."""
    chunk = NVLS_MAX_CHUNK
    for times, smaller in ((64, 65536), (8, 32768), (2, 16384)):
        if nbytes < times * concurrent * chunk:
            chunk = smaller
    return chunk


def nvls_seconds(fabric: Fabric, nbytes: float) -> float:
    """One NVLS all-reduce inside one NVLink domain. The preset's `nvls_busbw` is nccl-tests' bus bandwidth at 8
    GiB; each chunk a channel moves costs NVLS_CHUNK_OVERHEAD_S besides its bytes, so smaller chunks run slower,
    and the pipeline fills over 3(n-1) chunks first. Every rank heads its share (nHeads = ranks)."""
    n, channels = fabric.ranks, NVLS_CHANNELS[fabric.arch]
    overhead = NVLS_CHUNK_OVERHEAD_S / channels  # seconds a bus byte pays for its chunk's fixed cost, x chunk
    raw = 1 / (fabric.nvls_busbw * 1e9) - overhead / nvls_chunk(2**33, channels * n)  # seconds a bus byte
    chunk = nvls_chunk(nbytes, channels * n)
    fill = 3 * (n - 1) * chunk * channels * raw
    return NVLS_BASE_LATENCY_US * 1e-6 + fill + wire_factor("all_reduce", n) * nbytes * (raw + overhead / chunk)


def nvls_tree_chunk(nbytes: float, fabric: Fabric) -> int:
    """The chunk NCCL 2.26 moves NVLS-tree's data in (computeCollChunkInfo): NCCL_NVLS_CHUNKSIZE's 128 KiB, 64
    KiB from 4 domains on, halved to 64 and 32 KiB for messages under 4 and 1 chunks on each channel x head pair
    (a head is a rank with its own NIC: all of them here)."""
    concurrent = NVLS_CHANNELS[fabric.arch] * fabric.ppn
    chunk = NVLS_MAX_CHUNK if fabric.nodes < 4 else 65536
    for times, smaller in ((4, 65536), (1, 32768)):
        if nbytes < times * concurrent * chunk:
            chunk = min(chunk, smaller)
    return chunk


def nvls_tree_seconds(fabric: Fabric, nbytes: float, option: tuple) -> float:
    """One NVLS-tree all-reduce: NVLS reduces each chunk inside the domain, a tree carries it up and down between
    domains, NVLS broadcasts it. Before the rate holds the pipeline fills: as one domain's NVLS (3(ppn-1) chunks
    a channel, nvls_seconds) and over the tree's 2 log2(domains) network levels, each a round of every channel's
    chunk through the rank's NIC. On 4 and 8 H100 nodes that is 212 and 284 us against ~250 and ~300 measured
    (NVIDIA/nccl-tests#309, 32-256 MiB); on 2 NVL72 racks 0.7-1.3 ms (64-128 KiB chunks) against 0.9-1.5 ms."""
    channels, chunk = NVLS_CHANNELS[fabric.arch], nvls_tree_chunk(nbytes, fabric)
    inside = 3 * (fabric.ppn - 1) * chunk * channels / (fabric.nvls_busbw * 1e9)
    between = 2 * _log2i(fabric.nodes) * chunk * channels / ((fabric.net_busbw or fabric.busbw) * 1e9)
    return _tuner_seconds("all_reduce", fabric, nbytes, option, option[4]) + inside + between


def tree_chunk(nbytes: float, fabric: Fabric, proto: str) -> int:
    """The chunk NCCL 2.26 moves a tree's data in (computeCollChunkInfo): a step of the protocol's buffer
    (TREE_CHUNK); LL128 halves it, down to 72,000 B, while the message holds fewer than (1 + log2 domains + ppn / 10)
    x 64 / ppn chunks a channel, then down to 18,000 B while under a quarter of that."""
    chunk, ppn = TREE_CHUNK[proto], fabric.ppn
    if proto == "LL128":
        steps, channels = 1 + _log2i(fabric.nodes) + 0.1 * ppn, run_channels(fabric)
        for times, floor in ((64, 131072), (16, 32768)):
            while nbytes // (channels * chunk) < steps * times / ppn and chunk > floor:
                chunk //= 2
    return chunk


def tree_seconds(fabric: Fabric, nbytes: float, option: tuple) -> float:
    """One tree all-reduce. NCCL runs it split (runTreeSplit, src/device/all_reduce.h): on every channel some
    threads reduce chunks up the domain's chain and the tree between domains while the others broadcast them
    down, so the rate holds only once the first chunk has gone up (ppn - 1 + log2 domains hops) and down again.
    A chunk crosses a hop at one direction's share of its channel: half the bus bandwidth over the channels, the
    tree's between domains, the domain's where that is faster. On 20 NVL72 racks that fill is ~9 ms of 576,000 B
    chunks up and down a 72-GPU chain (the tuner's latency: 0.26 ms)."""
    channels = run_channels(fabric)
    running = max(1, min(channels, int(nbytes // CHANNEL_MIN_BYTES[option[1]])))
    chunk = min(tree_chunk(nbytes, fabric, option[1]), nbytes / running)  # a small message is one chunk a channel
    between = option[4] / (2 * channels)
    inside = max(between, _tree_domain_busbw(fabric) * 1e9 / (2 * channels))
    fill = 2 * chunk * ((fabric.ppn - 1) / inside + _log2i(fabric.nodes) / between)
    return _tuner_seconds("all_reduce", fabric, nbytes, option, option[4]) + fill


@lru_cache(maxsize=8192)
def seconds(collective: str, fabric: Fabric, nbytes: float, calls: int = 1) -> float:
    """`calls` calls moving `nbytes` in all (each nbytes / calls), NCCL's pick for each. calls=0: the bandwidth
    time alone at the fastest option's bandwidth (a lower bound of any number of calls, for the planner).
    Cached: a plan asks the same few thousand questions ~20 times each."""
    if fabric.ranks <= 1 or nbytes <= 0:
        return 0.0
    if collective == "all_to_all":
        return all_to_all_seconds(fabric, nbytes, calls)
    if collective == "send_recv":
        return nbytes / (_p2p_busbw(fabric) * 1e9) + calls * _p2p_latency(fabric)
    if calls == 0:
        return wire_factor(collective, fabric.ranks) * nbytes / max(o[4] for o in options(collective, fabric))
    return calls * best(collective, fabric, nbytes / calls)[0]


def _p2p_busbw(fabric: Fabric) -> float:
    """A send/recv's rate: the ring's bus bandwidth inside one domain; across domains the pair that crosses
    them moves through one rank's NIC (NCCL's p2p channels to a remote peer share its nearest NIC), and the
    group's sends step together (context parallelism's K,V ring, a pipeline's stage-to-stage sends in 1F1B's
    steady state), so every step waits for that pair."""
    return (fabric.net_busbw or fabric.busbw) if fabric.nodes > 1 else fabric.busbw


def _p2p_latency(fabric: Fabric) -> float:
    """One send/recv: Simple's base latency and one hop of what it crosses."""
    hop = HOP_LATENCY_US["net" if fabric.nodes > 1 else fabric.intra]["ring"][2]
    return (BASE_LATENCY_US["ring"][2] + hop) * 1e-6


def all_to_all_seconds(fabric: Fabric, nbytes: float, calls: int = 1) -> float:
    """NCCL's all-to-all is grouped send/recv to every peer (nccl-tests alltoall.cu; NCCL's p2p schedule runs
    them over its p2p channels at once). Of a rank's buffer, (ppn-1)/n goes to its own domain over NVLink and
    (n-ppn)/n leaves it through the rank's share of the network, both at once: the slower sets the time.
    The inside share travels at the domain's bus bandwidth, the outside one at the rank's network share."""
    n = fabric.ranks
    inside = (fabric.ppn - 1) / n * nbytes / (fabric.busbw * 1e9)
    outside = (n - fabric.ppn) / n * nbytes / ((fabric.net_busbw or fabric.busbw) * 1e9)
    peers_latency = (fabric.ppn - 1) * HOP_LATENCY_US[fabric.intra]["ring"][2] * 1e-6 + \
        (n - fabric.ppn) * NET_OVERHEAD_US[fabric.host] * 1e-6
    return max(inside, outside) + calls * (BASE_LATENCY_US["ring"][2] * 1e-6 + peers_latency)

