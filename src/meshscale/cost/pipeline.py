"""Pipeline bubbles: idle time as a fraction of the ideal (bubble-free) compute time.

With F, B, W the times of a micro-batch's forward, input-gradient and weight-gradient passes on a rank
(T = F + B + W; a full backward is B + W), p ranks, m micro-batches and v chunks per rank, for the orders
torch.distributed.pipelining runs (cost/schedule.py rebuilds them; tests/test_simulate.py checks them against
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

Uneven ranks (the output head, layers not divisible by the chunks, dense layers before MoE ones): predict
takes the longest path through torch's order with each chunk's own passes (`makespan`, `bubble_ratio`), the
time sim/engine.py replays, over the busiest rank's passes. The forms above approximated it from the other
ranks' mean passes, and missed most where chunks differ within a rank: under DualPipeV, DeepSeek-V3's rank 0
holds a light first chunk and a heavy last one (the head and the MTP module) and idles at both ends, 1.0 s of a
6.2 s step on 2,048 H200 where the forms gave 0.26 s; interleaved chunks of 1 and 2 layers, up to 20% of
the step. The planner's bound (cost/bound.py) keeps the forms for the zero-bubble schedules, and for the others
a path no order of these chunks undercuts.
"""

from array import array
from functools import lru_cache

from meshscale.cost.schedule import KINDS, pass_seconds, rank_orders
from meshscale.specs.layout import Layout
from meshscale.specs.placement import stage_owner


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


def bubble_ratio(layout: Layout, m: int, chunks=None) -> float:
    """Bubble over the busiest rank's ideal compute: of torch's order with each chunk's passes `chunks`
    (`makespan`; cost.kernels.Passes, one per stage), else the even form above with F = B = W."""
    if chunks is None or layout.pp == 1:
        return schedule_bubble(layout.schedule, layout.pp, layout.vpp, m)
    work = [0.0] * layout.pp
    for stage, c in enumerate(chunks):
        work[stage_owner(stage, layout.pp, layout.v_shaped)] += c.total
    return makespan(layout.schedule, layout.pp, layout.vpp, m, chunks) / (m * max(work)) - 1


def head_on_chain(schedule: str, others, last):
    """ZB-V: the others' chain of input gradients starts with a micro-batch's forward and input gradient on
    the last chunk, rank 0's: what they take beyond an other rank's chunk (half its passes) lengthens their
    span (where rank 0 is the slowest; cost/bound.py). Works on arrays."""
    if schedule != "zbv":
        return 0.0
    return last.forward + last.backward - (others.forward + others.backward) / 2


def v_tail(p: int, others, first, last, maximum=max) -> float:
    """Rank 0's idle at the end of torch's ZB-V when it is the slowest rank: after its last micro-batch's
    input gradient on the last chunk, the gradient travels down the other 2p-2 chunks (the other ranks'
    input gradients) while rank 0 runs that chunk's weight gradient and p-1 pairs of input and weight
    gradients of its first chunk (the order's cool-down; cost/schedule.py). At even ranks it is below the
    closed form above, which then stands. Arrays take maximum=np.maximum (the planner's bound)."""
    return maximum(0.0, (p - 1) * others.backward - last.weight - (p - 1) * (first.backward + first.weight))


def steady(schedule: str) -> int:
    """Micro-batches per rank after which each p more add what the p before them did (`makespan`), the least
    that keeps the extension exact against the engine for chunks 30x apart (tests/test_simulate.py): GPipe and
    1F1B are flow shops of identical jobs, linear in m once each rank's warm-up is past; the interleaved queues
    settle within 4 rounds and the zero-bubble ones, whose W passes fill in around the others, within 8."""
    return {"gpipe": 2, "1f1b": 2, "interleaved": 4}.get(schedule, 8)


@lru_cache(maxsize=128)
def _order_graph(schedule: str, p: int, v: int, m: int) -> tuple[array, array, array, array]:
    """torch's orders (cost/schedule.py) as a graph in topological order, four arrays over the passes: its
    weight's index (stage * 4 + KINDS index) and the passes it waits for (the one before it on its rank, those
    making its inputs as cost/schedule.py `inputs` says; -1 for none)."""
    orders = rank_orders(schedule, p, v, m)
    size = p * v * m  # outputs: activations at [stage * m + mb], input gradients after them, weight gradients
    made = [-1] * (2 * size)  # the pass making each, -1 until it is placed (weight gradients feed nothing)
    graph, n = (array("i"), array("i"), array("i"), array("i")), 0
    weight, after, first, second = (column.append for column in graph)
    kind_index = {k: i for i, k in enumerate(KINDS)}
    previous = [-1] * p
    queues = [iter(order) for order in orders]
    heads = [next(queue, None) for queue in queues]  # each rank's next pass, None once it has run them all
    total = sum(len(o) for o in orders)
    while n < total:
        before = n
        for r, queue in enumerate(queues):
            head = heads[r]
            while head is not None:
                stage, kind, mb = head
                at_stage = stage * m + mb
                if kind == "F":
                    a, b = (made[at_stage - m] if stage else n), n
                elif kind == "W":
                    a, b = made[size + at_stage], n
                else:  # I or B: this stage's forward, the next stage's input gradient (none from the last)
                    a = made[at_stage]
                    b = made[size + at_stage + m] if at_stage + m < size else n
                if a < 0 or b < 0:
                    break
                weight(stage * 4 + kind_index[kind])
                after(previous[r])
                first(-1 if a == n else a)
                second(-1 if b == n else b)
                previous[r] = n
                if kind != "W":
                    made[at_stage + (size if kind != "F" else 0)] = n
                n += 1
                head = next(queue, None)
            heads[r] = head
        if n == before:
            raise ValueError(f"{schedule} with pp={p}, vpp={v}, {m} micro-batches deadlocks: an order waits on a "
                             "pass that never runs")
    return graph


def makespan(schedule: str, p: int, v: int, m: int, chunks) -> float:
    """How long torch's order of `schedule` takes with each chunk's passes `chunks` (per stage, an object with
    .forward, .backward, .weight: cost.kernels.Passes), sends free: the longest path through its passes, each
    starting when its rank is free and its inputs are made (what sim/engine.py replays event by event). Exact
    where the forms above approximate: uneven chunks, under the interleaved and V schedules above all. Beyond
    2 x `steady(schedule)` micro-batches per rank the pipeline is in its steady state, every p more micro-batches
    adding what the p before them did, so the path is taken at m less a multiple of p and extended: against the
    engine with chunks up to 10x apart, exact but for the interleaved schedule (within 0.5%;
    tests/test_simulate.py)."""
    s = steady(schedule)
    if m > 2 * s * p:  # the steady state: each p further micro-batches add what the last p added
        ref = m - p * ((m - s * p) // p)
        at, beyond = makespan(schedule, p, v, ref, chunks), makespan(schedule, p, v, ref + p, chunks)
        return at + (beyond - at) * (m - ref) / p
    return _longest_path(schedule, p, v, m, tuple(pass_seconds(c, kind) for c in chunks for kind in KINDS))


@lru_cache(maxsize=4096)
def _longest_path(schedule: str, p: int, v: int, m: int, weights: tuple) -> float:
    """`makespan` over `_order_graph`, per pass its weight (layouts that differ in their data-parallel traffic
    alone ask again)."""
    graph = _order_graph(schedule, p, v, m)
    end = [0.0] * (len(graph[0]) + 1)  # end[-1] = 0.0: "waits for nothing"
    i = 0
    for k, a, b, c in zip(*graph):  # the hottest loop of a search: max() and enumerate() cost twice this
        t = end[a]
        if end[b] > t:
            t = end[b]
        if end[c] > t:
            t = end[c]
        end[i] = weights[k] + t
        i += 1
    return max(end)
