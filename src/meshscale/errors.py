"""User-facing errors: one clear line on stderr, exit code 2, never a traceback."""

import sys
from typing import NoReturn


class UserError(ValueError):
    """Bad input from the user. The message says what is wrong and how to fix it."""


def fail(message: str) -> NoReturn:
    print(f"meshscale: error: {message}", file=sys.stderr)
    raise SystemExit(2)
