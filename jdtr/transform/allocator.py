"""What a device's allocator holds beyond jdtr's count, and the margin plans keep for it.

jdtr counts the bytes of the buffers a run holds. A GPU's allocator (XLA's
BFC allocator) holds more: it serves a request from a whole free block up
to twice the request's size, so the bytes it has in use depend on the order
of allocations and frees, which a plan made by counting does not see.
Measured on an H200 (docs/benchmarks.md, 2026-11-27), planned runs that
kept budgets of 0.5-0.3 by count held 1.5-16% more on the device.

The online mode reads the allocator as it goes and evicts further where its
count leaves no room. A plan is made before its run and runs as made, so it
learns instead (`AllocatorGuard`): the first run of each plan step by step,
and its first run as compiled chunks, read the allocator's bytes in use
after every dispatch. Where their peak exceeds the budget, later calls plan
for the budget less what the allocator held beyond the run's count (a
margin per traced structure and budget), until a plan's runs keep it; such
a plan runs as compiled chunks from its first run (its structure has run).
The call that measured the excess has already run: an `AllocatorWarning`
says so, with the numbers. On a device that does not report
`memory_stats()` (the CPU) nothing is read and nothing changes.

Before a new plan's first run on a GPU, whose allocator `offline.bfc`
models, the guard also replays the plan's line on that model (`foresee`):
where the model's peak passes the budget, the plan is made again for less,
as a run's reading would have taught, so that the first call keeps the
budget too (it ran 4-14% over it on an H100 and an H200).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional, Sequence

import jax

from ..offline.bfc import allocator_peak
from ..runtime import format_bytes
from .devices import run_devices

# Plans made again for the allocator's model before a first run, at most.
FORESIGHTS = 4


def allocator_bytes(inputs: Sequence[Any], held: int) -> Optional[Callable[[], int]]:
    """For devices whose allocator reports its use (GPUs, TPUs; not the
    CPU): a reader of the bytes the run holds by the allocator's count,
    `held` (arguments, constants: on the device before the run, per device)
    plus what it has allocated since, on the device that allocated most.
    None where a device reports nothing."""
    # On a mesh over several processes, each reads its own devices (another's cannot be asked).
    devices = [d for d in run_devices(inputs) if d.process_index == jax.process_index()]
    try:
        starts = [device.memory_stats() for device in devices]
    except RuntimeError:  # a device that cannot say (XLA's error is a RuntimeError)
        return None
    if not devices or not all(stats and "bytes_in_use" in stats for stats in starts):
        return None
    start = [stats["bytes_in_use"] for stats in starts]

    return lambda: max(d.memory_stats()["bytes_in_use"] - s for d, s in zip(devices, start)) + held


def modelled_allocator(inputs: Sequence[Any]) -> bool:
    """Whether a run on `inputs` allocates from the allocator `offline.bfc`
    models: XLA's BFC allocator on one GPU, unless the process chose another
    (`XLA_PYTHON_CLIENT_ALLOCATOR=platform` or `cuda_async`)."""
    if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default") not in ("default", "bfc"):
        return False
    devices = run_devices(inputs)
    return len(devices) == 1 and devices[0].platform == "gpu"


class AllocatorWarning(UserWarning):
    """A run that kept its budget by jdtr's count held more on the device,
    by its allocator's count; later calls plan for less.

    Attributes:
      peak_bytes: the most the allocator held for the run (arguments and
        constants included, as the budget counts them).
      budget_bytes: the budget.
      planned_bytes: what later calls plan for (the budget less the excess
        measured so far).
    """

    def __init__(self, peak_bytes: int, budget_bytes: int, planned_bytes: int):
        self.peak_bytes, self.budget_bytes, self.planned_bytes = peak_bytes, budget_bytes, planned_bytes
        super().__init__(
            f"jdtr: the device's allocator held {format_bytes(peak_bytes)} ({peak_bytes} bytes) for this run, "
            f"{(peak_bytes - budget_bytes) / budget_bytes:.2%} over the budget of {format_bytes(budget_bytes)} "
            "that jdtr's count kept (the allocator hands out whole blocks). Later calls plan for "
            f"{format_bytes(planned_bytes)} ({planned_bytes} bytes) of its count, until a run keeps the budget."
        )


@dataclass
class Margins:
    """Per traced structure: the bytes its plans keep below each budget for
    the allocator (`learned`), and the budgets at which even that found no
    plan (`exhausted`: their plans are the count's, and nothing more is learned)."""

    learned: dict = field(default_factory=dict)
    exhausted: set = field(default_factory=set)


class AllocatorGuard:
    """One planned call's view of the allocator: the budget to plan for, the
    reading of the allocator while the run goes, and what the run teaches.

    `key` names the budget and the plan's other options (heuristic, dealloc,
    owned arguments); `margins` is the traced structure's."""

    def __init__(self, margins: Margins, key: Hashable, budget_bytes: int):
        self.margins, self.key, self.budget_bytes = margins, key, budget_bytes
        self.margin = 0 if key in margins.exhausted else margins.learned.get(key, 0)
        self.ran = self.margin > 0  # its margin was learned from runs
        self.foreseen = 0  # plans made again for the allocator's model, this call
        self.peak: Optional[int] = None
        self._read: Optional[Callable[[], int]] = None

    @property
    def plan_budget(self) -> int:
        """The budget to plan for: the caller's, less the margin learned (a byte at least)."""
        return max(self.budget_bytes - self.margin, 1)

    def exhausted(self) -> None:
        """No plan fits the budget less the margin: plan by the count alone from now on."""
        self.margins.exhausted.add(self.key)
        self.margin = 0

    def foresee(self, plan: Any, inputs: Sequence[Any]) -> bool:
        """Before `plan`'s first run: where the run is on an allocator
        `offline.bfc` models, and the model's peak for the plan's line passes
        the budget, a margin for the excess (learned as from a run, but
        silently: nothing ran) and True, to plan again for less. A plan by
        paths of `cond`s is not foreseen: its line is one path's."""
        if plan.path is not None or self.key in self.margins.exhausted or self.foreseen >= FORESIGHTS:
            return False
        if not modelled_allocator(inputs):
            return False
        peak = allocator_peak(plan.line)
        if peak <= self.budget_bytes:
            return False
        self.foreseen += 1
        self.margin = max(self.margin + peak - self.budget_bytes, peak - plan.result.peak_bytes)
        self.margins.learned[self.key] = self.margin
        return True

    def watch(self, plan: Any, execution: str, inputs: Sequence[Any], held: int, after: Optional[Callable[[], None]]):
        """The callback to run after each dispatch of this run: `after` (the
        debug check, or None), and on the first run of `plan` of this kind
        ("steps" or "chunks") on a device that reports its allocator, a
        reading of the allocator's bytes in use."""
        if execution in plan.watched:
            return after
        plan.watched.add(execution)  # once per plan and kind, also where nothing can be read
        self._read = allocator_bytes(inputs, held)
        if self._read is None:
            return after
        self.peak = self._read()

        def read() -> None:
            self.peak = max(self.peak, self._read())
            if after is not None:
                after()

        return read

    def learn(self, counted: int) -> Optional[int]:
        """After the run, whose peak by jdtr's count was `counted`: the
        allocator's peak for it (None where it was not read); where that
        exceeds the budget, a larger margin for later calls, said."""
        if self._read is None:
            return None
        self.peak = max(self.peak, self._read())
        excess = self.peak - self.budget_bytes
        if excess > 0 and self.key not in self.margins.exhausted:
            # The margin is what the allocator held beyond the count, not beyond the budget: a plan
            # whose count stayed well under what it planned for (a plan made for less, to run as
            # fewer chunks) would otherwise learn a sliver per call, each a plan and its first run,
            # before its count came down to where the allocator's excess fits (an H200's MLP at 0.5:
            # 18 KiB over the budget on every call, 262 KiB of the count's room unused).
            learned = max(self.margin + excess, self.peak - counted)
            self.margins.learned[self.key] = learned
            warnings.warn(AllocatorWarning(self.peak, self.budget_bytes, self.budget_bytes - learned), stacklevel=5)
        return self.peak
