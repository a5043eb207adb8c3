"""One GPU's kernels against the cost model's terms for the same shapes (run by hand on a CUDA machine; on one
without CUDA it says why and exits 0).

Each row is a micro-benchmark, the kind of source the cost model's efficiency terms come from, held against
what `cost/kernels.py` charges for that kernel on the matching preset (`--cluster`, default from the GPU's
name). Nothing here is fitted: the figures are for reading, and for a note that says where a term errs.

- GEMM, bf16 and FP8 (torch._scaled_mm, per-tensor scales), over a llama3-8b/70b layer's shapes and squares:
  measured TFLOP/s against `gemm_seconds`.
- Grouped GEMM (torch._grouped_mm, bf16) by tokens per expert, a rank's experts of Mixtral 8x7B at ep=1,
  Qwen3-235B-A22B at ep=8, DeepSeek-V3 at ep=32 and DeepSeek-V2 at ep=8, both matrices: forward (tokens as M)
  against `gemm_seconds(batch=groups)` over GROUPED_BF16_EFFICIENCY, and the weight gradient (tokens as K, one
  group's tokens each) against `gemm_seconds` of that shape over GROUPED_WGRAD_EFFICIENCY (both tables are these
  scans' own figures: the recorded rows replay at about 1), as `gemm_pass_seconds` charges them.
- Attention forward + backward (scaled_dot_product_attention, flash and cuDNN back ends), causal and not, by
  sequence length and head dims (query-key/value: 128, 64, MLA's 192/128, 192 and 256, a 4,096-wide layer's
  heads): against `attention_seconds` (the flash rows as [software] attention_kernel fa2).
- HBM: a 4 GiB copy and element-wise add (bytes read + written) against the rate the cost model charges
  memory traffic at, the preset's `hbm_bandwidth` x `hbm_efficiency` (the latter taken from this row's copy).
- Host link: a 1 GiB copy from device to pinned host memory and back, what activation offload moves, against
  the preset's `host_bandwidth` (the datasheet's PCIe rate; no scan had measured it).
- MoE routing, forward and backward, at Mixtral 8x7B, Qwen3-235B and DeepSeek-V3 shapes and a micro-batch's
  tokens, as Megatron-Core's all-to-all dispatcher runs it: its router
  (moe_utils.topk_routing_with_score_function), against the host time cost/overhead.py charges it
  (ROUTER_HOST), and its permute / unpermute both ways it can, torch's masked_select / index_select /
  scatter_add (moe_utils, the default) and Transformer Engine's fused Triton kernels (--moe-permute-fusion),
  against `routing_bytes` at the memory rate times PERMUTE_EFFICIENCY (this scan's own figures, where the
  kernels outlast their launches). Needs megatron-core and TE's transformer_engine/pytorch/triton/
  permutation.py importable (TE 2.4's kernels, from before TE PR #1927 reworked them, as well as 2.20's); rows whose
  code is missing are left out, as without Triton.
- Optimizer: one AdamW step over a llama3-8b 4-block stack's fp32 parameters (1.9B; gradients and moments fp32
  too) by torch's fused kernel, which the trainer uses on GPUs, and by its default foreach kernels, against the
  one read and write of parameters, gradients and moments that cost/step.py charges.
- Interference: a bf16 8192^3 GEMM beside a copy kernel that holds a fixed number of thread blocks on another
  stream (what an NCCL collective is to the SMs: one block per channel), against `gemm_seconds` slowed by the
  share of SMs the blocks hold (`comm.sm_share`'s mechanism), and that copy's own rate. Needs Triton.

Each timing is CUDA events around back-to-back launches, so no kernel waits for the host to launch it.
`--replay` predicts a recorded scan again with today's cost model on any machine:

    PYTHONPATH=src python benchmarks/kernel_scan.py [--cluster h200] [--json out.json]
    PYTHONPATH=src python benchmarks/kernel_scan.py --replay benchmarks/data/kernel_scan_h200.json
"""

import argparse
import dataclasses
import inspect
import json
import sys

try:  # measuring needs torch; --replay does not
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = F = None
try:  # the interference rows' copy kernel; a scan without Triton leaves them out
    import triton
    import triton.language as tl
except ImportError:
    triton = None

from meshscale.cost.kernels import (GROUPED_BF16_EFFICIENCY, GROUPED_WGRAD_EFFICIENCY, PERMUTE_EFFICIENCY,
                                    attention_seconds, gemm_seconds, grouped_gemm_efficiency, routing_bytes)
from meshscale.cost.overhead import ROUTER_HOST
from meshscale.specs.cluster import load_cluster
from meshscale.specs.model import load_model

GEMM_SHAPES = ((8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336),
               (8192, 10240, 8192), (8192, 8192, 28672), (2048, 2048, 2048), (4096, 4096, 4096),
               (8192, 8192, 8192), (1024, 4096, 4096), (512, 4096, 4096))
GROUPED_TOKENS = (128, 256, 512, 1024, 2048, 4096)
# (local experts, N, K) of each expert matrix's forward: gate and up fused (N = 2 ffn), then down
GROUPED_SHAPES = ((8, 14336, 4096), (8, 4096, 14336),  # Mixtral 8x7B, ep=1
                  (16, 3072, 4096), (16, 4096, 1536),  # Qwen3-235B-A22B, ep=8
                  (8, 4096, 7168), (8, 7168, 2048),  # DeepSeek-V3, ep=32
                  (20, 3072, 5120), (20, 5120, 1536))  # DeepSeek-V2, ep=8 (its paper's layout)
ATTENTION_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
# (query-key, value) head dims: Llama's 128, GPT-OSS's 64, DeepSeek's MLA (192, 128) and both at 192, Gemma's 256;
# as many heads as a 4,096-wide layer holds
ATTENTION_HEAD_DIMS = ((128, 128), (64, 64), (192, 128), (192, 192), (256, 256))
ATTENTION_WIDTH, ATTENTION_TOKENS = 4096, 32768  # batch = tokens / seq
ROUTING_MODELS, ROUTING_TOKENS = ("mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"), (4096, 16384)
# thread blocks the copy holds (24: NCCL's channels on Hopper); not all 132 SMs, where the GEMM would wait
INTERFERENCE_BLOCKS = (8, 24, 66)
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
    if kind.startswith("hbm") or kind == "interference copy":
        return shape["bytes"] / cluster.achieved_hbm_bandwidth
    if kind.startswith("optimizer"):  # fp32 parameter, gradient and two moments, each read and written once
        return 2 * 16 * shape["params"] / cluster.achieved_hbm_bandwidth
    if kind.startswith("moe"):  # forward and backward: each moves the pass's bytes once
        router, permute = routing_bytes(load_model(shape["model"]), shape["tokens"], 2)
        if kind == "moe router":  # a few dozen small kernels: the host launching them sets the pace
            return max(sum(ROUTER_HOST) * cluster.host_linear_s, 2 * router / cluster.achieved_hbm_bandwidth)
        return 2 * permute / (cluster.achieved_hbm_bandwidth * PERMUTE_EFFICIENCY[kind.endswith("te")])
    if kind == "interference":
        alone = gemm_seconds(cluster, shape["m"], shape["n"], shape["k"], cluster.gemm_peak("bf16"), 2)
        return alone / (1 - min(shape["blocks"], cluster.compute_units) / cluster.compute_units)
    if kind.startswith("host"):
        return shape["bytes"] / cluster.host_bandwidth if cluster.host_bandwidth else float("nan")
    if kind.startswith("gemm"):
        fp8 = kind.endswith("fp8")
        return gemm_seconds(cluster, shape["m"], shape["n"], shape["k"], cluster.gemm_peak("fp8" if fp8 else "bf16"),
                            2, operand_bytes=1 if fp8 else 0)
    if kind == "grouped wgrad bf16":
        return gemm_seconds(cluster, shape["k"], shape["n"], shape["m"], cluster.gemm_peak("bf16"),
                            batch=shape["groups"]) / grouped_gemm_efficiency(shape["m"], GROUPED_WGRAD_EFFICIENCY)
    if kind.startswith("grouped"):
        m = shape["m"]
        return gemm_seconds(cluster, m, shape["n"], shape["k"], cluster.gemm_peak("bf16"), batch=shape["groups"]) / \
            grouped_gemm_efficiency(m, GROUPED_BF16_EFFICIENCY)
    # the flash back end is FlashAttention-2's kernel ([software] attention_kernel fa2), cuDNN's the platform's
    kernel = "fa2" if kind == "attention flash" else "platform"
    cluster = cluster.with_software(attention_kernel=kernel)
    return attention_seconds(cluster, attention_core_flops(shape), shape["seq"], cluster.peak_flops("bf16"),
                             shape["causal"], head_dim=shape["head_dim"], v_head_dim=shape.get("v_head_dim", 0))


def attention_core_flops(shape: dict) -> float:
    """Useful forward FLOPs of one attention call: 2 s^2 (d_qk + d_v) per head (4 s^2 d, the papers' count, where
    the two are equal), halved when causal, as cost/flops.py counts them."""
    dims = shape["head_dim"] + shape.get("v_head_dim", shape["head_dim"])
    return 2.0 * shape["batch"] * shape["heads"] * shape["seq"] ** 2 * dims / (2 if shape["causal"] else 1)


def row_flops(row: dict) -> float:
    kind, shape = row["kind"], row["shape"]
    if kind.startswith(("hbm", "host", "moe", "optimizer")) or kind == "interference copy":
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
    for g, n, k in GROUPED_SHAPES:
        w = torch.randn(g, k, n, device="cuda", dtype=torch.bfloat16)
        for tokens in GROUPED_TOKENS:
            x = torch.randn(g * tokens, k, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(g * tokens, n, device="cuda", dtype=torch.bfloat16)
            xt = x.t().contiguous().t()  # K-major: each group's tokens contiguous as the reduction dimension
            offs = torch.arange(tokens, g * tokens + 1, tokens, device="cuda", dtype=torch.int32)
            shape = {"groups": g, "m": tokens, "n": n, "k": k}
            try:
                forward = timed(lambda: torch._grouped_mm(x, w, offs=offs))
                wgrad = timed(lambda: torch._grouped_mm(xt.t(), dy, offs=offs))
            except RuntimeError as e:  # this build or GPU has no grouped kernel for the shape
                print(f"grouped GEMM: {str(e).splitlines()[0]}", file=sys.stderr)
                return rows
            rows += [{"kind": "grouped gemm bf16", "shape": shape, "measured_s": forward},
                     {"kind": "grouped wgrad bf16", "shape": dict(shape), "measured_s": wgrad}]
            del x, dy, xt
    return rows


def attention() -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        for head_dim, v_head_dim in ATTENTION_HEAD_DIMS:
            for seq in ATTENTION_SEQS:
                rows += _attention_rows(backend, sdpa_kernel, seq, head_dim, v_head_dim)
    return rows


def _attention_rows(backend, sdpa_kernel, seq: int, head_dim: int, v_head_dim: int) -> list[dict]:
    batch, heads = max(1, ATTENTION_TOKENS // seq), ATTENTION_WIDTH // head_dim
    q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for d in (head_dim, head_dim, v_head_dim))
    grad = torch.randn_like(v)
    rows = []
    for causal in (False, True):
        def step():
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            out.backward(grad)
        try:
            t = timed(step, repeat=4, batches=3)
        except RuntimeError as e:  # this back end has no kernel for the shape
            print(f"attention {backend.name} seq {seq} head dims {head_dim}/{v_head_dim}: "
                  f"{str(e).splitlines()[0]}", file=sys.stderr)
            continue
        rows.append({"kind": f"attention {backend.name.split('_')[0].lower()}",
                     "shape": {"seq": seq, "batch": batch, "heads": heads, "head_dim": head_dim,
                               "v_head_dim": v_head_dim, "causal": causal}, "measured_s": t})
    return rows


def hbm() -> list[dict]:
    """A copy and an element-wise add (the shape of the cost model's memory-bound terms) over 4 GiB tensors:
    bytes read + written."""
    src = torch.empty(2 << 30, dtype=torch.bfloat16, device="cuda")
    other, dst = torch.empty_like(src), torch.empty_like(src)
    rows = []
    for kind, fn, moved in (("hbm copy", lambda: dst.copy_(src), 2),
                            ("hbm add", lambda: torch.add(src, other, out=dst), 3)):
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


def moe_routing() -> list[dict]:
    """Forward and backward of a MoE layer's routing for ROUTING_TOKENS tokens of bf16 activations: the router
    on fp32 logits (softmax, top-k, the probability and routing maps), then the permute with its
    probabilities and the unpermute that sums each token's top_k copies, by Megatron-Core's moe_utils (torch
    ops) and by Transformer Engine's fused Triton kernels, which Megatron-Core calls under
    --moe-permute-fusion (the same calls as TE's autograd functions make, forward and backward)."""
    try:
        from megatron.core.transformer.moe.moe_utils import permute, topk_routing_with_score_function, unpermute
    except ImportError as e:
        print(f"moe routing: skipped: megatron-core is not importable ({e})", file=sys.stderr)
        return []
    try:
        from transformer_engine.pytorch.triton import permutation as te
    except ImportError as e:
        print(f"moe routing: fused rows skipped: Transformer Engine's Triton permutation is not importable ({e})",
              file=sys.stderr)
        te = None
    rows = []
    for name in ROUTING_MODELS:
        model = load_model(name)
        for t in ROUTING_TOKENS:
            x = torch.randn(t, model.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            logits = torch.randn(t, model.experts, device="cuda", requires_grad=True)
            probs, routing_map = topk_routing_with_score_function(logits.detach(), model.top_k, False)
            probs.requires_grad_()
            copies, shape = t * model.top_k, {"model": name, "tokens": t}
            grad, probs_grad = torch.randn_like(x), torch.randn(copies, device="cuda")

            def router():
                p, _ = topk_routing_with_score_function(logits, model.top_k, False)
                p.sum().backward()

            def megatron():
                permuted, permuted_probs, order = permute(x, routing_map, probs=probs, num_out_tokens=copies)
                out = unpermute(permuted, order, x.shape, routing_map=routing_map)
                torch.autograd.backward((out, permuted_probs), (grad, probs_grad))

            rows += [{"kind": "moe router", "shape": shape, "measured_s": timed(router)},
                     {"kind": "moe permute megatron", "shape": shape, "measured_s": timed(megatron)}]
            if te is not None:
                rows.append({"kind": "moe permute te", "shape": shape,
                             "measured_s": timed(lambda: _te_routing(te, x.detach(), probs.detach(), routing_map,
                                                                     model))})
            del x, logits, grad
    return rows


def _te_routing(te, x, probs, routing_map, model) -> None:
    """TE's fused permute-with-probabilities and unpermute, forward then the backward each's autograd
    function runs (the unpermute's is a permute of the gradient, the permute's an unpermute of it and of its
    probabilities' gradient; the output stands in for both gradients). By keyword: TE 2.4's functions take
    the same arguments less the FP8 padding offsets that later ones added."""
    t = x.shape[0]
    sizes = {"num_tokens": t, "num_experts": model.experts, "hidden_size": model.hidden}
    spread = {**sizes, "num_out_tokens": t * model.top_k, "scale": None, "scale_hidden_dim": 0}
    if "pad_offsets" in inspect.signature(te.permute_with_mask_map).parameters:
        spread["pad_offsets"] = sizes["pad_offsets"] = None
    row_id_map = te.make_row_id_map(routing_map, t, model.experts)
    permuted, _, permuted_probs = te.permute_with_mask_map(x, row_id_map, probs=probs, **spread)
    out, _ = te.unpermute_with_mask_map(permuted, row_id_map, merging_probs=None, permuted_probs=None, **sizes)
    grad, _, _ = te.permute_with_mask_map(out, row_id_map, probs=None, **spread)
    te.unpermute_with_mask_map(grad, row_id_map, merging_probs=None, permuted_probs=permuted_probs, **sizes)


def optimizer() -> list[dict]:
    """AdamW steps (the trainer's betas and weight decay) over fp32 parameters shaped as our llama3-8b model's
    with 4 blocks (gpu_check's block stack), with gradients set: torch's fused kernel and its default foreach
    ones."""
    from meshscale.models.transformer import full_shapes

    stack = dataclasses.replace(load_model("llama3-8b"), layers=4)
    params = [torch.nn.Parameter(torch.randn(*s, device="cuda") * 0.01) for s in full_shapes(stack).values()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    shape = {"params": sum(p.numel() for p in params)}
    rows = []
    for kind, fused in (("optimizer fused", True), ("optimizer foreach", None)):
        adamw = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
        rows.append({"kind": kind, "shape": dict(shape), "measured_s": timed(adamw.step, repeat=5, batches=3)})
    return rows


if triton is not None:
    @triton.jit
    def _copy_on_blocks(src, dst, n, passes, BLOCK: tl.constexpr):
        # `passes` copies of src into dst by however many blocks the grid has, each striding the tensor
        stride = tl.num_programs(0) * BLOCK
        for _ in range(passes):
            for start in range(tl.program_id(0) * BLOCK, n, stride):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < n
                tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def interference() -> list[dict]:
    """The 8192^3 bf16 GEMM timed (as `timed` does) while a copy on INTERFERENCE_BLOCKS thread blocks runs on
    another stream for all of that time; and each copy's own rate (bytes read + written)."""
    if triton is None:
        print("interference: skipped: Triton is not installed", file=sys.stderr)
        return []
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    window = 103 * timed(lambda: a @ b)  # the GEMMs `timed` runs: warm-ups and 5 batches of 20
    side, rows = torch.cuda.Stream(), []
    for blocks in INTERFERENCE_BLOCKS:
        def copy(passes: int = 1):
            _copy_on_blocks[(blocks,)](src, dst, src.numel(), passes, BLOCK=4096, num_warps=8)
        try:
            one_pass = timed(copy, repeat=3, batches=3)
        except Exception as e:  # noqa: BLE001 - Triton's compile errors are not RuntimeErrors; the other rows stand
            print(f"interference: skipped: {str(e).splitlines()[0]}", file=sys.stderr)
            return rows
        rows.append({"kind": "interference copy", "shape": {"bytes": 2 * src.numel() * 2, "blocks": blocks},
                     "measured_s": one_pass})
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            copy(passes=int(2 * window / one_pass) + 1)  # outlasts the GEMMs even when they slow it
        rows.append({"kind": "interference", "shape": {"m": 8192, "n": 8192, "k": 8192, "blocks": blocks},
                     "measured_s": timed(lambda: a @ b)})
        torch.cuda.synchronize()
    return rows


def describe(row: dict) -> str:
    s = row["shape"]
    if row["kind"].startswith("moe"):
        return f"{s['model']} {s['tokens']} tokens"
    if row["kind"].startswith("optimizer"):
        return f"{s['params'] / 1e9:.2f}B fp32 parameters"
    if row["kind"] == "interference":
        return f"{s['m']}^3 beside {s['blocks']} blocks"
    if "blocks" in s:
        return f"{s['bytes'] / 2**30:.0f} GiB on {s['blocks']} blocks"
    if row["kind"].startswith(("hbm", "host")):
        return f"{s['bytes'] / 2**30:.0f} GiB moved"
    if row["kind"].startswith("attention"):
        dims = f"{s['head_dim']}/{s['v_head_dim']}" if s.get("v_head_dim", s["head_dim"]) != s["head_dim"] \
            else s["head_dim"]
        return f"seq {s['seq']} d{dims} x{s['batch']} {'causal' if s['causal'] else 'full'}"
    return (f"{s['groups']}x" if "groups" in s else "") + f"{s['m']}x{s['n']}x{s['k']}"


def report(rows: list[dict], cluster) -> None:
    print(f"{'kernel':<20} {'shape':<26} {'measured':>10} {'predicted':>10} {'rate meas.':>11} {'rate pred.':>11} "
          f"{'pred/meas':>9}")
    for r in rows:
        want = predicted_seconds(r, cluster)
        flops = row_flops(r)
        work, unit = (flops, 1e12) if flops else (r["shape"].get("bytes", 0), 1e9)
        rates = (f"{work / r['measured_s'] / unit:11.0f} {work / want / unit:11.0f}" + (" TF/s" if flops else " GB/s")
                 if work else f"{'':>28}")
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
    rows = hbm() + host_link() + gemms() + grouped() + attention() + moe_routing() + optimizer() + interference()
    cudnn = torch.backends.cudnn.version()
    print(f"{name}, torch {torch.__version__}, cuDNN {cudnn}; cost model preset {preset}")
    report(rows, load_cluster(preset))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": name, "torch": torch.__version__, "cudnn": cudnn, "preset": preset, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
