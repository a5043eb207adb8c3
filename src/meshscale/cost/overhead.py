"""What a calibrated machine spends beyond the FLOP and byte rooflines: per-operator host time and each
collective's own alpha-beta figures (measured by `meshscale calibrate`; its GEMM and attention rates are
used by cost/kernels.py).

Eager frameworks pay a fixed host cost per operator (Python, the dispatcher, autograd bookkeeping) whatever
the tensor size; for small per-device work it dominates (Lumos, Liang et al. 2025, and the PyTorch
profiler's own CPU-time accounting attribute eager training steps largely to launch overhead at small
sizes). We charge it per operator of our runtime's LLaMA block. A preset ClusterSpec measures none of this
and every term below is then zero (or the tier's figure).

On a GPU the host runs ahead of the device, queueing kernels, so its time adds nothing until it is the slower
of the two: a pass then takes as long as its host needs to issue it (framework_seconds, step.py host_bound).
"""

from dataclasses import replace

from meshscale.cost.comm import Link
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import REBUILDS_LAYER, Layout
from meshscale.specs.model import ModelSpec

# aten operators of models/transformer.py, counted with a TorchDispatchMode (tests/test_calibrate.py recounts them):
FORWARD_OPS_PER_LAYER = 90  # one block: two RMSNorms, q/k/v/o, half-split RoPE, SDPA, SwiGLU, residuals
BACKWARD_OPS_PER_LAYER = 154
SELECTIVE_OPS_PER_LAYER = 12  # the attention core (RoPE, SDPA, reshapes) run again before backward
ROOT_FORWARD_OPS, ROOT_BACKWARD_OPS = 20, 34  # embedding, final norm, head, cross-entropy
OPTIMIZER_OPS_PER_TENSOR = 10  # AdamW with foreach=False (runtime/loop/optim.py): one update per tensor
TENSORS_PER_LAYER = 9  # two norm gains, four attention and three MLP weights
ROOT_TENSORS = 3  # embedding, final norm, head


# Host time of Megatron-Core's modules in torch.nn.Linear forwards, (forward, backward), one call with tensors
# too small to take kernel time, on one CPU thread: benchmarks/host_calls.py (the local layer spec, megatron-core
# 0.16.1, torch 2.13; benchmarks/data/host_calls_cpu.json, rounded). A MoE layer's router runs the auxiliary
# loss, its dispatcher the all-to-all's; its experts are one MLP's modules, as a GPU run's grouped GEMMs. The
# local spec's ColumnParallelLinear costs 3.2 Linear forwards, as Transformer Engine's Linear costs 2.69 of
# torch's (issue #2053, Grace): the spec GPU runs use is charged the same.
LAYER_HOST = {False: (80.6, 99.7), True: (163.0, 133.8)}  # dense, MoE
MLA_EXTRA_HOST = (14.0, 37.9)  # MLA's q and kv down- and up-projections and their norms, beyond one QKV projection
MLP_HOST = (10.5, 20.8)  # a SwiGLU MLP (a MoE layer's shared experts add one)
ROUTER_HOST = (15.5, 18.1)  # a MoE layer's top-k router with its auxiliary loss
ROOT_HOST = (83.6, 42.9)  # embedding, final norm, output layer, vocab-parallel cross-entropy
LINEAR_HOST, NORM_HOST = 3.2, 2.1  # one ColumnParallelLinear, one RMSNorm forward
LORA_ADAPTER_HOST = (2 * LINEAR_HOST, 2 * LINEAR_HOST)  # a LoRA adapter: its A and B, two parallel linears
# The MoE block: a MoE layer less its attention (a dense layer less its MLP).
MOE_BLOCK_HOST = tuple(m - d + p for m, d, p in zip(LAYER_HOST[True], LAYER_HOST[False], MLP_HOST))
# What each --recompute-modules entry runs again in backward, in the same units: the attention core (one call
# of the size of a linear), the layer's two norms, MLA's two up-projections, the dense MLP, the MoE block, the
# experts' activation, the shared experts.
RECOMPUTE_HOST = {"core_attn": LINEAR_HOST, "layernorm": 2 * NORM_HOST, "mla_up_proj": 2 * LINEAR_HOST,
                  "mlp": MLP_HOST[0], "moe": MOE_BLOCK_HOST[0], "moe_act": NORM_HOST,
                  "shared_experts": MLP_HOST[0]}


def layer_host(model: ModelSpec, moe: bool, graphs: bool = False) -> tuple[float, float]:
    """(forward, backward) host time of one layer, in torch.nn.Linear forwards. Under CUDA graphs ([software]
    cuda_graphs) the host launches one graph each way for what was captured: a dense layer whole, a dropless
    MoE layer's attention and router, whose dispatch, experts and combine run eagerly."""
    if graphs:
        eager = tuple(b - r for b, r in zip(MOE_BLOCK_HOST, ROUTER_HOST)) if moe else (0.0, 0.0)
        return eager[0] + LINEAR_HOST, eager[1] + LINEAR_HOST
    parts = [LAYER_HOST[moe]] + [MLA_EXTRA_HOST] * model.uses_mla + [MLP_HOST] * (moe and model.shared_experts > 0)
    parts += [LORA_ADAPTER_HOST] * len(model.lora_matrices())
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def framework_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, dense: int, moe: int,
                      head: bool) -> tuple[float, float]:
    """Host time to issue one micro-batch through `dense` and `moe` layers (and the embedding, head, loss and
    MTP modules where `head`), (forward, backward), at `host_linear_s` a torch.nn.Linear forward; backward
    runs again what its recompute reruns."""
    graphs = cluster.software.cuda_graphs
    passes = [layer_host(model, False, graphs)] * dense + [layer_host(model, True, graphs)] * moe
    if head:  # each MTP module: a layer like the last, two norms and a projection (backward as forward), the head
        mtp = layer_host(model, model.is_moe_layer(model.layers - 1), graphs)
        joins = (2 * NORM_HOST + LINEAR_HOST,) * 2
        passes += [ROOT_HOST] + [mtp, ROOT_HOST, joins] * model.mtp_layers
    forward, backward = sum(p[0] for p in passes), sum(p[1] for p in passes)
    if layout.recompute in REBUILDS_LAYER:
        backward += forward
    else:
        for module in layout.recompute_modules:
            rerun = {"mlp": dense, "moe": moe}.get(module, dense + moe)
            backward += rerun * RECOMPUTE_HOST[module]
    return forward * cluster.host_linear_s, backward * cluster.host_linear_s


def chunk_seconds(cluster: ClusterSpec, layout: Layout, layers: int, head: bool) -> tuple[float, float]:
    """Host time of one micro-batch through a pipeline chunk of `layers` blocks (with the embedding, head and
    loss where `head`), (forward, backward): part of each pass, so predict and the simulator charge it alike."""
    # op and minimal rerun the forward but for what they saved, whose calls still pass the checkpoint's dispatch:
    # counted as the whole forward
    recompute = FORWARD_OPS_PER_LAYER if layout.recompute in REBUILDS_LAYER else \
        SELECTIVE_OPS_PER_LAYER if layout.recompute == "selective" else 0
    forward = layers * FORWARD_OPS_PER_LAYER + (ROOT_FORWARD_OPS if head else 0)
    backward = layers * (BACKWARD_OPS_PER_LAYER + recompute) + (ROOT_BACKWARD_OPS if head else 0)
    # FSDP2 (zero=3) wraps each block, and the root, in a unit with gather and reshard hooks both ways
    fsdp = (layers + head) * cluster.fsdp_unit_overhead_s / 2 if layout.zero == 3 else 0.0
    return forward * cluster.op_overhead_s + fsdp, backward * cluster.op_overhead_s + fsdp


def optimizer_seconds(cluster: ClusterSpec, layout: Layout, n_layers: int, root: bool) -> float:
    """Host time of the per-tensor optimizer update on one rank (DTensor dispatch for FSDP2's sharded ones)."""
    tensors = n_layers * TENSORS_PER_LAYER + (ROOT_TENSORS if root else 0)
    fsdp = cluster.fsdp_tensor_overhead_s if layout.zero == 3 else 0.0
    return tensors * (OPTIMIZER_OPS_PER_TENSOR * cluster.op_overhead_s + fsdp)


def measured_link(cluster: ClusterSpec, collective: str, link: Link) -> Link:
    """A collective kind measured over tier 0 uses its own latency and bus bandwidth (gloo's reduce-scatter,
    for one, is not a ring over the same link as its all-reduce). On a GPU cluster the measurement replaces
    NCCL's modelled algorithms for that kind (the fabric is dropped on purpose: the machine's own alpha-beta
    wins); kinds not measured keep the fabric."""
    if link.tier != cluster.tiers[0].name:
        return link
    for kind, latency, bandwidth in cluster.collectives:
        if kind == collective:
            return replace(link, bandwidth=bandwidth, latency=latency, fabric=None, all_to_all_bandwidth=0.0,
                           send_bandwidth=0.0)
    return link


def shared_cores(cluster: ClusterSpec, devices: int) -> ClusterSpec:
    """The machine each rank sees when a CPU host runs more ranks than were calibrated at once: they share the
    cores, each getting calibrated/ranks of them (processor sharing), so every measured rate slows by that
    factor and every per-call host time grows by it. Accelerators (calibrated_ranks = 0) are unaffected."""
    per_host = min(devices, cluster.tiers[0].size or devices)
    if not cluster.calibrated_ranks or per_host <= cluster.calibrated_ranks:
        return cluster
    f = per_host / cluster.calibrated_ranks
    return replace(cluster, peak_flops_fp32=cluster.peak_flops_fp32 / f, peak_flops_bf16=cluster.peak_flops_bf16 / f,
                   hbm_bandwidth=cluster.hbm_bandwidth / f, op_overhead_s=cluster.op_overhead_s * f,
                   fsdp_unit_overhead_s=cluster.fsdp_unit_overhead_s * f,
                   fsdp_tensor_overhead_s=cluster.fsdp_tensor_overhead_s * f,
                   gemm_rates=tuple((*r[:-1], r[-1] / f) for r in cluster.gemm_rates),
                   attention_rates=tuple((*r[:-1], r[-1] / f) for r in cluster.attention_rates),
                   collectives=tuple((kind, lat * f, bw / f) for kind, lat, bw in cluster.collectives),
                   tiers=tuple(replace(t, bandwidth=t.bandwidth / f, latency=t.latency * f) for t in cluster.tiers),
                   calibrated_ranks=per_host)  # so that sharing it again changes nothing
