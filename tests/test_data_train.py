"""A tokenized corpus trains through `meshscale train`: JSONL and Parquet files prepared into Megatron's
.bin/.idx by `meshscale data`, trained with and without document-boundary masking, and a run stopped and
resumed from its checkpoint reproduces the uninterrupted one exactly."""

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = Path(sysconfig.get_paths()["stdlib"])
MODEL = {"name": "tiny-bpe", "layers": 2, "hidden": 64, "heads": 8, "kv_heads": 4, "ffn": 176, "vocab": 512, "seq": 64}


def meshscale(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "meshscale", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A BPE of 512 tokens trained on the json and email packages' sources; their paragraphs (1,417
    documents of 290 characters on average, so a window of 64 tokens spans several) as JSONL and as Parquet,
    prepared into one indexed dataset."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = tmp_path_factory.mktemp("corpus")
    files = sorted((STDLIB / "json").glob("*.py")) + sorted((STDLIB / "email").glob("*.py"))
    texts = [part for f in files for part in f.read_text().split("\n\n") if part.strip()]
    half = len(texts) // 2
    (where / "a.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in texts[:half]))
    pq.write_table(pa.table({"body": texts[half:]}), where / "b.parquet")
    for step in (["tokenizer", "--vocab", 512, "--out", "tok.json"],
                 ["prepare", "--tokenizer", "tok.json", "--out", "corpus"]):
        out = meshscale("data", step[0], "a.jsonl", "b.parquet", "--data-field", "body", *step[1:], cwd=where)
        assert out.returncode == 0, out.stderr
    (where / "model.json").write_text(json.dumps(MODEL))
    return where


def train(corpus, name, *extra):
    out = meshscale("train", "--model", "model.json", "--data", "corpus", "--global-batch", 4, "--seed", 3,
                    "--lr", 1e-2, "--warmup", 2, "--val-batches", 2, "--metrics-out", f"{name}.jsonl", *extra,
                    cwd=corpus)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in (corpus / f"{name}.jsonl").read_text().splitlines()]
    val = re.search(r"validation loss (\S+)", out.stdout).group(1)
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows if "step" in r], val


def test_tokenized_corpus_trains_and_resumes_exactly(corpus):
    whole, whole_val = train(corpus, "whole", "--steps", 6, "--document-mask")
    assert whole[-1][1] < whole[0][1] - 0.3 and whole[0][1] == pytest.approx(6.24, abs=0.3)  # ln 512 = 6.24
    first, _ = train(corpus, "cut", "--steps", 3, "--document-mask", "--checkpoint-dir", "ckpt",
                     "--checkpoint-every", 3)
    # --steps is part of the LR schedule a resume checks: continuing past the cut is a deliberate change
    resumed, resumed_val = train(corpus, "cut", "--steps", 6, "--document-mask", "--checkpoint-dir", "ckpt",
                                 "--allow-config-change")
    assert first == whole[:3] and resumed == whole  # the resumed run continues the metrics file bit-exactly
    assert resumed_val == whole_val
    unmasked, _ = train(corpus, "unmasked", "--steps", 2)  # same tokens; documents now see their neighbours
    assert unmasked != whole[:2] and unmasked[1][1] == pytest.approx(whole[1][1], abs=0.05)


@pytest.mark.parametrize("args, needle", [
    (["--data", "a.jsonl"], "tokenize .jsonl files first: meshscale data prepare a.jsonl"),
    (["--data", "corpus", "--model", "tiny"], "token id 511 does not fit the model's vocabulary of 256"),
    (["--data", "empty.bin"], "empty file, no tokens"),
    (["--data", "corpus", "--document-mask", "--nproc", 2, "--layout", "pp=2"], "without pipeline or context"),
    (["--document-mask"], "--document-mask needs documents"),
])
def test_bad_data_for_train_is_one_line(corpus, args, needle, monkeypatch, capsys):
    from meshscale.cli import main

    (corpus / "empty.bin").write_bytes(b"")
    monkeypatch.chdir(corpus)
    with pytest.raises(SystemExit) as end:  # refused before any process starts: checked in this one
        main(["train", "--model", "model.json", *map(str, args)])
    err = capsys.readouterr().err
    assert end.value.code == 2 and needle in err and err.count("\n") == 1, err
