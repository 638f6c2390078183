"""When a plan's chunks are worth compiling: the ski-rental rule.

A plan runs step by step (one dispatch of a cached executable per
equation) or as compiled chunks (`chunks.py`: one XLA program per run of
steps). Chunks run faster, but compiling them costs seconds, and a
structure that is called a few times (a test, an example, a recursive
model's tree seen twice) never earns that back. Whether it will be called
again is not known when it comes back, which is the ski-rental problem:
rent (run step by step) or buy (compile). The deterministic rule that is
never worse than twice the best choice made in hindsight is to rent until
the rent paid equals the price, then buy. So with `chunks="auto"` a plan
runs step by step, each run's seconds added up (`Rent.stepped_s`), until
they reach what compiling its chunks is estimated to take; its next run
compiles them. A structure's extra time is then at most one compile's
worth of step-by-step runs, and a structure seen once or twice compiles
nothing.

The price is estimated before compiling, as the plan's distinct
operations (its computations with executables of their own: a repeated
layer's equations count once) times seconds per operation (`CompileRate`):
what compiles of chunks took in this process so far, started from a prior
measured on the CPU (docs/benchmarks.md). Distinct operations predict a
compile better than computations do: on six models on the CPU, 27-59 ms per
distinct operation, against 0.8-8.5 ms per computation (a 64-layer MLP has
668 computations of 14 operations, and compiles in 0.6 s). The rent counts
whole step-by-step runs, to the outputs being ready: the time a compiled
run would take too, so the rule compiles a little early, never late.

Where several processes run one program (`jax.process_count() > 1`), each
must dispatch the same programs in the same order, so their collectives
meet; times measured by each could differ, so there a plan compiles on its
second run, the same in every process (`deterministic`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

# Seconds a chunk compile takes per distinct operation of the plan, before
# this process has compiled any: at 0.5 of their peak on 2 CPU cores, a
# 4-block transformer took 3.9 s for 143, a flax GPT 11.0 s for 188, a
# GroupNorm ResNet 4.0 s for 108, a 64-layer MLP 0.56 s for 14.
PRIOR_SECONDS_PER_OPERATION = 0.04
# How many operations the prior counts as, against those compiled since:
# one model's compile moves the estimate about halfway to what it measured.
PRIOR_OPERATIONS = 150


class CompileRate:
    """Seconds per distinct operation that compiling a plan's chunks takes,
    learnt from the compiles of this process. Safe to use from several threads.

    Args:
      prior_s: seconds per operation before anything was compiled.
      weight: how many operations the prior counts as; None keeps the
        estimate at the prior whatever is observed (tests, benchmarks).
    """

    def __init__(self, prior_s: float = PRIOR_SECONDS_PER_OPERATION, weight: Optional[int] = PRIOR_OPERATIONS):
        if prior_s < 0 or (weight is not None and weight <= 0):
            raise ValueError(f"a compile rate needs prior_s >= 0 and weight > 0 (or None); got {prior_s}, {weight}")
        self.prior_s = prior_s
        self.weight = weight
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._operations = 0

    def observe(self, operations: int, seconds: float) -> None:
        """One plan's chunks were cut and compiled: its `operations` in `seconds`."""
        if operations <= 0:
            return
        with self._lock:
            self._seconds += max(seconds, 0.0)
            self._operations += operations

    def seconds_per_operation(self) -> float:
        if self.weight is None:
            return self.prior_s
        with self._lock:
            return (self.prior_s * self.weight + self._seconds) / (self.weight + self._operations)

    def estimate(self, operations: int) -> float:
        """Seconds compiling the chunks of a plan of `operations` distinct operations is expected to take."""
        return operations * self.seconds_per_operation()


# The process's rate: every plan's compile feeds it.
COMPILE_RATE = CompileRate()


@dataclass
class Rent:
    """What a plan has cost step by step so far.

    Attributes:
      runs: its runs, step by step or in chunks.
      stepped_s: seconds its step-by-step runs took, each to its outputs
        being ready.
    """

    runs: int = 0
    stepped_s: float = 0.0

    def paid(self, seconds: float) -> None:
        """A step-by-step run took `seconds`."""
        self.stepped_s += seconds


def pays(policy: str, rent: Rent, operations: int, deterministic: bool, rate: Optional[CompileRate] = None) -> bool:
    """Whether a plan's next run compiles its chunks, by `policy` ("always",
    "never", or "auto": the ski-rental rule), after `rent`, for a line of
    `operations` distinct operations. `deterministic`: decided by the count
    of runs alone (the second compiles), as every process of a multi-process
    run must."""
    if policy == "always":
        return True
    if policy != "auto" or rent.runs < 1:
        return False
    if deterministic:
        return True
    return rent.stepped_s >= (rate or COMPILE_RATE).estimate(operations)
