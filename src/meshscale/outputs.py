"""Files a command writes for its user, checked before any work starts: a path in a missing or read-only
directory is one line (exit 2), and a file already there is replaced only when the user passed --overwrite."""

import os
from pathlib import Path

from meshscale.errors import UserError


def check_directory(flag: str, path: str | Path) -> None:
    """`path`'s directory exists and can take a new file (as root, permission bits do not stop a write, but a
    read-only file system does: access(2) says so)."""
    parent = Path(path).absolute().parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} does not exist or is not a directory; choose a path in an "
                        "existing directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: directory {parent} is not writable (permissions or a read-only file "
                        "system); choose another place")


def check_new_file(flag: str, path: str | Path, overwrite: bool) -> None:
    """`check_directory`, and no file at `path` unless `overwrite`."""
    check_directory(flag, path)
    if Path(path).exists() and not overwrite:
        raise UserError(f"{flag} {path} already exists; choose a new name or pass --overwrite")


def check_outputs(args, *names: str) -> None:
    """Each file option among `names` (argparse dests, e.g. "plot") the user gave, by `check_new_file`."""
    for name in names:
        if path := getattr(args, name):
            check_new_file("--" + name.replace("_", "-"), path, args.overwrite)
