"""Real data: a BPE trained on local text, text/JSONL/Parquet sources, Megatron's indexed format (read and
written by megatron-core itself), packing with document ids, `meshscale data`, and bad data as one line."""

import json
import struct
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from meshscale.cli import main
from meshscale.data import indexed
from meshscale.data.indexed import IndexedDataset, IndexedWriter
from meshscale.data.packing import PackedWindows, split, windows
from meshscale.data.sources import documents, input_files
from meshscale.data.tokenizer import load_tokenizer, train_bpe
from meshscale.errors import UserError

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXTS = [(STDLIB / "json" / n).read_text() for n in ("__init__.py", "decoder.py", "encoder.py", "scanner.py")]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe(TEXTS, 400).save(path)
    return path


def meshscale(*argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def test_bpe_trained_here_round_trips_text_and_compresses_it(tokenizer_file):
    tok = load_tokenizer(tokenizer_file.parent)  # a directory holding tokenizer.json is accepted too
    assert tok.vocab == 400 and tok.eos == "<|endoftext|>" and tok.eos_id == 0
    ids = tok.encode(TEXTS)
    assert [tok.decode(i) for i in ids] == TEXTS
    assert sum(map(len, ids)) < 0.6 * sum(len(t.encode()) for t in TEXTS)  # merges learned, not bytes
    assert max(map(max, ids)) < 400 and tok.eos_id not in ids[0]  # the packer, not the encoder, adds EOS
    unseen = "naïve café — 東京"  # bytes never seen in training still encode: byte-level, nothing unknown
    assert tok.decode(tok.encode([unseen])[0]) == unseen


def test_tokenizer_errors_are_one_line(tmp_path, tokenizer_file):
    with pytest.raises(UserError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(UserError, match="not a tokenizers-library"):
        load_tokenizer(tmp_path)
    with pytest.raises(UserError, match="--eos '<s>'"):
        load_tokenizer(tokenizer_file, eos="<s>")
    with pytest.raises(UserError, match="at least 257"):
        train_bpe(TEXTS, 200)


def test_text_jsonl_and_parquet_sources_read_the_named_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("first document")
    (tmp_path / "b.jsonl").write_text('{"body": "two", "n": 1}\n\n{"body": "three", "n": 2}\n')
    pq.write_table(pa.table({"body": ["four", None, "six"], "n": [1, 2, 3]}), tmp_path / "c.parquet",
                   row_group_size=2)
    (tmp_path / ".hidden").write_text("left out")
    files = input_files(tmp_path)
    assert [f.name for f in files] == ["a.txt", "b.jsonl", "c.parquet"]
    got = list(documents(files, "body"))
    assert [t for t, _ in got] == ["first document", "two", "three", "four", "", "six"]
    assert [at for _, at in got] == sorted(at for _, at in got) and got[-1][1] < sum(f.stat().st_size for f in files)


@pytest.mark.parametrize("name, content, field, needle", [
    ("e.txt", b"", "text", "empty file"),
    ("b.txt", b"\x7fELF\0\0\0binary", "text", "binary data"),
    ("l.txt", "café".encode("latin-1"), "text", "not UTF-8"),
    ("m.jsonl", b'{"text": "ok"}\n{"body": "no text"}\n', "text", r"m.jsonl:2: no field 'text' \(fields: 'body'\)"),
    ("n.jsonl", b'{"text": 3}\n', "text", "is a int, not text"),
    ("j.jsonl", b'{"text": "ok"\n', "text", "j.jsonl:1: not a JSON object"),
    ("a.json", b'[{"text": "x"}]\n', "text", "JSON array"),
    ("p.parquet", "parquet", "body", r"no column 'body' \(columns: 'text', 'n'\)"),
    ("q.parquet", "parquet", "n", "holds int64, not text"),
    ("r.parquet", b"PAR1 not really", "text", "not a Parquet file"),
    ("t.bin", b"\1\2", "text", "already tokenized"),
])
def test_bad_data_is_one_user_error(tmp_path, name, content, field, needle):
    path = tmp_path / name
    if content == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": ["a"], "n": [1]}), path)
    else:
        path.write_bytes(content)
    with pytest.raises(UserError, match=needle):
        list(documents(input_files(path), field))


def test_indexed_files_are_byte_identical_to_megatron_cores_and_read_by_it(tmp_path):
    torch = pytest.importorskip("torch")
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronDataset, IndexedDatasetBuilder

    docs = [np.arange(n, dtype=np.int64) * 7 % 50000 for n in (5, 1, 300, 17)]
    for vocab, dtype, code in ((50000, np.uint16, 8), (128256, np.int32, 4)):
        with IndexedWriter(tmp_path / f"ours{vocab}", vocab) as w:
            for d in docs:
                w.add_document(d)
        theirs = IndexedDatasetBuilder(str(tmp_path / f"theirs{vocab}.bin"), dtype=dtype)
        for d in docs:
            theirs.add_document(torch.from_numpy(d), [len(d)])
        theirs.finalize(str(tmp_path / f"theirs{vocab}.idx"))
        for ext in (".bin", ".idx"):
            assert (tmp_path / f"ours{vocab}{ext}").read_bytes() == (tmp_path / f"theirs{vocab}{ext}").read_bytes()
        raw = (tmp_path / f"ours{vocab}.idx").read_bytes()  # the documented header, field by field
        assert struct.unpack_from("<9sQBQQ", raw) == (b"MMIDIDX\x00\x00", 1, code, 4, 5)
        read = MegatronDataset(str(tmp_path / f"ours{vocab}"))
        assert read.index.dtype == dtype and list(read.document_indices) == [0, 1, 2, 3, 4]
        assert all(np.array_equal(read[i], d) for i, d in enumerate(docs))

    # Megatron's sentence-split documents (several sequences each) read as whole documents here
    builder = IndexedDatasetBuilder(str(tmp_path / "split.bin"), dtype=np.uint16)
    builder.add_document(torch.tensor([1, 2, 3, 4, 5]), [2, 3])
    builder.add_document(torch.tensor([6, 7]), [2])
    builder.finalize(str(tmp_path / "split.idx"))
    ours = IndexedDataset(tmp_path / "split.idx")
    assert ours.documents == 2 and list(ours.doc_bounds) == [0, 5, 7]
    assert list(ours.document(0)) == [1, 2, 3, 4, 5] and list(ours.tokens) == [1, 2, 3, 4, 5, 6, 7]


def test_damaged_indexed_files_are_one_user_error(tmp_path):
    with IndexedWriter(tmp_path / "d", 1000) as w:
        w.add_document([1, 2, 3])
    good = (tmp_path / "d.idx").read_bytes()
    cases = [("d.idx", b"MMIDIDX\x00", "shorter than its header"),
             ("d.idx", b"NOTMEGA\x00\x00" + good[9:], "magic"),
             ("d.idx", good[:9] + struct.pack("<Q", 2) + good[17:], "version 2"),
             ("d.idx", good[:17] + bytes([6]) + good[18:], "not an integer token type"),
             ("d.idx", good[:-4], "truncated"),
             ("d.bin", b"\1\0\2\0", "does not belong"),
             ("d.bin", b"", "describes 6")]
    for name, content, needle in cases:
        (tmp_path / "d.idx").write_bytes(good)
        (tmp_path / "d.bin").write_bytes(b"\1\0\2\0\3\0")
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UserError, match=needle):
            IndexedDataset(tmp_path / "d")
    IndexedWriter(tmp_path / "none", 1000).close()  # a dataset of no documents: an empty .bin
    with pytest.raises(UserError, match="holds no tokens"):
        IndexedDataset(tmp_path / "none.bin")
    with pytest.raises(UserError, match="no such file"):
        IndexedDataset(tmp_path / "absent")


def test_packed_windows_see_every_token_once_an_epoch_in_a_seeded_order():
    tokens = np.arange(1001)
    bounds = np.array([0, 10, 400, 401, 1001])
    w = PackedWindows(tokens, bounds, seq=100, seed=5)
    assert w.count == 10
    epoch = windows(tokens, w.starts(0, 10), 100)
    assert sorted(epoch[:, 1:].ravel().tolist()) == list(range(1, 1001))  # each token a target exactly once
    assert np.array_equal(epoch, epoch[:, :1] + np.arange(101))  # each window contiguous, seq + 1 long
    again = PackedWindows(tokens, bounds, seq=100, seed=5)
    assert np.array_equal(again.starts(3, 4), w.starts(3, 4))  # (seed, sample) alone decides
    assert not np.array_equal(w.starts(0, 10), w.starts(10, 10))  # the next epoch is reshuffled
    assert not np.array_equal(w.starts(0, 10), PackedWindows(tokens, bounds, 100, seed=6).starts(0, 10))
    doc = w.documents(np.array([0, 300, 900]))
    assert doc[0].tolist() == [0] * 10 + [1] * 91
    assert doc[1].tolist() == [0] * 100 + [1]  # token 400 is a document of its own
    assert doc[2].tolist() == [0] * 101  # inside the last document


def test_split_keeps_document_starts_on_each_side():
    (head, hb), (tail, tb) = split(np.arange(100), np.array([0, 30, 96, 100]), 0.05)
    assert len(head) == 95 and hb.tolist() == [0, 30, 95]
    assert tail.tolist() == [95, 96, 97, 98, 99] and tb.tolist() == [0, 1, 5]


def test_meshscale_data_tokenizer_prepare_inspect(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"content": t}) + "\n" for t in TEXTS[:2]))
    pq.write_table(pa.table({"content": TEXTS[2:] + [""]}), tmp_path / "d.parquet")
    tok = tmp_path / "tok.json"
    assert meshscale("data", "tokenizer", tmp_path / "c.jsonl", tmp_path / "d.parquet", "--data-field", "content",
                     "--vocab", 300, "--out", tok) == 0
    out = tmp_path / "corpus"
    assert meshscale("data", "prepare", tmp_path / "c.jsonl", tmp_path / "d.parquet", "--data-field", "content",
                     "--tokenizer", tok, "--out", out) == 0
    said = capsys.readouterr().out
    assert "4 documents" in said and "1 empty document(s) left out" in said
    data, tokenizer = IndexedDataset(out), load_tokenizer(tok)
    assert data.documents == 4 and data.dtype == np.uint16
    for i, text in enumerate(TEXTS):  # every document, then its end-of-document token
        assert data.document(i)[-1] == tokenizer.eos_id and tokenizer.decode(data.document(i)[:-1]) == text
    assert meshscale("data", "inspect", f"{out}.idx", "--tokenizer", tok) == 0
    said = capsys.readouterr().out
    assert "4 documents in 4 sequences" in said and "first document: 'r\"\"\"JSON" in said
    # nothing is overwritten silently; --overwrite replaces the pair
    assert meshscale("data", "prepare", tmp_path / "c.jsonl", "--data-field", "content", "--tokenizer", tok,
                     "--out", out) == 2
    assert "already exists" in capsys.readouterr().err and IndexedDataset(out).documents == 4
    assert meshscale("data", "prepare", tmp_path / "c.jsonl", "--data-field", "content", "--tokenizer", tok,
                     "--out", out, "--overwrite") == 0
    assert IndexedDataset(out).documents == 2


def test_meshscale_data_bad_input_is_one_line_and_leaves_no_files(tmp_path, capsys, tokenizer_file):
    (tmp_path / "ok.jsonl").write_text('{"text": "fine"}\n' * 3 + '{"txt": "typo"}\n')
    code = meshscale("data", "prepare", tmp_path / "ok.jsonl", "--tokenizer", tokenizer_file, "--out", tmp_path / "x")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "ok.jsonl:4: no field 'text'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.jsonl"]  # no partial .bin left behind
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert meshscale("data", "prepare", tmp_path / "empty.jsonl", "--tokenizer", tokenizer_file, "--out",
                     tmp_path / "x") == 2
    assert "no non-empty documents" in capsys.readouterr().err
    with IndexedWriter(tmp_path / "big", 70000) as w:
        w.add_document([5, 69999])
    assert meshscale("data", "inspect", tmp_path / "big", "--tokenizer", tokenizer_file) == 2
    assert "token id 69999 is beyond the 400-token vocabulary" in capsys.readouterr().err


def test_document_mask_computes_each_packed_document_as_if_alone():
    torch = pytest.importorskip("torch")
    from dataclasses import replace

    from meshscale.models.transformer import build_model
    from meshscale.specs.model import PRESETS

    specs = [PRESETS["tiny"], PRESETS["tiny-gpt"],  # RoPE and learned positions; a window inside documents
             replace(PRESETS["tiny"], name="tiny-window", sliding_window=8, full_attention_every=2)]
    for spec in specs:
        model = build_model(spec, seed=1).eval()
        lengths = [5, 20, 1, 38]
        tokens = torch.randint(0, 256, (1, sum(lengths)), generator=torch.Generator().manual_seed(0))
        documents = torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))[None]
        with torch.no_grad():
            packed = model(tokens, documents)[0]
            alone = torch.cat([model(part)[0] for part in tokens.split(lengths, dim=1)])
            plain = model(tokens)[0]
        torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(plain[5:], alone[5:], atol=1e-3)  # without the mask, documents see each other
        torch.testing.assert_close(plain[:5], alone[:5], rtol=1e-5, atol=1e-5)
