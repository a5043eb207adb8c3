"""Predicted step time against published Megatron-LM measurements on A100 (DGX A100, HDR InfiniBand).

Narayanan et al. 2021 (arXiv:2104.04473) Table 1: GPT models, seq 2048, vocab 51200, full recomputation;
published per-GPU TFLOP/s counted with their eq. (3), 96*B*s*l*h^2*(1 + s/6h + V/16lh), converted to seconds.
Korthikanti et al. 2022 (arXiv:2205.05198) Table 4: sequence parallelism + selective recompute, step times.
Run: PYTHONPATH=src python benchmarks/published.py
"""

from dataclasses import replace

from meshscale.cost import predict
from meshscale.specs.cluster import load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec


def gpt(name, heads, hidden, layers):
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden, vocab=51200,
                     seq=2048, mlp="gelu", tied_embeddings=True, learned_positions=True, biases=True)


# (params, heads, hidden, layers, tp, pp, gpus, batch, TFLOP/s per GPU)
NARAYANAN_2021 = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137), ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142), ("18B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39B", 64, 8192, 48, 8, 2, 512, 1536, 138), ("76B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145B", 96, 12288, 80, 8, 8, 1536, 2304, 148), ("310B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("530B", 128, 20480, 105, 8, 35, 2520, 2520, 163), ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
# (params, heads, hidden, layers, tp, pp, gpus, batch, step seconds with SP + selective recompute)
KORTHIKANTI_2022 = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 1.10), ("175B", 96, 12288, 96, 8, 8, 64, 64, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 37.83), ("1T", 160, 25600, 128, 8, 64, 512, 512, 71.49),
]


def narayanan_seconds(h, l, batch, gpus, tflops, s=2048, v=51200):
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)) / (gpus * tflops * 1e12)


def interleave(layers, pp):
    """The interleaved schedule with the fewest chunks that split the layers evenly (both papers use it
    for their pipelined runs: Narayanan et al. 2021 sec. 2.2.2, Korthikanti et al. 2022 sec. 6)."""
    v = next((v for v in (2, 3, 4) if layers % (v * pp) == 0), 1) if pp > 1 else 1
    return f",schedule=interleaved,vpp={v}" if v > 1 else ""


def rows():
    # The published runs used unfused attention (before FlashAttention); the hardware figures are unchanged.
    a100 = replace(load_cluster("a100-80gb"), fused_attention=False)
    for name, a, h, l, tp, pp, n, b, tf in NARAYANAN_2021:
        layout = Layout.parse(f"tp={tp},pp={pp},mbs=1,recompute=full{interleave(l, pp)}", n)
        p = predict(gpt(name, a, h, l), a100, layout, b)
        yield "Narayanan21", name, str(layout), p.step_time_s, narayanan_seconds(h, l, b, n, tf)
    for name, a, h, l, tp, pp, n, b, secs in KORTHIKANTI_2022:
        layout = Layout.parse(f"tp={tp},sp=true,pp={pp},mbs=1,recompute=selective{interleave(l, pp)}", n)
        p = predict(gpt(name, a, h, l), a100, layout, b)
        yield "Korthikanti22", name, str(layout), p.step_time_s, secs


if __name__ == "__main__":
    errs = []
    for paper, name, layout, pred, real in rows():
        errs.append(pred / real - 1)
        print(f"{paper:14s} {name:5s} {layout:58s} predicted {pred:8.3f} s  published {real:8.3f} s  "
              f"{pred / real - 1:+.1%}")
    print(f"mean |error| {sum(map(abs, errs)) / len(errs):.1%}, worst {max(errs, key=abs):+.1%}")
