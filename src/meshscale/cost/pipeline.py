"""Pipeline bubbles: idle time as a fraction of the ideal (bubble-free) compute time.

With F, B, W the times of a micro-batch's forward, input-gradient and weight-gradient passes
(F = B = W for a transformer layer, so F : B+W = 1 : 2):
  GPipe, 1F1B  (p-1)/m                    Huang et al. 2019; Narayanan et al. 2021 eq. 1
  interleaved  (p-1)/(v*m)                Narayanan et al. 2021 sec. 2.2.2
  zb (ZB-H1)   (p-1)(F+B-2W)/(3Fm) = (p-1)/(3m)     Qi et al. 2023 (arXiv:2401.10241) sec. 3.1
  zbv (ZB-V)   ZB-H1 on V-placed half-size chunks: (p-1)/(6m)   Qi et al. 2024 (arXiv:2405.15362)
  dualpipev    DualPipe's (PP/2-1)(F&B+B-3W) on 2p half chunks, F&B = F+B: (p-1)/(3m)
               DeepSeek-AI 2024, DeepSeek-V3 report Table 2
"""

from meshscale.specs.layout import Layout


def bubble_ratio(layout: Layout, m: int) -> float:
    p, v = layout.pp, layout.vpp
    if p == 1:
        return 0.0
    if layout.schedule == "interleaved":
        return (p - 1) / (v * m)
    if layout.schedule in ("zb", "dualpipev"):
        return (p - 1) / (3 * m)
    if layout.schedule == "zbv":
        return (p - 1) / (6 * m)
    return (p - 1) / m


def slots(stages: int, microbatches: int) -> tuple[int, int]:
    """GPipe drawn as unit forward and backward slots (the lecture's picture): busy slots and all slots.
    Each stage runs m forwards and m backwards; the step lasts 2(m + p - 1) slots."""
    busy = 2 * stages * microbatches
    return busy, 2 * stages * (microbatches + stages - 1)


def utilisation(stages: int, microbatches: int) -> float:
    busy, total = slots(stages, microbatches)
    return busy / total
