"""Tracing, jaxpr normalisation and the eager interpreter (the JAX side of jdtr)."""

from .costs import OpInfo as OpInfo
from .costs import RooflineCostModel as RooflineCostModel
from .grad import grad as grad
from .grad import value_and_grad as value_and_grad
from .normalize import normalize as normalize
from .program import Program as Program

__all__ = ["OpInfo", "Program", "RooflineCostModel", "grad", "normalize", "value_and_grad"]
