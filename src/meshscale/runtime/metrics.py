"""Per-step metrics: printed by rank 0 (a rich progress bar on a terminal, plain lines otherwise) and
written as JSONL with --metrics-out."""

import json
import os
import resource
import sys

import torch


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_memory_bytes(device: torch.device, baseline: int = 0) -> int:
    """Peak memory of this rank: the allocator's peak on GPU; on CPU the peak resident set size
    (ru_maxrss, KiB on Linux) above `baseline`, the RSS before the model was built, so the
    interpreter and torch's own libraries are not counted."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline)


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
        line = (f"step {row['step']:>4}  loss {row['loss']:.4f}  lr {row['lr']:.2e}  grad_norm {row['grad_norm']:.3f}"
                f"  {row['tokens_per_s']:,.0f} tok/s  {row['step_time_s'] * 1e3:.0f} ms"
                f"  peak {row['peak_memory_bytes'] / 2**20:.1f} MiB")
        shown = row["step"] % self.every == 0 or row["step"] == self.steps - 1
        if self._progress:
            self._progress.update(self._task, advance=1, description=f"loss {row['loss']:.4f}")
            if shown:
                self._progress.console.print(line, highlight=False)
        elif shown:
            print(line, flush=True)

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
    from meshscale.cost import predict
    from meshscale.specs.cluster import load_cluster

    prediction = predict(run.spec, load_cluster("local-cpu"), run.layout, run.config.global_batch,
                         run.config.precision)
    return prediction.to_dict()


def _ratio(measured: float, predicted_value: float) -> str:
    return f"{measured / predicted_value:.2f}" if predicted_value else "-"


def report(run, result: dict, prediction: dict | None = None) -> str:
    """The closing summary: loss first and last, validation loss, measured comm of the last step,
    and, given a prediction, bytes per (collective, axis) beside it with memory and time ratios."""
    from meshscale.runtime.ledger import compare_comm, format_comparison

    rows = result["rows"]
    steady = sorted(r["step_time_s"] for r in rows[1:]) or [rows[0]["step_time_s"]]
    step_time = steady[len(steady) // 2]  # median, skipping the first (warm-up) step
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
                     f"{bubble['predicted']:.2f}" + (f"; trace written to {run.config.trace}" if run.config.trace else ""))
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
              f"memory: measured peak {peak / 2**20:.1f} MiB (highest rank; on CPU: RSS growth), predicted "
              f"{mem_pred / 2**20:.1f} MiB, ratio {_ratio(peak, mem_pred)}"]
    return "\n".join(lines)


def print_report(run, result: dict) -> None:
    print(report(run, result, predicted(run) if run.config.predict else None), flush=True)
