# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[train,test]"
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q -n 2 --dist loadscope

demo: setup
	$(PY) -m meshscale.demo

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
