"""Numbers on the command line. Counts take binary suffixes, as nccl-tests writes its sizes: 64M bytes, a batch
of 4M tokens (4 x 2^20 = 4,194,304, a whole number of 8,192-token sequences). Token budgets take decimal ones, as
they are written: 15T tokens (15 x 10^12). Bandwidths, hours, days and seconds must be finite."""

import argparse
import math

UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def binary_count(text: str) -> int:
    """'4M' -> 4,194,304, '512' -> 512: a positive integer, K/M/G binary (an argparse type)."""
    item = text.strip().upper()
    unit = item[-1:] if item[-1:] in ("K", "M", "G") else ""
    number = item[:-1] if unit else item
    if not number.isdigit() or int(number) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive count; write e.g. 4194304 or 4M (K, M and G "
                                         "are binary)")
    return int(number) * UNITS[unit]


DECIMAL = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def decimal_amount(text: str) -> float:
    """'15T' -> 1.5e13, '2e12' -> 2e12, '300B' -> 3e11: a positive finite number, K/M/B (or G)/T decimal (an
    argparse type)."""
    item = text.strip().upper()
    unit = item[-1:] if item[-1:] in DECIMAL else ""
    return _checked(_float(item[:-1] if unit else item) * DECIMAL.get(unit, 1.0), lambda v: v > 0, text,
                    "a positive amount; write e.g. 15T, 300B or 2e12 (K, M, B or G, and T are decimal: 1T = 10^12)")


def whole_number(text: str) -> int:
    """A positive integer without a suffix: optimizer steps (an argparse type)."""
    if not text.strip().isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def positive_number(text: str) -> float:
    """A positive finite number: bytes/s, hours, days (an argparse type)."""
    return _checked(_float(text), lambda v: v > 0, text, "a positive number")


def seconds(text: str) -> float:
    """Zero or more finite seconds (an argparse type)."""
    return _checked(_float(text), lambda v: v >= 0, text, "zero or more seconds")


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _checked(value: float, ok, text: str, what: str) -> float:
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value
