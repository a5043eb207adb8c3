"""Read JSON or TOML files into dicts, turning every read or parse failure into a UserError."""

import json
import weakref
from dataclasses import MISSING, is_dataclass
from pathlib import Path

from meshscale.errors import UserError


def read_mapping(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"file not found: {path}; pass an existing .json or .toml file")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib  # here, not at the top: every command imports this module, few read TOML (~15 ms)
            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as e:  # json.JSONDecodeError and tomllib.TOMLDecodeError both are ValueErrors
        raise UserError(f"cannot parse {path}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold an object/table at the top level")
    return data


def looks_like_path(name: str) -> bool:
    return name.endswith((".json", ".toml")) or "/" in name


def read_spec_file(name_or_path: str, presets: dict, kind: str) -> dict:
    """The mapping in a spec file, for a name that is not one of `presets`; a name that does not look like a
    path either is a UserError listing them."""
    if not looks_like_path(name_or_path):
        raise UserError(f"unknown {kind} preset {name_or_path!r}; choose one of {', '.join(presets)} "
                        "or pass a .json/.toml file")
    return read_mapping(name_or_path)


# What a file may give for a field of each scalar type (TOML and JSON integers are floats too; a boolean is
# neither, though Python counts it an int).
_ACCEPTS = {bool: (bool,), int: (int,), float: (int, float), str: (str,), tuple: (list, tuple, dict)}
_WHAT = {bool: "true or false", int: "an integer", float: "a number", str: "a string", tuple: "a list or a table"}


def build(cls, fields: dict, source: str, missing_hint: str = "", also_known: tuple = ()):
    """Construct dataclass `cls` from `fields`, naming unknown keys (beside the fields, `also_known`: keys the
    caller read itself), missing required ones (then `missing_hint`, what else the file could do) and mistyped
    values instead of raising TypeError (or failing later, in a comparison)."""
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        listed = ", ".join(sorted(known | set(also_known)))
        raise UserError(f"{source}: unknown field(s) {', '.join(unknown)}; known: {listed}")
    missing = [name for name, f in cls.__dataclass_fields__.items()
               if f.default is MISSING and f.default_factory is MISSING and name not in fields]
    if missing:
        raise UserError(f"{source}: missing field(s) {', '.join(missing)}{missing_hint}")
    for name, value in fields.items():
        kind = cls.__dataclass_fields__[name].type
        if type(None) in getattr(kind, "__args__", ()):  # `str | None` (a path): None, or the type's values
            if value is None:
                continue
            kind = next(a for a in kind.__args__ if a is not type(None))
        if isinstance(kind, type) and is_dataclass(kind):  # a nested spec ([software]): its table, or one built
            if not isinstance(value, (dict, kind)):
                raise UserError(f"{source}: {name} must be a table of {kind.__name__} fields, got {value!r}")
            continue
        accepts = _ACCEPTS.get(kind)
        if accepts and (not isinstance(value, accepts) or (isinstance(value, bool) and bool not in accepts)):
            raise UserError(f"{source}: {name} must be {_WHAT[kind]}, got {value!r}")
    try:
        return cls(**fields)
    except TypeError as e:
        raise UserError(f"{source}: {e}") from None


# hash_once's cache, by object identity, outside the objects: in their __dict__ it would break a copy made from
# it (type(s)(**s.__dict__)) and travel in a pickle (strings hash differently in another process)
_HASHES: dict[int, int] = {}


def hash_once(spec) -> int:
    """`__hash__` of a frozen dataclass that keys the cost model's caches: the hash of its fields, computed once
    per object (a ClusterSpec with its tiers took microseconds a lookup, thousands of lookups a plan)."""
    try:
        return _HASHES[id(spec)]
    except KeyError:
        value = hash(tuple(getattr(spec, name) for name in spec.__dataclass_fields__))
        weakref.finalize(spec, _HASHES.pop, id(spec), None).atexit = False  # before its id is reused
        _HASHES[id(spec)] = value
        return value
