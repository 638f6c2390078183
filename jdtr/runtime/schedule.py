"""The program's future accesses, for heuristics that look ahead.

The paper's heuristics see only the past (staleness: the time since a storage
was last used), because a PyTorch program reveals itself one operator at a
time. jdtr sees the whole program before running it (a jaxpr, or a log), so
it can say when each tensor will next be read. A driver that knows the
program fills a `Schedule` and the runtime hands it to its heuristic:

* `announce(tensor, uses)` when the program creates `tensor`: the
  *positions* at which the program will read it, ascending;
* `advance(cost)` after each program operation.

A position is the program's own progress: the cost of the program
operations done before (so that distances are in the clock's unit, like
staleness); rematerializations are the runtime's and move nothing. An
output of the program is read at the end. Drivers: `jdtr.simulator` (a log's
compute steps) and `jdtr.grad`'s interpreter (a program's top-level
equations; a `cond` counts as one operation).
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Hashable, Iterable, Iterator, Optional, Sequence, TypeVar

from .graph import Storage, Tensor

Key = TypeVar("Key", bound=Hashable)


def operation_costs(costs: Iterable[Optional[float]]) -> list[float]:
    """How far each operation moves the program on, for `future_uses` and
    `Schedule.advance`: its cost, or 1 each where any cost is unknown ahead
    (measured when it runs): positions then count operations."""
    costs = list(costs)
    if any(cost is None for cost in costs):
        return [1.0] * len(costs)
    return costs


def future_uses(operations: Iterable[tuple[Iterable[Key], float]], outputs: Iterable[Key]) -> dict[Key, list[float]]:
    """What a driver announces: per value, the positions at which the program
    reads it, ascending. `operations` are the program's operations in order,
    each as (the values it reads, its cost); an operation's position is the
    cost of those before it, and the `outputs` are read at the end."""
    uses: dict[Key, list[float]] = {}
    position = 0.0
    for reads, cost in operations:
        for value in dict.fromkeys(reads):
            uses.setdefault(value, []).append(position)
        position += cost
    for value in outputs:
        uses.setdefault(value, []).append(position)
    return uses


class Schedule:
    """When the program will read each tensor; it is at `position` now."""

    def __init__(self) -> None:
        self.position = 0.0
        # Per tensor, [cursor, uses]: its reads and the first not yet passed
        # (one lookup a query: the lookahead asks this of every storage it walks).
        self._uses: dict[Tensor, list] = {}
        self._reads: list = []  # (position, sequence, tensor): the reads still ahead
        self._sequence = itertools.count()
        # Storages' next uses at `position`: a choice walks the same evicted
        # storages for each candidate it scores, about five times each on a
        # TreeLSTM. Cleared when the position moves or a read is announced.
        self._nearest: dict[Storage, Optional[float]] = {}
        self._nearest_at = 0.0
        # Storages announced reads while not resident (a `cond`'s branch, once
        # known, announces its reads of its operands): the lookahead holds an
        # evicted storage's next use fixed until then.
        self._late: list[Storage] = []

    def announce(self, tensor: Tensor, uses: Sequence[float]) -> None:
        """The program will read `tensor` at these positions (ascending); a
        second announcement adds to the first (the value under a new name)."""
        self._nearest.clear()
        if not tensor.storage.resident:
            self._late.append(tensor.storage)
        known = self._uses.get(tensor)
        if known and known[1]:
            uses = sorted({*known[1], *uses})
        self._uses[tensor] = [0, uses]
        for position in uses:
            heapq.heappush(self._reads, (position, next(self._sequence), tensor))

    def advance(self, cost: float = 1.0) -> None:
        """One program operation of this cost is done."""
        self.position += cost

    def next_use(self, tensor: Tensor) -> Optional[float]:
        """The first position >= `position` at which the program reads
        `tensor`; inf if it never does again; None if it was never announced."""
        entry = self._uses.get(tensor)
        if entry is None:
            return None
        i, uses = entry
        n, position = len(uses), self.position
        while i < n and uses[i] < position:
            i += 1
        entry[0] = i
        return uses[i] if i < n else math.inf

    def known_storage_uses(self) -> dict[Storage, Optional[float]]:
        """`next_storage_use`'s answers so far at this position, to read
        without a call where a walk asks it of every storage it visits (a
        storage missing here is asked of `next_storage_use`). Valid until
        the position moves or a read is announced."""
        if self._nearest_at != self.position:
            self._nearest.clear()
            self._nearest_at = self.position
        return self._nearest

    def next_storage_use(self, storage: Storage) -> Optional[float]:
        """The earliest next use of a tensor of `storage` (None if none was announced)."""
        nearest = self._nearest
        if self._nearest_at != self.position:
            nearest.clear()
            self._nearest_at = self.position
        elif storage in nearest:
            return nearest[storage]
        found: Optional[float] = None
        for tensor in storage.tensors:
            use = self.next_use(tensor)
            if use is not None and (found is None or use < found):
                found = use
        nearest[storage] = found
        return found

    def late_announcements(self) -> list[Storage]:
        """The storages announced reads while not resident, since the last
        call: an evicted storage's next use moves only then (the program
        reads it only once it is rematerialized, and a read announced
        later may come sooner)."""
        late, self._late = self._late, []
        return late

    def passed_reads(self) -> Iterator[Tensor]:
        """The tensors whose announced reads the program has passed since the last call."""
        reads = self._reads
        while reads and reads[0][0] < self.position:
            yield heapq.heappop(reads)[2]
