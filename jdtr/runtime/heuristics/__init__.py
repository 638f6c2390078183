"""Eviction heuristics (paper §2, §4.1, App. C.3), one family per module.

* `base`: what a heuristic is (`Heuristic`, the indexed and ratio forms, the
  `RunView` it reads the run through);
* `regions`: searches of evicted regions (e*);
* `components`: h_DTR^eq's union-find components;
* `dtr`: the paper's h_DTR, h_DTR^eq and h_DTR^local;
* `baselines`: LRU, size, MSPS, e* and random;
* `lookahead`: h_DTR^eq with the distance to the next use;
* `sampled`: App. E.2's sampling of any of them;
* `registry`: names, the default, and `get_heuristic`.
"""

from .base import Heuristic as Heuristic
from .base import IndexedHeuristic as IndexedHeuristic
from .base import RatioHeuristic as RatioHeuristic
from .base import RunView as RunView
from .baselines import LRU as LRU
from .baselines import MSPS as MSPS
from .baselines import EStar as EStar
from .baselines import Random as Random
from .baselines import Size as Size
from .dtr import DTREqClass as DTREqClass
from .dtr import DTRFull as DTRFull
from .dtr import DTRLocal as DTRLocal
from .lookahead import Lookahead as Lookahead
from .regions import evicted_neighborhood as evicted_neighborhood
from .registry import DEFAULT_HEURISTIC as DEFAULT_HEURISTIC
from .registry import HEURISTICS as HEURISTICS
from .registry import get_heuristic as get_heuristic
from .sampled import Sampled as Sampled

__all__ = [
    "DEFAULT_HEURISTIC",
    "DTREqClass",
    "DTRFull",
    "DTRLocal",
    "EStar",
    "HEURISTICS",
    "Heuristic",
    "IndexedHeuristic",
    "LRU",
    "Lookahead",
    "MSPS",
    "Random",
    "RatioHeuristic",
    "RunView",
    "Sampled",
    "Size",
    "evicted_neighborhood",
    "get_heuristic",
]
