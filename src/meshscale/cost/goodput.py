"""Goodput under failures: checkpoint cost, the optimal checkpoint interval, and the expected fraction of
wall time that trains (effective training time ratio, ETTR).

With N devices of per-device MTBF H, the job fails every M = H / N on average (independent failures).
A checkpoint of the per-device shard takes delta = bytes / bandwidth (every device writes its own shard
at once, as DCP does). Between checkpoints the job trains for tau:
  Young 1974 ("A first order approximation to the optimum checkpoint interval", CACM 17(9)):
      tau = sqrt(2 delta M)
  Daly 2006 ("A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3),
  eq. 37), used here:
      tau = sqrt(2 delta M) (1 + sqrt(delta / (2M)) / 3 + delta / (18 M)) - delta   for delta < 2M, else M
A failure costs the restart R and the work since the last checkpoint:
- R = detection + relaunch + load + warm-up: the launcher noticing the failure and starting the processes
  again (rescheduling, process start, rendezvous), reading the checkpoint back, and the first steps' excess
  over a steady step; given or measured (benchmarks/goodput_soak.py measures each part);
- the lost work, with failures uniform in time over a segment tau + delta: on average half a segment (Daly
  2006, sec. 3). With an asynchronous save the step only waits for the copy to host memory (delta is that
  copy plus what the background write takes from the steps it overlaps), but the checkpoint counts only once
  its write, W long, has committed: a failure within W of the save goes back one more segment, so the
  expected loss is (1/S) (int_0^W (S + t) dt + int_W^S t dt) = S / 2 + W with S = tau + delta, W <= S.
ETTR, the useful fraction of wall time (Kokolis et al. 2024, "Revisiting Reliability in Large-Scale
Machine Learning Research Clusters", arXiv:2410.21680, sec. V), to first order in 1/M:
      ETTR = tau / (tau + delta) * (1 - (R + lost) / M)
That form over-counts when R or S is not small beside M (a failure that lands in a restart costs the part
of the restart done, not R plus half a segment), so ettr() uses Daly 2006's complete model for failures
that are a Poisson process in wall time (restarts fail too; sec. 3): a segment takes on average
      M e^(R/M) (e^(S/M) - 1)
of wall time, plus, with an asynchronous save, S e^(S/M) (1 - e^(-W/M)): the e^(S/M) - 1 failures per
segment each go back one more segment with probability (1 - e^(-W/M)) / (1 - e^(-S/M)). Both expand to the
first-order form above.
"""

import math
from dataclasses import asdict, dataclass

from meshscale.errors import UserError

# Llama 3 (Dubey et al. 2024, sec. 3.3.1): Tectonic sustains 2 TB/s (7 TB/s peak) for 16,384 GPUs'
# checkpoints, about 122 MB/s per GPU.
DEFAULT_CHECKPOINT_BANDWIDTH = 2e12 / 16384
# Re-launching a large job: rescheduling, process start, NCCL initialisation. Kokolis et al. 2024 model
# a restart overhead of the order of minutes at thousands of GPUs; we take 5 minutes.
RELAUNCH_S = 300.0
# Llama 3 (Dubey et al. 2024, Table 5): 419 unexpected interruptions in 54 days on 16,384 GPUs, a job
# MTBF of 3.1 hours, i.e. about 50,700 hours per device.
LLAMA3_MTBF_HOURS = 54 * 24 * 16384 / 419


@dataclass(frozen=True)
class Goodput:
    checkpoint_bytes_per_device: float
    checkpoint_bytes_total: float
    save_s: float
    interval_s: float
    restart_s: float
    ettr: float

    def to_dict(self) -> dict:
        return asdict(self)


def check_inputs(mtbf_hours: float, bandwidth: float, restart_s: float | None = None) -> None:
    if not 0 < mtbf_hours < math.inf:
        raise UserError(f"--mtbf-hours must be a positive number of hours, got {mtbf_hours}")
    if not 0 < bandwidth < math.inf:
        raise UserError(f"--checkpoint-bandwidth must be a positive number of bytes/s per device, got {bandwidth}")
    check_restart(restart_s)


def check_restart(restart_s: float | None) -> None:
    if restart_s is not None and not 0 <= restart_s < math.inf:
        raise UserError(f"--restart-seconds must be zero or more seconds (from a failure to training again, the "
                        f"load included), got {restart_s}")


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly 2006, eq. 37: the compute time between checkpoints that minimises the expected wall time."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def goodput(bytes_per_device: float, bytes_total: float, devices: int, mtbf_hours: float,
            bandwidth: float = DEFAULT_CHECKPOINT_BANDWIDTH, restart_s: float | None = None) -> Goodput:
    """Checkpoint cost and ETTR of a job of `devices` devices writing `bytes_per_device` each, saving
    synchronously. `restart_s`: the restart's time, when known; by default RELAUNCH_S plus the load, which
    reads back what the save wrote (no warm-up: at scale it is small beside the relaunch)."""
    check_inputs(mtbf_hours, bandwidth, restart_s)
    mtbf_s = mtbf_hours * 3600 / devices
    save = bytes_per_device / bandwidth
    interval = daly_interval(save, mtbf_s)
    restart = RELAUNCH_S + save if restart_s is None else restart_s
    return Goodput(bytes_per_device, bytes_total, save, interval, restart, ettr(interval, save, restart, mtbf_s))


def expected_lost_work(interval_s: float, save_s: float, write_s: float = 0.0) -> float:
    """The wall time of the work a failure throws away, on average (module docstring): half a segment, plus
    the asynchronous write's time (a failure during it goes back one more segment)."""
    segment = interval_s + save_s
    return segment / 2 + min(write_s, segment)


def ettr(interval_s: float, save_s: float, restart_s: float, mtbf_s: float, write_s: float = 0.0) -> float:
    """Useful fraction of wall time (Daly 2006's complete model, module docstring): interval_s of training per
    segment of interval_s + save_s, failures at mean mtbf_s of wall time, each costing the restart and the
    lost work. write_s: an asynchronous save's write, after the step stopped waiting (0: synchronous saves)."""
    segment, m = interval_s + save_s, mtbf_s
    if (restart_s + segment) / m > 700:  # e^x overflows: no segment ever completes
        return 0.0
    wall = m * math.exp(restart_s / m) * math.expm1(segment / m) - segment * math.exp(segment / m) * math.expm1(
        -min(write_s, segment) / m)
    return interval_s / wall


def of_prediction(pred, mtbf_hours: float, bandwidth: float = DEFAULT_CHECKPOINT_BANDWIDTH,
                  restart_s: float | None = None) -> Goodput:
    return goodput(pred.checkpoint_bytes_per_device, pred.checkpoint_bytes_total, pred.devices, mtbf_hours,
                   bandwidth, restart_s)
