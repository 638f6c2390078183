"""The DTR simulator: operator logs replayed on jdtr's runtime under a memory budget.

There is one DTR algorithm, `jdtr.runtime.Runtime`; the simulator runs it with
a backend that holds no buffers, on a `jdtr.Trace`, measured as the paper
authors' simulator (simrd, App. C) measures (the run itself is the
simulation driver's, `jdtr.offline`). `optimal` solves Checkmate's MILP on
the same trace: the least compute any rematerialization schedule needs.
Sweeps are drawn by `jdtr.plot.sweep`.
"""

# The simulator's part of the simulation driver and of the optimum, under the names it always had.
from ..offline import METHODS, MILP_MAX_BINARIES, Baseline, CheckmateGraph, OptimalResult, SimResult  # noqa: F401
from ..offline import checkmate_graph, interval_bound, optimal, run_baseline  # noqa: F401
from ._simulate import simulate as simulate
from ._sweep import PAPER_RATIOS as PAPER_RATIOS
from ._sweep import cell as cell
from ._sweep import format_table as format_table
from ._sweep import sweep as sweep

__all__ = sorted(
    ["Baseline", "CheckmateGraph", "METHODS", "MILP_MAX_BINARIES", "OptimalResult", "PAPER_RATIOS", "SimResult"]
    + ["cell", "checkmate_graph", "format_table", "interval_bound", "optimal", "run_baseline", "simulate", "sweep"]
)
