"""Heuristics by name: what the API edge resolves a `heuristic=` string with."""

from __future__ import annotations

from .base import Heuristic
from .baselines import LRU, MSPS, EStar, Random, Size
from .dtr import DTREqClass, DTRFull, DTRLocal
from .lookahead import Lookahead

# What `jdtr.grad` uses unless told otherwise. It sees the whole program before
# running it, so it fills the runtime's `Schedule`, and the lookahead heuristic
# beat h_DTR^eq on every log we measured (docs/heuristics.md). `jdtr.plan`, the
# simulator and a bare `Runtime` keep the paper's h_DTR^eq (plans from it fit
# XLA's compiled memory better; replayed logs are compared with the paper).
DEFAULT_HEURISTIC = "lookahead"

HEURISTICS: dict[str, type[Heuristic]] = {
    cls.name: cls for cls in (DTRFull, DTREqClass, DTRLocal, LRU, Size, MSPS, EStar, Random, Lookahead)
}


def get_heuristic(heuristic: "str | Heuristic") -> Heuristic:
    """A fresh heuristic for a name, or the given instance, reset."""
    if isinstance(heuristic, Heuristic):
        heuristic.reset()
        return heuristic
    if isinstance(heuristic, str) and heuristic in HEURISTICS:
        return HEURISTICS[heuristic]()
    raise ValueError(
        f"unknown heuristic {heuristic!r}; expected one of {sorted(HEURISTICS)} or a jdtr.runtime.Heuristic instance"
    )
