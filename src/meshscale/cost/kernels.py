"""Kernel times from shapes: each GEMM of a layer, the attention core, and the memory-bound rest.

A GEMM C[m,n] = A[m,k] B[k,n] is the slower of its compute and its memory traffic (the roofline, Williams et
al. 2009). Compute follows how GEMM kernels run (NVIDIA "Matrix Multiplication Background" user guide; Anthony
et al. 2024, arXiv:2401.14489, sec. 4): the output is cut into tiles, a tile pays k plus a fixed prologue and
epilogue, and tiles run in waves over the streaming multiprocessors, so a last partial wave idles the rest
(wave quantization) and a dimension not a multiple of the tile computes padding (tile quantization); cuBLAS
chooses among tile sizes to limit both (we offer the full and a half-width tile). The
ceiling is the best GEMM's measured fraction of peak (`ClusterSpec.matmul_efficiency`). Small and skinny
GEMMs (small hidden sizes, a TP- or EP-sharded matrix, few tokens per expert) therefore reach less of the peak,
and never more than the ceiling.

`microbatch_seconds` gives one micro-batch's forward, input-gradient and weight-gradient time (the F, B, W of
the pipeline schedules) through a rank's layers; `step.rank_passes` adds the rank's element-wise work.
"""

import math
from dataclasses import dataclass
from functools import lru_cache

from meshscale.cost import flops
from meshscale.cost.memory import PRECISIONS, adapter_widths
from meshscale.errors import UserError
from meshscale.specs.cluster import ClusterSpec, Software, is_fp8, is_quantized
from meshscale.specs.layout import Layout, kv_heads_per_rank
from meshscale.specs.model import ModelSpec

FLASH_BLOCK = 128  # query/key block of FlashAttention-2/3 kernels (Dao 2023, sec. 3.1)
# The blocks TPU flash kernels skip above the diagonal: MaxText's Pallas flash BlockSizes (layers/attentions.py at
# 76bd53b0, 2023-12: block_q = block_k_major = 512) and its splash kernel's (configs/base.yml: sa_block_* 512)
TPU_FLASH_BLOCK = 512


@lru_cache(maxsize=65536)
def gemm_seconds(cluster: ClusterSpec, m: float, n: float, k: float, peak: float, dtype_bytes: int = 2,
                 batch: int = 1, operand_bytes: int = 0) -> float:
    """`batch` independent (m x k) @ (k x n) GEMMs in one launch (a batched or grouped GEMM): inputs of
    `operand_bytes` (0: `dtype_bytes`; 1 for FP8), output of `dtype_bytes`. The kernels stage k in slices of
    128 bytes (CUTLASS's Hopper tiles: 64 of bf16, 128 of FP8 in examples/54_hopper_fp8_warp_specialized_gemm,
    32 of fp32 in 48_hopper_warp_specialized_gemm), so the pipeline prologue a tile pays, `gemm_k_overhead` of
    bf16, is twice the k for FP8 operands: against DeepGEMM's FP8 scan (README 55ab91f, M=4096) the bf16
    prologue predicts K=512 29% fast, the FP8 one 8% fast. Each launch pays a fixed `gemm_kernel_overhead_s`
    on top (pipeline fill, epilogue drain, launch on the device), which tiles and waves leave out."""
    operand_bytes = operand_bytes or dtype_bytes
    if min(m, n, k) <= 0:
        return 0.0
    measured = nearest(cluster.gemm_rates, (m, n, k)) if measured_precision(cluster, operand_bytes) else 0.0
    if measured:  # a calibrated machine: its own GEMM rate at the nearest measured shape and precision
        return batch * 2.0 * m * n * k / measured
    rate = peak * cluster.matmul_efficiency
    tm, tn = cluster.gemm_tile

    def compute(rows, cols, tn):
        tiles = batch * math.ceil(rows / tm) * math.ceil(cols / tn)
        if cluster.compute_units:  # waves: every wave costs a tile on each unit, busy or not
            tiles = math.ceil(tiles / cluster.compute_units) * cluster.compute_units
        prologue = cluster.gemm_k_overhead * 2 / operand_bytes
        return tiles * 2.0 * tm * tn * (k + prologue) / rate  # a tile pays its prologue too

    # The library picks the orientation, and on GPUs a half-width tile when it fills the waves better.
    widths = {tn, max(tm, tn // 2)} if cluster.compute_units else {tn}
    best = min(compute(r, c, w) for r, c in ((m, n), (n, m)) for w in widths)
    traffic = batch * (operand_bytes * (m * k + k * n) + dtype_bytes * m * n) / cluster.achieved_hbm_bandwidth
    return max(best, traffic) + cluster.gemm_kernel_overhead_s


def nearest(rows: tuple, shape: tuple) -> float:
    """The rate (last column) of the measured row (`meshscale calibrate`) whose shape is nearest `shape` in log
    distance; 0 when nothing was measured. The rows span transformer GEMM and attention shapes; between them
    the nearest measurement stands in for a curve."""
    if not rows:
        return 0.0
    near = min(rows, key=lambda r: sum(abs(math.log(a / b)) for a, b in zip(r[:-1], shape)))
    return near[-1]


def measured_precision(cluster: ClusterSpec, dtype_bytes: int) -> bool:
    """Whether a kernel on `dtype_bytes` operands runs at the precision the cluster's rates were measured in."""
    return PRECISIONS[cluster.rates_precision]["compute"] == dtype_bytes


def gemm_efficiency(cluster: ClusterSpec, m: float, n: float, k: float, peak: float) -> float:
    """Achieved fraction of `peak` for one GEMM."""
    return 2.0 * m * n * k / gemm_seconds(cluster, m, n, k, peak) / peak


# Fused attention throughput against the kernel's sequence length, head_dim 128, TFLOP/s as the papers count
# them (4 s^2 d heads forward, halved when causal; the backward 2.5x the forward's):
# Ampere: FlashAttention-2 on A100 80GB, forward + backward (Dao 2023, arXiv:2307.08691, fig. 4b and 4d, the
# repository's assets/flash2_a100_fwd_bwd_benchmark.png): (seq, not causal, causal). The legend hides fig. 4b's
# labels at 512 and 1k: read from the bars' heights against the axis (151, 173).
FA2_A100 = ((512, 151, 99), (1024, 173, 133), (2048, 187, 155), (4096, 196, 173), (8192, 201, 182),
            (16384, 203, 189))
# Hopper: cuDNN on H100 SXM5, the kernel Transformer Engine (Megatron-Core, NeMo) runs there, measured beside
# FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608, figs. 5c, 5d and 6b; within 10% of FA3's from 1k):
# (seq, forward not causal, forward causal, backward not causal). The paper has no causal backward: we take
# the backward's causal/non-causal ratio as the forward's at the same length (the same masked diagonal blocks).
CUDNN_H100 = ((512, 482, 315, 305), (1024, 574, 410, 408), (2048, 617, 484, 465), (4096, 609, 518, 499),
              (8192, 600, 529, 518), (16384, 595, 539, 516))
# Head dimension 64, the same figures' other panels (the papers count FLOPs in proportion to the head dimension,
# so the rates compare per FLOP): FlashAttention-2 on A100 (Dao 2023 fig. 4a and 4c; the legend hides 4a's 1k
# label: 153 from the bar), and cuDNN on H100 (Shah et al. 2024 figs. 5a, 5b and 6a).
FA2_A100_D64 = ((512, 132, 88), (1024, 153, 119), (2048, 162, 140), (4096, 171, 156), (8192, 175, 165),
                (16384, 176, 171))
CUDNN_H100_D64 = ((512, 335, 225, 266), (1024, 373, 288, 348), (2048, 395, 334, 395), (4096, 408, 363, 417),
                  (8192, 412, 379, 432), (16384, 413, 388, 433))


def _forward_backward(forward: float, backward: float) -> float:
    """Rate of a forward and its backward of 2.5x the FLOPs, from each one's rate."""
    return 3.5 / (1 / forward + 2.5 / backward)


def _cudnn_rates(table: tuple) -> tuple:
    """(seq, not causal, causal) forward + backward rates of a cuDNN table (seq, forward not causal, forward
    causal, backward not causal); the causal backward at the forward's causal/non-causal ratio."""
    return tuple((s, _forward_backward(fn, bn), _forward_backward(fc, bn * fc / fn)) for s, fn, fc, bn in table)


# (seq, non-causal, causal) forward + backward rate, as a fraction of its long causal rate (the last row's),
# by GPU architecture; newer GPUs without a published scan take Hopper's shape.
ATTENTION_SHAPES = {
    "ampere": tuple((s, nc / FA2_A100[-1][2], c / FA2_A100[-1][2]) for s, nc, c in FA2_A100),
    "hopper": _cudnn_rates(CUDNN_H100),
}


# Fused attention kernels a framework may run in place of its platform's (the presets' rates: FlashAttention-2 on
# Ampere, cuDNN on Hopper and later), forward + backward, head_dim 128, (seq, not causal, causal) TFLOP/s:
# - FlashAttention-2 on H100 SXM5 as benchmarks/kernel_scan.py measured it on this workplace's H100 (2026-11-28,
#   benchmarks/data/kernel_scan_h100.json: torch 2.11's SDPA flash back end, FlashAttention-2's kernels, 32 heads
#   of 128, 32k tokens a call, run back to back like the scan's GEMMs, which sustain 0.85 of their burst MAMF):
#   a sustained rate. Dao 2023's fig. 7 (assets/flash2_h100_fwd_bwd_benchmark.png) is a short burst's; the scan
#   keeps 0.93-0.95 of it from 4k (where its GEMMs keep 0.85 of their MAMF), 0.66-0.84 at 512-2k;
# - "FlashAttention Triton" beside FlashAttention-2 in one A100 80GB measurement (assets/flash2_a100_fwd_bwd_
#   benchmark.png, figs. b and d, FA2_A100's figure): (seq, not causal, causal), the stand-in for the 2022 Triton
#   kernel llm-foundry's `attn_impl: triton` copied (HazyResearch's flash_attn_triton.py on the pre-MLIR triton
#   2.0.0.dev20221202), which no scan measures. Those bars are OpenAI's MLIR tutorial kernel (the repository's
#   benchmark_flash_attention.py imports triton.ops.flash_attention); the kernel's own docstring measures it
#   against FlashAttention v1 ("slightly slower" overall), whose bars in the same figures sit within 2-10% of
#   these on A100 and at 0.41-0.49 of FlashAttention-2 from 1k to 16k on H100 (Dao 2023 fig. 7), where this
#   table's share, kept on Hopper (its compiler emits the same Ampere instructions there), is 0.42-0.46.
FA2_H100 = ((512, 174.4, 107.8), (1024, 233.2, 162.4), (2048, 256.9, 222.8), (4096, 302.5, 264.3),
            (8192, 317.0, 286.9), (16384, 321.4, 306.7))
FA_TRITON_A100 = ((512, 78, 50), (1024, 85, 61), (2048, 90, 68), (4096, 93, 74), (8192, 95, 78), (16384, 95, 80))
FA_TRITON_A100_D64 = ((512, 90, 59), (1024, 102, 75), (2048, 98, 79), (4096, 98, 76), (8192, 100, 79),
                      (16384, 100, 80))  # head dim 64: the same figure's panels a and c
# FlashAttention-2 on H100 at head dims 64 and 128 (Dao 2023 fig. 7, assets/flash2_h100_fwd_bwd_benchmark.png): a
# burst's rates, so only their ratio is taken, onto the sustained FA2_H100.
FA2_H100_D64 = ((512, 215, 141), (1024, 254, 192), (2048, 274, 232), (4096, 288, 257), (8192, 294, 273),
                (16384, 296, 284))
FA2_H100_D128 = ((512, 248, 163), (1024, 294, 221), (2048, 320, 265), (4096, 326, 294), (8192, 335, 308),
                 (16384, 338, 328))
# FlashAttention (v1, flash-attn 1.x; Transformer Engine before 1.0 ran it from Ampere on) beside FlashAttention-2 in
# the same figures, head dims 128 and 64 (Dao 2023 figs. 4 and 7, the "FlashAttention" bars of assets/flash2_a100_
# fwd_bwd_benchmark.png and flash2_h100_fwd_bwd_benchmark.png): only its ratio to FlashAttention-2's bars is taken,
# onto FlashAttention-2's rate. On H100 it runs its Ampere kernels, 0.40-0.44 as fast from 2k, 0.43-0.60 below.
FA1_A100 = ((512, 76, 55), (1024, 72, 62), (2048, 76, 69), (4096, 80, 76), (8192, 82, 80), (16384, 83, 83))
FA1_A100_D64 = ((512, 91, 58), (1024, 92, 70), (2048, 104, 77), (4096, 108, 87), (8192, 110, 92),
                (16384, 110, 97))
FA1_H100 = ((512, 127, 98), (1024, 127, 109), (2048, 128, 108), (4096, 131, 126), (8192, 137, 135),
            (16384, 139, 137))
FA1_H100_D64 = ((512, 157, 104), (1024, 159, 123), (2048, 161, 136), (4096, 161, 138), (8192, 166, 149),
                (16384, 168, 156))
# Larger heads on Hopper, as benchmarks/kernel_scan.py measured them on this workplace's H200 (2026-11-29,
# benchmarks/data/kernel_scan_h200_2026-11-29.json: torch 2.11's SDPA, cuDNN 9.19 and the flash back end, 32k tokens
# a call of a 4,096-wide layer's heads, forward + backward TFLOP/s counted as the papers do, 2 s^2 (d_qk + d_v) a
# head forward): (seq, not causal, causal) at (query-key, value) head dims 128, DeepSeek's MLA (192, 128), 192 and
# 256. Only each table's ratio to the same scan's 128 is taken (cuDNN 9.19 runs 128 faster than CUDNN_H100's).
# FlashAttention-2 has no kernel for a value dim unlike the query's: frameworks pad the values to it.
SCAN_CUDNN_H200 = {
    (128, 128): ((512, 327.0, 194.9), (1024, 438.1, 301.7), (2048, 510.6, 399.3), (4096, 526.1, 464.1),
                 (8192, 551.9, 500.7), (16384, 559.9, 531.2)),
    (192, 128): ((512, 230.8, 178.6), (1024, 288.0, 274.9), (2048, 325.1, 370.5), (4096, 348.1, 410.1),
                 (8192, 357.6, 452.3), (16384, 358.6, 485.3)),
    (192, 192): ((512, 231.9, 158.9), (1024, 296.7, 231.7), (2048, 346.2, 292.7), (4096, 379.9, 339.3),
                 (8192, 392.7, 365.4), (16384, 361.7, 363.5)),
    (256, 256): ((512, 255.5, 174.6), (1024, 330.8, 256.2), (2048, 385.0, 335.1), (4096, 422.8, 399.0),
                 (8192, 410.1, 411.7), (16384, 412.8, 422.1))}
SCAN_FA2_H200 = {
    (128, 128): ((512, 184.9, 117.4), (1024, 240.4, 176.0), (2048, 280.9, 231.2), (4096, 304.2, 270.6),
                 (8192, 317.1, 297.2), (16384, 322.3, 314.0)),
    (192, 192): ((512, 167.4, 114.6), (1024, 211.9, 163.3), (2048, 245.0, 209.4), (4096, 264.9, 243.7),
                 (8192, 275.0, 267.0), (16384, 280.1, 277.2)),
    (256, 256): ((512, 173.1, 115.4), (1024, 215.0, 163.5), (2048, 246.5, 207.4), (4096, 263.5, 237.6),
                 (8192, 272.9, 257.2), (16384, 277.6, 268.0))}


# FP8 attention (Transformer Engine's fp8_dpa, [software] fp8_attention) against bf16 on the same GPU and harness:
# cudnn-frontend's benchmark/sdpa_benchmark_training, results/h200_919_only_cudnn and gb200_919_only_cudnn
# (llama3.1_*.csv, 2026-02: cuDNN 9.19, batch 1, 64 query and 8 key-value heads of 128), milliseconds:
# (seq, causal forward bf16, fp8, backward bf16, fp8, not causal forward bf16, fp8, backward bf16, fp8).
# FP8's forward is 1.4-1.5x bf16's on H200 and 1.2-1.3x on GB200; its causal backward on H200 slows from 8k on
# (6.39 ms against 5.08 at 8k: near its unmasked time, as if the masked blocks were computed), where GB200's
# gains 7-16%. Only these ratios are taken, onto the kernels' bf16 rates; the casts into FP8 are not counted.
FP8_ATTENTION_H200 = ((2048, 0.142, 0.098, 0.464, 0.437, 0.217, 0.158, 0.681, 0.647),
                      (4096, 0.465, 0.322, 1.450, 1.459, 0.819, 0.565, 2.453, 2.285),
                      (8192, 1.708, 1.141, 5.083, 6.392, 3.182, 2.149, 9.262, 8.637),
                      (16384, 6.531, 4.357, 19.002, 29.422, 12.524, 8.335, 35.947, 33.355),
                      (32768, 25.566, 16.884, 75.688, 118.729, 50.769, 33.120, 153.841, 130.528))
FP8_ATTENTION_GB200 = ((2048, 0.066, 0.053, 0.206, 0.192, 0.110, 0.085, 0.315, 0.287),
                       (4096, 0.206, 0.161, 0.607, 0.559, 0.345, 0.276, 1.068, 0.938),
                       (8192, 0.688, 0.553, 2.097, 1.860, 1.286, 1.050, 3.901, 3.372),
                       (16384, 2.606, 2.060, 7.845, 6.764, 4.972, 4.001, 15.111, 12.683),
                       (32768, 10.226, 7.960, 29.863, 25.803, 19.759, 15.848, 58.606, 49.473))
FP8_ATTENTION = {"hopper": FP8_ATTENTION_H200, "blackwell": FP8_ATTENTION_GB200}


def fp8_attention_speed(arch: str, seq: float, causal: bool) -> tuple[float, float]:
    """(forward, backward) speed of FP8 attention over bf16 at length `seq` (FP8_ATTENTION): log-linear between the
    measured lengths, flat beyond them."""
    col = 1 if causal else 5
    speeds = tuple((r[0], r[col] / r[col + 1], r[col + 2] / r[col + 3]) for r in FP8_ATTENTION[arch])
    forward, backward = _loglinear(speeds, seq)
    return forward, backward


def _against_128(tables: dict) -> dict:
    """A scan's tables by head dims as (that table, the same scan's 128 table): what `head_dim_speed` divides."""
    return {dims: (rates, tables[128, 128]) for dims, rates in tables.items() if dims != (128, 128)}


# Each kernel's measured (query-key, value) head dims: (their forward + backward rates, the same source's at 128),
# (seq, not causal, causal). Blackwell's kernels take Hopper's, as they take its shape.
HEAD_DIM_TABLES = {
    ("ampere", "platform"): {(64, 64): (FA2_A100_D64, FA2_A100)},
    ("ampere", "fa2"): {(64, 64): (FA2_A100_D64, FA2_A100)},
    ("hopper", "platform"): {(64, 64): (_cudnn_rates(CUDNN_H100_D64), _cudnn_rates(CUDNN_H100)),
                             **_against_128(SCAN_CUDNN_H200)},
    ("hopper", "fa2"): {(64, 64): (FA2_H100_D64, FA2_H100_D128), **_against_128(SCAN_FA2_H200)},
    ("ampere", "fa-triton"): {(64, 64): (FA_TRITON_A100_D64, FA_TRITON_A100)},
    ("hopper", "fa-triton"): {(64, 64): (FA_TRITON_A100_D64, FA_TRITON_A100)},
    ("ampere", "fa1"): {(64, 64): (FA1_A100_D64, FA1_A100)},
    ("hopper", "fa1"): {(64, 64): (FA1_H100_D64, FA1_H100)}}
# FlashAttention-2 has no Blackwell kernels and runs its Ampere ones there: Azure's AI-benchmarking-guide ran
# flash-attention's benchmark_flash_attention.py (its first seq-8192 case: not causal, batch 2) on both and
# measured 373.9 TFLOP/s on GB200 (Azure_Results/ND_GB200_v6_results.md) and 327.9 on H100 (ND_H100_v5): 1.140x,
# where the presets' platform kernels (cuDNN) differ by 0.378 x 2500 / (0.434 x 989) = 2.202x.
FA2_BLACKWELL = 1.140 / 2.202
# Hopper's attention_efficiency is cuDNN's CUDNN_H100 rate (at the peak's 1830 MHz) times H100's sustained/burst
# GEMM ratio, MSMF 702.9 / MAMF 794.5 (specs/cluster.py): a rate measured sustained is taken against that.
HOPPER_SUSTAINED = 702.9 / 794.5


def _loglinear(rows: tuple, seq: float, extend_below: bool = False) -> tuple:
    """A table's columns at `seq`: log-linear between its lengths, flat above them; below them flat, or
    (extend_below) along its first segment's slope."""
    if seq >= rows[-1][0]:
        return tuple(rows[-1][1:])
    if not extend_below:
        seq = max(seq, rows[0][0])
    i = max(0, next(i for i, r in enumerate(rows) if r[0] > seq) - 1)
    (s0, *a), (s1, *b) = rows[i], rows[i + 1]
    t = math.log(seq / s0) / math.log(s1 / s0)
    return tuple(x + (y - x) * t for x, y in zip(a, b))


def kernel_speed(arch: str, kernel: str, seq: float, causal: bool) -> float:
    """The [software] attention_kernel's rate over the platform's at `seq`: FlashAttention-2's sustained rate
    over cuDNN's off Ampere (Blackwell: Hopper's, times FA2_BLACKWELL), times the Triton kernel's or
    FlashAttention v1's over FlashAttention-2's."""
    speed, col = 1.0, 1 if causal else 0  # the tables' columns: (not causal, causal)
    if kernel == "fa-triton":
        speed *= _loglinear(FA_TRITON_A100, seq)[col] / _loglinear(FA2_A100, seq)[col]
    if kernel == "fa1":
        v1, v2 = (FA1_A100, FA2_A100) if arch == "ampere" else (FA1_H100, FA2_H100_D128)
        speed *= _loglinear(v1, seq)[col] / _loglinear(v2, seq)[col]
    if kernel != "platform" and arch != "ampere":
        cudnn = _loglinear(ATTENTION_SHAPES["hopper"], seq)[col] * HOPPER_SUSTAINED
        speed *= _loglinear(FA2_H100, seq)[col] / cudnn * (FA2_BLACKWELL if arch == "blackwell" else 1.0)
    return speed


def head_dim_speed(arch: str, kernel: str, seq: float, causal: bool, head_dim: int, v_head_dim: int = 0) -> float:
    """The kernel's rate at (query-key) `head_dim` and `v_head_dim` (0: the same) over its rate at 128 at this
    length, from its measured head dims (HEAD_DIM_TABLES): a measured pair's own ratio; otherwise geometric in the
    head dim between the measured equal pairs on either side (128 at 1), flat beyond them. At 64, a tile's softmax
    and bookkeeping are paid over half the FLOPs (cuDNN 0.79-0.86, FlashAttention-2 0.86-0.91; the Triton kernel
    1.00-1.23); above 128 Hopper's run 0.65-0.98 as fast (cuDNN at 192 0.65-0.82, at 256 0.74-0.90, MLA's 192/128
    0.88-0.93 causal and 0.64-0.71 not; FlashAttention-2 0.85-0.98). FlashAttention's kernels, without a value
    dim of their own, pad the values to the query's: the useful share of their work."""
    v_head_dim = v_head_dim or head_dim
    tables = HEAD_DIM_TABLES.get(("ampere" if arch == "ampere" else "hopper", kernel), {})
    col = 1 if causal else 0

    def ratio(dims: tuple) -> float:
        measured, base = tables[dims]
        return _loglinear(measured, seq)[col] / _loglinear(base, seq)[col]

    if (head_dim, v_head_dim) in tables:
        return ratio((head_dim, v_head_dim))
    points = sorted([(128, 1.0)] + [(q, ratio((q, v))) for q, v in tables if q == v])
    below = [p for p in points if p[0] <= head_dim] or points[:1]
    above = [p for p in points if p[0] >= head_dim] or points[-1:]
    (d0, r0), (d1, r1) = below[-1], above[0]
    t = math.log(head_dim / d0) / math.log(d1 / d0) if d1 != d0 else 0.0
    pads = v_head_dim < head_dim and (kernel != "platform" or arch == "ampere")
    return r0 ** (1 - t) * r1 ** t * ((head_dim + v_head_dim) / (2 * head_dim) if pads else 1.0)


def attention_shape(arch: str, seq: float, causal: bool, kernel: str = "platform", head_dim: int = 128,
                    v_head_dim: int = 0) -> float:
    """A fused kernel's rate at sequence length `seq` over the platform kernel's rate at long causal sequences
    of head dim 128: log-linear between the measured lengths, the 512-1k slope continued below 512 (per-tile
    prologues and epilogues amortised over fewer key blocks; never below a tenth), flat above 16k; times
    `kernel_speed` and `head_dim_speed`."""
    rows = ATTENTION_SHAPES.get(arch, ATTENTION_SHAPES["hopper"])
    top = rows[-1][2]
    rate = _loglinear(rows, seq, extend_below=True)[1 if causal else 0]
    speed = kernel_speed(arch, kernel, seq, causal) * head_dim_speed(arch, kernel, seq, causal, head_dim, v_head_dim)
    return speed * max(0.1 * top, rate) / top


def attention_seconds(cluster: ClusterSpec, core_flops: float, seq: int, peak: float, causal: bool = True,
                      cp: int = 1, head_dim: int = 128, v_head_dim: int = 0) -> float:
    """Forward + backward of a fused attention kernel doing `core_flops` of (useful) forward work over sequences
    of `seq`, split over `cp` ranks. GPUs: `attention_efficiency` is the kernel's rate at long causal sequences
    of head dim 128; shorter ones, and smaller heads, run slower as the published scans measure
    (`attention_shape`). Under context parallelism each rank runs, ring step by ring step (Megatron-Core/
    Transformer Engine's load-balanced ring: two chunks of seq/2cp a rank), one causal kernel over its own 2
    chunks (1/cp of the work) and cp-1 non-causal ones of 2 chunks of queries by one of keys or the reverse
    (length taken as their geometric mean); without a causal mask, cp non-causal ones of 2 chunks by 2. Without a
    measured shape (TPUs): the matmul ceiling, with the causal diagonal blocks computed in full, nb(nb+1)/2 blocks
    for nb^2/2 of useful work (blocks of 512 on TPUs, 128 elsewhere)."""
    eff = min(cluster.attention_efficiency or cluster.matmul_efficiency, cluster.matmul_efficiency)
    if not (cluster.attention_efficiency and cluster.compute_units):
        blocks = max(1.0, seq / cp / (TPU_FLASH_BLOCK if cluster.torus else FLASH_BLOCK))
        diagonal = blocks / (blocks + 1) if causal else 1.0
        return 3.5 * core_flops / (peak * eff * diagonal)
    arch, kernel = cluster.gpu_arch, cluster.software.attention_kernel
    if cp == 1:
        return 3.5 * core_flops / (peak * eff * attention_shape(arch, seq, causal, kernel, head_dim, v_head_dim))
    chunk = seq / (2 * cp)
    own = attention_shape(arch, 2 * chunk, causal, kernel, head_dim, v_head_dim)
    ring = attention_shape(arch, chunk * (math.sqrt(2) if causal else 2), False, kernel, head_dim, v_head_dim)
    return 3.5 * core_flops / (peak * eff) * (1 / cp / own + (cp - 1) / cp / ring)


def ring_merge_seconds(cluster: ClusterSpec, queries: float, keys: float, cp: int) -> tuple[float, float]:
    """(forward, backward) memory traffic of ring attention's merging, `queries` and `keys` elements
    (tokens x heads x head_dim) on a rank: Transformer Engine's AttnFuncWithCPAndKVP2P (2024) adds each ring
    step's bf16 output, rescaled by exp(lse_step - lse), into an fp32 output (flash_attn_fwd_out_correction:
    read 2 + 4, write 4 bytes an element), and in backward accumulates dq in fp32 and the travelling dk, dv in
    fp32 (read and write 4 bytes each), every step but the first."""
    steps, bandwidth = cp - 1, cluster.achieved_hbm_bandwidth
    return steps * 10 * queries / bandwidth, steps * 8 * (queries + 2 * keys) / bandwidth


@dataclass(frozen=True)
class Gemm:
    m: float
    n: float
    k: float
    batch: int = 1
    grouped: bool = False  # MoE experts' grouped GEMM: `batch` groups of `m` tokens each
    weight_grad: bool = True  # False: its k x n operand takes no gradient (GShard's dispatch mask)


# A grouped GEMM's throughput beyond what tiles and waves (gemm_seconds) explain, by tokens (M) per group:
# DeepGEMM's published H800 scan (README at 55ab91f, 2025-03-25; grouped masked 256/512/1024 and contiguous
# 4096-8192 tokens per group, each against its normal GEMM of M=4096 and the same N x K, 4096 x 7168 and
# 7168 x 2048): the measured grouped/dense ratio divided by gemm_seconds' own ratio for those shapes (so its
# quantization is not counted twice), the mean of the two shapes. Every group's short M-extent re-loads its
# expert's weights and restarts the kernel's pipeline; below 256 the tile model's quantization takes over.
# Since gemm_seconds charges each launch a fixed time (and memory at the achieved HBM rate), its own grouped/
# dense ratio for the masked kernels (1,024 tokens in all) fell 1.088x and 1.132x for the two shapes (h100-80gb,
# FP8): the table written before, 0.77, 0.86, 0.94, was multiplied by their mean, 1.11, and held at 1.
GROUPED_GEMM_EFFICIENCY = ((256, 0.86), (512, 0.95), (1024, 1.0), (4096, 1.0))
# DeepGEMM's kernels are FP8. A bf16 grouped GEMM's forward, by the same reading of benchmarks/kernel_scan.py's
# torch._grouped_mm (CUTLASS) rows, the median over the expert matrices of all three recorded scans (one H100, two
# H200s): 0.79 at 128 tokens a group (0.70-0.93), then a dense GEMM's throughput, 0.97-1.02 from 256 to 4,096.
GROUPED_BF16_EFFICIENCY = ((128, 0.79), (256, 1.0), (4096, 1.0))
# The weight gradient of a grouped GEMM, whose reduction dimension K is a group's tokens, against what
# gemm_seconds charges that shape: benchmarks/kernel_scan.py on one H200 (torch._grouped_mm's CUTLASS kernels,
# benchmarks/data/kernel_scan_h200.json), the mean over six expert matrices of Mixtral 8x7B, Qwen3-235B-A22B and
# DeepSeek-V3 (0.62-0.84 at 128 tokens, 0.88-0.99 at 1,024). With few K steps a tile's epilogue, writing its
# whole K-independent output, is not hidden behind its main loop.
GROUPED_WGRAD_EFFICIENCY = ((128, 0.68), (256, 0.78), (512, 0.87), (1024, 0.93), (4096, 0.93))


def grouped_gemm_efficiency(tokens_per_group: float, points: tuple = GROUPED_GEMM_EFFICIENCY) -> float:
    """Throughput of a grouped GEMM relative to a dense one of the same shape, log-interpolated in its tokens
    per group (M; K for the weight gradient, with GROUPED_WGRAD_EFFICIENCY)."""
    if tokens_per_group <= points[0][0]:
        return points[0][1]
    for (m0, e0), (m1, e1) in zip(points, points[1:]):
        if tokens_per_group <= m1:
            return e0 + (e1 - e0) * math.log(tokens_per_group / m0) / math.log(m1 / m0)
    return 1.0


def layer_gemms(model: ModelSpec, layer: int, layout: Layout, tokens: float, sw: Software | None = None) -> tuple:
    """The forward GEMMs of one layer on one rank for a micro-batch of `tokens` (after CP), as Megatron shards
    them: QKV and the first MLP matrix (gate and up fused) split their outputs over TP, the output projection
    and the down projection their inputs. MoE: the rank's experts (experts/ep, each split etp ways, column then
    row parallel) each see top_k*tokens*ep*etp/(tp*experts) tokens (balanced routing: the rank's arrivals,
    gathered over ETP, of the tokens each TP rank dispatches, Layout.dispatch_split; Megatron-Core's
    all-to-all dispatcher, Liu et al. 2025 sec. 3), times their load under `sw` (`expert_load`: the capacity
    their buffers are padded to, or the busiest EP rank's imbalance), as one grouped GEMM; shared experts
    see every token, split over TP. Under GShard's einsum dispatcher each sequence's tokens go into and out of the
    experts' buffers by two more GEMMs against one-hot masks (`einsum_dispatch`)."""
    return sum(layer_gemm_parts(model, layer, layout, tokens, sw).values(), ())


def layer_gemm_parts(model: ModelSpec, layer: int, layout: Layout, tokens: float, sw: Software | None = None) -> dict:
    """`layer_gemms` by the part that runs them (specs.cluster.INT8_PARTS): attention (the q, k and v projections;
    MLA's all), attention_out (the output projection), mlp (a dense layer's), and a MoE layer's router, experts (with
    an einsum dispatcher's mask GEMMs, which AQT quantizes alike) and shared_experts."""
    t, h = layout.tp, model.hidden
    attn: dict
    if model.uses_mla:  # low-rank projections, the output's included: one GEMM of the same FLOPs
        attn = {"attention": (Gemm(tokens, model.attention_params() / h / t, h),)}
    else:
        q = model.heads * model.head_dim
        kv = kv_heads_per_rank(model.kv_heads, t) * model.head_dim  # a whole copy when tp > kv_heads
        attn = {"attention": (Gemm(tokens, q / t + 2 * kv, h),), "attention_out": (Gemm(tokens, h, q / t),)}
    up = model.mlp_matrices - 1  # gate + up, or up alone
    if not model.is_moe_layer(layer):
        return {**attn, "mlp": (Gemm(tokens, up * model.ffn / t, h), Gemm(tokens, h, model.ffn / t))}
    local = max(1, model.experts // layout.ep)
    load = expert_load(model, sw, layout.ep) if sw else 1.0
    routed = tokens * model.top_k * layout.ep * layout.expert_tp / (t * model.experts) * load
    e, f = model.expert_ffn / layout.expert_tp, model.expert_ffn / t * model.shared_experts
    shared = (Gemm(tokens, up * f, h), Gemm(tokens, h, f)) if model.shared_experts else ()
    experts = (Gemm(routed, up * e, h, local, True), Gemm(routed, h, e, local, True))
    if sw and sw.moe_dispatcher == "einsum":
        experts += einsum_dispatch(model, layout, tokens)
    return {**attn, "router": (Gemm(tokens, model.experts, h),), "experts": experts, "shared_experts": shared}


def expert_load(model: ModelSpec, sw: Software, ep: int) -> float:
    """Tokens a rank's experts compute, and its all-to-alls move, over the balanced share: under GShard's einsum
    dispatcher the whole buffers, the model's capacity_factor; otherwise the busiest expert-parallel rank's
    [software] moe_imbalance (none without EP), no more than the capacity where routing drops beyond one."""
    if sw.moe_dispatcher == "einsum":
        return model.capacity_factor
    load = sw.moe_imbalance if ep > 1 else 1.0
    return min(load, model.capacity_factor) if model.capacity_factor else load


def check_kernels(model: ModelSpec, cluster: ClusterSpec) -> None:
    """[software] kernel choices the model or the cluster cannot take, in one line: FP8 attention where no scan
    measured it (FP8_ATTENTION), GShard's einsum dispatch for a MoE model without a capacity to fill."""
    if cluster.software.fp8_attention and cluster.gpu_arch not in FP8_ATTENTION:
        raise UserError(f"cluster {cluster.name}: no FP8 attention data (cuDNN's FP8 attention is measured on Hopper "
                        f"and Blackwell, not {cluster.accelerator}); drop [software] fp8_attention")
    if model.is_moe and cluster.software.moe_dispatcher == "einsum" and not model.capacity_factor:
        raise UserError(f"cluster {cluster.name}: [software] moe_dispatcher = \"einsum\" fills each expert's buffer "
                        f"to a capacity, and model {model.name} has none: give it a capacity_factor (MaxText's, e.g. "
                        "1.25) or use moe_dispatcher = \"alltoall\"")


def capacity_slots(model: ModelSpec) -> float:
    """Experts x capacity of one sequence's buffers: capacity_factor x its top_k copies of every token."""
    return model.capacity_factor * model.top_k * model.seq


def einsum_dispatch(model: ModelSpec, layout: Layout, tokens: float) -> tuple:
    """GShard's dispatch and combine (Lepikhin et al. 2020 sec. 2.2; MaxText's dense_matmul with a capacity
    factor): per sequence of s tokens, an [experts x capacity, s] one-hot dispatch mask times its [s, hidden]
    tokens ("BSM,BSEC->EBCM"), and back through the combine mask ("EBCM,BSEC->BSM"), an expert's capacity the
    model's capacity_factor x its balanced share of the s x top_k copies: each 2 s hidden (capacity_factor top_k s)
    FLOPs a sequence, as dense as any GEMM. The dispatch mask takes no gradient, the combine mask (router
    probabilities) does. Split over TP along hidden, over CP along the sequence's own s."""
    slots = capacity_slots(model)
    s = model.seq / layout.cp  # this rank's part of each sequence
    sequences = max(1, round(tokens / s))
    h = model.hidden / layout.tp
    return Gemm(slots, h, s, sequences, weight_grad=False), Gemm(s, h, slots, sequences)


def column_parallel_share(model: ModelSpec, layout: Layout) -> float:
    """The column-parallel matrices' (QKV, gate and up) share of a layer's GEMM FLOPs on a rank; the row-
    parallel ones are the output and down projections (Shoeybi et al. 2019, sec. 3)."""
    t, h = layout.tp, model.hidden
    q = model.heads * model.head_dim / t
    kv = kv_heads_per_rank(model.kv_heads, t) * model.head_dim
    width = ((model.top_k + model.shared_experts) * model.expert_ffn if model.is_moe else model.ffn) / t
    column = (q + 2 * kv + (model.mlp_matrices - 1) * width) * h
    return column / (column + (q + width) * h)


def gemm_pass_seconds(cluster: ClusterSpec, gemms: tuple, peak: float, dtype_bytes: int,
                      operand_bytes: int = 0, grad_bytes: int = 0) -> tuple[float, float, float]:
    """(forward, input gradient, weight gradient) of a list of forward GEMMs: dX = dY W^T is (m, k, n) and
    dW = X^T dY is (k, n, m) (Narayanan et al. 2021 sec. 5.1: backward is twice the forward). A grouped GEMM's
    forward and input gradient (tokens as M) run at the grouped_gemm_efficiency of its tokens per group (FP8
    operands: DeepGEMM's table, else GROUPED_BF16_EFFICIENCY); its weight gradient (tokens as K) at
    GROUPED_WGRAD_EFFICIENCY's, and (`grad_bytes` > 0) no less than its memory traffic when it accumulates into
    the weight's gradient in place, every micro-batch (`expert_wgrad_traffic`)."""
    forward_table = GROUPED_GEMM_EFFICIENCY if (operand_bytes or dtype_bytes) == 1 else GROUPED_BF16_EFFICIENCY
    f = b = w = 0.0
    for g in gemms:
        slow = 1.0 / grouped_gemm_efficiency(g.m, forward_table) if g.grouped else 1.0
        f += gemm_seconds(cluster, g.m, g.n, g.k, peak, dtype_bytes, g.batch, operand_bytes) * slow
        b += gemm_seconds(cluster, g.m, g.k, g.n, peak, dtype_bytes, g.batch, operand_bytes) * slow
        if not g.weight_grad:
            continue
        wgrad = gemm_seconds(cluster, g.k, g.n, g.m, peak, dtype_bytes, g.batch, operand_bytes)
        if g.grouped:
            wgrad /= grouped_gemm_efficiency(g.m, GROUPED_WGRAD_EFFICIENCY)
        if g.grouped and grad_bytes:
            wgrad = max(wgrad, expert_wgrad_traffic(cluster, g, operand_bytes or dtype_bytes, grad_bytes))
        w += wgrad
    return f, b, w


def expert_wgrad_traffic(cluster: ClusterSpec, g: Gemm, operand_bytes: int, grad_bytes: int) -> float:
    """Memory time of a grouped GEMM's weight gradient that accumulates into each expert's gradient in place:
    it reads its two operands (tokens x k and tokens x n per group) and reads and writes the k x n gradient of
    `grad_bytes` an element. Megatron-Core builds its experts' GroupedLinear with fuse_wgrad_accumulation =
    gradient_accumulation_fusion (megatron/core/extensions/transformer_engine.py TEGroupedLinear; on unless
    --no-gradient-accumulation-fusion), so the GEMM adds into the fp32 main_grad (beta = 1) every micro-batch;
    any framework accumulating gradients over micro-batches reads and writes the accumulator at least once.
    With few tokens per expert (small K) that traffic outweighs the GEMM's FLOPs: a 4096 x 3072 expert matrix
    is 100 MB of fp32 read and written against 13 GFLOP at 512 tokens."""
    return g.batch * (operand_bytes * g.m * (g.n + g.k) + 2 * grad_bytes * g.n * g.k) / cluster.achieved_hbm_bandwidth


def grad_accumulator_bytes(cluster: ClusterSpec, precision: str) -> int:
    """Bytes per element of the gradient a weight-gradient GEMM accumulates into: fp32 where gradients are
    accumulated and reduced in fp32 ([software] grad_reduce_fp32, Megatron-Core's main_grad for bf16), else
    the precision's gradient dtype."""
    grads = PRECISIONS[precision]["grads"]
    return 4 if cluster.software.grad_reduce_fp32 and PRECISIONS[precision]["optimizer"] > 8 else grads


# Transformer Engine's MXFP8 quantize kernel moves its bytes at this share of the copy rate: in TE's GEMM benchmark
# on B300 (docs/examples/gemm_profiling; specs/cluster.py mxfp8_gemm_share) a layer's twelve MXFP8 GEMMs took
# 1.823 ms longer with their operands quantized in the call than beforehand, for 9.07 GB of quantization traffic
# by fp8_cast_bytes: 4.97 TB/s where a copy reaches 7.2. benchmarks/fp8_recipes.py works it out.
MX_QUANTIZE_EFFICIENCY = 0.69


def fp8_cast_bytes(cluster: ClusterSpec, precision: str, both_ways: bool = True) -> float:
    """Bytes one bf16 element's quantization moves, at the copy rate, for a GEMM operand another GEMM also reads
    the other way round (`both_ways`: an input the weight gradient reads transposed, an output gradient the input
    gradient and the weight gradient both read). Tensor-wise FP8 (Micikevicius et al. 2022, arXiv:2209.05433)
    reads 2 bytes and writes 1; where FP8 GEMMs take only TN operands (cuBLAS on Hopper and Ada; Blackwell takes
    every layout, Transformer Engine's is_non_tn_fp8_gemm_supported) it writes the transpose too, 1 more; current
    scaling first reads the tensor for its amax, 2 more. MXFP8 (OCP MX spec v1.0) writes a row-wise and a column-
    wise copy, each with an 8-bit scale per 32 elements, since a block's scale runs along the GEMM's k; blockwise
    FP8 (Transformer Engine's Float8BlockScaling) likewise, with an fp32 scale per 128, in one pass as delayed
    scaling's cast."""
    recipe = cluster.fp8_recipe(precision)
    copies = 2 if both_ways else 1
    if recipe == "mxfp8":
        return (2 + (1 + 1 / 32) * copies) / MX_QUANTIZE_EFFICIENCY
    if recipe == "blockwise":
        return 2 + (1 + 4 / 128) * copies
    transpose = both_ways and cluster.gpu_arch != "blackwell"
    return 3 + (1 if transpose else 0) + (2 if recipe == "current" else 0)


def weight_cast_bytes(cluster: ClusterSpec, precision: str) -> float:
    """Bytes a weight element moves every micro-batch where Transformer Engine caches no FP8 copy of it between
    micro-batches ([software] disable_parameter_transpose_cache; with the cache, once a step, left out): FP8
    weights (fp8_param_gather) have only their transpose written where GEMMs take TN operands alone (Hopper: a
    read and a write of a byte; none on Blackwell, none for MXFP8 or blockwise scaling, whose weights keep both
    copies: Megatron-Core's fp8_utils gives blockwise ones column-wise storage); bf16 ones are quantized again both
    ways (`fp8_cast_bytes`)."""
    sw = cluster.software
    if not (is_fp8(precision) and sw.disable_parameter_transpose_cache):
        return 0.0
    if sw.fp8_param_gather:
        both_kept = cluster.gpu_arch == "blackwell" or cluster.fp8_recipe(precision) in ("mxfp8", "blockwise")
        return 0.0 if both_kept else 2.0
    return fp8_cast_bytes(cluster, precision)


def fp8_cast_seconds(cluster: ClusterSpec, gemms: tuple, precision: str,
                     frozen: bool = False) -> tuple[float, float]:
    """(forward, backward) memory traffic of FP8 GEMMs' operands (Transformer Engine's quantize kernels): in
    forward each GEMM's bf16 input, in backward its output gradient, both read both ways (`fp8_cast_bytes`), but
    one way where the weights are `frozen` (no weight gradient reads them). The weights' casts, once per step,
    are left out."""
    per_byte = fp8_cast_bytes(cluster, precision, not frozen) / cluster.achieved_hbm_bandwidth
    f = sum(g.batch * g.m * g.k for g in gemms) * per_byte
    b = sum(g.batch * g.m * g.n for g in gemms) * per_byte
    return f, b


@dataclass(frozen=True)
class Passes:
    """One micro-batch on one pipeline rank, seconds: forward, input gradient (with any recompute), weight
    gradient; `attention` is the attention-core part of the three (what ring attention can hide behind)."""
    forward: float = 0.0
    backward: float = 0.0
    weight: float = 0.0
    attention: float = 0.0
    host: float = 0.0  # of the three, what the device spends waiting for the host that issues them (step.host_bound)

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.weight

    def __add__(self, other: "Passes") -> "Passes":
        return Passes(self.forward + other.forward, self.backward + other.backward, self.weight + other.weight,
                      self.attention + other.attention, self.host + other.host)

    def __mul__(self, n: float) -> "Passes":
        return Passes(self.forward * n, self.backward * n, self.weight * n, self.attention * n, self.host * n)


def microbatch_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, layers: tuple, head: bool,
                       precision: str) -> Passes:
    """F, B, W of one micro-batch (layout.mbs sequences) through `layers` (and the output head when `head`)
    on one rank: shape-aware GEMMs, the attention core, and recompute's extra forward work inside B."""
    moe = sum(model.is_moe_layer(i) for i in layers) if model.is_moe else 0
    return counted_seconds(model, cluster, kernel_shape(layout), len(layers) - moe, moe, head, precision)


@lru_cache(maxsize=65536)
def kernel_shape(layout: Layout) -> Layout:
    """Only what changes kernel shapes, so the caches hit across layouts (dp=ep keeps it a valid layout)."""
    return Layout(tp=layout.tp, cp=layout.cp, ep=layout.ep, etp=layout.etp, dp=layout.ep, mbs=layout.mbs,
                  recompute=layout.recompute)


@lru_cache(maxsize=65536)
def counted_seconds(model: ModelSpec, cluster: ClusterSpec, shape: Layout, dense: int, moe: int, head: bool,
                    precision: str) -> Passes:
    """`dense` dense and `moe` MoE layers, and the output head when `head`, under a `kernel_shape`."""
    out = Passes()
    for is_moe, count in ((False, dense), (True, moe)):
        if count:
            out = out + layer_passes(model, cluster, shape, is_moe, precision) * count
    if head:
        out = out + head_passes(model, cluster, shape.tp, shape.cp, shape.mbs, precision)
        out = out + mtp_passes(model, cluster, shape, precision)
    return out


@lru_cache(maxsize=65536)
def head_passes(model: ModelSpec, cluster: ClusterSpec, tp: int, cp: int, mbs: int, precision: str) -> Passes:
    """The output head and the loss, one micro-batch (whatever the recompute)."""
    tokens = mbs * model.seq / cp
    f, b, w = gemm_pass_seconds(cluster, (Gemm(tokens, model.vocab / tp, model.hidden),),
                                cluster.bf16_work_peak(precision), PRECISIONS[precision]["compute"])
    loss_f, loss_b = loss_seconds(cluster, tokens * model.vocab / tp)
    return Passes(f + loss_f, b + loss_b, 0.0 if model.lora else w)


@lru_cache(maxsize=65536)
def mtp_passes(model: ModelSpec, cluster: ClusterSpec, shape: Layout, precision: str) -> Passes:
    """The multi-token prediction modules on the head's rank, one micro-batch under a `kernel_shape`: each a
    column-parallel 2h -> h projection, a layer like the last and the shared head and loss (DeepSeek-V3 sec.
    2.2; Megatron-Core's MultiTokenPredictionBlock)."""
    if not model.mtp_layers:
        return Passes()
    tokens = shape.mbs * model.seq / shape.cp
    projection = linear_pass_seconds(cluster, (Gemm(tokens, model.hidden / shape.tp, 2 * model.hidden),), precision)
    module = (layer_passes(model, cluster, shape, model.is_moe_layer(model.layers - 1), precision)
              + head_passes(model, cluster, shape.tp, shape.cp, shape.mbs, precision) + Passes(*projection))
    return module * model.mtp_layers


def loss_seconds(cluster: ClusterSpec, logits: float) -> tuple[float, float]:
    """(forward, backward) of the cross-entropy over a rank's `logits` (tokens x vocab/tp), as memory traffic:
    Megatron-Core's LanguageModule.compute_language_model_loss casts the bf16 logits to fp32 and
    tensor_parallel.vocab_parallel_cross_entropy (2024) takes their max, subtracts it, exponentiates in place,
    sums and normalises in place, keeping the softmax for backward: 2+4, 4, 4+4, 4+4, 4, 4+4 bytes an element;
    backward scales that softmax by the loss gradient in place (4+4) and casts it back to bf16 (4+2). A fused
    kernel ([software] fused_cross_entropy) reads the logits (2) and, backward, reads them and writes their
    gradient (2+2). Each metric's cross-entropy ([software] metric_cross_entropies; torch's under autocast) casts
    the logits to fp32 (2+4) and takes their log-softmax (4+4)."""
    sw = cluster.software
    forward, backward = (2, 4) if sw.fused_cross_entropy else (38, 14)
    bandwidth = cluster.achieved_hbm_bandwidth
    return (forward + 14 * sw.metric_cross_entropies) * logits / bandwidth, backward * logits / bandwidth


@lru_cache(maxsize=65536)
def layer_passes(model: ModelSpec, cluster: ClusterSpec, layout: Layout, moe: bool, precision: str) -> Passes:
    """One transformer layer (a MoE one when `moe`), one micro-batch; under fp8 its linear layers' GEMMs in
    FP8 with their operands' casts. Recompute's forward work runs again inside B: the whole layer (full), the
    attention core (selective, minimal, or core_attn among Megatron-Core's modules; minimal_mlp with the MLP's
    first matmul), every other matmul (op), or the GEMMs of the modules named (step.elementwise_seconds counts
    their memory-bound kernels)."""
    f, b, w, core_f, core_b = _layer_kernels(model, cluster, layout.tp, layout.cp, layout.ep, layout.etp, layout.mbs,
                                             moe, precision)
    tokens = layout.mbs * model.seq / layout.cp
    if layout.recompute == "full":
        b += f
    elif layout.recompute == "op":  # a dense block at tp=1 (specs.layout.check_against)
        b += linear_pass_seconds(cluster, tuple(Gemm(tokens, o, i) for i, o in flops.op_recomputed_matmuls(model)),
                                 precision)[0]
    elif layout.recompute_modules - {"core_attn"}:
        b += _module_gemms_forward(model, cluster, layout, tokens, moe, precision)
    elif layout.recompute == "minimal_mlp":  # a dense layer (specs.layout.check_against): the MLP's first matmul
        first = layer_gemm_parts(model, _sample_layer(model, moe), layout, tokens)["mlp"][:1]
        b += linear_pass_seconds(cluster, first, precision)[0]
    rerun_core = core_f if layout.reruns("core_attn") else 0.0
    return Passes(f + core_f, b + core_b + rerun_core, w, core_f + core_b + rerun_core)


def _module_gemms_forward(model: ModelSpec, cluster: ClusterSpec, layout: Layout, tokens: float, moe: bool,
                          precision: str) -> float:
    """The forward GEMMs of the recompute modules a layer has (Megatron-Core's --recompute-modules: mlp a dense
    layer's MLP, moe the whole MoE layer with its router and shared experts, shared_experts those alone)."""
    layer = _sample_layer(model, moe)
    parts = layer_gemm_parts(model, layer, layout, tokens, cluster.software)
    wanted = {"mlp": ("mlp",), "moe": ("router", "experts", "shared_experts"), "shared_experts": ("shared_experts",)}
    names = {p for m in layout.recompute_modules for p in wanted.get(m, ())}
    gemms = tuple(g for name in sorted(names) for g in parts.get(name, ()))
    if "mla_up_proj" in layout.recompute_modules:
        gemms += mla_up_projections(model, layout.tp, tokens)
    return linear_pass_seconds(cluster, gemms, precision)[0] if gemms else 0.0


def _sample_layer(model: ModelSpec, moe: bool) -> int:
    """A layer of the kind asked for (MoE or dense): its GEMMs stand for every layer of that kind."""
    return model.first_dense_layers if moe else next(i for i in range(model.layers) if not model.is_moe_layer(i))


def mla_up_projections(model: ModelSpec, tp: int, tokens: float) -> tuple:
    """MLA's up-projections from the q and kv latents to the heads (DeepSeek-V2, arXiv:2405.04434, sec. 2.1.2),
    heads split over TP: the part of MLA that Megatron-Core's mla_up_proj recompute reruns."""
    heads, v = model.heads / tp, model.v_head_dim or model.head_dim
    kv = Gemm(tokens, heads * (model.head_dim + v), model.kv_lora_rank)
    return ((Gemm(tokens, heads * (model.head_dim + model.rope_head_dim), model.q_lora_rank), kv)
            if model.q_lora_rank else (kv,))


def linear_pass_seconds(cluster: ClusterSpec, gemms: tuple, precision: str, grad_bytes: int = 0,
                        int8_backward: bool = True) -> tuple[float, float, float]:
    """`gemm_pass_seconds` of a layer's linear GEMMs under `precision`: FP8 GEMMs read FP8 operands and write
    bf16; int8 ones (AQT's) run the forward and (`int8_backward`) both gradients on int8 operands, with their
    quantization (`int8_quantize_seconds`), else the gradients in bf16."""
    dtype_bytes = PRECISIONS[precision]["compute"]
    operand_bytes = 1 if is_quantized(precision) else dtype_bytes
    f, b, w = gemm_pass_seconds(cluster, gemms, cluster.gemm_peak(precision), dtype_bytes, operand_bytes,
                                grad_bytes)
    if precision != "int8":
        return f, b, w
    qf, qb, qw = int8_quantize_seconds(cluster, gemms)
    if int8_backward:
        return f + qf, b + qb, w + qw
    _, b, w = gemm_pass_seconds(cluster, gemms, cluster.bf16_work_peak(precision), dtype_bytes, 0, grad_bytes)
    return f + qf, b, w


def int8_quantize_seconds(cluster: ClusterSpec, gemms: tuple) -> tuple[float, float, float]:
    """(forward, input gradient, weight gradient) memory traffic of AQT's int8 dot_generals (google/aqt,
    aqt/jax/v2). MaxText's quantization=int8 (layers/quantizations.py, config_v3) quantizes all three: fwd_bits
    and dlhs_bits 8, and drhs_bits 8 whenever quantization_local_shard_count is not 0 (its default, -1, takes the
    slice count: pyconfig.py). Each dot quantizes both its operands per channel along its contraction as it runs:
    the forward X (m x k) and W (k x n), the input gradient dY (m x n) and W, the weight gradient X and dY.
    Calibration (AbsMaxCalibration) reads each operand once, 2 bytes an element; XLA fuses the scale, round and
    cast into the dot's operand fetch (conv input fusion), which then reads bf16, 1 byte more than the int8
    operand `gemm_seconds` counts: 3 bytes an element."""
    per_byte = 3 / cluster.achieved_hbm_bandwidth
    f = sum(g.batch * (g.m * g.k + g.k * g.n) for g in gemms) * per_byte
    b = sum(g.batch * (g.m * g.n + g.k * g.n) for g in gemms) * per_byte
    w = sum(g.batch * (g.m * g.k + g.m * g.n) for g in gemms if g.weight_grad) * per_byte
    return f, b, w


@lru_cache(maxsize=65536)
def _layer_kernels(model: ModelSpec, cluster: ClusterSpec, tp: int, cp: int, ep: int, etp: int, mbs: int, moe: bool,
                   precision: str) -> tuple[float, float, float, float, float]:
    """`layer_passes` before recompute (what the recompute modes of a kernel shape share): the GEMMs' (and
    casts', routing's) forward, input and weight gradients, then the attention core's forward and backward."""
    layout = Layout(tp=tp, cp=cp, ep=ep, etp=etp, dp=ep, mbs=mbs)
    tokens = layout.mbs * model.seq / layout.cp
    layer = _sample_layer(model, moe)
    parts = layer_gemm_parts(model, layer, layout, tokens, cluster.software)
    gemms = sum(parts.values(), ())
    grad_bytes = grad_accumulator_bytes(cluster, precision)
    forward_only = set(cluster.software.int8_forward_only.split("+"))
    f, b, w = 0.0, 0.0, 0.0
    for int8_backward in (True, False):
        chosen = tuple(g for name, part in parts.items() if (name not in forward_only) == int8_backward for g in part)
        if chosen:
            passes = linear_pass_seconds(cluster, chosen, precision, grad_bytes, int8_backward)
            f, b, w = f + passes[0], b + passes[1], w + passes[2]
    if is_fp8(precision):
        cast_f, cast_b = fp8_cast_seconds(cluster, gemms, precision, model.lora)
        weights = sum(g.batch * g.n * g.k for g in gemms) * weight_cast_bytes(cluster, precision)
        f, b = f + cast_f + weights / cluster.achieved_hbm_bandwidth, b + cast_b
    if moe:  # routing's memory-bound kernels, forward and (their gradients) backward
        routing = routing_seconds(model, cluster, tokens, PRECISIONS[precision]["compute"])
        f, b = f + routing, b + routing
    if model.lora:  # the frozen weights take no gradient; the adapters run beside them
        a_f, a_b, w = adapter_seconds(model, cluster, tp, tokens, PRECISIONS[precision]["compute"])
        f, b = f + a_f, b + a_b
    return (f, b, w, *attention_core_seconds(model, cluster, layout, tokens, precision))


def adapter_seconds(model: ModelSpec, cluster: ClusterSpec, tp: int, tokens: float,
                    act_bytes: int) -> tuple[float, float, float]:
    """(forward, input gradient, weight gradient) of one layer's LoRA adapters on a rank for `tokens`, as memory
    traffic. A rank-r matmul does about r FLOPs a byte it moves, far under any accelerator's ridge point, so each
    of an adapter's six GEMMs (A and B; forward, input and weight gradients) takes its activations' bytes at the
    achieved HBM rate and a launch's fixed time. The adapter's output is added to its matrix's (read two, write
    one), and its input gradient to the matrix's. Its dropout is element-wise work the layer stores for
    (memory.adapter_saved_elements), charged with the rest (step.elementwise_seconds)."""
    f = b = w = 0.0
    for i, o in adapter_widths(model, tp):
        f += act_bytes * (i + o) + 3 * act_bytes * o
        b += act_bytes * (o + i) + 3 * act_bytes * i
        w += act_bytes * (o + i)
    launches = 2 * len(model.lora_matrices()) * cluster.gemm_kernel_overhead_s
    per_byte = tokens / cluster.achieved_hbm_bandwidth
    return f * per_byte + launches, b * per_byte + launches, w * per_byte + launches


# The permute and unpermute's share of the achieved HBM rate, forward and backward, by [software]
# moe_permute_fusion: benchmarks/kernel_scan.py on one H200 (benchmarks/data/kernel_scan_h200.json, the rows whose
# kernels outlast their host launches: Mixtral 8x7B at 16,384 tokens, DeepSeek-V3 at 4,096 and 16,384).
# Transformer Engine 2.20's fused Triton kernels reach 0.72-0.81 of a copy's rate; Megatron-Core 0.16's
# moe_utils (masked_select, index_select, scatter_add's atomics, and their autograd) 0.14-0.16.
PERMUTE_EFFICIENCY = {True: 0.76, False: 0.15}


def routing_seconds(model: ModelSpec, cluster: ClusterSpec, tokens: float, dtype_bytes: int) -> float:
    """One MoE layer's routing kernels for `tokens` on a rank, one pass, as memory traffic (their FLOPs are
    nil; `routing_bytes`), the permute's at PERMUTE_EFFICIENCY. Every TP rank routes all tokens
    (memory.activation_bytes_per_layer's accounting). The router's many small kernels take their host time
    (cost/overhead.py ROUTER_HOST), not this."""
    router, permute = routing_bytes(model, tokens, dtype_bytes)
    rate = cluster.achieved_hbm_bandwidth
    sw = cluster.software
    if sw.moe_dispatcher == "einsum":  # no permute: the dispatch and combine masks, each written once
        return (router + 2 * tokens * capacity_slots(model) * dtype_bytes) / rate
    return router / rate + permute / (rate * PERMUTE_EFFICIENCY[sw.moe_permute_fusion])


def routing_bytes(model: ModelSpec, tokens: float, dtype_bytes: int) -> tuple[float, float]:
    """(router, permute) bytes of one MoE layer's routing for `tokens`, one pass: the router's softmax and top-k
    over tokens x experts fp32 logits (written, read twice); the permute that gathers top_k copies of each
    token (reads the tokens, writes the copies) and the unpermute that sums them back (reads the copies,
    writes the tokens): Megatron-Core's moe_utils.permute / unpermute and its TopKRouter."""
    router = 3 * 4 * tokens * model.experts
    permute = 2 * (1 + model.top_k) * tokens * model.hidden * dtype_bytes
    return router, permute


def attention_core_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, tokens: float,
                           precision: str) -> tuple[float, float]:
    """One layer's attention core, (forward, backward), for `tokens` queries on this rank (heads split by TP):
    the mean over the model's layers, whose sliding windows may differ. Fused: the flash kernel's throughput.
    Unfused (2021-22 Megatron-LM): batched QK^T and AV GEMMs per head, forward and their two gradients each,
    every score computed, a window's masked ones too (the softmax is memory-bound work, see
    step.elementwise_seconds)."""
    peak, dtype_bytes = cluster.bf16_work_peak(precision), PRECISIONS[precision]["compute"]
    if not cluster.fused_attention:
        heads = max(1, round(model.heads / layout.tp)) * layout.mbs
        s, d = model.seq / layout.cp, model.head_dim
        f, b, w = gemm_pass_seconds(cluster, (Gemm(s, model.seq, d, heads), Gemm(s, d, model.seq, heads)), peak,
                                    dtype_bytes)
        return f, b + w
    by_window: dict[int, list[int]] = {}
    for i in range(model.layers):
        by_window.setdefault(model.attention_window(i), []).append(i)
    f = b = 0.0
    for layers in by_window.values():
        lf, lb = _fused_core_seconds(model, cluster, layout, tokens, precision, layers[0])
        f, b = f + lf * len(layers) / model.layers, b + lb * len(layers) / model.layers
    return f, b


def _fused_core_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, tokens: float, precision: str,
                        layer: int) -> tuple[float, float]:
    """`attention_core_seconds` of layer `layer` with a fused kernel. Under a window w shorter than the sequence
    each query block loops over about w/128 + 1 key blocks, as a causal kernel's do on average at length 2w: it
    runs at the scans' causal rate there, on its own rank whatever the CP (the keys it needs are local but for
    the window's reach into the previous chunk). Chunks of w (Llama 4) are causal kernels of length w."""
    peak, dtype_bytes = cluster.bf16_work_peak(precision), PRECISIONS[precision]["compute"]
    core = tokens * flops.attention_core_flops(model, model.seq, True, layer) / layout.tp
    window = model.attention_window(layer)
    span = window if model.attends_in_chunks else 2 * window
    length, cp = (span, 1) if window and span < model.seq else (model.seq, layout.cp)
    measured = nearest(cluster.attention_rates, (length / cp, model.head_dim))
    if measured and measured_precision(cluster, dtype_bytes):
        # calibrated: forward + backward measured as 3x the forward FLOPs
        total = 3 * core / measured
        return total / 3, total * 2 / 3
    # the query-key product's head dim and the values' (MLA's differ)
    mla = model.uses_mla
    head_dim, v_head_dim = (model.head_dim + model.rope_head_dim, model.v_head_dim) if mla else (model.head_dim, 0)
    total = attention_seconds(cluster, core, length, peak, model.causal, cp, head_dim, v_head_dim)
    forward, backward = total / 3.5, total * 2.5 / 3.5
    if cluster.software.fp8_attention and is_fp8(precision):
        speed_f, speed_b = fp8_attention_speed(cluster.gpu_arch, length / cp, model.causal)
        forward, backward = forward / speed_f, backward / speed_b
    merge_f = merge_b = 0.0
    if cp > 1:
        queries = tokens * model.heads * model.head_dim / layout.tp
        keys = tokens * kv_heads_per_rank(model.kv_heads, layout.tp) * model.head_dim
        merge_f, merge_b = ring_merge_seconds(cluster, queries, keys, cp)
    return forward + merge_f, backward + merge_b
