"""One GPU's kernels against the cost model's terms for the same shapes (run by hand on a CUDA machine; on one
without CUDA it says why and exits 0).

Each row is a micro-benchmark, the kind of source the cost model's efficiency terms come from, held against
what `cost/kernels.py` charges for that kernel on the matching preset (`--cluster`, default from the GPU's
name). Nothing here is fitted: the figures are for reading, and for a note that says where a term errs.

- GEMM, bf16 and FP8 (torch._scaled_mm, per-tensor scales), over a llama3-8b/70b layer's shapes and squares:
  measured TFLOP/s against `gemm_seconds`.
- Grouped GEMM (torch._grouped_mm, bf16) by tokens per expert, 8 experts of a Mixtral-shaped FFN: measured
  against `gemm_seconds(batch=groups)` times `grouped_gemm_efficiency`.
- Attention forward + backward (scaled_dot_product_attention, flash and cuDNN back ends), causal and not, by
  sequence length, head_dim 128: against `attention_seconds`.
- HBM: a 4 GiB copy and element-wise add (bytes read + written) against the rate the cost model charges
  memory traffic at, the preset's `hbm_bandwidth` x `hbm_efficiency` (the latter taken from this row's copy).
- Host link: a 1 GiB copy from device to pinned host memory and back, what activation offload moves, against
  the preset's `host_bandwidth` (the datasheet's PCIe rate; no scan had measured it).

Each timing is CUDA events around back-to-back launches, so no kernel waits for the host to launch it.
`--replay` predicts a recorded scan again with today's cost model on any machine:

    PYTHONPATH=src python benchmarks/kernel_scan.py [--cluster h200] [--json out.json]
    PYTHONPATH=src python benchmarks/kernel_scan.py --replay benchmarks/data/kernel_scan_h200.json
"""

import argparse
import json
import sys

try:  # measuring needs torch; --replay does not
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = F = None

from meshscale.cost.kernels import attention_seconds, gemm_seconds, grouped_gemm_efficiency
from meshscale.specs.cluster import load_cluster

GEMM_SHAPES = ((8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336),
               (8192, 10240, 8192), (8192, 8192, 28672), (2048, 2048, 2048), (4096, 4096, 4096),
               (8192, 8192, 8192), (1024, 4096, 4096), (512, 4096, 4096))
GROUPED_TOKENS = (128, 256, 512, 1024, 2048, 4096)
GROUPED_EXPERTS, GROUPED_HIDDEN, GROUPED_FFN = 8, 4096, 14336
ATTENTION_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
ATTENTION_HEADS, HEAD_DIM, ATTENTION_TOKENS = 32, 128, 32768  # batch = tokens / seq
PRESET_BY_NAME = (("H200", "h200"), ("H100", "h100-80gb"), ("A100", "a100-80gb"), ("B200", "b200"))


def timed(fn, repeat: int = 20, batches: int = 5, warmup: int = 3) -> float:
    """Seconds a call of `fn`, by CUDA events around `repeat` back-to-back calls (so the GPU never waits for
    the host to launch the next kernel: a lone small GEMM timed by itself also times its launch), the median
    of `batches` such runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / repeat)
    return sorted(times)[len(times) // 2]


def predicted_seconds(row: dict, cluster) -> float:
    """What the cost model charges for the kernel a row measured."""
    kind, shape = row["kind"], row["shape"]
    if kind.startswith("hbm"):
        return shape["bytes"] / cluster.achieved_hbm_bandwidth
    if kind.startswith("host"):
        return shape["bytes"] / cluster.host_bandwidth if cluster.host_bandwidth else float("nan")
    if kind.startswith("gemm"):
        fp8 = kind.endswith("fp8")
        return gemm_seconds(cluster, shape["m"], shape["n"], shape["k"], cluster.gemm_peak("fp8" if fp8 else "bf16"),
                            2, operand_bytes=1 if fp8 else 0)
    if kind.startswith("grouped"):
        m = shape["m"]
        return gemm_seconds(cluster, m, shape["n"], shape["k"], cluster.gemm_peak("bf16"), batch=shape["groups"]) / \
            grouped_gemm_efficiency(m)
    return attention_seconds(cluster, attention_core_flops(shape), shape["seq"], cluster.peak_flops("bf16"),
                             shape["causal"])


def attention_core_flops(shape: dict) -> float:
    """Useful forward FLOPs of one attention call: 4 s^2 d per head, halved when causal (the papers' count)."""
    return 4.0 * shape["batch"] * shape["heads"] * shape["seq"] ** 2 * shape["head_dim"] / (2 if shape["causal"] else 1)


def row_flops(row: dict) -> float:
    kind, shape = row["kind"], row["shape"]
    if kind.startswith(("hbm", "host")):
        return 0.0
    if kind.startswith("attention"):
        return 3.5 * attention_core_flops(shape)  # forward + a backward of 2.5x
    return 2.0 * shape.get("groups", 1) * shape["m"] * shape["n"] * shape["k"]


def gemms() -> list[dict]:
    rows = []
    fp8 = hasattr(torch, "float8_e4m3fn") and torch.cuda.get_device_capability() >= (8, 9)
    for m, n, k in GEMM_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        rows.append({"kind": "gemm bf16", "shape": {"m": m, "n": n, "k": k}, "measured_s": timed(lambda: a @ b)})
        if fp8:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major second operand, as cuBLASLt wants
            one = torch.ones((), device="cuda")
            t = timed(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            rows.append({"kind": "gemm fp8", "shape": {"m": m, "n": n, "k": k}, "measured_s": t})
        del a, b
    return rows


def grouped() -> list[dict]:
    if not hasattr(torch, "_grouped_mm"):
        return []
    rows = []
    g, h, f = GROUPED_EXPERTS, GROUPED_HIDDEN, GROUPED_FFN
    w = torch.randn(g, h, f, device="cuda", dtype=torch.bfloat16)
    for tokens in GROUPED_TOKENS:
        x = torch.randn(g * tokens, h, device="cuda", dtype=torch.bfloat16)
        offs = torch.arange(tokens, g * tokens + 1, tokens, device="cuda", dtype=torch.int32)
        try:
            t = timed(lambda: torch._grouped_mm(x, w, offs=offs))
        except RuntimeError as e:  # this build or GPU has no grouped kernel for the shape
            print(f"grouped GEMM: {str(e).splitlines()[0]}", file=sys.stderr)
            return rows
        rows.append({"kind": "grouped gemm bf16", "shape": {"groups": g, "m": tokens, "n": f, "k": h},
                     "measured_s": t})
    return rows


def attention() -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        for seq in ATTENTION_SEQS:
            batch = max(1, ATTENTION_TOKENS // seq)
            q, k, v = (torch.randn(batch, ATTENTION_HEADS, seq, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            grad = torch.randn_like(q)
            for causal in (False, True):
                def step():
                    with sdpa_kernel([backend]):
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    out.backward(grad)
                try:
                    t = timed(step, repeat=4, batches=3)
                except RuntimeError as e:
                    print(f"attention {backend.name} seq {seq}: {str(e).splitlines()[0]}", file=sys.stderr)
                    continue
                rows.append({"kind": f"attention {backend.name.split('_')[0].lower()}",
                             "shape": {"seq": seq, "batch": batch, "heads": ATTENTION_HEADS, "head_dim": HEAD_DIM,
                                       "causal": causal}, "measured_s": t})
            del q, k, v, grad
    return rows


def hbm() -> list[dict]:
    """A copy and an element-wise add (the shape of the cost model's memory-bound terms) over 4 GiB tensors:
    bytes read + written."""
    src = torch.empty(2 << 30, dtype=torch.bfloat16, device="cuda")
    other, dst = torch.empty_like(src), torch.empty_like(src)
    rows = []
    for kind, fn, moved in (("hbm copy", lambda: dst.copy_(src), 2), ("hbm add", lambda: torch.add(src, other, out=dst), 3)):
        rows.append({"kind": kind, "shape": {"bytes": moved * src.numel() * src.element_size()},
                     "measured_s": timed(fn, repeat=5)})
    return rows


def host_link() -> list[dict]:
    """A 1 GiB copy to pinned host memory and one back, each way on its own (activation offload's copies)."""
    device = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    host = torch.empty_like(device, device="cpu").pin_memory()
    moves = (("host d2h", lambda: host.copy_(device, non_blocking=True)),
             ("host h2d", lambda: device.copy_(host, non_blocking=True)))
    return [{"kind": kind, "shape": {"bytes": device.numel() * device.element_size()},
             "measured_s": timed(fn, repeat=5)} for kind, fn in moves]


def describe(row: dict) -> str:
    s = row["shape"]
    if row["kind"].startswith(("hbm", "host")):
        return f"{s['bytes'] / 2**30:.0f} GiB moved"
    if row["kind"].startswith("attention"):
        return f"seq {s['seq']} x{s['batch']} {'causal' if s['causal'] else 'full'}"
    return (f"{s['groups']}x" if "groups" in s else "") + f"{s['m']}x{s['n']}x{s['k']}"


def report(rows: list[dict], cluster) -> None:
    print(f"{'kernel':<20} {'shape':<26} {'measured':>10} {'predicted':>10} {'rate meas.':>11} {'rate pred.':>11} "
          f"{'pred/meas':>9}")
    for r in rows:
        want = predicted_seconds(r, cluster)
        flops = row_flops(r)
        work, unit = (flops, 1e12) if flops else (r["shape"]["bytes"], 1e9)
        rates = f"{work / r['measured_s'] / unit:11.0f} {work / want / unit:11.0f}" + (" TF/s" if flops else " GB/s")
        print(f"{r['kind']:<20} {describe(r):<26} {r['measured_s'] * 1e3:8.3f}ms {want * 1e3:8.3f}ms {rates} "
              f"{want / r['measured_s']:9.2f}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cluster", help="the preset to predict with (default: from the GPU's name)")
    p.add_argument("--json", help="also write the measured rows here")
    p.add_argument("--replay", help="a scan written by --json: predict its rows again with today's cost model "
                                    "(no GPU needed)")
    args = p.parse_args()
    if args.replay:
        with open(args.replay) as f:
            scan = json.load(f)
        preset, rows = args.cluster or scan["preset"], scan["rows"]
        print(f"{scan['gpu']} (recorded, torch {scan['torch']}); cost model preset {preset}")
        report(rows, load_cluster(preset))
        return 0
    if torch is None or not torch.cuda.is_available():
        why = "torch is not installed" if torch is None else f"torch {torch.__version__} sees no CUDA GPU"
        print(f"kernel_scan: skipped: {why}; nothing to measure here")
        return 0
    name = torch.cuda.get_device_name(0)
    preset = args.cluster or next((c for key, c in PRESET_BY_NAME if key in name), "h100-80gb")
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = hbm() + host_link() + gemms() + grouped() + attention()
    print(f"{name}, torch {torch.__version__}; cost model preset {preset}")
    report(rows, load_cluster(preset))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": name, "torch": torch.__version__, "preset": preset, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
