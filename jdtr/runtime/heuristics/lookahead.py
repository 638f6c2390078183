"""Beyond the paper: h_DTR^eq that reads the program's future instead of its past."""

from __future__ import annotations

import math
from typing import Iterable, Optional

from ..graph import Storage
from .base import ratio
from .dtr import DTREqClass

_UNASKED = object()  # a storage whose next use the schedule has not been asked this position


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
        self.scored()
        numerator = self.numerator(storage)
        size = storage.size
        a = numerator / size if size > 0 else math.inf
        schedule = self.run.schedule
        own = schedule.next_storage_use(storage)
        if own is None:  # not announced: no future to read, look at the past
            return ratio(numerator, storage, self.run.clock), (math.nan, math.nan)
        if size <= 0:
            return math.inf, (a, -own)
        position = schedule.position
        if limit == -math.inf:  # a cheap key: the storage's own next use bounds the score
            return math.inf, (a, -own)
        # The score is within `limit` only if the next need is at least this far ahead.
        if limit == math.inf or numerator <= 0:
            least = -math.inf
        elif limit <= 0:
            least = math.inf  # only a storage never needed again scores <= 0 here
        else:
            least = numerator / (size * limit) * (1 - 1e-9)
        need, done = self._next_need(storage, own, position, least)
        if not done:
            return math.inf, (a, -need)
        if need == math.inf:
            return 0.0, (a, -need)
        distance = need - position
        return (numerator / (size * distance) if distance > 0 else math.inf), (a, -need)

    def _next_need(self, storage: Storage, own: float, position: float, least: float) -> tuple[float, bool]:
        """The earliest next use of `storage` or of an evicted storage depending
        on it through evicted storages; gives up (False) once one is less than
        `least` ahead of `position`."""
        need = own
        if need - position < least:
            return need, False
        # The walk runs once per candidate a choice scores, over what may be a
        # large evicted region (a TreeLSTM's subtrees): its loop is kept lean,
        # the visits counted in one report.
        schedule = self.run.schedule
        next_use, known = schedule.next_storage_use, schedule.known_storage_uses()
        found: set[Storage] = set()
        stack = [s for s in storage.dependents if not s.resident and not s.banished]
        visits = 0
        while stack:
            s = stack.pop()
            visits += 1
            if s in found:
                continue
            found.add(s)
            use = known.get(s, _UNASKED)
            if use is _UNASKED:
                use = next_use(s)
            if use is not None and use < need:
                need = use
                if need - position < least:
                    self.read_metadata(visits)
                    return need, False
            for t in s.dependents:
                if not t.resident and not t.banished and t not in found:
                    stack.append(t)
        self.read_metadata(visits)
        return need, True

    def choose(self, pool: Iterable[Storage], now: float) -> Optional[Storage]:
        if self._index is not None:
            # A storage the program read since the last choice is needed later now.
            for tensor in self.run.schedule.passed_reads():
                self.touch(tensor.storage)
        return super().choose(pool, now)
