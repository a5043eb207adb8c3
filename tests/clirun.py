"""The meshscale command line run inside the test process: its exit code, stdout and stderr as
`subprocess.run` would give them, without starting an interpreter and importing everything again (a
second per call on a quiet machine, many under the suite's load). Tests that must see a real process
(no torch imported, signals, launchers) still start one."""

import contextlib
import io
from subprocess import CompletedProcess

from meshscale.cli import main


def run_cli(*args) -> CompletedProcess:
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as end:  # argparse and `fail` end this way
            code = end.code if isinstance(end.code, int) else int(end.code is not None)
    return CompletedProcess(argv, code, out.getvalue(), err.getvalue())
