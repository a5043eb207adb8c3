"""Random initial values as a function of (seed, parameter name, global index), so that a process holding
any slice of a parameter (a TP slice, an FSDP shard, a pipeline stage's layers, an EP rank's experts) draws
exactly the numbers the single-process model has there, without drawing the rest.

A parameter, seen as a matrix (a vector is one row), is cut into fixed tiles of TILE (rows, columns), clipped
to its global shape. Each tile draws from its own generator, seeded by (key, tile row, tile column): a slice
costs the tiles it touches, at most one tile's edge more than it owns along each dimension.
"""

import torch

TILE = (64, 512)


def stable_hash(text: str) -> int:
    # Python's hash() is salted per process; ranks must agree, so use a fixed FNV-1a.
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


def normal_block(key: str, shape: tuple[int, int], offset: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """Standard-normal fp32 values of rows [r0, r0+rows) x columns [c0, c0+cols) of the `shape` matrix
    named `key` ((r0, c0) = offset, (rows, cols) = size)."""
    tr, tc = min(TILE[0], shape[0]), min(TILE[1], shape[1])
    (r0, c0), (rows, cols) = offset, size
    out = torch.empty(rows, cols)
    for i in range(r0 // tr, -(-(r0 + rows) // tr)):
        for j in range(c0 // tc, -(-(c0 + cols) // tc)):
            tile = torch.randn(tr, tc, generator=torch.Generator().manual_seed(stable_hash(f"{key}:{i}:{j}")))
            lo_r, hi_r = max(r0, i * tr), min(r0 + rows, (i + 1) * tr)
            lo_c, hi_c = max(c0, j * tc), min(c0 + cols, (j + 1) * tc)
            out[lo_r - r0:hi_r - r0, lo_c - c0:hi_c - c0] = tile[lo_r - i * tr:hi_r - i * tr,
                                                                 lo_c - j * tc:hi_c - j * tc]
    return out
