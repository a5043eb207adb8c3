"""Per-step metrics: printed by rank 0 (a rich progress bar on a terminal, plain lines otherwise) and
written as JSONL with --metrics-out; memory as the allocator sees it."""

import ctypes
import json
import os
import sys
from collections import defaultdict
from contextlib import contextmanager
from functools import lru_cache

import torch

from meshscale.cost import predict
from meshscale.runtime.measure.live import run_cluster


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_bytes() -> int:
    """Bytes glibc's malloc has handed out and not taken back (mallinfo2: in-use arena chunks plus mmapped
    blocks). torch's CPU allocator takes every tensor from malloc, so this counts tensors (and the few other
    heap objects of the process), not freed or fragmented pages as RSS does. 0 where glibc is absent."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return 0
    info = mallinfo2()
    return info.uordblks + info.hblkhd


@lru_cache(maxsize=1)
def _mallinfo2():
    try:
        function = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


def memory_bytes(device: torch.device, baseline: int = 0) -> int:
    """This rank's memory: on GPU the allocator's peak; on CPU the heap in use above `baseline` (the heap
    before the model was built). Sampled between steps on CPU, it misses the activations; `MemoryProbe`
    gives the CPU peak inside a step."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return max(0, heap_bytes() - baseline)


class MemoryProbe:
    """The CPU allocator's peak during one step: the heap in use when it starts plus the highest rise of the
    running total of the profiler's memory events (every allocation and free c10's CPU allocator makes, in
    order) during it. A block allocated before the step and freed inside it has no event (its free is not
    seen), so on pipelines, whose receive buffers outlive a step, this is an upper bound. The profiler's own
    buffers live in the heap too, hence the start, not the end, as anchor. The profiled step runs slower,
    so its time is not counted; its stderr is silenced (kineto and c10 log lines about the profiler)."""

    def __init__(self, baseline: int):
        self.baseline, self.peak = baseline, 0

    @contextmanager
    def step(self):
        from torch.profiler import ProfilerActivity, profile

        start = max(0, heap_bytes() - self.baseline)
        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_stderr():
            prof.start()
            try:
                yield
            finally:
                prof.stop()
        events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns())
        level = highest = 0
        for e in events:
            level += e.nbytes()
            highest = max(highest, level)
        self.peak = start + highest


@contextmanager
def _quiet_stderr():
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved), os.close(null)


class MetricsLog:
    """`resume_at`: the run continues one whose file may exist (a resume or restart): keep that file's rows
    of the steps before `resume_at`, then append, so no step appears twice."""

    def __init__(self, steps: int, path: str | None, enabled: bool, overwrite: bool = False, every: int = 1,
                 resume_at: int | None = None):
        self.enabled, self.every, self.steps = enabled, max(1, every), steps
        self.file = None
        if path and enabled:
            if resume_at is not None and os.path.exists(path):
                _keep_rows_before(path, resume_at)
                self.file = open(path, "a")
            else:
                self.file = open(path, "w" if overwrite else "x")
        self.rows: list[dict] = []
        self._progress = None
        if enabled and sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.description}"), TimeElapsedColumn())
            self._task = self._progress.add_task("", total=steps)
            self._progress.start()

    def log(self, row: dict) -> None:
        self.rows.append(row)
        if not self.enabled:
            return
        if self.file:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()
        aux = f"  aux {row['aux_loss']:.4f}" if "aux_loss" in row else ""
        line = (f"step {row['step']:>4}  loss {row['loss']:.4f}{aux}  lr {row['lr']:.2e}"
                f"  grad_norm {row['grad_norm']:.3f}"
                f"  {row['tokens_per_s']:,.0f} tok/s  {row['step_time_s'] * 1e3:.0f} ms"
                f"  mem {row['peak_memory_bytes'] / 2**20:.1f} MiB")
        shown = row["step"] % self.every == 0 or row["step"] == self.steps - 1
        events = [f"anomaly ({a['kind']}): {a['message']}" for a in row.get("anomalies", ())]
        if self._progress:
            self._progress.update(self._task, advance=1, description=f"loss {row['loss']:.4f}")
            for text in [line] * shown + events:
                self._progress.console.print(text, highlight=False)
        else:
            for text in [line] * shown + events:
                print(text, flush=True)

    def close(self) -> None:
        if self._progress:
            self._progress.stop()
        if self.file:
            self.file.close()


def _keep_rows_before(path: str, step: int) -> None:
    with open(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] < step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)


def predicted(run) -> dict:
    """The cost model's prediction for this run (imported only here: --predict)."""

    prediction = predict(run.spec, run_cluster(run.config), run.layout, run.config.global_batch,
                         run.config.precision)
    return prediction.to_dict()


def _ratio(measured: float, predicted_value: float) -> str:
    return f"{measured / predicted_value:.2f}" if predicted_value else "-"


def median_step_time(rows: list[dict]) -> float:
    """Median step time, skipping the first (warm-up) step and a profiled one (`MemoryProbe`)."""
    steady = sorted(r["step_time_s"] for r in rows[1:] if not r.get("memory_probe"))
    return steady[len(steady) // 2] if steady else rows[0]["step_time_s"]


def summary(result: dict, prediction: dict) -> dict:
    """The closed loop as one object (the last line of --metrics-out with --predict)."""

    return {"summary": True, "step_time_s": median_step_time(result["rows"]),
            "predicted_step_time_s": prediction["step_time_s"],
            "peak_memory_bytes": max(result["peak_memory_per_rank"]),
            "predicted_memory_bytes": prediction["memory_per_device_bytes"]["total"],
            "comm": [{k: r[k] for k in ("collective", "axis", "measured_bytes", "predicted_bytes")}
                     for r in compare_comm(result["comm"][-1], prediction["comm"])]}


def report(run, result: dict, prediction: dict | None = None) -> str:
    """The closing summary: loss first and last, validation loss, measured comm of the last step,
    and, given a prediction, bytes per (collective, axis) beside it with memory and time ratios."""

    rows = result["rows"]
    step_time = median_step_time(rows)
    peak = max(result["peak_memory_per_rank"])
    lines = [f"layout {run.layout}  model {run.spec.name}  precision {run.config.precision}",
             f"loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f} over {len(rows)} steps; "
             f"validation loss {result['val_loss']:.4f}",
             f"step time {step_time * 1e3:.1f} ms (median)  peak memory per rank "
             + ", ".join(f"{b / 2**20:.1f}" for b in result["peak_memory_per_rank"]) + " MiB"]
    if "bubble" in result:
        bubble = result["bubble"]
        lines.append(f"pipeline bubble (last step): measured {sum(bubble['measured']) / len(bubble['measured']):.2f} "
                     f"(per pp rank {', '.join(f'{b:.2f}' for b in bubble['measured'])}), predicted "
                     f"{bubble['predicted']:.2f}"
                     + (f"; trace written to {run.config.trace}" if run.config.trace else ""))
    if "ep_imbalance" in result:
        lines.append(f"expert parallelism: ep all_to_all bytes are the EP group's mean; the busiest rank sent "
                     f"{result['ep_imbalance']:.2f}x that (routing imbalance, last step)")
    measured = result["comm"][-1]
    if prediction is None:
        lines.append("communication per step (the rank the cost model describes, last step):")
        lines += [f"  {c['collective']:<15}{c['axis']:<4}{c['bytes']:>14,} B  {c['calls']:>4} calls  "
                  f"{c['time_s'] * 1e3:8.2f} ms" for c in measured] or ["  none (one data-parallel replica)"]
        return "\n".join(lines)
    rows_cmp = compare_comm(measured, prediction["comm"])
    mem = prediction["memory_per_device_bytes"]
    mem_pred = mem.get("total", max(mem.values())) if isinstance(mem, dict) else float(mem)
    lines += ["predicted vs measured communication per step (bytes must agree exactly):",
              format_comparison(rows_cmp),
              "comm bytes: " + ("all agree" if all(r["match"] for r in rows_cmp) else "MISMATCH"),
              f"step time: measured {step_time:.4f} s, predicted {prediction['step_time_s']:.4f} s, "
              f"ratio {_ratio(step_time, prediction['step_time_s'])}",
              f"memory: measured peak {peak / 2**20:.1f} MiB (highest rank; allocator peak), predicted "
              f"{mem_pred / 2**20:.1f} MiB, ratio {_ratio(peak, mem_pred)}"]
    return "\n".join(lines)


def print_report(run, result: dict) -> None:
    prediction = predicted(run) if run.config.predict else None
    print(report(run, result, prediction), flush=True)
    if prediction is not None and run.config.metrics_out:
        with open(run.config.metrics_out, "a") as f:
            f.write(json.dumps(summary(result, prediction)) + "\n")


def compare_comm(measured: list[dict], predicted: list[dict]) -> list[dict]:
    """Join measured and predicted comm entries on (collective, axis). Each row: bytes of both,
    whether they agree exactly, and the time ratio measured/predicted (None where not defined)."""
    def by_key(entries):
        acc: dict = defaultdict(lambda: {"bytes": 0, "time_s": 0.0})
        for e in entries:
            a = acc[(e["collective"], e["axis"])]
            a["bytes"] += int(e["bytes"])
            a["time_s"] += float(e.get("time_s") or 0.0)
        return acc

    m, p = by_key(measured), by_key(predicted)
    rows = []
    for key in sorted(set(m) | set(p)):
        mb, pb = m[key]["bytes"] if key in m else 0, p[key]["bytes"] if key in p else 0
        mt, pt = m[key]["time_s"] if key in m else 0.0, p[key]["time_s"] if key in p else 0.0
        rows.append({"collective": key[0], "axis": key[1], "measured_bytes": mb, "predicted_bytes": pb,
                     "match": mb == pb, "measured_time_s": mt, "predicted_time_s": pt,
                     "time_ratio": mt / pt if pt > 0 else None})
    return rows


def format_comparison(rows: list[dict]) -> str:
    lines = [f"{'collective':<15}{'axis':<5}{'measured B':>14}{'predicted B':>14}  {'':5}"
             f"{'meas. s':>10}{'pred. s':>10}{'ratio':>7}"]
    for r in rows:
        ratio = f"{r['time_ratio']:.2f}" if r["time_ratio"] is not None else "-"
        lines.append(f"{r['collective']:<15}{r['axis']:<5}{r['measured_bytes']:>14,}{r['predicted_bytes']:>14,}  "
                     f"{'ok' if r['match'] else 'DIFF':5}{r['measured_time_s']:>10.4f}{r['predicted_time_s']:>10.4f}"
                     f"{ratio:>7}")
    return "\n".join(lines)
