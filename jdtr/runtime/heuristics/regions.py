"""Evicted regions of the storage graph: e*(S) and its bounded searches (§2).

A storage's evicted neighbourhood e*(S) is what evicting it would drag along:
the evicted ancestors needed to recompute it, and the evicted descendants
that need it. The searches here report the storages they visit to the
heuristic that asked (`Heuristic.read_metadata`, App. D.3).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Optional

from ..graph import Storage
from .base import Heuristic

Edges = Callable[[Storage], list[Storage]]


def live_evicted(storage: Storage) -> bool:
    """Evicted but still recomputable (not banished)."""
    return not storage.resident and not storage.banished


def deps(s: Storage) -> list[Storage]:
    return s.deps


def dependents(s: Storage) -> list[Storage]:
    return s.dependents


def region(
    start: Storage,
    edges: Edges,
    counter: Heuristic,
    weight: Optional[Callable[[Storage], float]] = None,
    budget: float = math.inf,
    counted: frozenset = frozenset(),
) -> tuple[set[Storage], float, bool]:
    """Evicted storages reachable from `start` through evicted storages only.

    With a `weight`, also their total weight (storages in `counted` weigh 0),
    and the search gives up as soon as that total exceeds `budget`.
    Returns (storages found, their total weight, whether the search finished).
    """
    found: set[Storage] = set()
    total = 0.0
    visits = 0
    stack = [s for s in edges(start) if not s.resident and not s.banished]
    while stack:
        s = stack.pop()
        visits += 1
        if s in found:
            continue
        found.add(s)
        if weight is not None and s not in counted:
            total += weight(s)
            if total > budget:
                counter.read_metadata(visits)
                return found, total, False
        for t in edges(s):
            if not t.resident and not t.banished and t not in found:
                stack.append(t)
    counter.read_metadata(visits)
    return found, total, True


def evicted_closure(start: Storage, edges: Edges, counter: Heuristic) -> set[Storage]:
    """Evicted storages reachable from `start` through evicted storages only."""
    return region(start, edges, counter)[0]


def evicted_neighborhood(storage: Storage, counter: Optional[Heuristic] = None) -> set[Storage]:
    """e*(S): evicted ancestors needed to recompute S, plus evicted descendants needing S (§2)."""
    counter = counter or Heuristic()
    return evicted_closure(storage, deps, counter) | evicted_closure(storage, dependents, counter)


def bounded_neighborhood(
    storage: Storage, counter: Heuristic, weight: Callable[[Storage], float], budget: float, ancestors_only: bool = False
) -> tuple[Optional[set[Storage]], float]:
    """e*(S) (or its ancestors only) if its total weight is within `budget`,
    else (None, a lower bound of that weight above `budget`)."""
    ancestors, total, done = region(storage, deps, counter, weight, budget)
    if not done:
        return None, total
    if ancestors_only:
        return ancestors, total
    descendants, more, done = region(storage, dependents, counter, weight, budget - total, frozenset(ancestors))
    if not done:
        return None, total + more
    return ancestors | descendants, total + more


def above(limit: float, value: float) -> float:
    """A search given up at `limit` reports a score above it, whatever the rounding."""
    return max(value, math.nextafter(limit, math.inf))


def search_budget(limit: float) -> float:
    """A search budget a little above `limit`, so that giving up is never a rounding error."""
    return limit + abs(limit) * 1e-9 + 1e-12


def total_cost(storages: Iterable[Storage]) -> float:
    """The exactly rounded sum of the costs: a set iterates in memory-address
    order, and a plain float sum would depend on it (and so would ties)."""
    return math.fsum(s.cost for s in storages)


def storage_cost(s: Storage) -> float:
    return s.cost


def unit(s: Storage) -> float:
    return 1.0
