# Quick start: `make demo` then `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/train_mlp.py

test: $(STAMP)
	$(PY) -m pytest -n 2 tests

bench: $(STAMP)
	$(PY) benchmarks/grad_benchmark.py --output docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache
