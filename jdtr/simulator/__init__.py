"""The DTR simulator: operator logs replayed on jdtr's runtime under a memory budget.

There is one DTR algorithm, `jdtr.runtime.Runtime`; the simulator runs it with
a backend that holds no buffers, on a `jdtr.Trace`, measured as the paper
authors' simulator (simrd, App. C) measures. `optimal` solves Checkmate's
MILP on the same trace: the least compute any rematerialization schedule needs.
"""

from ._optimal import METHODS as METHODS
from ._optimal import MILP_MAX_BINARIES as MILP_MAX_BINARIES
from ._optimal import CheckmateGraph as CheckmateGraph
from ._optimal import OptimalResult as OptimalResult
from ._optimal import checkmate_graph as checkmate_graph
from ._optimal import interval_bound as interval_bound
from ._optimal import optimal as optimal
from ._plot import plot_sweep as plot_sweep
from ._simulate import Baseline as Baseline
from ._simulate import SimResult as SimResult
from ._simulate import run_baseline as run_baseline
from ._simulate import simulate as simulate
from ._sweep import PAPER_RATIOS as PAPER_RATIOS
from ._sweep import format_table as format_table
from ._sweep import sweep as sweep

__all__ = [
    "Baseline",
    "CheckmateGraph",
    "METHODS",
    "MILP_MAX_BINARIES",
    "OptimalResult",
    "PAPER_RATIOS",
    "SimResult",
    "checkmate_graph",
    "format_table",
    "interval_bound",
    "optimal",
    "plot_sweep",
    "run_baseline",
    "simulate",
    "sweep",
]
