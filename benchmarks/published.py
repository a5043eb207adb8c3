"""Predicted step time against published measured training runs: A100, H100, TPU v5e/v5p, dense and MoE.

Each run states its source (paper table or repository file), the layout the source reports, and the
measured step time, derived from what the source publishes (a step time, tokens/s per device, or TFLOP/s per
device with the source's own FLOP count). Only publications up to 2024: vendor performance tables of 2025-2026
(NeMo 25.x, Megatron-Bridge, Megatron-MoE-ModelZoo, torchtitan's 2025 pages) are kept out, for blind
scoring (issue 18). Nothing here sets an efficiency factor: those come from
micro-benchmarks and datasheets (specs/cluster.py). Run: PYTHONPATH=src python benchmarks/published.py
(--run TEXT: the runs whose source or name holds TEXT, each broken down as `meshscale predict` does;
--data-parallel: the runs that differ only in data-parallel size; --write-bands: rewrite cost/bands.py's error
bands from these runs, after any change to the model).
"""

import argparse
import datetime
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, replace

from meshscale.commands.report import print_prediction
from meshscale.cost import bands, predict
from meshscale.cost.flops import model_flops_per_step
from meshscale.specs.cluster import XLA, Software, load_cluster
from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec, load_model


@dataclass(frozen=True)
class Run:
    source: str  # paper + table, or repository + file
    name: str
    model: ModelSpec
    cluster: str  # preset
    layout: str
    devices: int
    batch: int  # sequences per step
    seconds: float  # measured step time
    hardware: str
    software: Software = Software(framework="megatron-core")
    fused_attention: bool = True
    nic: float = 0.0  # scale-out bytes/s per GPU where the site differs from the preset's (0: the preset's)
    torus: tuple = ()  # TPU: the ICI slice the run was given, where smaller than the preset's (DCN between them)
    precision: str = "bf16"
    # The measured span also holds an evaluation of as many sequences as the step trains, in forward passes of
    # `eval_batch` sequences (0: none): `evaluation_seconds`
    eval_batch: int = 0

    @property
    def moe(self) -> bool:
        return self.model.is_moe


def gpt(name, heads, hidden, layers):
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden, vocab=51200,
                     seq=2048, mlp="gelu", tied_embeddings=True, learned_positions=True, biases=True)


def maxtext(scale: int = 0, layers: int = 16, hidden: int = 2560, heads: int = 8, ffn: int = 8192) -> ModelSpec:
    """MaxText's model as its 2023 performance tables ran it (its DecoderLayer and configs/base.yml at
    281e04bf, 2023-04, 5ebcd67f, 2023-10, and 76bd53b0, 2023-12, alike): heads of 256, a ReLU MLP (up and down:
    GeLU's two matrices here), PaLM's parallel attention + MLP on one T5 RMSNorm (DecoderLayer: x +
    attention(norm(x)) + mlp(norm(x))), qk-norm, T5 relative position biases until RoPE in December (RoPE
    here), vocab 32768 with the logits read off the embedding, seq 2048. `global_parameter_scale` grows the base
    (emb 2560, 8 heads, mlp 8192, 16 layers) by doubling heads and mlp, then emb, then layers, in turn
    (pyconfig.get_individual_scales); without a scale the dimensions are given (the v4 configs set them)."""
    if scale:
        base, rem = divmod(scale.bit_length() - 1, 3)
        grow, wide = base + (rem > 0), base + (rem > 1)
        layers, hidden, heads, ffn = layers << base, hidden << wide, heads << grow, ffn << grow
    return ModelSpec(name=f"maxtext-2023-{scale}b" if scale else f"maxtext-2023-{hidden}x{layers}", layers=layers,
                     hidden=hidden, heads=heads, head_dim=256, ffn=ffn, vocab=32768, seq=2048, mlp="gelu",
                     tied_embeddings=True, qk_norm=True, parallel_residual=True)


def maxtext_seconds(model: ModelSpec, per_device_batch: int, tflops: float, attention: int) -> float:
    """MaxText's TFLOP/s per chip back to seconds with its own count of the time (train.py): 6 x its
    parameters per token (calculate_num_params_from_pytree: all of them), plus `attention` x s^2 x heads x
    head_dim per layer and sequence: 0 in April 2023, 12 (non-causal) in October, 6 (causal) from December."""
    s = model.seq
    per_sequence = 6 * model.param_count() * s + attention * model.heads * model.head_dim * model.layers * s * s
    return per_sequence * per_device_batch / (tflops * 1e12)


# Narayanan et al. 2021 (arXiv:2104.04473) Table 1: GPT, seq 2048, vocab 51200, full recomputation, DGX A100;
# per-GPU TFLOP/s counted with their eq. (3), 96*B*s*l*h^2*(1 + s/6h + V/16lh), converted to seconds.
# (params, heads, hidden, layers, tp, pp, gpus, batch, TFLOP/s per GPU)
NARAYANAN_2021 = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137), ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142), ("18B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39B", 64, 8192, 48, 8, 2, 512, 1536, 138), ("76B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145B", 96, 12288, 80, 8, 8, 1536, 2304, 148), ("310B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("530B", 128, 20480, 105, 8, 35, 2520, 2520, 163), ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
# Korthikanti et al. 2022 (arXiv:2205.05198) Table 4: SP + selective recompute, step seconds.
KORTHIKANTI_2022 = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 1.10), ("175B", 96, 12288, 96, 8, 8, 64, 64, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 37.83), ("1T", 160, 25600, 128, 8, 64, 512, 512, 71.49),
]
# Megatron-LM of 2021-22: attention without a fused kernel, and the gradient all-reduce after the whole
# backward (overlapped reduction came with Megatron-Core's distributed optimizer in 2023). The papers train
# in fp16 (their 312 TFLOP/s half-precision peak), where Megatron-LM all-reduces the gradients in fp16:
# arguments.py switches fp32 accumulation and all-reduce on only for bf16.
# Gradient buckets: Megatron-LM 2021 all-reduced its one contiguous gradient buffer in one call, which is
# Megatron-Core's rule without overlap (framework megatron-core, one bucket a buffer).
# Stage-boundary sends blocked their rank (p2p_communication.py _communicate: wait on each request, then
# torch.cuda.synchronize(), from 2021 until --overlap-p2p-communication in 2023).
MEGATRON_2021 = Software(framework="megatron-core", grad_reduce_overlap=False, param_gather_overlap=False,
                         grad_reduce_fp32=False, pp_comm_overlap=False)
# Sequence parallelism came with the backward's input-gradient reduce-scatter run behind the weight-gradient
# GEMM (Megatron-LM mpu/layers.py of 2022, LinearWithGradAccumulationAndAsyncCommunication); Megatron-Core
# keeps it (core/tensor_parallel/layers.py).
MEGATRON_2022 = replace(MEGATRON_2021, tp_wgrad_overlap=True)
MEGATRON_CORE = Software(framework="megatron-core", tp_wgrad_overlap=True)


def narayanan_seconds(h, l, batch, gpus, tflops, s=2048, v=51200):
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)) / (gpus * tflops * 1e12)


def interleave(layers, pp):
    """The interleaved schedule with the fewest chunks that split the layers evenly (both papers use it
    for their pipelined runs: Narayanan et al. 2021 sec. 2.2.2, Korthikanti et al. 2022 sec. 6)."""
    v = next((v for v in (2, 3, 4) if layers % (v * pp) == 0), 1) if pp > 1 else 1
    return f",schedule=interleaved,vpp={v}" if v > 1 else ""


def megatron_runs():
    for name, a, h, l, tp, pp, n, b, tf in NARAYANAN_2021:
        yield Run("Narayanan21 T1", name, gpt(name, a, h, l), "a100-80gb",
                  f"tp={tp},pp={pp},mbs=1,recompute=full{interleave(l, pp)}", n, b,
                  narayanan_seconds(h, l, b, n, tf), "A100", MEGATRON_2021, False)
    for name, a, h, l, tp, pp, n, b, secs in KORTHIKANTI_2022:
        yield Run("Korthikanti22 T4", name, gpt(name, a, h, l), "a100-80gb",
                  f"tp={tp},sp=true,pp={pp},mbs=1,recompute=selective{interleave(l, pp)}", n, b, secs, "A100",
                  MEGATRON_2022, False)


EAGER = Software(framework="torch", fused_elementwise=False)


def torchtitan_runs():
    """pytorch/torchtitan docs/performance.md (2024-04 to 2024-12): FSDP2 on 64 A100 80GB, local batch per GPU,
    WPS = tokens/s per GPU. Llama 3 at seq 8192, Llama 2 at 4096; 'selective op' AC is recompute=op (every other
    matmul); its 'selective layer' rows (every other layer in full) have no mode here. Eager mode: the
    train_configs/*.toml of the time set compile = false and norm_type = "rmsnorm" (the unfused one), so every
    element-wise operator is its own kernel. Its Llama 3.1 405B rows (2024-08) ran on H100s of 95 GB HBM2e "between
    SXM and NVL" whose peak the page does not know: no preset."""
    rows = [("llama3-8b", 1, "op", 2973), ("llama3-70b", 1, "full", 331),
            ("llama2-13b", 2, "none", 2162), ("llama2-13b", 2, "op", 1904), ("llama2-70b", 2, "full", 353),
            ("llama2-70b", 1, "op", 355)]
    for name, local, ac, wps in rows:
        model = load_model(name)
        yield Run("torchtitan performance.md", f"{name} local {local} AC {ac}", model, "a100-80gb",
                  f"fsdp=64,mbs={local},recompute={ac}", 64, 64 * local, local * model.seq / wps, "A100", EAGER)


# MaxText's 2023 tables, TFLOP/s per chip by slice count (slices joined by DCN, data-parallel across them:
# base.yml's dcn_data_parallelism = -1; FSDP over each slice's ICI, ici_fsdp_parallelism = -1).
# TPU v5e, README and v5e_high_performance.md at 5ebcd67f (2023-10-27), 1-32 slices of v5e-256, configs
# MaxText/configs/largest_job/{16,32,64,128}b.sh there: (scale, tp, per-device batch, remat, TFLOP/s by slices).
MAXTEXT_V5E = [(16, 1, 6, "full", (120, 117, 117, 115, 111, 108)), (32, 1, 4, "full", (132, 128, 126, 125, 123, 119)),
               (64, 1, 2, "full", (118, 112, 110, 108, 105, 99)), (128, 16, 1, "full", (110, 110, 108, 104, 100, 91))]
# TPU v5p, MaxText/configs/v5p/README.md and its {32,...,1024}b.sh at 76bd53b0 (2023-12-15): (scale, tp,
# per-device batch, remat, [(v5p-N, slices, TFLOP/s)]); v5p-N counts TensorCores, N/2 chips. remat 'minimal'
# (checkpoint_dots_with_no_batch_dims: keep the weight matmuls' outputs, rerun attention and the rest).
MAXTEXT_V5P = [(32, 4, 8, "minimal", [(128, 1, 328), (128, 2, 319)]),
               (64, 4, 4, "minimal", [(128, 1, 323), (128, 2, 309)]),
               (128, 8, 2, "minimal", [(256, 1, 315), (256, 2, 305), (512, 1, 316), (512, 2, 274)]),
               (256, 8, 2, "minimal", [(1024, 1, 308), (1024, 2, 289)]),
               (512, 16, 2, "full", [(1024, 1, 294), (1024, 2, 282)]),
               (1024, 16, 2, "full", [(2048, 1, 254), (2048, 2, 237), (4096, 1, 297), (4096, 2, 279)])]
# TPU v4, README at 281e04bf (2023-04-27), configs {1,2,4}xv4-128.sh and {1,2}xv4-384.sh there (dimensions as
# MaxText/configs/v4/{22,52}b.sh restate them at 76bd53b0): pure FSDP over the slice, full remat, attention as
# einsums around a materialised softmax (layers.py dot_product_attention; flash attention came in the autumn).
MAXTEXT_V4 = [("22B", (48, 6144, 24, 24576), 16, 128, (156, 152, 149, 146)),
              ("52B", (32, 12288, 32, 49152), 10, 384, (154, 162))]
# Slice shapes (Cloud TPU docs: v4 and v5p slices are 4x4x4 cubes, the longest axis last; v5e-256 is 16x16)
SLICES = {64: (4, 4, 4), 128: (4, 4, 8), 192: (4, 4, 12), 256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16),
          1536: (8, 12, 16), 2048: (8, 16, 16), 4096: (16, 16, 16), 6144: (16, 16, 24)}


def maxtext_run(name, model, cluster, slice_chips, slices, tp, pdb, remat, tflops, attention, flash=True) -> Run:
    chips = slice_chips * slices
    sp = ",sp=true" if tp > 1 else ""
    shard = f",shard={slice_chips // tp}" if slices > 1 else ""
    torus = () if cluster == "tpu-v5e" else SLICES[slice_chips]
    return Run("MaxText README", f"{name} {slices}x{slice_chips}", model, cluster,
               f"dp={chips // tp},zero=3{shard},tp={tp}{sp},mbs={pdb * tp},recompute={remat}", chips, pdb * chips,
               maxtext_seconds(model, pdb, tflops, attention), "TPU " + cluster[4:], XLA, fused_attention=flash,
               torus=torus)


def maxtext_runs():
    """MaxText's MFU tables of 2023 (AI-Hypercomputer/maxtext), each with the configs and the model of the
    commit that published it (`maxtext`); the multi-slice rows are data-parallel over DCN (`shard` = a slice's
    FSDP group). A row's name is "<model> <slices>x<chips a slice>". The v5e configs set enable_flash_attention,
    and MaxText ran its Pallas flash kernel with causal = False then (layers.py at 5ebcd67f; causal = True came in
    November, 3dbc0576 on main): every query attended to every key, as the 12 s^2 of its count says, and without
    the q/k LayerNorms its einsum path applies."""
    for scale, tp, pdb, remat, by_slices in MAXTEXT_V5E:
        model = replace(maxtext(scale), causal=False, qk_norm=False)
        for slices, tflops in zip((1, 2, 4, 8, 16, 32), by_slices):
            yield maxtext_run(f"v5e {scale}B", model, "tpu-v5e", 256, slices, tp, pdb, remat, tflops, 12)
    for scale, tp, pdb, remat, rows in MAXTEXT_V5P:
        for cores, slices, tflops in rows:
            yield maxtext_run(f"v5p {scale}B", maxtext(scale), "tpu-v5p", cores // 2, slices, tp, pdb, remat,
                              tflops, 6)
    for name, (layers, hidden, heads, ffn), pdb, cores, by_slices in MAXTEXT_V4:
        model = maxtext(layers=layers, hidden=hidden, heads=heads, ffn=ffn)
        for slices, tflops in enumerate(by_slices):
            yield maxtext_run(f"v4 {name}", model, "tpu-v4", cores // 2, 2 ** slices, 1, pdb, "full", tflops, 0,
                              flash=False)


def palm_runs():
    """Chowdhery et al. 2022, "PaLM" (arXiv:2204.02311): PaLM 540B (Table 1: 118 layers, d_model 18432, 48
    heads of 256 with one shared KV head, SwiGLU d_ff 73728, shared 256k embeddings, seq 2048) on 6144 TPU v4
    in two pods of 3072 (sec. 4: 12-way model parallelism and 256-way fully sharded data parallelism inside a
    pod, the pods data-parallel over DCN), 46.2% MFU (Table 3; 57.8% HFU, so some activations were
    rematerialized: recompute=full here) at 2048 sequences per step, converted with PaLM's own count (Appendix
    B: 6N + 12LHQT per token, N = 540.35B). Parallel attention + MLP (sec. 2, "Parallel Layers"): one TP
    region a layer. Attention as einsums around a materialised softmax, every score computed: PaLM predates
    FlashAttention (Dao et al., May 2022), and TPU flash kernels came with Pallas in 2023."""
    model = ModelSpec(name="palm-540b", layers=118, hidden=18432, heads=48, kv_heads=1, head_dim=256, ffn=73728,
                      vocab=256000, seq=2048, tied_embeddings=True, parallel_residual=True)
    batch, chips = 2048, 6144
    flops = batch * model.seq * (6 * 540.35e9 + 12 * model.layers * model.heads * model.head_dim * model.seq)
    yield Run("PaLM T3", "PaLM 540B", model, "tpu-v4", "dp=512,zero=3,shard=256,tp=12,mbs=1,recompute=full",
              chips, batch, flops / (chips * 275e12 * 0.462), "TPU v4", XLA, fused_attention=False)


def llama3_runs():
    """Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4: 405B on H100, seq 8192, 16M tokens per step,
    interleaved pipeline, no recomputation; TFLOP/s per GPU converted with the PaLM count (causal attention).
    Chunks per rank are not stated; we take 4 (two layers per chunk: 126 layers with the embedding and head
    balanced over 16 stages, sec. 3.3.2)."""
    model = load_model("llama3-405b")
    for gpus, dp, tflops in ((8192, 64, 430), (16384, 128, 400)):
        batch = 2048
        seconds = model_flops_per_step(model, batch * model.seq) / (gpus * tflops * 1e12)
        yield Run("Llama3 T4", f"405B/{gpus}", model, "h100-80gb",
                  f"dp={dp},zero=1,tp=8,sp=true,pp=16,vpp=4,schedule=interleaved,mbs=1", gpus, batch, seconds,
                  "H100")


# Jiang et al. 2024, "MegaScale" (arXiv:2402.15627v1, NSDI '24), Table 2: the 175B model's strong scaling under
# Megatron-LM (commit 285068c8, 2023-01), the paper's baseline: (global batch, GPUs, iteration seconds).
MEGASCALE_MEGATRON = [(768, 256, 40.0), (768, 512, 21.2), (768, 768, 15.2), (768, 1024, 11.9),
                      (6144, 3072, 29.02), (6144, 6144, 14.78), (6144, 8192, 12.24), (6144, 12288, 8.57)]


def megascale_runs():
    """MegaScale's Megatron-LM baseline (Table 2 above). Table 1 and sec. 6: 96 layers, hidden 12288, 128 heads,
    TP 8, PP 8 with the interleaved schedule of 6 chunks a rank, seq 2048, vocab 64,000, on "NVIDIA Ampere GPUs"
    (A100 80GB here) with eight 200G NICs a server, a 1:1 three-tier Clos (sec. 3.6). The baseline is Megatron-LM's
    standard block with its own kernels: FlashAttention-2 and fused LayerNorm/GeLU are MegaScale's additions (sec.
    3.3), as are overlapped data-parallel and pipeline communication (sec. 3.2), so Megatron-LM of 2023-01 here
    (MEGATRON_2022: gradients reduced after the backward, blocking stage sends). Not stated, taken: bf16 (fp32
    gradient reduction, Megatron-LM's rule for bf16), the distributed optimizer, sequence parallelism, selective
    recomputation, micro-batch 1. Not modelled: the per-GPU data loaders whose disk reads idle the GPUs at the start
    of each step (sec. 3.4, which MegaScale removed)."""
    model = replace(gpt("gpt-175b-megascale", 128, 12288, 96), vocab=64000)
    software = replace(MEGATRON_2022, grad_reduce_fp32=True)
    for batch, gpus, seconds in MEGASCALE_MEGATRON:
        yield Run("MegaScale T2", f"Megatron-LM 175B {gpus}", model, "a100-80gb",
                  f"dp={gpus // 64},zero=1,tp=8,sp=true,pp=8,vpp=6,schedule=interleaved,mbs=1,recompute=selective",
                  gpus, batch, seconds, "A100", software, False)


def deepseek_runs():
    yield from deepseek_v2_runs()
    yield from deepseek_v3_runs()


def deepseek_v2_runs():
    """DeepSeek-AI 2024, "DeepSeek-V2" (arXiv:2405.04434): "during our practical training on the H800 cluster",
    172.8K GPU hours a trillion tokens (sec. 3.2.3). Sec. 3.1.3 lays it out: 16-way zero-bubble pipeline
    parallelism, 8-way expert parallelism (its routed experts on 8 devices, sec. 3.1.2), ZeRO-1 data
    parallelism, no TP, "a portion of the operators" recomputed (which is not stated: DeepSeek-V3's RMSNorm and MLA
    up-projections here), MLA on "an improved version of FlashAttention-2", its own kernels for the dispatch
    (DeepEP's here, as for V3), routing and the experts' linears; seq 4096 and 9,216 sequences a step after the
    first 225B tokens (sec. 3.1.2). BF16: the FP8 framework came with V3. Not stated either: the GPU count
    (1,024: 144 micro-batches of 1 a step) and the micro-batch. Not modelled: each token sent to at most 3 of
    the 8 devices (the model sends its 6 copies), token dropping, and the shared experts run beside the
    dispatch. Like V3's, the figure is the run's average and bounds the step from above."""
    model, batch, gpus = load_model("deepseek-v2"), 9216, 1024
    tokens_per_s = gpus * 1e12 / (172.8e3 * 3600)
    yield Run("DeepSeek-V2 sec. 3.2.3", "DeepSeek-V2 236B", model, "h800",
              "dp=64,zero=1,pp=16,schedule=zb,ep=8,mbs=1,recompute=layernorm+mla_up_proj", gpus, batch,
              batch * model.seq / tokens_per_s, "H800",
              replace(MEGATRON_CORE, moe_dispatcher="deepep", moe_permute_fusion=True, attention_kernel="fa2"))


def deepseek_v3_runs():
    """DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv:2412.19437): pre-training took 180K H800 GPU
    hours a trillion tokens (Table 1; 2,664K for 14.8T) on 2,048 H800 (sec. 3.1), 3.16M tokens a second. As
    sec. 3.2 lays it out: 16-way pipeline parallelism with DualPipe (its V-shaped, one-copy form here), 64-way
    expert parallelism over 8 nodes, ZeRO-1 data parallelism, no TP; FP8 GEMMs (sec. 3.3); RMSNorm and MLA
    up-projection recomputed (sec. 3.2.3); seq 4096 and 15,360 sequences a step after the first 469B tokens
    (sec. 4.2); one MTP module (sec. 2.2); its own dispatch kernels (DeepEP's). The figure is the run's
    average: the smaller batches of its first 3% of tokens and any restart are in it, so it bounds the step
    from above. The micro-batch size is not stated: 1. How it permutes tokens for its experts is not stated
    either: fused kernels, as a team that wrote its own dispatch kernels would ([software] moe_permute_fusion)."""
    model, batch = load_model("deepseek-v3"), 15360
    tokens_per_s = 2048 * 1e12 / (180e3 * 3600)
    yield Run("DeepSeek-V3 T1", "DeepSeek-V3 671B", model, "h800",
              "dp=128,zero=1,pp=16,schedule=dualpipev,ep=64,mbs=1,recompute=layernorm+mla_up_proj", 2048, batch,
              batch * model.seq / tokens_per_s, "H800", replace(MEGATRON_CORE, moe_dispatcher="deepep",
                                                               moe_permute_fusion=True),
              precision="fp8")


def megatron_core_flops(model: ModelSpec, batch: int) -> float:
    """Megatron-LM's own count (training.py num_floating_point_operations, 2024): 12*B*s*L*h^2 times
    attention ((1 + kv/heads + s/h) * q/h, non-causal), MLP (ffn/h * top_k * 3/2 for SwiGLU) and logits."""
    h, s = model.hidden, model.seq
    q = model.heads * model.head_dim / h
    attention = (1 + model.kv_heads / model.heads + s / h) * q
    mlp = (model.expert_ffn if model.is_moe else model.ffn) / h * (model.top_k or 1) * model.mlp_matrices / 2
    return 12 * batch * s * model.layers * h * h * (attention + mlp + model.vocab / (2 * model.layers * h))


def mixtral_runs():
    """NVIDIA/Megatron-LM megatron/core/transformer/moe/README.md: Mixtral 8x7B bf16 on 64 H100 with the reference
    mapping of its table, seq 4096, TP1 EP8 PP4 VP8, MBS 1, GBS 256, dropless all-to-all, distributed optimizer
    with overlapped grad reduce and param gather. Two releases of the README give two rates for that mapping:
    438 TFLOP/s per GPU with MCore v0.8 (PyTorch 24.04, Transformer Engine 1.9; fbdc9167, 2024-10) and 468 with
    MCore v0.9 (PyTorch 24.09, Transformer Engine 1.11; c230e0d7, 2024-11). Both permute with torch ops
    (moe_utils: argsort, then index_select or, in v0.9, its own gather), the unfused default. v0.9's dispatcher
    changes (token-level all-to-all, sort_chunks_by_idxs) touch TP > 1 and several local experts, which this
    mapping has not, so one Software stands for both: the 7% between them is the newer containers' kernels."""
    model = load_model("mixtral-8x7b")
    for release, tflops in (("MCore 0.8", 438e12), ("MCore 0.9", 468e12)):
        yield Run("Megatron-Core MoE README", f"Mixtral 8x7B {release}", model, "h100-80gb",
                  "dp=16,zero=1,pp=4,vpp=8,schedule=interleaved,ep=8,mbs=1", 64, 256,
                  megatron_core_flops(model, 256) / (64 * tflops), "H100", MEGATRON_CORE)


# AI-Hypercomputer/tpu-recipes training/trillium/Mixtral-8x7B-MaxText/README.md at f81bfc9 (2024-10-30): Mixtral 8x7B
# on one v6e-256 slice, MaxText at 2e1ebad7 (2024-10-29), libtpu 20241028; benchmarks/maxtext_trillium_model_configs.py
# mixtral_8x7b_dropped (and _int8, quantization int8: AQT in all three passes): FSDP over the 256 chips, 8 sequences
# of 4,096 a chip, full remat, splash attention, megablox off with capacity_factor 1.25, so layers/linears.py
# dense_matmul dispatches and combines by GShard's one-hot einsums into buffers of 1.25x an expert's balanced share
# ([software] moe_dispatcher einsum; the model's capacity_factor). Measured: the step the README shows of each run
# ("completed step: 19, seconds: 8.409"; int8's step 18, 8.218). Not modelled: use_iota_embed's one-hot embedding
# matmul (0.7% of the FLOPs).
TRILLIUM_MIXTRAL = (("bf16", 8.409), ("int8", 8.218))


def trillium_mixtral_runs():
    model = replace(load_model("mixtral-8x7b"), capacity_factor=1.25)
    for precision, seconds in TRILLIUM_MIXTRAL:
        yield Run("tpu-recipes Trillium", f"Mixtral 8x7B dropped {precision}", model, "tpu-v6e",
                  "dp=256,zero=3,mbs=8,recompute=full", 256, 2048, seconds, "TPU v6e",
                  replace(XLA, moe_dispatcher="einsum"), precision=precision)


# Megatron-DeepSpeed: bf16 under DeepSpeed's BF16_Optimizer (ZeRO-0 in the config, partitioned like ZeRO-1;
# cost/step.py bf16_optimizer), its fp32 gradients all-reduced in buffers of 5e8 elements.
BLOOM_SOFTWARE = replace(MEGATRON_2021, framework="deepspeed", grad_reduce_fp32=True)


def bloom_runs():
    """BigScience 2022 (arXiv:2211.05100 sec. 3.4 and the BigScience 176B model page): BLOOM on 48 nodes of 8
    A100 80GB (Jean Zay: NVLink inside a node, 4 x 100 Gb/s Omni-Path per node, 6.25 GB/s per GPU), TP4 x PP12
    x DP8 with ZeRO-1 (Megatron-DeepSpeed, 1F1B, full recomputation, micro-batch 2), 2048 sequences of 2048,
    "about 150 TFLOP/s" per GPU in Narayanan et al.'s count. ALiBi (no position table), tied embeddings.
    Trained in bf16 (sec. 3.4), whose DeepSpeed optimizer accumulates and reduces fp32 gradients."""
    model = ModelSpec(name="bloom-176b", layers=70, hidden=14336, heads=112, ffn=4 * 14336, vocab=250880,
                      seq=2048, mlp="gelu", tied_embeddings=True, biases=True)
    cluster = "a100-80gb"
    seconds = narayanan_seconds(14336, 70, 2048, 384, 150, v=250880)
    yield Run("BLOOM paper / model page", "BLOOM 176B", model, cluster,
              "dp=8,zero=1,tp=4,pp=12,mbs=2,recompute=full", 384, 2048, seconds, "A100", BLOOM_SOFTWARE, False,
              nic=6.25e9)


def neox_runs():
    """Black et al. 2022 (arXiv:2204.06745, sec. 2.3 and 3): GPT-NeoX-20B on twelve Supermicro AS-4124GO-NART
    servers of 8 A100-SXM4-40GB (NVSwitch inside; four 200 Gb/s HDR HCAs a server, 12.5 GB/s a GPU), PyTorch
    1.10, NCCL 2.10.3, "117 teraFLOPS per GPU". The layout and software are the configs/20B.yml it released
    (EleutherAI/gpt-neox c560814b, 2022-02-10): TP 2 x PP 4 (DeepSpeed's pipeline engine, 1F1B) x DP 12,
    micro-batch 4, 32 micro-batches (1,536 sequences of 2,048), every layer recomputed, fp16 with ZeRO-1 (fp16
    gradients reduced after the backward), no fused attention (its softmax kernel alone). The FLOP count is the
    logger's of that commit (megatron/logging.py get_flops: 6 x every parameter + 60 s h L a token, recompute
    uncounted): 43.9 s a step, 1,827 hours over the 150,000 steps (summaries of the paper quote 1,830). Model:
    44 layers, hidden 6144, 64 heads, GeLU MLP of 24,576, vocab 50,432 untied, a quarter of each head rotated,
    GPT-J's parallel residual, biases."""
    model = ModelSpec(name="gpt-neox-20b", layers=44, hidden=6144, heads=64, ffn=24576, vocab=50432, seq=2048,
                      mlp="gelu", biases=True, parallel_residual=True, rotary_fraction=0.25)
    flops_per_token = 6 * 20_556_201_984 + 60 * model.seq * model.hidden * model.layers
    batch, gpus = 1536, 96
    seconds = batch * model.seq * flops_per_token / (gpus * 117e12)
    software = replace(MEGATRON_2021, framework="deepspeed")
    yield Run("GPT-NeoX-20B paper / 20B.yml", "GPT-NeoX 20B", model, "a100-40gb",
              "dp=12,zero=1,tp=2,pp=4,mbs=4,recompute=full", gpus, batch, seconds, "A100", software, False,
              nic=12.5e9)


def nemo_vocab(vocab: int, tp: int) -> int:
    """The vocabulary as NeMo pads it: to a multiple of 128 x TP (make_vocab_size_divisible_by)."""
    return math.ceil(vocab / (128 * tp)) * 128 * tp


def gpt3(name, layers, hidden, heads):  # NeMo GPTConfig: GeLU, biases, learned positions, tied, GPT-2 BPE
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden, vocab=50257,
                     seq=2048, mlp="gelu", tied_embeddings=True, learned_positions=True, biases=True)


def nemo_runs():
    """NVIDIA/NeMo docs/source/performance/performance_summary.md at 8e3d65dc ("24.07 perf numbers", 2024-09-09,
    the table's last version before NeMo moved it to its docs site; it revised the first, 4c73f776 of 2024-08-14,
    by -3.9% to +5.5%): FP8 pre-training on DGX-H100, NeMo 24.07 (Megatron-Core, Transformer Engine), tokens/s per
    GPU as published.
    Software from NVIDIA/NeMo-Framework-Launcher's configs of the time (launcher_scripts/conf/training/*.yaml
    and examples/training/*/h100/*_fp8*.sh at 20ab57b, 2024-08-13): FP8 linear layers (fp8_hybrid, bf16
    parameters, attention in bf16), the distributed optimizer with overlapped gradient reduce-scatter and
    parameter all-gather (bf16 parameters), gradients reduced in bf16 (the scripts' grad_sync_dtype=bf16) but
    for Nemotron 8B/22B (fp32, the default), Transformer Engine's TP overlap where ub_tp_comm_overlap is set,
    no recomputation, vocabularies padded to a multiple of 128 x TP. Nemotron-340B's row matches no public
    config of the time: we take NeMo 2.0's recipe (TP overlap, fp32 gradients, no recomputation). Attention ran
    in flash-attn's kernel (FlashAttention-2), not cuDNN's: the launcher's conf/config.yaml sets
    NVTE_FUSED_ATTN=0 ("Disable cudnn FA until we've tested it more") from 2024-02-13 to 2024-08-29, but for
    GPT3-175B, whose example script sets NVTE_FUSED_ATTN=1 (95c77b59, "Enable cuDNN FlashAtt only for 175B")."""
    def nemotron(name, layers, hidden, heads, kv_heads, ffn):  # Nemotron-4's block (the nemotron-4-340b preset's)
        return replace(load_model("nemotron-4-340b"), name=name, layers=layers, hidden=hidden, heads=heads,
                       kv_heads=kv_heads or heads, head_dim=hidden // heads, ffn=ffn)

    models = {"GPT3-5B": gpt3("gpt3-5b", 24, 4096, 32),
              "GPT3-20B": gpt3("gpt3-20b", 44, 6144, 48),
              "GPT3-175B": gpt3("gpt3-175b", 96, 12288, 96),
              "Nemotron-8B": nemotron("nemotron-8b", 32, 4096, 32, 0, 16384),
              "Nemotron-22B": nemotron("nemotron-22b", 40, 6144, 48, 0, 24576),
              "Nemotron-340B": load_model("nemotron-4-340b"),
              **{name.upper(): load_model(name) for name in ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
                                                             "llama3-70b")}}
    # (model, GPUs, GBS, MBS, seq, TP, PP, CP, VP, tokens/s per GPU, TP overlap, fp32 gradients)
    rows = [("GPT3-5B", 64, 2048, 4, 2048, 1, 1, 1, 1, 23406, False, False),
            ("GPT3-20B", 64, 256, 2, 2048, 2, 1, 1, 1, 5851, True, False),
            ("GPT3-175B", 128, 256, 1, 2048, 4, 8, 1, 6, 716, False, False),
            ("GPT3-175B", 512, 2048, 2, 2048, 4, 8, 1, 6, 825, True, False),
            ("LLAMA2-7B", 8, 128, 1, 4096, 1, 1, 1, 1, 16934, False, False),
            ("LLAMA2-13B", 16, 128, 1, 4096, 1, 4, 1, 10, 8715, False, False),
            ("LLAMA2-70B", 64, 128, 1, 4096, 4, 4, 1, 20, 1728, True, False),
            ("Nemotron-8B", 64, 256, 4, 4096, 2, 1, 1, 1, 12507, True, True),
            ("Nemotron-22B", 64, 256, 2, 4096, 2, 4, 1, 10, 4312, True, True),
            ("Nemotron-340B", 128, 32, 1, 4096, 8, 8, 1, 12, 326, True, True),
            ("LLAMA3-8B", 8, 128, 1, 8192, 1, 1, 2, 1, 12273, False, False),
            ("LLAMA3-70B", 64, 128, 1, 8192, 4, 4, 2, 5, 1524, True, False)]
    for name, gpus, gbs, mbs, seq, tp, pp, cp, vp, per_gpu, tp_overlap, fp32_grads in rows:
        model = models[name]
        model = replace(model, seq=seq, vocab=nemo_vocab(model.vocab, tp))
        layout = (f"dp={gpus // (tp * pp * cp)},zero=1,tp={tp},pp={pp},cp={cp},mbs={mbs}"
                  + (",sp=true" if tp > 1 else "") + (f",schedule=interleaved,vpp={vp}" if vp > 1 else ""))
        software = replace(MEGATRON_CORE, tp_comm_overlap=tp_overlap, grad_reduce_fp32=fp32_grads,
                           attention_kernel="platform" if name == "GPT3-175B" else "fa2")
        yield Run("NeMo 24.07 perf summary", f"{name} fp8", model, "h100-80gb", layout, gpus, gbs,
                  gbs * seq / (per_gpu * gpus), "H100", software, precision="fp8")


# MLPerf Training GPT-3 175B (mlcommons/training_results_v4.0, 2024-06, and _v4.1, 2024-11; closed division):
# NeMo / Megatron-Core with Transformer Engine's FP8 (hybrid), seq 2048, each submitter's
# benchmarks/gpt3/.../config_*.sh: TP overlap, the distributed optimizer reducing bf16 gradients
# (grad_sync_dtype), FP8 parameters (FP8_PARAMS), cuDNN attention (NVTE_FUSED_ATTN=1 on B200; Transformer
# Engine prefers it on Hopper), per-layer CUDA graphs where LAYER_CUDA_GRAPH=1. Measured: the median of the
# results' "train_step_timing in s" (NeMo's timer, steps only); where a log has none, a training block's
# span over its steps (block_start to block_stop, evaluation outside). Sustainable Metal Cloud's v4.0 run (64
# immersion-cooled SMC-H100 nodes) is NVIDIA's NeMo 24.04 submission but for INTERLEAVED_PIPELINE, unset: its log
# has custom.yaml's 12 chunks of one layer. (system, hardware, preset, GPUs, GBS, TP, PP, VPP, micro-batch, CUDA
# graphs, seconds)
MLPERF_GPT3 = [
    ("NVIDIA b200_n8_preview (v4.1)", "B200", "b200", 64, 2048, 4, 8, 6, 2, True, 36.23),
    ("NVIDIA eos_n32 (v4.1)", "H100", "h100-80gb", 256, 2048, 4, 8, 6, 2, False, 18.37),
    ("NVIDIA eos_n64 (v4.0)", "H100", "h100-80gb", 512, 2304, 4, 8, 4, 2, False, 10.98),  # its log's batch
    ("NVIDIA eos_n64 (v4.1)", "H100", "h100-80gb", 512, 2048, 4, 8, 6, 2, False, 9.50),
    ("SMC 64xSMC-H100-SXM-80GB (v4.0)", "H100", "h100-80gb", 512, 2048, 4, 8, 12, 2, False, 10.636),
    ("Oracle 1536xBM.GPU.H100.8 (v4.1)", "H100", "h100-80gb", 1536, 3072, 4, 8, 4, 2, False, 5.17),
    ("Oracle 3072xBM.GPU.H100.8 (v4.1)", "H100", "h100-80gb", 3072, 3072, 4, 8, 4, 2, False, 3.05),
    ("NVIDIA eos-dfw_n1344 (v4.0)", "H100", "h100-80gb", 10752, 2688, 4, 6, 8, 1, True, 0.921),
    ("NVIDIA eos-dfw_n1452 (v4.1)", "H100", "h100-80gb", 11616, 2904, 4, 6, 8, 1, True, 0.921)]


# MLPerf Training v3.1 (training_results_v3.1, 2023-11), NeMo 23.09: the same settings without FP8 parameters
# (no FP8_PARAMS then) or CUDA graphs; TP4 PP8 and custom.yaml's default interleaving, 12 chunks of one layer
# (INTERLEAVED_PIPELINE unset); FlashAttention-2 (the Dockerfile installs flash-attn 2.0.8, and Transformer
# Engine at its 09ba842 runs flash-attn whenever it can: its preference for cuDNN on sm90 came in v1.2).
# Measured: the median of the three results' train_step_timing medians; batch and data-parallel size from each
# log's global_batch_size and gradient_accumulation_steps (eos_n64 ran 2,048, not its config's 3,072).
MLPERF_GPT3_2023 = [
    ("NVIDIA eos_n64 (v3.1)", "H100", "h100-80gb", 512, 2048, 4, 8, 12, 1, False, 11.054),
    ("NVIDIA eos_n96 (v3.1)", "H100", "h100-80gb", 768, 3072, 4, 8, 12, 1, False, 11.075),
    ("NVIDIA eos-dfw_n512 (v3.1)", "H100", "h100-80gb", 4096, 2048, 4, 8, 12, 1, False, 1.608),
    ("NVIDIA eos-dfw_n768 (v3.1)", "H100", "h100-80gb", 6144, 3072, 4, 8, 12, 1, False, 1.615),
    ("NVIDIA eos-dfw_n1024 (v3.1)", "H100", "h100-80gb", 8192, 4096, 4, 8, 12, 1, False, 1.619),
    ("NVIDIA eos-dfw_n1280 (v3.1)", "H100", "h100-80gb", 10240, 2560, 4, 8, 12, 1, False, 0.926),
    ("NVIDIA eos-dfw_n1344 (v3.1)", "H100", "h100-80gb", 10752, 2688, 4, 8, 12, 1, False, 0.930),
    ("Azure ND_H100_v5_n1344 (v3.1)", "H100", "h100-80gb", 10752, 2688, 4, 8, 12, 1, False, 0.945)]


# MLPerf Training v3.0 (training_results_v3.0, 2023-06): NVIDIA's and NVIDIA+CoreWeave's one submission (identical
# configs, PyTorch 23.04, NeMo 1.17): the v3.1 settings but for the kernel Transformer Engine release_v0.8 ran,
# FlashAttention v1 (requirements.txt: flash_attn==1.0.5; TE 0.8's DotProductAttention takes it from compute
# capability 8.0 up). Measured: the median of the three results' train_step_timing medians (no block's span).
MLPERF_GPT3_V30 = [
    ("NVIDIA dgxh100_n64 (v3.0)", "H100", "h100-80gb", 512, 2048, 4, 8, 12, 1, False, 12.074),
    ("NVIDIA dgxh100_n96 (v3.0)", "H100", "h100-80gb", 768, 3072, 4, 8, 12, 1, False, 12.127),
    ("CoreWeave hgxh100_n96 (v3.0)", "H100", "h100-80gb", 768, 3072, 4, 8, 12, 1, False, 12.305),
    ("CoreWeave hgxh100_n192 (v3.0)", "H100", "h100-80gb", 1536, 3072, 4, 8, 12, 1, False, 6.340),
    ("CoreWeave hgxh100_n448 (v3.0)", "H100", "h100-80gb", 3584, 2688, 4, 8, 12, 1, False, 2.600)]


def mlperf_runs():
    for rows, fp8_params, attention in ((MLPERF_GPT3, True, "platform"), (MLPERF_GPT3_2023, False, "fa2"),
                                        (MLPERF_GPT3_V30, False, "fa1")):
        for system, hardware, cluster, gpus, gbs, tp, pp, vp, mbs, graphs, seconds in rows:
            model = gpt3("gpt3-175b", 96, 12288, 96)
            model = replace(model, vocab=nemo_vocab(model.vocab, tp))
            layout = f"dp={gpus // (tp * pp)},zero=1,tp={tp},sp=true,pp={pp},vpp={vp},schedule=interleaved,mbs={mbs}"
            software = replace(MEGATRON_CORE, tp_comm_overlap=True, grad_reduce_fp32=False,
                               fp8_param_gather=fp8_params, cuda_graphs=graphs, attention_kernel=attention)
            yield Run("MLPerf Training GPT-3", f"{system} 175B fp8", model, cluster, layout, gpus, gbs, seconds,
                      hardware, software, precision="fp8")


# MLPerf Training v4.1's Llama 2 70B LoRA (training_results_v4.1, 2024-11, closed division; NeMo 24.09): rank-16
# adapters with dropout 0.1 beside each layer's QKV and output projections (megatron_gpt_peft_tuning_config.yaml), the
# base frozen in FP8 (FP8, fp8_params), sequences packed to 8,192 tokens attending across the whole pack
# (packed_sequence_return_cu_seqlen false), micro-batch 1, SP with TP, TP overlap but for the QKV projection's
# all-gather (tp_comm_overlap_disable_qkv, MC_TP_DISABLE_QKV's default in every config but Lambda's), the input-gradient
# reduce-scatters pipelined with their dgrad GEMMs (MC_TP_OVERLAP_RS_DGRAD: config_common's True, which every multi-node
# TP4 config sets False; tp_overlap_rs_dgrad), cuDNN attention in bf16 (FP8_DPA=0) or in FP8 (FP8_DPA=1 and
# NVTE_FP8_DPA_BWD=1: [software] fp8_attention, at cuDNN 9.19's measured speed), per-layer CUDA graphs where
# LAYER_CUDA_GRAPH=1, the adapters' SP all-to-all (LORA_A2A=1, a2a_experimental), FP8 weights without a cached transpose
# (fp8_params, disable_parameter_transpose_cache). Every submitter's run whose configuration is on record: its logs'
# config dump (Lenovo, Oracle: fp8_dot_product_attention 0) or the config file its system name runs (NVIDIA's, Azure,
# Dell's 8 nodes); the other single nodes and Dell's 2- and 4-node runs have neither in the submission. v4.0's set (NeMo
# 24.04) is left out: every config of it ran FP8 attention (config_common's FP8_DPA=1) on the TE and cuDNN of early
# 2024, whose FP8 kernels no scan here measures and which v4.1 turned off across nodes; costed with 9.19's, NVIDIA's
# four rows would read +3.9% (H200), +10.0%, -18.1% and -20.1% (1, 8 and 128 H100 nodes). Measured: the lower median of
# the ten results' last "throughput" (samples a second over the training steps alone: custom_callbacks.py times each
# batch), the global batch (each log's global_batch_size) over it. (system, hardware, preset, GPUs, GBS, TP, CP, CUDA
# graphs, FP8 attention, dgrad reduce-scatter pipelined, samples a second)
MLPERF_LORA = [
    ("NVIDIA h200_ngc24.09 (v4.1)", "H200", "h200", 8, 8, 1, 2, False, False, False, 2.4718),
    ("Lenovo SR680aV3-8xH200 (v4.1)", "H200", "h200", 8, 8, 1, 2, False, False, False, 2.5866),
    ("Lenovo SR685aV3-8xH200 (v4.1)", "H200", "h200", 8, 8, 1, 2, False, False, False, 2.5767),
    ("Lenovo SR780aV3-8xH200 (v4.1)", "H200", "h200", 8, 8, 1, 2, False, False, False, 2.5591),
    ("Azure ND_H200_v5_n64 (v4.1)", "H200", "h200", 512, 64, 4, 2, True, False, False, 112.333),
    ("NVIDIA eos_ngc24.09 (v4.1)", "H100", "h100-80gb", 8, 8, 4, 1, False, True, True, 2.1825),
    ("NVIDIA eos_n8_ngc24.09 (v4.1)", "H100", "h100-80gb", 64, 8, 4, 2, True, False, False, 14.797),
    ("Dell 8xXE9680x8H100-SXM-80GB (v4.1)", "H100", "h100-80gb", 64, 8, 4, 2, True, False, False, 14.470),
    ("Oracle 64xBM.GPU.H100.8 (v4.1)", "H100", "h100-80gb", 64, 8, 4, 2, True, False, False, 14.416),
    ("Oracle 128xBM.GPU.H100.8 (v4.1)", "H100", "h100-80gb", 128, 16, 4, 2, True, False, False, 28.771),
    ("Oracle 512xBM.GPU.H100.8 (v4.1)", "H100", "h100-80gb", 512, 64, 4, 2, True, False, False, 114.528),
    ("NVIDIA eos_n128_ngc24.09 (v4.1)", "H100", "h100-80gb", 1024, 128, 4, 2, True, False, False, 235.115),
    ("NVIDIA b200_preview (v4.1)", "B200", "b200", 8, 8, 1, 2, True, True, False, 4.6951)]


def mlperf_lora_runs():
    for system, hardware, cluster, gpus, gbs, tp, cp, graphs, fp8_attention, rs_dgrad, samples_per_s in MLPERF_LORA:
        base = load_model("llama2-70b").with_seq(8192)
        model = replace(base, vocab=nemo_vocab(base.vocab, tp), lora_rank=16, lora_dropout=0.1)
        layout = f"dp={gpus // (tp * cp)},zero=1,tp={tp},sp={str(tp > 1).lower()},cp={cp},mbs=1"
        software = replace(MEGATRON_CORE, tp_comm_overlap=True, tp_overlap_disable_qkv=True, lora_all_to_all=True,
                           fp8_param_gather=True, disable_parameter_transpose_cache=True, cuda_graphs=graphs,
                           fp8_attention=fp8_attention, tp_overlap_rs_dgrad=rs_dgrad)
        yield Run("MLPerf Training Llama 2 70B LoRA", f"{system} r16 fp8", model, cluster, layout, gpus, gbs,
                  gbs / samples_per_s, hardware, software, precision="fp8")


# Google's MLPerf Training GPT-3 175B runs, v4.0 (mlcommons/training_results_v4.0, 2024-06: MaxText at f586e43f)
# and v4.1 (training_results_v4.1, 2024-11: the mlperf/4.1 branch the submission holds as maxtext_fork), closed
# division, each with the cloud-tpu-*.sh or v5p-*.sh that launches it. Their gpt3-175b config: 96 layers of
# 12288, 96 heads, GeLU MLP of 49152, biases, LayerNorm, learned positions, logits off the embedding, vocab
# 50304, seq 2048; causal splash attention (attention=flash); quantization=int8 (AQT in all three passes:
# cost/kernels.py int8_quantize_seconds). v5p: ici_data x ici_fsdp x ici_tensor on one slice (v4.0's remat
# save_dot_except_logits keeps what `minimal` keeps; save_dot_except_logits_ffn1 and v4.1's save_dot_except_mlpwi
# all but the MLP's first matmul's output, `minimal_mlp`), LIBTPU_INIT_ARGS with --xla_tpu_decompose_all_gather_einsum
# and not its reduce-scatter twin (XLA's collective matmul for the all-gathers alone: [software] tp_comm_overlap,
# tp_overlap_scatters false). Trillium: FSDP over each v6e-256 slice, the slices data-parallel over DCN,
# enable_tff_quant (the attention output projection and the MLP quantize their forward only: [software]
# int8_forward_only). Measured: the median over the three results of each block's median span (block_start to
# block_stop) over its steps. A block ends with an evaluation of 24,567 sequences (early_stop_check logs
# block_stop after it), as many as the block trains (50,331,648 tokens), at eval_per_device_batch_size 1
# (`eval_batch`: one sequence a chip).
# (system, preset, chips, slices, GBS, tp, ici data-parallel replicas, remat, seconds a step)
MLPERF_MAXTEXT = [("v5p-1024 (v4.0)", "tpu-v5p", 512, 1, 2048, 8, 1, "full", 285.777 / 12),
                  ("v5p-2048 (v4.0)", "tpu-v5p", 1024, 1, 2048, 8, 8, "minimal_mlp", 141.762 / 12),
                  ("v5p-3072 (v4.0)", "tpu-v5p", 1536, 1, 3072, 8, 12, "minimal_mlp", 95.608 / 8),
                  ("v5p-12288 (v4.0)", "tpu-v5p", 6144, 1, 6144, 8, 16, "minimal", 23.87 / 4),
                  ("v5p-4096 (v4.1)", "tpu-v5p", 2048, 1, 4096, 8, 4, "minimal_mlp", 67.4905 / 6),
                  ("v5p-8192 (v4.1)", "tpu-v5p", 4096, 1, 4096, 8, 16, "minimal", 37.0615 / 6),
                  ("v5p-12288 (v4.1)", "tpu-v5p", 6144, 1, 6144, 8, 16, "minimal", 23.965 / 4),
                  ("trillium-512 (v4.1)", "tpu-v6e", 512, 2, 1536, 1, 1, "full", 253.7885 / 16),
                  ("trillium-1024 (v4.1)", "tpu-v6e", 1024, 4, 2048, 1, 1, "full", 128.81 / 12),
                  ("trillium-2048 (v4.1)", "tpu-v6e", 2048, 8, 4096, 1, 1, "full", 64.488 / 6),
                  ("trillium-3072 (v4.1)", "tpu-v6e", 3072, 12, 6144, 1, 1, "full", 43.145 / 4)]


def mlperf_maxtext_runs():
    model = replace(gpt3("gpt3-175b", 96, 12288, 96), vocab=50304)
    for system, cluster, chips, slices, gbs, tp, replicas, remat, seconds in MLPERF_MAXTEXT:
        fsdp = chips // (slices * replicas * tp)
        layout = (f"dp={chips // tp},zero=3,shard={fsdp},tp={tp}" + (",sp=true" if tp > 1 else "")
                  + f",mbs={gbs // (chips // tp)},recompute={remat}")
        v5p = cluster == "tpu-v5p"
        software = replace(XLA, tp_comm_overlap=v5p, tp_overlap_scatters=False,
                           int8_forward_only="" if v5p else "attention_out+mlp")
        yield Run("MLPerf Training GPT-3", f"Google {system} 175B int8", model, cluster, layout, chips, gbs,
                  seconds, "TPU " + cluster[4:], software, torus=SLICES[chips] if v5p else (), precision="int8",
                  eval_batch=chips)


# NVIDIA/NeMo docs/source/performance/performance_long_sequence.md (8275bf6, 2024-10-21): LLAMA2-7B FP8
# pre-training on DGX-H100 with context parallelism, NeMo 24.03.01, one GPU per 1k tokens of sequence:
# (seq in k, TP, PP, DP, CP, TFLOP/s per GPU). TFLOP/s in Megatron's count (non-causal attention): the 4k row's
# 768 sits beside the 24.07 summary's 16,934 tokens/s for the same model, 780 in that count (726 causal). The
# NeMo-Framework-Launcher of the time (21657d24, 2024-04) ran Transformer Engine's flash-attn backend
# (NVTE_FUSED_ATTN=0) and llama2_7b.yaml's micro-batch 1, no recomputation, no TP overlap. Not stated: the
# global batch (the yaml's 2048 sequences; the rate hardly depends on it) and sequence parallelism (taken on).
NEMO_LONG_SEQUENCE = [(4, 1, 1, 4, 1, 768), (8, 1, 2, 4, 1, 730), (16, 2, 1, 8, 1, 660), (32, 2, 1, 8, 2, 610),
                      (64, 4, 1, 8, 2, 574), (128, 4, 1, 8, 4, 555), (256, 4, 1, 8, 8, 549), (512, 8, 1, 4, 16, 549),
                      (1024, 8, 1, 4, 32, 536)]


def nemo_finetuning_runs():
    """The same table's fine-tuning rows (8e3d65dc, "Finetuning"): Llama 2 7B, 13B and 70B, SFT (every parameter)
    and LoRA, FP8 on DGX-H100, NeMo 24.07, SQuAD v1.1 packed to 4,096 tokens, global batch 32, micro-batch 1,
    tokens/s per GPU as published, taken as 32 packs of 4,096 a step (pad_to_max_length pads each pack: padding
    counted). Software from the launcher's examples/peft/llama/h100/*.sh that name these layouts (unchanged from
    2024-06 to 2025-04) over conf/peft/llama/sft.yaml of the time (1a7171d7, 2024-07-17):
    - SFT: Apex's distributed Adam reducing bf16 gradients (grad_sync_dtype bf16) with overlap, as pre-training's,
      gathering FP8 parameters (fp8_params); 70B with SP and TP overlap; PP with overlapped sends.
    - LoRA: NeMo's lora_tuning (adapter_dim 32, dropout 0) on its default target, the fused QKV (peft_config.py
      get_target_modules: attention_qkv), fp8_params, fused_adam (no distributed optimizer). The 70B script sets
      ub_tp_comm_overlap without sequence_parallel, which NeMo switches off (megatron_base_model.py: TP overlap
      needs SP): TP 2 without SP.
    - Packed samples attend within themselves (GPTSFTPackedDataset's cu_seqlens, Transformer Engine's THD
      format): block-diagonal causal attention, samples of 256 tokens (packed_samples). A SQuAD v1.1 example is
      about 1,000 bytes with its paragraph (TFDS squad/v1.1: 94.06 MiB for 98,169), about 220 Llama tokens; 256
      stands for the mean of the squared lengths over the mean length. The 7B SFT's step moves 1.4% between 128
      and 512 (and is 15% longer attending across the whole 4,096).
    - Attention in flash-attn's kernel (the launcher's NVTE_FUSED_ATTN=0 of the time, as nemo_runs)."""
    # (model, task, GPUs, TP, PP, VP, tokens/s per GPU)
    rows = [("llama2-7b", "SFT", 8, 1, 1, 1, 16891), ("llama2-13b", "SFT", 8, 1, 4, 10, 10176),
            ("llama2-70b", "SFT", 16, 4, 4, 20, 1816), ("llama2-7b", "LoRA", 8, 1, 1, 1, 24824),
            ("llama2-13b", "LoRA", 8, 1, 1, 1, 14629), ("llama2-70b", "LoRA", 8, 2, 4, 1, 2621)]
    gbs, seq = 32, 4096
    for name, task, gpus, tp, pp, vp, per_gpu in rows:
        base = load_model(name)
        model = replace(base, seq=seq, vocab=nemo_vocab(base.vocab, tp), packed_samples=256)
        lora = task == "LoRA"
        if lora:
            model = replace(model, lora_rank=32, lora_modules="qkv")
        sp = tp > 1 and not lora
        layout = (f"dp={gpus // (tp * pp)},zero={0 if lora else 1},tp={tp},pp={pp},mbs=1"
                  + (",sp=true" if sp else "") + (f",schedule=interleaved,vpp={vp}" if vp > 1 else ""))
        software = replace(MEGATRON_CORE, tp_comm_overlap=sp, grad_reduce_fp32=False, fp8_param_gather=True,
                           attention_kernel="fa2")
        yield Run("NeMo 24.07 perf summary", f"{name} {task} fp8", model, "h100-80gb", layout, gpus, gbs,
                  gbs * seq / (per_gpu * gpus), "H100", software, precision="fp8")


def nemo_long_sequence_runs():
    base, batch = load_model("llama2-7b"), 2048
    software = replace(MEGATRON_CORE, attention_kernel="fa2")
    for k, tp, pp, dp, cp, tflops in NEMO_LONG_SEQUENCE:
        model = replace(base, seq=k * 1024, vocab=nemo_vocab(base.vocab, tp))
        gpus = tp * pp * dp * cp
        layout = f"dp={dp},zero=1,tp={tp},pp={pp},cp={cp},mbs=1" + (",sp=true" if tp > 1 else "")
        yield Run("NeMo long-sequence perf", f"LLAMA2-7B {k}k fp8", model, "h100-80gb", layout, gpus, batch,
                  megatron_core_flops(model, batch) / (gpus * tflops * 1e12), "H100", software, precision="fp8")


# MosaicML llm-foundry scripts/train/benchmarking/README.md at 5e85bd62 (2024-01-06): MPT models trained with
# Composer's FSDP (torch FSDP1, one unit a block, eager PyTorch, low-precision LayerNorm, MPT's Triton flash
# attention), every row at the models' own sequence length 2048: (model, GPUs, micro-batch, accumulation,
# global batch, tokens/s, sharding, activation checkpointing). MP mode DEFAULT reduces gradients in fp32, PURE
# in bf16. H100: both H100 80GB BF16 tables ("Large Scale" added in that commit); A100: the A100 80GB table.
MPT_SIZES = {"70b": (8192, 64, 80), "30b": (7168, 56, 48), "13b": (5120, 40, 40), "7b": (4096, 32, 32),
             "3b": (2560, 20, 32), "1b": (2048, 16, 24), "760m": (1536, 12, 24), "350m": (1024, 16, 24),
             "125m": (768, 12, 12)}
MOSAIC_H100_LARGE = [
    ("70b", 512, 8, 1, 4096, 515636, "full", True), ("70b", 256, 8, 1, 2048, 265149, "full", True),
    ("70b", 128, 8, 1, 1024, 135490, "full", True), ("30b", 512, 8, 1, 4096, 1083366, "full", True),
    ("30b", 256, 8, 1, 2048, 550022, "full", True), ("30b", 128, 8, 1, 1024, 281491, "full", True),
    ("13b", 512, 16, 1, 8192, 2535811, "full", True), ("13b", 256, 16, 1, 4096, 1277214, "full", True),
    ("13b", 128, 16, 1, 2048, 650264, "full", True), ("7b", 512, 6, 1, 3072, 4951479, "full", False),
    ("7b", 256, 6, 1, 1536, 2590548, "full", False), ("7b", 128, 6, 1, 768, 1340830, "full", False),
    ("3b", 512, 8, 1, 4096, 11092218, "grad", False), ("3b", 256, 8, 1, 2048, 5829686, "grad", False),
    ("3b", 128, 8, 1, 1024, 2998098, "grad", False), ("1b", 512, 12, 1, 6144, 20396905, "grad", False),
    ("1b", 256, 12, 1, 3072, 10894207, "grad", False), ("1b", 128, 12, 1, 1536, 5647854, "grad", False)]
MOSAIC_H100 = [
    ("70b", 64, 8, 4, 2048, 66523, "full", True), ("70b", 32, 2, 16, 1024, 28242, "full", True),
    ("30b", 32, 14, 3, 1344, 73860, "full", True), ("30b", 16, 10, 3, 480, 36209, "full", True),
    ("30b", 8, 3, 21, 504, 16022, "full", True), ("13b", 64, 2, 1, 128, 307209, "full", False),
    ("13b", 32, 2, 1, 64, 153960, "full", False), ("13b", 16, 2, 1, 32, 76280, "full", False),
    ("13b", 8, 2, 1, 16, 38336, "full", False), ("7b", 8, 6, 1, 48, 85144, "full", False),
    ("3b", 64, 6, 3, 1152, 1441663, "full", False), ("3b", 32, 6, 3, 576, 736701, "full", False),
    ("3b", 16, 10, 3, 480, 386285, "full", False), ("1b", 64, 20, 1, 1280, 2841754, "full", False),
    ("1b", 32, 20, 1, 640, 1444183, "full", False), ("1b", 16, 20, 1, 320, 736596, "full", False),
    ("1b", 8, 14, 1, 112, 363645, "full", False), ("760m", 32, 24, 1, 768, 2175091, "full", False),
    ("760m", 16, 24, 1, 384, 1096819, "full", False), ("760m", 8, 24, 2, 384, 505177, "full", False)]
MOSAIC_A100 = [
    ("70b", 64, 8, 4, 2048, 26274, "full", True, "PURE"), ("70b", 32, 2, 16, 1024, 11962, "full", True, "PURE"),
    ("30b", 8, 3, 21, 504, 7330, "full", True), ("13b", 8, 2, 3, 48, 18097, "full", False),
    ("7b", 8, 6, 2, 96, 37130, "full", False), ("3b", 8, 10, 2, 160, 86491, "full", False),
    ("1b", 8, 14, 4, 448, 164109, "full", False), ("760m", 8, 24, 2, 384, 259472, "full", False),
    ("350m", 8, 32, 2, 512, 470263, "full", False), ("125m", 8, 40, 2, 640, 1142641, "full", False),
    ("125m", 8, 32, 2, 512, 1133901, "full", False)]
# The H100 80GB FP8 table's one row at seq 2048 (Transformer Engine's FP8 linear layers, `amp_fp8`)
MOSAIC_H100_FP8 = [("3b", 8, 10, 6, 480, 244692, "full", False)]
# Composer's FSDP of 2023-24 is torch's FSDP1: flat parameters gathered in place (no copy-out). llm-foundry's
# benchmark runs set norm_type: low_precision_layernorm and attn_impl: triton (submit_benchmarks.py) and keep
# MPT's default loss_fn, fused_crossentropy (flash-attn's kernel; modeling_mpt.py); Composer computes the model's
# train metrics, LanguageCrossEntropy and LanguagePerplexity, after every micro-batch (trainer.py
# _train_microbatch -> _eval_train_metrics, composer 0e8bbf09).
COMPOSER = Software(framework="torch", fused_elementwise=False, fsdp_copy_out=False, low_precision_norm=True,
                    attention_kernel="fa-triton", fused_cross_entropy=True, metric_cross_entropies=2)
# The Large Scale table's sweep (sweep.py at 5e85bd62) ran FlashAttention-2 (flash-attn 2.4.2, `.[gpu-flash2]`)
# for these models and the Triton kernel for 13b and 30b; llm-foundry's flash_attn_fn unpads q, k and v for
# flash_attn_varlen_func and pads its output back, whatever the mask (llmfoundry/models/layers/attention.py there)
FA2_LARGE_SCALE = ("1b", "3b", "7b", "70b")


def mpt(name: str) -> ModelSpec:
    """MPT as llm-foundry's yamls/pretrain/mpt-*.yaml build it: GeLU MLP x4, no biases, learned positions, tied
    embeddings, vocab 50368, LayerNorm, seq 2048."""
    hidden, heads, layers = MPT_SIZES[name]
    return ModelSpec(name=f"mpt-{name}", layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden, vocab=50368,
                     seq=2048, mlp="gelu", norm="layernorm", tied_embeddings=True, learned_positions=True)


def mosaic_runs():
    for cluster, hardware, rows, precision in (("h100-80gb", "H100", MOSAIC_H100_LARGE, "bf16"),
                                               ("h100-80gb", "H100", MOSAIC_H100, "bf16"),
                                               ("h100-80gb", "H100", MOSAIC_H100_FP8, "fp8"),
                                               ("a100-80gb", "A100", MOSAIC_A100, "bf16")):
        for name, gpus, mbs, accum, batch, tokens_per_s, shard, ckpt, *mode in rows:
            model = mpt(name)
            zero = "zero=3" if shard == "full" else "zero=2"
            layout = f"dp={gpus},{zero},mbs={mbs}" + (",recompute=full" if ckpt else "")
            # FSDP reduces (and under SHARD_GRAD_OP gathers) one wrapped block at a time: MPT's fsdp_wrap_fn
            software = replace(COMPOSER, grad_reduce_fp32=mode != ["PURE"], grad_bucket_params=12 * model.hidden**2)
            if rows is MOSAIC_H100_LARGE and name in FA2_LARGE_SCALE:
                software = replace(software, attention_kernel="fa2", attention_unpad=True)
            if precision == "fp8":  # Composer's amp_fp8 is Transformer Engine's fp8_autocast with DelayedScaling
                software = replace(software, fp8_scaling="delayed")
            assert batch == gpus * mbs * accum, name
            yield Run("llm-foundry benchmarks", f"MPT-{name} {gpus}x{hardware} {precision} mbs{mbs}", model,
                      cluster, layout, gpus, batch, batch * model.seq / tokens_per_s, hardware, software,
                      precision=precision)


def runs():
    yield from megatron_runs()
    yield from torchtitan_runs()
    yield from maxtext_runs()
    yield from llama3_runs()
    yield from mixtral_runs()
    yield from deepseek_runs()
    yield from palm_runs()
    yield from megascale_runs()
    yield from bloom_runs()
    yield from neox_runs()
    yield from nemo_runs()
    yield from nemo_finetuning_runs()
    yield from nemo_long_sequence_runs()
    yield from mlperf_runs()
    yield from mlperf_lora_runs()
    yield from mlperf_maxtext_runs()
    yield from trillium_mixtral_runs()
    yield from mosaic_runs()


def rows(only: str = ""):
    """(run, layout, predicted seconds, measured seconds, prediction) of every run, or of those whose source or
    name holds `only` (any case)."""
    for run in runs():
        if only.lower() not in f"{run.source} {run.name}".lower():
            continue
        cluster = replace(load_cluster(run.cluster), software=run.software, fused_attention=run.fused_attention)
        if run.nic:
            cluster = replace(cluster, tiers=(cluster.tiers[0], replace(cluster.tiers[-1], bandwidth=run.nic)))
        if run.torus:
            ici = replace(cluster.tiers[0], size=math.prod(run.torus))
            cluster = replace(cluster, torus=run.torus, tiers=(ici, *cluster.tiers[1:]))
        assert run.hardware in pred_category(cluster, run), (run.hardware, run.cluster)
        layout = Layout.parse(run.layout, run.devices)
        pred = predict(run.model, cluster, layout, run.batch, run.precision)
        yield run, layout, pred.step_time_s + evaluation_seconds(run, cluster, layout), run.seconds, pred


def evaluation_seconds(run: Run, cluster, layout: Layout) -> float:
    """The evaluation inside a run's measured span: run.batch sequences in forward passes of run.eval_batch, each
    at the layout's shape with the micro-batch that batch gives, as long as its forward kernels or, where longer,
    ZeRO-3's forward all-gathers behind them (half of a step's: cost/comm.py gathers every unit again backward)."""
    if not run.eval_batch:
        return 0.0
    shape = replace(layout, mbs=run.eval_batch // (layout.devices // layout.tp))
    pred = predict(run.model, cluster, shape, run.eval_batch, run.precision)
    gathers = sum(e["time_s"] for e in pred.comm if e["axis"] == "dp" and e["collective"] == "all_gather") / 2
    return run.batch / run.eval_batch * max(pred.forward_s, gathers if shape.zero == 3 else 0.0)


def pred_category(cluster, run) -> str:
    return bands.category(cluster, run.model, run.precision)


def errors_by_category(pipelined: bool = False) -> dict[str, list[float]]:
    """Signed errors (predicted / measured - 1) per error-band category (cost/bands.py), of the pipelined runs
    (pp > 1) alone where `pipelined`."""
    out: dict = {}
    for run, layout, pred, real, p in rows():
        if layout.pp > 1 or not pipelined:
            out.setdefault(p.band["category"], []).append(pred / real - 1)
    return out


def computed_bands(pipelined: bool = False) -> dict[str, tuple]:
    """What cost/bands.py's BANDS (PIPELINED, where `pipelined`) must hold: per category (runs, median, p90, mean
    signed), to 0.01%."""
    out = {}
    for key, errs in sorted(errors_by_category(pipelined).items()):
        med, p90, _, bias = summary(errs)
        out[key] = (len(errs), med, p90, bias)
    return out


def computed_coverage() -> tuple[dict[str, int], int, float]:
    """What cost/bands.py's COVERAGE, CP_FEWEST_TOKENS and HOST_WAIT_MOST must hold: how many runs used each
    mechanism (`bands.mechanisms`), the fewest tokens a context-parallel rank of any run held, and the largest
    share of its predicted step any run's devices waited on their host, to 0.01%."""
    counts: dict = {}
    fewest, host = [], [0.0]
    for run, layout, _, _, pred in rows():
        for m in bands.mechanisms(layout):
            counts[m] = counts.get(m, 0) + 1
        fewest += [run.model.seq // layout.cp] if layout.cp > 1 else []
        host.append(pred.host_wait_s / pred.step_time_s)
    return dict(sorted(counts.items())), min(fewest, default=0), round(max(host), 4)


def wrapped(table: dict) -> str:
    """A dict's items as source lines of at most 120 characters, indented 4, an item never split."""
    lines = [""]
    for item in (f"{k!r}: {v!r}," for k, v in table.items()):
        lines += [""] if len(lines[-1]) + len(item) > 115 else []
        lines[-1] += f" {item}" if lines[-1] else item
    return "\n".join("    " + line for line in lines)


def write_bands(path: str) -> None:
    """Rewrite the written part of cost/bands.py from the current model (SOURCE, BANDS, PIPELINED, REPLICA_GROWTH,
    COVERAGE, CP_FEWEST_TOKENS and HOST_WAIT_MOST)."""
    text = open(path).read()
    head, rest = text.split("SOURCE = ", 1)
    _, tail = rest.split("# --- end of written part", 1)
    table = computed_bands()
    body = "".join(f"    {k!r}: {v!r},\n" for k, v in table.items())
    piped = "".join(f"    {k!r}: {v!r},\n" for k, v in computed_bands(pipelined=True).items())
    source = (f"benchmarks/published.py --write-bands, {sum(v[0] for v in table.values())} published runs "
              f"up to 2024, {datetime.date.today().isoformat()}")
    growth = computed_replica_growth()
    coverage, fewest, host = computed_coverage()
    open(path, "w").write(f"{head}SOURCE = {source!r}\n# \"hardware kind precision\": (runs, median |error|, "
                          f"p90 |error|, mean signed error)\nBANDS: dict[str, tuple[int, float, float, float]] = "
                          f"{{\n{body}}}\n# the same of each category's pipelined runs (pp > 1)\nPIPELINED: "
                          f"dict[str, tuple[int, float, float, float]] = {{\n{piped}}}\n# runs differing only in "
                          f"data-parallel size: (series, median step growth a doubling, measured, predicted)\n"
                          f"REPLICA_GROWTH: tuple[int, float, float] = {growth!r}\n"
                          f"# mechanisms the runs rest on (`mechanisms`): how many runs used each; the fewest tokens a "
                          f"context-parallel rank held\nCOVERAGE: dict[str, int] = {{\n{wrapped(coverage)}\n}}\n"
                          f"CP_FEWEST_TOKENS: int = {fewest!r}\n# the largest share of its step any run's devices "
                          f"waited on their host (cost/step.py host_wait_s)\nHOST_WAIT_MOST: float = {host!r}\n"
                          f"# --- end of written part{tail}")


def computed_replica_growth(series: list | None = None) -> tuple[int, float, float]:
    """What cost/bands.py's REPLICA_GROWTH must hold: the data-parallel series (`series`, else computed), and the
    median over them of the step's growth per doubling of the devices, measured and predicted, to 0.01%."""
    growth = [per_doubling(s) for s in (data_parallel_series() if series is None else series)]
    return (len(growth), round(statistics.median(m for m, _ in growth), 4),
            round(statistics.median(p for _, p in growth), 4))


def summary(errors: list[float]) -> tuple[float, float, float, float]:
    """Median, 90th percentile and max of |error|, and the mean signed error (negative: predicted too fast),
    to 0.01% as cost/bands.py stores them (so the printed table and the bands round alike)."""
    a = sorted(map(abs, errors))
    p90 = a[min(len(a) - 1, round(0.9 * (len(a) - 1)))]
    return tuple(round(x, 4) for x in (statistics.median(a), p90, a[-1], statistics.mean(errors)))


def data_parallel_series() -> list[list[tuple]]:
    """Runs that differ only in their data-parallel size (the same source, model, cluster, software, precision,
    per-device layout and batch: each device does the same work), as lists of (devices, measured s, predicted
    s, name) by device count: what the step loses as replicas are added, measured and predicted. A series spans
    1.5x the devices at least: over less (MLPerf's 10,240 and 10,752 GPUs, a fifteenth of a doubling) a 1%
    difference between two clusters reads as 15% a doubling."""
    groups: dict = {}
    for run, layout, pred, real, _ in rows():
        per_device = re.sub(r"(^|,)(dp|shard)=\d+", "", run.layout)
        key = (run.source, run.model, run.cluster, run.software, run.precision, per_device,
               run.batch / layout.dp)
        groups.setdefault(key, []).append((run.devices, real, pred, run.name))
    return [sorted(g) for g in groups.values() if max(d for d, *_ in g) >= 1.5 * min(d for d, *_ in g)]


def per_doubling(series: list[tuple]) -> tuple[float, float]:
    """A series' step growth per doubling of its devices, first run to last: (measured, predicted)."""
    (d0, m0, p0, _), (d1, m1, p1, _) = series[0], series[-1]
    doublings = math.log2(d1 / d0)
    return (m1 / m0) ** (1 / doublings) - 1, (p1 / p0) ** (1 / doublings) - 1


def print_data_parallel_series() -> None:
    print("step time per doubling of the data-parallel size, at the same work per device (first to last):")
    every = data_parallel_series()
    for series in every:
        measured, predicted = per_doubling(series)
        (d0, *_, name), (d1, *_) = series[0], series[-1]
        print(f"{name:34s} {d0:5d} -> {d1:5d} devices  measured {measured:+6.1%}  predicted {predicted:+6.1%}")
    runs, measured, predicted = computed_replica_growth(every)
    print(f"median of {runs} series: measured {measured:+.1%}, predicted {predicted:+.1%}")
    print_slice_costs()


def slice_costs() -> list[tuple]:
    """MaxText's multi-slice rows against their one-slice row: (name, slices, the step's measured growth per
    layer, the model's DCN all-reduce of one layer in seconds and in bytes). Each layer reduces its gradients
    across the slices over DCN once a step; whether the growth follows the bytes or the slice count says what
    costs it (docs/accuracy.md, "What a slice costs")."""
    single, out = {}, []
    for run, _, _, real, p in rows("MaxText README"):
        name, shape = run.name.rsplit(" ", 1)
        slices, chips = map(int, shape.split("x"))
        if slices == 1:
            single[name, chips] = real
        elif (name, chips) in single:
            dcn = [c for c in p.comm if c["tier"] == "dcn"]
            calls = max(1, sum(c["calls"] for c in dcn))
            out.append((run.name, slices, (real - single[name, chips]) / run.model.layers,
                        sum(c["time_s"] for c in dcn) / calls, sum(c["bytes"] for c in dcn) / calls))
    return out


def print_slice_costs() -> None:
    print("\nMaxText slices: measured step growth over one slice, per layer, beside the model's DCN all-reduce "
          "per layer:")
    for name, slices, grown, seconds, nbytes in slice_costs():
        print(f"{name:22s} {slices:3d} slices  {grown * 1e3:6.1f} ms a layer  DCN all-reduce "
              f"{seconds * 1e3:5.1f} ms a layer ({nbytes / 1e6:5.1f} MB)")


def print_runs(text: str) -> int:
    """--run TEXT: each run whose source or name holds TEXT, its measured step beside predict's breakdown of it
    (where the model puts the time: which term to look at when a run misses). Exit status 2 if none matches."""
    found = 0
    for run, layout, pred, real, p in rows(text):
        found += 1
        print(f"\n{run.source}: {run.name}, {run.devices} x {run.cluster}, {layout}, {run.batch} sequences a step: "
              f"measured {real:.3f} s, predicted {pred:.3f} s ({pred / real - 1:+.1%})")
        print_prediction(p)
    if not found:
        print(f"published.py: no run's source or name holds {text!r}; run without --run to list them all",
              file=sys.stderr)
    return 0 if found else 2


def print_table() -> None:
    by_category: dict = {}
    by_pipelining: dict = {}
    for run, layout, pred, real, p in rows():
        err = pred / real - 1
        by_category.setdefault(p.band["category"], []).append(err)
        by_pipelining.setdefault(p.band["category"], ([], []))[layout.pp == 1].append(err)
        fit = "" if p.fits else "  (does not fit)"
        print(f"{run.source:28s} {run.name:18s} {run.devices:6d} {str(layout):62s} predicted {pred:8.3f} s  "
              f"measured {real:8.3f} s  {err:+6.1%}{fit}")
    print("\n| category | runs | median abs error | 90th percentile | max | mean signed |\n"
          "|---|---|---|---|---|---|")
    everything = []
    for key, errs in sorted(by_category.items()):
        everything += errs
        med, p90, worst, bias = summary(errs)
        print(f"| {key} | {len(errs)} | {med:.1%} | {p90:.1%} | {worst:.1%} | {bias:+.1%} |")
    med, p90, worst, bias = summary(everything)
    print(f"| all | {len(everything)} | {med:.1%} | {p90:.1%} | {worst:.1%} | {bias:+.1%} |")
    print("\n| category | pipelined runs | median abs error | mean signed | other runs | median abs error "
          "| mean signed |\n|---|---|---|---|---|---|---|")
    for key, (piped, flat) in sorted(by_pipelining.items()):
        if piped and flat:
            (pm, _, _, pb), (fm, _, _, fb) = summary(piped), summary(flat)
            print(f"| {key} | {len(piped)} | {pm:.1%} | {pb:+.1%} | {len(flat)} | {fm:.1%} | {fb:+.1%} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="predicted step time against published measured runs")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--run", metavar="TEXT", help="break down the runs whose source or name holds TEXT")
    mode.add_argument("--data-parallel", action="store_true",
                      help="the runs that differ only in data-parallel size, and MaxText's slices a layer")
    mode.add_argument("--write-bands", action="store_true", help="rewrite cost/bands.py from these runs")
    args = parser.parse_args()
    if args.write_bands:
        write_bands(os.path.join(os.path.dirname(__file__), "..", "src", "meshscale", "cost", "bands.py"))
    elif args.data_parallel:
        print_data_parallel_series()
    elif args.run is not None:
        sys.exit(print_runs(args.run))
    else:
        print_table()
