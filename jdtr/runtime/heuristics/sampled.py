"""App. E.2's sampling approximation of any heuristic."""

from __future__ import annotations

import math
import random
from typing import Iterable, Optional

from ..graph import Storage
from .base import Heuristic, IndexedHeuristic, RunView
from .registry import HEURISTICS


class Sampled(Heuristic):
    """App. E.2's approximation: score a random sample of ceil(sqrt(n)) of the n
    evictable storages and evict the lowest of those.

    Cheap on any pool, but it changes decisions (and at low budgets can miss
    the storages that matter, as the paper found), so it is an option, not a
    default. Not in `HEURISTICS`; use an instance: `Sampled("dtr_eq", seed=0)`.

    Args:
      base: the heuristic whose scores are sampled (its full-scan form is used).
      seed: the sampling's random seed.
    """

    def __init__(self, base: "str | type[IndexedHeuristic] | Heuristic" = "dtr_eq", seed: int = 0):
        super().__init__()
        if isinstance(base, str):
            base = HEURISTICS[base](indexed=False) if issubclass(HEURISTICS[base], IndexedHeuristic) else HEURISTICS[base]()
        self.base: Heuristic = base
        self.name = f"{base.name}_sampled"
        self.seed = seed
        self._rng = random.Random(seed)
        self._members: list[Storage] = []
        self._slot: dict[Storage, int] = {}

    def reset(self) -> None:
        super().reset()
        self.base.reset()
        self._rng = random.Random(self.seed)

    def attach(self, run: RunView) -> None:
        super().attach(run)
        self.base.attach(run)
        self._members, self._slot = [], {}

    def detach(self) -> None:
        super().detach()
        self.base.detach()
        self._members, self._slot = [], {}

    def score(self, storage: Storage, now: float) -> float:
        return self.base.score(storage, now)

    def choose(self, pool: Iterable[Storage], now: float) -> Optional[Storage]:
        members = self._members if pool is getattr(self.run, "pool", None) else list(pool)
        if not members:
            return None
        count = math.isqrt(len(members) - 1) + 1  # ceil(sqrt(n))
        sample = [members[i] for i in sorted(self._rng.sample(range(len(members)), count))]
        best, best_score = None, math.inf
        for storage in sample:
            self.scored()
            s = self.score(storage, now)
            if s <= best_score:
                best, best_score = storage, s
        return best

    def on_compute(self, storage: Storage) -> None:
        self.base.on_compute(storage)

    def on_evict(self, storage: Storage) -> None:
        self.base.on_evict(storage)

    def on_rematerialize(self, storage: Storage) -> None:
        self.base.on_rematerialize(storage)

    def on_banish(self, storage: Storage) -> None:
        self.base.on_banish(storage)

    def on_pool_add(self, storage: Storage, now: float) -> None:
        self._slot[storage] = len(self._members)
        self._members.append(storage)

    def on_pool_remove(self, storage: Storage) -> None:
        slot = self._slot.pop(storage, None)
        if slot is not None:
            last = self._members.pop()
            if last is not storage:
                self._members[slot] = last
                self._slot[last] = slot

    def __repr__(self) -> str:
        return f"Sampled({self.base!r}, seed={self.seed})"
