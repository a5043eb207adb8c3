"""`meshscale data`: train a byte-level BPE tokenizer on local text, tokenize text/JSONL/Parquet into
Megatron's indexed .bin/.idx format (the format `meshscale train --data PREFIX` reads), and inspect one."""

from pathlib import Path

import numpy as np

from meshscale.commands.progress import progress
from meshscale.data import indexed
from meshscale.data.sources import documents, input_files
from meshscale.data.tokenizer import load_tokenizer, train_bpe
from meshscale.errors import UserError
from meshscale.outputs import check_new_file

BATCH_CHARS = 1 << 20  # texts handed to the tokenizer together (it encodes a batch on every core)


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    tok = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer on local text; write tokenizer.json")
    _inputs(tok)
    tok.add_argument("--vocab", type=int, required=True, help="tokens in the vocabulary (at least 257)")
    tok.add_argument("--out", required=True, help="tokenizer.json file to write")
    tok.add_argument("--eos", default="<|endoftext|>", help="end-of-document token (default <|endoftext|>)")
    prep = sub.add_parser("prepare", help="tokenize documents into an indexed PREFIX.bin/PREFIX.idx pair")
    _inputs(prep)
    prep.add_argument("--tokenizer", required=True, help="tokenizer.json, or a directory holding one")
    prep.add_argument("--out", required=True, help="PREFIX: writes PREFIX.bin and PREFIX.idx")
    prep.add_argument("--eos", default=None, help="end-of-document token (default: the tokenizer's "
                                                  "<|endoftext|>, </s>, ... whichever it has)")
    for q in (tok, prep):
        q.add_argument("--overwrite", action="store_true", help="allow replacing existing output files")
    ins = sub.add_parser("inspect", help="counts, document lengths and the first document of a PREFIX.bin/.idx")
    ins.add_argument("prefix", help="PREFIX, PREFIX.bin or PREFIX.idx")
    ins.add_argument("--tokenizer", default=None, help="decode the first document and check ids against its vocabulary")


def _inputs(p) -> None:
    p.add_argument("inputs", nargs="+", help="text files, .jsonl/.json, .parquet, or directories of them")
    p.add_argument("--data-field", default="text", help="JSONL field / Parquet column holding the text (default text)")


def run(args) -> int:
    return {"tokenizer": train_tokenizer, "prepare": prepare, "inspect": inspect}[args.action](args)


def _files(args) -> list[Path]:
    return [f for path in args.inputs for f in input_files(path)]


def train_tokenizer(args) -> int:
    out = Path(args.out)
    check_new_file("--out", out, args.overwrite)
    files = _files(args)
    tokenizer = train_bpe((text for text, _ in documents(files, args.data_field)), args.vocab, args.eos)
    tokenizer.save(out)
    print(f"wrote {out}: byte-level BPE, {tokenizer.vocab} tokens, end of document {tokenizer.eos!r} "
          f"= id {tokenizer.eos_id}, learned from {len(files)} file(s)")
    return 0


def prepare(args) -> int:
    tokenizer = load_tokenizer(args.tokenizer, args.eos)
    bin_path, idx_path = indexed.paths(args.out)
    for f in (bin_path, idx_path):
        check_new_file("--out", f, args.overwrite)
    files = _files(args)
    total = sum(f.stat().st_size for f in files)
    counts = {"documents": 0, "empty": 0, "tokens": 0}

    def flush(batch):
        for ids in tokenizer.encode(batch):
            writer.add_document(ids + [tokenizer.eos_id])
            counts["tokens"] += len(ids) + 1
        counts["documents"] += len(batch)
        batch.clear()

    with (progress(total, "tokenizing", in_bytes=True) as advance,
          indexed.IndexedWriter(args.out, tokenizer.vocab) as writer):
        batch, chars = [], 0
        for text, at in documents(files, args.data_field):
            if not text:
                counts["empty"] += 1
                continue
            batch.append(text)
            chars += len(text)
            if chars >= BATCH_CHARS:
                flush(batch)
                chars = 0
            advance(at)
        flush(batch)
        if not counts["documents"]:
            raise UserError(f"{', '.join(args.inputs)}: no non-empty documents"
                            + (f" in field {args.data_field!r}" if args.data_field != "text" else ""))
        advance(total)
    empty = f"; {counts['empty']} empty document(s) left out" if counts["empty"] else ""
    print(f"wrote {bin_path} and {idx_path.name}: {counts['documents']:,} documents, {counts['tokens']:,} tokens "
          f"({writer.dtype.name}, each document ending in {tokenizer.eos!r} = id {tokenizer.eos_id}; "
          f"vocabulary {tokenizer.vocab}){empty}")
    return 0


def inspect(args) -> int:
    data = indexed.IndexedDataset(args.prefix)
    lengths = np.diff(data.doc_bounds)
    top = int(data.tokens.max())
    print(f"{data.bin_path} / {data.idx_path.name}: {data.documents:,} documents in {len(data.sizes):,} sequences, "
          f"{len(data.tokens):,} {data.dtype.name} tokens, ids {int(data.tokens.min())}..{top}")
    print(f"document length: min {lengths.min():,}  median {int(np.median(lengths)):,}  "
          f"mean {lengths.mean():,.1f}  max {lengths.max():,}")
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
        if top >= tokenizer.vocab:
            raise UserError(f"{data.bin_path}: token id {top} is beyond the {tokenizer.vocab}-token vocabulary of "
                            f"{args.tokenizer}; it was prepared with another tokenizer")
        print(f"first document: {tokenizer.decode(data.document(0)[:200])!r}")
    return 0
