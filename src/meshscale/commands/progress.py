"""A progress bar on stderr while a command works, through a known amount or for as long as one search takes
(none when stderr is not a terminal, so piped output and logs stay clean)."""

import sys


class progress:
    """`with progress(total, "planning") as advance:` then `advance(done, label)` after each piece; with
    `in_bytes`, a byte count and the time left (tokenizing), else a count of steps (plans); with no total, the
    time so far (one search)."""

    def __init__(self, total: int | None, what: str, in_bytes: bool = False):
        self.total, self.what, self.in_bytes, self.bar = total, what, in_bytes, None

    def __enter__(self):
        if not sys.stderr.isatty():
            return lambda done, label="": None
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        if self.in_bytes:
            columns: tuple = (DownloadColumn(), TimeRemainingColumn())
        elif self.total is None:
            columns = (TimeElapsedColumn(),)
        else:
            columns = (MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"))
        self.bar = Progress(TextColumn(self.what), BarColumn(), *columns, console=Console(stderr=True),
                            transient=not self.in_bytes)
        task = self.bar.add_task("", total=self.total)
        self.bar.start()
        return lambda done, label="": self.bar.update(task, completed=done, description=label)

    def __exit__(self, *exc):
        if self.bar:
            self.bar.stop()
