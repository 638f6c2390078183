"""A planned step run as one XLA program: `jdtr.grad(..., chunks="whole")`,
and under `"auto"` where it ran faster than the chunks (`whole_choice.py`).

Compiled chunks keep the budget by cutting the run wherever the plan's count
of a chunk's memory would pass it, and every cut is a dispatch, arrays
written out that XLA would have fused, and a loss of XLA's own scheduling.
Near the budget the cuts come one or two computations apart: a VAE of 128-wide
layers at 0.7 of its peak ran as 25 chunks at 1.9x `jax.jit`'s step, a triplet
loss at 0.3 as 24 chunks at 2.0x (docs/benchmarks.md, "A planned step as one
XLA program"). The dispatches, not the recomputation, were most of that.

The compiled path plans the same step for `jax.jit` (`planning.make_plan`,
what `jdtr.remat_grad` runs; here its search without autotuning, and
without the budget an error would suggest, `planning.quick_plan`): DTR simulated on the forward program, its
decisions exported as `jax.checkpoint` segments, the plan kept only where
XLA's own analysis of the whole compiled step (`memory_analysis()`:
arguments, outputs and temporaries) fits the budget. That is the budget
`jdtr.grad` keeps too, in the same bytes: what the call holds, its arguments
and outputs included. So where such a plan fits the call's budget, the step
runs as that one program, and its bytes are XLA's, not a count; where none
fits, the run is the planned run in chunks, as with `chunks="always"`.

Only where nothing in the step depends on how a run is cut: one device (a
mesh's programs are placed chunk by chunk, `chunks.py`), no `cond` on data
(planned per path, `paths.py`), no effects (pinned, run once), no log or
timeline (they record the planned run's operators), not holomorphic, no
leaf of an aux value that is not an array.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp

from ..runtime import Heuristic
from .aux import array_leaves
from .compiled import executable_bytes
from .costs import NANOSECOND
from .planner import AUTO
from .planning import quick_plan
from .program import Equation, Program, Value

WHOLE = "whole"
# The compiled path's heuristic where the call's is the portfolio ("auto"):
# `jdtr.remat_grad`'s default.
COMPILED_PATH_HEURISTIC = "dtr_eq"


@dataclass(frozen=True)
class WholeStep:
    """The step compiled as one program, and what it holds by XLA's analysis.

    Attributes:
      executable: the compiled step: the call's traced leaves in, the
        traced value-and-grad's output leaves out.
      compiled_bytes: XLA's arguments + outputs + temporaries, less aliases.
      simulated: the DTR run its segments were read from (a `jdtr.SimResult`).
      segments: its top-level `jax.checkpoint` segments.
      planning_time_s: planning and compiling it took.
      code_bytes: XLA's generated code for it (0 where it reports none).
    """

    executable: Any
    compiled_bytes: int
    simulated: Any
    segments: int
    planning_time_s: float
    code_bytes: int = 0

    def __call__(self, inputs: Sequence[Any]) -> list:
        return jax.tree_util.tree_leaves(self.executable(*inputs))


def eligible(program: Program, device: Any, holomorphic: bool) -> bool:
    """Whether a call's step of `program` may run as one program: on one
    device, the backend's first (asked on every call; the rest once, by `whole_step`)."""
    return program.devices == 1 and device is None and not holomorphic


def may_be_whole(program: Program, aux: Any) -> bool:
    """No `cond` on data (it would be planned per path), no effects, and no
    leaf of the aux value (`aux.Aux`, or None) that is not an array
    (`jax.jit` returns arrays only)."""
    if aux is not None and aux.kept:
        return False
    return not any(type(item) is not Equation or item.effects for item in program.body)


def whole_step(
    program: Program,
    fun: Callable,
    argnums: Union[int, Sequence[int]],
    has_aux: bool,
    value: bool,
    heuristic: Union[str, Heuristic],
    arguments: Any,
    out_tree: Any,
    aux: Any,
    inputs: Sequence[Any],
    budget_bytes: int,
    within_s: Optional[float] = None,
) -> Optional[WholeStep]:
    """The compiled path's plan of `fun` (traced as `program`) at
    `budget_bytes`, compiled for `inputs` (the call's traced leaves,
    `arguments.unflatten` puts them in place), or None where the program
    has conds or effects or no plan fits the budget by XLA's analysis.
    `value`: whether the caller asked for the loss's value (`jdtr.value_and_grad`);
    `aux`: the traced aux value's structure (`aux.Aux`), or None;
    `within_s`: seconds after which the search starts nothing more (None: no limit)."""
    if not may_be_whole(program, aux):
        return None
    start = time.perf_counter()
    args, kwargs = arguments.unflatten(inputs)
    chosen = COMPILED_PATH_HEURISTIC if heuristic == AUTO else heuristic
    deadline = None if within_s is None else start + within_s
    plan = quick_plan(fun, args, kwargs, budget_bytes, argnums, has_aux, chosen, deadline=deadline)
    if plan is None:
        return None

    loss = program.outputs[0]  # (its place in the outputs: a value the caller did not ask for is a zero there)

    def step(*traced):
        a, k = arguments.unflatten(traced)
        if value:
            value_and_grads = plan.value_and_grad(*a, **k)
        else:  # `jax.grad`'s program: XLA's for `value_and_grad` held more and ran slower (a VAE: +14% bytes, +12% time)
            grads = plan.grad(*a, **k)
            zero = jnp.zeros(loss.shape, loss.dtype) if isinstance(loss, Value) else loss.value
            value_and_grads = ((zero, grads[1]), grads[0]) if has_aux else (zero, grads)
        if has_aux:  # (as the traced program returns it: the aux value's arrays, `aux.arrays_of_aux`)
            (v, extra), grads = value_and_grads
            value_and_grads = (v, array_leaves(jax.tree_util.tree_leaves(extra))), grads
        return value_and_grads

    lowered = jax.jit(step).lower(*inputs)
    if lowered.out_tree != out_tree:
        return None  # (outputs laid out otherwise than the traced program's: the planned run instead)
    executable = lowered.compile()
    nbytes = executable_bytes(executable)
    if nbytes > budget_bytes:
        return None
    code = int(getattr(executable.memory_analysis(), "generated_code_size_in_bytes", 0) or 0)
    return WholeStep(executable, nbytes, plan.simulated, len(plan.segments), time.perf_counter() - start, max(code, 0))


def report_of_whole(whole: WholeStep, pinned_bytes: int, wall_time_s: float, planning_time_s: float) -> dict[str, Any]:
    """The `jdtr.Stats` fields of a run as one program: its bytes by XLA's
    analysis, its recomputation by the simulation its segments came from."""
    sim = whole.simulated
    return dict(
        peak_bytes=whole.compiled_bytes,
        evictions=sim.evictions,
        dealloc_evictions=sim.dealloc_evictions,
        rematerializations=sim.rematerializations,
        pinned_bytes=pinned_bytes,
        base_cost=sim.baseline_cost * NANOSECOND,
        remat_cost=sim.remat_cost * NANOSECOND,
        overhead=sim.overhead,
        wall_time_s=wall_time_s,
        heuristic=sim.heuristic,
        timeline=None,
        chunks=1,
        planning_time_s=planning_time_s,
        execution=WHOLE,
        allocator_peak_bytes=None,
        slack_bytes=0,
    )


def run_whole(
    plan: Any, make: Callable[[], Optional[WholeStep]], inputs: Sequence[Any], check: Optional[Callable[[], None]], wait: bool,
    planning_time_s: float, equations: int,
) -> Optional[tuple[list, dict[str, Any]]]:
    """Runs `plan` (a `planner.PlannedRun`) as one program, made by `make()`
    on its first run (the time it takes counts as the plan's planning), and
    returns the outputs and the `Stats` fields; None where no such program
    fits (then it is not tried again for this plan)."""
    if plan.whole is None:
        start = time.perf_counter()
        plan.whole = make() or False
        elapsed = time.perf_counter() - start
        plan.planning_time_s += elapsed
        planning_time_s += elapsed
    if not plan.whole:
        return None
    start = time.perf_counter()
    outputs = plan.whole(inputs)
    if wait or check is not None:  # (else it returns once dispatched, as `jax.jit` does)
        jax.block_until_ready(outputs)
    if check is not None:  # debug=True: what is live after it (its temporaries are XLA's own)
        check()
    report = report_of_whole(plan.whole, plan.counters.pinned_bytes, time.perf_counter() - start, planning_time_s)
    report.update(scans=plan.scans, equations=equations)
    return outputs, report
