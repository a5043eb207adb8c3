"""Memory and a lower bound on step time for every layout of one parallel shape at once, over numpy arrays.

The planner (plan/search.py) scores each layout it enumerates with these, then costs the promising ones in
full with `predict`, cheapest bound first. Both are built from predict's own terms (cost/memory.py,
cost/kernels.py, cost/comm.py, cost/pipeline.py, cost/step.py), so a change there reaches the bound too:
- memory: predict's memory per device, with the parameters of the busiest rank of the shape's plain or V
  placement;
- step time: (compute of the slowest stage + the bandwidth part of the collectives on the critical path) x
  (1 + bubble ratio) + the ZeRO-1/2 parameter all-gather + the data-parallel traffic backward cannot hide,
  that traffic of the rank with the fewest parameters (predict's step waits for whichever rank takes
  longest), and a MoE layout's expert traffic that shows on the rank with the fewest MoE layers; latencies
  (but the CP ring's and the EP all-to-alls') and per-kernel host overheads are dropped, and every term is at
  most predict's; or, where more, the same with each rank's micro-batch lasting at least what its host takes to
  issue it (`host_wait_floor`). A host slower than its device stretches the passes, and so the compute that ring
  attention and a rank's lead hide traffic behind (`stretch_ceiling`): those floors take the longest stretch.
"""

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from meshscale.cost import comm, overhead
from meshscale.cost.comm import Overlap
from meshscale.cost.kernels import Passes, attention_core_seconds, head_passes, layer_passes, mtp_passes
from meshscale.cost.memory import (PRECISIONS, activation_bytes_per_layer, busiest_rank, expert_params_on_rank,
                                   fsdp_gathered, held_layers, optimizer_bytes, params_on_rank, rebuilt_layer_bytes,
                                   root_params_on_rank, trained_params_on_rank, weight_bytes, zero_copy_bytes)
from meshscale.cost.pipeline import head_on_chain, schedule_bubble, v_tail
from meshscale.cost.step import (chunk_kinds, elementwise_per_token, elementwise_scaled, grad_reduce_bytes,
                                 param_gather_bytes, queues_sends, rank_kinds, rank_moe_layers, running_overlap,
                                 slowest_of, unpad_waits)
from meshscale.specs.cluster import ClusterSpec
from meshscale.specs.layout import RECOMPUTE, REBUILDS_LAYER, ZERO_BUBBLE_SCHEDULES, Layout
from meshscale.specs.model import ModelSpec
from meshscale.specs.placement import layer_counts, rank_chunks, sends_per_rank, stage_owner

# The recompute modes the planner searches (op is torchtitan's policy for predict and train, with its own rules;
# minimal_mlp MaxText's, for predict and --emit maxtext)
RECOMPUTE_MODES = tuple(r for r in RECOMPUTE if r not in ("op", "minimal_mlp"))
REBUILT_MODES = [i for i, r in enumerate(RECOMPUTE_MODES) if r in REBUILDS_LAYER]  # their indices


@dataclass(frozen=True)
class Shape:
    """One parallel shape and the choices enumerated inside it, for a global batch of `global_batch`."""
    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    global_batch: int
    schedules: tuple  # (name, vpp) pairs
    microbatch_sizes: tuple  # ascending
    sps: tuple  # (False,) or (False, True)
    shards: tuple  # ZeRO shard group sizes: all dp*cp ranks first, then a hybrid group
    etp: int = 0  # expert tensor parallelism (Layout.etp; 0: tp)

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def per_rank(self) -> int:
        """Sequences per data-parallel rank and step."""
        return self.global_batch // self.dp

    def schedule_is(self, *names) -> np.ndarray:
        """Per schedule: whether it is one of `names`."""
        return np.array([n in names for n, _ in self.schedules])

    def vpps(self) -> np.ndarray:
        """Per schedule: its chunks per rank."""
        return np.array([v for _, v in self.schedules])

    def layout(self, **choices) -> Layout:
        """The Layout of this shape's tp, cp, dp, ep and etp with `choices` (the rest at their defaults): what
        Layout derives from them (edp, dispatch_split) is read from it, not written again."""
        return Layout(dp=self.dp, tp=self.tp, cp=self.cp, ep=self.ep, etp=self.etp, **choices)


@dataclass(frozen=True)
class Placements:
    """Per schedule of a shape, where its chunks and parameters are: what depends on tp, ep, pp and the
    schedules, and not on dp or cp (so the shapes that differ in those share one)."""
    layouts: tuple  # one Layout per schedule
    v_shaped: np.ndarray
    owned: tuple  # layers of each pipeline rank
    # the rank holding the most parameters (memory.busiest_rank): what the memory bound charges
    params: np.ndarray  # its parameters, less the routed experts under EP (those reduce over their own group)
    experts: np.ndarray  # its routed expert parameters under EP (0 without)
    trained: np.ndarray  # its parameters the optimizer updates: `params`, or LoRA's adapters
    # The time bound's data-parallel floor, valid on whichever rank predict's step waits for: the fewest dense
    # parameters, root parameters and dense parameters outside the root of any rank, and each rank's (dense
    # parameters, root parameters, chunks) for its gradient buckets.
    fewest_params: np.ndarray
    fewest_root: np.ndarray
    fewest_blocks: np.ndarray
    ranks: tuple
    fewest_moe: np.ndarray  # the fewest MoE layers any rank runs (its EP all-to-alls)
    fewest_experts: np.ndarray  # the fewest routed expert parameters any rank holds under EP (0 without)
    # the parameters each rank reduces the gradients of (its dense ones, or LoRA's adapters), and the fewest
    trained_ranks: tuple
    fewest_trained: np.ndarray


def placements(model: ModelSpec, shape: "Shape") -> Placements:
    return _placements(model, shape.tp, shape.ep, shape.etp, shape.pp, shape.schedules)


@lru_cache(maxsize=4096)
def _placements(model: ModelSpec, tp: int, ep: int, etp: int, pp: int, schedules: tuple) -> Placements:
    layouts = tuple(Layout(dp=ep, tp=tp, pp=pp, vpp=v, schedule=n, ep=ep, etp=etp) for n, v in schedules)
    busy = tuple(busiest_rank(model, lay) for lay in layouts)
    experts = np.array([expert_params_on_rank(model, lay, r) if ep > 1 else 0.0 for lay, r in zip(layouts, busy)])
    params = np.array([params_on_rank(model, lay, r) for lay, r in zip(layouts, busy)]) - experts
    v_shaped = np.array([lay.v_shaped for lay in layouts])
    ranks = tuple(tuple((params_on_rank(model, lay, r) - (expert_params_on_rank(model, lay, r) if ep > 1 else 0.0),
                         root_params_on_rank(model, lay, r), len(rank_chunks(pp, lay.stages, lay.v_shaped, r)))
                        for r in range(pp)) for lay in layouts)
    fewest_params = np.array([min(p for p, _, _ in each) for each in ranks])
    fewest_root = np.array([min(root for _, root, _ in each) for each in ranks])
    fewest_blocks = np.array([min(p - root for p, root, _ in each) for each in ranks])
    fewest_moe = np.array([min(rank_moe_layers(model, lay, r) for r in range(pp)) for lay in layouts])
    fewest_experts = np.array([min(expert_params_on_rank(model, lay, r) for r in range(pp)) if ep > 1 else 0.0
                               for lay in layouts])
    trained_ranks = tuple(tuple(trained_params_on_rank(model, lay, r) for r in range(pp)) if model.lora else
                          tuple(p for p, _, _ in each) for lay, each in zip(layouts, ranks))
    trained = np.array([each[r] for each, r in zip(trained_ranks, busy)]) if model.lora else params
    fewest_trained = np.array([min(each) for each in trained_ranks])
    for a in (params, experts, v_shaped, fewest_params, fewest_root, fewest_blocks, fewest_moe, fewest_experts,
              trained, fewest_trained):
        a.flags.writeable = False
    counts = tuple(layer_counts(model.layers, pp, lay.stages, lay.v_shaped, model.mtp_layers) for lay in layouts)
    return Placements(layouts, v_shaped, counts, params, experts, trained, fewest_params, fewest_root, fewest_blocks,
                      ranks, fewest_moe, fewest_experts, trained_ranks, fewest_trained)


@dataclass
class Rows:
    """Layouts of one Shape, one per row: the ZeRO stage, shard group size and micro-batch size as values; sp,
    schedule and recompute as indices into Shape.sps, Shape.schedules and RECOMPUTE_MODES."""
    zero: np.ndarray
    shard: np.ndarray
    sp: np.ndarray
    schedule: np.ndarray
    mbs: np.ndarray
    recompute: np.ndarray
    mbs_index: np.ndarray  # into Shape.microbatch_sizes

    def __getitem__(self, which) -> "Rows":
        return Rows(*(getattr(self, f.name)[which] for f in fields(self)))

    def __len__(self) -> int:
        return len(self.zero)


def memory_bytes(model: ModelSpec, cluster: ClusterSpec, shape: Shape, rows: Rows, precision: str) -> np.ndarray:
    """Predict's memory per device (memory.memory_per_device) of each row: parameters, gradients and optimizer
    state sharded by ZeRO over the shard group (routed experts over their tp*cp*dp/(ep*etp) replicas), then the
    activations the first rank holds in flight."""
    tp, pp, cp, dp, ep, etp = shape.tp, shape.pp, shape.cp, shape.dp, shape.ep, shape.expert_tp
    z, shard, s_i, k_i, r_i = rows.zero, rows.shard, rows.sp, rows.schedule, rows.recompute
    bytes_ = PRECISIONS[precision]
    place = placements(model, shape)  # the busiest rank of each schedule, its chunks cut as predict cuts them
    v_shaped, dense, experts = place.v_shaped[k_i], place.params[k_i], place.experts[k_i]
    state = np.array([optimizer_bytes(cluster, precision, stage) + zero_copy_bytes(precision, stage)
                      for stage in range(4)])[z]  # optimizer state a parameter, by ZeRO stage
    edp = tp * cp * dp // (ep * etp)  # the experts' replicas (Layout.edp)

    def held(params, expert_params, stage):
        return params / np.where(z >= stage, shard, 1) + expert_params / np.where(z >= stage, edp, 1)
    # under LoRA the adapters are weights beside the frozen ones, and alone have gradients and optimizer state
    adapters, trained_experts = (place.trained[k_i], 0.0) if model.lora else (0.0, experts)
    weights = weight_bytes(cluster, precision) * held(dense, experts, 3) + bytes_["params"] * held(adapters, 0.0, 3)
    static = weights + sum(b * held(place.trained[k_i], trained_experts, stage)
                           for b, stage in ((bytes_["grads"], 2), (state, 1)))
    if dp * cp > 1:  # ZeRO-3's unsharded units (memory.fsdp_gathered)
        root_held = cluster.software.holds_fsdp_root
        gathered = np.array([sum(fsdp_gathered(model, tp, ep, etp, pp, lay.stages, lay.v_shaped, (), root_held))
                             for lay in place.layouts])[k_i]
        static = static + np.where(z == 3, gathered * bytes_["compute"], 0.0)
    scale = bytes_["compute"] / 2
    per_token, rebuild = (a * scale for a in _activation_bytes(model, tp, shape.etp, shape.sps,
                                                               cluster.fused_attention,
                                                               not cluster.software.fused_elementwise))
    tokens = rows.mbs * model.seq / cp
    held = _held_layers(model.layers, model.mtp_layers, pp, shape.schedules, shape.per_rank,
                        shape.microbatch_sizes)[k_i, rows.mbs_index]
    logits = np.where(v_shaped | (pp == 1), 4 * model.vocab / tp, 0.0)  # the head on the first rank
    rebuilt = np.isin(r_i, REBUILT_MODES)  # one layer rebuilt at a time during backward, the logits freed by then
    acts = (per_token[s_i, r_i] * held + np.maximum(np.where(rebuilt, rebuild[s_i], 0.0), logits)) * tokens
    return static + acts


@lru_cache(maxsize=1024)
def _activation_bytes(model: ModelSpec, tp: int, etp: int, sps: tuple, fused_attention: bool, eager: bool) -> tuple:
    """Per token, 2-byte activations: a layer's (memory.activation_bytes_per_layer) per (sp, recompute), and
    the layer rebuilt under full (and minimal) recompute's per sp (read only)."""
    ep = 2 if etp else 1  # etp needs ep > 1; activations do not depend on ep
    per_token = np.array([[activation_bytes_per_layer(model, Layout(dp=tp, tp=tp, sp=sp, recompute=r, ep=ep, etp=etp),
                                                      1, fused_attention, eager)
                           for r in RECOMPUTE_MODES] for sp in sps])
    rebuild = np.array([rebuilt_layer_bytes(model, tp, sp, 1, fused_attention, eager) for sp in sps])
    per_token.flags.writeable = rebuild.flags.writeable = False
    return per_token, rebuild


@lru_cache(maxsize=1024)
def _elementwise_table(model: ModelSpec, cluster: ClusterSpec, tp: int, sps: tuple) -> np.ndarray:
    """step.elementwise_per_token per (sp, recompute) (read only)."""
    table = np.array([[elementwise_per_token(model, cluster, tp, sp, r) for r in RECOMPUTE_MODES] for sp in sps])
    table.flags.writeable = False
    return table


@lru_cache(maxsize=4096)
def _held_layers(layers: int, mtp: int, pp: int, schedules: tuple, per_rank: int,
                 microbatch_sizes: tuple) -> np.ndarray:
    """memory.held_layers per (schedule, micro-batch size): shared by the shapes with these pp and dp."""
    held = np.array([[held_layers(layers, pp, v, n, per_rank // b, mtp) for b in microbatch_sizes]
                     for n, v in schedules])
    held.flags.writeable = False
    return held


def fills_pipeline(shape: Shape, rows: Rows) -> np.ndarray:
    """All schedules but GPipe need at least pp micro-batches in flight (specs.layout.pipeline_refusal)."""
    if shape.pp == 1:
        return np.ones(len(rows), dtype=bool)
    return (shape.per_rank / rows.mbs >= shape.pp) | shape.schedule_is("gpipe")[rows.schedule]


def step_time_bound(model: ModelSpec, cluster: ClusterSpec, shape: Shape, rows: Rows, precision: str) -> np.ndarray:
    """A lower bound on predict's step time for each row. Compute is predict's own: the kernels' F, B, W of
    the slowest rank plus its element-wise work (a third of it in the forward), less the per-kernel overheads."""
    tp, pp, cp, dp, ep = shape.tp, shape.pp, shape.cp, shape.dp, shape.ep
    z, shard, k_i, r_i = rows.zero, rows.shard, rows.schedule, rows.recompute
    m = shape.per_rank / rows.mbs
    act_bytes = PRECISIONS[precision]["compute"]
    # every pass at the pace of the slowest device, as predict's chunk passes (step.slowest_of)
    slowest_device = slowest_of(cluster, shape.devices)
    kernels = pipeline_kernel_passes(model, cluster, shape, precision).at(k_i, rows.mbs_index, r_i).scaled(
        slowest_device)
    per_token = _elementwise_table(model, cluster, tp, shape.sps)
    elementwise = slowest_device * rows.mbs * elementwise_scaled(model, cluster, pp, model.seq / cp, per_token,
                                                                 act_bytes)[rows.sp, r_i]
    slowest, others = _with_elementwise(kernels.slowest, elementwise), _with_elementwise(kernels.others, elementwise)
    f, b, w = slowest.forward, slowest.backward, slowest.weight
    compute = m * (f + b + w)
    forward = m * f  # what is left of a micro-batch once its backward has started

    placed = placements(model, shape)
    owned = placed.owned
    fewest, most = min(map(min, owned)), max(map(max, owned))
    args = (model, cluster, shape, act_bytes)
    stretch = stretch_ceiling(model, cluster, shape, precision, slowest_device)  # per mbs x recompute
    cp_floor = context_parallel_floor(*args, fewest, most, precision, slowest_device * stretch.T)  # recompute x mbs
    tp_floor = {n: np.array([tensor_parallel_floor(*args, r, n) for r in RECOMPUTE_MODES])
                for n in {min(o) for o in owned}}
    comm_floor = np.array([tp_floor[min(o)] for o in owned])  # per schedule x recompute
    # the stage-boundary sends the slowest rank's lead cannot hide; none where the schedule queues other passes
    # behind them (step.queues_sends: predict shows only the chain's, which the bubble's floor may already hold)
    send_floor = np.array([0.0 if queues_sends(lay, cluster.software) else pipeline_floor(*args, lay)
                           for lay in placed.layouts])
    # per row, the fewest parameters any rank reduces the gradients of over dp*cp, and the fewest it holds in its
    # root unit and in the rest (what ZeRO-3 gathers)
    p_k, root_k, blocks = placed.fewest_trained[k_i], placed.fewest_root[k_i], placed.fewest_blocks[k_i]

    def per_byte(collective):  # seconds per byte over each row's shard group
        full, hybrid = (bandwidth_seconds(cluster, shape.devices, collective, 1.0, g, tp)
                        for g in (shape.shards * 2)[:2])
        return np.where(shard == shape.shards[0], full, hybrid)

    ag, rs = per_byte("all_gather"), per_byte("reduce_scatter")
    ar = np.minimum(per_byte("all_reduce"), 2 * rs)  # DDP's all-reduce: NVLS may beat reduce-scatter + gather
    update = param_gather_bytes(cluster.software, precision)
    gather = ag * update * p_k if not cluster.software.param_gather_overlap else 0.0
    ratio = bubble_floor(shape, rows, kernels, elementwise, m, slowest, others, placed.v_shaped)
    # what the slowest rank's lead leaves, its passes stretched by their hosts at most `stretch` (the others' not)
    lead = kernels.lead + (stretch[rows.mbs_index, r_i] - 1) * kernels.slowest.total
    sends = np.maximum(send_floor[k_i] - m * lead, 0.0)
    if dp * cp > 1:  # what the hidden ZeRO-0-2 traffic takes from the compute it hides behind
        buckets = np.array([min(comm.grad_buckets(cluster.software, p, dp * cp, r == 0, chunks)
                                for r, (p, (_, _, chunks)) in enumerate(zip(trained, each)))
                            for trained, each in zip(placed.trained_ranks, placed.ranks)])[k_i]
        sends = sends + data_parallel_interference(cluster, z, m, buckets, compute - forward, forward,
                                                   np.where(z == 0, ar, rs) * grad_reduce_bytes(
                                                       cluster.software, precision) * p_k, ag * update * p_k)
    # what the bubble stretches (the critical path beside compute; none of it shrinks where hosts stretch the
    # passes) and what it does not (the data-parallel traffic after it)
    on_path = comm_floor[k_i, r_i] + cp_floor[r_i, rows.mbs_index] + sends
    on_path = on_path + expert_parallel_floor(model, cluster, shape, rows, placed.fewest_moe, act_bytes, m)
    off_path = np.where((z == 1) | (z == 2), gather, 0.0)
    busy, bubble = host_wait_floor(model, cluster, shape, rows, kernels, elementwise, m)
    fsdp_floor = np.zeros_like(m)
    if dp * cp > 1:  # gradient reduction not hidden by backward (zero 0-2) or FSDP traffic beyond compute
        grads = rs * grad_reduce_bytes(cluster.software, precision) * p_k
        backward = compute - forward
        # ZeRO-3 (comm.data_parallel_ops): without a pipeline each micro-batch gathers the blocks twice and
        # the root once and reduce-scatters the gradient; inside one, every forward gathers the blocks, all
        # backwards gather them once more, and the gradient is reduce-scattered once.
        if pp == 1:
            fsdp = m * (grads + ag * act_bytes * (2 * blocks + root_k))
        else:
            fsdp = grads + ag * act_bytes * ((m + 1) * blocks + root_k)
        ar_grads = ar * grad_reduce_bytes(cluster.software, precision) * p_k
        unhidden = np.select([z == 0, z == 1, z == 2], [ar_grads - backward / m, grads - backward / m,
                                                         m * grads - backward], fsdp - compute)
        off_path = off_path + np.maximum(unhidden, 0.0)
        fsdp_floor = np.where(z == 3, fsdp, 0.0)
        if cluster.software.fsdp_prefetch:
            # FSDP's collectives hide at least min(compute, efficiency x (1 - 1/calls) of their time), one call
            # of each showing (step._shown), and slow that compute by their SM share: predict's interference, on
            # the critical path. Each makes a call per unit at least, the layers of the lightest rank and the
            # root (comm.data_parallel_ops); the experts' own units under EP may be as few as two.
            calls = fewest + 1 if ep == 1 else 2
            window = np.maximum(compute, busy)  # where hosts stretch the passes, predict's longer
            hides = np.minimum(window, cluster.software.overlap_efficiency * fsdp * (1 - 1 / calls))
            on_path = on_path + np.where(z == 3, comm.sm_share(cluster, "dp") * hides, 0.0)
    reduced_experts = 0.0 if model.lora else placed.fewest_experts[k_i]  # frozen experts: nothing to reduce
    off_path = off_path + expert_data_parallel_floor(cluster, shape, z, reduced_experts, m,
                                                     compute - forward, precision)
    # or, where hosts may be slower than their devices: their floor of compute (or the FSDP traffic that hides
    # behind it, if longer) and bubble, the critical path beside it, and ZeRO-1/2's gather; less what a negative
    # bubble takes off predict's step (DualPipeV's micro-batches overlapping)
    shrink = 1 + np.minimum(ratio, 0.0)
    hosts = (np.maximum(busy, fsdp_floor) + on_path) * shrink + bubble + np.where((z == 1) | (z == 2), gather, 0.0)
    return np.maximum((compute + on_path) * (1 + ratio) + off_path, hosts)


def host_wait_floor(model: ModelSpec, cluster: ClusterSpec, shape: Shape, rows: Rows, kernels: "PipelinePasses",
                    elementwise, m) -> tuple[np.ndarray, np.ndarray]:
    """Compute and bubble where hosts may be slower than their devices: a rank's micro-batch lasts at least
    x_r = max(its device's F + B + W, its host's issue time) (step.host_bound), so the slowest rank's
    micro-batches take m x max x_r. Under GPipe, 1F1B and interleaved the step is at least `last_rank_floor` with
    the lightest chunks lasting max(device, host) (PipelinePasses.fill); the bubble, what that floor adds to
    m x max x_r. Elsewhere it is left out."""
    at = kernels.placement[rows.schedule], rows.recompute
    host, fill_host = (h[at] for h in host_seconds(model, cluster, shape))
    x = np.where(kernels.count > 0, np.maximum(kernels.totals + elementwise[:, None], host), 0.0)
    x_fill = np.maximum(kernels.fill.total + elementwise, fill_host)
    even = ~shape.schedule_is(*ZERO_BUBBLE_SCHEDULES)[rows.schedule]
    vpp = shape.vpps()[rows.schedule]
    last = np.take_along_axis(x, kernels.head[:, None], 1)[:, 0]
    most = m * x.max(1)
    return most, np.where(even, np.maximum(last_rank_floor(shape.pp, vpp, m, last, x_fill / vpp) - most, 0.0), 0.0)


def data_parallel_interference(cluster: ClusterSpec, z, m, buckets, backward, forward, grads, gather):
    """At most predict's interference_s of the ZeRO-0-2 collectives over dp (comm.data_parallel_ops): a
    collective of t seconds in `calls` buckets, hidden behind h seconds of compute, hides min(h, efficiency x
    (t - t / calls)) (step.exposed_seconds, step._shown), which runs that much slower by the SM share
    (comm.sm_share). `grads`, `gather`: the bandwidth time of the gradient reduction (per step; zero 2: per
    micro-batch) and of the parameter all-gather; `backward`, `forward`: the compute of the step, at most
    predict's."""
    sw = cluster.software
    eff = sw.overlap_efficiency
    hidden = np.zeros_like(m)
    if sw.grad_reduce_overlap:  # zero 0, 1: behind the last backward; zero 2: behind every one, m x the buckets
        each = z == 2
        calls = np.where(each, m * buckets, buckets)
        t = np.where(each, m * grads, grads)
        hidden = hidden + np.where(z <= 2, np.minimum(np.where(each, backward, backward / m),
                                                      eff * t * (1 - 1 / calls)), 0.0)
    if sw.param_gather_overlap:  # zero 1, 2: behind the next forward
        hidden = hidden + np.where((z == 1) | (z == 2), np.minimum(forward / m, eff * gather * (1 - 1 / buckets)),
                                   0.0)
    return hidden * comm.sm_share(cluster, "dp")


def _with_elementwise(kernels: Passes, elementwise) -> Passes:
    """Kernel passes plus the element-wise work, a third in the forward and two thirds in the backward."""
    f, b, w = (k + elementwise * share for k, share in zip((kernels.forward, kernels.backward, kernels.weight),
                                                            (1 / 3, 2 / 3, 0)))
    return Passes(f, b, w)


def bubble_floor(shape: Shape, rows: Rows, kernels: "PipelinePasses", elementwise, m, slowest: Passes,
                 others: Passes, v_shaped: np.ndarray):
    """At most predict's bubble ratio (pipeline.bubble_ratio, the longest path through torch's order), over the
    slowest rank's passes. GPipe, 1F1B, interleaved: `path_floor`. The zero-bubble schedules: the larger of
    `path_floor` without the backward chain and `zero_bubble_floor` of the other ranks' mean passes, or of the
    lightest chunk's (PipelinePasses.fill) where fewer than 2p-1 micro-batches leave ZB-V's warm-up open (there
    the forms are short of exact). `v_shaped`: per schedule, Layout.v_shaped."""
    pp, k_i = shape.pp, rows.schedule
    args = shape, rows, kernels, elementwise, m, slowest.total, v_shaped
    ratio = zero_bubble_floor(*args, others)
    short = m < 2 * pp - 1
    if short.any():
        fill = _with_elementwise(kernels.fill, elementwise)
        ratio = np.where(short, np.minimum(ratio, zero_bubble_floor(*args, fill)), ratio)
    even = ~shape.schedule_is(*ZERO_BUBBLE_SCHEDULES)[k_i]
    vpp = shape.vpps()[k_i]
    path = path_floor(kernels, elementwise, vpp, m, even) / (m * slowest.total) - 1
    return np.maximum(np.where(even, path, np.maximum(ratio, path)), 0.0)


def path_floor(kernels: "PipelinePasses", elementwise, vpp, m, backward_chain):
    """A step no pipeline of these chunks undercuts, whatever the order: each rank r starts once micro-batch 0's
    forward has crossed the r chunks before its first (chunk r), then works m times its passes; under GPipe,
    1F1B and interleaved (`backward_chain`), which run full backwards, its last pass (a backward) is followed by
    that micro-batch's backward down the chunks before the one it ran, at least the same r. The latest of the
    ranks' floors; exact for even ranks, (p-1)/(v m). Element-wise work is alike on every rank, 1/v a chunk."""
    r = np.arange(kernels.ranks.shape[-1])
    before = kernels.before_forward + np.where(backward_chain[:, None], kernels.before_backward, 0.0)
    share = np.where(backward_chain, 1.0, 1 / 3)  # without the chain, the forward's third
    ends = before + r * (share * elementwise / vpp)[:, None] + m[:, None] * (kernels.ranks + elementwise[:, None])
    return ends.max(1)


def zero_bubble_floor(shape: Shape, rows: Rows, kernels: "PipelinePasses", elementwise, m, total, v_shaped,
                      others: Passes):
    """cost/pipeline.py's forms with `others` as the other ranks' passes, over `total`, the slowest rank's: their
    even bubble; where rank 0 holds the head and is the slowest under a V, the later of the others' span and its
    own cool-down (ZB-V's warm-up left out); ZB-H1: the others' span. Elsewhere, where ranks differ, the even
    forms over the others' mean passes can over-read torch's order (Llama 2 13B in 16 uneven ZB-V chunks on 8 A100
    ranks, the head's not the slowest: 7.4% against predict's 6.7%): none, `path_floor` stands alone there."""
    pp, k_i = shape.pp, rows.schedule
    total_o = others.total
    ratio = schedule_bubbles(shape.schedules, k_i, pp, m, others.forward, others.backward, others.weight)
    ratio = ratio * total_o / total
    v_first = v_shaped[k_i] & kernels.head_slowest
    beyond = ratio + total_o / total - 1
    if v_first.any():
        zbv = shape.schedule_is("zbv")[k_i]
        last = Passes(kernels.last.forward + elementwise / 6, kernels.last.backward + elementwise / 3)  # half of it
        beyond = np.where(v_first & zbv, beyond + head_on_chain("zbv", Passes(others.forward, others.backward),
                                                                last) / (m * total), beyond)
        first = Passes(0.0, kernels.first.backward + elementwise / 3, kernels.first.weight)  # B: 2/3 of half of it
        tail = np.where(zbv, v_tail(pp, Passes(0.0, others.backward), first, Passes(weight=kernels.last.weight),
                                    np.maximum),
                        (pp - 1) * (others.backward - others.weight) / 2)
        ratio = np.where(v_first, np.maximum(tail / (m * total), beyond), ratio)
    even = np.isclose(total_o, total)
    return np.where(even | v_first, np.where(shape.schedule_is("zb")[k_i], beyond, ratio), 0.0)


def last_rank_floor(pp: int, vpp, m, last, chunk):
    """A step no pipeline of these chunks undercuts under GPipe, 1F1B and interleaved 1F1B, which run full
    backwards, their slowest rank wherever it sits: the last rank starts once micro-batch 0's forward has crossed
    the p-1 chunks before it, works m times its passes (`last`), and its last pass, the last micro-batch's
    backward of its first chunk, is followed by that backward down the same p-1 chunks (each at least `chunk`, the
    lightest). Exact for even ranks, (p-1)/(v m)."""
    return m * last + (pp - 1) * chunk


def schedule_bubbles(schedules, k_i, pp: int, m, f, b, w) -> np.ndarray:
    """Each row's `pipeline.schedule_bubble` (its schedule `schedules[k_i]`) with its F, B, W, over arrays: one
    call per schedule name, with each row's vpp (the interleaved schedules differ in it alone)."""
    names = list(dict.fromkeys(n for n, _ in schedules))
    name_i = np.array([names.index(n) for n, _ in schedules])[k_i]
    vpp = np.array([v for _, v in schedules])[k_i]
    out = np.zeros_like(m)
    for j, name in enumerate(names):
        at = name_i == j
        out[at] = schedule_bubble(name, pp, vpp[at], m[at], f[at], b[at], w[at], np.maximum, np.minimum)
    return out


@dataclass(frozen=True)
class PipelinePasses:
    """The kernels' F, B, W of one micro-batch as predict's `pipeline_passes` charges them, less the
    element-wise work (alike on every rank): arrays over (placement, micro-batch size, recompute), `placement`
    giving each schedule's (schedules of a shape that place chunks alike share one), or, `at` rows, one value
    per row."""
    slowest: Passes  # the slowest pipeline rank's
    others: Passes  # their mean over the other ranks
    fill: Passes  # a rank of v chunks, each the lightest
    lead: np.ndarray  # how much longer the slowest rank's micro-batch takes than the next slowest's
    head_slowest: np.ndarray  # rank 0 is the slowest
    first: Passes  # the first chunk's
    last: Passes  # the last chunk's (rank 0's under a V)
    placement: np.ndarray  # per schedule of the shape
    totals: np.ndarray  # per distinct rank (the last axis), its F + B + W
    count: np.ndarray  # (placement, distinct rank): how many ranks are alike (0: padding)
    head: np.ndarray  # per placement, the distinct rank holding the head (the last rank but under a V)
    # per pipeline rank (the last axis, in order): its F + B + W, and the F and the B + W of the chunks before its
    # first (`path_floor`)
    ranks: np.ndarray
    before_forward: np.ndarray
    before_backward: np.ndarray

    def at(self, schedule, mbs, recompute) -> "PipelinePasses":
        # one flat index for the 14 arrays over (placement, mbs, recompute): np.take of it is several times
        # cheaper than indexing each with the three index arrays
        index = np.ravel_multi_index((self.placement[schedule], mbs, recompute), self.lead.shape)

        def pick(p: Passes) -> Passes:
            return Passes(np.take(p.forward, index), np.take(p.backward, index), np.take(p.weight, index))

        def per_rank(a: np.ndarray) -> np.ndarray:
            return a.reshape(-1, a.shape[-1])[index]
        return PipelinePasses(pick(self.slowest), pick(self.others), pick(self.fill), np.take(self.lead, index),
                              np.take(self.head_slowest, index), pick(self.first), pick(self.last), self.placement,
                              per_rank(self.totals), self.count[self.placement[schedule]],
                              self.head[self.placement[schedule]], per_rank(self.ranks),
                              per_rank(self.before_forward), per_rank(self.before_backward))

    def scaled(self, factor: float) -> "PipelinePasses":
        return PipelinePasses(self.slowest * factor, self.others * factor, self.fill * factor, self.lead * factor,
                              self.head_slowest, self.first * factor, self.last * factor, self.placement,
                              self.totals * factor, self.count, self.head, self.ranks * factor,
                              self.before_forward * factor, self.before_backward * factor)


def pipeline_kernel_passes(model: ModelSpec, cluster: ClusterSpec, shape: Shape, precision: str) -> PipelinePasses:
    """`PipelinePasses` of every (schedule, micro-batch size, recompute) of a shape. A rank's (and a chunk's)
    time is linear in its dense layers, MoE layers and head: step.rank_kinds counts them per distinct rank."""
    pp = shape.pp
    unit = np.stack([_unit_passes(model, cluster, shape.tp, shape.cp, shape.ep, shape.etp, mbs, precision)
                     for mbs in shape.microbatch_sizes])  # (mbs, recompute, kind, F/B/W)
    keys, placement = _placement_keys(model, shape)
    kinds, count, first_end, last_end, _, chunks = _placement_kinds(model, pp, keys)
    per_rank = np.einsum("qni,jrip->qnjrp", kinds, unit)  # (placement, distinct rank, mbs, recompute, F/B/W)
    totals = np.where(count[:, :, None, None] > 0, per_rank.sum(-1), -np.inf)  # padding is never the slowest
    top = totals.argmax(1)[:, None]
    slow = np.take_along_axis(per_rank, top[..., None], 1)[:, 0]
    by_rank = np.moveaxis(np.where(count[:, :, None, None] > 0, totals, 0.0), 1, -1)  # (placement, mbs, recompute, n)
    head = kinds[..., -1].argmax(1)  # the head's column comes last (_unit_columns)
    if pp == 1:
        none = np.zeros_like(slow)
        return PipelinePasses(_passes(slow), _passes(slow), _passes(slow), none[..., 0], top[:, 0] < 0, _passes(none),
                              _passes(none), placement, by_rank, count, head, by_rank, none[..., :1], none[..., :1])
    mean = (np.einsum("qn,qnjrp->qjrp", count, per_rank) - slow) / (pp - 1)
    next_slowest = np.where(np.arange(count.shape[1])[None, :, None, None] == top, -np.inf, totals).max(1)
    alike = count[np.arange(len(count))[:, None, None], top[:, 0]]  # how many ranks are like the slowest
    lead = np.where(alike > 1, 0.0, totals.max(1) - next_slowest)
    first, last = (_passes(np.einsum("qi,jrip->qjrp", end, unit)) for end in (first_end, last_end))
    per_chunk = np.einsum("qci,jrip->qcjrp", chunks, unit)  # (placement, chunk, mbs, recompute, F/B/W)
    real = chunks.sum(-1)[:, :, None, None] >= 0  # not padding
    lightest = np.where(real, per_chunk.sum(-1), np.inf).argmin(1)
    v = np.array([c for c, _ in keys]) / pp
    fill = _passes(np.take_along_axis(per_chunk, lightest[:, None, ..., None], 1)[:, 0] * v[:, None, None, None])
    # rank r's first chunk is chunk r, plain or V: the chunks before it are the first r
    before = np.moveaxis(np.cumsum(per_chunk[:, :pp], 1) - per_chunk[:, :pp], 1, -2)  # (q, mbs, recompute, r, FBW)
    ranks = np.einsum("qrc,qcjk->qjkr", _owners(pp, keys, chunks.shape[1]), np.where(real, per_chunk.sum(-1), 0.0))
    return PipelinePasses(_passes(slow), _passes(mean), fill, lead, top[:, 0] == 0, first, last, placement, by_rank,
                          count, head, ranks, before[..., 0], before[..., 1] + before[..., 2])


@lru_cache(maxsize=1024)
def _owners(pp: int, keys: tuple, width: int) -> np.ndarray:
    """(placement, rank, chunk): whether the rank holds the chunk, for `width` chunks (a placement's beyond its
    own count are padding)."""
    owner = np.array([[[stage_owner(c, pp, v_shaped) == r for c in range(width)] for r in range(pp)]
                      for _, v_shaped in keys])
    owner.flags.writeable = False
    return owner


def _placement_keys(model: ModelSpec, shape: Shape) -> tuple[tuple, np.ndarray]:
    """The distinct placements of a shape's schedules, (chunks, V-shaped) each, and each schedule's index
    into them (schedules that place chunks alike share one)."""
    keys: dict = {}
    placement = np.array([keys.setdefault((lay.stages, lay.v_shaped), len(keys))
                          for lay in placements(model, shape).layouts])
    return tuple(keys), placement


def host_seconds(model: ModelSpec, cluster: ClusterSpec, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    """Per (placement, recompute, distinct rank as PipelinePasses counts them), the host time the rank needs to
    issue one micro-batch: its layers' and head's (cost/overhead.py framework_seconds); and per (placement,
    recompute) the fill rank's (PipelinePasses.fill)."""
    return _host_seconds(model, cluster, shape.pp, _placement_keys(model, shape)[0])


@lru_cache(maxsize=4096)
def _host_seconds(model: ModelSpec, cluster: ClusterSpec, pp: int, placements: tuple) -> tuple:
    kinds, _, _, _, fill, _ = _placement_kinds(model, pp, placements)
    unit = _unit_host(model, cluster).sum(-1)
    out = np.einsum("qni,ri->qrn", kinds, unit), np.einsum("qi,ri->qr", fill, unit)
    for a in out:
        a.flags.writeable = False
    return out


@lru_cache(maxsize=256)
def _unit_host(model: ModelSpec, cluster: ClusterSpec) -> np.ndarray:
    """Host time to issue one micro-batch through a dense layer, a MoE layer and the head (those the model
    has), (recompute, unit, forward/backward) (read only)."""
    out = np.array([[overhead.framework_seconds(model, cluster, Layout(recompute=r), *UNITS[c])
                     for c in _unit_columns(model)] for r in RECOMPUTE_MODES])
    out.flags.writeable = False
    return out


def _passes(a: np.ndarray) -> Passes:
    """Passes of arrays (not the floats they are typed as), from an array whose last axis is F, B, W."""
    return Passes(a[..., 0], a[..., 1], a[..., 2])  # type: ignore[arg-type]


@lru_cache(maxsize=4096)
def _placement_kinds(model: ModelSpec, pp: int, placements: tuple) -> tuple:
    """Of each placement ((chunks, V-shaped), ...), per distinct rank the (dense layers, MoE layers, head) it
    holds (those the model has) and how many ranks are alike (step.rank_kinds), padded with ranks alike to
    none; the same of its first and last chunks; of a rank of chunks/pp chunks each holding of every kind the
    fewest any chunk holds (a host time no rank undercuts); and of every chunk, padded with -1s."""
    columns = _unit_columns(model)
    per_placement = [np.array(rank_kinds(model, pp, chunks, v_shaped), dtype=float) for chunks, v_shaped in placements]
    kinds = np.zeros((len(placements), max(map(len, per_placement)), len(columns) + 1))
    for q, k in enumerate(per_placement):
        kinds[q, :len(k)] = k[:, columns + [-1]]
    ends = [np.array([chunk_kinds(model, chunks)[c] for chunks, _ in placements], dtype=float)[:, columns]
            for c in (0, -1)]
    each = [np.array(chunk_kinds(model, chunks), dtype=float)[:, columns] for chunks, _ in placements]
    fill = np.array([k.min(0) * len(k) / pp for k in each])
    chunks = np.full((len(placements), max(map(len, each)), len(columns)), -1.0)
    for q, k in enumerate(each):
        chunks[q, :len(k)] = k
    return kinds[..., :-1], kinds[..., -1], *ends, fill, chunks


UNITS = ((1, 0, False), (0, 1, False), (0, 0, True))  # (dense layers, MoE layers, head) of each unit


@lru_cache(maxsize=256)
def _unit_columns(model: ModelSpec) -> list[int]:
    """Which of (a dense layer, a MoE layer, the head) the model has."""
    return [c for c, present in enumerate((model.dense_layers > 0, model.is_moe, True)) if present]


def stretch_ceiling(model: ModelSpec, cluster: ClusterSpec, shape: Shape, precision: str,
                    slowest_device: float) -> np.ndarray:
    """Per (micro-batch size, recompute), the most step.host_bound may stretch a pass whose host is slower than
    its device (1: never): what bounds the compute that ring attention and a rank's lead hide traffic behind.
    A chunk's stretch is max(1, its host's time over its device's), forward and backward alike, or apart where
    it waits on the device (MoE dispatch, unpadding) max(1, h_f / F) + the waits' calls / F and the same of
    B + W; a chunk being a sum of units (layers, the head), each ratio of sums is at most the largest ratio of
    a unit's (the mediant inequality)."""
    return _stretch_ceiling(model, cluster, shape.tp, shape.cp, shape.ep, shape.etp, shape.microbatch_sizes,
                            precision, slowest_device)


@lru_cache(maxsize=4096)
def _stretch_ceiling(model, cluster, tp, cp, ep, etp, microbatch_sizes, precision, slowest_device) -> np.ndarray:
    host = _unit_host(model, cluster)  # (recompute, unit, forward/backward)
    unpad = unpad_waits(cluster, 1)
    # the waits' calls a unit makes (step._kind_passes): forward, and backward where its recompute reruns them
    waits = np.array([[(moe + unpad * (dense + moe), (moe if Layout(recompute=r).reruns("moe") else 0)
                        + (unpad * (dense + moe) if Layout(recompute=r).reruns("core_attn") else 0))
                       for dense, moe, _ in (UNITS[c] for c in _unit_columns(model))] for r in RECOMPUTE_MODES])
    waits = waits * overhead.LINEAR_HOST * cluster.host_linear_s
    out = np.ones((len(microbatch_sizes), len(RECOMPUTE_MODES)))
    for j, mbs in enumerate(microbatch_sizes):
        unit = slowest_device * _unit_passes(model, cluster, tp, cp, ep, etp, mbs, precision)  # (recompute, unit, 3)
        device = np.stack([unit[..., 0], unit[..., 1] + unit[..., 2]], -1)
        uniform = host.sum(-1) / device.sum(-1)
        apart = np.maximum(1.0, (host / device).max(1)) + (waits / device).max(1)  # (recompute, forward/backward)
        out[j] = np.maximum(np.maximum(1.0, uniform.max(1)), np.where(waits.any(), apart.max(1), 1.0))
    out.flags.writeable = False
    return out


@lru_cache(maxsize=4096)
def _unit_passes(model, cluster, tp, cp, ep, etp, mbs, precision) -> np.ndarray:
    """F, B, W of one dense layer, one MoE layer and the head (those the model has) per recompute mode: an
    array (recompute, kinds, 3), shared by every shape with these tp, cp, ep and mbs (so read only)."""
    columns = _unit_columns(model)
    unit = np.zeros((len(RECOMPUTE_MODES), len(columns), 3))
    for r, recompute in enumerate(RECOMPUTE_MODES):
        shape = Layout(tp=tp, cp=cp, ep=ep, etp=etp, dp=ep, mbs=mbs, recompute=recompute)  # a kernel_shape
        for i, c in enumerate(columns):  # counted_seconds of one dense layer, one MoE layer, the head
            if c == 2:
                p = head_passes(model, cluster, tp, cp, mbs, precision) + mtp_passes(model, cluster, shape, precision)
            else:
                p = layer_passes(model, cluster, shape, c == 1, precision)
            unit[r, i] = p.forward, p.backward, p.weight
    unit.flags.writeable = False
    return unit


@lru_cache(maxsize=65536)
def bandwidth_seconds(cluster: ClusterSpec, devices: int, collective: str, nbytes: float, size: int,
                      stride: int) -> float:
    """A collective's time over a group of `size` ranks `stride` apart, latency left out, on the link predict
    uses (a calibrated cluster's measured one over tier 0); cached: the bound asks for the same few per byte."""
    link = overhead.measured_link(cluster, collective, comm.group_link(cluster, devices, size, stride))
    return comm.collective_time(collective, nbytes, 0, size, link)


def tensor_parallel_floor(model: ModelSpec, cluster: ClusterSpec, shape: Shape, act_bytes: int, recompute: str,
                          fewest: int) -> float:
    """Bandwidth time of the TP traffic for the whole step on the lightest rank (`fewest` layers; with layers
    not divisible by the chunks that is fewer than layers / pp). EP all-to-alls have their own floor
    (`expert_parallel_floor`)."""
    if shape.tp == 1:
        return 0.0
    return _tensor_parallel_floor(model, cluster, shape.devices, shape.tp, shape.ep,
                                  shape.per_rank * model.seq / shape.cp, act_bytes, recompute, fewest)


@lru_cache(maxsize=4096)
def _tensor_parallel_floor(model: ModelSpec, cluster: ClusterSpec, devices: int, tp: int, ep: int, tokens: float,
                           act_bytes: int, recompute: str, fewest: int) -> float:
    """tensor_parallel_floor for `tokens` per rank and step: the same for every shape with these tp and dp*cp
    (comm.tensor_parallel_ops reads neither dp nor cp). A MoE model's layers all count as MoE layers, which
    under SP with EP have the fewest TP collectives: a floor whichever of them are dense."""
    # SP's all-gathers and reduce-scatters take the bandwidth time of the all-reduces without SP; only the
    # unhidden ones count (the small all-reduces are left out: SP adds its norm gradients to them)
    # minimal is floored at none's count: its rebuilt collectives differ with SP (re-gathers only under it)
    layout = Layout(dp=ep, tp=tp, sp=True, ep=ep, recompute="none" if recompute == "minimal" else recompute)
    sw = cluster.software
    # a byte of an all-gather or reduce-scatter at no less than half an all-reduce's byte: NVLS all-reduces
    # (cost/collectives.py) beat the ring's all-gather + reduce-scatter pair that SP splits them into
    half_ar = bandwidth_seconds(cluster, devices, "all_reduce", 1.0, tp, 1) / 2
    return sum(op.bytes * min(half_ar, bandwidth_seconds(cluster, devices, op.collective, 1.0, tp, 1))
               for op in comm.tensor_parallel_ops(model, layout, tokens, act_bytes, fewest, False, False, 1, 0,
                                                  fewest if model.is_moe else 0, sw.framework,
                                                  sw.tp_overlap_disable_qkv)
               if op.collective != "all_reduce" and running_overlap(op, sw, layout, 1) == Overlap.NONE)


def context_parallel_floor(model: ModelSpec, cluster: ClusterSpec, shape: Shape, act_bytes: int, fewest: int,
                           most: int, precision: str, slowest_device) -> np.ndarray:
    """Per recompute mode and micro-batch size of the shape, the CP ring time the attention cannot hide: the
    ring of the rank with the `fewest` layers, latencies included, as predict costs it (the same ops and link),
    against the attention of the `most` at the slowest device's pace (per recompute and mbs where its host may
    stretch it: `stretch_ceiling`); plus what the part it hides at least
    (against the `fewest` layers' attention) takes from that attention's SMs (predict's interference_s,
    comm.sm_share). A fused kernel's time is linear in the tokens, so its step total does not depend on mbs;
    the batched GEMMs of unfused attention are not, and get no CP term."""
    if shape.cp == 1 or not cluster.fused_attention:
        return np.zeros((len(RECOMPUTE_MODES), len(shape.microbatch_sizes)))
    layouts = [shape.layout(recompute=r, mbs=1) for r in RECOMPUTE_MODES]
    f, b = attention_core_seconds(model, cluster, layouts[0], model.seq / shape.cp, precision)  # any recompute
    per_layer = shape.per_rank * np.array([[f + b + (f if r != "none" else 0.0)] for r in RECOMPUTE_MODES])
    link = overhead.measured_link(cluster, "send_recv", comm.group_link(cluster, shape.devices, shape.cp, shape.tp))
    ring = np.array([[sum(comm.collective_time(op.collective, op.bytes, op.calls, shape.cp, link)
                          for op in comm.context_parallel_ops(model, layout, mbs * model.seq / shape.cp, act_bytes,
                                                              fewest, shape.per_rank // mbs))
                      for mbs in shape.microbatch_sizes] for layout in layouts])
    return (np.maximum(0.0, ring - most * per_layer * slowest_device)
            + np.minimum(ring, fewest * per_layer) * comm.sm_share(cluster, "cp", link, "send_recv"))


def expert_parallel_floor(model: ModelSpec, cluster: ClusterSpec, shape: Shape, rows: Rows, fewest_moe: np.ndarray,
                          act_bytes: int, m) -> np.ndarray | float:
    """The expert-parallel traffic that shows on the path of the rank with the fewest MoE layers (`fewest_moe` per
    schedule), as predict costs and exposes it (step._shown, exposed_seconds). The all-to-alls
    (comm.expert_parallel_ops and expert_dispatch_time, latencies included): all of them, or where another
    micro-batch's compute may hide them (dualpipev, [software] ep_comm_overlap) 1/m of them and the
    1 - overlap_efficiency of the rest that cannot run beside compute. Expert TP's gathers and reduce-scatters
    (comm.expert_tensor_parallel_ops, which nothing hides): their bandwidth time. A rank's bytes a step do not
    depend on the micro-batch size."""
    if shape.ep == 1 or not model.is_moe:
        return 0.0
    sw = cluster.software
    split = np.array([shape.layout(sp=sp).dispatch_split for sp in shape.sps])[rows.sp]
    reruns = np.array([Layout(recompute=r).reruns("moe") for r in RECOMPUTE_MODES])[rows.recompute]
    dispatched = shape.per_rank * model.seq / shape.cp / split * model.top_k * model.hidden * act_bytes  # a layer
    per_mb = fewest_moe[rows.schedule] * (4 + 2 * reruns)  # all-to-alls a micro-batch
    per_byte, per_call = _dispatch_rates(model, cluster, shape.devices, shape.ep, shape.expert_tp)
    e = sw.overlap_efficiency
    hideable = sw.ep_comm_overlap | shape.schedule_is("dualpipev")[rows.schedule]
    shown = np.where(hideable, (1 - e) + e / m, 1.0)
    floor = (per_byte * dispatched * per_mb + per_call * m * per_mb) * shown
    etp = shape.expert_tp
    if etp > 1:
        gathers = np.where(split > 1, etp * dispatched * fewest_moe[rows.schedule] * (2 + reruns), 0.0)
        floor = floor + gathers * sum(bandwidth_seconds(cluster, shape.devices, c, 1.0, etp, 1)
                                      for c in ("all_gather", "reduce_scatter"))
    return floor


def expert_data_parallel_floor(cluster: ClusterSpec, shape: Shape, z, experts, m, backward, precision: str):
    """Bandwidth time of the routed experts' gradient reduction over their own replicas (edp ranks etp*ep apart,
    step._axis_group) that the backward cannot hide, as the dense floor charges ZeRO-0-2 (comm.data_parallel_ops:
    DDP's all-reduce and ZeRO-1's reduce-scatter behind the last micro-batch's backward, ZeRO-2's behind all of
    them; ZeRO-1/2's parameter all-gather where nothing overlaps it); ZeRO-3's units are left out."""
    edp = shape.layout().edp
    if shape.ep == 1 or edp == 1:
        return 0.0
    sw = cluster.software

    def per_byte(collective):
        return bandwidth_seconds(cluster, shape.devices, collective, 1.0, edp, shape.expert_tp * shape.ep)

    grads = grad_reduce_bytes(sw, precision) * experts
    unhidden = np.select([z == 0, z == 1, z == 2], [per_byte("all_reduce") * grads - backward / m,
                                                     per_byte("reduce_scatter") * grads - backward / m,
                                                     per_byte("reduce_scatter") * grads * m - backward], 0.0)
    gather = 0.0 if sw.param_gather_overlap else per_byte("all_gather") * param_gather_bytes(sw, precision) * experts
    return np.maximum(unhidden, 0.0) + np.where((z == 1) | (z == 2), gather, 0.0)


@lru_cache(maxsize=4096)
def _dispatch_rates(model: ModelSpec, cluster: ClusterSpec, devices: int, ep: int, etp: int) -> tuple[float, float]:
    """Seconds a byte and a call of the EP all-to-alls take (their time is linear in both), as predict costs
    them: the group of ep ranks etp apart (step._axis_group), the [software] dispatcher and routing imbalance."""
    link = overhead.measured_link(cluster, "all_to_all", comm.group_link(cluster, devices, ep, etp))
    per_byte = comm.expert_dispatch_time(cluster, 1.0, 0, ep, link, model)
    return per_byte, comm.expert_dispatch_time(cluster, 1.0, 1, ep, link, model) - per_byte


def pipeline_floor(model: ModelSpec, cluster: ClusterSpec, shape: Shape, act_bytes: int, layout: Layout) -> float:
    """Bandwidth time of the stage-boundary sends of the rank sending fewest (predict costs one rank's)."""
    if shape.pp == 1:
        return 0.0
    return _pipeline_floor(model, cluster, shape.devices, layout, shape.per_rank * model.seq / shape.cp, act_bytes)


@lru_cache(maxsize=4096)
def _pipeline_floor(model: ModelSpec, cluster: ClusterSpec, devices: int, layout: Layout, tokens: float,
                    act_bytes: int) -> float:
    """pipeline_floor for `tokens` per rank and step: the same for every shape with this placement and dp*cp."""
    per_rank = sends_per_rank(layout.pp, layout.stages, layout.v_shaped)
    quietest = min(range(layout.pp), key=per_rank.__getitem__)
    ops = comm.pipeline_ops(model, layout, tokens, act_bytes, 1, quietest, cluster.software.pipeline_receives_block)
    return sum(bandwidth_seconds(cluster, devices, op.collective, op.bytes, 2, devices // layout.pp) for op in ops)
