"""A mixed-integer program for HiGHS, built row by row (through `scipy.optimize.milp`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ...quiet import ignoring


@dataclass(frozen=True)
class WorkLimit:
    """Limits on each of HiGHS's solves that, unlike time, give the same
    answer on every run and machine.

    Attributes:
      nodes: branch-and-bound nodes (HiGHS's `mip_max_nodes`). It does not
        bound the root node's work: its cuts and its sub-MIP heuristics.
      solutions: improving solutions found (`mip_max_improving_sols`). The
        root node's sub-MIPs run until they find one; on the rematerialization
        models most of a solve with a node limit of 1 is spent there.
    """

    nodes: Optional[int] = None
    solutions: Optional[int] = None

    @property
    def bounded(self) -> bool:
        """Whether it limits work at all (else only time can)."""
        return self.nodes is not None or self.solutions is not None


UNLIMITED = WorkLimit()


class Model:
    """Variables and sparse constraint rows of a MILP, in scipy's terms."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.objective: list[float] = []
        self.integer: list[int] = []
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.values: list[float] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []

    def variable(self, lower: float, upper: float, cost: float = 0.0, integer: bool = False) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.objective.append(cost)
        self.integer.append(1 if integer else 0)
        return len(self.lower) - 1

    def constraint(self, terms: list[tuple[int, float]], lower: float, upper: float) -> None:
        row = len(self.row_lower)
        for col, value in terms:
            self.rows.append(row)
            self.cols.append(col)
            self.values.append(value)
        self.row_lower.append(lower)
        self.row_upper.append(upper)

    def solve(self, time_limit: Optional[float], rel_gap: float, work: WorkLimit = UNLIMITED) -> Any:
        """HiGHS's solution (`scipy.optimize.milp`), within `rel_gap` of
        optimal, or by `time_limit` seconds or the limits of `work`."""
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array

        matrix = csr_array(
            (self.values, (self.rows, self.cols)), shape=(len(self.row_lower), len(self.lower)), dtype=float
        )
        options: dict[str, Any] = {"disp": False, "mip_rel_gap": rel_gap}
        if time_limit is not None:
            options["time_limit"] = max(float(time_limit), 0.0)
        if work.nodes is not None:
            options["node_limit"] = int(work.nodes)
        if work.solutions is not None:
            # Not among the options scipy documents; it passes them on to HiGHS.
            options["mip_max_improving_sols"] = int(work.solutions)
        # Under `ignoring`'s lock: solves in several threads at once (`jdtr.grad`
        # called from several) once let scipy's warning through in
        # `test_calls_from_several_threads`, where warnings are errors.
        with ignoring("Unrecognized options", RuntimeWarning):
            solution = milp(
                np.asarray(self.objective),
                integrality=np.asarray(self.integer),
                bounds=Bounds(np.asarray(self.lower), np.asarray(self.upper)),
                constraints=LinearConstraint(matrix, np.asarray(self.row_lower), np.asarray(self.row_upper)),
                options=options,
            )
        if solution.status == 4 and "limit reached" in str(solution.message).lower():
            # scipy does not know every one of HiGHS's limits (its node limit
            # and its limit on improving solutions come back as "status 16:
            # solution limit reached"): a limit all the same.
            solution.status = 1
        return solution

    def size(self) -> dict[str, int]:
        """Variables, binaries and constraints, as `OptimalResult` reports them."""
        return {"variables": len(self.lower), "integer_variables": sum(self.integer), "constraints": len(self.row_lower)}



def memory_unit(budget_bytes: int) -> float:
    """Bytes per unit of memory in the solver's models: a ten-thousandth of
    the budget. Coefficients in bytes (up to 1e10 for the paper's logs) are
    beyond HiGHS's tolerances, and its presolve then calls feasible models
    infeasible."""
    return max(1.0, budget_bytes / 1e4)
