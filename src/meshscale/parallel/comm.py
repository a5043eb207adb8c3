"""Interim comm recording for TP/PP until runtime/ledger.py lands: `record(axis, collective, nbytes)`
appends to the active log, if any (see `recording`)."""

from contextlib import contextmanager

_active: list | None = None


def record(axis: str, collective: str, nbytes: int) -> None:
    if _active is not None:
        _active.append((axis, collective, nbytes))


@contextmanager
def recording():
    global _active
    previous, _active = _active, []
    try:
        yield _active
    finally:
        _active = previous
