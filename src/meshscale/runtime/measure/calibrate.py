"""Measure the machine in hand and write it as a ClusterSpec file (`meshscale calibrate`).

Every rank measures at once, as in training (one thread per rank on a CPU): GEMM throughput over
transformer-like shapes, causal attention (forward + backward), memory bandwidth of element-wise work, the
host time per framework operator, and every collective kind over message sizes, reduced to the alpha-beta
figures `cost/comm.py` uses. Rank 0 writes the file: the base preset plus the measured fields and their
provenance. Nothing here looks at a training step: those are what the file is then checked against.
"""

import datetime
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshscale.errors import UserError
from meshscale.parallel.compat import all_gather_into, reduce_scatter_from
from meshscale.runtime.loop.launch import exit_worker, first_failure
from meshscale.runtime.loop.optim import build_optimizer
from meshscale.runtime.loop.trainer import pick_device


@dataclass(frozen=True)
class Sweep:
    """What is measured on one kind of device, in the precision `train` runs there: GEMMs (m, n, k), causal
    attention (seq, head_dim) over `attention_tokens` tokens of 8 heads, and an add over fp32 tensors of
    `add_elements`, large enough to leave the caches."""
    precision: str
    gemms: tuple
    attention: tuple
    attention_tokens: int
    add_elements: int


SWEEPS = {
    # tiny's and small's layer GEMMs, then a square one; fp32 (`train`'s default); 16 MiB tensors
    "cpu": Sweep("fp32", ((512, 64, 176), (512, 176, 64), (2048, 256, 688), (2048, 688, 256), (2048, 256, 256),
                          (1024, 1024, 1024)), ((64, 8), (256, 32), (1024, 64)), 4096, 2**22),
    # a llama3-8b layer's GEMMs at 4,096 tokens (QKV, output, MLP up and down), the output at 1,024, and 8192^3,
    # in bf16 (a GPU trains in bf16; its fp32 and FP8 keep the preset's figures); attention at head dims 128 and
    # 64 (smaller heads run slower a FLOP, cost/kernels.py head_dim_speed); 1 GiB tensors (an H100's L2 holds 50 MB)
    "cuda": Sweep("bf16", ((4096, 6144, 4096), (4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336),
                           (1024, 4096, 4096), (8192, 8192, 8192)),
                  ((1024, 128), (4096, 128), (8192, 128), (1024, 64), (4096, 64), (8192, 64)), 32768, 2**28),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MESSAGE_BYTES = (4 * 2**10, 64 * 2**10, 1 * 2**20, 8 * 2**20)
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def _timed(fn, device, repeat: int, stat=statistics.median, before=None) -> float:
    """Median (or `stat`) seconds of `fn` after one warm-up call; `before` runs untimed ahead of each call."""
    fn()
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return stat(times)


def _gemm_burst(device, n: int, count: int):
    """A function running `count` n x n GEMMs: the compute the communication figures are measured beside."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)

    def burst():
        for _ in range(count):
            a @ b
    return burst


def gemm_rates(device, sweep: Sweep, repeat: int) -> list[tuple]:
    out, dtype = [], DTYPES[sweep.precision]
    for m, n, k in sweep.gemms:
        a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
        out.append((m, n, k, 2 * m * n * k / _timed(lambda: a @ b, device, repeat)))
    return out


def attention_rates(device, sweep: Sweep, repeat: int) -> list[tuple]:
    """Causal SDPA forward + backward at 8 heads; FLOPs counted as cost/flops.py does (QK^T and AV over
    the (s+1)/2 positions a token attends to, backward twice forward)."""
    out, dtype = [], DTYPES[sweep.precision]
    for seq, head_dim in sweep.attention:
        batch = max(1, sweep.attention_tokens // seq)
        q, k, v = (torch.randn(batch, 8, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))

        def step():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        flops = 3 * 2.0 * 8 * 2 * head_dim * (seq + 1) / 2 * batch * seq
        out.append((seq, head_dim, flops / _timed(step, device, repeat)))
    return out


def memory_bandwidth(device, sweep: Sweep, repeat: int) -> float:
    """Bytes/s of an out-of-place add of fp32 tensors (two reads, one write)."""
    a, b = torch.randn(sweep.add_elements, device=device), torch.randn(sweep.add_elements, device=device)
    out = torch.empty_like(a)
    return 3 * a.nbytes / _timed(lambda: torch.add(a, b, out=out), device, repeat)


def op_overhead(device, repeat: int) -> float:
    """Seconds per operator of a forward + backward chain of element-wise ops on 8-element tensors: the
    host cost (Python, dispatch, autograd) with no arithmetic to speak of. Operators are counted by
    autograd's own graph: each forward op adds one node, run once more in backward."""
    x = torch.randn(8, device=device, requires_grad=True)
    n = 100

    def chain():
        y = x
        for _ in range(n):
            y = y * 1.0001
        y.sum().backward()

    return _timed(chain, device, repeat) / (2 * n + 2)


def fsdp_overhead(device, repeat: int) -> tuple[float, float]:
    """Host seconds FSDP2 adds beyond its collectives: per unit for one forward + backward, and per parameter
    tensor for one AdamW update of sharded (DTensor) parameters. Measured with `fully_shard` on a one-rank
    mesh, so nothing travels: eight Linear(32, 32) units against the same stack unsharded, the two timed in
    turn, so that load coming and going on a shared host falls on both alike."""
    alone = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]  # every rank makes each
    try:
        (plain_pass, plain_opt), (sharded_pass, sharded_opt) = (_units(device, group) for group in (None, alone))
        passes, updates = (_paired(device, repeat, plain, sharded)
                           for plain, sharded in ((plain_pass, sharded_pass), (plain_opt, sharded_opt)))
    finally:
        dist.destroy_process_group(alone)
    return max(0.0, passes) / 8, max(0.0, updates) / 16


def _paired(device, repeat: int, a, b) -> float:
    """The median over `repeat` turns of b's seconds less a's, each timed right after the other."""
    return statistics.median(_timed(b, device, 1) - _timed(a, device, 1) for _ in range(repeat))


def _units(device, group):
    """(forward + backward, optimizer step) of eight Linear(32, 32) units, sharded over `group`'s one-rank mesh
    when given."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    x = torch.randn(16, 32, device=device)
    units = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(8))).to(device)
    if group is not None:
        mesh = DeviceMesh.from_group(group, device.type)
        for unit in units:
            fully_shard(unit, mesh=mesh)
    optimizer = build_optimizer(list(units.parameters()), 1e-3, 0.1)
    return lambda: units(x).sum().backward(), optimizer.step


def collective_times(device, repeat: int, sizes=MESSAGE_BYTES) -> dict:
    """{kind: [(bytes, mean seconds)]} for the world group, bytes as the comm ledger counts them (the full
    buffer; send_recv: what one rank sends, ranks pairing up 0-1, 2-3, ...). Each call follows a few
    milliseconds of GEMMs, as in a step: the ranks arrive with the skew compute leaves between them and the
    collective's threads wake from idle, which costs gloo on a shared CPU about twice a back-to-back call.
    The mean, not the median: a step pays every call, and a quarter of small gloo calls take several times
    the median (a thread wakes late)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    compute = _gemm_burst(device, 256, 4)
    out = {kind: [] for kind in KINDS}
    for nbytes in sizes:
        numel = nbytes // 4 // world * world
        full = torch.randn(numel, device=device)
        part = torch.empty(numel // world, device=device)
        peer = rank ^ 1

        def send_recv():
            if peer >= world:
                return
            ops = [dist.P2POp(dist.isend, full, peer), dist.P2POp(dist.irecv, torch.empty_like(full), peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        calls = {"all_reduce": lambda: dist.all_reduce(full),
                 "all_gather": lambda: all_gather_into(full, part),
                 "reduce_scatter": lambda: reduce_scatter_from(part, full),
                 "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full),
                 "send_recv": send_recv}
        for kind, fn in calls.items():
            dist.barrier()
            out[kind].append((full.nbytes, _timed(fn, device, repeat, statistics.mean, compute)))
    return out


def overlap_efficiency(device, repeat: int) -> float:
    """The fraction of a gradient-sized all-reduce's time that can run beside compute (the rest adds to it):
    GEMMs alone (tc, longer than the all-reduce), the all-reduce alone (tm), then the all-reduce launched
    asynchronously under the same GEMMs (tb); (tc + tm - tb) / tm, clipped to [0, 1]. Near 1 where a separate
    engine moves the data; on a CPU the collective's threads take the cores the GEMMs need (the slowdown of
    compute under concurrent communication that Echo and Lumos measure on GPUs, here in full)."""
    compute = _gemm_burst(device, 512, 24)
    buf = torch.randn(2**20, device=device)  # 4 MiB

    def overlapped():
        work = dist.all_reduce(buf, async_op=True)
        compute()
        work.wait()

    def timed(fn):
        dist.barrier()
        return _timed(fn, device, repeat)

    tc, tm, tb = timed(compute), timed(lambda: dist.all_reduce(buf)), timed(overlapped)
    return min(1.0, max(0.0, (tc + tm - tb) / tm))


def alpha_beta(kind: str, samples: list[tuple], n: int) -> tuple[float, float]:
    """(latency per step, bus bandwidth) in cost/comm.py's terms: the smallest message gives alpha (its
    time over the algorithm's latency steps), the largest the bandwidth of what remains (Hockney 1994)."""
    wire = {"all_reduce": 2 * (n - 1) / n, "send_recv": 1.0}.get(kind, (n - 1) / n)
    steps = {"all_reduce": min(2 * (n - 1), 2 * math.ceil(math.log2(n))), "send_recv": 1}.get(kind, n - 1)
    (_, t_small), (big, t_big) = samples[0], samples[-1]
    alpha = t_small / steps
    return alpha, wire * big / max(t_big - steps * alpha, t_big / 2)


def measure(device, quick: bool) -> dict:
    """This rank's measurements."""
    repeat, sweep = 3 if quick else 10, SWEEPS[device.type]
    result = {"gemm": gemm_rates(device, sweep, repeat), "attention": attention_rates(device, sweep, repeat),
              "bandwidth": memory_bandwidth(device, sweep, repeat), "op_overhead": op_overhead(device, repeat)}
    if dist.is_initialized() and dist.get_world_size() > 1:
        sizes = MESSAGE_BYTES[::3] if quick else MESSAGE_BYTES
        result["collectives"] = collective_times(device, repeat if quick else 40, sizes)
        result["overlap"] = overlap_efficiency(device, repeat)
        result["fsdp"] = fsdp_overhead(device, repeat)
    return result


def cluster_fields(per_rank: list[dict], device, nproc: int, method: str) -> dict:
    """The ClusterSpec fields measured, each the median over ranks (they ran at once)."""
    med = statistics.median
    first = per_rank[0]
    gemm = [(*first["gemm"][i][:3], med(r["gemm"][i][3] for r in per_rank)) for i in range(len(first["gemm"]))]
    attention = [(*first["attention"][i][:2], med(r["attention"][i][2] for r in per_rank))
                 for i in range(len(first["attention"]))]
    fields = {"base": "local-cpu" if device.type == "cpu" else _gpu_base(device),
              "name": f"calibrated-{platform.node() or 'host'}",
              "hbm_bandwidth": med(r["bandwidth"] for r in per_rank),
              "hbm_efficiency": 1.0,  # measured: already what an element-wise kernel reaches, not a datasheet's
              "op_overhead_s": med(r["op_overhead"] for r in per_rank),
              "host_linear_s": 0.0,  # the measured per-operator time replaces the preset's host figure
              "attention_rates": attention, "gemm_rates": gemm, "rates_precision": SWEEPS[device.type].precision,
              "default_devices": nproc,
              # our runtime keeps fp32 parameters under autocast, so ZeRO-1/2 gathers them in fp32
              "software": {"param_gather_fp32": True}}
    if device.type == "cpu":
        # The best fp32 GEMM measured is the peak, reached in full; each layout's shapes get their own measured
        # rate (cost/kernels.py), never above it. A GPU keeps its datasheet peaks and efficiency: they still
        # cost the precisions not measured.
        fields.update(peak_flops_fp32=max(g[3] for g in gemm), matmul_efficiency=1.0)
        # The ranks measured at once share this host's cores; a job with more ranks per host shares them too.
        # Our runtime runs each element-wise operator eagerly and keeps what autograd saves (cost/memory.py).
        fields["calibrated_ranks"] = nproc
        fields["software"]["fused_elementwise"] = False
    if "collectives" in first:
        kinds = []
        for kind in KINDS:
            samples = [(b, med(r["collectives"][kind][i][1] for r in per_rank))
                       for i, (b, _) in enumerate(first["collectives"][kind])]
            kinds.append((kind, *alpha_beta(kind, samples, nproc)))
        ar = next(k for k in kinds if k[0] == "all_reduce")
        fields["software"]["overlap_efficiency"] = med(r["overlap"] for r in per_rank)
        # That fraction already holds the slowdown of the GEMMs beside the all-reduce (they ran together), so
        # the SM share cost/comm.sm_share would otherwise derive must not be charged on top of it.
        fields["overlap_slowdown"] = 0.0
        fields["fsdp_unit_overhead_s"] = med(r["fsdp"][0] for r in per_rank)
        fields["fsdp_tensor_overhead_s"] = med(r["fsdp"][1] for r in per_rank)
        # The tier carries the fastest kind's bandwidth, so the planner's latency-free bound stays a bound.
        fields["tiers"] = [{"name": "nvlink" if device.type == "cuda" else "loopback", "size": 0,
                            "bandwidth": max(k[2] for k in kinds), "latency": ar[1], "efficiency": 1.0}]
        fields["collectives"] = kinds
    fields["calibration"] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "host": platform.node(), "torch": torch.__version__, "nproc": nproc,
                             "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                             else f"cpu ({os.cpu_count()} cores)", "method": method}
    return fields


def _gpu_base(device) -> str:
    name = torch.cuda.get_device_name(device)
    return next((preset for key, preset in (("H200", "h200"), ("H100", "h100-80gb"), ("A100", "a100-80gb"),
                                             ("B200", "b200")) if key in name), "h100-80gb")


def to_toml(fields: dict) -> str:
    """TOML text of the fields (numbers, strings, arrays of rows, one table of tiers, one of provenance)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = ["# Written by `meshscale calibrate`: the base preset with what was measured on this machine."]
    tables = {k: fields[k] for k in ("tiers", "software", "calibration") if k in fields}
    for key, v in fields.items():
        if key in tables:
            continue
        if key in ("gemm_rates", "attention_rates", "collectives"):
            lines.append(f"{key} = [\n" + "".join(f"  {value(row)},\n" for row in v) + "]")
        else:
            lines.append(f"{key} = {value(v)}")
    for tier in tables.get("tiers", []):
        lines += ["", "[[tiers]]"] + [f"{k} = {value(x)}" for k, x in tier.items()]
    for table in ("software", "calibration"):
        if table in tables:
            lines += ["", f"[{table}]"] + [f"{k} = {value(x)}" for k, x in tables[table].items()]
    return "\n".join(lines) + "\n"


def launch(nproc: int, out: str, quick: bool) -> None:
    """Run the measurement on `nproc` local processes (torch.distributed's elastic launcher, as `train`)."""
    import logging
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    method = f"meshscale calibrate, {nproc} process(es), {'quick' if quick else 'full'} sweep"
    if nproc == 1:
        _worker(out, quick, method)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # ranks share the cores, as in training
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1)
    try:
        elastic_launch(config, sys.executable)("-m", "meshscale.runtime.measure.calibrate", out,
                                               "quick" if quick else "full", method)
    except ChildFailedError as e:
        raise UserError(first_failure(e)) from None


def _worker(out: str, quick: bool, method: str) -> int:
    device = pick_device("auto", int(os.environ.get("LOCAL_RANK", 0)))
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        mine = measure(device, quick)
        per_rank = [None] * world
        if world > 1:
            dist.all_gather_object(per_rank, mine)
        else:
            per_rank = [mine]
        if int(os.environ.get("RANK", 0)) == 0:
            with open(out, "w") as f:  # the command checked that `out` may be written
                f.write(to_toml(cluster_fields(per_rank, device, world, method)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_worker(_worker(sys.argv[1], sys.argv[2] == "quick", sys.argv[3]))
