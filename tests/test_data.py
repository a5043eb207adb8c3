"""Data: the stdlib corpus, user files (text, raw .bin, indexed datasets), the split, and layout-independent
batches (random windows of text, packed windows of documents with their document ids)."""

import numpy as np
import pytest
import torch

from meshscale.errors import UserError
from meshscale.parallel.context import cp_positions
from meshscale.runtime.loop.data import TokenData, check_tokens, load_tokens, rank_microbatches


def test_stdlib_corpus_is_real_deterministic_text():
    a, b = load_tokens(None), load_tokens(None)
    assert len(a) > 1_000_000 and np.array_equal(a, b)
    assert b"def " in a[:200_000].tobytes()


def test_text_file_and_directory(tmp_path):
    (tmp_path / "a.txt").write_text("hello world")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("!")
    (tmp_path / "blob.dat").write_bytes(b"\0\1\2")  # binary: skipped
    assert load_tokens(str(tmp_path / "a.txt")).tobytes() == b"hello world"
    assert load_tokens(str(tmp_path)).tobytes() == b"hello world!"


def test_bin_token_files_are_memory_mapped(tmp_path):
    ids = np.arange(1000, dtype=np.uint16)
    ids.tofile(tmp_path / "toks.bin")
    got = load_tokens(str(tmp_path / "toks.bin"))
    assert isinstance(got, np.memmap) and np.array_equal(got, ids)
    np.arange(70000, 70010, dtype=np.uint32).tofile(tmp_path / "big.u32.bin")
    assert load_tokens(str(tmp_path / "big.u32.bin"))[0] == 70000
    (tmp_path / "odd.bin").write_bytes(b"\1\2\3")
    with pytest.raises(UserError, match="whole number"):
        load_tokens(str(tmp_path / "odd.bin"))


def test_missing_path_and_bad_tokens_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_tokens(str(tmp_path / "nope"))
    with pytest.raises(UserError, match="vocabulary"):
        check_tokens(np.full(100_000, 300, dtype=np.uint16), 256, 64, "x")
    with pytest.raises(UserError, match="too little"):
        check_tokens(np.zeros(100, dtype=np.uint8), 256, 64, "x")


def test_split_and_batches_do_not_depend_on_the_layout():
    tokens = np.arange(100_000) % 251
    data = TokenData(tokens, seq=16, seed=3)
    assert len(data.tokens["train"]) + len(data.tokens["val"]) == len(tokens) and len(data.tokens["val"]) > 0
    batch = data.global_batch(7, 8)
    assert batch.shape == (8, 17) and np.array_equal(batch, data.global_batch(7, 8))
    assert not np.array_equal(batch, data.global_batch(8, 8))
    for dp, mbs in [(1, 8), (2, 4), (2, 1), (4, 2), (8, 1)]:
        rows = [mb for r in range(dp) for mb in rank_microbatches(batch, r, dp, mbs)]
        assert all(x.shape[0] == mbs for x, _ in rows)
        assert np.array_equal(np.concatenate([x for x, _ in rows]), batch[:, :-1])  # same tokens, same order
        assert np.array_equal(np.concatenate([y for _, y in rows]), batch[:, 1:])
    val = data.global_batch(0, 4, "val")
    assert val.min() >= 0 and not np.array_equal(val, data.global_batch(0, 4))


def test_context_parallel_ranks_hold_balanced_chunks_of_every_sequence():
    batch = TokenData(np.arange(100_000) % 251, seq=16, seed=3).global_batch(0, 4)
    for cp in (2, 4):
        parts = [rank_microbatches(batch, 0, 1, 4, r, cp)[0] for r in range(cp)]
        positions = [cp_positions(16, r, cp) for r in range(cp)]
        chunk = 16 // (2 * cp)
        assert positions[0].tolist()[:chunk] == list(range(chunk))  # rank 0: the first and the last chunk
        assert positions[0].tolist()[chunk:] == list(range(16 - chunk, 16))
        assert sorted(torch.cat(positions).tolist()) == list(range(16))  # every token once
        for (x, y), pos in zip(parts, positions):
            assert np.array_equal(x, batch[:, :-1][:, pos]) and np.array_equal(y, batch[:, 1:][:, pos])


def test_indexed_datasets_by_prefix_bin_or_idx(tmp_path):
    from meshscale.data.indexed import IndexedWriter
    from meshscale.runtime.loop.data import load_corpus

    with IndexedWriter(tmp_path / "c", 1000) as w:
        w.add_document([7, 8, 0])
        w.add_document([9, 0])
    for name in ("c", "c.bin", "c.idx"):
        corpus = load_corpus(str(tmp_path / name))
        assert corpus.tokens.tolist() == [7, 8, 0, 9, 0] and corpus.bounds.tolist() == [0, 3, 5]
    assert load_corpus(str(tmp_path / "c")).tokens.tolist() == load_tokens(str(tmp_path / "c.idx")).tolist()
    (tmp_path / "c.bin").unlink()
    with pytest.raises(UserError, match="c.bin: no such file"):
        load_corpus(str(tmp_path / "c.idx"))
    (tmp_path / "raw.bin").write_bytes(b"\1\0\2\0")  # no .idx beside it: raw ids, no documents
    assert load_corpus(str(tmp_path / "raw.bin")).bounds is None


def test_packed_batches_are_layout_independent_and_carry_documents():
    tokens = np.arange(20_000)  # each token its own offset
    bounds = np.arange(0, 20_001, 50)  # documents of 50 tokens
    data = TokenData(tokens, seq=16, seed=3, bounds=bounds)
    batch, docs = data.global_batch(4, 8), data.global_documents(4, 8)
    assert batch.shape == docs.shape == (8, 17) and np.array_equal(batch, data.global_batch(4, 8))
    starts = batch[:, 0].numpy()
    assert np.array_equal(docs, (starts[:, None] + np.arange(17)) // 50 - starts[:, None] // 50)
    for dp, mbs in [(1, 8), (2, 2), (4, 1)]:
        rows = [mb for r in range(dp) for mb in rank_microbatches(batch, r, dp, mbs, documents=docs)]
        assert all(len(mb) == 3 for mb in rows)
        assert np.array_equal(np.concatenate([d for _, _, d in rows]), docs[:, :-1])
    parts = [rank_microbatches(batch, 0, 1, 8, r, 2, documents=docs)[0] for r in range(2)]
    for (x, _, d), pos in zip(parts, [cp_positions(16, r, 2) for r in range(2)]):
        assert np.array_equal(x, batch[:, :-1][:, pos]) and np.array_equal(d, docs[:, :-1][:, pos])
    val = data.global_batch(0, 4, "val")
    assert val.min() >= 19_000 and data.global_batch(0, 8).max() < 19_000  # the last 5%, held out
    with pytest.raises(UserError, match="needs documents"):
        TokenData(tokens, seq=16, seed=3).global_documents(0, 4)
