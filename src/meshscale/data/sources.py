"""Documents from the user's files: plain text (a file is a document), JSON Lines (an object a line, its
text in --data-field) and Parquet (the --data-field column, read a row group at a time). Each document
comes with the input bytes read so far, for a progress bar. Anything that is not what it claims to be
is one UserError naming the file (and line), never a document of garbage."""

import json
from collections.abc import Iterator
from pathlib import Path

from meshscale.errors import UserError

JSONL = (".jsonl", ".json", ".ndjson")
PARQUET = (".parquet",)
TOKENIZED = (".bin", ".idx")


def input_files(path: str | Path) -> list[Path]:
    """A file, or the files under a directory in sorted order (hidden ones left out)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{path}: no such file or directory; "
                        "pass text, .jsonl or .parquet files or a directory of them")
    files = [p] if p.is_file() else sorted(
        f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts))
    if not files:
        raise UserError(f"{path}: directory holds no files")
    for f in files:
        if f.suffix in TOKENIZED:
            raise UserError(f"{f}: already tokenized ({f.suffix}); prepare reads text, .jsonl or .parquet — "
                            "train on a .bin/.idx pair directly with `meshscale train --data PREFIX`")
    return files


def documents(files: list[Path], field: str = "text") -> Iterator[tuple[str, int]]:
    """(text, input bytes consumed so far) for every document of every file, in order."""
    done = 0
    for f in files:
        size = f.stat().st_size
        if size == 0:
            raise UserError(f"{f}: empty file; remove it or give a file with documents in it")
        read = _parquet if f.suffix in PARQUET else _jsonl if f.suffix in JSONL else _text
        for text, at in read(f, field):
            yield text, done + at
        done += size


def _decode(raw: bytes, where: str) -> str:
    if b"\0" in raw[:4096]:
        raise UserError(f"{where}: binary data (NUL bytes), not text; pass text, .jsonl or .parquet files")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                        "convert it to UTF-8 first") from None


def _text(f: Path, field: str):
    raw = f.read_bytes()
    yield _decode(raw, str(f)), len(raw)


def _jsonl(f: Path, field: str):
    at = 0
    with open(f, "rb") as stream:
        for number, raw in enumerate(stream, 1):
            at += len(raw)
            where = f"{f}:{number}"
            line = _decode(raw, where).strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                hint = " (a JSON array: write one object per line)" if number == 1 and line.startswith("[") else ""
                raise UserError(f"{where}: not a JSON object{hint}: {e.msg}") from None
            yield _field(record, field, where), at


def _field(record, field: str, where: str) -> str:
    if isinstance(record, list):
        raise UserError(f"{where}: a JSON array; write one object per line (JSON Lines)")
    if not isinstance(record, dict):
        raise UserError(f"{where}: a {type(record).__name__}, not a JSON object with a {field!r} field")
    if field not in record:
        raise UserError(f"{where}: no field {field!r} (fields: {', '.join(map(repr, record)) or 'none'}); "
                        "name the text field with --data-field")
    text = record[field]
    if not isinstance(text, str):
        raise UserError(f"{where}: field {field!r} is a {type(text).__name__}, not text; choose a text field "
                        "with --data-field")
    return text


def _parquet(f: Path, field: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(f)
    except (pa.ArrowInvalid, OSError) as e:
        raise UserError(f"{f}: not a Parquet file ({e})") from None
    schema = table.schema_arrow
    if field not in schema.names:
        raise UserError(f"{f}: no column {field!r} (columns: {', '.join(map(repr, schema.names))}); name the "
                        "text column with --data-field")
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise UserError(f"{f}: column {field!r} holds {kind}, not text; choose a text column with --data-field")
    size, groups = f.stat().st_size, table.num_row_groups
    for g in range(groups):
        for text in table.read_row_group(g, columns=[field]).column(0).to_pylist():
            yield text or "", size * g // groups  # a null row is an empty document
