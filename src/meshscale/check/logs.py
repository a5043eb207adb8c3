"""Step lines of a running job's log, as torchtitan and Megatron-LM print them.

torchtitan (components/metrics.py, MetricsProcessor.log), one line every metrics.log_freq steps:
    step: 10  loss:  7.12345  grad_norm:  1.2345  memory: 61.23GiB(77.45%)  tps: 1,234  tflops: 345.67  mfu: 34.95%
tps: tokens per second per device; memory: the peak reserved by the caching allocator.
Megatron-LM (training/training.py, training_log), one line every --log-interval iterations:
     [2025-01-01 00:00:00.000000] iteration       10/    1000 | consumed samples:  ... | elapsed time per
     iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 345.6 | learning rate: ... |
     global batch size: 512 | ...
and, from report_memory, `[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: 61234.56 | ...`.
Either, under NCCL_DEBUG=INFO (or VERSION), carries NCCL's banner: `NCCL INFO NCCL version 2.21.5+cuda12.4`.
"""

import re
from dataclasses import dataclass
from statistics import median

from meshscale.errors import UserError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torchtitan colours its step lines
_TITAN = re.compile(r"step:\s*(\d+)\s+loss:.*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+)\s+tflops:\s*([\d,.]+)"
                    r"\s+mfu:\s*([\d.]+)%")
_MEGATRON = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)")
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
_MEGATRON_MEMORY = re.compile(r"memory \(MB\).*?max allocated:\s*([\d.]+)")
_NCCL = re.compile(r"\bNCCL version (\d+)\.(\d+)\.\d+")
GiB, MiB = 2**30, 2**20


@dataclass(frozen=True)
class Measured:
    framework: str
    steps: int  # step lines read (the first, which carries start-up, left out when there are more)
    step_time_s: float  # median
    tokens_per_s_per_device: float
    tflops_per_device: float | None
    memory_bytes: float | None  # peak per device


def detect(text: str) -> str:
    text = _ANSI.sub("", text)
    if _TITAN.search(text):
        return "torchtitan"
    if _MEGATRON.search(text):
        return "megatron"
    raise UserError("the log has no torchtitan step lines ('step: N  loss: ...  tps: ...') nor Megatron-LM "
                    "ones ('iteration N/M | ... elapsed time per iteration (ms): ...'); pass the training log")


def nccl_release(text: str) -> str:
    """The NCCL release ("major.minor") the log's banner names, "" where it prints none."""
    found = _NCCL.search(text)
    return f"{found[1]}.{found[2]}" if found else ""


def read_log(text: str, framework: str, tokens_per_step: int, devices: int) -> Measured:
    """The median of the log's step lines; step time and tokens/s derived from each other where the
    framework prints only one (torchtitan's tps counts tokens per second per device)."""
    text = _ANSI.sub("", text)
    if framework == "torchtitan":
        rows = [m.groups() for m in _TITAN.finditer(text)]
        if not rows:
            raise UserError("the log has no torchtitan step lines ('step: N  loss: ...  tps: ...')")
        rows = rows[1:] if len(rows) > 1 else rows
        tps = median(float(r[2].replace(",", "")) for r in rows)
        return Measured(framework, len(rows), tokens_per_step / (tps * devices), tps,
                        median(float(r[3].replace(",", "")) for r in rows), max(float(r[1]) for r in rows) * GiB)
    lines = [line for line in text.splitlines() if _MEGATRON.search(line)]
    if not lines:
        raise UserError("the log has no Megatron-LM iteration lines ('iteration N/M | ... elapsed time per "
                        "iteration (ms): ...')")
    lines = lines[1:] if len(lines) > 1 else lines
    step = median(float(m.group(2)) for line in lines if (m := _MEGATRON.search(line))) / 1e3
    tflops = [float(m.group(1)) for line in lines if (m := _MEGATRON_TFLOPS.search(line))]
    memory = [float(m.group(1)) for m in _MEGATRON_MEMORY.finditer(text)]
    return Measured(framework, len(lines), step, tokens_per_step / step / devices,
                    median(tflops) if tflops else None, max(memory) * MiB if memory else None)
