"""Critical batch sizes: the per-device batch (tokens) below which a strategy is communication-bound.

The rooflines of the scaling book ("How to Scale Your Model", Part 5, Austin et al. 2025), with C the
device's peak FLOP/s and W the bandwidth of the group the strategy communicates over:
  DP and FSDP      B/N > C / W                (W grows with the torus axes the group spans: M_X * W_ici)
  FSDP + TP        B/N > C^2 / (2 F W_X W_Y)  (= alpha^2 / (2 M_X M_Y F) with alpha = C / W_ici)
  optimal FSDP     X_opt = sqrt(B N W_X / (F W_Y))
  TP               Y < F W_Y / C              (the largest TP degree that stays compute-bound)
"""

import math


def dp_critical(peak: float, bandwidth: float) -> float:
    return peak / bandwidth


def fsdp_tp_critical(peak: float, ffn: int, bw_fsdp: float, bw_tp: float) -> float:
    return peak ** 2 / (2 * ffn * bw_fsdp * bw_tp)


def optimal_fsdp(batch_tokens: float, devices: int, ffn: int, bw_fsdp: float, bw_tp: float) -> float:
    return math.sqrt(batch_tokens * devices * bw_fsdp / (ffn * bw_tp))


def max_tp(peak: float, ffn: int, bw_tp: float) -> float:
    return ffn * bw_tp / peak
