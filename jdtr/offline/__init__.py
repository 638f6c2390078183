"""DTR decided before a run: the one simulation driver, and the optimum.

`driver` runs a program on the DTR runtime with no buffers under a budget
and measures the run (`SimResult`); `straightline` writes such a run down
as the computations and frees it asked for (`StraightLine`), which
`jdtr.grad` replays on device buffers; `optimal` solves Checkmate's MILP on an
operator log, the least compute any schedule needs. Both are what a planner
needs before any device work: `jdtr.simulator` (operator logs) and
`jdtr.transform` (traced JAX programs) call them, and never each other.
"""

from .driver import Baseline as Baseline
from .driver import SimResult as SimResult
from .driver import Workload as Workload
from .driver import as_trace as as_trace
from .driver import log_workload as log_workload
from .driver import run as run
from .driver import run_baseline as run_baseline
from .straightline import Compute as Compute
from .straightline import Free as Free
from .straightline import Read as Read
from .straightline import RecordingBackend as RecordingBackend
from .straightline import StraightLine as StraightLine
from .stage_line import StagedRun as StagedRun
from .stage_line import stage_line as stage_line
from .optimal import METHODS as METHODS
from .optimal import MILP_MAX_BINARIES as MILP_MAX_BINARIES
from .optimal import CheckmateGraph as CheckmateGraph
from .optimal import OptimalResult as OptimalResult
from .optimal import checkmate_graph as checkmate_graph
from .optimal import interval_bound as interval_bound
from .optimal import optimal as optimal

__all__ = [
    "Baseline",
    "CheckmateGraph",
    "Compute",
    "Free",
    "METHODS",
    "MILP_MAX_BINARIES",
    "OptimalResult",
    "Read",
    "RecordingBackend",
    "SimResult",
    "StagedRun",
    "StraightLine",
    "Workload",
    "as_trace",
    "checkmate_graph",
    "interval_bound",
    "log_workload",
    "optimal",
    "run",
    "run_baseline",
    "stage_line",
]
