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

The trade is priced in the plan's cost model: a chunk costs as much as the
program's average equation. That is a lower bound where dispatch is the
cost (a GPU running small kernels, or any device on a small model: a
step-by-step run then takes about one dispatch per equation, so an
equation's compute is at most a dispatch), and an upper bound where
compute is (large kernels on a CPU, where the rule gives up at most what
the chunks saved: a fraction of a percent of compute). The candidates are
DTR's plans, by the plan's own heuristic, for a few fractions of the
budget below it; each is cut as the executor will cut it (`chunks.count`),
without compiling.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from .chunks import count
from .planner import OPTIMAL, PlannedRun, plans_below, refine
from .program import Program

# The budgets tried below the budget, as fractions of it taken off.
SLACKS = (0.02, 0.05, 0.1, 0.2)
# A plan in this many chunks or fewer is kept as it is: there is little to save.
FEW_CHUNKS = 2
# A chunk is priced as this many of the program's average equations. On an
# H200 a small transformer's chunk cost the host as much as about 200 of
# its equations cost the device (docs/benchmarks.md, 2026-11-28), but where
# the device is busy longer than the host, dispatch is hidden and a chunk
# costs nothing: what it is worth depends on the model and the machine, and
# is not measured yet. A benchmark sets this to compare plans.
CHUNK_PRICE = 1.0


def settle(plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str, chunks_at: Optional[int]) -> PlannedRun:
    """A plan that came back, or is about to run as chunks cut at budget
    `chunks_at`: with the candidates its quick first plan skipped tried
    (`planner.refine`), then, where it runs as chunks, for fewer of them."""
    plan = refine(plan, program, owned, dealloc)
    return plan if chunks_at is None else plan_for_chunks(plan, program, owned, dealloc, chunks_at)


def plan_for_chunks(plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str, budget_bytes: int) -> PlannedRun:
    """The plan to cut into chunks at `budget_bytes`: `plan` (made for that
    budget), or one made for a little less by its heuristic, whichever costs
    least with each chunk priced as an average equation. A plan kept under
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
