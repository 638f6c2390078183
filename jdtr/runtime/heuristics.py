"""Eviction heuristics (paper §2, §4.1, App. C.3).

A heuristic scores each evictable storage; the runtime evicts the lowest
score. All of the paper's heuristics are written over three measures of a
storage S at clock time T:

  staleness s(S) = T - last_access(S)   (the clock advances by op cost)
  memory    m(S) = size(S)
  cost      c(S) = cost of recomputing S, plus some neighbourhood of it

Writing your own heuristic: subclass `Heuristic`, set `name`, and implement
`score(storage, now)`. Lower scores are evicted first. If it needs to track
state across evictions, override the `on_*` hooks; they are called by the
runtime after the event. Pass the instance wherever a heuristic name is
accepted (`jdtr.grad(f, heuristic=MyHeuristic())`). A heuristic object holds
per-run state, so the runtime calls `reset()` before each run.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Iterable, Optional

from .graph import Storage
from .union_find import CostSet, find, union


def ratio(numerator: float, storage: Storage, now: float) -> float:
    """numerator / (m * s), infinite when m * s <= 0: an empty or just-used
    storage is never worth evicting (the paper's simulator, no epsilon)."""
    denominator = storage.size * (now - storage.last_access)
    return numerator / denominator if denominator > 0 else math.inf


class Heuristic:
    """Base class: scores storages; lower is evicted first."""

    name = "heuristic"

    def __init__(self) -> None:
        self.evaluations = 0  # App. D.3: heuristic evaluations
        self.metadata_accesses = 0  # App. D.3: storages visited for metadata

    def reset(self) -> None:
        self.evaluations = 0
        self.metadata_accesses = 0

    def score(self, storage: Storage, now: float) -> float:
        raise NotImplementedError

    def choose(self, pool: Iterable[Storage], now: float) -> Optional[Storage]:
        """The storage to evict next: the lowest score.

        As in the paper's simulator: the pool is scanned in order, ties go to
        the later storage, and a score of 0 (free to recompute) stops the scan.
        """
        best, best_score = None, math.inf
        for storage in pool:
            self.evaluations += 1
            self.metadata_accesses += 1
            s = self.score(storage, now)
            if s <= best_score:
                best, best_score = storage, s
                if s == 0:
                    break
        return best

    # Events the runtime reports after they happen.
    def on_compute(self, storage: Storage) -> None:
        """`storage` became resident for the first time."""

    def on_evict(self, storage: Storage) -> None:
        """`storage` was evicted (by choice or because it was dead)."""

    def on_rematerialize(self, storage: Storage) -> None:
        """`storage` became resident again."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _evicted_closure(start: Storage, edges: Callable[[Storage], list[Storage]], counter: "Heuristic") -> set[Storage]:
    """Evicted storages reachable from `start` through evicted storages only."""
    found: set[Storage] = set()
    stack = [s for s in edges(start) if not s.resident and not s.banished]
    while stack:
        s = stack.pop()
        counter.metadata_accesses += 1
        if s in found:
            continue
        found.add(s)
        stack.extend(t for t in edges(s) if not t.resident and not t.banished and t not in found)
    return found


def evicted_neighborhood(storage: Storage, counter: Optional[Heuristic] = None) -> set[Storage]:
    """e*(S): evicted ancestors needed to recompute S, plus evicted descendants needing S (§2)."""
    counter = counter or Heuristic()
    return _evicted_closure(storage, lambda s: s.deps, counter) | _evicted_closure(
        storage, lambda s: s.dependents, counter
    )


class DTRFull(Heuristic):
    """h_DTR: (c0 + sum of c0 over e*(S)) / (m * s), exact e* by graph search."""

    name = "dtr_full"

    def score(self, storage: Storage, now: float) -> float:
        neighborhood = evicted_neighborhood(storage, self)
        cost = storage.cost + sum(s.cost for s in neighborhood)
        return ratio(cost, storage, now)


class DTREqClass(Heuristic):
    """h_DTR^eq: e* relaxed to undirected evicted components in a union-find (App. C.2).

    Splitting approximation: when a storage is rematerialized, its cost leaves
    its component's sum and it starts a new empty set; the component itself is
    not split, so "phantom" connections can remain.
    """

    name = "dtr_eq"

    # A resident storage has no set; an evicted one belongs to exactly one.

    def on_evict(self, storage: Storage) -> None:
        node = CostSet(storage.cost)
        storage.heuristic_state = node
        for neighbor in (*storage.deps, *storage.dependents):
            self.metadata_accesses += 1
            if neighbor.heuristic_state is not None and not neighbor.resident and not neighbor.banished:
                node = union(neighbor.heuristic_state, node)

    def on_rematerialize(self, storage: Storage) -> None:
        if storage.heuristic_state is not None:
            find(storage.heuristic_state).cost -= storage.cost
            storage.heuristic_state = None

    def score(self, storage: Storage, now: float) -> float:
        roots: dict[int, CostSet] = {}
        for neighbor in (*storage.deps, *storage.dependents):
            self.metadata_accesses += 1
            if neighbor.heuristic_state is not None and not neighbor.resident and not neighbor.banished:
                root = find(neighbor.heuristic_state)
                roots[id(root)] = root
        return ratio(storage.cost + sum(r.cost for r in roots.values()), storage, now)


class DTRLocal(Heuristic):
    """h_DTR^local: c0 / (m * s), the storage's own cost only."""

    name = "dtr_local"

    def score(self, storage: Storage, now: float) -> float:
        return ratio(storage.cost, storage, now)


class LRU(Heuristic):
    """h_LRU: 1 / s, evict the least recently used (scored by last access)."""

    name = "lru"

    def score(self, storage: Storage, now: float) -> float:
        return storage.last_access


class Size(Heuristic):
    """h_size: 1 / m, evict the largest (GreedyRemat, Kumar et al. 2019)."""

    name = "size"

    def score(self, storage: Storage, now: float) -> float:
        return 1.0 / storage.size if storage.size > 0 else math.inf


class MSPS(Heuristic):
    """h_MSPS: (c0 + c0 of evicted ancestors e_R) / m (Peng et al. 2020)."""

    name = "msps"

    def score(self, storage: Storage, now: float) -> float:
        ancestors = _evicted_closure(storage, lambda s: s.deps, self)
        if storage.size <= 0:
            return math.inf
        return (storage.cost + sum(s.cost for s in ancestors)) / storage.size


class EStar(Heuristic):
    """h_e*: the smallest evicted neighbourhood |e*(S)|, the heuristic of Theorem 3.1.

    Ties go to the stalest storage, which spreads checkpoints evenly over a
    linear chain as the proof requires (App. A.3).
    """

    name = "estar"

    def score(self, storage: Storage, now: float) -> float:
        count = len(evicted_neighborhood(storage, self))
        return count + 1.0 / (1.0 + max(now - storage.last_access, 0.0))


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


HEURISTICS: dict[str, type[Heuristic]] = {
    cls.name: cls for cls in (DTRFull, DTREqClass, DTRLocal, LRU, Size, MSPS, EStar, Random)
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
