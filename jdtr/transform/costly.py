"""Plans that save what is dearest to recompute per byte, and what reruns cost.

DTR evicts the tensor of least h = c / (m * s): its cost to recompute over
its memory and its staleness (§2). A plan read from DTR's simulation saves
the residuals DTR kept, and its compiled segments recompute the rest from
their inputs, rerunning everything those residuals are made of. The
simulation may have had some of that resident: a sort's output is no
residual (its derivative reads the permutation), and DTR kept it while it
recomputed the cheap `add` after it; the compiled segment, which saves
residuals only, reran the sort. Where a few operations cost far more per
byte than the rest, those reruns are most of a plan's overhead (six layers
of sort, top_k and softmax: a 6 ms sort where a matmul of the same bytes
takes 0.2 ms; every plan DTR's runs gave took 1.55-1.7x `jax.jit(jax.grad)`'s
step at half its bytes).

`costly_plan` drops the staleness, which a compiled step has no use for,
and saves the forward values of greatest c/m, as many as the memory model
fits: sorts and matmuls are kept, elementwise chains recomputed. Some
saved equations keep values no name reaches: JAX's derivative of a `sort`
sorts an iota beside the keys and keeps the permutation
(`hidden_residuals`); the segment saves those by the primitive's signature.

`rerun_cost` prices a plan as its compiled step runs it, by what the
backward pass reruns (`segments.recompute_cost`, with those derivatives'
equations rerun whole unless saved by signature), so that the planner
offers this candidate only where it reruns less than DTR's own plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax

from . import _jax_core
from .checkpoint_plan import Plan, layout
from .program import Equation, Program, Value, signature
from .segments import Segment, is_float, item_cost, predicted_bytes, recompute_cost, segments

# The candidate is offered where the backward pass of DTR's plan reruns at
# least this many times what its own reruns (cost-model units): it costs a
# compile and a timing, which a plan that reruns about as much seldom repays.
RERUN_GAIN = 1.25
# How deep its segments may nest where no flat cut fits (as `simulated_plans.NESTING_DEPTHS`' middle).
NESTING = 3
# At most this many levels of c/m are tried, spread over the program's (a
# cut of the forward pass each).
LEVELS = 16
# Where a level fits and the next does not, the next is bisected: at the first this many such places.
CROSSINGS = 2


@dataclasses.dataclass(frozen=True)
class Hidden:
    """What an equation's derivative keeps that no name reaches."""

    signatures: frozenset  # of the equations JAX's rule binds (`SavePolicy.signatures`)
    nbytes: int  # the values they keep beside the primal outputs


_NONE = Hidden(frozenset(), 0)
# By primitive and input signature: a program repeats them (every layer's
# sort). Emptied past `HIDDEN_KEPT` (a long process plans many programs).
_HIDDEN: dict[tuple, Hidden] = {}
HIDDEN_KEPT = 4096


def hidden_residuals(item: Any) -> Hidden:
    """The values JAX's derivative of `item` keeps beside its outputs, which
    the plan can save only by the primitive's signature."""
    if not isinstance(item, Equation) or item.trace is None or item.scan is not None or item.effects:
        return _NONE
    differentiable = [is_float(v) for v in item.args]
    if not any(differentiable):
        return _NONE
    key = (item.name, signature(item.name, item.args), len(item.outputs))
    found = _HIDDEN.get(key)
    if found is None:
        structs = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in item.args]
        try:
            rebound = _jax_core.rebound_under_jvp(item.trace, structs, differentiable, item.name, len(item.outputs))
        except Exception:  # noqa: BLE001 - no derivative rule (or none JAX can trace abstractly): nothing to keep
            rebound = []
        found = Hidden(
            frozenset(signature(item.name, avals) for avals, _ in rebound),
            sum(_jax_core.aval_nbytes(a) for _, extra in rebound for a in extra),
        )
        if len(_HIDDEN) >= HIDDEN_KEPT:
            _HIDDEN.clear()
        _HIDDEN[key] = found
    return found


def keeps_hidden(seg: Segment, item: Any) -> bool:
    """Whether `seg`'s backward pass reruns `item` whole, whatever it saves
    of its outputs: its derivative keeps values no name reaches
    (`hidden_residuals`), and `seg` does not save them by signature."""
    hidden = hidden_residuals(item)
    return bool(hidden.signatures) and not hidden.signatures <= seg.signatures


def rerun_cost(program: Program, segs: Sequence[Segment]) -> float:
    """What the compiled backward pass reruns of `segs` (cost-model units):
    `segments.recompute_cost`, with the equations `keeps_hidden` names."""
    return recompute_cost(program, segs, keeps_hidden)


def _ratios(program: Program) -> dict[Value, float]:
    """Each value an equation makes, with the equation's cost per byte of its outputs."""
    found = {}
    for item in program.body:
        if isinstance(item, Equation) and item.scan is None and item.outputs:
            nbytes = max(1, sum(v.nbytes for v in item.outputs))
            for v in item.outputs:
                found[v] = item_cost(item) / nbytes
    return found


def _worth_saving(program: Program, saved: set[Value], residuals: set[Value]) -> set[Value]:
    """`saved` less the values no recomputation would read: neither a residual
    nor read by an equation some output of which is not saved."""
    read_by_recomputed: set[Value] = set()
    for item in program.body:
        if not all(v in saved for v in item.outputs):
            read_by_recomputed.update(item.args)
    return {v for v in saved if v in residuals or v in read_by_recomputed}


def _with_hidden(program: Program, segs: Sequence[Segment], saved: set[Value]) -> tuple[tuple[Segment, ...], int]:
    """`segs` with each leaf saving, by signature, what the derivatives of
    its saved equations keep beyond their outputs; and those bytes. A
    signature saves every equation of the leaf that has it: their outputs
    join the leaf's saved values (and `saved`)."""
    out, extra = [], 0
    for seg in segs:
        if seg.children:
            children, more = _with_hidden(program, seg.children, saved)
            out.append(dataclasses.replace(seg, children=children))
            extra += more
            continue
        items = [(item, hidden_residuals(item)) for item in program.body[seg.start : seg.stop]]
        signatures = frozenset(
            sig for item, hidden in items if any(v in saved for v in item.outputs) for sig in hidden.signatures
        )
        caught = [(item, hidden) for item, hidden in items if hidden.signatures & signatures]
        made = {v for item, _ in caught for v in item.outputs}
        saved |= made
        extra += sum(hidden.nbytes for _, hidden in caught)
        leaving = set(seg.outputs)
        out.append(dataclasses.replace(
            seg, signatures=signatures,
            saved=(*seg.saved, *(v for v in made if v not in seg.saved and v not in leaving)),
            recomputed=tuple(v for v in seg.recomputed if v not in made),
        ))
    return tuple(out), extra


def costly_plan(planning: Any, base: Plan, target: float) -> Optional[Plan]:
    """Of the plans that save the values whose equations cost the most
    compute per byte, the one the memory model fits in `target` that reruns
    least; None where none fits. Tried: every value of at least some c/m,
    at `LEVELS` levels of it spread over the program's; and where one level
    fits and the next does not, as many of the next level's values as fit
    (bisected; among equals, those made first: a chain's first layers).
    Segments are cut as DTR's plans' are (`segments.segments`), beside
    `base`. (The memory model is not monotone in what is saved, as saving
    more moves the cuts: on six layers of sort, top_k and softmax at half of
    `jax.grad`'s bytes, the most values whose plan fitted reran 7x what the
    sorts and top_ks alone did.)"""
    if planning.kept_scans:  # (its cuts would run through a kept scan's neighbours alone)
        return None
    forward, residuals, gradient_bytes = planning.forward, planning.residuals, planning.gradient_bytes
    # (floats, and the integer residuals: a key or an index no recomputation needs is not worth a name)
    ratio = {v: r for v, r in _ratios(forward).items() if is_float(v) or v in residuals}
    if not ratio:
        return None
    dearest = sorted(ratio, key=lambda v: -ratio[v])  # (stable: among equals, in program order)
    levels = sorted(set(ratio.values()), reverse=True)
    if len(levels) > LEVELS:
        levels = [levels[round(i * (len(levels) - 1) / (LEVELS - 1))] for i in range(LEVELS)]
    counts = [sum(1 for r in ratio.values() if r >= level) for level in levels]
    found: dict[int, tuple[float, Plan]] = {}  # by how many of `dearest` are saved: (rerun, plan); rerun inf if over

    def plan_for(count: int) -> tuple[float, Plan]:
        if count not in found:
            saved = _worth_saving(forward, set(dearest[:count]), residuals)
            cut, extra = _with_hidden(forward, segments(forward, saved, residuals, target, gradient_bytes, NESTING), saved)
            plan = dataclasses.replace(
                base, segments=cut, saved=frozenset(saved | {v for s in cut for v in s.inputs}),
                predicted_bytes=predicted_bytes(forward, cut, gradient_bytes) + extra, compiled_bytes=None,
                origin="costly", gate="auto",
            )
            fits = plan.predicted_bytes <= target
            found[count] = (rerun_cost(forward, cut) if fits else float("inf"), plan)
        return found[count]

    crossings = 0
    for before, count in zip([0, *counts], counts):
        if plan_for(count)[0] == float("inf") and before and plan_for(before)[0] < float("inf") and crossings < CROSSINGS:
            crossings += 1
            lo, hi = before, count  # plan_for(lo) fits, plan_for(hi) does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if plan_for(mid)[0] < float("inf") else (lo, mid)
    rerun, plan = min(found.values(), key=lambda f: f[0])
    return plan if rerun < float("inf") else None


def costly_candidate(search: Any, base: Plan, attempts: int = 3, model: Optional[float] = None) -> Optional[Plan]:
    """`costly_plan` for `search`'s step, measured (`search.measure`: XLA's
    bytes), where it reruns `RERUN_GAIN` times less than `base`: the first
    that fits the budget, planning for proportionally less after one that
    does not, as `search` does with DTR's plans; None where none does.
    `model`: the memory model's target to start from (else the search's)."""
    planning, target = search.planning, search.target
    model = search.effective_target if model is None else model
    for _ in range(attempts):
        plan = costly_plan(planning, base, model)
        if plan is None or layout(plan) in search.tried:
            return None
        if rerun_cost(planning.forward, plan.segments) * RERUN_GAIN > rerun_cost(planning.forward, base.segments):
            return None
        plan = search.measure(plan)
        if plan.compiled_bytes <= target:
            return plan
        model = search.less(model, plan.compiled_bytes)
    return None
