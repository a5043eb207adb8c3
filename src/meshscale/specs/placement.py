"""Where a pipeline's chunks and layers live: which rank holds which chunk (stage) and layer.

The model is cut into pp*vpp chunks of contiguous layers (`layout.split_layers`). Rank r holds chunks r, r+pp,
... (looped, interleaved 1F1B; Narayanan et al. 2021 sec. 2.2) or, under a V schedule (`Layout.v_shaped`),
r and 2pp-1-r (the model goes down the ranks and back up; Qi et al. 2024 sec. 6). The cost model, the
simulator and the runtime all place chunks with these functions.
"""

from functools import lru_cache

from meshscale.specs.layout import Layout, split_layers


def rank_chunks(pp: int, chunks: int, v_shaped: bool, rank: int) -> tuple:
    """The pipeline chunks (stages) rank `rank` holds."""
    return (rank, chunks - 1 - rank) if v_shaped else tuple(range(rank, chunks, pp))


def stage_owner(stage: int, pp: int, v_shaped: bool) -> int:
    """The pipeline rank holding chunk `stage` (the inverse of `rank_chunks`)."""
    if v_shaped:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


@lru_cache(maxsize=65536)
def rank_layers(layers: int, pp: int, chunks: int, v_shaped: bool, rank: int, mtp: int = 0,
                ends: tuple = ()) -> tuple:
    """The layers rank `rank` holds, in order, cut as the runtime cuts them (`split_layers`; `mtp` multi-token
    prediction modules count in the last chunk; `ends`: `layout_ends`)."""
    ranges = chunk_ranges(layers, chunks, mtp, pp, ends)
    return tuple(i for c in rank_chunks(pp, chunks, v_shaped, rank) for i in ranges[c])


@lru_cache(maxsize=4096)
def chunk_ranges(layers: int, chunks: int, mtp: int = 0, pp: int = 1, ends: tuple = ()) -> tuple:
    """`split_layers`, cut once for every rank that asks."""
    return tuple(split_layers(layers, chunks, mtp, pp, *ends))


def layout_ends(layout: Layout) -> tuple:
    """How the layout's cut departs from the even one, as `split_layers` takes it after (mtp, pp): its (first,
    last) rank sizes and (embedding_layer, loss_layer) where it sets any, else (), what the placement functions
    take."""
    ends = (layout.first, layout.last, layout.embedding_layer, layout.loss_layer)
    return ends if any(ends) else ()


@lru_cache(maxsize=4096)
def layer_counts(layers: int, pp: int, chunks: int, v_shaped: bool, mtp: int = 0, ends: tuple = ()) -> tuple:
    """How many layers each rank holds."""
    return tuple(len(rank_layers(layers, pp, chunks, v_shaped, r, mtp, ends)) for r in range(pp))


@lru_cache(maxsize=4096)
def sends_per_rank(pp: int, chunks: int, v_shaped: bool) -> tuple:
    """Stage-boundary sends per micro-batch from each rank: forward from each chunk whose successor lives
    elsewhere, backward from each chunk whose predecessor does (a V keeps its turn on one rank)."""
    owner = [stage_owner(c, pp, v_shaped) for c in range(chunks)]
    return tuple(sum(1 for c in range(chunks - 1) if owner[c] == r and owner[c + 1] != r)
                 + sum(1 for c in range(1, chunks) if owner[c] == r and owner[c - 1] != r) for r in range(pp))


def stage_layers(model, layout: Layout, rank: int) -> tuple:
    """The layers of `model` pipeline rank `rank` owns under `layout`."""
    return rank_layers(model.layers, layout.pp, layout.stages, layout.v_shaped, rank, model.mtp_layers,
                       layout_ends(layout))


def head_rank(layout: Layout) -> int:
    """The rank holding the final norm and the output head (rank 0 when the V turns back)."""
    return 0 if layout.v_shaped else layout.pp - 1
