"""`jdtr.grad` and `jdtr.value_and_grad`: JAX's gradients under a byte budget.

Tracing (`tracing.py`): the value-and-grad of the user's function is traced
once per argument structure (treedef, shapes, dtypes, static values) and
normalised to a `Program`; later calls with the same structure reuse it, so
a dynamic model re-traces only when its structure changes. A scan of 4 or
more iterations stays one operation, under the scan strategy whose plan
computes least (`scan_variants.py`).

Planning: DTR is simulated on the traced program under the budget before
any device work (`planner.py`; a portfolio of heuristics by default), and
the decisions, a straight line of computations and frees, are cached per
structure and budget. A call runs them step by step and, once those runs
took as long as compiling is expected to (`rental.py`), as compiled chunks
(`chunks.py`): one XLA program per run of steps, within the budget by XLA's
own memory analysis.

A `cond` on data is planned per path (`paths.py`): the plan reads each
predicate where its `cond` starts and, where a branch is not the one it
went by, the run follows the plan of the path read so far.

Running online (`mode="online"`, and where no plan can be made before the run:
costs still to be measured, which the first call of a structure then measures
for the plans of the next): a fresh DTR runtime per call executes the program
eagerly on the device, deciding as it goes, the paper's algorithm. Either way,
every byte the run holds (outputs too) stays within the budget.

Logging: `log=path`, and `jdtr.trace`, write down what the program asks of
the runtime as an operator log in the DTR prototype's format, which
`jdtr.simulate` replays to the same decisions.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import jax

from ..budget import Budget, BudgetLike, parse_budget
from ..runtime import (
    DEFAULT_HEURISTIC,
    DEALLOC_POLICIES,
    HEURISTICS,
    Counters,
    Heuristic,
    OutOfBudgetError,
    Runtime,
    ThrashWarning,
    Timeline,
    get_heuristic,
)
from ..offline import run
from ..stats import Stats
from ..oplog import Trace, TraceRecorder
from . import _jax_core
from .costs import MEASURED, CostModel, MeasuredCosts, check_cost_model
from .arguments import argnums_tuple, flatten_arguments, run_inputs
from .executor import Execution, chunks_for, compiles, renting, run_device, serial_dispatch
from .allocator import AllocatorGuard, allocator_bytes
from .interpreter import Interpreter, JaxBackend, LiveArrayCheck
from .int_inputs import IntInputs
from .lowering import recording, simulation
from .caches import Traced, trace_cache
from .scan_variants import first_plan
from .tracing import trace_value_and_grad
from .paths import run_by_paths
from .planner import AUTO, THRASH_OVERHEAD, branching, observe, plannable, verified_budget
from .slack import chunk_seconds, settle
from .reporting import report_of
from .whole_choice import chunks_ran, one_program, open_trial
from .whole_step import WHOLE, eligible, may_be_whole, whole_step

MODES = ("planned", "online")
CHUNK_POLICIES = ("auto", "always", "never", WHOLE)
SCAN_POLICIES = ("keep", "unroll")
# `debug=True` sums `jax.live_arrays()`, which holds every thread's arrays:
# debug calls run one at a time, so that it holds one call's (calls without
# debug beside them still count: the docs say so).
_DEBUG_LOCK = threading.Lock()


@dataclass(eq=False, repr=False)
class _ValueAndGrad:
    """The callable `jdtr.value_and_grad` returns (its options as `_make` checked them)."""

    fun: Callable
    argnums: Union[int, Sequence[int]]
    has_aux: bool
    budget: Budget
    heuristic: Union[str, Heuristic]
    dealloc: str
    cost_model: CostModel
    return_stats: bool
    debug: bool
    timeline: bool
    value: bool
    log: "Optional[str | os.PathLike[str]]" = None
    mode: str = "planned"
    chunks: str = "auto"
    holomorphic: bool = False
    scans: str = "keep"

    def __post_init__(self) -> None:
        self.argnum_tuple = argnums_tuple(self.argnums)
        self.cache = trace_cache(self.fun, self.argnum_tuple, self.has_aux, self.cost_model, self.holomorphic, self.scans)
        self.cache_hits = 0
        self.cache_misses = 0
        functools.update_wrapper(self, self.fun)

    # ---------------------------------------------------------------- running

    def __call__(self, *args, **kwargs):
        leaves, arguments = flatten_arguments(self.argnums, args, kwargs, eager=True)
        # Arrays on a mesh with Explicit axes carry their shardings in their
        # types: tracing, XLA's analyses and every dispatch need that mesh set.
        with _jax_core.mesh_context(_jax_core.explicit_mesh(leaves) if arguments.meshed else None):
            return self._call(leaves, arguments)

    def _call(self, leaves: list, arguments):
        traced, inputs, owned, cache_hit = self._prepare(leaves, arguments)
        try:
            outputs, stats, log = self._run(traced, inputs, owned, cache_hit, lambda: run_inputs(leaves, arguments)[0])
        except OutOfBudgetError as err:
            if self.budget.nbytes == 1:
                err.add_note("budget=1 is one byte (an int is bytes): did you mean budget=1.0, the whole peak?")
            if traced.program.devices > 1:
                err.add_note(
                    f"The arguments are sharded over {traced.program.devices} devices: every byte count here is "
                    "per device (of the device that holds most), and so is the budget."
                )
            raise
        if log is not None:
            log.to_log(self.log)
        value_and_grads = jax.tree_util.tree_unflatten(traced.out_tree, outputs)
        if traced.aux is not None:
            (value, arrays), grads = value_and_grads
            value_and_grads = (value, traced.aux.rebuild(arrays)), grads
        result = self._shape_result(value_and_grads)
        return (result, stats) if self.return_stats else result

    def record(self, args: tuple, kwargs: dict) -> Trace:
        """The log of the program run in simulation, with no budget (`jdtr.trace`)."""
        leaves, arguments = flatten_arguments(self.argnums, args, kwargs, eager=True)
        with _jax_core.mesh_context(_jax_core.explicit_mesh(leaves)):
            traced, _, owned, _ = self._prepare(leaves, arguments)
        recorder = TraceRecorder()
        # The caller's arrays are not the run's to free, here as in a real run.
        run(recording(simulation(traced.online_program(), owned), recorder), math.inf, "dtr_eq", overhead_limit=None)
        return recorder.trace()

    def _prepare(self, leaves: list, arguments):
        """The traced program for these arguments (from the cache if it can) and its input arrays."""
        traced = self.cache.get(arguments.key)
        cache_hit = traced is not None
        if traced is None:
            self.cache_misses += 1
            traced = trace_value_and_grad(
                self.fun, self.argnums, self.has_aux, self.holomorphic, self.cost_model, arguments, self.scans == "keep"
            )
            traced.arguments = arguments
            self.cache[arguments.key] = traced
        else:
            self.cache_hits += 1
        return (traced, *run_inputs(leaves, arguments), cache_hit)

    def _shape_result(self, value_and_grads):
        value, grads = value_and_grads
        if self.value:
            return value_and_grads
        return (grads, value[1]) if self.has_aux else grads

    def _run(self, traced: Traced, inputs: list, owned: list, cache_hit: bool, remake: Callable[[], list]):
        """Runs the program on `inputs` within the budget: returns the outputs,
        the `Stats` and, with `log=`, the operator log to write (`remake()`: the inputs made again)."""
        program = traced.program
        if self.cost_model == MEASURED and program.devices > 1 and jax.process_count() > 1:
            # Every process must run the same plan (their collectives meet), and timings differ.
            raise ValueError(
                'cost_model="measured" plans from times measured by this process, which differ between processes: '
                "across several processes use the default (deterministic) cost model or \"xla\""
            )
        budget_bytes = self.budget.resolve(traced.unconstrained_peak)
        planned = self.mode == "planned" and plannable(program)
        if planned and branching(program) and (self.timeline or self.log is not None):
            planned = False  # a run by paths is several simulations' parts: its events and log are the online run's
        run = functools.partial(self._planned, remake=remake) if planned else self._online
        held = program.held_bytes
        if held > budget_bytes and run == self._online:  # a plan says so itself, with a budget that fits
            raise self._verified(
                OutOfBudgetError(
                    needed_bytes=held,
                    free_bytes=budget_bytes,
                    pinned_bytes=held,
                    locked_bytes=0,
                    budget_bytes=budget_bytes,
                    op_name="arguments and constants",
                    source=None,
                ),
                traced,
                owned,
            )
        check = None
        with _DEBUG_LOCK if self.debug else contextlib.nullcontext():
            if self.debug:
                check = LiveArrayCheck(budget_bytes, [*inputs, *(a for _, a in program.consts)])
            try:
                outputs, report, log = run(traced, budget_bytes, inputs, owned, check)
            finally:
                if check is not None:
                    check.release()
        stats = Stats(
            **report,
            budget_bytes=budget_bytes,
            unconstrained_peak_bytes=traced.unconstrained_peak,
            trace_time_s=0.0 if cache_hit else traced.trace_time_s,
            cache_hit=cache_hit,
            dealloc=self.dealloc,
            live_peak_bytes=check.peak_bytes if check is not None else None,
            devices=program.devices,
        )
        return outputs, stats, log

    def _planned(self, traced: Traced, budget_bytes: int, inputs: list, owned: list, check, remake: Callable[[], list]):
        """Runs the cached plan for this budget (made first if there is none)."""
        program = traced.program
        chunks = "always" if self.chunks == WHOLE else self.chunks  # (where no whole step fits)
        options = (self.heuristic if isinstance(self.heuristic, str) else id(self.heuristic), self.dealloc, tuple(owned))
        guard = AllocatorGuard(traced.margins, (budget_bytes, *options), budget_bytes)
        while True:  # for the budget less what the device's allocator was seen to hold beyond the count (allocator.py)
            planned_for = guard.plan_budget
            key = (planned_for, *options)
            try:
                plan, planned_before = traced.plan(key, lambda: first_plan(traced, planned_for, self.heuristic, self.dealloc, owned))
                if planned_before or not guard.foresee(plan, inputs):  # (else: planned again, for the allocator)
                    break
            except OutOfBudgetError:
                if not guard.margin:
                    raise
                guard.exhausted()  # no plan fits within the margin: plan for the budget by count, once more
        program = plan.program or program
        if plan.path is not None and (self.timeline or self.log is not None):  # conds a kept scan hid (`_run`'s check)
            return self._online(traced, budget_bytes, inputs, owned, check)
        if guard.ran and not planned_before:
            plan.rent.runs = max(plan.rent.runs, 1)  # made for the margin runs taught: its structure ran, it may compile
        planning = 0.0 if planned_before else plan.planning_time_s
        known_ahead = plan.path is None and not planned_before  # said once per plan, before the run
        if known_ahead and plan.overhead > THRASH_OVERHEAD:  # (by paths: once the path is known)
            warnings.warn(ThrashWarning(plan.overhead, budget_bytes, plan.calm_budget_bytes, plan.heuristic), stacklevel=4)
        in_chunks = compiles(plan, chunks) if plan.path is None else None  # (by paths: decided per plan followed)
        chunked = bool(in_chunks) and plan.compiled is None  # its first run as chunks: settled for them first
        how = (self.fun, self.argnums, self.has_aux, self.value, self.heuristic)
        make = lambda within_s: whole_step(program, *how, traced.arguments, traced.out_tree, traced.aux, inputs, planned_for, within_s)  # noqa: E731
        device = run_device(program, inputs)
        may_whole = in_chunks and not (self.timeline or self.log is not None) and eligible(program, device, self.holomorphic)
        if may_whole and (self.chunks == WHOLE or plan.trial):  # as one program (`whole_choice.py`)
            ran = one_program(self.chunks, plan, make, inputs, check, self.return_stats, planning, program.num_equations)
            if ran is not None:
                return (*ran, None)
        if (planned_before and plan.remaining or chunked) and traced.claim(key):  # it came back, or is to be compiled
            before, settled = plan.planning_time_s, plan
            try:  # (with a log, the run stays the plan at the budget: `jdtr.simulate` replays it there)
                at = planned_for if chunked and self.log is None else None
                settled = settle(plan, program, owned, self.dealloc, at, chunk_seconds(inputs, self.cost_model) if at else 0.0)
            finally:  # on an error the plan before stays, and the next call tries again
                plan = traced.replan(key, settled)
            planning = plan.planning_time_s - before
        if self.timeline or self.log is not None:
            observe(plan, program, owned, self.dealloc, self.timeline, self.log is not None)
        execution = Execution(plan.line, inputs, owned, check, serial_dispatch(program), device)
        if plan.path is not None:  # a cond on data: by the path its predicates read
            start = time.perf_counter()
            try:
                went = run_by_paths(plan, program, owned, self.dealloc, execution, chunks, planned_for)
            except OutOfBudgetError as err:
                # The path read does not fit by the plan's heuristic (the first plan's: a plan that
                # goes on from another must decide as it did). The error stays cached with the path:
                # without this call's frames (they hold the caller's arrays).
                err.with_traceback(None)
                went = None
            if went is None:  # this call runs online, deciding as it goes, as before such programs were planned
                if any(mine and x.is_deleted() for x, mine in zip(inputs, owned)):
                    # The path run freed inputs jdtr made (from NumPy arrays or Python scalars) before
                    # its branch: made again from the caller's values (theirs are never freed).
                    inputs = [y if mine and x.is_deleted() else x for x, y, mine in zip(inputs, remake(), owned)]
                return self._online(traced, budget_bytes, inputs, owned, check)
            outputs = execution.outputs()
            jax.block_until_ready(outputs)
            wall = time.perf_counter() - start - went.planning_time_s
            plan, compiled, planning = went.plan, went.compiled, planning + went.planning_time_s
            if plan.overhead > THRASH_OVERHEAD and not plan.warned:  # said once per path
                plan.warned = True
                warnings.warn(ThrashWarning(plan.overhead, budget_bytes, plan.calm_budget_bytes, plan.heuristic), stacklevel=4)
        else:
            items, compiling = chunks_for(plan, program, chunks, planned_for, in_chunks, execution.device)
            planning += compiling
            compiled, rents = items is not None, items is None and renting(plan, chunks)  # (rents: rental.py)
            if compiled and self.chunks == "auto" and may_whole and plan.trial is None:  # (`whole_choice.py`)
                open_trial(plan, may_be_whole(program, traced.aux))
            timed = compiled and may_whole and plan.trial and plan.trial.timing
            execution.after = guard.watch(plan, "chunks" if compiled else "steps", inputs, program.held_bytes, check)
            # (It returns once dispatched, as jit does, unless something waits for the run's end.)
            wait = rents or timed or self.return_stats or check is not None or execution.after is not None
            outputs, wall = execution.run(items, wait)
            if rents:
                plan.rent.paid(wall)
            elif timed:
                chunks_ran(plan, wall)
        report = report_of(plan.counters, plan.heuristic, wall, self.timeline and plan.timeline, plan.baseline_cost)
        report.update(
            chunks=execution.dispatches, planning_time_s=planning, execution="chunks" if compiled else "steps", scans=plan.scans,
            equations=program.num_equations, allocator_peak_bytes=guard.learn(report["peak_bytes"]), slack_bytes=plan.slack,
        )
        return outputs, report, plan.log if self.log is not None else None

    def _online(self, traced: Traced, budget_bytes: int, inputs: list, owned: list, check):
        """Runs the program with DTR deciding as it goes (the paper's algorithm)."""
        program = traced.online_program()
        recorder = TraceRecorder() if self.log is not None else None
        counters = Counters()
        observers: list = [counters]
        timeline = Timeline() if self.timeline else None
        if timeline is not None:
            observers.append(timeline)
        measured = MeasuredCosts() if self.cost_model == MEASURED and self.mode == "planned" else None
        if measured is not None:
            observers.append(measured)
        runtime = Runtime(
            JaxBackend(measure=self.cost_model == MEASURED, after_compute=check, serial=serial_dispatch(program)),
            budget_bytes,
            heuristic=get_heuristic(DEFAULT_HEURISTIC if self.heuristic == AUTO else self.heuristic),
            dealloc=self.dealloc,
            observers=observers,
            device_bytes=allocator_bytes(inputs, program.held_bytes),
        )
        start = time.perf_counter()
        try:
            outputs = Interpreter(runtime, recorder=recorder).run(program, inputs, owned)
        except OutOfBudgetError as err:
            raise self._verified(err, traced, owned)
        finally:
            runtime.close()
        jax.block_until_ready(outputs)
        if measured is not None:  # later calls plan from what this run measured
            traced.measured(measured.cost_of)
        if counters.overhead > THRASH_OVERHEAD:  # known once it has run (a plan would know before, with a budget that avoids it)
            warnings.warn(ThrashWarning(counters.overhead, budget_bytes, None, runtime.heuristic.name), stacklevel=4)
        events = tuple(timeline.events) if timeline is not None else None
        report = report_of(counters, runtime.heuristic.name, time.perf_counter() - start, events)
        report.update(chunks=counters.computations, planning_time_s=0.0, execution="online", equations=program.num_equations)
        return outputs, report, recorder.trace() if recorder is not None else None

    def _verified(self, err: OutOfBudgetError, traced: Traced, owned: list) -> OutOfBudgetError:
        """`err`, from a run that decided as it went, with the least budget at
        which that run fits, verified in simulation, where it can be."""
        if err.suggested_budget_bytes is None:
            heuristic = DEFAULT_HEURISTIC if self.heuristic == AUTO else self.heuristic
            suggested = verified_budget(traced.online_program(), owned, self.dealloc, heuristic, err.budget_bytes)
            if suggested is not None:
                err.suggest(suggested)
        return err


def _make(
    fun, argnums, has_aux, budget, heuristic, dealloc, cost_model, return_stats, debug, timeline, value, log=None, mode="planned",
    chunks="auto", holomorphic=False, allow_int=False, scans="keep",
):
    if not callable(fun):
        raise TypeError(f"expected a callable to differentiate; got {fun!r}")
    if allow_int:  # integer leaves leave the differentiated arguments (`int_inputs.py`)
        options = (has_aux, budget, heuristic, dealloc, cost_model, return_stats, debug, timeline, value, log, mode, chunks)
        make = lambda f, nums: _make(f, nums, *options, holomorphic, False, scans)  # noqa: E731
        return IntInputs(fun, argnums, make(fun, argnums), make, value, has_aux, extra=return_stats)
    if dealloc not in DEALLOC_POLICIES:
        raise ValueError(f"unknown dealloc policy {dealloc!r}; expected one of {DEALLOC_POLICIES}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if chunks not in CHUNK_POLICIES:
        raise ValueError(f"unknown chunks policy {chunks!r}; expected one of {CHUNK_POLICIES}")
    if scans not in SCAN_POLICIES:
        raise ValueError(f"unknown scans policy {scans!r}; expected one of {SCAN_POLICIES}")
    if heuristic != AUTO and not isinstance(heuristic, Heuristic) and heuristic not in HEURISTICS:  # fails now
        raise ValueError(f"unknown heuristic {heuristic!r}; expected {AUTO!r} (the default), one of {sorted(HEURISTICS)} or a jdtr.runtime.Heuristic instance")
    return _ValueAndGrad(
        fun,
        argnums,
        has_aux,
        parse_budget(budget),
        heuristic,
        dealloc,
        check_cost_model(cost_model),
        return_stats,
        debug,
        timeline,
        value,
        None if log is None else os.fspath(log),
        mode,
        chunks,
        bool(holomorphic),
        scans,
    )


def value_and_grad(
    fun: Callable,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    budget: BudgetLike = None,
    heuristic: Union[str, Heuristic] = AUTO,
    dealloc: str = "eager",
    cost_model: CostModel = None,
    return_stats: bool = False,
    debug: bool = False,
    timeline: bool = False,
    log: "Optional[str | os.PathLike[str]]" = None,
    mode: str = "planned",
    chunks: str = "auto",
    scans: str = "keep",
) -> Callable:
    """Like `jax.value_and_grad`, run eagerly under a device-memory budget.

    Args:
      fun: the function to differentiate; it returns a scalar (and aux data
        when `has_aux`).
      argnums: which positional argument(s) to differentiate.
      has_aux: whether `fun` returns `(value, aux)`.
      holomorphic: as in `jax.grad`: `fun` is holomorphic in complex inputs.
      allow_int: as in `jax.grad`: integer and boolean leaves of the
        differentiated arguments get `float0` zeros as their gradient.
      budget: bytes (int), a size string ("512MiB", "2GB") or a fraction in
        (0, 1] of the computation's unconstrained peak (or a percentage of
        it, "50%"). It bounds every byte
        the run holds on the device: arguments, constants, intermediates and
        outputs. None means no constraint.
      heuristic: "auto" (the default) plans the run with a portfolio of
        heuristics and keeps the cheapest schedule that fits; a heuristic
        name (see `jdtr.HEURISTICS`) or a `jdtr.runtime.Heuristic` instance
        plans with that one alone. "lookahead" is h_DTR^eq with the distance
        to the next use (known from the traced program) in place of
        staleness; "dtr_eq" is the paper's. Online, "auto" is "lookahead".
      dealloc: "eager" (evict dead values), "banish" or "ignore" (App. C.5).
      cost_model: None for flops and bytes counted from shapes on a nominal
        roofline (deterministic), "xla" for XLA's cost analysis of each
        equation, "measured" to time every operator, or a callable
        `jdtr.OpInfo -> float`.
      return_stats: also return a `jdtr.Stats`.
      debug: check after every operator that the bytes of `jax.live_arrays()`
        the run holds stay within the budget (slow). Debug calls from several
        threads run one at a time; arrays that calls without debug make
        meanwhile are counted too.
      timeline: record residency events in `Stats.timeline`.
      log: a path: each call writes there the operator log of what the
        program asked of the runtime (the branches it took, costs as
        nanoseconds), in the DTR prototype's format; `jdtr.simulate` replays
        it to this run's decisions. A call that fails writes nothing. See
        `jdtr.trace`.
      mode: "planned" (the default) decides the whole run before it starts,
        by simulating DTR on the traced program, and caches the plan per
        argument structure and budget; "online" decides as it runs, one
        equation at a time (the paper's algorithm). A `cond` on data is
        planned per path of branches: each predicate is read where its
        `cond` starts, and a path not seen before is planned then (once).
        With `cost_model="measured"` the first call of a structure runs
        online, timing every operator, and later calls are planned from
        those times. `timeline=` or `log=` on a program with a `cond` run
        it online.
      chunks: how a plan runs: "auto" (one equation per dispatch until
        those runs have taken as long as compiling the plan's chunks is
        expected to, then compiled chunks, and once those took twice their
        compile, timed against the "whole" program, the faster kept:
        `transform/whole_choice.py`), "always" (compiled chunks at once),
        "never", or "whole": the step as one XLA program from its first run,
        the plan `jdtr.plan` makes at the same budget in bytes, where XLA's
        analysis of it fits (`transform/whole_step.py`); else as "always".
      scans: "keep" (the default): a planned run keeps a `lax.scan` of 4 or
        more iterations whole, one operation whose memory XLA's analysis
        gives, under the strategy of what its iterations keep (every
        residual; matmul outputs; the carry; the carry in 2 or 3 nested
        checkpointed levels) whose plan computes least; it unrolls the
        scan only where no strategy fits (`Stats.scans` says which).
        "unroll": every iteration's tensors are DTR's to decide on, as an
        online run always does.

    Returns:
      A function returning `(value, grads)` (or `((value, aux), grads)`),
      followed by `Stats` when `return_stats`.

    Raises:
      jdtr.OutOfBudgetError: the budget cannot hold what one operation needs.
        A planned run raises it before any device work, when no candidate
        fits, with a budget verified to fit (`suggested_budget_bytes`). A
        path of a `cond` on data whose plan does not fit is run online
        (from its start; the call raises it if that does not fit either).
        `jdtr.OverheadLimitError`, a subclass, where no candidate fits
        within overhead 4 (`planner.MAX_OVERHEAD`, where a plan's
        simulation is cut off) and one was still thrashing there; online
        runs have no such limit.

    Example:
      >>> import jax.numpy as jnp, jdtr
      >>> f = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
      >>> value, g = jdtr.value_and_grad(f, budget=0.5)(jnp.ones((4, 4)), jnp.ones((8, 4)))
    """
    return _make(
        fun, argnums, has_aux, budget, heuristic, dealloc, cost_model, return_stats, debug, timeline, True, log, mode, chunks,
        holomorphic, allow_int, scans,
    )


def grad(
    fun: Callable,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    budget: BudgetLike = None,
    heuristic: Union[str, Heuristic] = AUTO,
    dealloc: str = "eager",
    cost_model: CostModel = None,
    return_stats: bool = False,
    debug: bool = False,
    timeline: bool = False,
    log: "Optional[str | os.PathLike[str]]" = None,
    mode: str = "planned",
    chunks: str = "auto",
    scans: str = "keep",
) -> Callable:
    """Like `jax.grad`, run eagerly under a device-memory budget.

    Takes the arguments of `jdtr.value_and_grad` and returns only the
    gradients (and aux data when `has_aux`, as `(grads, aux)`).

    Example:
      >>> import jax.numpy as jnp, jdtr
      >>> f = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
      >>> g = jdtr.grad(f, budget="1MiB")(jnp.ones((4, 4)), jnp.ones((8, 4)))
    """
    return _make(
        fun, argnums, has_aux, budget, heuristic, dealloc, cost_model, return_stats, debug, timeline, False, log, mode, chunks,
        holomorphic, allow_int, scans,
    )


def trace(fun: Callable, *args: Any, argnums: Union[int, Sequence[int]] = 0, has_aux: bool = False, **kwargs: Any) -> Trace:
    """The operator log of `jax.value_and_grad(fun)(*args, **kwargs)` as jdtr runs it.

    The value-and-grad is traced and normalised as `jdtr.grad` does, then
    run once in simulation — on jdtr's runtime with no buffers and no budget,
    so nothing is computed on the device and a model too large for it can be
    traced — and what the program asks of the DTR runtime is written down in
    the DTR prototype's log format (paper App. C.6; see
    `jdtr.TraceRecorder`): a `CONSTANT` per argument and constant, a
    `CALL` per equation with sizes in bytes and `TIME` in nanoseconds of the
    default, deterministic cost model, a `RELEASE` at each value's last use;
    the outputs stay referenced. The log does not depend on a budget, so
    `jdtr.simulate(jdtr.trace(f, *args), b, h)` takes the decisions of
    `jdtr.grad(f, budget=b, heuristic=h, scans="unroll")(*args)` for a
    budget of `b` bytes: scans unrolled, as the online mode runs them (a
    planned run keeps them whole by default).

    Nothing runs, but each distinct operation is compiled once, to read the
    temporaries XLA needs for it (a `CALL` result named "workspace<n>"; the
    compilation a first `jdtr.grad` call would make): seconds for models of
    a thousand operations, where the simulation alone takes a fraction of one.

    A simulation cannot read a `cond`'s predicate: each `cond` contributes
    its branch with the largest unconstrained peak (the branch the budget
    fraction of `jdtr.grad` is measured on). `jdtr.grad(..., log=path)` writes
    the log of a real run instead, with the branches actually taken.

    Args:
      fun: the function `jdtr.grad` would differentiate.
      *args: its positional arguments.
      argnums: which positional argument(s) to differentiate.
      has_aux: whether `fun` returns `(value, aux)`.
      **kwargs: its keyword arguments.

    Returns:
      A `jdtr.Trace`.

    Example:
      >>> import jax.numpy as jnp, jdtr
      >>> f = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
      >>> log = jdtr.trace(f, jnp.ones((4, 4)), jnp.ones((8, 4)))
      >>> result = jdtr.simulate(log, 0.8)
      >>> result.status, result.rematerializations
      ('ok', 5)
    """
    return _make(fun, argnums, has_aux, None, "dtr_eq", "eager", None, False, False, False, True).record(args, kwargs)
