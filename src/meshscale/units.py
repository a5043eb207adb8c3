"""Figures as a reader takes them in: bytes in the largest SI unit they reach (the planner's prose and every
command's tables share this, so the same state reads the same everywhere)."""


def si_bytes(x: float, digits: int = 1) -> str:
    """Bytes in the largest SI unit they reach (a small model's state in MB, not 0.0 GB)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:,.{digits}f} {unit}"
    return f"{x:,.0f} B"
