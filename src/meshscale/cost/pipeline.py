"""Pipeline bubbles: idle time as a fraction of the ideal (bubble-free) compute time.

With F, B, W the times of a micro-batch's forward, input-gradient and weight-gradient passes on a rank
(T = F + B + W), p ranks, m micro-batches and v chunks per rank, for the orders torch.distributed.pipelining
runs (sim/schedule.py rebuilds them; tests/test_simulate.py checks them against torch's and these forms
against the simulated idle time):
  GPipe, 1F1B  (p-1)/m                    Huang et al. 2019; Narayanan et al. 2021 eq. 1
  interleaved  (p-1)/(v*m)                Narayanan et al. 2021 sec. 2.2.2
  zb (ZB-H1)   (p-1)(F+B-W)/(m*T), (p-1)/(3m) at F = B = W     Qi et al. 2024 (ICLR, arXiv:2401.10241)
               sec. 3.1; exact for torch's order at m >= p
  zbv (ZB-V)   max(p-1, 2(2p-1-m))/(6m) at F = B = W, m >= p: Qi et al. 2024 sec. 6 give (p-1)/(6m) (V-placed
               half-size chunks); with fewer than (3p-1)/2 micro-batches torch's order cannot fill the warm-up
               and idles up to twice that at m = p (derived from torch's order, see tests/test_simulate.py)
  dualpipev    as ZB-V (m >= 2p, so (p-1)/(6m)): torch's DualPipeV order runs each overlapped F&B pair one
               pass after the other, so it idles as ZB-V does (derived from torch's order, see
               tests/test_simulate.py; DeepSeek-V3 report Table 2's (p/2-1)(F&B+B-3W) assumes the pair truly
               overlaps its communication, which a single stream cannot show)
"""

from meshscale.specs.layout import Layout


def bubble_ratio(layout: Layout, m: int, passes=None) -> float:
    """Bubble over ideal compute; `passes` (cost.kernels.Passes of the slowest rank) sharpens ZB-H1, whose
    bubble depends on F, B, W; the others are taken at F = B = W."""
    p, v = layout.pp, layout.vpp
    if p == 1:
        return 0.0
    if layout.schedule == "interleaved":
        return (p - 1) / (v * m)
    if layout.schedule == "zb":
        share = (passes.forward + passes.backward - passes.weight) / passes.total if passes else 1 / 3
        return (p - 1) * share / m
    if layout.schedule in ("zbv", "dualpipev"):
        return max(p - 1, 2 * (2 * p - 1 - m)) / (6 * m)
    return (p - 1) / m


def slots(stages: int, microbatches: int) -> tuple[int, int]:
    """GPipe drawn as unit forward and backward slots (the lecture's picture): busy slots and all slots.
    Each stage runs m forwards and m backwards; the step lasts 2(m + p - 1) slots."""
    busy = 2 * stages * microbatches
    return busy, 2 * stages * (microbatches + stages - 1)


def utilisation(stages: int, microbatches: int) -> float:
    busy, total = slots(stages, microbatches)
    return busy / total
