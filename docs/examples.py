"""Keep every console example in the README and the docs what meshscale prints today.

Two kinds of ```console block:
- a live example, one `$ meshscale ...` command (planning side, seconds): `python docs/examples.py` rewrites its
  output, `--check` (run by tests/test_docs.py) says which pages differ from what the commands print now;
- a recorded run, under a line `*Recorded run ...*` naming the meshscale version and commit it came from:
  training transcripts, too slow for the test suite. `--all` re-runs them too, by hand: each `$ ` line through
  bash, in order, in one scratch directory per page (holding a link to the repository's `configs/`), so a
  page's runs may use the files its earlier runs wrote; `$?` is the previous command's exit code.
A console block of neither kind fails `--check`.
"""

import datetime
import os
from concurrent.futures import ThreadPoolExecutor
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).parent
ROOT = DOCS.parent
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
BLOCK = re.compile(r"(?P<label>^\*Recorded run[^\n]*\*\n\n)?```console\n(?P<body>.*?)```", re.S | re.M)
LIVE = re.compile(r"\$ meshscale (?P<args>[^\n]*)\n")
# What differs from run to run in a live example's output (the planner's own search time).
VOLATILE = re.compile(r"in \d+\.\d+ s;")


def env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "120",
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}


def run_live(args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "meshscale", *args.split()], capture_output=True, text=True,
                       cwd=ROOT, env=env(), timeout=600)
    return r.stdout + r.stderr


def commands(body: str) -> list[str]:
    """The `$ ` lines of a transcript, each with its `\\`-continued lines."""
    out: list[str] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            cmd = [lines[i]]
            while cmd[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd.append(lines[i])
            out.append("\n".join(cmd))
        i += 1
    return out


def rerun(body: str, scratch: Path) -> str:
    text, rc = [], 0
    for cmd in commands(body):
        r = subprocess.run(["bash", "-c", f"(exit {rc}); {cmd[2:]}"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, cwd=scratch, env=env(), timeout=1800)
        rc = r.returncode
        text.append(f"{cmd}\n{r.stdout}")
    return "".join(text)


def label() -> str:
    from meshscale import __version__
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)

    # the code that printed it: HEAD, "-dirty" when src/ differs from it (edits to the pages do not count)
    commit = git("rev-parse", "--short", "HEAD").stdout.strip()
    commit += "-dirty" if git("diff", "--quiet", "HEAD", "--", "src").returncode else ""
    return (f"*Recorded run (meshscale {__version__}, commit {commit}, {datetime.date.today()}); "
            f"`python docs/examples.py --all` re-runs it.*\n\n")


def live_outputs(pages: list[Path]) -> dict[str, str]:
    """Every live example's output, two commands at a time (each is one process, mostly importing)."""
    wanted = {live["args"] for page in pages for m in BLOCK.finditer(page.read_text()) if not m["label"]
              and (live := LIVE.match(m["body"]))}
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(wanted, pool.map(run_live, wanted)))


def regenerate(page: Path, text: str, recorded: bool, bad: list[str], outputs: dict[str, str]) -> str:
    with tempfile.TemporaryDirectory(prefix="meshscale-docs-") as scratch:
        (Path(scratch) / "configs").symlink_to(ROOT / "configs")

        def one(m: re.Match[str]) -> str:
            if m["label"]:
                if not recorded:
                    return m[0]
                print(f"{page.name}: re-running {commands(m['body'])[0]}", file=sys.stderr)
                return f"{label()}```console\n{rerun(m['body'], Path(scratch))}```"
            live = LIVE.match(m["body"])
            if not live:
                bad.append(f"{page.name}: a console block is neither one `$ meshscale` command nor under a "
                           f"'*Recorded run ...*' line: {m['body'].splitlines()[:1]}")
                return m[0]
            out = outputs[live["args"]] if live["args"] in outputs else run_live(live["args"])
            return f"```console\n$ meshscale {live['args']}\n{out}```"

        return BLOCK.sub(one, text)


def main(argv: list[str]) -> int:
    check, recorded = "--check" in argv, "--all" in argv
    stale: list[str] = []
    bad: list[str] = []
    outputs = live_outputs(PAGES)
    for page in PAGES:
        text = page.read_text()
        fresh = regenerate(page, text, recorded and not check, bad, outputs)
        if VOLATILE.sub("", fresh) != VOLATILE.sub("", text):
            stale.append(page.name)
            if not check:
                page.write_text(fresh)
    for line in bad:
        print(line, file=sys.stderr)
    if check and stale:
        print(f"stale examples in {', '.join(stale)}: run python docs/examples.py", file=sys.stderr)
    return 1 if bad or (check and stale) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
