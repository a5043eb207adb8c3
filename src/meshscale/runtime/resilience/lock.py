"""One job per checkpoint directory: the process that starts a run (the launcher, or the one process) holds
an exclusive lock on DIR/meshscale.lock for the run's whole life, and writes its pid, host and start time
into it, so a second run on the same directory is refused in one line naming the holder.

The lock is flock(2): the kernel drops it when its holder exits, however it exits (kill -9 included), so
there is never a stale lock to clean by hand; the file itself stays, naming the last holder."""

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from meshscale.errors import UserError

LOCK = "meshscale.lock"


class DirLock:
    def __init__(self, root: str):
        self.path = Path(root) / LOCK
        self.fd: int | None = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(_in_use(self.path.parent, holder)) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        os.fsync(fd)
        self.fd = fd
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None


def refuse_if_held(root: str) -> None:
    """DirLock's refusal, without taking the lock or creating anything: checked before the directory's
    checkpoints are read, which a running holder may be writing (else a second run could be refused for
    what the first one saved meanwhile, not for the first one)."""
    path = Path(root) / LOCK
    if not path.exists():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserError(_in_use(path.parent, _holder(fd))) from None
    finally:
        os.close(fd)  # releases the probe's lock


def _in_use(root: Path, holder: str) -> str:
    return (f"--checkpoint-dir {root} is in use by another run ({holder}); wait for it to end or choose another "
            "directory")


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode())
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError):
        return "holder unknown"
