"""One training step on one device: compute, exposed communication, pipeline bubble, optimizer update.

step = (compute + TP + PP + EP + unhidden CP) * (1 + bubble ratio) + unhidden data-parallel traffic
       + optimizer update
(the composition of Narayanan et al. 2021 sec. 3 with the overlap rules of each collective below).
"""

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from meshscale.cost import bands, comm, critical, flops, overhead
from meshscale.cost.comm import CommOp, Overlap
from meshscale.cost.checkpoint import ADAM_MOMENTS, checkpoint_bytes
from meshscale.cost.kernels import (Passes, check_kernels, column_parallel_share, counted_seconds,
                                    grad_accumulator_bytes, kernel_shape)
from meshscale.cost.memory import (PRECISIONS, Memory, activation_bytes_per_layer, adapter_saved_elements,
                                   expert_params_on_rank, memory_per_device, optimizer_bytes, params_on_rank,
                                   root_params_on_rank, trained_params_on_rank, weight_bytes)
from meshscale.cost.pipeline import bubble_ratio
from meshscale.errors import UserError
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import REBUILDS_LAYER, Layout, check_against, kv_heads_per_rank, split_layers
from meshscale.specs.placement import head_rank, layout_ends, rank_chunks, stage_layers
from meshscale.specs.model import ModelSpec


@dataclass
class CommEntry:
    axis: str
    collective: str
    bytes: float
    time_s: float
    exposed_s: float
    tier: str
    calls: int
    group: int
    overlap: Overlap  # what hides it (predict's rules below); NONE where its [software] switch is off
    hidden_by_s: float = 0.0  # the compute it may hide behind: exposed_s = max(time_s - hidden_by_s, shown_s)
    shown_s: float = 0.0  # what shows however much compute there is
    # what the compute it hides behind loses to it: the SMs its kernels hold while it runs (comm.sm_share), and
    # for FSDP2's all-gathers the copy-out of the gathered parameters on the compute stream
    interference_s: float = 0.0


@dataclass
class Prediction:
    model: str
    cluster: str
    layout: str
    devices: int
    global_batch: int  # sequences
    seq: int
    precision: str
    microbatches: int
    step_time_s: float
    compute_s: float
    bubble_s: float
    exposed_comm_s: float
    optimizer_s: float
    mfu: float
    hfu: float
    tokens_per_s: float
    model_flops_per_step: float
    six_pt_flops_per_step: float
    hardware_flops_per_step: float
    bubble_fraction: float
    fits: bool
    hbm_bytes: float
    memory_per_device_bytes: dict
    comm: list = field(default_factory=list)
    bound: str = "compute"  # compute | host | communication | bubble (and memory when it does not fit)
    regime: dict = field(default_factory=dict)
    checkpoint_bytes_per_device: float = 0.0  # what one checkpoint writes (cost/checkpoint.py)
    checkpoint_bytes_total: float = 0.0
    band: dict = field(default_factory=dict)  # the error its category earned on the validation set (cost/bands.py)
    comm_rank: int = 0  # the pipeline rank `comm` describes: the one whose traffic shows longest (compute_s is
    # the slowest rank's passes, which every rank's last)
    host_wait_s: float = 0.0  # of compute_s, the device waiting for the host that issues its kernels (GPUs)
    forward_s: float = 0.0  # of compute_s, the forward passes: what evaluating the same batch computes
    trained: str = "all"  # what the step trains: every parameter, or "LoRA rank r on <modules>" (ModelSpec)
    packed_samples: int = 0  # the packed samples' length, each attending within itself (0: none; ModelSpec)

    @property
    def kernels_s(self) -> float:
        """Of compute_s, what the devices spend running their kernels (the rest waits on the host)."""
        return self.compute_s - self.host_wait_s

    def to_dict(self) -> dict:
        return {**self.__dict__, "memory_per_device_bytes": dict(self.memory_per_device_bytes),
                "comm": [dict(e) for e in self.comm], "regime": dict(self.regime), "band": dict(self.band)}


def _axis_group(layout: Layout, axis: str) -> tuple[int, int]:
    """(size, stride) of an axis's group in the mesh (pp, dp, cp, tp), tp innermost. ZeRO/FSDP use the dp*cp
    ranks that hold the same parameters ("dp": a shard group of them under hybrid sharding, "dp_replicate":
    the ranks holding the same shard in the other groups); the expert groups fold the stage's tp*cp*dp ranks
    as (edp, ep, etp), etp innermost (specs.layout.expert_mesh_shape; Megatron-Core's expert RankGenerator)."""
    t, c, d, e, s, et = layout.tp, layout.cp, layout.dp, layout.ep, layout.shard_size, layout.expert_tp
    return {"tp": (t, 1), "cp": (c, t), "dp": (s, t), "dp_replicate": (layout.replicas, s * t), "ep": (e, et),
            "etp": (et, 1), "edp": (layout.edp, et * e), "pp": (2, t * c * d)}[axis]


def predict(model: ModelSpec, cluster: ClusterSpec, layout: Layout, global_batch: int,
            precision: str = "bf16") -> Prediction:
    """Predict one optimizer step of `global_batch` sequences (of model.seq tokens) under `layout`."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    cluster.check_precision(precision)
    check_kernels(model, cluster)
    check_against(layout, model, global_batch)
    if layout.offload and not cluster.host_bandwidth:
        raise UserError(f"layout: offload={layout.offload} copies activations to host memory, and cluster "
                        f"{cluster.name} has no host_bandwidth (bytes/s one way); set it or drop offload")
    layout = layout.resolve_mbs(global_batch)
    m = layout.microbatches(global_batch)
    devices = layout.devices
    act_bytes = PRECISIONS[precision]["compute"]
    peak = cluster.peak_flops(precision)  # MFU counts against the device's own peak, shared or not
    cluster = overhead.shared_cores(cluster, devices)
    tokens = layout.mbs * model.seq / layout.cp  # per device per micro-batch, before TP
    sw = cluster.software

    # Compute and communication on each kind of pipeline rank: the step waits for the slowest rank's passes and
    # for the rank whose collectives (its layers' TP, CP and EP, its gradients' reduction) show longest beyond them.
    ranks = distinct_rank_passes(model, cluster, layout, precision)
    passes, _, lead = _slowest_and_others(ranks, layout.pp)
    elementwise = elementwise_seconds(model, cluster, layout, tokens, act_bytes)
    ledgers = [_rank_ledger(model, cluster, layout, r, p, m, lead, elementwise, tokens, act_bytes, precision)
               for r, _, p in ranks]
    # Every rank's passes last the slowest rank's span (the pipeline runs at its pace): a lighter rank's
    # collectives on their path hide in the idle that leaves it, and its data-parallel traffic shows after.
    compute_s = m * passes.total
    slow = next(g for g, (_, _, p) in zip(ledgers, ranks) if p is passes)

    def shown(g: RankLedger) -> float:  # what a rank's collectives on its path add to the span
        return max(g.critical_s - (compute_s - g.compute_s), 0.0)
    led = max(ledgers, key=lambda g: shown(g) + g.dp_exposed_s)
    critical_path, dp_exposed = shown(led), led.dp_exposed_s
    host_wait_s = m * passes.host

    ratio = bubble_ratio(layout, m, [chunk_passes(model, cluster, layout, c, precision) for c in range(layout.stages)])
    bubble_s = ratio * (compute_s + slow.critical_s)
    critical_path += control_seconds(cluster, devices, layout)  # once per step, after the pipeline drains
    mem = memory_per_device(model, layout, global_batch, precision, cluster.fused_attention,
                            eager=not sw.fused_elementwise, root_held=sw.holds_fsdp_root,
                            weights=weight_bytes(cluster, precision),
                            optimizer=optimizer_bytes(cluster, precision, layout.zero))
    optimizer_s = optimizer_traffic(cluster, mem, precision) / cluster.achieved_hbm_bandwidth
    optimizer_s += overhead.optimizer_seconds(cluster, layout, led.layers, led.rank in (0, head_rank(layout)))
    step = compute_s + critical_path + bubble_s + dp_exposed + optimizer_s

    n_tokens = global_batch * model.seq
    model_flops = flops.model_flops_per_step(model, n_tokens)
    hw_flops = model_flops + n_tokens * flops.recompute_flops_per_token(model, layout.recompute,
                                                                         range(model.layers))
    # What bounds the step: the largest of the devices' compute, their wait on the host issuing it, the
    # communication left exposed, and the bubble.
    bound = max((("compute", compute_s - host_wait_s), ("host", host_wait_s),
                 ("communication", critical_path + dp_exposed), ("bubble", bubble_s)), key=lambda kv: kv[1])[0]
    fits = mem.total <= cluster.hbm_bytes
    ckpt_device, ckpt_total = checkpoint_bytes(model, layout, precision)
    return Prediction(
        model=model.name, cluster=cluster.name, layout=str(layout), devices=devices, global_batch=global_batch,
        seq=model.seq, precision=precision, microbatches=m, step_time_s=step, compute_s=compute_s,
        host_wait_s=host_wait_s, forward_s=m * passes.forward,
        bubble_s=bubble_s, exposed_comm_s=critical_path + dp_exposed, optimizer_s=optimizer_s,
        mfu=model_flops / (step * devices * peak), hfu=hw_flops / (step * devices * peak),
        tokens_per_s=n_tokens / step, model_flops_per_step=model_flops,
        six_pt_flops_per_step=flops.six_pt(model, n_tokens), hardware_flops_per_step=hw_flops,
        bubble_fraction=bubble_s / step, fits=fits, hbm_bytes=cluster.hbm_bytes,
        memory_per_device_bytes=mem.to_dict(), comm=[dict(e.__dict__) for e in led.entries],
        bound=bound if fits else "memory", regime=regime(model, cluster, layout, n_tokens),
        checkpoint_bytes_per_device=ckpt_device, checkpoint_bytes_total=ckpt_total,
        band=bands.band(cluster, model, precision, layout, host_wait_s / step), comm_rank=led.rank,
        trained=f"LoRA rank {model.lora_rank} on {model.lora_modules}" if model.lora else "all",
        packed_samples=model.packed_samples)


@dataclass
class RankLedger:
    """One pipeline rank's compute and the collectives it runs in a step, with what they leave exposed."""
    rank: int
    layers: int  # the layers it runs (its MTP modules counted)
    compute_s: float
    critical_s: float  # the exposed collectives on its passes' path, and what the hidden ones slow them by
    dp_exposed_s: float  # exposed data-parallel traffic
    entries: list


def _rank_ledger(model: ModelSpec, cluster: ClusterSpec, layout: Layout, rank: int, passes: Passes, m: int,
                 lead: float, elementwise: float, tokens: float, act_bytes: int, precision: str) -> RankLedger:
    """What each axis sends from pipeline rank `rank`, on which link, how long, and what stays exposed behind
    its `passes` (one micro-batch's; `m` a step)."""
    sw, devices = cluster.software, layout.devices
    compute_s = m * passes.total
    attention_s = m * passes.attention
    gemm_s = compute_s - attention_s - m * elementwise
    params = params_on_rank(model, layout, rank)
    first, last = rank == 0, rank == head_rank(layout)
    n_layers = len(stage_layers(model, layout, rank)) + (model.mtp_layers if last else 0)
    moe_layers = rank_moe_layers(model, layout, rank)
    ops = []
    # Under EP the routed experts reduce over their own replicas (edp), the rest over dp*cp.
    experts = expert_params_on_rank(model, layout, rank) if layout.ep > 1 else 0.0
    grad_bytes = grad_reduce_bytes(sw, precision)
    update_bytes = param_gather_bytes(sw, precision)
    chunks = len(rank_chunks(layout.pp, layout.stages, layout.v_shaped, rank))

    def buckets(n):  # the framework's gradient buckets for n parameters ([software] framework, grad_bucket_params)
        return comm.grad_buckets(sw, n, layout.dp * layout.cp, first, chunks)

    # the dense parameters whose gradients are reduced: all but the routed experts, or LoRA's adapters
    trained = trained_params_on_rank(model, layout, rank) - (0.0 if model.lora else experts)
    if layout.dp * layout.cp > 1:
        ops += _on("dp", comm.data_parallel_ops(layout.zero, params - experts, m, act_bytes, n_layers + 1,
                                                root_params_on_rank(model, layout, rank), layout.pp > 1, grad_bytes,
                                                update_bytes, buckets(trained),
                                                bf16_optimizer(sw, layout.zero, precision), trained))
        ops += _on("dp_replicate", comm.replica_ops(layout.zero, trained, m, n_layers + 1, layout.shard_size,
                                                    layout.replicas, layout.pp > 1, grad_bytes, buckets(trained)))
    if experts and layout.edp > 1:
        units = moe_layers * expert_units_per_layer(model, layout, sw) + 1  # zero=3's FSDP units (+ a root)
        expert_ops = comm.data_parallel_ops(layout.zero, experts, m, act_bytes, units, 0.0, layout.pp > 1,
                                            grad_bytes, update_bytes, buckets(experts),
                                            trained=0.0 if model.lora else None)
        ops += _on("edp", [op for op in expert_ops if op.bytes])  # frozen experts: ZeRO-3's gathers alone
    crossings = comm.pipeline_sends(layout, rank) if layout.pp > 1 else 0
    ops += _on("tp", comm.tensor_parallel_ops(model, layout, tokens, act_bytes, n_layers, first, last, m, crossings,
                                              moe_layers, sw.framework, sw.tp_overlap_disable_qkv))
    ops += _on("tp", comm.lora_adapter_ops(model, layout, tokens, act_bytes, n_layers, m,
                                           sw.tp_comm_overlap and not sw.tp_overlap_disable_qkv,
                                           sw.lora_all_to_all))
    ops += _on("pp", comm.pipeline_ops(model, layout, tokens, act_bytes, m, rank, sw.pipeline_receives_block))
    ops += _on("pp", comm.tied_embedding_ops(model, layout, first or last))
    ops += _on("cp", comm.context_parallel_ops(model, layout, tokens, act_bytes, n_layers, m, moe_layers))
    ops += _on("ep", comm.expert_parallel_ops(model, layout, tokens, act_bytes, moe_layers, m))
    ops += _on("etp", comm.expert_tensor_parallel_ops(model, layout, tokens, act_bytes, moe_layers, m))

    forward_mb = passes.forward
    backward_mb = passes.backward + passes.weight
    entries, critical_path, dp_exposed = [], 0.0, 0.0
    wgrad_s = m * passes.weight * column_parallel_share(model, layout)
    fsdp_time = sum(_time(cluster, devices, layout, op.axis, op.collective, op.bytes, op.calls) for op in ops
                    if op.overlap == Overlap.FSDP)
    for op in ops:
        size, stride = _axis_group(layout, op.axis)
        link = overhead.measured_link(cluster, op.collective, comm.group_link(cluster, devices, size, stride))
        if op.axis == "ep":
            t = comm.expert_dispatch_time(cluster, op.bytes, op.calls, size, link, model)
        else:
            t = comm.collective_time(op.collective, op.bytes, op.calls, size, link)
        overlap = running_overlap(op, sw, layout, m)
        # the compute each overlap class hides behind (FSDP: its share of all compute); _shown: what shows anyway
        windows = {Overlap.ATTENTION: attention_s, Overlap.BACKWARD: backward_mb,
                   Overlap.EACH_BACKWARD: backward_mb * m, Overlap.FORWARD: forward_mb,
                   Overlap.FSDP: t * compute_s / fsdp_time if fsdp_time else 0.0,
                   Overlap.OTHER_MICROBATCH: compute_s * (m - 1) / m, Overlap.GEMM: gemm_s,
                   Overlap.WGRAD: wgrad_s}
        hidden_by, shown = windows.get(overlap, 0.0), _shown(overlap, t, op.calls, layout.tp, m)
        if op.axis == "pp" and op.collective == "send_recv":  # behind the faster ranks' slack (cost/pipeline.py)
            hidden_by, shown = _p2p_hidden_by(layout, sw, t, m * lead), t / op.calls * _chain_crossings(layout)
        exposed = exposed_seconds(t, hidden_by, shown, sw.overlap_efficiency)
        # the compute it hides behind runs on the SMs its kernels leave: that compute takes longer by the hidden
        # time x their share (critical path: it slows passes, and so the bubble, wherever it lands). A send chain
        # can show more than this rank's own sends take (every rank's boundary is on it): then none of them hides.
        interference = max(t - exposed, 0.0) * comm.sm_share(cluster, op.axis, link, op.collective)
        if op.collective == "all_gather" and op.overlap == Overlap.FSDP and _copies_out(sw):
            interference += 2 * op.bytes / cluster.achieved_hbm_bandwidth  # on the compute stream
        if op.collective == "reduce_scatter" and op.axis in ("dp", "edp"):
            copied = reduce_copy_bytes(sw, layout.zero, precision) * op.bytes / grad_bytes
            interference += copied / cluster.achieved_hbm_bandwidth
        critical_path += interference
        if op.axis in ("dp", "dp_replicate", "edp"):
            dp_exposed += exposed
        else:
            critical_path += exposed
        # both groups of hybrid sharding are the ledger's dp axis (their collectives differ)
        ledger_axis = "dp" if op.axis == "dp_replicate" else op.axis
        entries.append(CommEntry(ledger_axis, op.collective, op.bytes, t, exposed, link.tier, op.calls, size,
                                 overlap, hidden_by, shown, interference))
    return RankLedger(rank, n_layers, compute_s, critical_path, dp_exposed, entries)


def rank_moe_layers(model: ModelSpec, layout: Layout, rank: int) -> int:
    """The MoE layers pipeline rank `rank` runs, each MTP module's on the head's rank (a layer like the last,
    kernels.mtp_passes)."""
    if not model.is_moe:
        return 0
    mtp = model.mtp_layers if rank == head_rank(layout) else 0
    return sum(model.is_moe_layer(i) for i in (*stage_layers(model, layout, rank), *[model.layers - 1] * mtp))


def optimizer_traffic(cluster: ClusterSpec, mem: Memory, precision: str) -> float:
    """Bytes the update moves: one read and write of parameters, gradients and optimizer states, and gradient
    clipping's reads of the gradients in the dtype they accumulate in. The norm reads every gradient; torch's
    clip_grad_norm_ then scales them all by the clamped coefficient whatever it is (foreach mul, a read and a
    write; no host sync to skip it), where Megatron-LM's clip_grad_by_total_norm_fp32 (and DeepSpeed's) scale
    only when the norm is over the limit, which a run between spikes is not."""
    clip = 3 if cluster.software.framework == "torch" else 1
    grads = mem.grads / PRECISIONS[precision]["grads"] * grad_accumulator_bytes(cluster, precision)
    return 2 * (mem.params + mem.grads + mem.optimizer) + clip * grads


def _on(axis: str, ops: list[CommOp]) -> list[CommOp]:
    """`ops` over the group of mesh axis `axis`."""
    return [CommOp(op.collective, op.bytes, op.calls, op.overlap, axis) for op in ops]


def exposed_seconds(t: float, hidden_by: float, shown: float, efficiency: float = 1.0) -> float:
    """What shows of a collective of `t` seconds behind `hidden_by` seconds of compute, `shown` showing
    anyway (`_shown`), when only `efficiency` of its time can run beside compute ([software]
    overlap_efficiency, which calibrate measures as that fraction) and the rest runs alone."""
    return (1 - efficiency) * t + max(efficiency * t - hidden_by, efficiency * shown)


def control_seconds(cluster: ClusterSpec, devices: int, layout: Layout) -> float:
    """The small all-reduces of a step besides its traffic, latency-bound and not in the comm ledger.
    Megatron-Core makes several: the gradient norm for clipping over the groups that split the gradient
    (Megatron-LM optimizer/clip_grads.py: the model-parallel group, and the data-parallel one where gradients
    are sharded), the loss averaged over the replicas for logging (average_losses_across_data_parallel_group)
    and the non-finite check every rank joins (found_inf). Torch's frameworks make one over every rank: our
    runtime's control exchange carries all of these, a (world, 5) fp32 tensor (runtime/resilience/guards.py
    Guards.exchange), and torchtitan's clip_grad_norm_ reduces its DTensor norm once."""
    if cluster.software.framework == "torch":
        return _small_all_reduces(cluster, devices, ((devices, 1),), 20 * devices)
    t, c, d = layout.tp, layout.cp, layout.dp
    groups = [(t, 1), (layout.pp, t * c * d), (d * c, t), (devices, 1)]
    if layout.zero >= 2:
        groups.append(_axis_group(layout, "dp"))
    return _small_all_reduces(cluster, devices, tuple(groups))


@lru_cache(maxsize=4096)
def _small_all_reduces(cluster: ClusterSpec, devices: int, groups: tuple, nbytes: int = 8) -> float:
    """One all-reduce of `nbytes` over each of `groups` ((size, stride), ...): many layouts share their groups."""
    return sum(_time(cluster, devices, None, None, "all_reduce", nbytes, 1, (n, stride))
               for n, stride in groups if n > 1)


def expert_units_per_layer(model: ModelSpec, layout: Layout, sw) -> int:
    """Collective launches a MoE layer's routed experts take under zero=3, each way (gather, reduce-scatter).
    Megatron-FSDP (Megatron-Core custom_fsdp, 2025: fully_sharded_data_parallel.py makes TransformerLayer the
    FSDP unit; param_and_grad_buffer.py _get_parameter_groups aggregates a unit's buckets per (unit, is expert
    parameter)) gathers a layer's experts in one collective over the expert data-parallel group; the runtime's
    FSDP2 shards each expert as its own unit (parallel/expert.py _ShardedExperts), as does DeepSpeed's."""
    return 1 if sw.framework == "megatron-core" else model.experts // layout.ep


def reduce_copy_bytes(sw, zero: int, precision: str) -> int:
    """HBM bytes per gradient element torch's FSDP moves to prepare each reduce-scatter, beside backward's compute.
    FSDP2 (zero=3) copies the unsharded gradients into its reduce-scatter buffer in the reduce dtype on the compute
    stream (_fsdp_collectives.py foreach_reduce_scatter_copy_in: a read and a write) and lets NCCL average. FSDP1
    (fsdp_copy_out false, FULL_SHARD or SHARD_GRAD_OP) gets its flat gradient from autograd's backward of the split
    into parameter views (a cat of their gradients, measured on torch 2.13), then casts it to the reduce dtype and
    divides it in place by its pre-divide factor on its post-backward stream (_runtime_utils.py
    _post_backward_hook, _reduce_grad). Other frameworks reduce the buffer their gradients accumulate in."""
    if sw.framework != "torch" or zero < 2:
        return 0
    compute, reduce = PRECISIONS[precision]["compute"], grad_reduce_bytes(sw, precision)
    if not sw.fsdp_copy_out:
        return 2 * compute + (compute + reduce if reduce != compute else 0) + 2 * reduce
    return compute + reduce if zero == 3 else 0


def grad_reduce_bytes(sw, precision: str) -> int:
    """Bytes per parameter the gradient reduction moves: fp32, or the compute dtype where the software
    reduces in it ([software] grad_reduce_fp32). A recipe without an fp32 master (fp32, bf16-pure) has no
    fp32 gradient to reduce: its gradients travel in their own dtype (measured: bf16-pure's ledger)."""
    b = PRECISIONS[precision]
    if b["optimizer"] <= ADAM_MOMENTS:
        return b["grads"]
    return 4 if sw.grad_reduce_fp32 else b["compute"]


def param_gather_bytes(sw, precision: str) -> int:
    """Bytes per parameter ZeRO-1/2's all-gather of the updated parameters moves: fp32, or the compute dtype
    ([software] param_gather_fp32), or FP8 ([software] fp8_param_gather); without a master, the parameters' own
    dtype."""
    b = PRECISIONS[precision]
    if b["optimizer"] <= ADAM_MOMENTS:
        return b["params"]
    if sw.fp8_param_gather:
        return 1
    return 4 if sw.param_gather_fp32 else b["compute"]


# DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py since #1801, 2022-04) adds every micro-batch's bf16
# gradients into fp32 copies after the backward: lp.grad.to(fp32) reads 2 and writes 4 bytes, hp_grad.add_ reads
# 4 + 4 and writes 4 (the 2022 code then drops the bf16 gradients; later versions zero them in place, a little more).
BF16_OPTIMIZER_COPY_BYTES = 18


def bf16_optimizer(sw, zero: int, precision: str) -> bool:
    """Whether DeepSpeed's BF16_Optimizer takes the step: its engine picks it for a bf16 model with fp32
    gradient accumulation at ZeRO-1 (engine.py _do_optimizer_sanity_check; BLOOM's 2022 runs configured ZeRO-0,
    which it partitions alike). It copies each micro-batch's gradients to fp32 (BF16_OPTIMIZER_COPY_BYTES),
    all-reduces them where ZeRO-1 reduce-scatters (pipe/engine.py _bf16_reduce_grads, the engine's
    allreduce_gradients), updates its partition and all-gathers the bf16 parameters (update_lp_params)."""
    b = PRECISIONS[precision]
    return (sw.framework == "deepspeed" and zero == 1 and sw.grad_reduce_fp32 and b["compute"] == 2
            and b["optimizer"] > ADAM_MOMENTS)


# torch.autocast over fp32 parameters (our runtime's bf16 recipe, parallel/precision.py; its FSDP2 gathers bf16
# copies instead) casts each matrix's weight to bf16 in every micro-batch's forward (aten::linear > _to_copy: a
# 4-byte read and a 2-byte write an element) and its bf16 gradient back to fp32 in backward (ToCopyBackward0,
# 2 + 4). A profile of our trainer's llama3-8b 4-block stack on an H200 (2026-11-29) shows both: the forward
# casts of its 1.4B matrix weights took 1.95 ms (8.4 GB at 4.3 TB/s).
AUTOCAST_CAST_BYTES = 6


def autocast_casts(sw, zero: int, precision: str) -> bool:
    """Whether the matrices' fp32 weights are cast by autocast every micro-batch ([software] param_gather_fp32:
    our runtime's fp32 parameters under autocast)."""
    return sw.param_gather_fp32 and zero < 3 and precision == "bf16"


def matrix_params_on_rank(model: ModelSpec, layout: Layout, rank: int) -> float:
    """The parameters a matrix multiply reads on pipeline rank `rank`: all but what only a lookup reads (the
    embedding table, unless the head shares it on this rank, and learned positions)."""
    lookup = 0.0
    if rank == 0:
        lookup = model.seq * model.hidden if model.learned_positions else 0.0
        if not (model.tied_embeddings and layout.pp == 1):
            lookup += model.vocab * model.hidden / layout.tp
    return params_on_rank(model, layout, rank) - lookup


def running_overlap(op, sw, layout: Layout, m: int) -> Overlap:
    """A collective's overlap class (cost/comm.py) as it runs: NONE where the [software] switch is off."""
    overlap = op.overlap
    if overlap == Overlap.WGRAD and (not sw.tp_wgrad_overlap or sw.tp_comm_overlap and sw.tp_overlap_rs_dgrad):
        overlap = Overlap.GEMM  # decomposed behind its own dgrad GEMM where tp_overlap_rs_dgrad pipelines them
    on = {Overlap.ATTENTION: True, Overlap.BACKWARD: sw.grad_reduce_overlap,
          Overlap.EACH_BACKWARD: sw.grad_reduce_overlap, Overlap.FORWARD: sw.param_gather_overlap,
          Overlap.FSDP: sw.fsdp_prefetch,
          Overlap.OTHER_MICROBATCH: (sw.ep_comm_overlap or layout.schedule == "dualpipev") and m > 1,
          Overlap.GEMM: comm.tp_decomposed(sw, op.collective), Overlap.WGRAD: True}
    return overlap if on.get(overlap, False) else Overlap.NONE


def _shown(overlap: Overlap, t: float, calls: int, tp: int, m: int) -> float:
    """The part of a collective of `t` seconds that shows behind however much compute (see `running_overlap`):
    - attention: CP ring steps hide behind the attention blocks they feed, all of them;
    - backward, each_backward, forward: gradient buckets behind the (last) backward, the ZeRO-1/2 gather
      behind the next forward: the last (first) bucket shows;
    - fsdp: one unit ahead, behind all compute: the first and last show;
    - other_microbatch: EP all-to-all behind another micro-batch's compute; the first has no partner;
    - wgrad: SP's backward reduce-scatter behind the weight gradients of the column-parallel layers it came
      from, all of it;
    - gemm: TP collectives decomposed into tp ring steps, each behind a slice of the GEMM it feeds (Wang et
      al. 2023, ASPLOS, "Overlap communication with dependent computation via decomposition"; Megatron-Core
      --tp-comm-overlap): the first step shows;
    - none: all of it."""
    if overlap in (Overlap.ATTENTION, Overlap.WGRAD):
        return 0.0
    if overlap in (Overlap.BACKWARD, Overlap.EACH_BACKWARD, Overlap.FORWARD, Overlap.FSDP):
        return t / calls
    return {Overlap.OTHER_MICROBATCH: t / m, Overlap.GEMM: t / tp}.get(overlap, t)


def chunk_passes(model: ModelSpec, cluster: ClusterSpec, layout: Layout, chunk: int,
                 precision: str = "bf16") -> Passes:
    """F, B, W of one micro-batch through pipeline chunk (stage) `chunk`: its layers' kernels
    (cost/kernels.py), the output head on the last chunk, its share (1/vpp) of the rank's element-wise
    work, a third in forward and two thirds in backward, and the host time of its operators (calibrated
    clusters, cost/overhead.py). `layout` must have its mbs resolved."""
    return _kind_passes(model, cluster, layout, layout_kinds(model, layout)[chunk], precision)


@lru_cache(maxsize=4096)
def _kind_passes(model: ModelSpec, cluster: ClusterSpec, layout: Layout, kind: tuple, precision: str) -> Passes:
    """`chunk_passes` of every chunk of this kind (dense layers, MoE layers, holds the head): ranks hold many."""
    act_bytes = PRECISIONS[precision]["compute"]
    kernels = counted_seconds(model, cluster, kernel_shape(layout), *kind, precision)
    tokens = layout.mbs * model.seq / layout.cp
    elementwise = elementwise_seconds(model, cluster, layout, tokens, act_bytes) / layout.vpp
    host_f, host_b = overhead.chunk_seconds(cluster, layout, kind[0] + kind[1], kind[2])
    passes = kernels + Passes(elementwise / 3 + host_f, elementwise * 2 / 3 + host_b)
    if layout.offload:
        passes = passes + offload_shown(model, cluster, layout, tokens, act_bytes, passes)
    issue = overhead.framework_seconds(model, cluster, layout, *kind)
    call = overhead.LINEAR_HOST * cluster.host_linear_s  # the call after each wait
    unpad = unpad_waits(cluster, kind[0] + kind[1])
    # a recompute that reruns a MoE layer's dispatch or the attention's unpadding waits again in backward
    rerun = (kind[1] if layout.reruns("moe") else 0) + (unpad if layout.reruns("core_attn") else 0)
    return host_bound(passes * slowest_of(cluster, layout.devices), *issue, (kind[1] + unpad) * call, rerun * call)


def unpad_waits(cluster: ClusterSpec, layers: int) -> int:
    """Host waits of `layers` layers' attention unpadding ([software] attention_unpad) in one forward: every
    unpad_input (q, k, v) reads torch.nonzero's count and the longest sequence (.item()) back to the host."""
    return 3 * layers if cluster.software.attention_unpad else 0


def host_bound(device: Passes, host_f: float, host_b: float, sync_s: float, sync_b: float = 0.0) -> Passes:
    """A micro-batch's passes when the host issuing them may be slower than the device running them. The host
    runs ahead, so a pass takes the longer of the two, and a host lead left from one pass carries into the
    next: without MoE layers the passes stretch together to the host's total. Megatron-Core's MoE
    dispatchers copy the tokens-per-expert counts to the host in each MoE layer's forward and wait for them
    (token_dispatcher.py _maybe_dtoh_and_synchronize; DeepEP's dispatch likewise), which drops any lead: forward
    and backward are then bounded apart, and after each wait the device idles through the host's next call
    (`sync_s`: a call the size of a linear's per MoE layer, the tokens' permutation, and per unpad_waits;
    `sync_b`: those a recompute's rerun of them waits in backward)."""
    if sync_s:
        forward = max(device.forward, host_f) + sync_s
        backward = max(device.backward + device.weight, host_b) + sync_b
        return _stretched(device, forward / device.forward, backward / (device.backward + device.weight))
    stretch = max(1.0, (host_f + host_b) / device.total) if device.total else 1.0
    return _stretched(device, stretch, stretch)


def _stretched(device: Passes, forward: float, backward: float) -> Passes:
    """`device` with its forward `forward` times and its backward and weight passes `backward` times longer (the
    attention core's share too: it is what ring attention hides behind, as long as its pass)."""
    if forward == backward == 1.0:
        return device
    attention_f = device.attention * (device.forward / device.total) if device.total else 0.0
    attention = attention_f * forward + (device.attention - attention_f) * backward
    out = Passes(device.forward * forward, device.backward * backward, device.weight * backward, attention)
    return replace(out, host=out.total - device.total)


def offload_shown(model: ModelSpec, cluster: ClusterSpec, layout: Layout, tokens: float, act_bytes: int,
                  passes: Passes) -> Passes:
    """What activation offload adds to a micro-batch: its layers' activations copied to host memory in forward
    and back in backward over the host link, each copy behind its pass's compute (Transformer Engine's CPU
    offload runs them on their own streams); what outlasts the pass shows."""
    stored = activation_bytes_per_layer(model, layout, tokens, cluster.fused_attention,
                                        not cluster.software.fused_elementwise) * act_bytes / 2
    copy = layout.offload * stored / cluster.host_bandwidth
    return Passes(max(0.0, copy - passes.forward), max(0.0, copy - passes.backward))


def slowest_of(cluster: ClusterSpec, devices: int) -> float:
    """How much slower the slowest of `devices` devices computes than the typical one, which every synchronous
    step waits for: with device speeds spread normally by sigma (ClusterSpec.device_spread), the expected
    maximum of n draws is about sigma * sqrt(2 ln n) above the mean (the Gaussian extreme-value bound)."""
    if devices <= 1 or not cluster.device_spread:
        return 1.0
    return 1.0 + cluster.device_spread * math.sqrt(2 * math.log(devices))


def rank_passes(model: ModelSpec, cluster: ClusterSpec, layout: Layout, rank: int,
                precision: str = "bf16") -> Passes:
    """F, B, W of one micro-batch on pipeline rank `rank`: the sum over the chunks it holds (the passes the
    simulator runs one by one)."""
    kinds = layout_kinds(model, layout)  # chunk_passes of each, the kind looked up once
    passes = sum((_kind_passes(model, cluster, layout, kinds[c], precision)
                  for c in rank_chunks(layout.pp, layout.stages, layout.v_shaped, rank)), Passes())
    return passes + rank_extra_passes(model, cluster, layout, rank, precision)


def rank_extra_passes(model: ModelSpec, cluster: ClusterSpec, layout: Layout, rank: int,
                      precision: str = "bf16") -> Passes:
    """What pipeline rank `rank` adds to its chunks' passes each micro-batch, over all its parameters: DeepSpeed's
    BF16_Optimizer copies of the gradients to fp32 every backward, autocast's casts of the weights."""
    extra = Passes()
    if bf16_optimizer(cluster.software, layout.zero, precision):
        trained = trained_params_on_rank(model, layout, rank)
        extra = extra + Passes(backward=BF16_OPTIMIZER_COPY_BYTES * trained / cluster.achieved_hbm_bandwidth)
    if autocast_casts(cluster.software, layout.zero, precision):
        cast = AUTOCAST_CAST_BYTES * matrix_params_on_rank(model, layout, rank) / cluster.achieved_hbm_bandwidth
        extra = extra + Passes(forward=cast, backward=cast)
    return extra


def pipeline_passes(model: ModelSpec, cluster: ClusterSpec, layout: Layout,
                    precision: str = "bf16") -> tuple[Passes, Passes, float]:
    """One micro-batch's F, B, W on the slowest pipeline rank, their mean over the other ranks (whose passes
    make the bubble, cost/pipeline.py), and the slowest rank's lead: how much longer its micro-batch takes
    than the next slowest rank's (slack that hides the stage-boundary sends)."""
    return _slowest_and_others(distinct_rank_passes(model, cluster, layout, precision), layout.pp)


def distinct_rank_passes(model: ModelSpec, cluster: ClusterSpec, layout: Layout, precision: str = "bf16") -> list:
    """[(rank, how many ranks are alike, its `rank_passes`)] for one rank of each distinct kind."""
    return [(r, n, rank_passes(model, cluster, layout, r, precision))
            for r, n in _distinct_ranks(model, layout.pp, layout.stages, layout.v_shaped, layout_ends(layout))]


def _slowest_and_others(ranks: list, pp: int) -> tuple[Passes, Passes, float]:
    """`pipeline_passes` of `distinct_rank_passes`."""
    per = sorted(((p, n) for _, n, p in ranks), key=lambda pn: -pn[0].total)
    slowest = per[0][0]
    if pp == 1:
        return slowest, slowest, 0.0
    others = [(p, n - (i == 0)) for i, (p, n) in enumerate(per)]
    mean = sum((p * n for p, n in others), Passes()) * (1 / (pp - 1))
    return slowest, mean, slowest.total - next(p.total for p, n in others if n)


# Schedules whose ranks hold other passes ready while a send travels (GPipe's run of forwards, then of
# backwards; interleaved 1F1B's other chunks): their sends hide but for the chain (sim/engine.py shows it).
QUEUED = ("gpipe", "interleaved")


def queues_sends(layout: Layout, sw) -> bool:
    """Whether the schedule queues other passes while a send travels and the framework overlaps the sends."""
    return not sw.pipeline_sends_block and layout.schedule in QUEUED


def _p2p_hidden_by(layout: Layout, sw, t: float, slack: float) -> float:
    """What the stage-boundary sends of `t` seconds hide behind: all of themselves where the schedule queues
    them (`queues_sends`), the slowest rank's slack over its neighbours otherwise, nothing where every send blocks
    its rank (Software.pipeline_sends_block: the slowest rank waits out its own sends)."""
    if sw.pipeline_sends_block:
        return 0.0
    return t if queues_sends(layout, sw) else slack


def _copies_out(sw) -> bool:
    """Whether ZeRO-3's gathered parameters are copied out of the all-gather buffer (Software.fsdp_copy_out)."""
    return sw.framework == "torch" and sw.fsdp_copy_out


def _chain_crossings(layout: Layout) -> int:
    """Stage-boundary sends on the path of the first micro-batch's forward and the last one's backward, which
    nothing hides: every chunk boundary (the V's turn stays on rank p-1)."""
    return 2 * (layout.stages - 1 - (1 if layout.v_shaped else 0))


def layout_kinds(model: ModelSpec, layout: Layout) -> tuple:
    """`chunk_kinds` of the layout's cut."""
    return chunk_kinds(model, layout.stages, layout.pp, layout_ends(layout))


@lru_cache(maxsize=4096)
def chunk_kinds(model: ModelSpec, chunks: int, pp: int = 1, ends: tuple = ()) -> tuple:
    """(dense layers, MoE layers, holds the head) of each pipeline chunk (`ends`: placement.layout_ends)."""
    out = []
    for c, owned in enumerate(split_layers(model.layers, chunks, model.mtp_layers, pp, *ends)):
        moe = sum(model.is_moe_layer(i) for i in owned) if model.is_moe else 0
        out.append((len(owned) - moe, moe, c == chunks - 1))
    return tuple(out)


@lru_cache(maxsize=4096)
def _distinct_ranks(model: ModelSpec, pp: int, chunks: int, v_shaped: bool, ends: tuple = ()) -> tuple:
    """((rank, how many ranks hold alike chunks), ...): one pipeline rank per distinct multiset of chunk kinds,
    as ranks holding alike chunks cost alike."""
    kinds = chunk_kinds(model, chunks, pp, ends)
    count: dict = {}
    first: dict = {}
    for r in range(pp):
        key = tuple(sorted(kinds[c] for c in rank_chunks(pp, chunks, v_shaped, r)))
        first.setdefault(key, r)
        count[key] = count.get(key, 0) + 1
    return tuple((first[k], count[k]) for k in first)


@lru_cache(maxsize=4096)
def rank_kinds(model: ModelSpec, pp: int, chunks: int, v_shaped: bool) -> tuple:
    """(dense layers, MoE layers, 1 if it holds the head, how many ranks are alike) of each distinct pipeline
    rank (`_distinct_ranks`)."""
    kinds = chunk_kinds(model, chunks)
    return tuple(tuple(map(sum, zip(*(kinds[c] for c in rank_chunks(pp, chunks, v_shaped, r))))) + (n,)
                 for r, n in _distinct_ranks(model, pp, chunks, v_shaped))


def elementwise_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, tokens: float,
                        act_bytes: int) -> float:
    """Memory-bound kernels (norms, activations, softmax, dropout, residuals) per micro-batch: they move
    about what a layer stores for backward, written and read once per pass (Ivanov et al. 2021, "Data
    movement is all you need": these take a third of BERT's time at 0.2% of its FLOPs); unfused, every
    operator moves its own inputs and outputs ([software] fused_elementwise). Passes: forward, backward (2x),
    and the recomputed forward."""
    per_token = elementwise_per_token(model, cluster, layout.tp, layout.sp, layout.recompute)
    return elementwise_scaled(model, cluster, layout.pp, tokens, per_token, act_bytes)


def elementwise_scaled(model: ModelSpec, cluster: ClusterSpec, pp: int, tokens: float, per_token, act_bytes: int):
    """`elementwise_seconds` from a layer's bytes moved per token (`_elementwise_per_token`; a float, or an
    array of them for the planner's bound)."""
    return model.layers / pp * tokens * per_token * act_bytes / cluster.achieved_hbm_bandwidth


def elementwise_per_token(model: ModelSpec, cluster: ClusterSpec, tp: int, sp: bool, recompute: str) -> float:
    """`_elementwise_per_token` for a cluster's kernels."""
    sw = cluster.software
    return _elementwise_per_token(model, cluster.fused_attention, sw.fused_elementwise, tp, sp, recompute,
                                  sw.low_precision_norm, sw.attention_unpad)


@lru_cache(maxsize=4096)
def _elementwise_per_token(model: ModelSpec, fused: bool, fused_elementwise: bool, tp: int, sp: bool,
                           recompute: str, low_precision_norm: bool = False, unpad: bool = False) -> float:
    """Bytes (per byte of activation) one layer's element-wise kernels move per token in all its passes. Fused
    kernels write and read once per pass what the layer stores (the 2-byte accounting of
    activation_bytes_per_layer scaled to one byte); eager ones move what eager_forward_elements counts; an
    unfused attention core's softmax and dropout move what `score_elements` counts; `unpad` adds
    `unpad_elements`."""
    # LoRA's frozen matrices run the element-wise kernels of the matrices they are (though they keep less for
    # backward), and each adapter's dropout those of what it keeps
    base, adapters = replace(model, lora_rank=0), 2 * adapter_saved_elements(model, tp)
    stored = activation_bytes_per_layer(base, Layout(tp=tp, sp=sp, recompute="selective"), 1) + adapters
    passes = 3 + (1 if recompute in REBUILDS_LAYER else 0)
    forward = stored if fused_elementwise else eager_forward_elements(model, tp, sp, low_precision_norm) + adapters
    # recompute modules (Megatron-Core's) write again, and read once, what they no longer keep
    modules = Layout(recompute=recompute).recompute_modules | {"core_attn"}
    rerun = stored - adapters - activation_bytes_per_layer(base, Layout(tp=tp, sp=sp, recompute="+".join(modules)), 1)
    moved = forward * passes + rerun + (0.0 if fused else score_elements(model, tp, recompute))
    return moved + (unpad_elements(model, tp, recompute) if unpad else 0.0)


def unpad_elements(model: ModelSpec, tp: int, recompute: str) -> float:
    """Elements one layer's attention unpadding moves per token over a step (flash-attn 2.4's bert_padding, as
    llm-foundry's flash_attn_fn calls it): forward, q, k and v each gathered (torch.gather against an expanded
    index: read and write, 2) and the output put back into zeros (zeros, read, write: 3); backward, their
    gradients scattered into zeros (3 each) and the output's gradient indexed (2). A rerun of the attention core
    (selective, minimal, full) unpads again."""
    q = model.heads * model.head_dim / tp
    qkv = q + 2 * kv_heads_per_rank(model.kv_heads, tp) * model.head_dim
    forward = 2 * qkv + 3 * q
    return forward * (2 if Layout(recompute=recompute).reruns("core_attn") else 1) + 3 * qkv + 2 * q


def score_elements(model: ModelSpec, tp: int, recompute: str) -> float:
    """Elements (a 2-byte one counts 1, the 1-byte dropout mask 1/2) an unfused attention core's element-wise
    kernels move per token over a step, counted kernel by kernel as Megatron-LM runs them, per element of the
    rank's heads x seq scores: the fused scale-mask-softmax reads the scores and writes the probabilities (2),
    torch's dropout reads them and writes its output and mask (2.5); backward, the dropout's reads the gradient
    and the mask and writes the gradient (2.5), the softmax's reads the gradient and the probabilities and writes
    the gradient (3). Dropout only in models trained with it (GPT-style, `biases`: memory.activation_bytes_per_
    layer's rule); recompute of the attention core (selective, core_attn, full) runs the forward twice."""
    dropout = 2.5 if model.biases else 0.0
    forwards = 2 if Layout(recompute=recompute).reruns("core_attn") else 1
    return model.heads / tp * model.seq * ((2 + dropout) * forwards + 3 + dropout)


def eager_forward_elements(model: ModelSpec, tp: int, sp: bool, low_precision_norm: bool = False) -> float:
    """Elements (of the activation dtype; an fp32 one counts 2) the element-wise operators of one block read
    and write per token in forward when each runs as its own kernel, as torchtitan's model.py runs a LLaMA
    block in eager mode: per RMSNorm, x.float() 3, pow 4, mean 2, x * rsqrt 4, type_as 3, * weight 2 (18 per
    hidden element); RoPE in complex fp32 on its rotated share of q and k, .float() 3, multiply 4, type_as 3
    (10 per element; none with learned positions); grouped K, V expanded to the query heads (repeat_kv); the
    attention output made contiguous 2; SwiGLU's silu 2 and product 3 per ffn element (GeLU 2, a squared ReLU's
    relu and square 4: Megatron-Core's squared_relu is two operators); two residual adds 3 each. A LayerNorm
    (GPT-style blocks, Nemotron-4) runs in fp32 under autocast (its autocast-to-float32 list):
    the input cast 3, layer_norm 4, the next linear's cast back 3 (10 per hidden element); a low-precision norm
    reads and writes the 2-byte activations once (2)."""
    q = model.heads * model.head_dim / tp
    kv = kv_heads_per_rank(model.kv_heads, tp) * model.head_dim
    width = ((model.top_k + model.shared_experts) * model.expert_ffn if model.is_moe else model.ffn) / tp
    norm = 2 if low_precision_norm else 10 if model.layer_norm else 18
    hidden = (2 * norm + 2 * 3) * model.hidden / (tp if sp else 1)
    rope = 0.0 if model.learned_positions else 10 * model.rotary_fraction * (q + kv)
    repeat = 2 * (kv + q) if kv < q else 0.0
    activation = 5 if model.gated_mlp else 4 if model.mlp == "relu2" else 2
    return hidden + rope + repeat + 2 * q + activation * width


def _time(cluster, devices, layout, axis, collective, nbytes, calls, group=None) -> float:
    """Seconds of a collective over an axis's group (or over `group`, (size, stride))."""
    size, stride = group or _axis_group(layout, axis)
    link = overhead.measured_link(cluster, collective, comm.group_link(cluster, devices, size, stride))
    return comm.collective_time(collective, nbytes, calls, size, link)


def regime(model: ModelSpec, cluster: ClusterSpec, layout: Layout, batch_tokens: float) -> dict:
    """Which side of its strategy's critical batch size the layout sits on (scaling book rooflines), with
    every strategy's threshold over this layout's groups for comparison."""
    devices = layout.devices
    per_device = batch_tokens / devices
    peak = cluster.peak_flops_bf16
    dp_size, dp_stride = _axis_group(layout, "dp")
    w_dp = comm.group_link(cluster, devices, dp_size, dp_stride).raw_bandwidth
    w_tp = comm.group_link(cluster, devices, max(layout.tp, 2), 1).raw_bandwidth
    thresholds = {"DP or FSDP": critical.dp_critical(peak, w_dp),
                  "FSDP+TP": critical.fsdp_tp_critical(peak, model.ffn, w_dp, w_tp),
                  "largest compute-bound TP degree": critical.max_tp(peak, model.ffn, cluster.tiers[0].bandwidth)}
    if layout.tp > 1:
        strategy = ("FSDP" if layout.zero == 3 else "DP") + "+TP"
        crit = thresholds["FSDP+TP"] if dp_size > 1 else None
    else:
        strategy = "FSDP" if layout.zero == 3 else "DP"
        crit = thresholds["DP or FSDP"] if dp_size > 1 else None
    if layout.pp > 1:
        strategy += "+PP"
    side = None if crit is None else ("compute" if per_device >= crit else "communication")
    return {"strategy": strategy, "per_device_tokens": per_device, "critical_tokens": crit, "side": side,
            "thresholds": thresholds}
