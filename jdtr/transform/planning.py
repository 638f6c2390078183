"""Planning: DTR simulated on a traced step, its decisions exported as `jax.checkpoint` segments.

`jdtr.grad` pays Python dispatch per equation. For a static computation one
can instead *simulate* DTR once on the traced forward+backward at the
budget, read off which forward values it kept resident until the backward
pass needed them (its persistent checkpoints), and compile that decision:

1. The forward function is traced and normalised (scans unrolled), and every
   forward value gets a `checkpoint_name`.
2. The value-and-grad of that named forward is simulated under the budget
   (the same runtime, with a backend that holds no buffers). A named value
   the backward pass reads and DTR never had to rematerialize is *saved*.
3. The forward equations are cut into segments at points where every value
   crossing the cut is saved: each segment becomes one `jax.checkpoint`
   whose policy saves the segment's saved names, so its other values are
   recomputed when the backward pass reaches it.
4. The compiled step's memory (`memory_analysis()`: arguments + outputs +
   temporaries) is checked against the budget; if XLA needs more than the
   simulation predicted, the plan is redone for a proportionally smaller
   simulated budget.

The segments are cut in `segments`, run in `checkpoint`, compiled and
measured in `compiled`; `plan_search` searches the simulated budget for a
plan that fits; `make_plan` tries the scan strategies (`scans`) in turn
and, autotuning, times the candidates.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import jax

from ..budget import BudgetLike, parse_budget
from ..offline import run
from ..runtime import Heuristic, OutOfBudgetError, get_heuristic
from . import manual
from .arguments import Arguments, argnums_tuple, concrete_leaves, flatten_arguments, on_planning_mesh, unseen_mesh
from .autotune import Timing, can_autotune, example_inputs, median_step_seconds
from .checkpoint import named_forward, run_segments
from .checkpoint_plan import Plan, layout
from .compiled import CompiledStep, compile_all, compiled_bytes, lower, measure_options
from .costly import costly_candidate
from .devices import DeviceScale, device_bytes, device_scale, is_sharded, placed_scale, placements, unsharded
from .lowering import simulation
from .plan_search import PlanSearch, SlowPlanWarning, least_target_in_reach, model_target, out_of_reach, past, scan_floor
from .simulated_plans import autotune_candidates
from .normalize import normalize
from .program import Program, Value
from .scans import (
    STRATEGIES, KeptScan, ScanMemory, ScanStrategy, as_run, for_length, kept_scans, scan_memory, with_strategy,
)
from .save_policy import NAME_PREFIX, value_id as named_id
from .segments import fixed_bytes


IMPLEMENTATIONS = ("auto", "checkpoint", "protected")
# Autotuning: step times within this fraction of the fastest count as equal.
TIE_TOLERANCE = 0.02
# Autotuning's candidates: DTR's plans for these fractions of the budget.
# Fine steps matter: on the CPU the fastest transformer plan came from 0.35.
AUTOTUNE_SCALES = (0.7, 0.5, 0.35, 0.25)



# ------------------------------------------------------------ configuration


@dataclass(frozen=True, eq=False)
class Config:
    """How the user's function is flattened for planning (not the function
    itself: plans and the planning cache must not keep it alive)."""

    argnums: Union[int, tuple[int, ...]]
    has_aux: bool
    arguments: Arguments
    out_tree: Any
    implementation: str
    traced: Any = None  # the function's forward jaxpr (`Plan.grad`'s derivatives under an outer transformation)

    def traced_leaves(self, args, kwargs) -> list:
        return self.arguments.traced_leaves(args, kwargs)

    def unflatten_outputs(self, outs):
        return jax.tree_util.tree_unflatten(self.out_tree, outs)


def _forward_program(fun: Callable, arguments: Arguments) -> tuple[Any, Program, Any]:
    """The forward function's jaxpr and normalised program (scans kept); inputs are the traced leaves."""
    closed, out_shape = jax.make_jaxpr(arguments.bind(fun), return_shape=True)(*arguments.traced_specs)
    # (JAX differentiates it again: calls with custom derivatives stay whole.)
    program = normalize(closed, keep_scans=True, shardings=placements(arguments.traced_specs), keep_custom=True)
    return closed, program, jax.tree_util.tree_structure(out_shape)


# ------------------------------------------------------------ simulation


def _backward_reads(forward: Program, vg: Program) -> dict[Value, Value]:
    """The forward values the backward pass reads (the residuals), each with
    its named counterpart in the value-and-grad program.

    Some values the backward pass reads are computed in the forward pass by
    JAX's derivative rules, not by the function (JAX 0.11's tanh: its
    gradient reads `one_minus_square` of the tanh's output, which the
    forward pass computes beside it). A plan that recomputes such a value
    recomputes it from the forward value it is made of, which counts as read."""
    names = {named_id(k): v for k, v in vg.names.items() if k.startswith(NAME_PREFIX)}
    forward_values = {v.id: v for item in forward.body for v in item.outputs}
    named: dict[Value, list[Value]] = {}  # the forward values each stands for (several: equal scalars)
    for value_id, vg_value in names.items():
        stands_for = named.setdefault(vg_value, [])
        if value_id in forward_values:
            stands_for.append(forward_values[value_id])
    position, last_use, producer = {}, {}, {}
    for i, item in enumerate(vg.body):
        for v in item.outputs:
            position[v], producer[v] = i, item
        for v in item.args:
            last_use[v] = i
    # Where the forward pass ends in the value-and-grad program: the last named value.
    forward_end = max((position.get(v, -1) for v in names.values()), default=-1)
    pending = [v for v, last in last_use.items() if last > forward_end and position.get(v, -1) <= forward_end]
    own = {getattr(item, "name", None) for item in forward.body}  # the primitives the function itself uses
    reads, seen = {}, set()
    while pending:  # back from each value read late, through unnamed values, to the named ones
        v = pending.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in named:  # (a named value with no forward counterpart ends the walk too)
            reads.update((fwd, v) for fwd in named[v])
            continue
        # Only through a value made from one value, as large, by a primitive the function itself
        # does not use (the derivative rules' own): it stands for that value (`one_minus_square`
        # for the tanh's output). Without that, JAX 0.11's gradient of a tanh chain by its input
        # reads no forward value at all, and its plans saved nothing (measured on an H200's JAX
        # 0.11.2). Through every derived value would be as right, but it moved JAX 0.10's plans
        # of the reference models (a normalization's `2 (x - mean)` read: a ResNet at 0.7 no
        # longer fit); this rule leaves their residuals as they were.
        if v not in producer:
            continue  # an input of the step
        made_of = [a for a in producer[v].args if a in position]
        if getattr(producer[v], "name", None) not in own and len(made_of) == 1 and made_of[0].nbytes == v.nbytes:
            pending.append(made_of[0])
        elif getattr(producer[v], "name", None) == "shard_map" and "shard_map" not in own:
            # A residual JAX's `shard_map` rule made beside an inlined body
            # equation's output (`manual.py`): recomputed from that equation's inputs.
            pending.extend(made_of)
    return reads


def _value_and_grad_program(config: Config, forward: Program) -> Program:
    """The value-and-grad of the forward program with every float value named."""
    named = named_forward(forward)

    def scalar(*leaves):
        outs = named(*leaves)
        return (outs[0], outs[1:]) if config.has_aux else outs[0]

    arguments = config.arguments
    vg = jax.value_and_grad(scalar, arguments.traced_argnums, has_aux=config.has_aux)
    return normalize(jax.make_jaxpr(vg)(*arguments.traced_specs), keep_scans=True, shardings=placements(arguments.traced_specs))


@dataclass(eq=False)
class Planning:
    """What planning one function for one argument structure computes once
    for every budget: its programs, XLA's bytes without remat, the DTR
    simulations (by simulated budget) and the compiled candidate plans (by
    layout). Reused, like `jax.jit`'s cache, by the function's identity."""

    config: Config
    forward: Program
    vg: Program
    unconstrained: int
    simulations: dict = dataclasses.field(default_factory=dict)
    steps: dict = dataclasses.field(default_factory=dict)  # layout -> CompiledStep
    # layout -> the lowered step of a CompiledStep compiled only to be
    # measured: autotuning compiles it again to run, and tracing a step's
    # gradient again took about 1 s a plan on a 6-block transformer. Kept
    # during one `make_plan` (`forget_lowerings`).
    lowerings: dict = dataclasses.field(default_factory=dict)
    measured: dict = dataclasses.field(default_factory=dict)  # layout -> the plan with XLA's bytes, every search's
    strategy: ScanStrategy = ScanStrategy()  # how its kept scans run (`scans.py`)
    kept_scans: tuple[KeptScan, ...] = ()
    strategies: dict = dataclasses.field(default_factory=dict)  # the same step under other scan strategies
    traced: Any = None  # the forward's jaxpr, to unroll its scans where no strategy fits
    scale: Optional[DeviceScale] = None  # sharded arguments: bytes per device against the model's
    unrolled: bool = False  # the fallback: a step whose kept scans are unrolled, no strategy having fit

    @property
    def scan_memory(self) -> dict[int, ScanMemory]:
        return {k.position: k.memory for k in self.kept_scans}

    def under(self, strategy: ScanStrategy) -> "Planning":
        """This planning with its kept scans run under `strategy` (programs
        traced again: the value-and-grad keeps what the strategy keeps)."""
        found = self.strategies.get(strategy)
        if found is None:
            forward = with_strategy(self.forward, strategy) if strategy != self.strategy else self.forward
            kept = tuple(
                KeptScan(i, eq, own, scan_memory(self.forward.body[i], own))
                for i, eq in kept_scans(forward).items()
                for own in [for_length(strategy, eq.scan.length)]
            )
            vg = _value_and_grad_program(self.config, forward) if strategy != self.strategy else self.vg
            found = Planning(
                self.config, forward, vg, self.unconstrained, strategy=strategy, kept_scans=kept, scale=self.scale
            )
            self.strategies[strategy] = found
        return found

    def scan_levels(self) -> Iterator["Planning"]:
        """This step under each scan strategy, least recompute first, then
        with its scans unrolled (DTR deciding per iteration, as before scans
        were kept); itself alone without kept scans. Last, on a mesh, the
        step with its `shard_map`s' bodies inlined (`inlined`)."""
        if not kept_scans(self.forward):
            yield self
        else:
            equations = kept_scans(self.forward).values()
            yield from (self.under(s) for s in STRATEGIES if as_run(s, equations) == s)  # each program once
            yield self._unrolled(inline_manual=False)
        shardings = placements(self.config.arguments.traced_specs)
        if shardings is not None and self.traced is not None and manual.has_inlinable(self.traced.jaxpr):
            yield self._unrolled(inline_manual=True)

    def _unrolled(self, inline_manual: bool) -> "Planning":
        """The step with its scans unrolled, and with `inline_manual` its
        `shard_map`s' bodies inlined: each equation of a body a `shard_map`
        of its own over the same mesh (`manual.py`), so that the plan's
        segments cut inside the body. A `shard_map` is one equation
        otherwise, and its gradient two, the backward body needing every
        residual of the forward body at once: a loss written inside one
        `shard_map` had no plan below about its own step. Tried last: a whole
        `shard_map` compiles to one program, XLA's to schedule."""
        key = "inlined" if inline_manual else "unrolled"
        if key not in self.strategies:
            shardings = placements(self.config.arguments.traced_specs)
            forward = normalize(self.traced, shardings=shardings, keep_custom=True, inline_manual=inline_manual)
            vg = _value_and_grad_program(self.config, forward)
            self.strategies[key] = Planning(
                self.config, forward, vg, self.unconstrained, scale=self.scale, unrolled=not inline_manual
            )
        return self.strategies[key]

    @functools.cached_property
    def reads(self) -> dict[Value, Value]:
        """The residuals, each with its counterpart in the value-and-grad program."""
        return _backward_reads(self.forward, self.vg)

    @functools.cached_property
    def workload(self):
        """The value-and-grad program for the simulation driver."""
        return simulation(self.vg)

    @functools.cached_property
    def residuals(self) -> set[Value]:
        return set(self.reads)

    @property
    def fixed_device_bytes(self) -> int:
        """The arguments, constants and gradients on one device (whole on one device)."""
        if self.scale is not None:
            return self.scale.fixed_device
        return fixed_bytes(self.forward, self.gradient_bytes)

    @functools.cached_property
    def gradient_bytes(self) -> int:
        """Bytes of the gradients the step returns (one per differentiated input)."""
        differentiated = set(self.config.arguments.traced_argnums)
        return sum(v.nbytes for i, v in enumerate(self.forward.inputs) if i in differentiated)

    def compile(self, plans: Iterable[Plan], run: bool = False) -> list[tuple[Plan, CompiledStep]]:
        """Each plan with its compiled step. A new layout is lowered as
        `plans` yields it and compiled in the background while the next is
        chosen (`plans` may be a generator that searches) and lowered.
        Steps to `run` (autotuning times them) compile with XLA's defaults
        and keep their executables; the others are only measured
        (`compiled.measure_options`)."""
        options = None if run else measure_options()
        taken: list[Plan] = []
        new: list = []

        def lowered():
            for plan in plans:
                taken.append(plan)
                key = layout(plan)
                found = self.steps.get(key)
                if (found is None or (run and found.executable is None)) and key not in new:
                    new.append(key)
                    step = self.lowerings.pop(key, None)
                    if step is None:
                        step = lower(step_of(plan, self.config), self.config.arguments.traced_specs)
                    if options is not None:  # (compiled without its executable: kept to compile again, to run)
                        self.lowerings[key] = step
                    yield step

        for key, (executable, nbytes) in zip(new, compile_all(lowered(), options)):
            self.steps[key] = CompiledStep(nbytes, executable if options is None else None)
        return [(plan, self.steps[layout(plan)]) for plan in taken]

    def forget_lowerings(self) -> None:
        """Drops the lowered steps kept for autotuning, this planning's and its scan strategies'."""
        self.lowerings.clear()
        for other in self.strategies.values():
            other.lowerings.clear()


# Planning a function again for the same shapes (another budget, a sweep of
# budgets, a notebook) starts from what was computed before. Held weakly by
# the function, as `jax.jit` does, so that dropping the function frees its
# programs (and any arrays they captured); per function, the last few
# argument structures.
PLANNING_CACHE_SIZE = 8
planning_cache: "weakref.WeakKeyDictionary[Callable, collections.OrderedDict]" = weakref.WeakKeyDictionary()


def _planning_for(fun, argnums, has_aux, heuristic, implementation, arguments: Arguments) -> Planning:
    key = (argnums_tuple(argnums), has_aux, heuristic, implementation, arguments.key)
    try:
        entries = planning_cache.setdefault(fun, collections.OrderedDict())
        found = entries.get(key)
    except TypeError:  # a callable without weak references, or an unhashable heuristic: plan from scratch
        entries, found = None, None
    if found is not None:
        entries.move_to_end(key)
        return found
    traced, forward, out_tree = _forward_program(fun, arguments)
    config = Config(argnums, has_aux, arguments, out_tree, implementation, traced)
    vg = _value_and_grad_program(config, forward)
    plain = arguments.bind(jax.grad(fun, argnums, has_aux))
    specs = arguments.traced_specs
    unconstrained = compiled_bytes(plain, specs)
    scale = None
    if is_sharded(specs):  # a budget per device: how the model's values map to one device's bytes
        differentiated = set(arguments.traced_argnums)
        consts = sum(v.nbytes for v, _ in forward.consts)
        flags = [i in differentiated for i in range(len(specs))]
        if placements(specs) is not None:  # the programs count per device already
            scale = placed_scale(specs, flags, consts)
        else:
            whole = compiled_bytes(plain, [unsharded(spec) for spec in specs])
            scale = device_scale(specs, flags, consts, unconstrained, whole)
    planning = Planning(config, forward, vg, unconstrained, traced=traced, scale=scale)
    if entries is not None:
        entries[key] = planning
        while len(entries) > PLANNING_CACHE_SIZE:
            entries.popitem(last=False)
    return planning


def _no_plan_fits(
    searches: list[PlanSearch], unreached: list[Planning], target: int, heuristic, implementation: str,
    max_attempts: int,
) -> OutOfBudgetError:
    """The error where no plan fits: said by the search whose smallest plan
    is smallest (a scan kept under one strategy may fit where the unrolled
    program, tried last, compiles to more than no remat at all), with that
    plan's bytes as the budget to ask for (a call at it finds the plan:
    `PlanSearch._measured_before`).

    Where strategies were out of reach of the target, the one with the
    lowest floor is searched first at the least target in its reach, so
    that its plans are among those the suggestion is taken from: a GRU's
    step at 0.3 of `jax.grad`'s bytes, every kept strategy out of reach,
    suggested the unrolled program's smallest plan, 1.36x `jax.grad`'s
    bytes, where a call at 0.5 suggested 0.53."""
    if unreached:
        lowest = min(unreached, key=scan_floor)
        PlanSearch(lowest, least_target_in_reach(lowest), heuristic, implementation).run(max_attempts)
        said = PlanSearch(lowest, target, heuristic, implementation)  # at the target, of the plans measured there
        said.best = min(lowest.measured.values(), key=lambda p: p.compiled_bytes, default=None)
        searches = [*searches, said]
    measured = [s for s in searches if s.best is not None]
    return min(measured, key=lambda s: s.best.compiled_bytes, default=searches[-1]).error()


def make_plan(
    fun: Callable,
    args: tuple,
    kwargs: dict,
    budget: BudgetLike,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    implementation: str = "auto",
    autotune: Optional[bool] = None,
    max_attempts: int = 6,
) -> Plan:
    """Simulates DTR at `budget` and exports its decisions as checkpoint segments."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    budget_spec = parse_budget(budget)
    get_heuristic(heuristic)
    _, arguments = flatten_arguments(argnums, args, kwargs, eager=False)
    devices = unseen_mesh(args, kwargs)
    if devices > 1:
        warnings.warn(
            f"jdtr: the arguments are traced over a mesh of {devices} devices whose shardings their types do not "
            "carry (axes of type Auto under jax.jit), so the plan counts whole arrays, not bytes per device. "
            "Make the plan on the sharded arrays themselves (jdtr.plan(loss, *args), then jax.jit(plan.grad)), "
            "or shard them over a mesh with Explicit axes (jax.make_mesh's default), whose types carry them.",
            stacklevel=3,
        )
    arguments = on_planning_mesh(arguments)
    base = _planning_for(fun, argnums, has_aux, heuristic, implementation, arguments)
    try:
        unconstrained = base.unconstrained
        target = budget_spec.resolve(unconstrained)
        if unconstrained <= target:
            # `jax.grad` itself fits: nothing to recompute, and no plan is faster.
            return _without_remat(base, target, heuristic, fun)
        chosen, searches, unreached = _search_levels(base, target, heuristic, implementation, max_attempts)
        if chosen is None:
            err = _no_plan_fits(searches, unreached, target, heuristic, implementation, max_attempts)
            if "inlined" in base.strategies:  # (planned with its `shard_map`s' bodies inlined)
                err.add_note(_IN_THE_BODY)
            raise err
        search = searches[-1]
        planning = search.planning
        limit = max(target, chosen.compiled_bytes)
        search.adopt_measured(limit)
        slow = search.slow_plan_message(chosen)
        if slow is not None:
            warnings.warn(slow, SlowPlanWarning, stacklevel=3)
        untimed = lambda: search.least_recompute(chosen, limit)  # noqa: E731
        if autotune is False:
            return untimed()
        if jax.process_count() > 1:
            # Every process must run the same plan (its collectives meet those of
            # the others), and timings differ between processes: chosen untimed.
            if autotune:
                warnings.warn("jdtr: autotune is off across several processes; the plan is chosen by the cost model", stacklevel=3)
            return untimed()
        structs = arguments.traced_specs
        if not can_autotune(structs):
            if autotune:  # asked for explicitly: say why it did not happen
                warnings.warn(
                    "autotune needs example inputs and cannot make PRNG keys of this JAX's types; the plan is chosen by the cost model", stacklevel=3
                )
            return untimed()
        # The steps are timed on the caller's own arrays where they are concrete:
        # example inputs would sit on the device beside them, and a candidate
        # within the budget plus a second copy of the arguments is not (on an
        # H100 autotuning peaked 8% over the budget that way). Under a trace
        # there are none, so a candidate is timed only if it fits with the copy.
        inputs = concrete_leaves(arguments, args, kwargs)
        copies = 0
        if inputs is None:
            inputs = example_inputs(structs)
            copies = sum(device_bytes(x) for x in inputs)  # (per device, as the budget)
        # Candidates: the plans DTR makes for smaller budgets, which also fit,
        # and the uniform plan (timed where it fits beside the copy); each
        # compiles in the background while the next is searched for and lowered.
        beside = search.effective_target if not copies else min(search.effective_target, model_target(planning, limit - copies))
        candidates = autotune_candidates(planning, search.sim_peak, search.effective_target, beside, heuristic, AUTOTUNE_SCALES, chosen, search.tried)

        def timed(plans: list[Plan]) -> list[Plan]:
            fitting = [plan for plan in plans if plan.compiled_bytes + copies <= limit]
            if any(plan.gate != "cond" for plan in fitting):
                # A plan gated by conds is measured only as the fallback for a
                # convolution's recomputation, which runs ~20x slower in a cond on
                # the CPU: where another fits, it is not worth a run.
                fitting = [plan for plan in fitting if plan.gate != "cond"]
            return fitting

        # The search's plans to time were only measured: they compile again, to
        # run, in the background with the candidates.
        searched = timed(search.compiled)
        compiled = planning.compile(itertools.chain(searched, candidates), run=True)
        for candidate, step in compiled[len(searched):]:
            search.record(candidate, step.nbytes)
        # Where DTR's plan reruns much of what a plan saving the values dearest to
        # recompute would keep (sorts): measured, and timed with the others if it fits.
        costly_candidate(search, chosen)
        fitting = timed(search.compiled)
        if not fitting:  # none can run beside the copy within the budget
            return untimed()
        seconds = median_step_seconds([step.executable for _, step in planning.compile(fitting, run=True)], inputs)
        # Within 2% of the fastest is a tie (timing noise): the smallest of those wins.
        ties = [i for i, s in enumerate(seconds) if s <= min(seconds) * (1 + TIE_TOLERANCE)]
        fastest = min(ties, key=lambda i: fitting[i].compiled_bytes)
        timings = tuple(
            Timing(plan.compiled_bytes, s, len(plan.segments), chosen=i == fastest, origin=plan.origin)
            for i, (plan, s) in enumerate(zip(fitting, seconds))
        )
        return dataclasses.replace(fitting[fastest], timings=timings)
    finally:
        # The lowered programs of the steps only measured were kept so that
        # autotuning compiles them to run without tracing them again; their
        # use ends with the plan.
        base.forget_lowerings()


def quick_plan(
    fun: Callable, args: tuple, kwargs: dict, budget_bytes: int, argnums, has_aux: bool, heuristic, attempts: int = 6,
    deadline: Optional[float] = None,
) -> Optional[Plan]:
    """The plan `make_plan` would make at `budget_bytes` (its search, within
    `attempts` compiles per scan strategy before its last resorts), else
    None: where none fits, no budget is searched for the error to suggest,
    and none is autotuned. For a caller with a plan of its own to fall back
    on (`jdtr.grad(..., chunks="whole")`). `deadline`: a `time.perf_counter()`
    after which the search compiles no plan but its first (`PlanSearch.run`)."""
    _, arguments = flatten_arguments(argnums, args, kwargs, eager=False)
    base = _planning_for(fun, argnums, has_aux, heuristic, "auto", on_planning_mesh(arguments))
    try:
        if base.unconstrained <= budget_bytes:
            return _without_remat(base, budget_bytes, heuristic, fun)
        return _search_levels(base, budget_bytes, heuristic, "auto", attempts, deadline)[0]
    finally:
        base.forget_lowerings()


_IN_THE_BODY = (
    "The step is written inside a shard_map. Its plans cut inside the body only as shard_maps of one "
    "equation each, whose gradients JAX makes with residuals of their own. A plan of each device's step "
    "may go further: call remat_grad inside the body, e.g. jax.shard_map(lambda w, x: jax.lax.pmean("
    "jdtr.remat_grad(local_loss, budget=...)(w, x), 'data'), ...)."
)


def _search_levels(
    base: Planning, target: float, heuristic, implementation: str, attempts: int, deadline: Optional[float] = None
) -> tuple[Optional[Plan], list[PlanSearch], list[Planning]]:
    """Kept scans: the strategies in turn, least recompute first, until one
    fits (none starts past `deadline`, but the first). The plan (None where
    none fits), the searches made (the last found it), and the strategies
    out of reach of `target` (their plans would each compile over it)."""
    searches: list[PlanSearch] = []
    unreached: list[Planning] = []
    for level, planning in enumerate(base.scan_levels()):
        if level and past(deadline):
            break
        if out_of_reach(planning, target):
            unreached.append(planning)
            continue
        searches.append(PlanSearch(planning, target, heuristic, implementation))
        chosen = searches[-1].run(attempts, deadline)
        if chosen is not None:
            return chosen, searches, unreached
    return None, searches, unreached


def _without_remat(planning: Planning, target: float, heuristic, fun: Callable) -> Plan:
    """The plan that recomputes nothing: `jax.grad`'s own step (no segments), of `fun` itself."""
    sim_peak = planning.vg.unconstrained_peak()
    simulated = run(planning.workload, max(sim_peak, 1), heuristic)
    return Plan(
        int(target),
        (),
        frozenset(planning.residuals),
        simulated,
        planning.forward,
        planning.config,
        compiled_bytes=planning.unconstrained,
        unconstrained_compiled_bytes=planning.unconstrained,
        predicted_bytes=planning.unconstrained,
        origin="none",
        function=fun,
    )


def step_of(plan: Plan, config: Config) -> Callable:
    """The planned gradient step as a function of the traced leaves (what is compiled)."""
    return lambda *traced: _grad_of(plan, config, traced)


def _grad_of(plan: Plan, config: Config, traced):
    positions = config.arguments.traced_argnums

    def f(*leaves):
        differentiated = [i in positions for i in range(len(leaves))]
        outs = run_segments(plan.program, plan.segments, leaves, config.implementation, plan.gate, plan.tied, differentiated)
        return (outs[0], outs[1:]) if config.has_aux else outs[0]

    return jax.grad(f, positions, has_aux=config.has_aux)(*traced)
