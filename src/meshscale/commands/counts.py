"""Counts on the command line with binary suffixes, as nccl-tests writes its sizes: 64M bytes, a batch of 4M
tokens (4 x 2^20 = 4,194,304, a whole number of 8,192-token sequences)."""

import argparse

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
