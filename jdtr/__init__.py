"""jdtr: Dynamic Tensor Rematerialization for JAX.

Train models that do not fit in device memory: `jdtr.grad` computes JAX's
gradients eagerly under a hard byte budget, evicting device buffers and
recomputing them on demand (Kirisame et al., ICLR 2021). `jdtr.simulate`
runs the same runtime on operator logs (`jdtr.Trace`), as the paper's
simulator; `jdtr.trace` records such a log of a JAX computation, and
`jdtr.optimal` gives the least compute any schedule needs (Checkmate's MILP).
"""

from . import plot as plot
from .budget import Budget as Budget
from .budget import parse_budget as parse_budget
from .runtime import DEFAULT_HEURISTIC as DEFAULT_HEURISTIC
from .runtime import HEURISTICS as HEURISTICS
from .runtime import Heuristic as Heuristic
from .runtime import OutOfBudgetError as OutOfBudgetError
from .runtime import OverheadLimitError as OverheadLimitError
from .runtime import ThrashWarning as ThrashWarning
from .simulator import OptimalResult as OptimalResult
from .simulator import SimResult as SimResult
from .simulator import optimal as optimal
from .simulator import simulate as simulate
from .stats import Stats as Stats
from .oplog import LogFormatError as LogFormatError
from .oplog import Trace as Trace
from .oplog import TraceRecorder as TraceRecorder
from .transform import CacheInfo as CacheInfo
from .transform import OpInfo as OpInfo
from .transform import cache_info as cache_info
from .transform import clear_caches as clear_caches
from .transform import Plan as Plan
from .transform import PolicyWarning as PolicyWarning
from .transform import AllocatorWarning as AllocatorWarning
from .transform import RooflineCostModel as RooflineCostModel
from .transform import SavePolicy as SavePolicy
from .transform import SlowPlanWarning as SlowPlanWarning
from .transform import grad as grad
from .transform import plan as plan
from .transform import remat_grad as remat_grad
from .transform import remat_value_and_grad as remat_value_and_grad
from .transform import value_and_grad as value_and_grad
from .transform import trace as trace

__version__ = "0.2.0"


def __getattr__(name: str):
    """`jdtr.nnx` after a plain `import jdtr`, as `jax.numpy` after `import
    jax`: imported on first use, so that Flax, an optional dependency, is
    imported only by those who use it."""
    if name == "nnx":
        import importlib

        return importlib.import_module(".nnx", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "nnx"])


__all__ = [
    "Budget",
    "CacheInfo",
    "DEFAULT_HEURISTIC",
    "HEURISTICS",
    "Heuristic",
    "LogFormatError",
    "OpInfo",
    "OptimalResult",
    "OutOfBudgetError",
    "OverheadLimitError",
    "ThrashWarning",
    "Plan",
    "PolicyWarning",
    "AllocatorWarning",
    "RooflineCostModel",
    "SavePolicy",
    "SimResult",
    "SlowPlanWarning",
    "Stats",
    "Trace",
    "TraceRecorder",
    "cache_info",
    "clear_caches",
    "grad",
    "optimal",
    "parse_budget",
    "plan",
    "plot",
    "remat_grad",
    "remat_value_and_grad",
    "simulate",
    "trace",
    "value_and_grad",
]
