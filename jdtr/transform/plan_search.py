"""The search for a plan that fits: DTR simulated at a budget, its plan compiled and measured.

`PlanSearch` compiles the plans `simulated_plans` reads off DTR's runs and,
where XLA needs more than predicted, plans for proportionally less (never a
plan it measured already), until one fits, or, where none does, takes the
plan that fits among those measured for the same step, by it (cond-gated
fallbacks) or by earlier searches at other budgets (`_measured_before`), or
says, in `error`, what the smallest found needs. A planning
(`planning.Planning`: the traced programs, the simulations and the compiled
candidates of one step) is what they search.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import jax

from ..runtime import OutOfBudgetError, format_bytes
from .checkpoint import CONDS, gates_differ, makes_random_bits, protects
from .checkpoint_plan import Plan, layout
from .costly import costly_candidate, rerun_cost
from .segments import LEFT_NESTED_MAX, nested_left, predicted_bytes, recompute_cost, uniform_leaves
from .simulated_plans import flat_plans, plan_at, search_simulated_budget, uniform_plan

# Where the plan for a smaller target is one already measured, the target
# shrinks by this factor, at most this many times, before the search gives up.
REPEAT_SHRINK = 0.9
MAX_REPEATS = 3

# A kept scan's strategy is searched only where the memory model's floor for
# it (arguments, gradients and what the strategy keeps for its scans, no
# segment at all) times this is within the target. XLA compiled the plans
# of four scan models (a scan GPT, an LSTM, two RNNs; 0.7, 0.5 and 0.3) to
# 0.76-1.27 of that floor; a strategy searched above it had each plan
# compiled, over the target, twice (docs/benchmarks.md).
SCAN_FLOOR_REACH = 0.7

# Where a search's path ends with no plan that fits, DTR's flat plans at this
# many simulated budgets are swept, and at most this many of them measured.
SWEEP_BUDGETS = 16
SWEEP_COMPILES = 3

# Where the path's plan that fits nests convolutions deeper than one level,
# the leaves of this many flat plans (least predicted first) are nested to
# the left in its stead, where one fits and recomputes less (`_shallower`).
SHALLOWER_SOURCES = 2
# Plans measured by earlier searches of a step that a later one adopts, at most (`adopt_measured`).
ADOPTED_AT_MOST = 4


class SlowPlanWarning(UserWarning):
    """The only plans `jdtr.plan` / `remat_grad` found within the budget
    run convolutions' gradients inside `lax.cond`s, which XLA on the CPU
    runs about 20x slower; the message gives the budget of the smallest
    plan found without them."""


def out_of_reach(planning: Any, target: float) -> bool:
    """Whether no plan of this planning's scan strategy can fit `target`: its
    memory model's floor (`predicted_bytes` without segments) is more than
    XLA has ever brought such a floor down to (`SCAN_FLOOR_REACH`). Only
    for kept scans, whose strategy keeps bytes no segment can save."""
    if not planning.kept_scans:
        return False
    return scan_floor(planning) * SCAN_FLOOR_REACH > model_target(planning, target)


def scan_floor(planning: Any) -> float:
    """The memory model's floor of a planning's scan strategy: arguments,
    gradients and what it keeps for its scans, no segment at all."""
    return predicted_bytes(planning.forward, (), planning.gradient_bytes, planning.scan_memory)


def least_target_in_reach(planning: Any) -> float:
    """The smallest target (compiled bytes, per device where sharded) that
    `out_of_reach` lets a search of this planning's strategy try."""
    floor = scan_floor(planning) * SCAN_FLOOR_REACH
    return planning.scale.to_device(floor) if planning.scale else floor


def model_target(planning: Any, target: float) -> float:
    """`target` in the plan's memory model: whole values (`devices.py` where sharded)."""
    return planning.scale.to_model(target) if planning.scale else float(target)


def past(deadline: Optional[float]) -> bool:
    """Whether `deadline` (a `time.perf_counter()`, or None: none) has passed."""
    return deadline is not None and time.perf_counter() > deadline


class _Late(Exception):
    """A search's deadline passed (`PlanSearch.run`)."""


class PlanSearch:
    """The search for a plan of one planning (one scan strategy) that fits
    `target`: DTR's plan at a simulated budget, compiled and measured, then
    for proportionally less where XLA needed more than predicted."""

    def __init__(self, planning: Any, target: float, heuristic, implementation: str):
        self.planning, self.target, self.heuristic, self.implementation = planning, target, heuristic, implementation
        self.sim_peak = planning.vg.unconstrained_peak()
        self.effective_target = model_target(planning, target)  # what the plan's memory model must fit
        self.tried: set = set()
        self.compiled: list[Plan] = []  # every plan measured
        self.best: Optional[Plan] = None
        self.deadline: Optional[float] = None  # (`run`'s)

    def record(self, candidate: Plan, nbytes: int) -> Plan:
        measured = dataclasses.replace(
            candidate, budget_bytes=self.target, compiled_bytes=nbytes,
            unconstrained_compiled_bytes=self.planning.unconstrained,
        )
        self.compiled.append(measured)
        self.planning.measured[layout(measured)] = measured
        if self.best is None or measured.compiled_bytes < self.best.compiled_bytes:
            self.best = measured
        return measured

    def adopt_measured(self, limit: float) -> None:
        """The plans earlier searches of the same planning measured within
        `limit` join this one's, to be timed or chosen with them: a search
        skips the layouts measured before, so a later one had neither (after
        an eager plan, a `jax.jit` plan of the same step at the same budget
        kept one of three times the recomputation, and ran 1.8x as long)."""
        known = {layout(p) for p in self.compiled}
        earlier = [p for key, p in self.planning.measured.items() if key not in known and p.compiled_bytes <= limit]
        # The least rerun first, a few: each one timed compiles again (plans at other budgets pile up).
        earlier.sort(key=lambda p: (rerun_cost(self.planning.forward, p.segments), p.compiled_bytes))
        self.compiled += [dataclasses.replace(p, budget_bytes=self.target) for p in earlier[:ADOPTED_AT_MOST]]

    def least_recompute(self, chosen: Plan, limit: float) -> Plan:
        """The plan to keep where none is timed (`autotune=False`, several
        processes, or under a trace where no candidate runs beside a copy of
        the arguments within the budget): of those measured within `limit`,
        the one that recomputes least by the cost model (`costly.rerun_cost`),
        the smaller of equals; gated by `cond`s only where no other fits (a
        convolution's gradient in a `cond` runs ~20x slower on the CPU). The
        search's own plan is its first fit at the budget, and could be one
        segment nested four deep, its forward rerun at each level: on a
        6-layer GELU MLP at 0.5, 2.9x `jax.jit(jax.grad)`'s step, where four
        flat segments of the same bytes ran at 1.6x."""
        fits = [p for p in (chosen, *self.compiled) if p.compiled_bytes is not None and p.compiled_bytes <= limit]
        pool = [p for p in fits if p.gate != "cond"] or fits
        forward = self.planning.forward
        return min(pool, key=lambda p: (rerun_cost(forward, p.segments), p.compiled_bytes))

    def measure(self, plan: Plan) -> Plan:
        if self.tried and past(self.deadline):
            raise _Late
        self.tried.add(layout(plan))
        [(_, step)] = self.planning.compile([plan])
        return self.record(plan, step.nbytes)

    def run(self, max_attempts: int, deadline: Optional[float] = None) -> Optional[Plan]:
        """The plan within the budget, or None. `deadline`: a `time.perf_counter()`
        after which no plan but the first is compiled; then the plan is one
        measured that fits, if any (for a caller with a plan of its own to
        fall back on, `whole_choice.py`)."""
        self.deadline = deadline
        try:
            return self._search(max_attempts)
        except _Late:
            self.deadline = None
            return self._measured_before()

    def _search(self, max_attempts: int) -> Optional[Plan]:
        planning, target = self.planning, self.target
        fallbacks: list[Plan] = []  # the path's plans over the target, gated by conds (`checkpoint.GATES`): the last resort
        attempts = repeats = 0
        while attempts < max_attempts:
            plan = search_simulated_budget(
                planning, self.sim_peak, self.effective_target, self.heuristic, measured=self.tried
            )
            if plan is None:
                break
            if layout(plan) in self.tried:
                # Asking for a little less gave a plan measured before: ask for
                # less still (a simulation, not a compile), a few times.
                repeats += 1
                if repeats > MAX_REPEATS:
                    break  # asking for less no longer changes the plan: nothing better to find
                self.effective_target *= REPEAT_SHRINK
                continue
            attempts += 1
            plan = self.measure(plan)
            if plan.compiled_bytes <= target:
                return self._taken(plan)
            if not plan.tied and makes_random_bits(planning.forward):
                # XLA may have made every layer's random bits at the start of
                # the step (of a key argument) and held them: the same plan
                # with them tied to their place (a 12-layer dropout MLP at
                # 0.5: no plan below 0.59 of `jax.grad`'s bytes untied, 0.39
                # tied). Not by default: tied, plans that fitted untied ran
                # 12% slower.
                tied = self.measure(dataclasses.replace(plan, tied=True, compiled_bytes=None))
                if tied.compiled_bytes <= target:
                    return self._taken(tied)
            if gates_differ(planning.forward, plan.segments, self.implementation):
                # The taint keeps convolutions fast, but XLA may hoist backward
                # work on the saved inputs into the forward pass: the same
                # segments with those inputs gated too ("inputs"), then with
                # their pullback's constants ("anchored"), then with their
                # recomputation in conds ("cond_recompute"); gated by "cond",
                # such plans are the fallbacks, should none of these fit
                # (slow).
                inputs = self.measure(dataclasses.replace(plan, gate="inputs", compiled_bytes=None))
                if inputs.compiled_bytes <= target:
                    return self._taken(inputs)
                # Nor the constants its pullback makes ("anchored"): smaller
                # where XLA made them at the start of the step, else larger
                # or slower, so measured only where "inputs" is over, and the
                # search's path goes on by the other two.
                anchored = self.measure(dataclasses.replace(plan, gate="anchored", compiled_bytes=None))
                if anchored.compiled_bytes <= target:
                    return self._taken(anchored)
                # Nothing of the backward pass can start before a cond on the
                # cotangent, and a convolution's gradients after it run at
                # their speed: often smaller than the taint's, a little
                # slower. Before the path asks for less (deeper nests, which
                # recompute more): a 6-layer 64-channel CNN at 0.5 fit at
                # 1.20x `jax.jit(jax.grad)`'s step so, where the path's plan
                # nested 5 deep ran at 1.58x.
                recomputing = self.measure(dataclasses.replace(plan, gate="cond_recompute", compiled_bytes=None))
                if recomputing.compiled_bytes <= target:
                    return self._taken(recomputing)
                plan = min(plan, inputs, key=lambda p: p.compiled_bytes)
                fallbacks.append(dataclasses.replace(plan, gate="cond", compiled_bytes=None))
            # XLA needed more than the plan's memory model predicted: plan for
            # proportionally less.
            self.effective_target = self.less(self.effective_target, plan.compiled_bytes)
        return self._last_resorts(fallbacks)

    def _last_resorts(self, fallbacks: list[Plan]) -> Optional[Plan]:
        """Where the search's path found no plan that fits: left nestings, a
        sweep of DTR's flat plans and the uniform one (`_sweep`), the
        cond-gated `fallbacks` (`_cond_gated`), plans measured before."""
        planning = self.planning
        tainted = self._without_conds(recomputing_convolutions=True)
        if tainted:
            # No tainted plan fits (where one did, the search returned it):
            # before the slow fallback, the smallest ones nested to the left,
            # then the sweep's.
            nested = self._nested_left(tainted, finest=True)
            if nested is None:
                nested = self._sweep()
            if nested is not None:
                return nested
            self._cond_gated(fallbacks)
            return self._measured_before()
        # Without convolutions, a plan measured before that fits recomputes
        # less than a left nesting, which keeps the least of all (one input
        # per group) for recompute quadratic in the group's size.
        before = self._measured_before()
        if before is not None:
            return before
        # The leaves of uniform segments only (of the smallest plan where a
        # kept scan rules those out): each source costs a compile of its
        # deepest nesting, and DTR's leaves did no better on chains. Not on
        # the fallback of scans unrolled where no strategy fit: there that
        # nesting was never the smallest plan (four scan models, two budgets
        # each, and a scan transformer; on an LSTM and two RNNs 2.0-2.5x
        # `jax.grad`'s own bytes), for a compile of the whole unrolled step
        # (a third of a failing call's seconds).
        plain = self._without_conds()
        if plain and not planning.unrolled:
            nested = self._nested_left(plain, plans=1 if planning.kept_scans else 0)
            if nested is not None:
                return nested
        return self._sweep()

    def _taken(self, plan: Plan) -> Plan:
        """What the search returns for a plan of its path that fits: with
        less recompute where a shallower nesting fits too (`_shallower`),
        and, sharded, with more bytes where they fit (`_closer`)."""
        return self._closer(self._shallower(plan))

    def _shallower(self, plan: Plan) -> Plan:
        """Where the path's plan that fits recomputes convolutions in nests
        deeper than one level: the leaves of the flat plans the memory model
        predicts smallest (`flat_plans`, `SHALLOWER_SOURCES` of them) nested
        to the left under the plan's gate, where one fits and recomputes
        less (`_nested_left`); else the plan.

        The path asks for proportionally less after each plan over the
        target, and where flat plans are over it takes DTR's nesting of
        its smaller plans, a binary tree: on a 2-level U-Net at 0.5 of
        `jax.grad`'s bytes, five levels deep (recomputing 3.7 forward passes;
        1.44x `jax.jit(jax.grad)`'s step), where the leaves of the flat plan
        predicted smallest, nested in pairs, fit recomputing 1.2 (1.30-1.35x)."""
        forward = self.planning.forward
        if max((seg.depth for seg in plan.segments), default=0) <= 1 or self.planning.kept_scans:
            return plan
        if not gates_differ(forward, plan.segments, self.implementation):
            return plan
        sources = flat_plans(self.planning, self.sim_peak, self.heuristic, SWEEP_BUDGETS)[:SHALLOWER_SOURCES]
        if not sources:
            return plan
        found = self._nested_left(
            sources, plans=SHALLOWER_SOURCES, gate=plan.gate, below=recompute_cost(forward, plan.segments), uniform=False,
        )
        return plan if found is None else found

    def _cond_gated(self, fallbacks: list[Plan]) -> None:
        """Measures the path's plans gated by "cond" (their convolutions'
        gradients in the conds, ~20x slower on the CPU, where every gate the
        path measured was over), compiled only now, where nothing else fits
        (a compile saved on every search that finds one): the first, which
        recomputes least, and where it is over the target, the least
        predicted, asked for least. Kept in `planning.measured` for
        `_measured_before`, here and at other budgets.

        XLA holds more than the model predicts of a plan asked for more: on
        a U-Net at 0.5 of `jax.grad`'s bytes the first plan gated by conds
        compiled to 0.73, the path's second, asked for less, to 0.42; the
        error suggested 0.51, where a call at 0.3 found 0.42."""
        least = [min(fallbacks[1:], key=lambda p: p.predicted_bytes)] if len(fallbacks) > 1 else []
        for plan in fallbacks[:1] + least:
            if layout(plan) not in self.tried and self.measure(plan).compiled_bytes <= self.target:
                return

    def _sweep(self) -> Optional[Plan]:
        """Where nothing else fits, before the error: DTR's flat plans
        across simulated budgets (`flat_plans`), least predicted first, those
        not measured yet, at most `SWEEP_COMPILES` of them, then the uniform
        plan. Only those the memory model fits in the target, unless no plan
        measured has beaten `jax.grad`'s own step (the error would suggest it).
        Last, the costly candidate of the smallest plan measured.

        XLA's bytes need not follow the model's order, so the proportional
        step down (`less`) can pass over the plan that fits: on a language
        model's head, with the output projection's transposed weight its own
        segment, a plan predicted at 13.8 MiB compiled to 27.9 (over
        `jax.grad`'s 23.1), and the next, 13.3, to 27.4; the step down went
        below the one at 12.8, which compiles to 18.6. Not for kept or
        unrolled scans, whose error paths compile large steps."""
        planning = self.planning
        if planning.kept_scans or planning.unrolled:
            return None
        beaten = any(p.compiled_bytes < planning.unconstrained for p in planning.measured.values())
        limit = model_target(planning, self.target) if beaten else float("inf")

        def fresh(p: Plan) -> bool:
            return p.predicted_bytes <= limit and layout(p) not in self.tried and layout(p) not in planning.measured

        candidates = [p for p in flat_plans(planning, self.sim_peak, self.heuristic, SWEEP_BUDGETS) if fresh(p)]
        # Then the uniform plan, whose cuts need no DTR run: DTR's runs fail at
        # low simulated budgets where it holds values that XLA fuses away.
        uniform = [uniform_plan(planning, self.best)] if self.best is not None else []
        for plan in candidates[:SWEEP_COMPILES] + [p for p in uniform if fresh(p)]:
            plan = self.measure(plan)
            if plan.compiled_bytes <= self.target:
                return self._closer(plan)
        # Then the plan saving what is dearest to recompute per byte, of the
        # smallest measured (autotuning measures it only beside a plan that
        # fits), one compile at most: on a Fourier neural operator (FFTs) at
        # 0.6 of `jax.grad`'s bytes, DTR's plans compiled to 0.65 at least,
        # and it to 0.57.
        if self.best is not None:
            costly = costly_candidate(self, self.best, attempts=1, model=model_target(planning, self.target))
            if costly is not None:
                return self._closer(costly)
        return None

    def less(self, model: float, compiled: int) -> float:
        """A memory-model target `model` whose plan compiled to `compiled`
        bytes, over the budget, made proportionally less (through the
        planning's scale to one device's bytes where sharded)."""
        if self.planning.scale is not None:
            return self.planning.scale.shrink(model, self.target, compiled)
        return model * self.target / compiled * 0.97

    def _measured_before(self) -> Optional[Plan]:
        """Where the search's own path found none that fits: the plan that fits
        among every plan measured for this step, by this search (cond-gated
        fallbacks) or by earlier ones at other budgets. Plans whose
        convolutions' gradients run outside conds first (in one, XLA on the
        CPU runs them ~20x slower), then the one that recomputes least (the
        most bytes).

        The budget an `OutOfBudgetError` suggests is a measured plan's bytes;
        a call at that budget must find the plan, where the search's path
        (its simulated budgets follow the target) may not pass by it again."""
        fits = [p for p in self.planning.measured.values() if p.compiled_bytes <= self.target]
        if not fits:
            return None
        plan = max(fits, key=lambda p: (p.gate != "cond", p.compiled_bytes))
        if layout(plan) in self.tried:
            return plan  # measured by this search: recorded at this target already
        return self.measure(plan)

    def _without_conds(self, recomputing_convolutions: bool = False) -> list[Plan]:
        """The plans this search measured not gated by conds (with
        `recomputing_convolutions`, only those with a convolution kept out of
        conds: tainted), smallest first."""
        forward = self.planning.forward
        plans = [
            p for p in self.compiled
            if p.gate not in CONDS and (not recomputing_convolutions or gates_differ(forward, p.segments, self.implementation))
        ]
        return sorted(plans, key=lambda p: p.compiled_bytes)

    def _nested_left(
        self, tainted: list[Plan], plans: int = 2, finest: bool = False, gate: Optional[str] = None,
        below: float = float("inf"), uniform: bool = True,
    ) -> Optional[Plan]:
        """Leaves nested to the left (`segments.nested_left`): those of the
        smallest `tainted` plans (at most `plans` of them; on a program
        without convolutions, of the smallest plan measured where scans are
        kept, else none), with `finest` those of DTR's plan at the
        unconstrained simulated budget, then `LEFT_NESTED_MAX` uniform ones;
        of each, the group size that recomputes least among those that fit
        (and less than `below`), gated by `gate` (by default the taint's).
        None if none fits.

        DTR's plan with the most room cuts the finest leaves, a layer each
        on a plain CNN. The search's path need not pass it: a 6-layer CNN
        at 0.35 of `jax.grad`'s bytes, asked for that alone, measured only
        coarser ones and raised, suggesting 0.47, where its leaves in one
        group compile to 0.33 (and were found after a call at 0.5).

        Measured, not predicted: on the CPU, XLA starts a convolution's weight
        gradient (a transposed copy of its input) as soon as that input
        exists, so a segment whose children all keep their inputs through its
        backward pass holds those copies at once. Nested to the left, a
        group keeps one leaf's input at a time (on a 6-convolution CNN: 0.48
        of `jax.grad`'s bytes in groups of 3 and 0.40 in one group of 6,
        where the uniform nesting took 0.55 and flat segments 0.54).
        Larger groups keep less and recompute more, so the sizes are
        bisected: the largest first (if it does not fit, none is tried).
        Each source is bisected among the groupings that recompute less than
        the best found so far, and the least recompute that fits is kept:
        of a plain CNN's, the first source's that fit at 0.5 (DTR's leaves
        in groups of five) ran at 1.6x `jax.jit(jax.grad)`'s step, where
        uniform leaves in groups of four fit at 1.23x."""
        planning = self.planning
        extra = []  # sources beyond the measured plans, each taken whatever `plans` says
        if not planning.kept_scans:  # (uniform segments would cut through a kept scan's neighbours alone)
            fine = plan_at(planning, max(int(self.sim_peak), 1), self.effective_target, self.heuristic) if finest else None
            leaves = uniform_leaves(planning.forward, planning.residuals, LEFT_NESTED_MAX)
            even = dataclasses.replace(tainted[0], segments=leaves, saved=frozenset(), origin="uniform") if uniform else None
            extra = [p for p in (fine, even) if p is not None]
        seen: set = set()
        best, least = None, below
        for i, plan in enumerate([*tainted, *extra]):
            leaves = tuple((leaf.start, leaf.stop) for seg in plan.segments for leaf in seg.leaves())
            if leaves in seen or (i < len(tainted) and len(seen) >= plans and plan.origin != "uniform"):
                continue
            seen.add(leaves)
            found = self._bisect_groups(plan, below=least, gate=gate)
            if found is not None:
                best, least = found, recompute_cost(self.planning.forward, found.segments)
        return best

    def _bisect_groups(self, plan: Plan, below: float = float("inf"), gate: Optional[str] = None) -> Optional[Plan]:
        """The least-recompute left nesting of `plan`'s leaves that fits and
        recomputes less than `below`, by bisection over group sizes. Without
        convolutions every group is tainted: gated by conds, a group n
        leaves deep would nest n conds."""
        forward, planning = self.planning.forward, self.planning
        options = nested_left(forward, plan.segments, planning.residuals, below)
        convolutions = gates_differ(forward, plan.segments, self.implementation)
        if gate is None:
            gate = "taint" if protects(self.implementation) and not convolutions else "auto"
        measured: dict[int, Plan] = {}

        def fits(i: int) -> bool:
            if i not in measured:
                nested = options[i]
                # What the whole step keeps: the new top level's inputs in place of the old's.
                kept = (plan.saved - {v for seg in plan.segments for v in seg.inputs}) | {
                    v for seg in nested for v in seg.inputs
                }
                measured[i] = self.measure(dataclasses.replace(
                    plan, segments=nested, saved=frozenset(kept), gate=gate, compiled_bytes=None,
                    predicted_bytes=predicted_bytes(forward, nested, planning.gradient_bytes, planning.scan_memory),
                ))
            return measured[i].compiled_bytes <= self.target

        if not options or not fits(len(options) - 1):
            return None
        lo, hi = -1, len(options) - 1  # options[hi] fits; options[lo] does not (or none)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        return measured[hi]

    def _closer(self, plan: Plan, attempts: int = 2) -> Plan:
        """On sharded arguments, where a plan that fits leaves much of the
        budget unused (one factor from whole values to a device's bytes is
        coarse), plans for more, keeping the largest that still fits: it
        recomputes less."""
        scale, target, model = self.planning.scale, self.target, self.effective_target
        for _ in range(attempts):
            if scale is None or plan.compiled_bytes >= 0.85 * target:
                break
            model = scale.shrink(model, target, plan.compiled_bytes)  # grows: the plan used less than the room
            candidate = search_simulated_budget(self.planning, self.sim_peak, model, self.heuristic)
            if candidate is None or layout(candidate) in self.tried:
                break
            candidate = self.measure(candidate)
            if candidate.compiled_bytes > target:
                break
            plan = max(plan, candidate, key=lambda p: p.compiled_bytes)
        return plan

    def _smallest_without_conds(self) -> Optional[int]:
        """The compiled bytes of the smallest plan measured for this step
        whose convolutions run outside conds, if any."""
        return min((p.compiled_bytes for p in self.planning.measured.values() if p.gate != "cond"), default=None)

    def slow_plan_message(self, plan: Plan) -> Optional[str]:
        """What a `SlowPlanWarning` says where `plan` is gated by conds and a
        plan without them was measured over the target, none within it; else None."""
        nbytes = self._smallest_without_conds()
        if plan.gate != "cond" or nbytes is None or any(p.gate != "cond" and p.compiled_bytes <= self.target for p in self.compiled):
            return None
        return (
            f"jdtr.plan: the only plans found within the budget of {format_bytes(int(self.target))} recompute "
            f"convolutions inside lax.cond, which XLA on the CPU runs about 20x slower than the step without "
            f"them; the smallest plan found without conds compiles to {format_bytes(nbytes)}: budget={nbytes} "
            "(bytes) keeps it."
        )

    def error(self) -> OutOfBudgetError:
        """No plan fits: say so rather than hand back a step over the budget,
        with the smallest plan's bytes as a budget that works: the smallest
        measured for this step, by this search or an earlier one (at another
        budget, whose path passed plans this one's did not)."""
        planning, target = self.planning, int(self.target)
        # (`record` puts every plan this search measures there too, its `best` included.)
        best = min(planning.measured.values(), key=lambda p: p.compiled_bytes, default=None)
        if best is not None and best.compiled_bytes >= planning.unconstrained:
            # No plan measured beat `jax.grad`'s own step, which a call at its
            # bytes runs (`planning.make_plan`): that is the smallest found. (A
            # GRU's unrolled plans compiled to 1.38x it at 0.3.)
            best = None
        fixed = planning.fixed_device_bytes
        if fixed >= target:
            error = arguments_exceed(fixed, target, planning.unconstrained, planning.scale is not None)
        else:
            needed = planning.unconstrained if best is None else best.compiled_bytes
            source = "the smallest checkpoint plan found" if best is not None else None
            if self.implementation == "checkpoint" and jax.default_backend() == "cpu":
                source = (
                    'the smallest plan found with implementation="checkpoint" (XLA on the CPU removes '
                    'checkpoint barriers and merges the recomputation away; use implementation="auto")'
                )
            error = OutOfBudgetError(
                needed_bytes=max(needed - fixed, 0),
                free_bytes=max(target - fixed, 0),
                pinned_bytes=fixed,
                locked_bytes=0,
                budget_bytes=target,
                op_name="the compiled step",
                source=source,
            )
        per_device = " per device" if planning.scale is not None else ""
        if best is None:
            error.suggest(planning.unconstrained, f"compiling `jax.grad`'s own step without remat (XLA's bytes{per_device}), "
                          "which no plan found beat")
        else:
            how = f"compiling the smallest plan found (XLA's bytes{per_device})"
            fast = self._smallest_without_conds()
            if best.gate == "cond" and fast is not None:
                how += (
                    f"; that plan recomputes convolutions inside lax.cond, about 20x slower on the CPU, and the "
                    f"smallest without conds compiles to {format_bytes(fast)} ({fast} bytes)"
                )
            error.suggest(best.compiled_bytes, how)
        return error


def arguments_exceed(fixed: int, target: int, unconstrained: int, per_device: bool = False) -> OutOfBudgetError:
    """The error for a budget that the step's arguments and gradients alone
    exceed: no recomputation can help, and the message says so in those terms."""
    error = OutOfBudgetError(
        needed_bytes=fixed, free_bytes=0, pinned_bytes=fixed, locked_bytes=0, budget_bytes=target,
        op_name="the compiled step's arguments and gradients",
    )
    device = " per device" if per_device else ""
    error.args = (
        f"the step's arguments and gradients alone take {format_bytes(fixed)} ({fixed} bytes){device}, more "
        f"than the budget of {format_bytes(target)} ({target} bytes){device}: no plan can fit, since "
        f"recomputation only frees intermediate values. (A budget counts the whole compiled step, arguments, "
        f"outputs and temporaries; `jax.grad` without remat compiles to {format_bytes(unconstrained)}{device}"
        f"{'; a budget of at least ' + format_bytes(fixed + 1) + ' per device is needed' if per_device else ''}.)",
    )
    return error


