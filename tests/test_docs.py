"""The docs: every console example is what its command prints today (or a labelled recorded run), the README's
links lead somewhere, every page is in the site's navigation, and the site builds strictly."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_examples_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "examples.py"), "--check"], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr


def test_readme_links_and_navigation():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) > 10
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, missing
    assert len(readme.splitlines()) < 200  # a front page (it was 1,203 lines); the rest lives in docs/
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages and all(f": {name}\n" in nav for name in pages), pages - set(re.findall(r": (\S+\.md)\n", nav))
    text = readme + "".join((ROOT / "docs" / name).read_text() for name in sorted(pages))
    labels = re.findall(r"^\*Recorded run.*", text, re.M)
    dated = [s for s in labels if re.match(r"\*Recorded run \(meshscale \S+, commit [\w-]+, \d{4}-\d\d-\d\d\)", s)]
    assert labels and dated == labels  # every training transcript says which code printed it, and when


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs-material is not installed (pip install '.[test]')")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "frameworks" / "index.html").is_file() and not (tmp_path / "examples.py").exists()
    assert (tmp_path / "checkpoints" / "index.html").is_file() and (tmp_path / "accuracy" / "index.html").is_file()
