"""Sweeps: one trace under many budgets and heuristics, as in the paper's Figure 2."""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence, Union

from ..budget import parse_budget
from ..offline import SimResult, as_trace, log_workload, run
from ..oplog import Trace
from ..runtime import Heuristic

# The budget ratios of the paper's Figure 2.
PAPER_RATIOS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)

Progress = Callable[[int, int, SimResult], None]


def sweep(
    trace: "Trace | str | os.PathLike[str]",
    ratios: Sequence[float] = PAPER_RATIOS,
    heuristics: Sequence[Union[str, Heuristic]] = ("dtr_eq",),
    dealloc: str = "eager",
    *,
    overhead_limit: Optional[float] = 2.0,
    progress: Optional[Progress] = None,
) -> list[SimResult]:
    """Simulates `trace` at every budget ratio with every heuristic.

    The baseline is computed once and shared; each run starts afresh.

    Args:
      trace: a `Trace`, or the path of a log.
      ratios: budgets as fractions of the unconstrained peak.
      heuristics: names from `jdtr.HEURISTICS` or `Heuristic` instances.
      dealloc: the deallocation policy of every run.
      overhead_limit: see `jdtr.simulate`.
      progress: called after each run with (runs done, runs in all, result).

    Returns:
      The results, heuristic by heuristic, each in the order of `ratios`.
    """
    workload = log_workload(as_trace(trace))
    total = len(ratios) * len(heuristics)
    results = []
    for heuristic in heuristics:
        for ratio in ratios:
            budget_bytes = parse_budget(float(ratio), "ratio").resolve(workload.baseline.peak_bytes)
            result = run(workload, budget_bytes, heuristic, dealloc, overhead_limit)
            results.append(result)
            if progress is not None:
                progress(len(results), total, result)
    return results


def cell(result: SimResult) -> str:
    """A table cell: the overhead, or why the run failed."""
    if result.status == "ok":
        assert result.overhead is not None
        return f"{result.overhead:.4f}"
    return "OOM" if result.status == "oom" else "thrash"


def format_table(ratios: Sequence[float], results: Sequence[SimResult]) -> str:
    """Slowdown per budget ratio (columns) per heuristic (rows): Figure 2 in numbers.

    Args:
      ratios: the ratios of the sweep.
      results: what `sweep` returned for them, heuristic by heuristic.
    """
    if len(results) % max(len(ratios), 1):
        raise ValueError(f"{len(results)} results do not make rows of {len(ratios)} ratios")
    header = ["heuristic \\ ratio", *(f"{ratio:g}" for ratio in ratios)]
    rows = [
        [results[start].heuristic, *(cell(r) for r in results[start : start + len(ratios)])]
        for start in range(0, len(results), len(ratios))
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(text.rjust(width) if i else text.ljust(width) for i, (text, width) in enumerate(zip(row, widths)))
        for row in (header, *rows)
    )
