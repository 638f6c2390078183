"""What a run measured: `jdtr.Stats`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .runtime.errors import format_bytes
from .runtime.observer import TimelineEvent


@dataclass(frozen=True)
class Stats:
    """Measurements of one `jdtr.grad` run.

    Costs are in the cost model's unit (seconds on a nominal device for the
    default XLA cost model, measured seconds with `cost_model="measured"`).

    Attributes:
      budget_bytes: the budget in force. Every byte count is per device:
        on arguments sharded over a mesh, of the device that holds most
        (`devices` says over how many).
      peak_bytes: the most bytes the runtime held at once.
      unconstrained_peak_bytes: the peak with no budget (values freed at last use).
      pinned_bytes: bytes that could never be evicted (arguments, constants,
        outputs of effectful operations).
      evictions: storages evicted by the heuristic.
      dealloc_evictions: dead storages evicted eagerly (App. C.5).
      rematerializations: operator replays.
      base_cost: cost of running every operator once.
      remat_cost: cost of the replays.
      overhead: (base_cost + remat_cost) / base_cost.
      wall_time_s: time of the run, tracing excluded.
      trace_time_s: time spent tracing and normalizing (0 on a cache hit).
      equations: operators in the normalised program.
      cache_hit: whether the traced program came from the cache.
      live_peak_bytes: with `debug=True`, the peak summed over `jax.live_arrays()`.
      timeline: with `timeline=True`, the residency events of the run.
      execution: how the run went: "chunks" (a plan made before the run,
        as compiled chunks), "steps" (a plan, one equation per dispatch: a
        plan's runs until compiling its chunks pays, with `chunks="auto"`),
        "whole" (with `chunks="whole"`, or where `"auto"` found it faster than
        the chunks: the step as one XLA program, its
        `peak_bytes` XLA's for it, its recomputation that of the plan's
        `jax.checkpoint` segments) or "online" (DTR deciding as it ran).
      chunks: dispatches the run made: compiled chunks, or equations run
        one at a time (rematerializations included).
      planning_time_s: time spent planning the run (simulating candidates,
        cutting and compiling chunks); 0 when all of it was cached.
      scans: where the program has scans kept whole (planned runs), what
        the plan does with them: the strategy of what each iteration keeps
        (its recomputation counts in `remat_cost`), or "unrolled".
      devices: the devices the run is placed on: 1, or on arguments
        sharded over a mesh, the mesh's (the byte counts are per device).
      allocator_peak_bytes: on a device whose allocator reports its use (a
        GPU, a TPU), the most it held for a plan's first run step by step
        and its first run as chunks (arguments and constants included);
        None where it was not read. Over `budget_bytes`, later calls plan
        for less (`jdtr.AllocatorWarning`).
      slack_bytes: how far under `budget_bytes` the run's plan was made:
        once a structure runs in compiled chunks, they may run a
        plan made for a little less, where that cuts the run into far
        fewer chunks (docs/design.md, "A plan for fewer chunks"); 0 otherwise.
    """

    budget_bytes: int
    peak_bytes: int
    unconstrained_peak_bytes: int
    pinned_bytes: int
    evictions: int
    dealloc_evictions: int
    rematerializations: int
    base_cost: float
    remat_cost: float
    overhead: float
    wall_time_s: float
    trace_time_s: float
    equations: int
    cache_hit: bool
    heuristic: str
    dealloc: str
    live_peak_bytes: Optional[int] = None
    execution: str = "online"
    chunks: int = 0
    planning_time_s: float = 0.0
    scans: Optional[str] = None
    timeline: Optional[tuple[TimelineEvent, ...]] = field(default=None, repr=False)
    devices: int = 1
    allocator_peak_bytes: Optional[int] = None
    slack_bytes: int = 0

    def summary(self) -> str:
        where = f" per device ({self.devices} devices)" if self.devices > 1 else ""
        return (
            f"peak {format_bytes(self.peak_bytes)} / budget {format_bytes(self.budget_bytes)}{where} "
            f"(unconstrained {format_bytes(self.unconstrained_peak_bytes)}), "
            f"{self.evictions} evictions, {self.rematerializations} rematerializations, "
            f"overhead {self.overhead:.3f}x, {self.wall_time_s * 1e3:.1f} ms"
        )
