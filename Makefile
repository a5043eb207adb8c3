# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test demo docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[train,test]"
	# The frameworks whose own loaders read `--emit`'s configs (tests/test_export.py), without their
	# dependencies so that torch stays the wheel above; their light dependencies are in the test extra.
	$(PY) -m pip install -q --no-deps "torchtitan==0.2.2" "megatron-core==0.16.1"
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-deps --no-build-isolation "deepspeed==0.19.8"
	touch $(STAMP)

test: setup
	$(PY) -m mypy
	$(PY) -m pytest -q -n 2 --dist loadscope

# The docs site (mkdocs-material) into build/site, every console example re-run first.
docs: setup
	$(PY) docs/examples.py
	$(PY) -m mkdocs build --strict

demo: setup
	$(PY) -m meshscale.demo

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
