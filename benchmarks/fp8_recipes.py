"""Transformer Engine's GEMM benchmark against the cost model's FP8 recipes: the GEMMs at each recipe's rate and
the quantization traffic each recipe moves (cost/kernels.py fp8_cast_bytes).

The benchmark (NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst and
benchmarks/gemm/benchmark_gemm.py, 2026) times a 4096-hidden layer's twelve GEMMs (fprop, dgrad and wgrad of QKV,
attention out, MLP up and down at 16,384 wide; 15,872 tokens) as te.Linear forwards in autocast, 100 back to back
after 10 warm-ups, per recipe: with operands quantized in the call ("autocast") and beforehand ("GEMM only",
BF16 and FP8 current scaling and MXFP8; delayed scaling always quantizes in the call, so its GEMMs are taken as
current scaling's, the same tensor-wise kernels; block scaling on Hopper was timed in the call alone, and its
GEMM rate, specs/cluster.py FP8_BLOCK_GEMM_SHARE, is read off that figure: its row checks the arithmetic). Each
call quantizes its input both ways (the weight needs a gradient, so the input is kept for the weight-gradient
GEMM) and its weight one way (the input needs none).
Measured: per-layer milliseconds as the page prints them, on B300 SXM6 AC and H200 NVL (a 600 W H200: its BF16
GEMMs run slower than the 700 W SXM the h200 preset is; the ratios and the quantization times are the test).

Run: PYTHONPATH=src python benchmarks/fp8_recipes.py
"""

from meshscale.cost.kernels import fp8_cast_bytes, gemm_seconds
from meshscale.specs.cluster import load_cluster

TOKENS, HIDDEN, FFN = 15872, 4096, 16384
# (M, K, N) of the layer's forward GEMMs; dgrad swaps K and N, wgrad is (K, M, N)
FORWARD = ((TOKENS, HIDDEN, 3 * HIDDEN), (TOKENS, HIDDEN, HIDDEN), (TOKENS, HIDDEN, FFN), (TOKENS, FFN, HIDDEN))
SHAPES = FORWARD + tuple((m, n, k) for m, k, n in FORWARD) + tuple((k, m, n) for m, k, n in FORWARD)

# (preset, recipe): (autocast ms, GEMM-only ms or None) per layer, TE's page
MEASURED = {
    ("b300", "bf16"): (12.758, 13.102),
    ("b300", "current"): (9.147, 6.812),
    ("b300", "delayed"): (7.802, 6.812),
    ("b300", "mxfp8"): (8.984, 7.161),
    ("h200", "bf16"): (32.014, 31.968),
    ("h200", "current"): (20.285, 16.785),
    ("h200", "delayed"): (18.978, 16.785),
    ("h200", "blockwise"): (22.882, None),
}


def layer_ms(preset: str, recipe: str) -> tuple[float, float]:
    """(autocast, GEMM-only) milliseconds the model gives the benchmark's twelve calls."""
    cluster = load_cluster(preset)
    precision = {"bf16": "bf16", "mxfp8": "mxfp8"}.get(recipe, "fp8")
    if precision == "fp8":
        cluster = cluster.with_software(fp8_scaling=recipe)
    peak, operand = cluster.gemm_peak(precision), 2 if precision == "bf16" else 1
    gemms = sum(gemm_seconds(cluster, m, n, k, peak, 2, 1, operand) for m, k, n in SHAPES)
    if precision == "bf16":
        return gemms * 1e3, gemms * 1e3
    both, one = fp8_cast_bytes(cluster, precision), fp8_cast_bytes(cluster, precision, False)
    traffic = sum(m * k * both + k * n * one for m, k, n in SHAPES)  # the input both ways, the weight one way
    return (gemms + traffic / cluster.achieved_hbm_bandwidth) * 1e3, gemms * 1e3


def main() -> None:
    print(f"{'system':6s} {'recipe':9s} {'autocast ms':>24s} {'GEMM only ms':>24s} {'quantization ms':>26s}")
    for (preset, recipe), (auto, gemm_only) in MEASURED.items():
        model_auto, model_gemm = layer_ms(preset, recipe)
        cells = []
        for model, measured in ((model_auto, auto), (model_gemm, gemm_only),
                                (model_auto - model_gemm, None if gemm_only is None else auto - gemm_only)):
            if measured is None:
                cells.append(f"{'-':>7s} model {model:7.3f}       ")
                continue
            err = f"{model / measured - 1:+6.1%}" if measured > 0.05 else "      "
            cells.append(f"{measured:7.3f} model {model:7.3f} {err}")
        print(f"{preset:6s} {recipe:9s} {cells[0]:>24s} {cells[1]:>24s} {cells[2]:>26s}")


if __name__ == "__main__":
    main()
