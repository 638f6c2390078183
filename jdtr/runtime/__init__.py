"""The DTR algorithm itself: no JAX here, so it runs on device buffers and in simulation alike."""

from .errors import OutOfBudgetError as OutOfBudgetError
from .errors import OverheadLimitError as OverheadLimitError
from .errors import ThrashWarning as ThrashWarning
from .errors import format_bytes as format_bytes
from .graph import Operator as Operator
from .graph import Storage as Storage
from .graph import Tensor as Tensor
from .heuristics import DEFAULT_HEURISTIC as DEFAULT_HEURISTIC
from .heuristics import HEURISTICS as HEURISTICS
from .heuristics import Heuristic as Heuristic
from .heuristics import IndexedHeuristic as IndexedHeuristic
from .heuristics import RatioHeuristic as RatioHeuristic
from .heuristics import RunView as RunView
from .heuristics import Sampled as Sampled
from .heuristics import evicted_neighborhood as evicted_neighborhood
from .heuristics import get_heuristic as get_heuristic
from .observer import Counters as Counters
from .observer import Observer as Observer
from .observer import Timeline as Timeline
from .observer import TimelineEvent as TimelineEvent
from .runtime import DEALLOC_POLICIES as DEALLOC_POLICIES
from .runtime import Backend as Backend
from .runtime import NullBackend as NullBackend
from .runtime import Runtime as Runtime
from .runtime import ThrashError as ThrashError
from .schedule import Schedule as Schedule
from .schedule import future_uses as future_uses
from .schedule import operation_costs as operation_costs

__all__ = [
    "Backend",
    "Counters",
    "DEALLOC_POLICIES",
    "DEFAULT_HEURISTIC",
    "HEURISTICS",
    "Heuristic",
    "IndexedHeuristic",
    "NullBackend",
    "Observer",
    "Operator",
    "OutOfBudgetError",
    "OverheadLimitError",
    "RatioHeuristic",
    "RunView",
    "Runtime",
    "Sampled",
    "Schedule",
    "Storage",
    "Tensor",
    "ThrashError",
    "ThrashWarning",
    "Timeline",
    "TimelineEvent",
    "evicted_neighborhood",
    "format_bytes",
    "future_uses",
    "operation_costs",
    "get_heuristic",
]
