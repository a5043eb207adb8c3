"""Pipeline bubbles: idle time as a fraction of the ideal (bubble-free) compute time.

With F, B, W the times of a micro-batch's forward, input-gradient and weight-gradient passes on a rank
(T = F + B + W; a full backward is B + W), p ranks, m micro-batches and v chunks per rank, for the orders
torch.distributed.pipelining runs (sim/schedule.py rebuilds them; tests/test_simulate.py checks them against
torch's and these forms against the simulated idle time, for equal and unequal F, B, W):
  GPipe, 1F1B  (p-1)/m                    Huang et al. 2019; Narayanan et al. 2021 eq. 1
  interleaved  (p-1)/(v*m)                Narayanan et al. 2021 sec. 2.2.2
  zb (ZB-H1)   (p-1)(F+B-W)/(m*T), (p-1)/(3m) at F = B = W     Qi et al. 2024 (ICLR, arXiv:2401.10241)
               sec. 3.1; exact for torch's order at m >= p
  zbv (ZB-V)   max((p-1)B/2 + max(0, 2p-1-m)(B-W)/2,  (p-1)B - min(m-p, p-1)W) / (m*T)
               At F = B = W and m >= 2p-1 this is Qi et al. 2024 sec. 6's (p-1)/(6m) (V-placed half-size
               chunks). The first term is the warm-up that fewer than 2p-1 micro-batches cannot fill; the
               second is the last rank's chain of input gradients that only m-p weight gradients can cover,
               twice Qi et al.'s figure at m = p.
  dualpipev    max((p-1)(F+B-W)/2,  (p-1)(B-W/2) - F/2) / (m*T), for m >= 2p: torch's DualPipeV order runs
               each overlapped F&B pair one pass after the other, so it idles about as ZB-V does, (p-1)/(6m) at
               F = B = W (DeepSeek-V3 report Table 2's (p/2-1)(F&B+B-3W) assumes the pair truly overlaps,
               which a single stream cannot show).
The ZB-V and DualPipeV forms are derived from torch's orders by walking their critical paths, and are exact
where W <= F <= B, which the kernels (cost/kernels.py) give every model above the toy presets: F and B carry
the attention that W lacks, and B the element-wise backward and any recomputation.

Uneven ranks (the output head, layers not divisible by the chunks, dense layers before MoE ones): the step
runs at the pace of the slowest rank s, and the bubble is the chain of the *other* ranks' passes that lead
in and out of it. For GPipe that is the flow-shop makespan of m identical jobs, sum over stages of one
micro-batch's F+B plus (m-1) times the slowest stage's (PipeDream, Narayanan et al. 2019 sec. 3.1: the
slowest stage sets the throughput), i.e. m*T_s plus (p-1) times the others' mean T. `bubble_ratio` applies
each form above to the other ranks' mean F, B, W (so it is unchanged when the ranks are even), over the
slowest rank's compute. When the slowest rank holds the head (the last rank; rank 0, which holds both ends,
under the V schedules), the step of ZB-H1, ZB-V and DualPipeV is the later of the others' span (their work
and bubble; under ZB-V with rank 0's last chunk on their chain, `head_on_chain`) and the slowest rank's work
plus its own idle (`head_idle`): ZB-H1's warm-up and cool-down, ZB-V's warm-up (left open by fewer than 2p-1
micro-batches) and the tail of its cool-down (`v_tail`), DualPipeV's (p-1)(B-W)/2.
While the slowest rank is ahead of the next slowest by a margin (its lead), the others deliver its inputs
early and the stage-boundary sends hide behind it, but for those on the path of the first micro-batch's
forward and the last one's backward (cost/step.py). Against the simulator's replay of torch's orders
(benchmarks/sim_vs_predict.py: llama2-7b, llama3-8b, llama2-70b at tp=8, pp 2-8, m = p..8p) the median gap
is 0.01-0.05% per schedule; GPipe and 1F1B within 0.8% of the step, interleaved within 1.1%, ZB-H1 within
0.5%, ZB-V and DualPipeV within 1.0%.
"""

from meshscale.specs.layout import V_SCHEDULES, Layout


def schedule_bubble(schedule: str, p: int, v: int, m, f=1.0, b=1.0, w=1.0, maximum=max, minimum=min):
    """Bubble over ideal compute for one schedule (the forms above). v, m, f, b, w may be numpy arrays, with
    maximum=np.maximum, minimum=np.minimum (the planner's vectorised bound)."""
    if p == 1:
        return 0.0 * m
    t = f + b + w
    if schedule == "interleaved":
        return (p - 1) / (v * m)
    if schedule == "zb":
        return (p - 1) * (f + b - w) / (m * t)
    if schedule == "zbv":
        warmup = (p - 1) * b / 2 + maximum(0, 2 * p - 1 - m) * (b - w) / 2
        return maximum(warmup, (p - 1) * b - minimum(m - p, p - 1) * w) / (m * t)
    if schedule == "dualpipev":
        return maximum((p - 1) * (f + b - w) / 2, (p - 1) * (b - w / 2) - f / 2) / (m * t)
    return (p - 1) / m


def bubble_ratio(layout: Layout, m: int, slowest=None, others=None, ends=None) -> float:
    """Bubble over the slowest rank's ideal compute; `slowest` and `others` (cost.kernels.Passes: the slowest
    rank's, the other ranks' mean) give F, B, W, else they are taken equal (and `others` defaults to
    `slowest`): the even bubble of the other ranks' passes (see the module docstring). `ends`: the passes of
    the first and last chunks where the slowest rank holds the last one (`head_idle`)."""
    if slowest is None:
        return schedule_bubble(layout.schedule, layout.pp, layout.vpp, m)
    others = others or slowest
    ratio = schedule_bubble(layout.schedule, layout.pp, layout.vpp, m, others.forward, others.backward,
                            others.weight) * others.total / slowest.total
    if ends is None or layout.schedule not in HEAD_IDLE_SCHEDULES:
        return ratio
    # the others' span (their work and bubble) against the slowest rank's work and idle: whichever ends later
    span = ratio + (others.total + head_on_chain(layout.schedule, others, ends[1]) / m) / slowest.total - 1
    return max(head_idle(layout.schedule, layout.pp, m, others, *ends) / (m * slowest.total), span)


def head_on_chain(schedule: str, others, last):
    """ZB-V: the others' chain of input gradients starts with a micro-batch's forward and input gradient on
    the last chunk, rank 0's: what they take beyond an other rank's chunk (half its passes) lengthens their
    span (exact against the simulator at m = p, where that span sets the step). Works on arrays."""
    if schedule != "zbv":
        return 0.0
    return last.forward + last.backward - (others.forward + others.backward) / 2


HEAD_IDLE_SCHEDULES = ("zb",) + V_SCHEDULES


def head_idle(schedule: str, p: int, m, others, first, last, maximum=max):
    """The idle of the slowest rank when it holds the last chunk (the head: the last rank, rank 0 under a V),
    derived from torch's orders as the forms above. ZB-H1: the others' p-1 forwards before its first, and at
    the end the input gradients going down the other p-1 ranks beyond what its p weight gradients (and one of
    theirs) cover; exact against the simulator. ZB-V: rank 0 runs its m first-chunk forwards, then waits while
    micro-batch 0's forward crosses the other 2p-2 chunks (a warm-up that more than 2p-1 micro-batches fill),
    and idles at the end (`v_tail`). DualPipeV: (p-1)(B-W)/2 of the others' passes, whatever m. Against the
    simulator with a heavy head on rank 0: within 0.6% from m >= p (ZB-V) and m >= 2p (DualPipeV) where chunk
    0 costs what the other ranks' chunks cost, up to 5% where it does not. Arrays take maximum=np.maximum."""
    if schedule == "zb":
        return (p - 1) * others.forward + maximum(0.0, (p - 1) * others.backward - p * last.weight + others.weight)
    if schedule == "dualpipev":
        return (p - 1) * (others.backward - others.weight) / 2
    warmup = maximum(0.0, (p - 1) * others.forward - (m - 1) * first.forward)
    return warmup + v_tail(p, others, first, last, maximum)


def v_tail(p: int, others, first, last, maximum=max) -> float:
    """Rank 0's idle at the end of torch's ZB-V when it is the slowest rank: after its last micro-batch's
    input gradient on the last chunk, the gradient travels down the other 2p-2 chunks (the other ranks'
    input gradients) while rank 0 runs that chunk's weight gradient and p-1 pairs of input and weight
    gradients of its first chunk (the order's cool-down; sim/schedule.py). At even ranks it is below the
    closed form above, which then stands. Arrays take maximum=np.maximum (the planner's bound)."""
    return maximum(0.0, (p - 1) * others.backward - last.weight - (p - 1) * (first.backward + first.weight))
