"""A mixed-integer program for HiGHS, built row by row (through `scipy.optimize.milp`)."""

from __future__ import annotations

from typing import Any, Optional


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

    def solve(self, time_limit: Optional[float], rel_gap: float, node_limit: Optional[int] = None) -> Any:
        """HiGHS's solution (`scipy.optimize.milp`), within `rel_gap` of
        optimal, or by `time_limit` seconds or `node_limit` branch-and-bound
        nodes (a limit that, unlike time, gives the same answer every run)."""
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array

        matrix = csr_array(
            (self.values, (self.rows, self.cols)), shape=(len(self.row_lower), len(self.lower)), dtype=float
        )
        options: dict[str, Any] = {"disp": False, "mip_rel_gap": rel_gap}
        if time_limit is not None:
            options["time_limit"] = max(float(time_limit), 0.0)
        if node_limit is not None:
            options["node_limit"] = int(node_limit)
        solution = milp(
            np.asarray(self.objective),
            integrality=np.asarray(self.integer),
            bounds=Bounds(np.asarray(self.lower), np.asarray(self.upper)),
            constraints=LinearConstraint(matrix, np.asarray(self.row_lower), np.asarray(self.row_upper)),
            options=options,
        )
        if solution.status == 4 and "limit reached" in str(solution.message).lower():
            # scipy does not know every one of HiGHS's limits (its node limit
            # comes back as "status 16: solution limit reached"): a limit all the same.
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
