"""Telemetry as observers: the runtime reports events, observers count them.

The runtime itself keeps only what its decisions need (memory in use, the
clock, the pool). Everything measured about a run (peaks, counts, costs,
timelines) is an observer, so the algorithm stays readable and a run pays
only for the telemetry it asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graph import Operator, Storage


class Observer:
    """Receives runtime events; every method is optional."""

    def on_allocate(self, nbytes: int, memory: int, op: "Operator | None") -> None:
        """`nbytes` were reserved; `memory` is the total in use after it."""

    def on_free(self, nbytes: int, memory: int) -> None:
        """`nbytes` were returned; `memory` is the total in use after it."""

    def on_compute(self, op: "Operator", cost: float, rematerialization: bool, clock: float) -> None:
        """`op` ran (for the first time, or again to rematerialize an output)."""

    def on_evict(self, storage: "Storage", by_heuristic: bool, clock: float) -> None:
        """`storage` left memory: chosen by the heuristic, or dead (eager eviction)."""

    def on_banish(self, storage: "Storage", clock: float) -> None:
        """`storage` was freed for good (banishing, App. C.5)."""

    def on_pin(self, storage: "Storage") -> None:
        """`storage` can no longer be evicted."""

    def on_score(self, count: int) -> None:
        """The heuristic computed `count` scores (App. D.3's heuristic evaluations)."""

    def on_metadata(self, count: int) -> None:
        """The heuristic read the metadata of `count` storages (App. D.3's metadata accesses)."""


@dataclass
class Counters(Observer):
    """The totals of a run: peak memory, evictions, rematerializations, costs, the heuristic's work."""

    peak_bytes: int = 0
    evictions: int = 0  # chosen by the heuristic
    dealloc_evictions: int = 0  # eager evictions of dead storages
    banishments: int = 0
    rematerializations: int = 0  # operator replays
    computations: int = 0  # operator runs, first and replayed
    base_cost: float = 0.0
    remat_cost: float = 0.0
    pinned_bytes: int = 0
    heuristic_evaluations: int = 0  # App. D.3
    metadata_accesses: int = 0  # App. D.3
    _pinned_ids: set = field(default_factory=set, repr=False)

    def on_allocate(self, nbytes, memory, op):
        if memory > self.peak_bytes:
            self.peak_bytes = memory

    def on_compute(self, op, cost, rematerialization, clock):
        self.computations += 1
        if rematerialization:
            self.rematerializations += 1
            self.remat_cost += cost
        else:
            self.base_cost += cost

    def on_evict(self, storage, by_heuristic, clock):
        if by_heuristic:
            self.evictions += 1
        else:
            self.dealloc_evictions += 1

    def on_banish(self, storage, clock):
        self.banishments += 1

    def on_pin(self, storage):
        if storage.id not in self._pinned_ids:
            self._pinned_ids.add(storage.id)
            self.pinned_bytes += storage.size

    def on_score(self, count):
        self.heuristic_evaluations += count

    def on_metadata(self, count):
        self.metadata_accesses += count

    def totals(self) -> dict[str, int]:
        """The counts every report of a run carries (`jdtr.SimResult`, `jdtr.Stats`), by their field names."""
        return {
            "peak_bytes": self.peak_bytes,
            "evictions": self.evictions,
            "dealloc_evictions": self.dealloc_evictions,
            "rematerializations": self.rematerializations,
        }

    @property
    def overhead(self) -> float:
        """Total compute over baseline compute: 1.0 means no rematerialization."""
        return (self.base_cost + self.remat_cost) / self.base_cost if self.base_cost > 0 else 1.0


@dataclass(frozen=True)
class TimelineEvent:
    """One residency change of a storage, at a clock time and an operation index."""

    step: int
    clock: float
    storage_id: int
    size: int
    kind: str  # "compute" | "rematerialize" | "evict" | "dealloc" | "banish"
    memory: int


class Timeline(Observer):
    """Records when each storage became resident and left, for plots like Figure 5."""

    def __init__(self) -> None:
        self.events: list[TimelineEvent] = []
        self.step = 0
        self._memory = 0

    def on_allocate(self, nbytes, memory, op):
        self._memory = memory

    def on_free(self, nbytes, memory):
        self._memory = memory

    def on_compute(self, op, cost, rematerialization, clock):
        self.step += 1
        kind = "rematerialize" if rematerialization else "compute"
        for t in op.outputs:
            if not t.is_alias:
                self.events.append(TimelineEvent(self.step, clock, t.storage.id, t.storage.size, kind, self._memory))

    def on_evict(self, storage, by_heuristic, clock):
        kind = "evict" if by_heuristic else "dealloc"
        self.events.append(TimelineEvent(self.step, clock, storage.id, storage.size, kind, self._memory))

    def on_banish(self, storage, clock):
        self.events.append(TimelineEvent(self.step, clock, storage.id, storage.size, "banish", self._memory))
