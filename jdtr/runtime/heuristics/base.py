"""What a heuristic is (paper §2, App. C.3): a score per evictable storage.

All of the paper's heuristics are written over three measures of a storage S
at clock time T:

  staleness s(S) = T - last_access(S)   (the clock advances by op cost)
  memory    m(S) = size(S)
  cost      c(S) = cost of recomputing S, plus some neighbourhood of it

Writing your own heuristic: subclass `Heuristic`, set `name`, and implement
`score(storage, now)`. Lower scores are evicted first. If it needs to track
state across evictions, override the `on_*` hooks; the runtime calls them
after the event. Pass the instance wherever a heuristic name is accepted
(`jdtr.grad(f, heuristic=MyHeuristic())`). A heuristic object holds per-run
state, so the runtime calls `reset()` before each run.

A heuristic sees the run through a `RunView` (the clock, the evictable
pool, the program's future), never the runtime itself. What it costs to
decide (App. D.3's heuristic evaluations and metadata accesses) is
telemetry: it is reported to the run's observers (`Observer.on_score`,
`Observer.on_metadata`), not kept in the heuristic.

Choosing fast. The paper's simulator scores the whole pool at every eviction
(`Heuristic.choose`, kept as the reference). The built-in heuristics instead
keep the pool in an index (`jdtr.runtime.index`) that finds the same storage
while scoring only those that could beat the best: the decisions are
identical, only cheaper on large pools. `indexed=False` selects the full scan
(e.g. `DTREqClass(indexed=False)`).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence

from ..graph import Storage
from ..index import OrderIndex, RatioIndex
from ..observer import Observer
from ..schedule import Schedule


class RunView(Protocol):
    """What a heuristic may read of the run it serves (the runtime is one)."""

    @property
    def clock(self) -> float:
        """The run's time: 1 plus the cost of every operator run so far."""

    @property
    def pool(self) -> Mapping[Storage, None]:
        """The evictable storages, oldest first."""

    @property
    def schedule(self) -> Optional[Schedule]:
        """The program's future accesses, when a driver announces them."""

    @property
    def observers(self) -> Sequence[Observer]:
        """The run's telemetry receivers."""


def ratio(numerator: float, storage: Storage, now: float) -> float:
    """numerator / (m * s), infinite when m * s <= 0: an empty or just-used
    storage is never worth evicting (the paper's simulator, no epsilon)."""
    denominator = storage.size * (now - storage.last_access)
    return numerator / denominator if denominator > 0 else math.inf


def _overrides(observer: Observer, hook: str) -> bool:
    return getattr(type(observer), hook) is not getattr(Observer, hook)


class Heuristic:
    """Base class: scores storages; lower is evicted first."""

    name = "heuristic"
    uses_schedule = False  # whether it reads the run's `Schedule` (the program's future)

    def __init__(self) -> None:
        self.run: Optional[RunView] = None
        # The observers that count the work of deciding (App. D.3); empty
        # unless some observer listens, so that deciding pays nothing for it.
        self._on_score: tuple = ()
        self._on_metadata: tuple = ()

    def reset(self) -> None:
        """Forgets what a previous run left (the runtime calls it before `attach`)."""

    def attach(self, run: RunView) -> None:
        """A run starts (called by the runtime's constructor, after `reset`)."""
        self.run = run
        self._on_score = tuple(o.on_score for o in run.observers if _overrides(o, "on_score"))
        self._on_metadata = tuple(o.on_metadata for o in run.observers if _overrides(o, "on_metadata"))

    def detach(self) -> None:
        """The run is over (`Runtime.free_all`): drop every reference to it, so
        that an instance the caller keeps does not keep the run's storages (and
        their device buffers) alive."""
        self.run = None
        self._on_score, self._on_metadata = (), ()

    def scored(self, count: int = 1) -> None:
        """Reports `count` heuristic evaluations to the run's observers."""
        for report in self._on_score:
            report(count)

    def read_metadata(self, count: int = 1) -> None:
        """Reports `count` storages whose metadata a search visited."""
        for report in self._on_metadata:
            report(count)

    def score(self, storage: Storage, now: float) -> float:
        raise NotImplementedError

    def choose(self, pool: Iterable[Storage], now: float) -> Optional[Storage]:
        """The storage to evict next: the lowest score.

        As in the paper's simulator: the pool is scanned in order, ties go to
        the later storage, and a score of 0 (free to recompute) stops the scan.
        """
        best, best_score = None, math.inf
        for storage in pool:
            self.scored()
            self.read_metadata()
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

    def on_banish(self, storage: Storage) -> None:
        """`storage` was freed for good (App. C.5): it can no longer be rematerialized."""

    def on_pool_add(self, storage: Storage, now: float) -> None:
        """`storage` became evictable; it is now last in the pool."""

    def on_pool_remove(self, storage: Storage) -> None:
        """`storage` left the pool (evicted, locked or pinned)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class IndexedHeuristic(Heuristic):
    """A heuristic that chooses through an index of the pool (`jdtr.runtime.index`).

    It takes the decisions of the full scan (`Heuristic.choose`) while scoring
    only the storages that could win. A subclass provides `evaluate` (its
    score within a limit, and an index key) and `touch`es the pool members
    whose score may drop for another reason than time passing.

    Args:
      indexed: False to scan the whole pool at every eviction, as the paper's simulator does.
    """

    def __init__(self, indexed: bool = True):
        super().__init__()
        self.indexed = indexed
        self._index: "RatioIndex | OrderIndex | None" = None
        self._pool: Any = None

    def make_index(self) -> "RatioIndex | OrderIndex":
        raise NotImplementedError

    def evaluate(self, storage: Storage, now: float, limit: float) -> tuple[float, tuple[float, ...]]:
        """(score, key): the exact score when it is <= `limit`, else any
        value above `limit`; and a key that bounds the score from below."""
        raise NotImplementedError

    def index_time(self, now: float) -> float:
        """The time the index's keys are measured against (the run's clock by default)."""
        return now

    def attach(self, run: RunView) -> None:
        super().attach(run)
        self._pool = run.pool
        self._index = self.make_index() if self.indexed and self._evaluate_matches_score() else None

    def detach(self) -> None:
        super().detach()
        self._pool, self._index = None, None

    @classmethod
    def _evaluate_matches_score(cls) -> bool:
        """False for a subclass that redefines `score` but not `evaluate`:
        the index would not take its decisions, so it scans."""
        defining = {name: next(c for c in cls.__mro__ if name in c.__dict__) for name in ("score", "evaluate")}
        return issubclass(defining["evaluate"], defining["score"])

    def choose(self, pool: Iterable[Storage], now: float) -> Optional[Storage]:
        if self._index is None or pool is not self._pool:
            return super().choose(pool, now)  # not the pool the index mirrors
        victim = self._index.choose(pool, self.index_time(now))
        if victim is None and self._index:
            return super().choose(pool, now)  # a case the index leaves to the scan
        return victim

    def touch(self, storage: Storage) -> None:
        """`storage`'s score may have dropped: its key is refreshed before the next choice."""
        if self._index is not None:
            self._index.touch(storage)

    def touch_all(self, storages: Iterable[Storage]) -> None:
        """`touch` of each."""
        if self._index is not None:
            self._index.touch_all(storages)

    def on_pool_add(self, storage: Storage, now: float) -> None:
        if self._index is not None:
            self._index.add(storage, self.index_time(now))

    def on_pool_remove(self, storage: Storage) -> None:
        if self._index is not None:
            self._index.remove(storage)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()" if self.indexed else f"{type(self).__name__}(indexed=False)"


class RatioHeuristic(IndexedHeuristic):
    """h = numerator(S) / (m(S) * s(S)): every h_DTR variant (§2, App. C.3).

    Indexed by (numerator / m, last access) in a `RatioIndex`. A subclass
    implements `numerator`, and touches a storage whenever its numerator may
    have decreased.
    """

    def numerator(self, storage: Storage) -> float:
        raise NotImplementedError

    def score(self, storage: Storage, now: float) -> float:
        return ratio(self.numerator(storage), storage, now)

    def make_index(self) -> RatioIndex:
        return RatioIndex(self.evaluate)

    def evaluate(self, storage: Storage, now: float, limit: float) -> tuple[float, tuple[float, ...]]:
        self.scored()
        numerator = self.numerator(storage)
        a = numerator / storage.size if storage.size > 0 else math.inf
        return ratio(numerator, storage, now), (a, storage.last_access)


def order_index(heuristic: IndexedHeuristic) -> OrderIndex:
    """An index for keys whose first element orders the scores at any time."""
    return OrderIndex(heuristic.evaluate, _first_key)


def _first_key(key: tuple[float, ...], now: float) -> float:
    return key[0]
