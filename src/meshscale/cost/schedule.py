"""The order in which each pipeline rank runs its passes, torch-free, for every schedule the runtime uses.

Each rank's order is a list of actions (stage, kind, micro-batch) with kind one of
  F  forward;  B  full backward (input and weight gradients together);
  I  input-gradient backward;  W  weight-gradient backward (zero-bubble schedules split B into I and W).
These are the orders of torch.distributed.pipelining's schedules (parallel/pipeline.py SCHEDULE_CLASSES:
ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble for "zb",
ScheduleZBVZeroBubble, ScheduleDualPipeV) without their idle slots, which a simulator does not need: it
waits on data, not slots. tests/test_simulate.py checks them against torch's own `pipeline_order`.
"""

from collections import defaultdict
from functools import lru_cache


@lru_cache(maxsize=256)
def rank_orders(schedule: str, pp: int, vpp: int, m: int) -> tuple:
    """One tuple of (stage, kind, micro-batch) per pipeline rank."""
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved": _interleaved, "zb": _interleaved,
             "zbv": _zbv, "dualpipev": _dualpipev}[schedule]
    return tuple(tuple(build(schedule, pp, vpp, m, r)) for r in range(pp))


def _gpipe(schedule, pp, vpp, m, rank):
    return [(rank, "F", i) for i in range(m)] + [(rank, "B", i) for i in range(m)]


def _one_f_one_b(schedule, pp, vpp, m, rank):
    """Warm up with pp-1-rank forwards, then one forward and one backward each, then drain the backwards."""
    warmup = min(pp - 1 - rank, m)
    out = [(rank, "F", i) for i in range(warmup)]
    for i in range(warmup, m):
        out += [(rank, "F", i), (rank, "B", i - warmup)]
    return out + [(rank, "B", i) for i in range(m - warmup, m)]


def _interleaved(schedule, pp, vpp, m, rank):
    """Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2) in torch's rounds of m/rounds micro-batches, depth
    first; with schedule "zb" torch's ZB-H1 variant (Qi et al. 2023): backward split into I and W, a shorter
    warm-up, and each W deferred until `rank` 1F1B steps have passed (then drained at the end)."""
    zero_bubble = schedule == "zb"
    rounds = max(1, m // pp)
    per_round = m // rounds
    warmup = min((vpp - 1) * per_round + (1 if zero_bubble else 2) * (pp - 1 - rank), m * vpp)
    total = m * vpp
    fwd_stage = lambda step: ((step // per_round) % vpp) * pp + rank  # noqa: E731
    bwd_stage = lambda step: (vpp - 1 - ((step - warmup) // per_round) % vpp) * pp + rank  # noqa: E731
    counts = {k: defaultdict(int) for k in "FBW"}
    backward_steps, weights_done = [], 0
    out = []

    def take(kind, stage):
        mb = counts[kind][stage]
        counts[kind][stage] += 1
        out.append((stage, kind, mb))

    def weight():
        nonlocal weights_done
        take("W", bwd_stage(backward_steps[weights_done]))
        weights_done += 1

    for step in range(total + warmup):  # warm-up forwards, 1F1B steps, cool-down backwards
        if step < total:
            take("F", fwd_stage(step))
        if step >= warmup:
            stage = bwd_stage(step)
            mb = counts["B"][stage]
            counts["B"][stage] += 1
            out.append((stage, "I" if zero_bubble else "B", mb))
            backward_steps.append(step)
            if zero_bubble and step - warmup >= rank:
                weight()
    while zero_bubble and weights_done < len(backward_steps):
        weight()
    return out


def _zbv(schedule, pp, vpp, m, rank):
    """ZB-V (Qi et al. 2023, sec. 6) as torch builds it: chunk 0 descends, chunk 1 climbs back; it plans
    max(m, 2pp-1) micro-batches and drops those beyond m."""
    n = max(2 * pp - 1, m)
    c0, c1 = rank, 2 * pp - 1 - rank
    f0 = f1 = b0 = b1 = 0
    out = []
    for _ in range(2 * (pp - rank) - 1):
        out.append((c0, "F", f0)); f0 += 1  # noqa: E702
    for _ in range(rank):
        out += [(c1, "F", f1), (c0, "F", f0)]; f1 += 1; f0 += 1  # noqa: E702
    for _ in range(pp - rank):
        out += [(c1, "F", f1), (c1, "I", b1), (c1, "W", b1)]; f1 += 1; b1 += 1  # noqa: E702
    while f1 < f0 or f0 < n:
        if f0 < n:
            out.append((c0, "F", f0)); f0 += 1  # noqa: E702
        out += [(c0, "I", b0), (c0, "W", b0), (c1, "F", f1), (c1, "I", b1), (c1, "W", b1)]
        b0 += 1; f1 += 1; b1 += 1  # noqa: E702
    w0, w1 = b0, b1
    for _ in range(rank):
        out += [(c0, "I", b0), (c1, "I", b1)]; b0 += 1; b1 += 1  # noqa: E702
    for _ in range(pp - rank):
        out += [(c0, "I", b0), (c0, "W", w0)]; b0 += 1; w0 += 1  # noqa: E702
    out += [(c1, "W", i) for i in range(w1, b1)] + [(c0, "W", i) for i in range(w0, b0)]
    return [a for a in out if a[2] < m]


def _dualpipev(schedule, pp, vpp, m, rank):
    """DualPipeV (DeepSeek-AI 2024, DeepSeek-V3 report sec. 3.2.1) as torch builds it. Its overlapped
    forward+backward pairs are listed as the forward, then the full backward."""
    c0, c1 = rank, 2 * pp - 1 - rank
    nxt = defaultdict(int)  # (stage, "F" | "I" | "W") -> next micro-batch
    weights = []  # (stage, micro-batch) with I done and W pending
    out = []

    def act(stage, kind):
        key = (stage, "I" if kind == "B" else kind)
        mb = nxt[key]
        out.append((stage, kind, mb))
        if kind == "B":  # a full backward also accounts for its weight gradient
            nxt[(stage, "I")] += 1
            nxt[(stage, "W")] += 1
        else:
            nxt[key] += 1
            if kind == "I":
                weights.append((stage, mb))

    def pending_weight():
        if weights:
            stage, mb = weights.pop(0)
            out.append((stage, "W", mb))
            nxt[(stage, "W")] += 1

    for _ in range(2 * (pp - rank - 1)):
        act(c0, "F")
    for _ in range(rank + 1):
        act(c0, "F"), act(c1, "F")
    for _ in range(pp - rank - 1):
        act(c1, "I"), pending_weight(), act(c1, "F")
    for i in range(m - 2 * pp + rank + 1):
        act(c0, "F"), act(c1, "B")  # the first on the last rank is not overlapped; same order either way
        act(c1, "F"), act(c0, "B")
    for _ in range(pp - rank - 1):
        act(c1, "B"), act(c1, "F"), act(c0, "B")
    zb = False
    for i in range(rank + 1):
        zb = zb or (i == (rank + 1) // 2 and rank % 2 == 1)
        act(c1, "I" if zb else "B")
        zb = zb or (i == (rank + 1) // 2 and rank % 2 == 0)
        act(c0, "I" if zb else "B")
    for _ in range(pp - rank - 1):
        pending_weight()
        act(c0, "I" if zb else "B")
    for _ in range(rank + 1):
        pending_weight()
    return out


KINDS = ("F", "B", "I", "W")


def pass_seconds(passes, kind: str) -> float:
    """How long a pass of `kind` takes on a chunk whose micro-batch's passes are `passes` (cost.kernels.Passes):
    a full backward B runs the input and the weight gradient together."""
    return {"F": passes.forward, "B": passes.backward + passes.weight, "I": passes.backward,
            "W": passes.weight}[kind]


def output(stage: int, kind: str, mb: int) -> tuple:
    """What a pass makes ready: "F" its activations, "G" the input gradient (from I or a full B), "W"."""
    return ("F" if kind == "F" else "G" if kind in "BI" else "W", stage, mb)


def inputs(stage: int, kind: str, mb: int, last: int) -> tuple:
    """The outputs a pass needs: a forward of chunk s the forward of s-1 (same micro-batch), an input gradient
    (I, or a full B) the forward of s and the input gradient of s+1, a weight gradient W the I of its chunk;
    `last` is the last chunk's index."""
    if kind == "F":
        return (("F", stage - 1, mb),) if stage > 0 else ()
    if kind == "W":
        return (("G", stage, mb),)
    return (("F", stage, mb),) + ((("G", stage + 1, mb),) if stage < last else ())
