"""Errors raised by the DTR runtime."""

from __future__ import annotations

from typing import Optional


def format_bytes(n: float) -> str:
    """Human-readable bytes in binary units: 1536 -> '1.50 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class OutOfBudgetError(MemoryError):
    """The budget cannot hold what one operation needs, even after evicting all it may.

    Attributes:
      needed_bytes: bytes the operation had to allocate.
      free_bytes: bytes left under the budget after every possible eviction.
      pinned_bytes: bytes that can never be evicted (arguments, constants,
        outputs of effectful operations).
      locked_bytes: bytes held resident by the operation in flight (its inputs
        and pending rematerializations).
      budget_bytes: the budget.
      op_name: the primitive that did not fit.
      source: the user's source line of that primitive, when known.
      suggested_budget_bytes: where a planner searched for one, a budget
        it verified in simulation that the same run fits; None otherwise.
    """

    suggested_budget_bytes: Optional[int] = None
    _SUGGESTION = "fits"  # what the message says a suggested budget does

    def __init__(
        self,
        needed_bytes: int,
        free_bytes: int,
        pinned_bytes: int,
        locked_bytes: int,
        budget_bytes: int,
        op_name: str,
        source: Optional[object] = None,
    ):
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.pinned_bytes = pinned_bytes
        self.locked_bytes = locked_bytes
        self.budget_bytes = budget_bytes
        self.op_name = op_name
        self.source = None if source is None else str(source)  # (a source may be found when shown: its str)
        where = f" at {self.source}" if self.source else ""
        super().__init__(
            f"`{op_name}`{where} needs {format_bytes(needed_bytes)} ({needed_bytes} bytes) but only "
            f"{format_bytes(free_bytes)} of the {format_bytes(budget_bytes)} budget ({budget_bytes} bytes) "
            f"can be made free: {format_bytes(pinned_bytes)} is pinned (arguments, constants, outputs, "
            f"effects) and {format_bytes(locked_bytes)} is locked by the operation in flight."
        )
        # No budget is suggested from these numbers: what a run needs depends on
        # what it evicted before this point, so their sum could fail again or sit
        # above a budget that works (issue 23). A planner adds one it verified (`suggest`).

    def suggest(self, budget_bytes: int, verified_by: str = "simulating the run") -> "OutOfBudgetError":
        """Adds a budget verified to fit (`suggested_budget_bytes`) to the error and its message."""
        self.suggested_budget_bytes = int(budget_bytes)
        self.args = (
            f"{self.args[0]} A budget of {format_bytes(budget_bytes)} ({int(budget_bytes)} bytes) "
            f"{self._SUGGESTION}: it was verified by {verified_by}.",
        )
        return self


class OverheadLimitError(OutOfBudgetError):
    """No plan keeps the budget without recomputing more than `overhead_limit`
    times the step's compute: of the candidates tried, before any device
    work, some were still thrashing where their simulations were cut off
    there, and the others ran out of memory.

    A planned run is not made past that overhead: its simulation alone can
    take minutes (the evicted regions a heuristic scores grow with the
    thrashing), and the run would take the step's time many times over.
    `mode="online"`, the paper's algorithm, runs without that limit.

    Attributes:
      overhead_limit: the overhead (compute over the step's) where the
        simulations were cut off.
      budget_bytes: the budget.
      heuristics: the heuristics cut off there.
      suggested_budget_bytes: where a planner searched for one, a budget it
        verified in simulation to run without thrashing; None otherwise.

    The fields of an operation that did not fit (`needed_bytes`,
    `free_bytes`, `pinned_bytes`, `locked_bytes`, `op_name`, `source`) are
    None: no operation failed.
    """

    _SUGGESTION = "runs at overhead 2 or less"

    def __init__(self, overhead_limit: float, budget_bytes: int, heuristics: tuple[str, ...]):
        self.overhead_limit = overhead_limit
        self.heuristics = tuple(heuristics)
        self.budget_bytes = budget_bytes
        self.needed_bytes = self.free_bytes = self.pinned_bytes = self.locked_bytes = None
        self.op_name = self.source = None
        names = ", ".join(repr(h) for h in self.heuristics)
        MemoryError.__init__(
            self,
            f"jdtr: no plan keeps the budget of {format_bytes(budget_bytes)} ({budget_bytes} bytes) within "
            f"overhead {overhead_limit:g}: {names} recomputed more than {overhead_limit - 1:g}x the step's "
            "compute and went on thrashing, where a planned run is cut off (mode=\"online\" runs without that limit).",
        )


class ThrashWarning(UserWarning):
    """A run that fits its budget only by recomputing more than the step's own
    compute again (overhead over 2, what the simulator calls thrashing).

    Attributes:
      overhead: the run's compute over the step's ((base + remat) / base).
      budget_bytes: the budget it ran under.
      suggested_budget_bytes: a budget at which a plan runs with overhead at
        most 2, verified in simulation (None when not searched: online runs).
    """

    def __init__(self, overhead: float, budget_bytes: int, suggested_budget_bytes: Optional[int], heuristic: str):
        self.overhead = overhead
        self.budget_bytes = budget_bytes
        self.suggested_budget_bytes = suggested_budget_bytes
        message = (
            f"jdtr: this run recomputes {overhead - 1:.1f}x the step's compute to keep the budget of "
            f"{format_bytes(budget_bytes)} ({budget_bytes} bytes): overhead {overhead:.2f} with heuristic "
            f"{heuristic!r}, thrashing."
        )
        if suggested_budget_bytes is not None:
            message += (
                f" A budget of {format_bytes(suggested_budget_bytes)} ({suggested_budget_bytes} bytes) runs at "
                "overhead 2 or less: it was verified by simulating the run."
            )
        super().__init__(message)
