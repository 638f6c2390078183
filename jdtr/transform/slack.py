"""A plan to run as compiled chunks: at the budget, or a little under it
where that cuts the run into far fewer chunks.

A plan made at the budget runs near it throughout its tight stretches, and
there a chunk cannot hold what a step-by-step run would already have freed:
a value read and then freed inside a chunk stays until the chunk has run
(XLA reuses a donated input for an output, never for its temporaries). So
the chunks are cut short, down to one or two computations each where the
plan sits at the budget (a 64-layer MLP at 0.3 of its peak: 81 chunks for
727 steps), and each is a dispatch. A plan made for a budget a few percent
lower recomputes a little more and leaves that room: the same MLP planned
for 5% less runs as 21 chunks at 0.5% more compute, and XLA, whose schedule
needs more than the plan's count near its peaks, halves fewer of them.

The trade is priced in the plan's cost model. On the CPU a chunk costs as
much as the program's average equation: the host is the device, and that
is an upper bound where compute is the cost (large kernels, where the rule
gives up at most what the chunks saved: a fraction of a percent of
compute). On an accelerator the host dispatches each chunk, with the
arrays crossing into it, while the device runs the last: there a chunk
costs the host's time for it (`AcceleratorPrice`), which a small model's
step cannot hide (an H100 ran a small transformer's plan at 0.5 of its
peak in 25 chunks at 5.5x `jax.jit`, in 6 chunks for 9% more compute at
2.7x) and a large one's does (its equations take longer than the host's
dispatches). The candidates are DTR's plans, by the plan's own heuristic,
for a few fractions of the budget below it; each is cut as the executor
will cut it (`chunks.count`), without compiling.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .chunks import count
from .costs import MEASURED, XLA, nanoseconds
from .devices import run_devices
from .planner import OPTIMAL, PlannedRun, plans_below, refine
from .program import Program

# The budgets tried below the budget, as fractions of it taken off.
SLACKS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4)
# A plan in this many chunks or fewer is kept as it is: there is little to save.
FEW_CHUNKS = 2
# A chunk is priced as at least this many of the program's average
# equations (on the CPU, exactly). A benchmark sets this to compare plans.
CHUNK_PRICE = 1.0


@dataclass(frozen=True)
class AcceleratorPrice:
    """What a chunk costs the host of an accelerator (a GPU or TPU), in the
    cost model's seconds: `host_seconds` of real time, times `speedup` for
    the roofline's nominal device (`costs.RooflineCostModel`), whose seconds
    are longer than the accelerator's.

    Measured (docs/benchmarks.md, "On a GPU", 2026-11-28 and 2026-12-05):
    each chunk of a small transformer's plan cost an H100's and an H200's
    host 0.14-0.3 ms with its arrays and deletes, and the four benchmark
    models' `jax.jit` steps ran 14-29x faster on the H100 than the roofline
    prices them (the scan RNN 4x: its step is one long loop). A model whose
    equations are longer pays the same per chunk, a smaller part of its step.
    """

    host_seconds: float = 2e-4
    speedup: float = 20.0

    def seconds(self, cost_model: Any) -> float:
        """A chunk in the seconds of `cost_model`: 0 where its unit is the
        user's own (a callable)."""
        if cost_model == MEASURED:  # real seconds, timed on the device
            return self.host_seconds
        return self.host_seconds * self.speedup if cost_model in (None, XLA) else 0.0


ACCELERATOR = AcceleratorPrice()


def chunk_seconds(inputs: Sequence[Any], cost_model: Any) -> float:
    """What a chunk costs the host beyond the average equation, in
    `cost_model`'s seconds, on the platform of `inputs`: 0 on the CPU."""
    return 0.0 if run_devices(inputs)[0].platform == "cpu" else ACCELERATOR.seconds(cost_model)


def settle(
    plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str, chunks_at: Optional[int], chunk_s: float = 0.0
) -> PlannedRun:
    """A plan that came back, or is about to run as chunks cut at budget
    `chunks_at`: with the candidates its quick first plan skipped tried
    (`planner.refine`), then, where it runs as chunks, for fewer of them
    (each costing `chunk_s`, `chunk_seconds`)."""
    plan = refine(plan, program, owned, dealloc)
    return plan if chunks_at is None else plan_for_chunks(plan, program, owned, dealloc, chunks_at, chunk_s)


def plan_for_chunks(
    plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str, budget_bytes: int, chunk_s: float = 0.0
) -> PlannedRun:
    """The plan to cut into chunks at `budget_bytes`: `plan` (made for that
    budget), or one made for a little less by its heuristic, whichever costs
    least with each chunk priced as an average equation, or as `chunk_s`
    seconds of the cost model where that is more. A plan kept under
    a scan strategy stays under it; a plan by paths of `cond`s is kept, and
    so is `jdtr.optimal`'s: each budget below would be a solve of its own,
    seconds each (a BatchNorm CNN at 0.6 of its peak: two solves, 6-11 s of
    its second call, for plans that were not kept), and its schedule is the
    least compute the solver found at the budget."""
    if plan.path is not None or plan.candidate == OPTIMAL:
        return plan
    start = time.perf_counter()
    program = plan.program or program
    chunks = count(plan.line, budget_bytes)
    if chunks <= FEW_CHUNKS:
        return plan
    base = plan.counters.base_cost  # of the program simulated: the same for every budget
    per_chunk = CHUNK_PRICE * (plan.baseline_cost or base) / max(program.num_equations, 1)
    if chunk_s > 0:
        per_chunk = max(per_chunk, nanoseconds(chunk_s))
    best, best_cost = plan, _cost(plan) + chunks * per_chunk
    # A candidate cannot win once it recomputes more than the best costs less its base and one
    # chunk: its simulation stops there.
    budgets = [int(budget_bytes * (1 - slack)) for slack in SLACKS]
    for candidate in plans_below(plan, program, owned, dealloc, budgets, lambda: best_cost - per_chunk - base):
        if candidate is None:
            break  # it did not fit, or recomputed too much: a smaller budget would too
        cost = _cost(candidate) + count(candidate.line, budget_bytes) * per_chunk
        if cost < best_cost:
            best, best_cost = candidate, cost
    elapsed = time.perf_counter() - start
    if best is plan:
        plan.planning_time_s += elapsed
        return plan
    best.keeps_scans_of(plan)
    best.tried, best.rent = plan.tried, plan.rent
    best.planning_time_s = plan.planning_time_s + elapsed
    best.slack = budget_bytes - best.result.budget_bytes
    return best


def _cost(plan: PlannedRun) -> float:
    """What a plan computes, in the cost model's units."""
    return plan.counters.base_cost + plan.counters.remat_cost
