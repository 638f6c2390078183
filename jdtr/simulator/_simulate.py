"""`jdtr.simulate`: a trace under a memory budget, as the paper's simulator runs it.

The measurements follow the paper authors' experiment driver (simrd), so
that the figures of their paper come out:

* The *baseline* is the trace run with no budget, freeing every value for good
  when its last reference goes (banishing, App. C.5), constants included. Its
  peak is the *unconstrained peak* that budget ratios refer to; its compute is
  the sum of all operator costs.
* A run *thrashes* once rematerialization compute exceeds the baseline compute
  (overhead limit 2x), and is *out of memory* when an operator cannot fit even
  after evicting everything evictable.
* Overhead = the runtime's clock / baseline compute, the clock starting at 1.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence, Union

from ..budget import BudgetLike, parse_budget
from ..runtime import Counters, Heuristic, NullBackend, Observer, OutOfBudgetError, Runtime, ThrashError
from ..trace import Program, Trace
from ._replay import replay

STATUSES = ("ok", "oom", "thrash")


@dataclass(frozen=True)
class SimResult:
    """The outcome of simulating one trace under one budget.

    Costs are in the log's unit (nanoseconds for prototype logs), sizes in bytes.

    Attributes:
      status: "ok", "oom" (an operator could not fit) or "thrash"
        (rematerialization compute exceeded the overhead limit).
      overhead: total compute / baseline compute (the paper's slowdown);
        None unless status is "ok".
      budget_bytes: the budget the run had.
      peak_bytes: the most memory resident at once (until the failure, if any).
      unconstrained_peak_bytes: the baseline's peak; budget ratios refer to it.
      baseline_cost: compute of running every operator once.
      remat_cost: compute spent rematerializing (until the failure, if any).
      evictions: storages evicted by the heuristic.
      dealloc_evictions: dead storages evicted when their last reference went.
      rematerializations: operator replays.
      heuristic_evaluations: heuristic scores computed (App. D.3).
      metadata_accesses: storages whose metadata a heuristic read (App. D.3).
      constant_bytes: bytes of constants (weights, inputs), pinned throughout;
        the black area of the paper's Figure 2.
      largest_op_bytes: the most one operator needs at once, inputs and
        outputs; the gray area of Figure 2.
      heuristic: the heuristic's name.
      dealloc: the deallocation policy.
      message: why the run failed, when it did.
    """

    status: str
    overhead: Optional[float]
    budget_bytes: int
    peak_bytes: int
    unconstrained_peak_bytes: int
    baseline_cost: float
    remat_cost: float
    evictions: int
    dealloc_evictions: int
    rematerializations: int
    heuristic_evaluations: int
    metadata_accesses: int
    constant_bytes: int
    largest_op_bytes: int
    heuristic: str
    dealloc: str
    message: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def budget_ratio(self) -> float:
        """The budget as a fraction of the unconstrained peak."""
        return self.budget_bytes / self.unconstrained_peak_bytes if self.unconstrained_peak_bytes else math.inf

    def to_dict(self) -> dict[str, Any]:
        """The fields and `budget_ratio`, for JSON."""
        return {**asdict(self), "budget_ratio": self.budget_ratio}


@dataclass(frozen=True)
class Baseline:
    """A trace run without a budget.

    Attributes:
      peak_bytes: the unconstrained peak (values and constants freed at their last release).
      cost: compute of running every operator once.
    """

    peak_bytes: int
    cost: float


def as_trace(trace: "Trace | str | os.PathLike[str]") -> Trace:
    return trace if isinstance(trace, Trace) else Trace.from_log(trace)


def run_baseline(program: Program) -> Baseline:
    """The unconstrained run: an infinite budget, banishing each value at its last release."""
    counters = Counters()
    runtime = Runtime(NullBackend(), math.inf, dealloc="banish", observers=[counters])
    replay(program, runtime)
    return Baseline(peak_bytes=counters.peak_bytes, cost=float(program.compute_cost))


def run_budget(
    trace: Trace,
    baseline: Baseline,
    budget_bytes: int,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    dealloc: str = "eager",
    overhead_limit: Optional[float] = 2.0,
    observers: Sequence[Observer] = (),
) -> SimResult:
    """One run of `trace` under `budget_bytes`, measured against `baseline`."""
    program = trace.program
    counters = Counters()
    remat_limit = None if overhead_limit is None else baseline.cost * (overhead_limit - 1.0)
    runtime = Runtime(
        NullBackend(),
        budget_bytes,
        heuristic=heuristic,
        dealloc=dealloc,
        observers=[counters, *observers],
        remat_limit=remat_limit,
    )
    status, message = "ok", None
    try:
        replay(program, runtime, trace.source)
    except OutOfBudgetError as err:
        status, message = "oom", str(err)
    except ThrashError as err:
        status, message = "thrash", str(err)
    overhead = None
    if status == "ok":
        overhead = runtime.clock / baseline.cost if baseline.cost > 0 else 1.0
    return SimResult(
        status=status,
        overhead=overhead,
        budget_bytes=int(budget_bytes),
        peak_bytes=counters.peak_bytes,
        unconstrained_peak_bytes=baseline.peak_bytes,
        baseline_cost=baseline.cost,
        remat_cost=runtime.remat_cost,
        evictions=counters.evictions,
        dealloc_evictions=counters.dealloc_evictions,
        rematerializations=counters.rematerializations,
        heuristic_evaluations=runtime.heuristic.evaluations,
        metadata_accesses=runtime.heuristic.metadata_accesses,
        constant_bytes=program.constant_bytes,
        largest_op_bytes=program.largest_op_bytes,
        heuristic=runtime.heuristic.name,
        dealloc=dealloc,
        message=message,
    )


def simulate(
    trace: "Trace | str | os.PathLike[str]",
    budget: BudgetLike,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    dealloc: str = "eager",
    *,
    overhead_limit: Optional[float] = 2.0,
    observers: Sequence[Observer] = (),
) -> SimResult:
    """Simulates DTR on an operator log under a memory budget (paper §4, App. C).

    The trace runs on the same `jdtr.runtime.Runtime` that `jdtr.grad` uses,
    with a backend that holds no buffers. With the defaults this reproduces
    the paper authors' simulator (their h_DTR^eq, "DTR-EqClass", with eager
    eviction) figure for figure.

    Args:
      trace: a `Trace`, or the path of a log.
      budget: bytes (int), a size with a unit ("4GB", "512MiB"), or a float in
        (0, 1]: a fraction of the trace's unconstrained peak (truncated to
        whole bytes, as the reference simulator does).
      heuristic: a name from `jdtr.HEURISTICS` or a `Heuristic`.
      dealloc: "eager", "banish" or "ignore" (App. C.5).
      overhead_limit: a run whose total compute would exceed this multiple of
        the baseline compute is stopped as thrashing; None for no limit.
      observers: telemetry receivers (`jdtr.runtime.Timeline`, ...) for the run.

    Returns:
      A `SimResult`. Running out of memory or thrashing is a result, not an error.

    Raises:
      LogFormatError: when `trace` is a path to a malformed log.

    Example:
      >>> result = jdtr.simulate("resnet32-56.log", 0.5)   # doctest: +SKIP
      >>> result.status, round(result.overhead, 4)         # doctest: +SKIP
      ('ok', 1.1068)
    """
    trace = as_trace(trace)
    baseline = run_baseline(trace.program)
    budget_bytes = parse_budget(budget).resolve(baseline.peak_bytes)
    return run_budget(trace, baseline, budget_bytes, heuristic, dealloc, overhead_limit, observers)
