"""Choosing among checkpoint plans that fit the budget by timing them.

The DTR simulation ranks plans by the compute they recompute (the paper's
cost model), which tracks step time where compute is the bottleneck, as on
a GPU. On a CPU it often does not: XLA fuses a recomputed forward into the
backward pass, and a step that stores fewer activations streams less
memory, so a plan that recomputes more can run faster than one that
recomputes less (docs/benchmarks.md). Autotuning measures instead of
predicting: every candidate's compiled step runs on example inputs of the
argument shapes, the candidates interleaved round by round so that machine
noise falls on all alike, and the fastest median wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import _jax_core


@dataclass(frozen=True)
class Timing:
    """One candidate plan's compiled step, as measured while autotuning.

    Attributes:
      compiled_bytes: XLA's argument + output + temporary bytes.
      seconds: median wall time of one step.
      segments: the plan's number of top-level checkpoint segments.
      chosen: whether this candidate became the plan.
      origin: "dtr" (read from a DTR simulation), "uniform" (evenly
        spaced segments that save nothing inside) or "costly" (the values
        dearest to recompute per byte saved); see `Plan.origin`.
    """

    compiled_bytes: int
    seconds: float
    segments: int
    chosen: bool = False
    origin: str = "dtr"


def can_autotune(structs: Sequence[jax.ShapeDtypeStruct]) -> bool:
    """Whether example inputs can be made for these argument shapes (PRNG
    keys only where their type says their implementation)."""
    return all(_jax_core.key_data_shape(s.dtype) is not None for s in structs if _is_key(s))


def _is_key(struct: jax.ShapeDtypeStruct) -> bool:
    return jnp.issubdtype(struct.dtype, jax.dtypes.prng_key)


def example_inputs(structs: Sequence[jax.ShapeDtypeStruct], seed: int = 0) -> list[jax.Array]:
    """Arrays of these shapes: small normal floats (no overflow, no NaN, so no
    slow paths), zero integers (valid indices) and keys of zero bits (of the
    keys' own implementation: random bits cost the same from any key).

    Made eagerly even while a `jax.jit` trace is being built, since the
    compiled steps they feed run now, during planning."""
    rng = np.random.default_rng(seed)
    arrays = []
    with jax.ensure_compile_time_eval():
        for s in structs:
            if _is_key(s):
                arrays.append(_jax_core.zero_keys(s.shape, s.dtype))
                continue
            if jnp.issubdtype(s.dtype, jnp.inexact):
                host = (0.1 * rng.standard_normal(s.shape)).astype(s.dtype)
            else:
                host = np.zeros(s.shape, s.dtype)
            arrays.append(jax.device_put(host, _placement(s)))
    return arrays


def _placement(struct: jax.ShapeDtypeStruct):
    """Where an example input goes: the spec's sharding where it is over
    concrete devices (a compiled step for sharded arguments takes them so;
    others would be moved, and under a jit's trace that move is traced),
    else the default device."""
    sharding = getattr(struct, "sharding", None)
    return None if _jax_core.on_abstract_mesh(sharding) else sharding


# A candidate whose warm-up run takes this many times the fastest one's is
# not timed again: it cannot win, and repeating it could cost more than the
# rest of planning (a convolution's gradient under a `cond` on the CPU, 20x).
# It runs once more first: an executable's first run also pays a one-time
# cost (60-95 ms on the CPU for a 3-block transformer's step that then takes
# 5-8 ms), which a candidate timed before in the process (planning the same
# step at another budget) paid already; judged by that run, a new candidate,
# smaller than the plan kept and as fast, was dropped at 13x its time
# (docs/benchmarks.md, "Autotuning times a new candidate as the others").
SLOW_WARMUP = 4.0
# One whose warm-up and first timed run both take this many times the
# fastest first run is not timed again either: two slow runs in a row are
# seldom noise (where they are, the plan kept is within that noise of the
# one dropped), and the rounds left would cost most of the timing (on a
# ResNet, 3 of 6 candidates ran 1.3-1.6x the fastest). (A warm-up that is an
# executable's first run is often that slow by its one-time cost alone: the
# first round then decides.)
SLOW_FIRST_ROUND = 1.25


def median_step_seconds(
    executables: Sequence[Any],
    inputs: Sequence[jax.Array],
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Median wall time of each compiled step over `repeats` interleaved rounds
    (after one warm-up run each, which also faults in its memory); a step
    whose warm-up, and a second run after it, took `SLOW_WARMUP` times the
    fastest warm-up keeps that time, and one whose warm-up and first round
    both took `SLOW_FIRST_ROUND` times the fastest first round keeps the
    times it has (successive halving). `clock` reads seconds (a test's own
    clock)."""

    def seconds(exe) -> float:
        start = clock()
        jax.block_until_ready(exe(*inputs))
        return clock() - start

    warmups = [seconds(exe) for exe in executables]
    fastest = min(warmups, default=0.0)
    # What looks slow may be a first run's one-time cost: its second run says.
    warmups = [seconds(exe) if w > SLOW_WARMUP * fastest else w for exe, w in zip(executables, warmups)]
    timed = [w <= SLOW_WARMUP * fastest for w in warmups]
    samples: list[list[float]] = [[] if t else [w] for t, w in zip(timed, warmups)]
    for round_ in range(repeats):
        for exe, times, t in zip(executables, samples, timed):
            if t:
                times.append(seconds(exe))
        if round_ == 0:
            first = min((times[0] for times, t in zip(samples, timed) if t), default=0.0)
            timed = [
                t and not (w > SLOW_FIRST_ROUND * first and times[0] > SLOW_FIRST_ROUND * first)
                for t, w, times in zip(timed, warmups, samples)
            ]
    return [float(np.median(times)) for times in samples]
