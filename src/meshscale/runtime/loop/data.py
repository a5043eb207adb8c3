"""Token data: the Python standard library's own sources by default, or the user's files.

Tokens are bytes (vocabulary 256) for text; a Megatron indexed dataset (PREFIX.bin + PREFIX.idx, written by
`meshscale data prepare`) holds tokenized documents, each ending in its end-of-document token; a lone `.bin`
holds raw uint16/uint32 ids. Both are memory-mapped. The last `VAL_FRACTION` of the tokens is held out for
validation.

Batches depend only on (seed, step): every rank draws the same global batch of windows, then takes
its contiguous slice of rows (and, under context parallelism, its positions in each), so the tokens of a
step and their order never depend on the layout. Text and raw ids are cut at random offsets; documents are
packed (data/packing.py): every token a target once per epoch, with each token's document at hand for
document-boundary masking.
"""

import os
import sysconfig
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from meshscale.data.indexed import IndexedDataset, is_indexed
from meshscale.data.packing import PackedWindows, split, windows
from meshscale.data.sources import JSONL, PARQUET
from meshscale.errors import UserError
from meshscale.parallel.context import cp_positions

VAL_FRACTION = 0.05
STDLIB_BYTES = 8 << 20  # enough real text for CPU runs, read in well under a second
BYTE_VOCAB = 256  # text is read as bytes: its token ids run to 255


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
    if size == 0:
        raise UserError(f"--data {path}: empty file, no tokens; pass a tokenized corpus")
    if size % np.dtype(dtype).itemsize:
        raise UserError(f"--data {path}: size {size} is not a whole number of {np.dtype(dtype).name} tokens; "
                        "name uint32 files *.u32.bin")
    return np.memmap(path, dtype=dtype, mode="r")


class Corpus(NamedTuple):
    tokens: np.ndarray
    bounds: np.ndarray | None = None  # where each document starts, then len(tokens); None: no documents


def load_corpus(path: str | None) -> Corpus:
    """The corpus `--data` names: an indexed dataset (by PREFIX, PREFIX.bin or PREFIX.idx) with its
    documents, or text / raw ids without."""
    if path is not None and is_indexed(path):
        dataset = IndexedDataset(path)
        return Corpus(dataset.tokens, dataset.doc_bounds)
    return Corpus(load_tokens(path))


def load_tokens(path: str | None) -> np.ndarray:
    """All tokens of the corpus as a 1-D integer array (memory-mapped for .bin files)."""
    if path is None:
        return _read_text_files(stdlib_files(), STDLIB_BYTES)
    if is_indexed(path):
        return IndexedDataset(path).tokens
    p = Path(path)
    if not p.exists():
        raise UserError(f"--data {path}: no such file or directory; pass a text file, a directory of text "
                        "files, an indexed dataset's PREFIX (PREFIX.bin + PREFIX.idx), or a .bin of raw ids")
    if p.suffix in JSONL + PARQUET:
        raise UserError(f"--data {path}: tokenize {p.suffix} files first: meshscale data prepare {path} --tokenizer "
                        "TOKENIZER.json --out PREFIX, then train with --data PREFIX")
    if p.is_file() and p.suffix == ".bin":
        return _read_bin(p)
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    tokens = _read_text_files(files)
    if not len(tokens):
        raise UserError(f"--data {path}: no text in it (empty, or only binary files)")
    return tokens


def check_tokens(tokens: np.ndarray, vocab: int, seq: int, source: str) -> None:
    if len(tokens) < 2 * (seq + 1) / VAL_FRACTION:
        raise UserError(f"{source}: {len(tokens)} tokens is too little for seq={seq} with a validation split; "
                        f"give at least {int(2 * (seq + 1) / VAL_FRACTION)} tokens")
    low, top = int(tokens.min()), int(tokens.max())
    if low < 0:
        raise UserError(f"{source}: token id {low} is negative; token ids run from 0 to the vocabulary size - 1")
    if top >= vocab:
        raise UserError(f"{source}: token id {top} does not fit the model's vocabulary of {vocab}; train a model "
                        f"with vocab >= {top + 1} (the tokenizer's) or prepare the data with a smaller tokenizer")


class TokenData:
    def __init__(self, tokens: np.ndarray, seq: int, seed: int, bounds: np.ndarray | None = None):
        self.seq, self.seed = seq, seed
        if bounds is None:
            cut = int(len(tokens) * (1 - VAL_FRACTION))
            self.tokens = {"train": tokens[:cut], "val": tokens[cut:]}
            self.packed = None
        else:  # documents: packed windows, a stream of their own for validation
            parts = split(tokens, bounds, VAL_FRACTION)
            self.packed = {name: PackedWindows(t, b, seq, seed, stream)
                           for stream, (name, (t, b)) in enumerate(zip(("train", "val"), parts))}
            self.tokens = {name: w.tokens for name, w in self.packed.items()}

    def _starts(self, step: int, size: int, split: str) -> np.ndarray:
        if self.packed is not None:
            return self.packed[split].starts(step * size, size)
        rng = np.random.default_rng([self.seed, step, split == "val"])
        return rng.integers(0, len(self.tokens[split]) - self.seq - 1, size=size)

    def global_batch(self, step: int, size: int, split: str = "train") -> torch.Tensor:
        """(size, seq + 1) token windows for `step`: inputs are [:, :-1], targets [:, 1:]."""
        return torch.from_numpy(windows(self.tokens[split], self._starts(step, size, split), self.seq))

    def global_documents(self, step: int, size: int, split: str = "train") -> torch.Tensor:
        """(size, seq + 1): the document of each token of `global_batch(step, size, split)`."""
        if self.packed is None:
            raise UserError("document-boundary masking needs documents: train on an indexed dataset "
                            "(meshscale data prepare)")
        return torch.from_numpy(self.packed[split].documents(self._starts(step, size, split)))


def rank_microbatches(batch: torch.Tensor, dp_rank: int, dp: int, mbs: int, cp_rank: int = 0, cp: int = 1,
                      documents: torch.Tensor | None = None) -> list[tuple[torch.Tensor, ...]]:
    """This DP rank's contiguous slice of the global batch, cut into micro-batches of mbs rows, each as
    (inputs, targets), or (inputs, targets, the inputs' documents); under context parallelism, the tokens at
    this CP rank's positions of each."""
    per_rank = batch.shape[0] // dp
    rows = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)
    parts = [batch[rows, :-1], batch[rows, 1:]] + ([documents[rows, :-1]] if documents is not None else [])
    if cp > 1:
        positions = cp_positions(batch.shape[1] - 1, cp_rank, cp)
        parts = [part[:, positions] for part in parts]
    return list(zip(*(part.split(mbs) for part in parts)))
