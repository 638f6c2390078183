"""`jdtr.simulate`: a trace under a memory budget, as the paper's simulator runs it.

The run and its measurements are the simulation driver's (`jdtr.offline`);
this is the entry point for operator logs.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

from ..budget import BudgetLike, parse_budget
from ..offline import SimResult, as_trace, log_workload, run
from ..oplog import Trace
from ..runtime import Heuristic, Observer


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
    workload = log_workload(as_trace(trace))
    budget_bytes = parse_budget(budget).resolve(workload.baseline.peak_bytes)
    return run(workload, budget_bytes, heuristic, dealloc, overhead_limit, observers)
