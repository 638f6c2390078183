"""Plans read off DTR's simulated runs, before anything is compiled.

`plan_at` reads one plan off DTR's run at a simulated budget: the values the
run never rematerialized are saved, and the forward program is cut into
checkpoint segments around them (`segments.segments`). `flat_plans` reads
flat plans at evenly spaced budgets; `uniform_plan` cuts without a run; and
`search_simulated_budget` bisects the simulated budget for the largest plan
whose predicted memory fits a target; `autotune_candidates` proposes the
plans autotuning times. `plan_search.PlanSearch` compiles and measures what
these propose.
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet, Any, Iterator, Optional, Sequence

from ..offline import run
from ..runtime import Observer
from .checkpoint import CONDS
from .checkpoint_plan import Plan, layout
from .program import Equation, Value
from .segments import flat_cuts, predicted_bytes, recompute_cost, segments, uniform_segments

# How deep segments may nest, tried in turn until a plan's prediction fits:
# flat, then nested. Deeper nesting keeps fewer inputs (about log N levels
# for a chain of N layers, as DTR's recursive recomputation) for more
# recompute: the 64-layer test MLP at a quarter of its step compiled to
# 1.029x the budget nested 3 deep, and fits nested 4 deep.
NESTING_DEPTHS = (1, 3, 5)


class _Rematerialized(Observer):
    """The values of the equations a run replayed."""

    def __init__(self):
        self.values: set[Value] = set()

    def on_compute(self, op, cost, rematerialization, clock):
        if rematerialization and isinstance(op.payload, Equation):
            self.values.update(op.payload.outputs)


def _simulated(planning: Any, sim_budget: int, heuristic) -> Optional[tuple[Any, set]]:
    """DTR's run at `sim_budget` and the forward values whose residuals it
    never rematerialized (saved), or None if DTR runs out of memory or
    thrashes there. Cached by simulated budget: searches revisit budgets."""
    simulations = planning.simulations
    if sim_budget not in simulations:
        # A plan that recomputes more than the whole step again is not worth
        # reading (the driver's default overhead limit, 2x). A failed run is
        # cached as None, not as an error, whose traceback would keep this
        # call's frames (and the user's function) alive.
        remat = _Rematerialized()
        simulated = run(planning.workload, sim_budget, heuristic, observers=[remat])
        simulations[sim_budget] = (simulated, remat.values) if simulated.ok else None
    if simulations[sim_budget] is None:
        return None
    simulated, rematerialized = simulations[sim_budget]
    return simulated, {fwd_value for fwd_value, vg_value in planning.reads.items() if vg_value not in rematerialized}


def _plan_of(planning: Any, simulated: Any, saved: set, cut: tuple, predicted: Optional[int] = None) -> Plan:
    """The plan of `cut`; `predicted`, its `predicted_bytes` where the caller has them."""
    saved_all = frozenset(saved | {v for s in cut for v in s.inputs})
    if predicted is None:
        predicted = predicted_bytes(planning.forward, cut, planning.gradient_bytes, planning.scan_memory)
    return Plan(
        0, cut, saved_all, simulated, planning.forward, planning.config, predicted_bytes=predicted,
        scans=planning.kept_scans,
    )


def plan_at(planning: Any, sim_budget: int, target: float, heuristic, max_depth: int = 1) -> Optional[Plan]:
    """The plan read from DTR's run at `sim_budget`, or None if DTR runs out
    of memory or thrashes there."""
    found = _simulated(planning, sim_budget, heuristic)
    if found is None:
        return None
    simulated, saved = found
    cut = segments(
        planning.forward, saved, planning.residuals, target, planning.gradient_bytes, max_depth, planning.scan_memory
    )
    return _plan_of(planning, simulated, saved, cut)


def flat_plans(planning: Any, sim_peak: int, heuristic, points: int) -> list[Plan]:
    """DTR's flat plans at `points` simulated budgets evenly spaced up to
    `sim_peak`, each cut under every cap `segments` tries: distinct layouts,
    least predicted bytes first."""
    found: dict = {}
    for k in range(1, points + 1):
        simulation = _simulated(planning, max(sim_peak * k // points, 1), heuristic)
        if simulation is None:
            continue
        simulated, saved = simulation
        cuts = flat_cuts(planning.forward, saved, planning.residuals, planning.gradient_bytes, planning.scan_memory)
        for cut, predicted in cuts.flat():  # (predicted as `_plan_of` would: the same program, gradients and scans)
            plan = _plan_of(planning, simulated, saved, cut, predicted)
            found.setdefault(layout(plan), plan)
    return sorted(found.values(), key=lambda p: p.predicted_bytes)


def uniform_plan(planning: Any, base: Plan) -> Plan:
    """The uniform-segments candidate (`segments.uniform_segments`), of `base`'s step."""
    cut = uniform_segments(planning.forward, planning.residuals, planning.gradient_bytes)
    gate = "auto" if base.gate in CONDS else base.gate  # (a cond-gated base is the fallback)
    return dataclasses.replace(
        base, segments=cut, saved=frozenset(v for s in cut for v in s.inputs), compiled_bytes=None, origin="uniform",
        gate=gate, predicted_bytes=predicted_bytes(planning.forward, cut, planning.gradient_bytes),
    )


def search_simulated_budget(
    planning: Any, sim_peak: int, target: float, heuristic, steps: int = 10, measured: AbstractSet = frozenset()
) -> Optional[Plan]:
    """The plan for the largest simulated budget whose predicted compiled
    memory fits `target` (bisection: less budget, fewer values kept), flat
    if any flat plan fits, else with nested segments. A plan whose layout
    is in `measured` (compiled before, over the target) counts as not
    fitting, whatever its prediction: the search goes on to lower budgets.

    The simulation and XLA count differently (XLA fuses, so it keeps fewer
    and smaller residuals), so the simulated budget is searched for rather
    than scaled: what must fit is the plan's prediction in XLA's terms.
    Where the prediction is the same for plans that save more and less (a
    conv net's, which the backward pass's transients set), asking for a
    smaller target never changes the plan; leaving out the plans measured
    does (a VGG-like net at 0.7, whose plan saving one ReLU output less fits).
    """
    smallest = None
    for max_depth in NESTING_DEPTHS:
        lo, hi = 0.0, float(sim_peak)
        fitting = None
        for _ in range(steps):
            mid = (lo + hi) / 2
            plan = plan_at(planning, max(int(mid), 1), target, heuristic, max_depth)
            if plan is None:  # infeasible at this budget: go higher
                lo = mid
                continue
            if smallest is None or plan.predicted_bytes < smallest.predicted_bytes:
                smallest = plan
            if plan.predicted_bytes <= target and layout(plan) not in measured:
                fitting, lo = plan, mid
            else:
                hi = mid
        if fitting is not None:
            return fitting
    if smallest is None:
        # DTR ran out of memory at every budget tried below the peak (kept
        # scans are single operators, with their residuals as one tensor):
        # the segments alone, cut from the unconstrained run, may still fit.
        return plan_at(planning, max(int(sim_peak), 1), target, heuristic, 3)
    return smallest


def autotune_candidates(
    planning: Any, sim_peak: int, target: float, timed_within: float, heuristic, scales: Sequence[float], base: Plan,
    tried: set,
) -> Iterator[Plan]:
    """The plans autotuning compiles and times beside `base` (the search's):
    DTR's for `scales` of `target` (coarser searches: within 1/64 of the
    peak), then the uniform plan, each whose layout is not in `tried` (DTR's
    are added to it); all in the memory model's bytes. Where the uniform plan
    is timed (its prediction is within `timed_within`: the target, or less
    where example inputs are timed beside it), the ladder stops at its
    first plan of nested segments that reruns more than it (cost model): a
    nest runs its forward again once per level, and lower scales nest
    deeper. Such plans ran slower than the uniform one on every model
    measured (a 6-block transformer 1.28x, a ResNet 1.6x, a 64-layer MLP
    1.2-1.6x, a 6-layer CNN 1.4x; docs/benchmarks.md), so compiling them
    was time lost to planning."""
    uniform = None
    if not planning.kept_scans:  # (uniform segments would cut through a kept scan's neighbours alone)
        uniform = uniform_plan(planning, base)
        if uniform.predicted_bytes > target or layout(uniform) in tried:
            uniform = None
    timed = uniform is not None and uniform.predicted_bytes <= timed_within
    reruns = recompute_cost(planning.forward, uniform.segments) if timed else float("inf")
    for scale in scales:
        plan = search_simulated_budget(planning, sim_peak, target * scale, heuristic, steps=6)
        if plan is None or layout(plan) in tried:
            continue
        if any(s.children for s in plan.segments) and recompute_cost(planning.forward, plan.segments) > reruns:
            break
        tried.add(layout(plan))
        yield plan
    if uniform is not None and layout(uniform) not in tried:
        yield uniform
