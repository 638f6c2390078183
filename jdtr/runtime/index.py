"""Indexes of the evictable pool: choosing a victim without scoring every storage.

The paper's simulator (and its prototype, App. E.2) scores the whole pool at
each eviction. These indexes find the same storage while scoring only the few
that could beat the best one found. Each pool member is filed under a *key*
that bounds its score from below, and the members are visited in the order of
their bounds until the next bound exceeds the best exact score found:

* `RatioIndex`, for scores `a(S) / (T - b(S))` (infinite when T - b <= 0),
  the form of every h_DTR variant: a = cost / size, b = last access, so that
  T - b is the staleness at the runtime's time T. The order of such scores
  changes as T advances, so members are grouped in buckets of a (16 per
  octave); a bucket's smallest a bounds its members', within a bucket they
  are ordered by b, and the buckets are visited in the order of their bounds.
* `OrderIndex`, for keys whose order is that of their bounds at any time
  (h_e*: the size of e*, then the staleness; h_MSPS; h_LRU; h_size): one heap.

Keys may go stale in the safe direction only. A heuristic must `touch` a
member whose score may have decreased for another reason than time passing
(for h_DTR^eq: a neighbouring component lost a storage), and need not
otherwise: when a score only grows (a neighbour evicted, a new access), the
old key still bounds it. A member whose key is found wrong when it is scored
is filed again.

The scores that decide are exact (`evaluate` with a limit computes the exact
score whenever it is within the limit), and the tie rules are the full
scan's (App. C.3, `Heuristic.choose`): the lowest score wins, ties go to
the member later in the pool, and a score of 0 picks the earliest member
scoring 0 (unless a negative score comes before it). So an index never
changes a decision, only how many scores it takes to make it.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Iterable, Optional

from .graph import Storage

# Members whose bound is within this relative distance of the best score are
# always scored, so that rounding in a bound never hides a tie or a better one.
_SLACK = 1e-9
_SUBBUCKETS = 16  # per octave of a: the members of a bucket differ by at most 1/32

# evaluate(storage, T, limit) -> (score, key): the exact score at time T when
# it is <= limit (else any value > limit), and a key bounding it from below.
Evaluate = Callable[[Storage, float, float], "tuple[float, tuple[float, ...]]"]


def _limit(best: float) -> float:
    """Bounds above this cannot hide the best score or a tie with it."""
    return best + abs(best) * _SLACK


def _pick(scores: dict[Storage, float], position: dict[Storage, int], pool: Iterable[Storage]) -> Optional[Storage]:
    """What a scan in pool order would take, given every score that could matter."""
    zeros = [s for s, v in scores.items() if v == 0]
    if zeros:
        first = min(zeros, key=position.__getitem__)
        if not any(v < 0 and position[s] < position[first] for s, v in scores.items()):
            return first  # the scan stops at the first score of 0
    best = min((v for v in scores.values() if v == v), default=math.inf)
    if best == math.inf:
        # Nothing scores finite: the scan ends on the last member of the pool.
        return next(reversed(pool)) if isinstance(pool, dict) else list(pool)[-1]
    return max((s for s, v in scores.items() if v == best), key=position.__getitem__)


class _Index:
    """Membership, pool positions, entry versions and touched members."""

    def __init__(self, evaluate: Evaluate):
        self.evaluate = evaluate
        self.clear()

    def clear(self) -> None:
        """Empties the index (a new run)."""
        self._position: dict[Storage, int] = {}  # members -> order of joining the pool
        self._key: dict[Storage, tuple[float, ...]] = {}  # members -> their filed key
        self._version: dict[Storage, int] = {}  # members -> the version of their live entry
        self._next_position = 0
        self._next_version = 0
        self._irregular: set[Storage] = set()  # keys that bound nothing: always scored
        self._dirty: dict[Storage, None] = {}
        self._entries = 0  # heap entries, stale ones included
        self._clear_entries()

    def _clear_entries(self) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._position)

    def __contains__(self, storage: Storage) -> bool:
        return storage in self._position

    def add(self, storage: Storage, now: float) -> None:
        """`storage` joined the pool, at its end."""
        self._position[storage] = self._next_position
        self._next_position += 1
        self._file(storage, self.evaluate(storage, now, -math.inf)[1])

    def remove(self, storage: Storage) -> None:
        """`storage` left the pool; its entries become stale."""
        if self._position.pop(storage, None) is not None:
            del self._version[storage], self._key[storage]
            self._irregular.discard(storage)
            self._dirty.pop(storage, None)

    def touch(self, storage: Storage) -> None:
        """`storage`'s key may no longer bound its score: file it again before the next choice."""
        if storage in self._position:
            self._dirty[storage] = None

    def touch_all(self, storages: Iterable[Storage]) -> None:
        """`touch` of each (a component's frontier: hundreds at once on a TreeLSTM)."""
        position, dirty = self._position, self._dirty
        for storage in storages:
            if storage in position:
                dirty[storage] = None

    def _file(self, storage: Storage, key: tuple[float, ...]) -> None:
        self._next_version += 1
        self._version[storage] = self._next_version
        self._key[storage] = key
        self._irregular.discard(storage)
        pushed = self._push(storage, key, self._position[storage], self._next_version)
        if pushed is None:
            self._irregular.add(storage)
        else:
            self._entries += pushed

    def _push(self, storage: Storage, key: tuple[float, ...], position: int, version: int) -> Optional[int]:
        """Files entries for `storage`; returns how many, or None when the key bounds nothing."""
        raise NotImplementedError

    def _begin(self, now: float) -> tuple[dict[Storage, float], list]:
        """Files the touched members again and scores the irregular ones."""
        if self._entries > 2 * len(self._position) + 1024:
            self._compact()
        scores: dict[Storage, float] = {}
        refile: list = []
        dirty, self._dirty = self._dirty, {}
        keys = self._key
        for storage in dirty:
            key = self.evaluate(storage, now, -math.inf)[1]
            if key != keys[storage]:  # (an equal key's entry is live and bounds as well)
                self._file(storage, key)
        for storage in list(self._irregular):
            self._score(storage, now, math.inf, scores, refile)
        return scores, refile

    def _score(self, storage: Storage, now: float, limit: float, scores: dict, refile: list) -> float:
        """Scores `storage` within `limit`; an exact score goes into `scores`."""
        s = scores.get(storage)
        if s is not None:
            return s
        s, key = self.evaluate(storage, now, limit)
        if s <= limit or s != s:
            scores[storage] = s
        if key != self._key[storage]:
            refile.append((storage, key))
        return s

    def _finish(self, refile: list) -> None:
        for storage, key in refile:
            if storage in self._position:
                self._file(storage, key)

    def _compact(self) -> None:
        raise NotImplementedError


    def _live_top(self, heap: list, live: dict) -> Optional[tuple]:
        """The first live entry of `heap`, its stale entries (members since
        refiled or removed) dropped on the way; None when none is left."""
        while heap:
            entry = heap[0]
            if live.get(entry[3]) == entry[2]:
                return entry
            heapq.heappop(heap)
            self._entries -= 1
        return None


class RatioIndex(_Index):
    """The pool for scores a / (T - b); keys are (a, b).

    A key (a, b) must satisfy a <= the member's true a and b <= its true b
    (then a / (T - b) bounds its score). b = -inf with a > 0 means a score of 0.
    """

    def _clear_entries(self) -> None:
        # Entries (b, position, version, storage) per bucket of a > 0.
        self._buckets: dict[int, tuple[float, list]] = {}
        # Entries (position, version, storage) whose bound is 0.
        self._zero: list = []

    def _push(self, storage, key, position, version) -> Optional[int]:
        a, b = key
        if storage.size <= 0:
            return 0  # scores infinite for good: only the all-infinite fallback takes it
        if a == 0 or (b == -math.inf and 0 < a < math.inf):
            heapq.heappush(self._zero, (position, version, storage))
            return 1
        if not (0 < a < math.inf and -math.inf < b < math.inf):
            return None
        mantissa, exponent = math.frexp(a)  # a = mantissa * 2**exponent, mantissa in [0.5, 1)
        sub = int((mantissa - 0.5) * 2 * _SUBBUCKETS)
        bucket = exponent * _SUBBUCKETS + sub
        entry = self._buckets.get(bucket)
        if entry is None:  # the bucket's lower bound, an exact binary fraction <= a
            entry = self._buckets[bucket] = (math.ldexp(0.5 + sub / (2 * _SUBBUCKETS), exponent), [])
        heapq.heappush(entry[1], (b, position, version, storage))
        return 1

    def _compact(self) -> None:
        live = self._version
        self._zero = [e for e in self._zero if live.get(e[2]) == e[1]]
        heapq.heapify(self._zero)
        for bucket in list(self._buckets):
            low, heap = self._buckets[bucket]
            kept = [e for e in heap if live.get(e[3]) == e[2]]
            if kept:
                heapq.heapify(kept)
                self._buckets[bucket] = (low, kept)
            else:
                del self._buckets[bucket]
        self._entries = len(self._zero) + sum(len(heap) for _, heap in self._buckets.values())

    def choose(self, pool: Iterable[Storage], now: float) -> Optional[Storage]:
        """The member a full scan of `pool` (the pool this index mirrors) would take at time `now`."""
        if not self._position:
            return None
        live, keys = self._version, self._key
        scores, refile = self._begin(now)
        # The earliest member scoring 0, if any: the scan stops there.
        first_zero = min((self._position[s] for s, v in scores.items() if v == 0), default=math.inf)
        heap, kept, pending = self._zero, [], []
        while heap and heap[0][0] < first_zero:
            entry = heapq.heappop(heap)
            if live.get(entry[2]) != entry[1]:
                self._entries -= 1
                continue
            kept.append(entry)
            if self._score(entry[2], now, 0.0, scores, refile) == 0:
                first_zero = entry[0]
            elif entry[2] not in scores:
                pending.append(entry[2])  # scores above 0: a candidate like any other
        for entry in kept:
            heapq.heappush(heap, entry)
        if first_zero != math.inf:
            self._finish(refile)
            if any(v < 0 and self._position[s] < first_zero for s, v in scores.items()):
                return None  # a negative score before the first 0 (the members after it are unscored): the caller scans
            return _pick(scores, self._position, pool)  # the scan stops at the first 0
        best = min((v for v in scores.values() if v == v), default=math.inf)
        for storage in pending:
            s = self._score(storage, now, _limit(best), scores, refile)
            if s < best:
                best = s
        # The buckets in the order of their bounds (the first entry of a heap,
        # live or stale, has the smallest b), each in the order of b.
        bounds = [
            (low / (now - heap[0][0]) if now > heap[0][0] else math.inf, bucket)
            for bucket, (low, heap) in self._buckets.items()
        ]
        heapq.heapify(bounds)
        emptied, underflow = [], False
        limit = _limit(best)
        while bounds:
            bound, bucket = heapq.heappop(bounds)
            if bound > limit:
                break
            low, heap = self._buckets[bucket]
            if self._live_top(heap, live) is None:
                emptied.append(bucket)
                continue
            popped = []
            while (top := self._live_top(heap, live)) is not None:
                b, _, version, storage = top
                gap = now - b
                if gap <= 0 or low / gap > limit:
                    break  # and so does the rest of the bucket, whose b is larger
                popped.append(heapq.heappop(heap))
                if keys[storage][0] / gap > limit:
                    continue  # its own key already loses
                s = self._score(storage, now, limit, scores, refile)
                underflow = underflow or s == 0
                if s < best:
                    best, limit = s, _limit(s)
            for entry in popped:
                heapq.heappush(heap, entry)
            if not heap:
                emptied.append(bucket)
        for bucket in emptied:
            del self._buckets[bucket]
        self._finish(refile)
        if underflow:
            return None  # a positive key whose score underflowed to 0: the caller scans
        return _pick(scores, self._position, pool)


class OrderIndex(_Index):
    """The pool for keys whose order is the order of their bounds at every time.

    Args:
      evaluate: as for `RatioIndex`; keys are tuples of floats.
      bound: `bound(key, T)`, a lower bound of the score of a member filed
        under `key`, nondecreasing in the keys' order at every T.
    """

    def __init__(self, evaluate: Evaluate, bound: Callable[[tuple[float, ...], float], float]):
        self.bound = bound
        super().__init__(evaluate)

    def _clear_entries(self) -> None:
        self._heap: list = []  # entries (key, position, version, storage)

    def _push(self, storage, key, position, version) -> Optional[int]:
        if any(k != k for k in key):
            return None
        heapq.heappush(self._heap, (key, position, version, storage))
        return 1

    def _compact(self) -> None:
        live = self._version
        self._heap = [e for e in self._heap if live.get(e[3]) == e[2]]
        heapq.heapify(self._heap)
        self._entries = len(self._heap)

    def choose(self, pool: Iterable[Storage], now: float) -> Optional[Storage]:
        """The member a full scan of `pool` (the pool this index mirrors) would take at time `now`."""
        if not self._position:
            return None
        scores, refile = self._begin(now)  # may compact: read the heap after it
        live, heap, bound = self._version, self._heap, self.bound
        best = min((v for v in scores.values() if v == v), default=math.inf)
        popped = []
        while (top := self._live_top(heap, live)) is not None:
            key, _, version, storage = top
            if bound(key, now) > _limit(best):
                break
            popped.append(heapq.heappop(heap))
            s = self._score(storage, now, _limit(best), scores, refile)
            if s < best:
                best = s
        for entry in popped:
            heapq.heappush(heap, entry)
        self._finish(refile)
        return _pick(scores, self._position, pool)
