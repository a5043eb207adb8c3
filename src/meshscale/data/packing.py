"""Documents packed into training sequences. Each document ends with the end-of-document token (written by
`meshscale data prepare`, as Megatron's --append-eod does), the documents lie end to end, and the stream is
cut into windows of seq + 1 tokens that share one token with the next (inputs [:-1], targets [1:]: every
token is a target exactly once per epoch). Windows are visited in a fresh seeded order each epoch, so the
batch of a step depends only on (seed, step) and a resumed run reads exactly what an uninterrupted one would.

For document-boundary masking a window also carries each token's document (numbered from the window's
first): attention can then stay within a document and positions restart at each one, as Megatron's
reset_attention_mask / reset_position_ids do."""

import numpy as np


def split(tokens: np.ndarray, bounds: np.ndarray, fraction: float):
    """((tokens, bounds), (tokens, bounds)): the first 1 - fraction of the tokens and the rest, each with its
    document starts (then its length) counted from its own first token."""
    cut = int(len(tokens) * (1 - fraction))
    head = np.append(bounds[bounds < cut], cut)
    tail = np.concatenate(([0], bounds[bounds > cut] - cut))
    return (tokens[:cut], head), (tokens[cut:], tail)


def windows(tokens: np.ndarray, starts: np.ndarray, seq: int) -> np.ndarray:
    """(len(starts), seq + 1) int64 token ids from each start."""
    return np.stack([np.asarray(tokens[s:s + seq + 1], dtype=np.int64) for s in starts])


class PackedWindows:
    """Windows of seq + 1 tokens over `tokens`, whose documents start at `bounds` (then len(tokens))."""

    def __init__(self, tokens: np.ndarray, bounds: np.ndarray, seq: int, seed: int, stream: int = 0):
        self.tokens, self.bounds, self.seq = tokens, np.asarray(bounds, dtype=np.int64), seq
        self.key = (seed, stream)  # train and validation draw from different streams
        self.count = (len(tokens) - 1) // seq
        self._epoch: tuple[int, np.ndarray] | None = None

    def starts(self, first: int, size: int) -> np.ndarray:
        """Token offsets of samples first .. first + size - 1 of the run (epoch after epoch)."""
        k = np.arange(first, first + size)
        epochs, within = np.divmod(k, self.count)
        return np.array([self._order(e)[i] for e, i in zip(epochs, within)], dtype=np.int64) * self.seq

    def _order(self, epoch: int) -> np.ndarray:
        if self._epoch is None or self._epoch[0] != epoch:  # one epoch's order kept: steps walk through it
            self._epoch = (epoch, np.random.default_rng([*self.key, epoch]).permutation(self.count))
        return self._epoch[1]

    def documents(self, starts: np.ndarray) -> np.ndarray:
        """(len(starts), seq + 1): the document of every token of each window, counted from the window's
        first (a non-decreasing run: positions inside a document follow from where its run starts)."""
        at = starts[:, None] + np.arange(self.seq + 1)
        doc = np.searchsorted(self.bounds, at, side="right") - 1
        return doc - doc[:, :1]
