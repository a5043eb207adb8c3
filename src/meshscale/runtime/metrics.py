"""Per-step metrics: printed by rank 0 (a rich progress bar on a terminal, plain lines otherwise) and
written as JSONL with --metrics-out."""

import json
import resource
import sys

import torch


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this rank: allocator peak on GPU; peak resident set size on CPU (ru_maxrss, KiB
    on Linux), which includes the interpreter and torch itself."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MetricsLog:
    def __init__(self, steps: int, path: str | None, enabled: bool, overwrite: bool = False):
        self.enabled = enabled
        self.file = open(path, "w" if overwrite else "x") if (path and enabled) else None
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
                f"  peak {row['peak_memory_bytes'] / 2**20:.0f} MiB")
        if self._progress:
            self._progress.update(self._task, advance=1, description=f"loss {row['loss']:.4f}")
            self._progress.console.print(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self._progress:
            self._progress.stop()
        if self.file:
            self.file.close()
