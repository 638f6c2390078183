"""Compiling candidate steps and reading XLA's memory for them (`memory_analysis()`)."""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Callable, Iterable, Sequence

import jax

def lower(fn: Callable, specs: Sequence[jax.ShapeDtypeStruct]) -> Any:
    """`fn` jitted and lowered for arguments of these shapes."""
    return jax.jit(fn).lower(*specs)


def compile_all(lowered: Iterable[Any]) -> list[tuple[Any, int]]:
    """Compiles in threads, each program as soon as `lowered` yields it: XLA
    compiles without the GIL, so candidates overlap each other and the
    Python that lowers (or chooses) the next ones."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = [pool.submit(lambda x: _compiled_and_bytes(x.compile()), x) for x in lowered]
        return [f.result() for f in futures]


def _compiled_and_bytes(compiled: Any) -> tuple[Any, int]:
    analysis = compiled.memory_analysis()
    if analysis is None:  # some backends do not report
        return compiled, 0
    nbytes = analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
    return compiled, int(nbytes - analysis.alias_size_in_bytes)


def compiled_sizes(fn: Callable, specs: Sequence) -> tuple[int, int]:
    """XLA's bytes for `fn` compiled for these shapes: all of them, and its
    arguments and outputs alone (0 where the backend does not report)."""
    compiled = lower(fn, specs).compile()
    analysis = compiled.memory_analysis()
    fixed = 0 if analysis is None else analysis.argument_size_in_bytes + analysis.output_size_in_bytes
    return _compiled_and_bytes(compiled)[1], int(fixed - (analysis.alias_size_in_bytes if analysis else 0))


def compiled_bytes(fn: Callable, specs: Sequence) -> int:
    """XLA's argument + output + temporary bytes for `fn` compiled for these shapes."""
    return _compiled_and_bytes(lower(fn, specs).compile())[1]
