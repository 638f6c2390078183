"""Compiling candidate steps and reading XLA's memory for them (`memory_analysis()`).

Most of what the planner compiles is only measured: its bytes decide, and
it never runs (the search's plans, `jax.grad`'s own step). On the CPU those
compile with LLVM's optimizations off. XLA's buffer assignment, which
`memory_analysis()` reports, is made by its HLO passes before any code is
generated, and `xla_backend_optimization_level` sets only how hard LLVM
optimizes the code: at 0 the gradient of the 4-block test transformer
compiles in 1.7 s against 3.0-3.4 s, and a small ResNet's in 0.8-1.0 s
against 1.7-2.1 s, to the same bytes (tests/test_plan.py compares them
with the caller's jit's on its models' plans). What runs, the candidates autotuning
times and the caller's own `jax.jit`, keeps XLA's defaults. Other backends
keep them for everything: the GPU's choice of convolution algorithms sizes
its scratch, and that is not verified there.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import jax

from .xla_options import accepted


@dataclass(frozen=True)
class CompiledStep:
    """A compiled step's bytes by XLA's analysis, and its executable where it was compiled to run."""

    nbytes: int
    executable: Optional[Any] = None  # None: compiled only to be measured


# Options for programs only measured, on the CPU (read once per backend).
MEASURE_OPTIONS: dict[str, object] = {"xla_backend_optimization_level": 0}


@functools.lru_cache(maxsize=None)
def _measure_options(backend: str) -> Optional[tuple[tuple[str, object], ...]]:
    if backend != "cpu" or not MEASURE_OPTIONS:
        return None
    return tuple(sorted(MEASURE_OPTIONS.items())) if accepted(MEASURE_OPTIONS) else None


def measure_options() -> Optional[dict[str, object]]:
    """Compiler options for a program whose bytes are read and which never runs (None: XLA's defaults)."""
    options = _measure_options(jax.default_backend())
    return None if options is None else dict(options)


def lower(fn: Callable, specs: Sequence[jax.ShapeDtypeStruct]) -> Any:
    """`fn` jitted and lowered for arguments of these shapes."""
    return jax.jit(fn).lower(*specs)


def compile_all(lowered: Iterable[Any], options: Optional[dict] = None) -> list[tuple[Any, int]]:
    """Compiles in threads, each program as soon as `lowered` yields it: XLA
    compiles without the GIL, so candidates overlap each other and the
    Python that lowers (or chooses) the next ones."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = [pool.submit(lambda x: _compiled_and_bytes(x.compile(options)), x) for x in lowered]
        return [f.result() for f in futures]


def _compiled_and_bytes(compiled: Any) -> tuple[Any, int]:
    analysis = compiled.memory_analysis()
    if analysis is None:  # some backends do not report
        return compiled, 0
    nbytes = analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
    return compiled, int(nbytes - analysis.alias_size_in_bytes)


def executable_bytes(compiled: Any) -> int:
    """XLA's argument + output + temporary bytes of a compiled program, less its aliases."""
    return _compiled_and_bytes(compiled)[1]


def compiled_to_measure(fn: Callable, specs: Sequence) -> Any:
    """`fn` compiled for these shapes to be read (bytes, placements), never
    run: with `measure_options`."""
    return lower(fn, specs).compile(measure_options())


def compiled_sizes(fn: Callable, specs: Sequence) -> tuple[int, int]:
    """XLA's bytes for `fn` compiled for these shapes (to be measured, not
    run): all of them, and its arguments and outputs alone (0 where the
    backend does not report)."""
    compiled = compiled_to_measure(fn, specs)
    analysis = compiled.memory_analysis()
    fixed = 0 if analysis is None else analysis.argument_size_in_bytes + analysis.output_size_in_bytes
    return _compiled_and_bytes(compiled)[1], int(fixed - (analysis.alias_size_in_bytes if analysis else 0))


def compiled_bytes(fn: Callable, specs: Sequence) -> int:
    """XLA's argument + output + temporary bytes for `fn` compiled for these shapes (to be measured, not run)."""
    return _compiled_and_bytes(compiled_to_measure(fn, specs))[1]
