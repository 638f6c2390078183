"""Tracing, jaxpr normalisation and the eager interpreter (the JAX side of jdtr)."""

from .executable import OpInfo as OpInfo
from .executable import XlaCostModel as XlaCostModel
from .grad import grad as grad
from .grad import value_and_grad as value_and_grad
from .normalize import normalize as normalize
from .program import Program as Program

__all__ = ["OpInfo", "Program", "XlaCostModel", "grad", "normalize", "value_and_grad"]
