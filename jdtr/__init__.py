"""jdtr: Dynamic Tensor Rematerialization for JAX.

Train models that do not fit in device memory: `jdtr.grad` computes JAX's
gradients eagerly under a hard byte budget, evicting device buffers and
recomputing them on demand (Kirisame et al., ICLR 2021).
"""

from .budget import Budget as Budget
from .budget import parse_budget as parse_budget
from .runtime import HEURISTICS as HEURISTICS
from .runtime import Heuristic as Heuristic
from .runtime import OutOfBudgetError as OutOfBudgetError
from .stats import Stats as Stats
from .transform import OpInfo as OpInfo
from .transform import RooflineCostModel as RooflineCostModel
from .transform import grad as grad
from .transform import value_and_grad as value_and_grad

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "HEURISTICS",
    "Heuristic",
    "OpInfo",
    "OutOfBudgetError",
    "RooflineCostModel",
    "Stats",
    "grad",
    "parse_budget",
    "value_and_grad",
]
