"""Figure 2 as a picture: slowdown against budget ratio, one line per heuristic.

matplotlib is imported only here, and only when a plot is asked for.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional, Sequence

from ._simulate import SimResult

if TYPE_CHECKING:
    from ._optimal import OptimalResult


def plot_sweep(
    ratios: Sequence[float],
    results: Sequence[SimResult],
    path: "str | os.PathLike[str]",
    title: Optional[str] = None,
    optimal: "Optional[Sequence[Optional[OptimalResult]]]" = None,
) -> None:
    """Writes a PNG of a sweep: slowdown per budget ratio per heuristic.

    As in the paper's Figure 2, vertical lines mark the memory pinned by
    constants (weights and inputs) and the largest single operator, both as
    fractions of the unconstrained peak; no budget below them can work.
    Failed runs (OOM, thrash) are left out of their heuristic's line.
    With `optimal`, Checkmate's optimum per ratio (`jdtr.optimal`) is drawn
    too: solved points as a line, timeouts as the best schedule found
    (hollow) above the solver's lower bound (a bar down to it).

    Args:
      ratios: the ratios of the sweep.
      results: what `jdtr.simulator.sweep` returned for them.
      path: where to write the PNG.
      title: the plot's title.
      optimal: per ratio, what `jdtr.optimal` returned (None: not solved).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("nothing to plot: no results")
    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    for start in range(0, len(results), len(ratios)):
        row = results[start : start + len(ratios)]
        points = [(ratio, r.overhead) for ratio, r in zip(ratios, row) if r.ok]
        axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=row[0].heuristic)
    if optimal is not None:
        _plot_optimal(axes, ratios, optimal)
    first = results[0]
    peak = first.unconstrained_peak_bytes
    if peak > 0:
        axes.axvline(first.constant_bytes / peak, color="black", linestyle="-", label="constants (pinned)")
        axes.axvline(first.largest_op_bytes / peak, color="gray", linestyle="--", label="largest single op")
    axes.set_xlabel("budget / unconstrained peak memory")
    axes.set_ylabel("slowdown (total compute / baseline)")
    axes.set_xlim(0.0, max(max(ratios), 1.0) + 0.02)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    if title:
        axes.set_title(title)
    figure.tight_layout()
    figure.savefig(os.fspath(path), dpi=120)
    plt.close(figure)


def _plot_optimal(axes, ratios: Sequence[float], optimal: "Sequence[Optional[OptimalResult]]") -> None:
    solved = [(x, r.overhead) for x, r in zip(ratios, optimal) if r is not None and r.status == "optimal"]
    if solved:
        axes.plot([x for x, _ in solved], [y for _, y in solved], color="black", linestyle=":", marker="*",
                  markersize=9, label="optimal (Checkmate MILP)")  # fmt: skip
    bounds_only = [
        (x, r.bound / r.baseline_cost)
        for x, r in zip(ratios, optimal)
        if r is not None and r.status == "timeout" and r.overhead is None and r.bound is not None and r.baseline_cost
    ]
    if bounds_only:  # no schedule from the MILP: the optimum lies on or above this line
        axes.plot([x for x, _ in bounds_only], [y for _, y in bounds_only], color="black", linestyle="--",
                  marker="_", markersize=10, label="optimum is at least (relaxation)")  # fmt: skip
    for x, r in zip(ratios, optimal):
        if r is None or r.status != "timeout" or r.overhead is None:
            continue
        if r.bound is not None and r.baseline_cost > 0:
            low = r.bound / r.baseline_cost
            high = r.overhead if r.overhead is not None else low
            axes.plot([x, x], [low, high], color="black", linewidth=1)
            axes.plot([x], [low], color="black", marker="_", markersize=10)
        if r.overhead is not None:
            axes.plot([x], [r.overhead], color="black", marker="*", markersize=9, fillstyle="none")
