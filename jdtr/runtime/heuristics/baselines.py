"""The baselines the paper compares DTR with (§4.1): LRU, size, MSPS, e*, random."""

from __future__ import annotations

import math
import random

from ..graph import Storage
from ..index import OrderIndex
from .base import Heuristic, IndexedHeuristic, order_index
from .components import ComponentHeuristic
from .regions import above, bounded_neighborhood, deps, evicted_closure, evicted_neighborhood, search_budget, storage_cost, total_cost, unit


class LRU(IndexedHeuristic):
    """h_LRU: 1 / s, evict the least recently used (scored by last access)."""

    name = "lru"

    def score(self, storage: Storage, now: float) -> float:
        return storage.last_access

    make_index = order_index

    def evaluate(self, storage: Storage, now: float, limit: float) -> tuple[float, tuple[float, ...]]:
        self.scored()
        return storage.last_access, (storage.last_access,)


class Size(IndexedHeuristic):
    """h_size: 1 / m, evict the largest (GreedyRemat, Kumar et al. 2019)."""

    name = "size"

    def score(self, storage: Storage, now: float) -> float:
        return 1.0 / storage.size if storage.size > 0 else math.inf

    make_index = order_index

    def evaluate(self, storage: Storage, now: float, limit: float) -> tuple[float, tuple[float, ...]]:
        self.scored()
        s = self.score(storage, now)
        return s, (s,)


class MSPS(ComponentHeuristic):
    """h_MSPS: (c0 + c0 of evicted ancestors e_R) / m (Peng et al. 2020)."""

    name = "msps"

    def score(self, storage: Storage, now: float) -> float:
        ancestors = evicted_closure(storage, deps, self)
        if storage.size <= 0:
            return math.inf
        return (storage.cost + total_cost(ancestors)) / storage.size

    make_index = order_index

    def evaluate(self, storage: Storage, now: float, limit: float) -> tuple[float, tuple[float, ...]]:
        self.scored()
        size, cost = storage.size, storage.cost
        if size <= 0:
            return math.inf, (math.inf,)
        if limit == -math.inf:
            return cost / size, (cost / size,)
        ancestors, weight = bounded_neighborhood(storage, self, storage_cost, search_budget(limit * size - cost), ancestors_only=True)
        if ancestors is None:
            return above(limit, (cost + weight) / size), ((cost + weight) / size,)
        s = (cost + total_cost(ancestors)) / size
        return s, (s,)


class EStar(ComponentHeuristic):
    """h_e*: the smallest evicted neighbourhood |e*(S)|, the heuristic of Theorem 3.1.

    With unit costs and sizes this is Def. A.2's (c(S) + c0(S)) / m(S) up to
    the constant 1 (Corollary A.1). The proof (Lemma A.3) needs only that a
    storage of smallest |e*| is evicted, whichever of the tied ones it is;
    ties go to the stalest storage here (a fraction in (0, 1] added to the
    count), which keeps the choice deterministic and in our measurements
    gave the fewest operations on a linear chain in our runs.
    """

    name = "estar"

    def score(self, storage: Storage, now: float) -> float:
        count = len(evicted_neighborhood(storage, self))
        return count + 1.0 / (1.0 + max(now - storage.last_access, 0.0))

    def make_index(self) -> OrderIndex:
        return OrderIndex(self.evaluate, _estar_bound)

    def evaluate(self, storage: Storage, now: float, limit: float) -> tuple[float, tuple[float, ...]]:
        self.scored()
        fraction = 1.0 / (1.0 + max(now - storage.last_access, 0.0))
        if limit == -math.inf:
            return fraction, (0.0, storage.last_access)
        neighborhood, count = bounded_neighborhood(storage, self, unit, search_budget(limit - fraction))
        if neighborhood is None:
            return above(limit, count + fraction), (count, storage.last_access)
        count = len(neighborhood)
        return count + fraction, (float(count), storage.last_access)


def _estar_bound(key: tuple[float, ...], now: float) -> float:
    """count + 1 / (1 + staleness) for a count and last access that are lower bounds."""
    return key[0] + 1.0 / (1.0 + max(now - key[1], 0.0))


class Random(Heuristic):
    """h_rand: a uniformly random evictable storage (seeded, so reproducible)."""

    name = "random"

    def __init__(self, seed: int = 0):
        super().__init__()
        self.seed = seed
        self._rng = random.Random(seed)

    def reset(self) -> None:
        super().reset()
        self._rng = random.Random(self.seed)

    def score(self, storage: Storage, now: float) -> float:
        return self._rng.random()

    def __repr__(self) -> str:
        return f"Random(seed={self.seed})"
