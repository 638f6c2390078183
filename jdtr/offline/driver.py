"""The one simulation driver: a DTR run on no buffers, measured.

Everything that simulates DTR — `jdtr.simulate` and its sweeps on operator
logs, `jdtr.optimal`'s seed runs, `jdtr.plan`'s reading of a traced step —
runs here: a `Workload` says how to play a program on a runtime and what
its unconstrained run is, and `run` plays it under a budget on a runtime
whose backend holds no buffers, and reports.

The measurements follow the paper authors' experiment driver (simrd), so
that the figures of their paper come out:

* The *baseline* is the program run with no budget, freeing every value for
  good when its last reference goes (banishing, App. C.5), constants
  included. Its peak is the *unconstrained peak* that budget ratios refer
  to; its compute is the sum of all operator costs.
* A run *thrashes* once rematerialization compute exceeds the baseline compute
  (overhead limit 2x), and is *out of memory* when an operator cannot fit even
  after evicting everything evictable.
* Overhead = the runtime's clock / baseline compute, the clock starting at 1.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Callable, Optional, Sequence, Union

from ..runtime import Backend, Counters, Heuristic, NullBackend, Observer, OutOfBudgetError, Runtime, ThrashError, get_heuristic
from ..oplog import Program, Trace, replay

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
      error: the error the run stopped with, when it did (not in `to_dict`).
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
    error: Optional[Exception] = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def budget_ratio(self) -> float:
        """The budget as a fraction of the unconstrained peak."""
        return self.budget_bytes / self.unconstrained_peak_bytes if self.unconstrained_peak_bytes else math.inf

    def to_dict(self) -> dict[str, Any]:
        """The fields and `budget_ratio`, for JSON."""
        fields = {f.name: getattr(self, f.name) for f in dataclass_fields(self) if f.name != "error"}
        return {**fields, "budget_ratio": self.budget_ratio}


@dataclass(frozen=True)
class Baseline:
    """A trace run without a budget.

    Attributes:
      peak_bytes: the unconstrained peak (values and constants freed at their last release).
      cost: compute of running every operator once.
    """

    peak_bytes: int
    cost: float


@dataclass(frozen=True)
class Workload:
    """A program as the driver runs it.

    Attributes:
      play: runs the program on a runtime (raising what the runtime raises).
      baseline: its unconstrained run.
      constant_bytes: bytes of its constants (weights, inputs).
      largest_op_bytes: the most one of its operators needs at once.
    """

    play: Callable[[Runtime], None]
    baseline: Baseline
    constant_bytes: int
    largest_op_bytes: int


def as_trace(trace: "Trace | str | os.PathLike[str]") -> Trace:
    return trace if isinstance(trace, Trace) else Trace.from_log(trace)


def run_baseline(program: Program) -> Baseline:
    """The unconstrained run of a log's program: an infinite budget,
    banishing each value at its last release."""
    counters = Counters()
    runtime = Runtime(NullBackend(), math.inf, dealloc="banish", observers=[counters])
    try:
        replay(program, runtime)
    finally:
        runtime.close()
    return Baseline(peak_bytes=counters.peak_bytes, cost=float(program.compute_cost))


def log_workload(trace: Trace, baseline: Optional[Baseline] = None) -> Workload:
    """A log's program as a workload (its baseline run unless given)."""
    program = trace.program
    return Workload(
        play=lambda runtime: replay(program, runtime, trace.source),
        baseline=baseline if baseline is not None else run_baseline(program),
        constant_bytes=program.constant_bytes,
        largest_op_bytes=program.largest_op_bytes,
    )


def run(
    workload: Workload,
    budget_bytes: float,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    dealloc: str = "eager",
    overhead_limit: Optional[float] = 2.0,
    observers: Sequence[Observer] = (),
    backend: Optional[Backend] = None,
) -> SimResult:
    """One run of `workload` under `budget_bytes`, measured against its baseline.

    Running out of memory or thrashing is a result (its `status`), not an error.
    `backend` stands in for the buffers (none by default; a
    `jdtr.offline.RecordingBackend` writes the run down as a straight line).
    """
    baseline = workload.baseline
    counters = Counters()
    remat_limit = None if overhead_limit is None else baseline.cost * (overhead_limit - 1.0)
    runtime = Runtime(
        NullBackend() if backend is None else backend,
        budget_bytes,
        heuristic=get_heuristic(heuristic),
        dealloc=dealloc,
        observers=[counters, *observers],
        remat_limit=remat_limit,
    )
    status, message, error = "ok", None, None
    try:
        workload.play(runtime)
    except (OutOfBudgetError, ThrashError) as err:
        # Without its traceback: the frames it holds (the caller's among them,
        # through `f_back`) would keep the caller's arrays alive in a cycle.
        status, message, error = ("oom" if isinstance(err, OutOfBudgetError) else "thrash"), str(err), err.with_traceback(None)
    finally:
        runtime.close()
    overhead = None
    if status == "ok":
        overhead = runtime.clock / baseline.cost if baseline.cost > 0 else 1.0
    return SimResult(
        status=status,
        overhead=overhead,
        **counters.totals(),
        budget_bytes=budget_bytes if math.isinf(budget_bytes) else int(budget_bytes),
        unconstrained_peak_bytes=baseline.peak_bytes,
        baseline_cost=baseline.cost,
        remat_cost=runtime.remat_cost,
        heuristic_evaluations=counters.heuristic_evaluations,
        metadata_accesses=counters.metadata_accesses,
        constant_bytes=workload.constant_bytes,
        largest_op_bytes=workload.largest_op_bytes,
        heuristic=runtime.heuristic.name,
        dealloc=dealloc,
        message=message,
        error=error,
    )
