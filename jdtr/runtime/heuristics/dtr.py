"""The paper's h_DTR family (§2, App. C.2-C.3): full e*, equivalence classes, local."""

from __future__ import annotations

import math

from ..graph import Storage
from ..index import RatioIndex
from ..union_find import CostSet, find
from .base import RatioHeuristic, ratio
from .components import ComponentHeuristic
from .regions import above, bounded_neighborhood, evicted_neighborhood, live_evicted, search_budget, storage_cost, total_cost


class DTRFull(ComponentHeuristic):
    """h_DTR: (c0 + sum of c0 over e*(S)) / (m * s), exact e* by graph search.

    Indexed, a search stops as soon as the cost found makes S lose to the best
    storage so far.
    """

    name = "dtr_full"

    def score(self, storage: Storage, now: float) -> float:
        neighborhood = evicted_neighborhood(storage, self)
        cost = storage.cost + total_cost(neighborhood)
        return ratio(cost, storage, now)

    def make_index(self) -> RatioIndex:
        return RatioIndex(self.evaluate)

    def evaluate(self, storage: Storage, now: float, limit: float) -> tuple[float, tuple[float, ...]]:
        self.scored()
        size, cost = storage.size, storage.cost
        a = cost / size if size > 0 else math.inf
        denominator = size * (now - storage.last_access)
        if denominator <= 0 or limit == -math.inf:
            return (ratio(cost, storage, now) if denominator > 0 else math.inf), (a, storage.last_access)
        neighborhood, weight = bounded_neighborhood(storage, self, storage_cost, search_budget(limit * denominator - cost))
        if neighborhood is None:
            return above(limit, (cost + weight) / denominator), ((cost + weight) / size, storage.last_access)
        total = cost + total_cost(neighborhood)
        return ratio(total, storage, now), (total / size, storage.last_access)


class DTREqClass(ComponentHeuristic, RatioHeuristic):
    """h_DTR^eq: e* relaxed to undirected evicted components in a union-find (App. C.2).

    Splitting approximation: when a storage is rematerialized, its cost leaves
    its component's sum and it starts a new empty set; the component itself is
    not split, so "phantom" connections can remain.
    """

    name = "dtr_eq"
    # Keys count each evicted set at a floor up to this much under its cost
    # (`ComponentHeuristic`). Planning a 24-block Flax GPT at 0.5 of its step
    # refiled 2.4 million keys over 30 simulations before (20 of its 54 s);
    # with floors the simulations take 7 s, their decisions the same.
    floor_slack = 1 / 8

    def numerator(self, storage: Storage) -> float:
        return storage.cost + sum(r.cost for r in self._roots(storage).values())

    def _roots(self, storage: Storage) -> dict[int, CostSet]:
        """The distinct sets of `storage`'s evicted neighbours."""
        roots: dict[int, CostSet] = {}
        neighbors = (*storage.deps, *storage.dependents)
        self.read_metadata(len(neighbors))
        for neighbor in neighbors:
            if neighbor.heuristic_state is not None and live_evicted(neighbor):
                root = find(neighbor.heuristic_state)
                roots[id(root)] = root
        return roots

    def keys_count_floors(self) -> bool:
        # Not for a subclass that scores otherwise (its own `numerator` or
        # `evaluate`, as `Lookahead`): its keys are its own.
        cls = type(self)
        return cls.evaluate is DTREqClass.evaluate and cls.numerator is DTREqClass.numerator

    def evaluate(self, storage: Storage, now: float, limit: float) -> tuple[float, tuple[float, ...]]:
        self.scored()
        roots = self._roots(storage)
        numerator = storage.cost + sum(r.cost for r in roots.values())  # (as `numerator` sums: the same score)
        floor = storage.cost + sum(r.floor for r in roots.values())
        size = storage.size
        return ratio(numerator, storage, now), ((floor / size if size > 0 else math.inf), storage.last_access)


class DTRLocal(RatioHeuristic):
    """h_DTR^local: c0 / (m * s), the storage's own cost only."""

    name = "dtr_local"

    def numerator(self, storage: Storage) -> float:
        return storage.cost
