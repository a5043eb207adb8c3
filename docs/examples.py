"""Regenerate the output under every `$ meshscale ...` line of the docs' console blocks, so no example goes
stale: `python docs/examples.py` rewrites the pages, `--check` (run by tests/test_docs.py) only says which
blocks differ from what the commands print today."""

import os
import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).parent
ROOT = DOCS.parent
BLOCK = re.compile(r"```console\n\$ meshscale (?P<args>[^\n]*)\n(?P<output>.*?)```", re.S)


def output(args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "120"}
    r = subprocess.run([sys.executable, "-m", "meshscale", *args.split()], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=600)
    return r.stdout + r.stderr


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: f"```console\n$ meshscale {m['args']}\n{output(m['args'])}```", text)


def main(check: bool) -> int:
    stale = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        fresh = regenerate(text)
        if fresh != text:
            stale.append(page.name)
            if not check:
                page.write_text(fresh)
    if check and stale:
        print(f"stale examples in {', '.join(stale)}: run python docs/examples.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main("--check" in sys.argv[1:]))
