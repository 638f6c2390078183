"""jdtr's pictures: one run's residency (the paper's Figure 5) and memory, and a sweep's slowdowns (Figure 2).

`sweep` draws what `jdtr.simulator.sweep` returns. `timeline` and `memory`
read a `jdtr.Stats` recorded with `timeline=True`:

    grads, stats = jdtr.grad(loss, budget=0.4, return_stats=True, timeline=True)(params, batch)
    jdtr.plot.timeline(stats)   # one row per value, one column per operator run
    jdtr.plot.memory(stats)     # bytes held after every residency change, against the budget

The x axis counts *steps*: operator runs in order, first computations and
rematerializations alike. matplotlib is imported inside the drawing
functions only; `residency` and `find_backward_start` need numpy alone.

Forward values and gradient-side values. A `jdtr.grad` program is the
value-and-grad of the loss: the forward pass ends with the loss, then the
backward pass computes the gradients. The loss is an output, so once
computed it stays referenced, and being a scalar it is (practically) never
evicted. `find_backward_start` therefore takes the step that computed the first
value which stays resident from its computation to the end of the run (the
first output the program produces), and puts the backward pass after it.
Values first computed up to that step are forward values, the others
gradient-side values. This needs eager deallocation (the default), so that
dead values leave memory when they die; and outputs computed before the
loss (auxiliary data such as updated BatchNorm statistics) move the
boundary earlier. Pass `backward_start=` explicitly in those cases.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from .runtime.errors import format_bytes
from .runtime.observer import TimelineEvent
from .stats import Stats

if TYPE_CHECKING:
    from .offline import OptimalResult, SimResult

__all__ = ["Interval", "Residency", "find_backward_start", "memory", "residency", "sweep", "timeline"]

_ARRIVALS = ("compute", "rematerialize")
_DEPARTURES = ("evict", "dealloc", "banish")

NOT_RESIDENT, FORWARD, GRADIENT = 0, 1, 2  # the cells of `Residency.matrix`


@dataclass(frozen=True)
class Interval:
    """One stretch of time a value's storage spent in memory.

    Attributes:
      storage_id: the runtime's storage.
      size: its bytes.
      start: the step whose operator made it resident (a first computation or a rematerialization).
      stop: one past the last step it was resident: it left after step `stop - 1` (evicted to make
        room for step `stop`, or freed when it died then), or `stop` is `steps + 1` if it stayed.
      rematerialized: it became resident by a rematerialization.
      end: how it left: "evict" (chosen by the heuristic), "dealloc" (dead, eager eviction),
        "banish", or "end" (still resident when the run finished).
      backward: it is a gradient-side value (first computed in the backward pass).
    """

    storage_id: int
    size: int
    start: int
    stop: int
    rematerialized: bool
    end: str
    backward: bool


@dataclass(frozen=True)
class Residency:
    """Every residency interval of a run, with one row per storage.

    Attributes:
      storage_ids: the rows, in the order the storages were first computed.
      intervals: all intervals, in the order they began.
      steps: the number of operator runs.
      backward_start: the first step of the backward pass (None: unknown).
    """

    storage_ids: tuple[int, ...]
    intervals: tuple[Interval, ...]
    steps: int
    backward_start: Optional[int]

    def matrix(self) -> np.ndarray:
        """rows x steps: `FORWARD` (1) or `GRADIENT` (2) where resident, else `NOT_RESIDENT` (0).

        Column j is step j + 1; a row holds the storage `storage_ids[row]`.
        """
        row = {sid: i for i, sid in enumerate(self.storage_ids)}
        out = np.zeros((len(self.storage_ids), self.steps), np.uint8)
        for interval in self.intervals:
            out[row[interval.storage_id], interval.start - 1 : interval.stop - 1] = GRADIENT if interval.backward else FORWARD
        return out


def _events(stats: Stats) -> tuple[TimelineEvent, ...]:
    if stats.timeline is None:
        raise ValueError("these stats have no timeline: pass timeline=True to jdtr.grad / jdtr.value_and_grad")
    return stats.timeline


def find_backward_start(stats: Stats) -> Optional[int]:
    """The first step of the backward pass, by the criterion of this module's docstring.

    Returns None when it cannot be told: deallocation was not eager, or no
    value stayed resident from its computation to the end.
    """
    events = _events(stats)
    if stats.dealloc != "eager":
        return None
    history: dict[int, list[str]] = {}
    for event in events:
        history.setdefault(event.storage_id, []).append(event.kind)
    first_step: dict[int, int] = {}
    for event in events:
        first_step.setdefault(event.storage_id, event.step)
    stayed = [sid for sid, kinds in history.items() if kinds == ["compute"]]
    if not stayed:
        return None
    return min(first_step[sid] for sid in stayed) + 1


def residency(stats: Stats, backward_start: Optional[int] = None) -> Residency:
    """The residency intervals of a run recorded with `timeline=True`.

    Args:
      stats: the run's `jdtr.Stats`.
      backward_start: the first step of the backward pass; by default found
        by `jdtr.plot.find_backward_start`. Values first computed before it are
        forward values.
    """
    events = _events(stats)
    boundary = find_backward_start(stats) if backward_start is None else backward_start
    steps = max((e.step for e in events), default=0)
    first_step: dict[int, int] = {}
    open_since: dict[int, TimelineEvent] = {}
    intervals: list[Interval] = []

    def close(arrival: TimelineEvent, stop: int, end: str) -> None:
        created = first_step[arrival.storage_id]
        intervals.append(
            Interval(
                storage_id=arrival.storage_id,
                size=arrival.size,
                start=arrival.step,
                stop=stop,
                rematerialized=arrival.kind == "rematerialize",
                end=end,
                backward=boundary is not None and created >= boundary,
            )
        )

    for event in events:
        if event.kind in _ARRIVALS:
            first_step.setdefault(event.storage_id, event.step)
            if event.storage_id not in open_since:  # a multi-output replay may re-announce a resident storage
                open_since[event.storage_id] = event
        elif event.kind in _DEPARTURES:
            arrival = open_since.pop(event.storage_id, None)
            if arrival is not None:
                close(arrival, event.step + 1, event.kind)
        else:
            raise ValueError(f"unknown timeline event kind {event.kind!r}")
    for arrival in open_since.values():
        close(arrival, steps + 1, "end")
    intervals.sort(key=lambda i: (i.start, first_step[i.storage_id]))
    rows = tuple(sorted(first_step, key=lambda sid: (first_step[sid], sid)))
    return Residency(rows, tuple(intervals), steps, boundary)


def _byte_unit(nbytes: float) -> tuple[float, str]:
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= scale:
            return float(scale), name
    return 1.0, "B"


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(8, 4.5))[1]


def timeline(stats: Stats, ax: Any = None, *, backward_start: Optional[int] = None) -> Any:
    """Draws which values were resident at every step, as the paper's Figure 5.

    One row per storage (in the order they were first computed, top to
    bottom), one column per step. Black: not resident (not yet computed,
    evicted or freed); red: a resident forward value; white: a resident
    gradient-side value. A dashed vertical line marks the start of the
    backward pass.

    Args:
      stats: a `jdtr.Stats` recorded with `timeline=True`.
      ax: matplotlib axes to draw on (default: a new figure).
      backward_start: see `residency`.

    Returns:
      The `matplotlib.image.AxesImage`; its array is `residency(...).matrix()`.
    """
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    ax = _axes(ax)
    res = residency(stats, backward_start)
    colors = ListedColormap(["black", "tab:red", "white"])
    image = ax.imshow(
        res.matrix(),
        cmap=colors,
        norm=BoundaryNorm([-0.5, 0.5, 1.5, 2.5], colors.N),
        aspect="auto",
        interpolation="nearest",
        extent=(0.5, res.steps + 0.5, len(res.storage_ids) - 0.5, -0.5),
    )
    handles = [Patch(facecolor="tab:red", label="forward value"), Patch(facecolor="white", edgecolor="gray", label="gradient-side value")]
    if res.backward_start is not None:
        ax.axvline(res.backward_start - 0.5, color="tab:cyan", linestyle="--", linewidth=1.2)
        handles.append(Patch(facecolor="tab:cyan", label="backward pass begins"))
    ax.legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.9)
    ax.set_xlabel("step (operator runs, rematerializations included)")
    ax.set_ylabel("value (in order of first computation)")
    ax.set_title(
        f"budget {format_bytes(stats.budget_bytes)}: {stats.evictions} evictions, "
        f"{stats.rematerializations} rematerializations",
        fontsize="medium",
    )
    return image


def memory(stats: Stats, ax: Any = None, *, backward_start: Optional[int] = None) -> Any:
    """Draws the bytes held after every residency change, with the budget and the unconstrained peak.

    Args:
      stats: a `jdtr.Stats` recorded with `timeline=True`.
      ax: matplotlib axes to draw on (default: a new figure).
      backward_start: where to mark the backward pass; by default found by
        `jdtr.plot.find_backward_start`.

    Returns:
      The `matplotlib.lines.Line2D` of memory: x is each event's step, y its
      bytes in use after the event (in the unit of the y label).
    """
    events = _events(stats)
    ax = _axes(ax)
    scale, unit = _byte_unit(max(stats.budget_bytes, stats.unconstrained_peak_bytes))
    boundary = find_backward_start(stats) if backward_start is None else backward_start
    (line,) = ax.plot(
        [e.step for e in events], [e.memory / scale for e in events], color="tab:red", linewidth=1.0, label="held"
    )
    ax.axhline(stats.budget_bytes / scale, color="black", linestyle="-", linewidth=1.0, label="budget")
    ax.axhline(stats.unconstrained_peak_bytes / scale, color="gray", linestyle=":", label="unconstrained peak")
    if boundary is not None:
        ax.axvline(boundary - 0.5, color="tab:cyan", linestyle="--", linewidth=1.2, label="backward pass begins")
    ax.set_xlim(0.5, max((e.step for e in events), default=0) + 0.5)  # the columns of `timeline`
    ax.set_xlabel("step (operator runs, rematerializations included)")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(bottom=0)
    ax.legend(loc="center right", fontsize="small")
    return line


# ------------------------------------------------------------------ sweeps


def sweep(
    ratios: Sequence[float],
    results: "Sequence[SimResult]",
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
