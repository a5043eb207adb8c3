"""The rows of one nccl-tests (or rccl-tests) run, as its *_perf binaries print them, to hold the collective
model against (`meshscale collectives --measured`).

After a header of `#` lines, among them one per rank (`#  Rank  0 Group  0 Pid 653 on node-1 device  0
[0000:06:00] NVIDIA H100 80GB HBM3`) and, in newer releases, `# Collective test starting: alltoall_perf`,
the run prints one line a message size, out-of-place figures then in-place ones:
         size     count   type  redop  root   time  algbw  busbw  #wrong   time  algbw  busbw  #wrong
Older releases print no root column (NVIDIA/nccl-tests#100, 2021). We read the out-of-place bus bandwidth, and
from the header's `# nThread 1 nGpus 8 ...` how many GPUs each process drove (`-t` threads x `-g` GPUs a thread)
and, where newer releases print it (`# nccl-tests version 2.17.9 nccl-headers=22602 nccl-library=22602`), the
NCCL release it ran (NCCL_VERSION_CODE: major x 10000 + minor x 100 + patch).
"""

import re
from dataclasses import dataclass

from meshscale.errors import UserError

_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+?)_perf\b", re.M)
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s", re.M)
_THREADS_GPUS = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)", re.M)
_LIBRARY = re.compile(r"\bnccl-library=(\d{5,})\b")
# the binaries' names for the collectives the cost model has
COLLECTIVES = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
               "alltoall": "all_to_all"}


@dataclass(frozen=True)
class Run:
    collective: str | None  # ours (all_to_all for alltoall_perf); None where the log does not say
    ranks: int | None  # from its rank lines; None where it prints none
    points: tuple  # ((bytes, out-of-place busbw GB/s), ...) in the order printed
    gpus_per_process: int = 1  # nThread x nGpus of its header (1 where it prints none)
    nccl: str = ""  # the NCCL release it ran, "major.minor" ("" where the header does not say)


def parse(text: str, name: str) -> Run:
    """The run in `text` (the file `name`, for messages)."""
    tests = _STARTING.findall(text)
    if len(tests) > 1:
        raise UserError(f"{name} holds {len(tests)} nccl-tests runs ({', '.join(tests)}); save each run's output "
                        "to its own file")
    if tests and tests[0] not in COLLECTIVES:
        raise UserError(f"{name} is a {tests[0]}_perf run; the model has "
                        f"{', '.join(n + '_perf' for n in COLLECTIVES)}")
    ranks = [int(r) for r in _RANK.findall(text)]
    if len(set(ranks)) < len(ranks):
        raise UserError(f"{name} names the same rank more than once: each process ran alone (build nccl-tests "
                        "with MPI=1 and launch it with mpirun or srun)")
    points = tuple(p for line in text.splitlines() if (p := _point(line)))
    if not points:
        raise UserError(f"{name}: no nccl-tests result lines (size, count, type, redop, time, algbw, busbw, ...) "
                        "found; give the stdout of an all_reduce_perf, all_gather_perf, reduce_scatter_perf or "
                        "alltoall_perf run")
    per_process = _THREADS_GPUS.search(text)
    library = _LIBRARY.search(text)
    return Run(COLLECTIVES[tests[0]] if tests else None, max(ranks) + 1 if ranks else None, points,
               int(per_process[1]) * int(per_process[2]) if per_process else 1,
               f"{int(library[1]) // 10000}.{int(library[1]) // 100 % 100}" if library else "")


def _point(line: str) -> tuple[int, float] | None:
    """(bytes, out-of-place busbw) of a result line, None for anything else (headers, warnings, summaries)."""
    cols = line.split()
    if len(cols) not in (12, 13) or not (cols[0].isdigit() and cols[1].isdigit()):
        return None
    try:
        busbw = float(cols[-6])
    except ValueError:
        return None
    return (int(cols[0]), busbw) if int(cols[0]) > 0 and busbw > 0 else None
