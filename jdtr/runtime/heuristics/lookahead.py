"""Beyond the paper: h_DTR^eq that reads the program's future instead of its past."""

from __future__ import annotations

import math
from typing import Iterable, Optional

from ..graph import Storage
from .base import RunView, ratio
from .dtr import DTREqClass
from .regions import live_evicted


def _use(use: Optional[float]) -> float:
    """A next use, inf for a storage never announced (nothing says it is needed)."""
    return math.inf if use is None else use


class Lookahead(DTREqClass):
    """Beyond the paper: h_DTR^eq with the time to the next use in place of staleness.

    h(S) = (c0(S) + cost of the evicted components next to S) / (m(S) * d(S))

    where d(S) is how far ahead (in program compute, the clock's unit) the
    program next needs S: its next read of S, or of an evicted storage that
    depends on S (recomputing that one needs S), whichever comes first. jdtr
    knows this because it sees the whole program (a jaxpr, or a log) before
    running it. It is Belady's rule for caches (evict what is needed furthest
    in the future) weighed by what bringing a storage back costs. A storage
    never needed again scores 0 and goes first; one the current operation
    reads scores infinity.

    It reads the run's `Schedule`, which the log replayer and `jdtr.grad`'s
    interpreter fill. A storage no driver announced is scored as h_DTR^eq
    scores it (staleness in place of d).
    """

    name = "lookahead"
    uses_schedule = True

    def index_time(self, now: float) -> float:
        # Keys are (a, -next use) against T = -position: T - b is the distance.
        return -self.run.schedule.position

    def score(self, storage: Storage, now: float) -> float:
        return self.evaluate(storage, now, math.inf)[0]

    def evaluate(self, storage: Storage, now: float, limit: float) -> tuple[float, tuple[float, ...]]:
        size = storage.size
        schedule = self.run.schedule
        own = schedule.next_storage_use(storage)
        if limit == -math.inf and own is not None and size > 0 and storage.cost > 0 and not self.negative_sets:
            # Only a key is asked (a storage joining the pool, or touched):
            # its own cost and next use bound the score from below while no
            # evicted component costs less than nothing, and they do not
            # change when a neighbouring component does, so a component's
            # touches leave it filed (`touch_all`). The exact numerator (a
            # union-find search of its neighbours) is left to a choice that
            # may take it: a TreeLSTM's evictions touch hundreds of frontier
            # storages each, and this was a fifth of a fresh tree's planning.
            self._own_keyed.add(storage)
            return math.inf, (storage.cost / size, -own)
        self._own_keyed.discard(storage)
        self.scored()
        numerator = self.numerator(storage)
        a = numerator / size if size > 0 else math.inf
        if own is None:  # not announced: no future to read, look at the past
            return ratio(numerator, storage, self.run.clock), (math.nan, math.nan)
        if size <= 0:
            return math.inf, (a, -own)
        if limit == -math.inf:  # a cheap key: the storage's own next use bounds the score
            return math.inf, (a, -own)
        need = self._next_need(storage, own)
        if need == math.inf:
            return 0.0, (a, -need)
        distance = need - schedule.position
        return (numerator / (size * distance) if distance > 0 else math.inf), (a, -need)

    def _next_need(self, storage: Storage, own: float) -> float:
        """The earliest next use of `storage` or of an evicted storage depending
        on it through evicted storages (`walked_need`), from the nearest needs
        its evicted dependents keep. (Exact in a few steps: the score is too,
        where a limit once cut a walk short.)"""
        need = own
        nearest = self._nearest
        dependents = storage.dependents
        for t in dependents:
            d = nearest.get(t)
            if d is not None and d < need:
                need = d
        self.read_metadata(len(dependents))
        return need

    def walked_need(self, storage: Storage) -> float:
        """The definition `_next_need` keeps incrementally: the earliest next
        use of `storage` or of any evicted storage reachable from it through
        evicted dependents (recomputing one of those needs `storage`), found
        by walking them; inf where none is ever needed again. The reference
        the tests compare with, and a walk per candidate per choice (a
        TreeLSTM's evicted subtrees: 175 storages a walk) was a third of a
        fresh tree's planning."""
        schedule = self.run.schedule
        need = _use(schedule.next_storage_use(storage))
        found: set[Storage] = set()
        stack = [s for s in storage.dependents if live_evicted(s)]
        while stack:
            s = stack.pop()
            if s in found:
                continue
            found.add(s)
            need = min(need, _use(schedule.next_storage_use(s)))
            stack.extend(t for t in s.dependents if live_evicted(t) and t not in found)
        return need

    # The nearest need of each evicted storage, kept as the evicted region
    # changes: near(t) = min(t's next use, near(u) for t's evicted dependents
    # u). Edges join only resident storages, and an evicted storage's next
    # use moves only when the program passes a read of it without reading it
    # (a `cond`'s branch not taken) or a read is announced for it (the branch
    # taken): the program reads it only once it is back. So near changes when
    # a storage leaves or joins the region, or at those reads, and each
    # change is carried up the evicted dependencies only as far as it changes
    # a near.

    def attach(self, run: RunView) -> None:
        super().attach(run)
        self._nearest: dict[Storage, float] = {}  # evicted storage -> near(t)
        self._own: dict[Storage, float] = {}  # evicted storage -> its own next use
        self._own_keyed: set[Storage] = set()  # storages last keyed by their own cost and next use

    def detach(self) -> None:
        super().detach()
        self._nearest, self._own, self._own_keyed = {}, {}, set()

    def touch_all(self, storages: Iterable[Storage]) -> None:
        """A frontier's touch (an evicted component next to them lost a
        member): a storage keyed by its own cost and next use stays filed,
        its key counts no component and no need. (Unless a component costs
        less than nothing: then the frontier's own keys may not bound.)"""
        if not self.negative_sets:
            own_keyed = self._own_keyed
            storages = [s for s in storages if s not in own_keyed]
        super().touch_all(storages)

    def on_evict(self, storage: Storage) -> None:
        super().on_evict(storage)
        if self.run.schedule is not None:
            self._own[storage] = _use(self.run.schedule.next_storage_use(storage))
            self._nearest[storage] = math.nan  # (never equal: set by `_carry`)
            self._carry([storage])

    def on_rematerialize(self, storage: Storage) -> None:
        super().on_rematerialize(storage)
        self._left(storage)

    def on_banish(self, storage: Storage) -> None:
        super().on_banish(storage)
        self._left(storage)

    def _left(self, storage: Storage) -> None:
        """`storage` left the evicted region: its evicted dependencies' near
        may rise (there are usually none: a return needs its inputs resident)."""
        if self._nearest.pop(storage, None) is not None:
            del self._own[storage]
            self._carry([p for p in storage.deps if p in self._nearest])

    def _moved(self, storage: Storage) -> None:
        """An evicted storage's next use moved (`choose`)."""
        if storage in self._own:
            self._own[storage] = _use(self.run.schedule.next_storage_use(storage))
            self._carry([storage])

    def _carry(self, stack: list[Storage]) -> None:
        """Recomputes near for these evicted storages, and up their evicted
        dependencies wherever it changed. A resident dependency whose near
        rose is touched: its need may have risen, and its key (the need
        it had) no longer bounds its score."""
        nearest, own = self._nearest, self._own
        while stack:
            s = stack.pop()
            near = own[s]
            for u in s.dependents:
                d = nearest.get(u)
                if d is not None and d < near:
                    near = d
            before = nearest[s]
            if near != before:
                nearest[s] = near
                rose = near > before  # (False for a storage just evicted: its near was nan)
                for p in s.deps:
                    if p in nearest:
                        stack.append(p)
                    elif rose and p.resident:
                        self.touch(p)

    def choose(self, pool: Iterable[Storage], now: float) -> Optional[Storage]:
        schedule = self.run.schedule
        if schedule is not None:
            for storage in schedule.late_announcements():
                self._moved(storage)
            for tensor in schedule.passed_reads():
                # A storage the program read since the last choice is needed later now.
                self.touch(tensor.storage)
                if not tensor.storage.resident:
                    self._moved(tensor.storage)
        return super().choose(pool, now)
