"""Megatron-LM's indexed dataset format (`megatron.core.datasets.indexed_dataset`, the "MMIDIDX" files
`tools/preprocess_data.py` writes), byte for byte, so either side reads the other's files.

PREFIX.bin holds the token ids of every sequence back to back. PREFIX.idx, little-endian:
    magic      9 bytes  b"MMIDIDX\\x00\\x00"
    version    uint64   1
    dtype      uint8    the ids' numpy dtype as Megatron's DType code (below)
    sequences  uint64   S
    documents  uint64   D + 1 (the document index has a leading 0)
    sizes      int32[S]     tokens per sequence
    pointers   int64[S]     byte offset of each sequence in the .bin
    doc_index  int64[D + 1] sequence index at which each document starts, then S
A document is one or more sequences (Megatron splits sentences into sequences); we write one sequence per
document, with the end-of-document token appended as preprocess_data.py's --append-eod does.
"""

import struct
from pathlib import Path

import numpy as np

from meshscale.errors import UserError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents: 34 bytes
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
               8: np.uint16}
CODE_OF = {np.dtype(t): c for c, t in DTYPE_CODES.items()}


def token_dtype(vocab: int) -> np.dtype:
    """uint16 below 65,500 ids, else int32: the choice Megatron's DType.optimal_dtype makes."""
    return np.dtype(np.uint16 if vocab < 65500 else np.int32)


def paths(prefix: str | Path) -> tuple[Path, Path]:
    """(PREFIX.bin, PREFIX.idx) for a prefix or for either file's own name."""
    p = Path(prefix)
    if p.suffix in (".bin", ".idx"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".bin"), p.with_name(p.name + ".idx")


def is_indexed(path: str | Path) -> bool:
    """True when `path` names an indexed dataset: an .idx file, or a prefix or .bin with an .idx beside it
    (a .bin alone is raw token ids). IndexedDataset then says which half of the pair is missing."""
    bin_path, idx_path = paths(path)
    return Path(path).suffix == ".idx" or idx_path.is_file()


class IndexedWriter:
    """Writes PREFIX.bin as documents arrive and PREFIX.idx on close. Both are written under temporary
    names and renamed only once complete, so an interrupted run leaves no half-written dataset behind."""

    def __init__(self, prefix: str | Path, vocab: int):
        self.bin_path, self.idx_path = paths(prefix)
        self.dtype = token_dtype(vocab)
        self._tmp_bin = self.bin_path.with_name(self.bin_path.name + ".partial")
        self._bin = open(self._tmp_bin, "wb")
        self.sizes: list[int] = []

    def add_document(self, ids) -> None:
        ids = np.asarray(ids)
        self._bin.write(ids.astype(self.dtype, copy=False).tobytes())
        self.sizes.append(len(ids))

    def close(self) -> None:
        self._bin.close()
        sizes = np.asarray(self.sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        np.cumsum(sizes[:-1] * self.dtype.itemsize, out=pointers[1:])
        doc_index = np.arange(len(sizes) + 1, dtype=np.int64)
        tmp_idx = self.idx_path.with_name(self.idx_path.name + ".partial")
        with open(tmp_idx, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, CODE_OF[self.dtype], len(sizes), len(doc_index)))
            f.write(sizes.tobytes() + pointers.tobytes() + doc_index.tobytes())
        self._tmp_bin.replace(self.bin_path)
        tmp_idx.replace(self.idx_path)

    def abort(self) -> None:
        self._bin.close()
        self._tmp_bin.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.close() if kind is None else self.abort()


class IndexedDataset:
    """A memory-mapped PREFIX.bin/.idx pair, checked against each other on open. `tokens` is the whole .bin
    as one flat array; `doc_bounds` the token offset at which each document starts, then the total."""

    def __init__(self, prefix: str | Path):
        self.bin_path, self.idx_path = paths(prefix)
        for f in (self.bin_path, self.idx_path):
            if not f.is_file():
                raise UserError(f"{f}: no such file; an indexed dataset is a PREFIX.bin and PREFIX.idx pair "
                                "(write one with `meshscale data prepare`)")
        self.sizes, self.pointers, self.doc_index = self._read_index()
        self.tokens = self._map_tokens()
        self.doc_bounds = np.append(self.pointers, self.tokens.nbytes)[self.doc_index] // self.dtype.itemsize

    def _read_index(self):
        raw = self.idx_path.read_bytes()
        bad = f"{self.idx_path}: not a Megatron indexed-dataset index"
        if len(raw) < HEADER.size:
            raise UserError(f"{bad} ({len(raw)} bytes, shorter than its header); "
                            "rewrite it with `meshscale data prepare`")
        magic, version, code, n_seq, n_doc = HEADER.unpack_from(raw)
        if magic != MAGIC:
            raise UserError(f"{bad} (magic {magic!r}, expected {MAGIC!r}); pass PREFIX of a PREFIX.bin/.idx pair")
        if version != VERSION:
            raise UserError(f"{self.idx_path}: index version {version}; only version {VERSION} exists in Megatron-LM")
        if code not in DTYPE_CODES or not np.issubdtype(DTYPE_CODES[code], np.integer):
            raise UserError(f"{self.idx_path}: dtype code {code} is not an integer token type "
                            f"(codes {sorted(c for c, t in DTYPE_CODES.items() if np.issubdtype(t, np.integer))})")
        self.dtype = np.dtype(DTYPE_CODES[code])
        expected = HEADER.size + 12 * n_seq + 8 * n_doc
        if len(raw) < expected:
            raise UserError(f"{self.idx_path}: {len(raw)} bytes, but its header promises {n_seq} sequences and "
                            f"{n_doc} document offsets ({expected} bytes); the file is truncated")
        sizes = np.frombuffer(raw, np.int32, n_seq, HEADER.size)
        pointers = np.frombuffer(raw, np.int64, n_seq, HEADER.size + 4 * n_seq)
        doc_index = np.frombuffer(raw, np.int64, n_doc, HEADER.size + 12 * n_seq)
        contiguous = np.concatenate(([0], np.cumsum(sizes[:-1], dtype=np.int64) * self.dtype.itemsize))
        if n_seq and not np.array_equal(pointers, contiguous):
            raise UserError(f"{self.idx_path}: sequence pointers do not follow the sizes back to back; the index "
                            "does not describe this .bin (rewrite it with `meshscale data prepare`)")
        if n_doc < 1 or doc_index[0] != 0 or doc_index[-1] != n_seq or np.any(np.diff(doc_index) < 0):
            raise UserError(f"{self.idx_path}: document index must rise from 0 to the sequence count {n_seq}")
        return sizes, pointers, doc_index

    def _map_tokens(self) -> np.ndarray:
        size = self.bin_path.stat().st_size
        want = int(self.sizes.sum(dtype=np.int64)) * self.dtype.itemsize
        if size != want:
            raise UserError(f"{self.bin_path}: {size} bytes, but {self.idx_path.name} describes {want} "
                            f"({int(self.sizes.sum())} {self.dtype.name} tokens); the pair does not belong together")
        if size == 0:
            raise UserError(f"{self.bin_path}: holds no tokens; prepare it from a non-empty corpus")
        return np.memmap(self.bin_path, dtype=self.dtype, mode="r")

    @property
    def documents(self) -> int:
        return len(self.doc_index) - 1

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.doc_bounds[i]:self.doc_bounds[i + 1]]
