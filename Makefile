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

# The tests share JAX's persistent compilation cache, in a directory of
# their own for the run: the same programs (a model's equations, jax.grad's
# reference steps, the subprocesses' meshes) are compiled by many tests, on
# both workers. On 2 cores pytest took 754 s instead of 877 s side by side,
# and 801-835 s in CI against 867-884 s before, with the same results
# (docs/benchmarks.md, "A process started again"). Fresh each run, so
# nothing is read back from an earlier one. Each pytest-xdist worker keeps a
# directory of its own under it (tests/conftest.py): JAX writes an entry in
# place, and a worker reading what the other was still writing failed CI.
WITH_XLA_CACHE = cache=$$(mktemp -d) && trap 'rm -rf "$$cache"' EXIT && \
	JAX_COMPILATION_CACHE_DIR="$$cache" JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
	JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1

test: $(STAMP)
	$(WITH_XLA_CACHE) $(PY) -m pytest -n 2 --dist worksteal --durations=30 tests

# The oldest JAX that pyproject.toml accepts, in a venv of its own, on the
# tests that exercise JAX's internals (CI runs this after `make test`).
OLDEST_JAX := 0.6.0
OLDEST := .venv-oldest-jax
OLDEST_JAX_TESTS := tests/test_primitives.py tests/test_api.py tests/test_lowering.py tests/test_paths.py tests/test_runtime.py tests/test_pooling.py tests/test_repeats.py
$(OLDEST)/.installed: pyproject.toml
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet "jax[cpu]==$(OLDEST_JAX)" "numpy>=1.24" "pytest>=8" "pytest-xdist>=3.2" "hypothesis>=6" "scipy>=1.11"
	$(OLDEST)/bin/python -m pip install --quiet --no-deps -e .
	touch $(OLDEST)/.installed

test-oldest-jax: $(OLDEST)/.installed
	$(OLDEST)/bin/python -c "import jax; assert jax.__version__ == '$(OLDEST_JAX)', jax.__version__"
	$(WITH_XLA_CACHE) $(OLDEST)/bin/python -m pytest -n 2 --dist worksteal $(OLDEST_JAX_TESTS)

# The property tests at length: FUZZ_EXAMPLES random programs per test (each
# run under every heuristic, and planned for jax.jit); see docs/robustness.md.
FUZZ_EXAMPLES ?= 2000
fuzz: $(STAMP)
	$(WITH_XLA_CACHE) JDTR_HYPOTHESIS_PROFILE=fuzz JDTR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
		$(PY) -m pytest -n 2 --dist worksteal tests/test_properties.py tests/test_plan_properties.py -k match_jax --hypothesis-show-statistics

bench: $(STAMP)
	$(PY) benchmarks/grad_benchmark.py --output docs/benchmarks.md

# The notebooks executed in place, committed with their outputs (tests re-run them).
notebooks: $(STAMP)
	$(PY) notebooks/execute.py

clean:
	rm -rf $(VENV) $(OLDEST) .pytest_cache
