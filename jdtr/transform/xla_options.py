"""Compiler options for the programs jdtr compiles itself: its per-equation
executables (`executable.py`) and its chunks (`chunks.py`).

A planned run compiles many small programs where `jax.jit` compiles one: a
first call compiles an executable per distinct equation, a second call a few
dozen chunks. On the CPU, XLA's fusion emitters (its default in JAX 0.10;
JAX 0.6 still used the older ones) take 1.5-2x as long to compile a small
elementwise program as its older emitters (a tanh over 128K floats: 48 ms
against 27 ms), and the chunks of a transformer's plan 25-40% longer, for
the same run time (docs/benchmarks.md, "Compiling jdtr's own programs").
So on the CPU jdtr asks for the older emitters, for its own programs only:
the caller's `jax.jit` programs, and those `remat_grad` measures, keep
XLA's defaults.

Where the caller sets the flag in `XLA_FLAGS`, theirs stands. Where this
XLA does not know the flag (it is a debug option, and JAX 0.11.2's XLA has
dropped it: "No such compile option"), nothing is asked: a program compiled
once with it decides.
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
    if not options:
        return {}
    try:  # a flag this XLA does not know is an error at compile time
        jax.jit(jnp.negative).lower(jax.ShapeDtypeStruct((), jnp.float32)).compile(options)
    except Exception:  # noqa: BLE001  (whichever error this XLA raises: the flag is not asked)
        return {}
    return options
