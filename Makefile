# Quick start: `make demo` then `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test fuzz bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/train_mlp.py

test: $(STAMP)
	$(PY) -m pytest -n 2 tests

# The property tests at length: FUZZ_EXAMPLES random programs per test (each
# run under every heuristic); see docs/robustness.md.
FUZZ_EXAMPLES ?= 2000
fuzz: $(STAMP)
	JDTR_HYPOTHESIS_PROFILE=fuzz JDTR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
		$(PY) -m pytest -n 2 tests/test_properties.py -k match_jax --hypothesis-show-statistics

bench: $(STAMP)
	$(PY) benchmarks/grad_benchmark.py --output docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache
