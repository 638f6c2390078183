"""Python's cyclic garbage collector, paused while jdtr builds a run.

Tracing, normalizing and simulating a program allocate hundreds of
thousands of small objects (tracers, equations, storages, heap entries). On
a process that holds JAX, each full collection walks every object it holds,
and allocation this fast triggers many: on a TreeLSTM's fresh tree they
took a fifth of the trace and of the plan (docs/benchmarks.md). Nothing in
these phases needs a collection (device buffers are freed by reference
count or by the run's own `delete()`), so the collector waits until they
end, and then collects what they left as usual.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Within (or around a function, as a decorator): no automatic collection.
    A collector already disabled (by the caller, or by another thread within
    this) is left as it is."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
