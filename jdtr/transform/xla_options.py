"""Compiler options for the executables of single equations that jdtr
compiles itself (`executable.py`): a first call compiles one per distinct
equation and runs them step by step, where `jax.jit` compiles one program.

On the CPU, XLA's fusion emitters (its default in JAX 0.10; JAX 0.6 still
used the older ones) take 1.5-2x as long to compile a small elementwise
program as its older emitters (a tanh over 128K floats: 48 ms against
27 ms), so a new structure's first call takes 25-35% longer with them
(docs/benchmarks.md, "Compiling jdtr's own programs"). So on the CPU jdtr
asks for the older emitters for these executables only. A plan's chunks
(`chunks.py`), runs of hundreds of equations with their matmuls, keep
XLA's defaults: with the older emitters an MLP of 64 layers of width 32
ran its compiled step 20-25% slower and compiled its chunks in 5.5 s
against 0.6 s (a matmul followed by a `tanh` compiles 16x slower with
them); other models' steps ran as fast or slower (up to 13%) with them,
and their chunks compiled up to 2x faster, once. The caller's `jax.jit`
programs, and those `remat_grad` measures, keep XLA's defaults too.

Where the caller sets the flag in `XLA_FLAGS`, theirs stands. Where this
XLA does not know the flag (it is a debug option, and JAX 0.11.2's XLA has
dropped it: "No such compile option"), nothing is asked: a program compiled
once with it decides. (`accepted` is that check, which `compiled` also
asks of the options it measures plans with.)
"""

from __future__ import annotations

import os
import threading
from typing import Optional

import jax
import jax.numpy as jnp

# Asked on the CPU only: on a GPU the flag means nothing, and XLA's own
# choices for its kernels stand. A benchmark sets this to {} to compare.
CPU_OPTIONS: dict[str, object] = {"xla_cpu_use_fusion_emitters": False}

_LOCK = threading.Lock()
_CHOSEN: Optional[dict[str, object]] = None


def compiler_options() -> dict[str, object]:
    """The options jdtr's own compilations pass to XLA (empty: none)."""
    global _CHOSEN
    with _LOCK:
        if _CHOSEN is None:
            _CHOSEN = _choose()
        return _CHOSEN


def _choose() -> dict[str, object]:
    if not CPU_OPTIONS or jax.default_backend() != "cpu":
        return {}
    flags = os.environ.get("XLA_FLAGS", "")
    options = {name: value for name, value in CPU_OPTIONS.items() if name not in flags}
    return options if options and accepted(options) else {}


def accepted(options: dict[str, object]) -> bool:
    """Whether this XLA compiles with `options`: one it does not know is an
    error at compile time (whichever error it raises, the options are not asked)."""
    try:
        jax.jit(jnp.negative).lower(jax.ShapeDtypeStruct((), jnp.float32)).compile(options)
    except Exception:  # noqa: BLE001
        return False
    return True
