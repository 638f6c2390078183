# Quick start: `make demo` then `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-oldest-jax fuzz bench notebooks clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/train_mlp.py

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist worksteal tests

# The oldest JAX that pyproject.toml accepts, in a venv of its own, on the
# tests that exercise JAX's internals (CI runs this after `make test`).
OLDEST_JAX := 0.6.0
OLDEST := .venv-oldest-jax
OLDEST_JAX_TESTS := tests/test_primitives.py tests/test_api.py tests/test_lowering.py tests/test_paths.py tests/test_runtime.py
$(OLDEST)/.installed: pyproject.toml
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet "jax[cpu]==$(OLDEST_JAX)" "numpy>=1.24" "pytest>=8" "pytest-xdist>=3.2" "hypothesis>=6" "scipy>=1.11"
	$(OLDEST)/bin/python -m pip install --quiet --no-deps -e .
	touch $(OLDEST)/.installed

test-oldest-jax: $(OLDEST)/.installed
	$(OLDEST)/bin/python -c "import jax; assert jax.__version__ == '$(OLDEST_JAX)', jax.__version__"
	$(OLDEST)/bin/python -m pytest -n 2 --dist worksteal $(OLDEST_JAX_TESTS)

# The property tests at length: FUZZ_EXAMPLES random programs per test (each
# run under every heuristic, and planned for jax.jit); see docs/robustness.md.
FUZZ_EXAMPLES ?= 2000
fuzz: $(STAMP)
	JDTR_HYPOTHESIS_PROFILE=fuzz JDTR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
		$(PY) -m pytest -n 2 --dist worksteal tests/test_properties.py tests/test_plan_properties.py -k match_jax --hypothesis-show-statistics

bench: $(STAMP)
	$(PY) benchmarks/grad_benchmark.py --output docs/benchmarks.md

# The notebooks executed in place, committed with their outputs (tests re-run them).
notebooks: $(STAMP)
	$(PY) notebooks/execute.py

clean:
	rm -rf $(VENV) $(OLDEST) .pytest_cache
