"""Hypothesis profiles for the property tests (tests/test_properties.py).

"ci" (the default) is deterministic and short, so `make test` is
reproducible; "fuzz" draws thousands of random programs (`make fuzz`).
Select one with JDTR_HYPOTHESIS_PROFILE; JDTR_FUZZ_EXAMPLES sets how many
examples each property test draws under "fuzz".
"""

from __future__ import annotations

import gc
import math
import os

import jax
import pytest
from hypothesis import HealthCheck, settings

from jdtr.transform import rental, whole_choice

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


# JAX's persistent compilation cache (the Makefile's `WITH_XLA_CACHE`), one
# directory per pytest-xdist worker. JAX writes an entry in place, without
# a lock or a rename, so a worker that reads an entry while the other is
# still writing it gets a truncated stream and warns, and the warning,
# raised as an error by the suite's filters, failed CI once (JAX 0.6.0,
# "Error -5 while decompressing data"). Under its own worker's directory an
# entry is read only after it was written whole; the worker's subprocesses
# inherit the directory and run while the worker waits on them.
def _compilation_cache_per_worker() -> None:
    shared, worker = os.environ.get("JAX_COMPILATION_CACHE_DIR"), os.environ.get("PYTEST_XDIST_WORKER")
    if not shared or not worker:
        return
    own = os.path.join(shared, worker)
    os.makedirs(own, exist_ok=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = own
    jax.config.update("jax_compilation_cache_dir", own)


_compilation_cache_per_worker()


@pytest.fixture(autouse=True)
def compile_on_second_run(monkeypatch):
    """Plans compile their chunks on their second run, as with a compile
    estimated at nothing: whether the ski-rental rule (`rental.py`) has
    compiled by a given call depends on this machine's timings, and the
    tests check the runs on either side of it. tests/test_rental.py checks
    the rule itself with rates of its own."""
    monkeypatch.setattr(rental, "COMPILE_RATE", rental.CompileRate(0.0, weight=None))


@pytest.fixture(autouse=True)
def no_whole_trial_by_time(monkeypatch):
    """Under `chunks="auto"`, plans keep their chunks: when a plan's timed
    chunk runs pay for making its step as one program depends on this
    machine's timings (`whole_choice.py`). tests/test_whole_choice.py sets
    a price of its own."""
    monkeypatch.setattr(whole_choice, "WHOLE_PRICE", math.inf)


# Garbage collection over a worker's whole heap. A worker runs hundreds of
# tests and keeps what they compiled (JAX's caches, jdtr's traces and plans):
# half a million objects and more, which every full collection walks, the
# tests' own `gc.collect()` (before counting `jax.live_arrays()`) and
# Python's automatic ones alike. Measured: the fault tests spent 5 of their
# 9 s each in collections. Objects that survived into a test are frozen
# (`gc.freeze`: left out of every collection), so a collection walks what
# the current test made; every `FREEZE_EVERY` tests everything is thawed
# and collected once, so garbage frozen in a cycle is freed within that many
# tests. A test's own objects are never frozen while it runs, so what it
# checks by collecting (buffers freed, functions not kept alive) is what it
# made and is collected as before.
FREEZE_EVERY = 25
_tests_since_thaw = [0]


def pytest_runtest_setup(item):
    _tests_since_thaw[0] += 1
    if _tests_since_thaw[0] >= FREEZE_EVERY:
        _tests_since_thaw[0] = 0
        gc.unfreeze()
        gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """The tests marked `long` first, the others in their order. pytest-xdist's
    `--dist worksteal` hands each worker a contiguous half of the collection
    and steals from the end of a queue, so a test of a minute or two collected
    late (test_sharded.py's, on 8 devices in a subprocess) could run last on
    one worker while the other has nothing left to take."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
