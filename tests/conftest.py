"""Hypothesis profiles for the property tests (tests/test_properties.py).

"ci" (the default) is deterministic and short, so `make test` is
reproducible; "fuzz" draws thousands of random programs (`make fuzz`).
Select one with JDTR_HYPOTHESIS_PROFILE; JDTR_FUZZ_EXAMPLES sets how many
examples each property test draws under "fuzz".
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from hypothesis import HealthCheck, settings

_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci",
    max_examples=6,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("JDTR_FUZZ_EXAMPLES", "2000")),
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)
settings.load_profile(os.environ.get("JDTR_HYPOTHESIS_PROFILE", "ci"))


# XLA's programs compiled once per test run, shared by the run's processes:
# the pytest-xdist workers, and the examples, notebooks and multi-device
# checks run in subprocesses, which plan and compile the same models at the
# same budgets (identical chunks: identical programs). JAX's persistent
# compilation cache, in a directory of the run's own, removed at its end.
# What a test reads of a compiled program is the same from the cache
# (`memory_analysis()` included); jdtr's own caches are untouched.
_XLA_CACHE = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    if hasattr(config, "workerinput") or os.environ.get(_XLA_CACHE):
        return  # a worker (it inherits the controller's), or one chosen by the caller
    config._jdtr_xla_cache = tempfile.mkdtemp(prefix="jdtr-tests-xla-")
    os.environ[_XLA_CACHE] = config._jdtr_xla_cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # a chunk compiles in 0.1-0.3 s
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    if "jax" in sys.modules:  # imported already (a plugin): it read its flags then
        import jax

        jax.config.update("jax_compilation_cache_dir", config._jdtr_xla_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    directory = getattr(config, "_jdtr_xla_cache", None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop(_XLA_CACHE, None)
