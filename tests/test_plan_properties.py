"""Property-based tests of the compiled path: random programs through `jdtr.plan` and `jdtr.remat_grad`.

The programs are `program_strategies.programs()`'s, every family (scans of
length 0, conds, custom derivative rules, integer and PRNG values, host
callbacks...). For each, at a random fraction of `jax.jit(jax.grad)`'s
compiled bytes:

* the plan's compiled step is within the budget (strict budgets), or the
  planner raises `OutOfBudgetError` with a budget it verified, and a plan at
  that budget fits;
* the planned value and gradients equal `jax.value_and_grad`'s, under
  `jax.jit` and called eagerly;
* `jax.jit(jdtr.remat_grad(...))` at the plan's budget gives `jax.grad`'s
  gradients (and aux).

Autotuning is off: it times plans, and the plans it picks from are these.
The "ci" hypothesis profile draws a few programs; `make fuzz` draws many.
"""

from __future__ import annotations

import os

import jax
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import jdtr

# (Its tolerance, rtol 1e-4: XLA fuses a planned step differently from `jax.grad`'s, sums in another order.)
from program_strategies import assert_trees_close as assert_close, is_usable, programs, reference

# Each program is several compiles (the plan search measures each plan it
# tries): the fixed "ci" slice is kept short.
EXAMPLES = {"ci": 10}.get(os.environ.get("JDTR_HYPOTHESIS_PROFILE", "ci"))


def plan_within_budget(fun, args, kwargs, program, ratio) -> jdtr.Plan:
    """The plan at `ratio`, or, where none fits, at the budget the error verified."""
    options = dict(argnums=program.argnums, has_aux=program.has_aux, autotune=False)
    try:
        plan = jdtr.plan(fun, *args, budget=ratio, **options, **kwargs)
    except jdtr.OutOfBudgetError as err:
        assert ratio < 1.0, err  # `jax.grad`'s own step fits a budget of 1.0
        assert err.suggested_budget_bytes is not None and err.suggested_budget_bytes > err.budget_bytes, err
        note(f"no plan fits {ratio}; the error suggests {err.suggested_budget_bytes} bytes")
        plan = jdtr.plan(fun, *args, budget=err.suggested_budget_bytes, **options, **kwargs)
    assert plan.compiled_bytes <= plan.budget_bytes, plan.report()
    return plan


# A plan that recomputes a convolution inside `lax.cond` is slow on the CPU, and says so
# (`SlowPlanWarning`); here only its values and bytes are checked.
@pytest.mark.filterwarnings("ignore::jdtr.SlowPlanWarning")
@settings(max_examples=EXAMPLES) if EXAMPLES else (lambda test: test)
@given(programs(max_ops=8), st.sampled_from([1.0, 0.8, 0.6, 0.4]))
def test_random_programs_planned_for_jit_match_jax(program, ratio):
    note(repr(program))
    fun, (args, kwargs) = program.loss(), program.arguments()
    expected = reference(program, args, kwargs)
    if not is_usable(expected):
        return  # (an overflowing program says nothing about jdtr)
    plan = plan_within_budget(fun, args, kwargs, program, ratio)
    note(plan.report())
    assert_close(jax.jit(plan.value_and_grad)(*args, **kwargs), expected)
    assert_close(plan.value_and_grad(*args, **kwargs), expected)
    remat = jdtr.remat_grad(fun, program.argnums, program.has_aux, budget=plan.budget_bytes, autotune=False)
    value, grads = expected  # (value, aux) with has_aux, as `jax.value_and_grad` gives them
    assert_close(jax.jit(remat)(*args, **kwargs), (grads, value[1]) if program.has_aux else grads)


@pytest.mark.parametrize("ratio", [0.9, 0.7])
def test_a_scan_of_length_0_in_a_protected_segment(ratio):
    """Regression (found by the property above): a protected segment's
    backward pass reads one element of its cotangents to gate the
    recomputation; a scan of length 0 stacks empty outputs, and the smallest
    cotangent, empty, was indexed (`IndexError: index is out of bounds for
    axis 0 with size 0` while planning)."""

    def loss(p, c0):
        def body(c, _):
            c = jax.numpy.tanh(c) + 0.5 * p
            return c, jax.numpy.sin(c)

        h, ys = jax.lax.scan(body, c0, None, length=0)
        for _ in range(6):
            h = jax.numpy.sin(h) * h + jax.numpy.tanh(h @ jax.numpy.ones((8, 8)))
        return jax.numpy.sum(h) + jax.numpy.sum(ys)

    p, c0 = jax.numpy.full((4, 8), 0.1), jax.numpy.linspace(0.0, 1.0, 32).reshape(4, 8)
    plan = jdtr.plan(loss, p, c0, argnums=(0, 1), budget=ratio, autotune=False)
    assert plan.segments and plan.compiled_bytes <= plan.budget_bytes, plan.report()
    assert_close(jax.jit(plan.grad)(p, c0), jax.grad(loss, argnums=(0, 1))(p, c0))
