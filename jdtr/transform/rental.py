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

The price is estimated before compiling, as seconds per computation of the
plan's line times its computations (`CompileRate`): what compiles of
chunks took in this process so far, started from a prior measured on the
CPU (docs/benchmarks.md). The rent counts whole step-by-step runs, to the
outputs being ready: the time a compiled run would take too, so the rule
compiles a little early, never late.

Where several processes run one program (`jax.process_count() > 1`), each
must dispatch the same programs in the same order, so their collectives
meet; times measured by each could differ, so there a plan compiles on its
second run, the same in every process (`deterministic`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

# Seconds a chunk compile takes per computation, before this process has
# compiled any: the CPU benchmarks' second calls took 3-9 ms per
# computation of the plan (a 4-block transformer 3.7 s for 1,154, a flax GPT
# 11 s for 1,294, a ResNet 4 s for 682), less where repeated layers share
# their chunks (a 64-layer MLP: 1 ms).
PRIOR_SECONDS_PER_COMPUTATION = 0.005
# How many computations the prior counts as, against those compiled since:
# one model's compile moves the estimate about halfway to what it measured.
PRIOR_COMPUTATIONS = 1000


class CompileRate:
    """Seconds per computation that compiling a plan's chunks takes, learnt
    from the compiles of this process. Safe to use from several threads.

    Args:
      prior_s: seconds per computation before anything was compiled.
      weight: how many computations the prior counts as; None keeps the
        estimate at the prior whatever is observed (tests, benchmarks).
    """

    def __init__(self, prior_s: float = PRIOR_SECONDS_PER_COMPUTATION, weight: Optional[int] = PRIOR_COMPUTATIONS):
        if prior_s < 0 or (weight is not None and weight <= 0):
            raise ValueError(f"a compile rate needs prior_s >= 0 and weight > 0 (or None); got {prior_s}, {weight}")
        self.prior_s = prior_s
        self.weight = weight
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._computations = 0

    def observe(self, computations: int, seconds: float) -> None:
        """One plan's chunks were cut and compiled: `computations` in `seconds`."""
        if computations <= 0:
            return
        with self._lock:
            self._seconds += max(seconds, 0.0)
            self._computations += computations

    def seconds_per_computation(self) -> float:
        if self.weight is None:
            return self.prior_s
        with self._lock:
            return (self.prior_s * self.weight + self._seconds) / (self.weight + self._computations)

    def estimate(self, computations: int) -> float:
        """Seconds compiling the chunks of a plan of `computations` is expected to take."""
        return computations * self.seconds_per_computation()


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


def pays(policy: str, rent: Rent, computations: int, deterministic: bool, rate: Optional[CompileRate] = None) -> bool:
    """Whether a plan's next run compiles its chunks, by `policy` ("always",
    "never", or "auto": the ski-rental rule), after `rent`, for a line of
    `computations`. `deterministic`: decided by the count of runs alone (the
    second compiles), as every process of a multi-process run must."""
    if policy == "always":
        return True
    if policy != "auto" or rent.runs < 1:
        return False
    if deterministic:
        return True
    return rent.stepped_s >= (rate or COMPILE_RATE).estimate(computations)
