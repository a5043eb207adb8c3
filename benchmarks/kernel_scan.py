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
- HBM: a large device-to-device copy (read + write bytes) against the preset's `hbm_bandwidth`.

    PYTHONPATH=src python benchmarks/kernel_scan.py [--cluster h200] [--json out.json]
"""

import argparse
import json
import sys

import torch
import torch.nn.functional as F

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


def timed(fn, repeat: int = 20, warmup: int = 3) -> float:
    """Median seconds of `fn` by CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def _row(kind: str, shape: str, measured_s: float, predicted_s: float, flops: float = 0.0) -> dict:
    return {"kind": kind, "shape": shape, "measured_s": measured_s, "predicted_s": predicted_s,
            "measured_tflops": flops / measured_s / 1e12 if flops else None,
            "predicted_tflops": flops / predicted_s / 1e12 if flops else None,
            "ratio": predicted_s / measured_s}


def gemms(cluster) -> list[dict]:
    rows = []
    fp8 = hasattr(torch, "float8_e4m3fn") and torch.cuda.get_device_capability() >= (8, 9)
    for m, n, k in GEMM_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        t = timed(lambda: a @ b)
        rows.append(_row("gemm bf16", f"{m}x{n}x{k}", t, gemm_seconds(cluster, m, n, k, cluster.peak_flops("bf16")),
                         flops))
        if fp8:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major second operand, as cuBLASLt wants
            one = torch.ones((), device="cuda")
            t = timed(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            rows.append(_row("gemm fp8", f"{m}x{n}x{k}", t,
                             gemm_seconds(cluster, m, n, k, cluster.peak_flops("fp8"), 2, operand_bytes=1), flops))
        del a, b
    return rows


def grouped(cluster) -> list[dict]:
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
        predicted = gemm_seconds(cluster, tokens, f, h, cluster.peak_flops("bf16"), batch=g) / \
            grouped_gemm_efficiency(tokens)
        rows.append(_row("grouped gemm bf16", f"{g}x({tokens}x{f}x{h})", t, predicted, 2.0 * g * tokens * f * h))
    return rows


def attention(cluster) -> list[dict]:
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
                    t = timed(step, repeat=10)
                except RuntimeError as e:
                    print(f"attention {backend.name} seq {seq}: {str(e).splitlines()[0]}", file=sys.stderr)
                    continue
                core = 4.0 * batch * ATTENTION_HEADS * seq * seq * HEAD_DIM / (2 if causal else 1)  # useful fwd
                predicted = attention_seconds(cluster, core, seq, cluster.peak_flops("bf16"), causal)
                rows.append(_row(f"attention {backend.name.split('_')[0].lower()} {'causal' if causal else 'full'}",
                                 f"seq {seq} x{batch}", t, predicted, 3.5 * core))
            del q, k, v, grad
    return rows


def hbm(cluster) -> list[dict]:
    src = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    moved = 2.0 * src.numel()
    t = timed(lambda: dst.copy_(src))
    row = _row("hbm copy", "4 GiB", t, moved / cluster.hbm_bandwidth)
    row["measured_GBps"], row["datasheet_GBps"] = moved / t / 1e9, cluster.hbm_bandwidth / 1e9
    return [row]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cluster", help="the preset to predict with (default: from the GPU's name)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print(f"kernel_scan: skipped: torch {torch.__version__} sees no CUDA GPU; nothing to measure here")
        return 0
    name = torch.cuda.get_device_name(0)
    preset = args.cluster or next((c for key, c in PRESET_BY_NAME if key in name), "h100-80gb")
    cluster = load_cluster(preset)
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = hbm(cluster) + gemms(cluster) + grouped(cluster) + attention(cluster)
    print(f"{name}, torch {torch.__version__}; cost model preset {preset}")
    print(f"{'kernel':<26} {'shape':<24} {'measured':>10} {'predicted':>10} {'TFLOP/s meas.':>14} "
          f"{'TFLOP/s pred.':>14} {'pred/meas':>9}")
    for r in rows:
        tf = (f"{r['measured_tflops']:14.1f} {r['predicted_tflops']:14.1f}" if r["measured_tflops"]
              else f"{r['measured_GBps']:11.0f} GB/s {r['datasheet_GBps']:9.0f} GB/s")
        print(f"{r['kind']:<26} {r['shape']:<24} {r['measured_s'] * 1e3:8.3f}ms {r['predicted_s'] * 1e3:8.3f}ms "
              f"{tf} {r['ratio']:9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": name, "torch": torch.__version__, "preset": preset, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
