"""The docs site: every console example is what its command prints today, and the site builds strictly."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_examples_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "examples.py"), "--check"], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs-material is not installed (pip install '.[test]')")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "frameworks" / "index.html").is_file() and not (tmp_path / "examples.py").exists()
