"""Token data: the Python standard library's own sources by default, or the user's files.

Tokens are bytes (vocabulary 256) for text; `.bin` files hold pre-tokenised uint16/uint32 ids and are
memory-mapped. The last `VAL_FRACTION` of the tokens is held out for validation.

Batches depend only on (seed, step): every rank draws the same global batch of windows, then takes
its contiguous slice of rows (and, under context parallelism, its positions in each), so the tokens of a
step and their order never depend on the layout.
"""

import os
import sysconfig
from pathlib import Path

import numpy as np
import torch

from meshscale.errors import UserError
from meshscale.parallel.context import cp_positions

VAL_FRACTION = 0.05
STDLIB_BYTES = 8 << 20  # enough real text for CPU runs, read in well under a second


def stdlib_files():
    """The standard library's .py files in a fixed order (installed packages and caches pruned), lazily:
    reading stops once the corpus budget is met."""
    for folder, subdirs, names in os.walk(sysconfig.get_paths()["stdlib"]):
        subdirs[:] = sorted(d for d in subdirs if d not in ("site-packages", "__pycache__"))
        yield from (Path(folder, n) for n in sorted(names) if n.endswith(".py"))


def _read_text_files(files, budget: int | None = None) -> np.ndarray:
    chunks, total = [], 0
    for f in files:
        raw = f.read_bytes()
        if b"\0" in raw[:4096]:  # binary file in a text directory: skip it
            continue
        chunks.append(np.frombuffer(raw, dtype=np.uint8))
        total += len(raw)
        if budget and total >= budget:
            break
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint8)


def _read_bin(path: Path) -> np.ndarray:
    dtype = np.uint32 if path.name.endswith((".u32.bin", ".uint32.bin")) else np.uint16
    size = path.stat().st_size
    if size % np.dtype(dtype).itemsize:
        raise UserError(f"--data {path}: size {size} is not a whole number of {np.dtype(dtype).name} tokens; "
                        "name uint32 files *.u32.bin")
    return np.memmap(path, dtype=dtype, mode="r")


def load_tokens(path: str | None) -> np.ndarray:
    """All tokens of the corpus as a 1-D integer array (memory-mapped for .bin files)."""
    if path is None:
        return _read_text_files(stdlib_files(), STDLIB_BYTES)
    p = Path(path)
    if not p.exists():
        raise UserError(f"--data {path}: no such file or directory; pass a text file, a directory of text "
                        "files, or a .bin token file (uint16; *.u32.bin for uint32)")
    if p.is_file() and p.suffix == ".bin":
        return _read_bin(p)
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    return _read_text_files(files)


def check_tokens(tokens: np.ndarray, vocab: int, seq: int, source: str) -> None:
    if len(tokens) < 2 * (seq + 1) / VAL_FRACTION:
        raise UserError(f"{source}: {len(tokens)} tokens is too little for seq={seq} with a validation split; "
                        f"give at least {int(2 * (seq + 1) / VAL_FRACTION)} tokens")
    top = int(tokens.max())
    if top >= vocab:
        raise UserError(f"{source}: token id {top} does not fit the model's vocabulary of {vocab}")


class TokenData:
    def __init__(self, tokens: np.ndarray, seq: int, seed: int):
        cut = int(len(tokens) * (1 - VAL_FRACTION))
        self.train, self.val = tokens[:cut], tokens[cut:]
        self.seq, self.seed = seq, seed

    def global_batch(self, step: int, size: int, split: str = "train") -> torch.Tensor:
        """(size, seq + 1) token windows for `step`: inputs are [:, :-1], targets [:, 1:]."""
        tokens = self.train if split == "train" else self.val
        rng = np.random.default_rng([self.seed, step, split == "val"])
        starts = rng.integers(0, len(tokens) - self.seq - 1, size=size)
        rows = np.stack([np.asarray(tokens[s:s + self.seq + 1], dtype=np.int64) for s in starts])
        return torch.from_numpy(rows)


def rank_microbatches(batch: torch.Tensor, dp_rank: int, dp: int, mbs: int, cp_rank: int = 0,
                      cp: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This DP rank's contiguous slice of the global batch, cut into micro-batches of mbs rows, each as
    (inputs, targets); under context parallelism, the tokens at this CP rank's positions of each."""
    per_rank = batch.shape[0] // dp
    mine = batch[dp_rank * per_rank:(dp_rank + 1) * per_rank]
    inputs, targets = mine[:, :-1], mine[:, 1:]
    if cp > 1:
        positions = cp_positions(inputs.shape[1], cp_rank, cp)
        inputs, targets = inputs[:, positions], targets[:, positions]
    return list(zip(inputs.split(mbs), targets.split(mbs)))
