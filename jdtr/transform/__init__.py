"""Tracing, jaxpr normalisation and the eager interpreter (the JAX side of jdtr)."""

from .costs import OpInfo as OpInfo
from .costs import RooflineCostModel as RooflineCostModel
from .grad import grad as grad
from .grad import value_and_grad as value_and_grad
from .normalize import normalize as normalize
from .checkpoint_plan import Plan as Plan
from .checkpoint_plan import SavePolicy as SavePolicy
from .checkpoint_plan import Segment as Segment
from .checkpoint_plan import plan as plan
from .checkpoint_plan import remat_grad as remat_grad
from .checkpoint_plan import remat_value_and_grad as remat_value_and_grad
from .program import Program as Program

__all__ = [
    "OpInfo",
    "Plan",
    "Program",
    "RooflineCostModel",
    "SavePolicy",
    "Segment",
    "grad",
    "normalize",
    "plan",
    "remat_grad",
    "remat_value_and_grad",
    "value_and_grad",
]
