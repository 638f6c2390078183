"""jdtr.plan / remat_grad: DTR's decisions compiled as checkpoint segments.

Gradients must equal jax.grad (also under jit and vmap); XLA's compiled
memory (arguments + outputs + temporaries) must stay within the budget, or
planning raises with a budget that works; the policy must work with
jax.checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdtr
from jdtr import models

from jdtr.runtime import format_bytes
from jdtr.transform.program import Equation

from budgets import biting_plan, searched_plan
from host_devices import run_on_8_devices
from xla_premises import xla_strips_checkpoint_barriers

# How close two programs' compiled bytes count as alike (a plan's own
# bytes are checked against its budget strictly: it is measured).
ALIKE = 0.10


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def compiled_total(fn, *args, **jit_options):
    """XLA's argument + output + temporary bytes of `jax.jit(fn)` for `args` (what a plan's budget counts)."""
    return compiled_and_total(fn, *args, **jit_options)[1]


def compiled_and_total(fn, *args, **jit_options):
    """`jax.jit(fn)` compiled for `args`, with XLA's defaults (as a caller's jit), and its bytes."""
    compiled = jax.jit(fn, **jit_options).lower(*args).compile()
    a = compiled.memory_analysis()
    return compiled, a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes


MODELS = {
    "mlp": lambda: models.mlp_chain(layers=64, width=64, batch=1024),
    "transformer": lambda: models.transformer(blocks=4, dim=32, heads=2, seq=64, batch=8, vocab=64),
    "resnet": lambda: models.resnet(blocks=1, channels=4, image=8, batch=4),
    "rnn": lambda: models.rnn(steps=8, hidden=16, features=4, batch=32),
}


@functools.lru_cache(maxsize=None)
def model(name):
    return MODELS[name]()


# Autotuning (the default) compiles and times several plans; it has its own
# tests, and the others check the cost model's plan, which it starts from.
@functools.lru_cache(maxsize=None)
def plan_of(name, ratio, implementation="auto", autotune=False):
    m = model(name)
    return jdtr.plan(m.loss, m.params, m.batch, budget=ratio, implementation=implementation, autotune=autotune)


# The test ResNet is tiny (42 KiB compiled): arguments and XLA's fixed
# buffers leave no plan without conds below 0.85 of it on JAX 0.10 (0.91
# before the gate "anchored"), so it is checked at 0.95 (or at the budget
# the planner verified, where that fits no plan on another JAX).
@pytest.mark.parametrize("name,ratio", [("resnet", 0.95), ("rnn", 0.5), ("transformer", 0.5)])
def test_remat_grad_matches_jax_grad_under_jit(name, ratio):
    m = model(name)
    plan = biting_plan(m.loss, m.params, m.batch, fraction=ratio, autotune=False)
    step, nbytes = compiled_and_total(jdtr.remat_grad(m.loss, budget=plan.budget_bytes, autotune=False), m.params, m.batch)
    # Measured by the planner with LLVM's optimizations off (on the CPU), its bytes are the caller's jit's.
    assert nbytes == plan.compiled_bytes <= plan.budget_bytes
    reference, unconstrained = compiled_and_total(jax.grad(m.loss), m.params, m.batch)
    assert unconstrained == plan.unconstrained_compiled_bytes
    assert_trees_close(step(m.params, m.batch), reference(m.params, m.batch), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["mlp", "transformer"])
@pytest.mark.parametrize("ratio", [0.7, 0.5, 0.35])
def test_compiled_memory_within_budget(name, ratio):
    m = model(name)
    plan = plan_of(name, ratio)
    assert plan.budget_bytes == int(ratio * plan.unconstrained_compiled_bytes)
    assert plan.compiled_bytes <= plan.budget_bytes, plan.report()
    assert plan.compiled_bytes < plan.unconstrained_compiled_bytes
    assert len(plan.segments) > 1
    step, nbytes = compiled_and_total(plan.grad, m.params, m.batch)
    assert nbytes == plan.compiled_bytes  # (measured by the planner without LLVM's optimizations on the CPU)
    assert_trees_close(step(m.params, m.batch), jax.jit(jax.grad(m.loss))(m.params, m.batch), rtol=1e-4, atol=1e-6)


def test_nested_segments_where_no_flat_plan_fits():
    """At a quarter of the compiled step, no flat segmentation of the MLP fits
    (its saved boundaries alone exceed the budget); nested checkpoints keep
    only a group's inputs for the whole step, as DTR recomputes recursively."""
    m = model("mlp")
    plan = plan_of("mlp", 0.25)
    assert max(segment.depth for segment in plan.segments) > 1, plan.report()
    assert plan.compiled_bytes <= plan.budget_bytes, plan.report()
    flat_peak = plan_of("mlp", 0.5).compiled_bytes
    assert plan.compiled_bytes < 0.75 * flat_peak
    assert "nested segments" in plan.report()
    got = jax.jit(plan.grad)(m.params, m.batch)
    assert_trees_close(got, jax.jit(jax.grad(m.loss))(m.params, m.batch), rtol=1e-4, atol=1e-6)


def test_where_no_plan_fits_the_error_suggests_a_budget_a_call_at_runs():
    """The budget is strict: where no plan's compiled step fits (the MLP at a
    sixth of its step, here), `jdtr.plan` raises before returning a step
    over it, with the smallest plan's bytes as `suggested_budget_bytes`;
    planning again at that budget finds a plan within it, with `jax.grad`'s
    gradients."""
    m = model("mlp")
    loss = lambda p, x: m.loss(p, x)  # noqa: E731 - a function of its own: its plans are this test's
    with pytest.raises(jdtr.OutOfBudgetError) as caught:
        jdtr.plan(loss, m.params, m.batch, budget=1 / 6, autotune=False)
    err = caught.value
    suggested = err.suggested_budget_bytes
    full = jdtr.plan(loss, m.params, m.batch, budget=1.0, autotune=False).compiled_bytes
    assert full / 6 < suggested < full, (suggested, full)
    assert f"A budget of {format_bytes(suggested)} ({suggested} bytes) fits" in str(err)
    plan = jdtr.plan(loss, m.params, m.batch, budget=suggested, autotune=False)
    assert plan.compiled_bytes <= suggested == plan.budget_bytes, plan.report()
    assert_trees_close(jax.jit(plan.grad)(m.params, m.batch), jax.grad(m.loss)(m.params, m.batch), rtol=1e-4, atol=1e-6)


def test_nested_segments_carry_integer_values():
    """The transformer's nested segments pass integer values (the labels'
    one-hot indices) between levels: explicit inputs, not closed over, since
    an inner segment's backward is traced after its parent's trace ends."""
    m = model("transformer")
    plan = biting_plan(m.loss, m.params, m.batch, fraction=0.3, autotune=False)
    assert max(segment.depth for segment in plan.segments) > 1, plan.report()
    inner = [v for s in plan.segments for c in s.children for v in c.inputs]
    assert any(not jnp.issubdtype(v.dtype, jnp.inexact) for v in inner)
    assert plan.compiled_bytes <= plan.budget_bytes, plan.report()
    got = jax.jit(plan.grad)(m.params, m.batch)
    assert_trees_close(got, jax.jit(jax.grad(m.loss))(m.params, m.batch), rtol=1e-4, atol=1e-6)
    # The same segments as plain nested jax.checkpoint (what a GPU runs).
    config = dataclasses.replace(plan._config, implementation="checkpoint")
    checkpointed = dataclasses.replace(plan, _config=config)
    assert_trees_close(jax.jit(checkpointed.grad)(m.params, m.batch), got, rtol=1e-4, atol=1e-6)


def test_a_budget_no_plan_fits_raises_instead_of_exceeding():
    """Below what any plan needs (here 5% of the compiled step: less than the
    parameters and their gradients), `plan` and `remat_grad` raise a clean
    OutOfBudgetError naming the need, rather than return an oversized step."""
    m = model("mlp")
    with pytest.raises(jdtr.OutOfBudgetError, match="arguments and gradients alone take") as info:
        jdtr.plan(m.loss, m.params, m.batch, budget=0.05)
    err = info.value
    assert err.pinned_bytes > err.budget_bytes  # arguments + gradients alone exceed it
    leaves = jax.tree_util.tree_leaves((m.params, m.batch))
    assert err.pinned_bytes >= sum(x.nbytes for x in leaves)
    with pytest.raises(jdtr.OutOfBudgetError):
        jax.jit(jdtr.remat_grad(m.loss, budget=0.05))(m.params, m.batch)
    # It says which budget works: the smallest plan found, which a plan at that budget fits.
    works = err.suggested_budget_bytes
    assert works is not None and str(works) in str(err) and works > err.budget_bytes
    plan = jdtr.plan(m.loss, m.params, m.batch, budget=works, autotune=False)
    assert plan.compiled_bytes <= works


@pytest.mark.parametrize("budget", [1.0, "4MiB"])
def test_a_budget_jax_grad_fits_never_raises(budget):
    """`jax.jit(jax.grad)` itself is a plan within any budget of at least its
    compiled bytes (1.0 means them exactly): it is the plan, whatever
    recomputation would cost around it (a 2-layer MLP, where every
    checkpointed plan compiles to more than no remat)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(keys[0], (32, 32)), "w2": jax.random.normal(keys[1], (32, 32))}
    x = jax.random.normal(keys[2], (64, 32))

    def loss(p, x):
        return jnp.sum(jnp.tanh(jnp.tanh(x @ p["w1"]) @ p["w2"]) ** 2)

    plan = jdtr.plan(loss, params, x, budget=budget)
    assert plan.origin == "none" and plan.segments == () and "no remat" in plan.report()
    assert plan.compiled_bytes == compiled_total(jax.grad(loss), params, x) <= plan.budget_bytes
    assert compiled_total(plan.grad, params, x) <= plan.budget_bytes
    got = jax.jit(jdtr.remat_grad(loss, budget=budget))(params, x)
    assert_trees_close(got, jax.jit(jax.grad(loss))(params, x), rtol=1e-4, atol=1e-5)


def test_compiled_bytes_are_xla_numbers_for_what_the_user_compiles():
    m = model("mlp")
    plan = plan_of("mlp", 0.5)
    assert compiled_total(plan.grad, m.params, m.batch) == plan.compiled_bytes


def tanh_chain(layers):
    """A loss of `layers` tanh layers sharing one weight matrix."""

    def loss(w, x):
        h = x
        for _ in range(layers):
            h = jnp.tanh(h @ w)
        return jnp.sum(h**2)

    return loss


def test_remat_grad_under_vmap():
    loss = tanh_chain(12)
    # Activations (64 KiB each) dominate the step, so a plan fits 0.6 of it.
    w = jax.random.normal(jax.random.PRNGKey(0), (64, 64)) / 8
    xs = jax.random.normal(jax.random.PRNGKey(1), (5, 256, 64))
    got = jax.vmap(jdtr.remat_grad(loss, argnums=1, budget=0.6), in_axes=(None, 0))(w, xs)
    ref = jax.vmap(jax.grad(loss, argnums=1), in_axes=(None, 0))(w, xs)
    assert_trees_close(got, ref, rtol=1e-5, atol=1e-6)



def steps_on_a_clock(**seconds):
    """Stand-ins for compiled steps that take the given seconds on a clock of
    their own (so that timings do not depend on the machine's load), the
    clock, and the count of each one's calls. A pair of seconds is a step's
    first run, then every later one."""
    now = [0.0]
    calls = dict.fromkeys(seconds, 0)

    def step(name):
        first, later = seconds[name] if isinstance(seconds[name], tuple) else (seconds[name],) * 2

        def run(x):
            calls[name] += 1
            now[0] += first if calls[name] == 1 else later
            return x

        return run

    return [step(name) for name in seconds], (lambda: now[0]), calls


def test_autotuning_runs_a_step_far_slower_than_the_fastest_twice():
    """A candidate whose warm-up run, and a second run, take `SLOW_WARMUP`
    times the fastest warm-up is not run again (a convolution's gradient
    under a `cond` on the CPU took 33 s of a ResNet's 54 s of planning); the
    others are timed `repeats` times more, interleaved."""
    from jdtr.transform.autotune import SLOW_WARMUP, median_step_seconds

    fast, slow = 0.002, 0.002 * SLOW_WARMUP * 25
    steps, clock, calls = steps_on_a_clock(fast=fast, slow=slow)
    times = median_step_seconds(steps, [jnp.zeros(())], repeats=3, clock=clock)
    assert calls == {"fast": 4, "slow": 2}
    assert times == pytest.approx([fast, slow])


def test_autotuning_times_a_new_step_whose_first_run_is_slow_beside_one_run_before():
    """An executable's first run pays a one-time cost that a candidate run
    before (planning the same step at another budget) paid already: the new
    one, slow only in its first run, is timed as the others and can win."""
    from jdtr.transform.autotune import SLOW_WARMUP, median_step_seconds

    warm, cold = 0.006, (0.006 * SLOW_WARMUP * 12, 0.005)
    steps, clock, calls = steps_on_a_clock(warm=warm, cold=cold)
    times = median_step_seconds(steps, [jnp.zeros(())], repeats=3, clock=clock)
    assert calls == {"warm": 4, "cold": 5}
    assert times == pytest.approx([warm, 0.005])


def test_autotuning_stops_timing_a_step_slower_than_the_fastest_in_two_runs():
    """Successive halving: a candidate whose warm-up and first timed run both
    take `SLOW_FIRST_ROUND` times the fastest first run (but less than
    `SLOW_WARMUP` times) is not timed again; one as fast as the fastest is
    timed every round."""
    from jdtr.transform.autotune import SLOW_FIRST_ROUND, SLOW_WARMUP, median_step_seconds

    fast = 0.01
    slower = fast * (SLOW_FIRST_ROUND + SLOW_WARMUP) / 2
    steps, clock, calls = steps_on_a_clock(fast=fast, twin=fast, slower=slower)
    times = median_step_seconds(steps, [jnp.zeros(())], repeats=3, clock=clock)
    assert calls == {"fast": 4, "twin": 4, "slower": 2}
    assert times == pytest.approx([fast, fast, slower])


def test_autotune_keeps_the_fastest_plan_within_the_budget():
    """By default, planning times DTR's plans for this and smaller budgets and
    keeps the fastest (ties within 2% go to the smaller); all fit the budget.
    autotune=False keeps the cost model's plan, one of those timed."""
    loss = tanh_chain(16)
    w = jax.random.normal(jax.random.PRNGKey(0), (64, 64)) / 8
    x = jax.random.normal(jax.random.PRNGKey(1), (512, 64))
    plan = jdtr.plan(loss, w, x, budget=0.7)
    assert len(plan.timings) >= 2, plan.report()
    untuned = jdtr.plan(loss, w, x, budget=0.7, autotune=False)
    assert untuned.timings == () and "autotuned" not in untuned.report()
    assert untuned.compiled_bytes in [t.compiled_bytes for t in plan.timings]
    (chosen,) = [t for t in plan.timings if t.chosen]
    fastest = min(t.seconds for t in plan.timings)
    ties = [t for t in plan.timings if t.seconds <= fastest * 1.02]
    assert chosen.compiled_bytes == min(t.compiled_bytes for t in ties)
    assert plan.compiled_bytes == chosen.compiled_bytes
    assert all(t.compiled_bytes <= plan.budget_bytes for t in plan.timings)
    assert "autotuned: fastest of" in plan.report()
    assert_trees_close(jax.jit(plan.grad)(w, x), jax.grad(loss)(w, x), rtol=1e-4, atol=1e-5)
    tuned = jax.jit(jdtr.remat_grad(loss, budget=0.7))
    assert_trees_close(tuned(w, x), jax.grad(loss)(w, x), rtol=1e-4, atol=1e-5)


def test_autotuning_compiles_no_nest_that_reruns_more_than_the_uniform_plan():
    """Autotuning's ladder of DTR's plans for smaller budgets stops, where
    the uniform plan is timed, at its first plan of nested segments that
    reruns more than the uniform plan (cost model): such nests ran slower
    than it on every model measured. Here the ladder's lower rungs are such
    nests: none is proposed, the rungs above them and the uniform plan are."""
    from jdtr.transform import planning as cpn
    from jdtr.transform.checkpoint_plan import layout
    from jdtr.transform.plan_search import model_target
    from jdtr.transform.segments import recompute_cost
    from jdtr.transform.simulated_plans import autotune_candidates, search_simulated_budget, uniform_plan

    loss = tanh_chain(32)
    w = jax.random.normal(jax.random.PRNGKey(0), (64, 64)) / 8
    x = jax.random.normal(jax.random.PRNGKey(1), (1024, 64))
    base = jdtr.plan(loss, w, x, budget=0.7, autotune=False)
    (entries,) = [e for f, e in cpn.planning_cache.items() if f is loss]
    (planning,) = entries.values()
    target, peak = model_target(planning, base.budget_bytes), planning.vg.unconstrained_peak()
    uniform = uniform_plan(planning, base)
    assert uniform.predicted_bytes <= target
    reruns = lambda plan: recompute_cost(planning.forward, plan.segments)  # noqa: E731
    nested = lambda plan: any(seg.children for seg in plan.segments)  # noqa: E731

    ladder = [search_simulated_budget(planning, peak, target * s, "dtr_eq", steps=6) for s in cpn.AUTOTUNE_SCALES]
    ladder = [p for p in ladder if p is not None and layout(p) != layout(base)]
    first = next(i for i, p in enumerate(ladder) if nested(p) and reruns(p) > reruns(uniform))
    proposed = list(autotune_candidates(planning, peak, target, target, "dtr_eq", cpn.AUTOTUNE_SCALES, base, {layout(base)}))
    assert proposed[-1].origin == "uniform"
    kept = list(dict.fromkeys(layout(p) for p in ladder[:first]))
    assert [layout(p) for p in proposed[:-1]] == kept
    assert all(not nested(p) or reruns(p) <= reruns(uniform) for p in proposed)
    # Where the uniform plan would not be timed (under `jax.jit`, beside the
    # example inputs), the nests are proposed: they may be the fastest timed.
    beside = uniform.predicted_bytes - 1
    proposed = list(autotune_candidates(planning, peak, target, beside, "dtr_eq", cpn.AUTOTUNE_SCALES, base, {layout(base)}))
    assert [layout(p) for p in proposed[:-1]] == list(dict.fromkeys(layout(p) for p in ladder))

    tuned = jdtr.plan(loss, w, x, budget=0.7)  # (the same planning, from the cache)
    timed = {key for key, step in planning.steps.items() if step.executable is not None}  # (compiled to run)
    assert layout(uniform) in timed and not timed & {layout(p) for p in ladder[first:]}
    assert tuned.compiled_bytes <= tuned.budget_bytes
    assert_trees_close(jax.jit(tuned.grad)(w, x), jax.grad(loss)(w, x), rtol=1e-3, atol=1e-3)  # (sums of 1024 rows)


def test_autotune_runs_no_copy_of_the_arguments_beside_the_budget(monkeypatch):
    """Found on an H100: autotuning timed its candidates on example inputs
    made beside the caller's arrays, so the device held a candidate within
    the budget plus a second copy of the arguments (8% over the budget). It
    now times the caller's own arrays; under `jax.jit`, where they are
    abstract, only candidates that fit beside the copy are timed."""
    from jdtr.transform import planning as cpn

    loss = tanh_chain(16)
    w = jax.random.normal(jax.random.PRNGKey(0), (64, 64)) / 8
    x = jax.random.normal(jax.random.PRNGKey(1), (512, 64))
    timed_on = []
    real_median, real_examples = cpn.median_step_seconds, cpn.example_inputs
    monkeypatch.setattr(cpn, "median_step_seconds", lambda exes, inputs: timed_on.append(inputs) or real_median(exes, inputs))
    monkeypatch.setattr(cpn, "example_inputs", lambda structs: pytest.fail("example inputs beside the caller's arrays"))
    plan = jdtr.plan(loss, w, x, budget=0.7)
    assert len(plan.timings) >= 2
    assert len(timed_on) == 1 and timed_on[0][0] is w and timed_on[0][1] is x

    # At 0.5 the candidates fit the budget, but not beside a copy of the arguments.
    copy = w.nbytes + x.nbytes
    budget = 0.5
    concrete = jdtr.plan(loss, w, x, budget=budget)
    assert len(concrete.timings) >= 1
    # (The cost model's own plan is within the budget: where a smaller target
    # gave a plan measured before, the search asks for less still,
    # `plan_search.MAX_REPEATS`; it had stopped at 1.03x.)
    untuned = jdtr.plan(loss, w, x, budget=budget, autotune=False)
    assert untuned.compiled_bytes <= untuned.budget_bytes
    assert all(t.compiled_bytes + copy > concrete.budget_bytes for t in concrete.timings)

    monkeypatch.setattr(cpn, "example_inputs", real_examples)
    plans = []

    @jax.jit
    def step(w, x):
        plans.append(jdtr.plan(loss, w, x, budget=budget))
        return plans[-1].grad(w, x)

    assert_trees_close(step(w, x), jax.grad(loss)(w, x), rtol=1e-4, atol=1e-5)
    (traced,) = plans
    assert all(t.compiled_bytes + copy <= max(traced.budget_bytes, traced.compiled_bytes) for t in traced.timings)
    assert len(traced.timings) < len(concrete.timings)  # the copy ruled some out


def test_under_jit_where_no_candidate_runs_beside_the_copy_the_least_recompute_is_kept():
    """Under `jax.jit` the candidates are timed on example inputs, a copy of
    the arguments beside the step, and only those that fit the budget with
    the copy. Where none did, the search's own plan was kept: the first to
    fit at the budget, which after an eager plan of the same step (which
    measured flatter plans) was one segment nested four deep, its forward
    recomputed at each level (2.9x `jax.jit(jax.grad)`'s step where the
    flattest of the same bytes ran at 1.6x). Now the plan that recomputes
    least by the cost model among those measured within the budget, as
    where autotuning is off."""
    from jdtr.transform.costly import rerun_cost

    d = 64
    ps = {"w": [jax.random.normal(jax.random.PRNGKey(i), (d, d)) / 8 for i in range(2)], "b": [jnp.zeros(d), jnp.ones(d)]}
    x = jax.random.normal(jax.random.PRNGKey(9), (256, d))

    def loss(ps, x):
        for w, b in zip(ps["w"], ps["b"]):
            for _ in range(3):
                x = jax.nn.gelu(x @ w + b)
        return jnp.mean(x**2)

    budget = 0.5
    eager = jdtr.plan(loss, ps, x, budget=budget)
    remat = jdtr.remat_grad(loss, budget=budget)
    assert_trees_close(jax.jit(remat)(ps, x), jax.grad(loss)(ps, x), rtol=1e-4, atol=1e-5)
    (traced,) = remat.plans.values()
    untuned = jdtr.plan(loss, ps, x, budget=budget, autotune=False)
    copy = sum(a.nbytes for a in jax.tree.leaves((ps, x)))
    assert traced.timings == () and traced.compiled_bytes + copy > traced.budget_bytes, traced.report()
    assert traced.compiled_bytes <= traced.budget_bytes == untuned.budget_bytes
    cost = lambda plan: rerun_cost(plan.program, plan.segments)  # noqa: E731
    assert cost(traced) <= min(cost(eager), cost(untuned)), (cost(traced), cost(eager), cost(untuned))


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_autotune_under_jit_makes_typed_keys_of_their_own_implementation(impl, monkeypatch):
    """Under `jax.jit` a typed key argument (dropout's) is abstract, and
    autotuning, which times its candidates on example inputs there, made
    none for it: it was skipped, and the plan chosen by memory alone. It
    now makes keys of zero bits of the key's implementation, and times the
    candidates; the step's gradients are `jax.grad`'s."""
    from jdtr.transform import planning as cpn

    made = []
    real_examples = cpn.example_inputs
    monkeypatch.setattr(cpn, "example_inputs", lambda structs: made.append(real_examples(structs)) or made[-1])
    w = [jax.random.normal(jax.random.PRNGKey(i), (64, 64)) / 8 for i in range(8)]
    x = jax.random.normal(jax.random.PRNGKey(9), (2048, 64))  # (activations, not arguments, dominate)
    key = jax.random.key(3, impl=impl)

    def loss(w, x, key):
        for i, wi in enumerate(w):
            x = jnp.tanh(x @ wi)
            x = jnp.where(jax.random.bernoulli(jax.random.fold_in(key, i), 0.9, x.shape), x / 0.9, 0.0)
        return jnp.mean(x**2)

    plans = []

    @jax.jit
    def step(w, x, key):
        plans.append(jdtr.plan(loss, w, x, key, budget=0.5))
        return plans[-1].grad(w, x, key)

    assert_trees_close(step(w, x, key), jax.grad(loss)(w, x, key), rtol=1e-4, atol=1e-5)
    (plan,) = plans
    assert len(plan.timings) >= 1 and plan.compiled_bytes <= plan.budget_bytes
    [example_key] = [a for a in made[0] if jnp.issubdtype(a.dtype, jax.dtypes.prng_key)]
    assert jax.random.key_impl(example_key) == jax.random.key_impl(key)


def test_uniform_candidate_is_sqrt_n_checkpointing():
    """Autotuning also times evenly spaced segments that save nothing inside:
    on a chain of 16 layers that is about sqrt(16) segments, as small in
    XLA's memory as a jax.checkpoint every 4 layers, with exact gradients."""
    from jdtr.transform import planning as cpn
    from jdtr.transform.simulated_plans import uniform_plan

    loss = tanh_chain(16)
    w = jax.random.normal(jax.random.PRNGKey(0), (64, 64)) / 8
    x = jax.random.normal(jax.random.PRNGKey(1), (512, 64))

    def block(h, w):
        for _ in range(4):
            h = jnp.tanh(h @ w)
        return h

    def sqrt_n(w, x):
        h = x
        for _ in range(4):
            h = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)(h, w)
        return jnp.sum(h**2)

    options = {"xla_disable_hlo_passes": "cse_barrier_expander"}  # else XLA on the CPU undoes jax.checkpoint
    analysis = jax.jit(jax.grad(sqrt_n), compiler_options=options).lower(w, x).compile().memory_analysis()
    builtin = analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes

    base = jdtr.plan(loss, w, x, budget=0.7, autotune=False)
    (entries,) = [e for f, e in cpn.planning_cache.items() if f is loss]
    (planning,) = entries.values()
    uniform = uniform_plan(planning, base)
    assert 3 <= len(uniform.segments) <= 6, uniform.report()
    assert all(seg.saved == () for seg in uniform.segments)
    assert "uniform segments saving nothing inside" in uniform.report()
    assert_trees_close(jax.jit(uniform.grad)(w, x), jax.grad(loss)(w, x), rtol=1e-4, atol=1e-5)
    compiled = cpn.compiled_bytes(cpn.step_of(uniform, base._config), [w, x])
    assert compiled <= builtin * (1 + ALIKE), (compiled, builtin)
    assert compiled < base.compiled_bytes  # it saves less than DTR's plan at this budget

    tuned = jdtr.plan(loss, w, x, budget=0.7)
    (timed,) = [t for t in tuned.timings if t.origin == "uniform"]
    assert timed.compiled_bytes == compiled and timed.segments == len(uniform.segments)


def test_value_and_grad_has_aux_and_argnums():
    m = model("mlp")

    def loss(params, x, scale):
        value = m.loss(params, x * scale)
        return value, {"v": value}

    fn = jax.jit(jdtr.remat_value_and_grad(loss, argnums=(0, 2), has_aux=True, budget=0.5))
    (value, aux), grads = fn(m.params, m.batch, 0.5)
    (rvalue, raux), rgrads = jax.value_and_grad(loss, argnums=(0, 2), has_aux=True)(m.params, m.batch, 0.5)
    assert_trees_close((value, aux, grads), (rvalue, raux, rgrads), rtol=1e-4, atol=1e-6)


def test_an_aux_value_jit_cannot_return_is_refused_naming_the_users_function():
    """The compiled path returns what a jitted step can, as `jax.jit(jax.grad)`;
    JAX's error names the user's function, as it does there, not jdtr's
    wrapper of it (it named `flat at jdtr/transform/arguments.py`)."""

    def labelled_loss(w):
        return jnp.sum(w**2), {"label": "a string"}

    with pytest.raises(TypeError, match=r"labelled_loss at .*test_plan\.py.*output component \[1\]\['label'\]"):
        jdtr.remat_grad(labelled_loss, has_aux=True, budget=1.0)(jnp.ones(3))


def test_policy_is_frozen_hashable_and_works_with_jax_checkpoint():
    m = model("mlp")
    plan = dataclasses.replace(plan_of("mlp", 0.5))  # a fresh object: `policy` is computed (and warns) once each
    with pytest.warns(jdtr.PolicyWarning):  # the plan saves some of the chain's tanh outputs, not all
        policy = plan.policy
    assert hash(policy) == hash(jdtr.SavePolicy(policy.names, policy.signatures))
    assert policy == jdtr.SavePolicy(policy.names, policy.signatures)
    with pytest.raises(Exception):
        policy.names = frozenset()
    got = jax.jit(jax.grad(jax.checkpoint(m.loss, policy=policy)))(m.params, m.batch)
    assert_trees_close(got, jax.grad(m.loss)(m.params, m.batch), rtol=1e-4, atol=1e-6)
    for segment in plan.segments:
        assert segment.policy.names <= policy.names


def test_policy_warns_where_signatures_cannot_mean_the_plan():
    """The issue's case: on a 16-layer tanh MLP at 0.6 the plan saves some of
    the 16 tanh outputs, all of one signature, so `jax.checkpoint(loss,
    policy=plan.policy)` saves all 16 (compiled with CSE's barrier pass off,
    its best case): `plan.policy` says so. Where the plan saves every value
    of its signatures (no remat), it is silent and means the plan."""
    keys = jax.random.split(jax.random.PRNGKey(0), 17)
    params = [jax.random.normal(k, (256, 256)) / 16 for k in keys[:16]]
    x = jax.random.normal(keys[16], (4096, 256))

    def loss(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x**2)

    def compiled_bytes(policy):
        no_cse = {"xla_disable_hlo_passes": "cse_barrier_expander"}
        return compiled_total(jax.grad(jax.checkpoint(loss, policy=policy)), params, x, compiler_options=no_cse)

    plan = biting_plan(loss, params, x, fraction=0.6, autotune=False)
    # The signature whose values the plan saves only some of: the tanh outputs on JAX 0.10's
    # program, the matmuls that make them on 0.11's (measured on JAX 0.11.2).
    with pytest.warns(jdtr.PolicyWarning, match=r"(tanh|dot_general) of float32\[4096, 256\][^:]*: \d+ of 1[56]") as caught:
        policy = plan.policy
    mixed = caught[0].message.mixed
    assert mixed and all(0 < k < n <= 16 for k, n in mixed.values())
    assert compiled_bytes(policy) > 1.3 * plan.compiled_bytes  # what the warning says
    whole = jdtr.plan(loss, params, x, budget=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy = whole.policy
    assert compiled_bytes(policy) <= 1.02 * whole.compiled_bytes


@pytest.mark.parametrize("in_axes", [(None, 0), (0, 0)])
def test_vmap_plans_the_batched_step_within_the_budget(in_axes):
    """`vmap(remat_grad(loss, budget=0.5))` compiles within half of
    `vmap(jax.grad)`'s bytes (planned per example, it compiled to 1.56x
    them): the batching rule plans the batched step. Per-example gradients
    (shared parameters, `in_axes=(None, 0)`) and an ensemble (`(0, 0)`),
    values and aux as `vmap(jax.value_and_grad(has_aux=True))`'s."""
    layers, batch = 16, 8
    keys = jax.random.split(jax.random.PRNGKey(0), layers + 1)
    params = [jax.random.normal(k, (32, 32)) / np.sqrt(32) for k in keys[:layers]]
    if in_axes[0] == 0:
        params = [jnp.stack([w * (1 + 0.1 * i) for i in range(batch)]) for w in params]
    xs = jax.random.normal(keys[-1], (batch, 1024, 32))

    def loss(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x**2), {"last": x[0]}

    planned = jax.vmap(jdtr.remat_value_and_grad(loss, has_aux=True, budget=0.5, autotune=False), in_axes=in_axes)
    plain = jax.vmap(jax.value_and_grad(loss, has_aux=True), in_axes=in_axes)
    assert compiled_total(planned, params, xs) <= 0.5 * compiled_total(plain, params, xs)
    got, expected = jax.jit(planned)(params, xs), jax.jit(plain)(params, xs)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
    assert_trees_close(got, expected, rtol=1e-4, atol=1e-6)
    remat = jdtr.remat_grad(lambda p, x: loss(p, x)[0], budget=0.5, autotune=False)
    grads = jax.vmap(remat, in_axes=in_axes)(params, xs)
    assert_trees_close(grads, expected[1], rtol=1e-4, atol=1e-6)
    # On arrays the batched step runs compiled, as `remat_grad` on arrays runs its step: operation
    # by operation it was not the plan's memory, and on JAX 0.7.2 it raised (JAX evaluating a
    # checkpoint's pullback eagerly: `add_any` of a literal, a KeyError).
    assert [key for key in remat.steps if isinstance(key, tuple) and key[:1] == ("vmap",)], remat.steps


def tanh_layers(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return x


def shared_tanh_mlp(layers, examples, rows, width=64):
    """Weights of `layers` tanh layers, shared by `examples` inputs of `rows` rows each."""
    keys = jax.random.split(jax.random.PRNGKey(0), layers + 1)
    params = [jax.random.normal(k, (width, width)) / 8 for k in keys[:layers]]
    return params, jax.random.normal(keys[-1], (examples, rows, width))


def test_vmap_of_per_example_gradients_of_shared_parameters_fits_a_budget_of_one():
    """Per-example gradients of shared parameters (`in_axes=(None, 0)`),
    where they dominate the step: at 1.0 `vmap(jax.grad)` itself fits and
    runs (planned with a copy of the parameters per example as arguments,
    the step raised); below what the arguments and gradients take, the
    error says so in those terms."""
    params, xs = shared_tanh_mlp(layers=4, examples=64, rows=16)

    def loss(params, x):
        return jnp.sum(tanh_layers(params, x) ** 2)

    plain = jax.vmap(jax.grad(loss), in_axes=(None, 0))
    planned = jax.vmap(jdtr.remat_grad(loss, budget=1.0), in_axes=(None, 0))
    assert compiled_total(planned, params, xs) <= compiled_total(plain, params, xs)
    assert_trees_close(jax.jit(planned)(params, xs), jax.jit(plain)(params, xs))
    # The same through `remat_value_and_grad` with aux: values, aux and gradients as vmap's.
    def with_aux(params, x):
        return loss(params, x), {"first": x[0, 0]}

    got = jax.jit(jax.vmap(jdtr.remat_value_and_grad(with_aux, has_aux=True, budget=1.0), in_axes=(None, 0)))(params, xs)
    expected = jax.jit(jax.vmap(jax.value_and_grad(with_aux, has_aux=True), in_axes=(None, 0)))(params, xs)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
    assert_trees_close(got, expected, rtol=1e-4, atol=1e-6)
    gradients = 4 * 64 * 64 * 64 * 4  # one copy of the parameters' gradients per example
    with pytest.raises(jdtr.OutOfBudgetError, match="arguments and gradients alone") as caught:
        jax.jit(jax.vmap(jdtr.remat_grad(loss, budget=0.5), in_axes=(None, 0)))(params, xs)
    assert caught.value.needed_bytes > gradients > caught.value.budget_bytes


def test_vmap_where_no_plan_fits_suggests_a_budget_the_batched_call_runs_at():
    """Shared parameters, activations dominating: where no plan's batched
    step fits, the error's suggestion is a budget at which the batched call
    plans and compiles within it, with `vmap(jax.grad)`'s gradients."""
    params, xs = shared_tanh_mlp(layers=8, examples=16, rows=512)

    def loss(params, x):
        return jnp.mean(tanh_layers(params, x) ** 2)

    plain = jax.vmap(jax.grad(loss), in_axes=(None, 0))
    with pytest.raises(jdtr.OutOfBudgetError) as caught:
        jax.jit(jax.vmap(jdtr.remat_grad(loss, budget=0.4, autotune=False), in_axes=(None, 0)))(params, xs)
    suggested = caught.value.suggested_budget_bytes
    assert suggested is not None and "under vmap" in str(caught.value)
    planned = jax.vmap(jdtr.remat_grad(loss, budget=suggested, autotune=False), in_axes=(None, 0))
    assert compiled_total(planned, params, xs) <= suggested < compiled_total(plain, params, xs)
    assert_trees_close(jax.jit(planned)(params, xs), jax.jit(plain)(params, xs), rtol=1e-4, atol=1e-6)


def gru_scan(steps: int, features: int, hidden: int, *batch: int):
    """One sequence's loss, a GRU over its `steps` inputs in `lax.scan` and
    a linear read-out of its last state; its parameters; inputs of shape
    (*batch, steps, features)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "x": jax.random.normal(keys[0], (features, 3 * hidden)) / 8,
        "h": jax.random.normal(keys[1], (hidden, 3 * hidden)) / 11,
        "out": jax.random.normal(keys[2], (hidden, 10)) / 11,
    }
    x = jax.random.normal(keys[3], (*batch, steps, features))

    def loss(p, x):
        def cell(h, xt):
            gx, gh = xt @ p["x"], h @ p["h"]
            r = jax.nn.sigmoid(gx[:hidden] + gh[:hidden])
            z = jax.nn.sigmoid(gx[hidden : 2 * hidden] + gh[hidden : 2 * hidden])
            n = jnp.tanh(gx[2 * hidden :] + r * gh[2 * hidden :])
            return (1 - z) * n + z * h, None

        h, _ = jax.lax.scan(cell, jnp.zeros(hidden), x)
        return jnp.sum((h @ p["out"]) ** 2)

    return loss, params, x


def test_vmap_of_per_example_gradients_without_copies_of_the_shared_parameters():
    """Per-example gradients of a GRU's shared weights (a `scan` of 128
    steps): with a copy of the weights per example as the planned step's
    arguments, no plan compiled below 0.72 of `vmap(jax.grad)`'s bytes; one
    example's plan, mapped by `vmap`, fits 0.5."""
    loss, params, xs = gru_scan(128, 64, 128, 8)

    plain = jax.vmap(jax.grad(loss), in_axes=(None, 0))
    planned = jax.vmap(jdtr.remat_grad(loss, budget=0.5, autotune=False), in_axes=(None, 0))
    assert compiled_total(planned, params, xs) <= 0.5 * compiled_total(plain, params, xs)
    assert_trees_close(jax.jit(planned)(params, xs), jax.jit(plain)(params, xs), rtol=1e-5, atol=1e-5)


@jax.custom_vjp
def _straight_through(x):
    return jnp.round(x)


_straight_through.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))


@jax.custom_jvp
def _half_gradient(x):
    return x


_half_gradient.defjvp(lambda primals, tangents: (primals[0], 0.5 * tangents[0]))


@pytest.mark.parametrize("budget", [1.0, 0.5])
def test_custom_derivatives_keep_their_rules_in_a_plan(budget):
    """A `custom_vjp` (a straight-through estimator) and a `custom_jvp` keep
    their rules in the planned step, recomputed or not: the forward program
    JAX differentiates again binds them as they are. (Inlined, the plan took
    the derivative of `round`, zero, and of the identity.)"""
    keys = jax.random.split(jax.random.PRNGKey(0), 9)
    params = [jax.random.normal(k, (64, 64)) / 8 for k in keys[:8]]
    x = jax.random.normal(keys[-1], (4096, 64))

    def loss(params, x):
        for w in params:
            x = _half_gradient(_straight_through(jnp.tanh(x @ w) * 3))
        return jnp.mean(x**2)

    expected = jax.grad(loss)(params, x)
    assert max(float(jnp.max(jnp.abs(g))) for g in expected) > 0  # the rules carry a gradient through
    plan = jdtr.plan(loss, params, x, budget=budget, autotune=False)
    assert (plan.origin == "none") == (budget == 1.0)
    if budget < 1.0:
        assert any(s.recomputed for s in plan.segments)
    assert_trees_close(jax.jit(plan.grad)(params, x), expected, rtol=1e-5, atol=1e-9)
    assert_trees_close(jdtr.remat_grad(loss, budget=budget, autotune=False)(params, x), expected, rtol=1e-5, atol=1e-9)


@jax.custom_vjp
def _weighted_by_table(table, x):
    return x * jnp.sum(table)


def _weighted_by_table_bwd(residuals, g):
    table, _ = residuals
    # Reads the residual `table` at a traced index, as `odeint`'s backward
    # pass reads its time points: a NumPy array there cannot be indexed so.
    total = jax.lax.scan(lambda c, i: (c + table[i], None), jnp.zeros(()), jnp.arange(table.shape[0]))[0]
    return None, g * total


_weighted_by_table.defvjp(lambda table, x: (_weighted_by_table(table, x), (table, x)), _weighted_by_table_bwd)


@pytest.mark.parametrize("budget", [1.0, 0.5])
def test_a_custom_vjp_whose_backward_pass_indexes_a_constant_residual(budget):
    """A constant made inside a `jit` (`jnp.array([...])`, a literal of the
    program once the `jit` is inlined) reaches a `custom_vjp`'s backward
    pass as a residual, which indexes it with a traced index. Planning
    raised `TracerArrayConversionError` (seen with `jax.experimental.ode`)."""

    @jax.jit
    def layer(w, x):
        return _weighted_by_table(jnp.array([0.25, 0.5, 0.125]), jnp.tanh(x @ w))

    def loss(params, x):
        for w in params:
            x = layer(w, x)
        return jnp.mean(x**2)

    keys = jax.random.split(jax.random.PRNGKey(0), 13)
    params = [jax.random.normal(k, (64, 64)) / 8 for k in keys[:12]]
    x = jax.random.normal(keys[-1], (2048, 64))
    expected = jax.grad(loss)(params, x)
    plan = jdtr.plan(loss, params, x, budget=budget, autotune=False)
    assert (plan.origin == "none") == (budget == 1.0)
    assert_trees_close(jax.jit(plan.grad)(params, x), expected, rtol=1e-5, atol=1e-9)
    assert_trees_close(jdtr.remat_grad(loss, budget=budget, autotune=False)(params, x), expected, rtol=1e-5, atol=1e-9)


def test_holomorphic_on_the_compiled_path_as_in_jax_grad():
    """`holomorphic=True` in `remat_grad` and `remat_value_and_grad` (it was
    no argument of theirs): `jax.grad`'s derivative of a holomorphic loss,
    from a step within the budget, under `jit` and `vmap`; the dtypes
    checked as `jax.grad` checks them."""

    def f(z, w):
        for _ in range(16):
            z = jnp.tanh(z @ w)
        return jnp.sum(z**2)

    k = jax.random.split(jax.random.PRNGKey(0), 4)
    z = ((jax.random.normal(k[0], (2048, 32)) + 1j * jax.random.normal(k[1], (2048, 32))) * 0.3).astype(jnp.complex64)
    w = ((jax.random.normal(k[2], (32, 32)) + 1j * jax.random.normal(k[3], (32, 32))) * 0.1).astype(jnp.complex64)
    plain = jax.grad(f, (0, 1), holomorphic=True)
    step = jdtr.remat_grad(f, (0, 1), holomorphic=True, budget=0.5, autotune=False)
    assert compiled_total(step, z, w) <= 0.5 * compiled_total(plain, z, w)
    assert_trees_close(jax.jit(step)(z, w), plain(z, w), rtol=1e-5, atol=1e-6)
    value, grads = jdtr.remat_value_and_grad(f, holomorphic=True, budget=1.0)(z, w)
    assert jnp.iscomplexobj(value) and abs(value - f(z, w)) <= 1e-5 * abs(value)
    assert_trees_close(grads, plain(z, w)[0], rtol=1e-5, atol=1e-6)
    zs = z.reshape(4, 512, 32)
    mapped = jax.vmap(jdtr.remat_grad(f, holomorphic=True, budget=1.0), in_axes=(0, None))(zs, w)
    assert_trees_close(mapped, jax.vmap(jax.grad(f, holomorphic=True), in_axes=(0, None))(zs, w), rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="requires inputs with complex dtype"):
        jdtr.remat_grad(f, holomorphic=True, budget=0.5)(z.real, w.real)
    with pytest.raises(TypeError, match="requires outputs with complex dtype"):
        jdtr.remat_grad(lambda z, w: jnp.real(f(z, w)), holomorphic=True, budget=0.5)(z, w)
    with pytest.raises(TypeError, match="holomorphic"):  # without it, as jax.grad says it
        jdtr.remat_grad(f, budget=0.5)(z, w)
    with pytest.raises(TypeError, match="requires at least 3 positional arguments"):  # a negative argnum past them
        jdtr.remat_grad(f, argnums=-3, holomorphic=True, budget=0.5)(z, w)


def test_a_plan_without_remat_is_jax_grads_own_step():
    """Where `jax.grad`'s step fits, the plan runs the user's function as it
    is: the very program measured as the unconstrained step (jdtr's
    program of it, run equation by equation, compiled to 11% more on a
    Flax BatchNorm CNN)."""

    def loss(params, x, labels):
        for w in params:
            x = jax.nn.relu(x @ w)
        logits = jax.nn.log_softmax(x)
        return -jnp.mean(jnp.take_along_axis(logits, labels[:, None], axis=1))

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = [jax.random.normal(k, (32, 32)) / 6 for k in keys[:3]]
    args = (params, jax.random.normal(keys[-1], (128, 32)), jnp.arange(128) % 32)
    plan = jdtr.plan(loss, *args, budget=1.0)
    assert plan.origin == "none" and plan.segments == ()
    assert str(jax.make_jaxpr(plan.grad)(*args)) == str(jax.make_jaxpr(jax.grad(loss))(*args))
    assert compiled_total(plan.grad, *args) == plan.compiled_bytes == compiled_total(jax.grad(loss), *args)


def test_report_lists_segments_and_totals():
    plan = plan_of("mlp", 0.5)
    text = plan.report()
    assert f"{len(plan.segments)} segments" in text
    assert text.count("\nsegment ") == len(plan.segments)
    assert "total:" in text and "compiled step:" in text
    assert plan.simulated.rematerializations > 0


def as_implementation(plan, implementation):
    """The same segments run with another implementation (no re-planning)."""
    return dataclasses.replace(plan, _config=dataclasses.replace(plan._config, implementation=implementation))


@pytest.mark.parametrize("implementation", ["checkpoint", "protected", "auto"])
def test_implementations_agree(implementation):
    m = model("mlp")
    plan = as_implementation(plan_of("mlp", 0.5), implementation)
    assert_trees_close(jax.jit(plan.grad)(m.params, m.batch), jax.grad(m.loss)(m.params, m.batch), rtol=1e-4, atol=1e-6)


def test_protected_segments_survive_xla_cse_on_cpu():
    """With plain jax.checkpoint, XLA on the CPU merges the recomputation away;
    the protected segments keep the saving with default compiler options."""
    m = model("mlp")
    protected = plan_of("mlp", 0.5)  # "auto": protected on the CPU
    plain = as_implementation(protected, "checkpoint")
    analysis = jax.jit(plain.grad).lower(m.params, m.batch).compile().memory_analysis()
    plain_bytes = analysis.temp_size_in_bytes + analysis.argument_size_in_bytes + analysis.output_size_in_bytes
    if jax.default_backend() != "cpu":
        pytest.skip("XLA strips checkpoint barriers only on the CPU")
    assert protected.compiled_bytes <= protected.budget_bytes
    if not xla_strips_checkpoint_barriers():
        pytest.skip("this XLA keeps jax.checkpoint's barriers on the CPU (JAX 0.11's does)")
    assert plain_bytes > protected.budget_bytes
    # Asked for plain checkpoints on the CPU, the planner cannot meet the
    # budget and says why instead of returning an oversized step.
    with pytest.raises(jdtr.OutOfBudgetError, match="removes checkpoint barriers") as caught:
        plan_of("mlp", 0.5, "checkpoint")
    # Every such plan compiled to more than `jax.grad`'s own step (1.08x):
    # the budget suggested is that step's, which a call at it runs.
    full = compiled_total(jax.grad(m.loss), m.params, m.batch)
    assert caught.value.suggested_budget_bytes == full and "no plan found beat" in str(caught.value)
    plan = jdtr.plan(m.loss, m.params, m.batch, budget=full, implementation="checkpoint", autotune=False)
    assert plan.segments == () and plan.compiled_bytes <= full


def convolutions_in_branches(c):
    """Convolutions in the computations a compiled step's conditionals branch to (and those they call)."""
    text = c.as_text()
    bodies = dict(re.findall(r"^(?:ENTRY )?%?([\w.\-]+) [^\n]*\{\n(.*?)^\}", text, re.S | re.M))
    groups = re.findall(r"branch_computations=\{([^}]*)\}", text)
    pending = [n for group in groups for n in re.findall(r"%?([\w.\-]+)", group)]
    seen, count = set(), 0
    while pending:
        name = pending.pop()
        if name in seen or name not in bodies:
            continue
        seen.add(name)
        count += bodies[name].count("convolution(")
        called = r"(?:calls|to_apply|body|condition|branch_computations=\{)=?%?([\w.\-]+)"
        pending += re.findall(called, bodies[name])
    return count


def recomputed_convolutions(plan) -> int:
    """The convolutions inside a plan's segments (each recomputed once by a flat plan)."""
    body = plan.program.body
    return sum(
        isinstance(item, Equation) and item.name == "conv_general_dilated"
        for seg in plan.segments for item in body[seg.start : seg.stop]
    )


def test_convolution_segments_are_gated_without_a_cond_and_keep_their_saving():
    """XLA on the CPU runs a convolution's gradient inside a `lax.cond` about
    20x slower (issue 22): segments that recompute a convolution are gated by
    a taint instead (`checkpoint.GATES`), so the compiled step holds no
    conditional, and CSE still cannot merge the recomputation away (the
    saving is kept, unlike plain checkpoints), with `jax.grad`'s gradients.
    Gated by "cond_recompute", only the recomputation runs in conds: they
    hold each recomputed forward convolution once and none of the
    gradients' (under "cond", the whole pullback in the cond, they hold
    those too). The planner keeps a plan within the budget, gated either way."""
    m = jdtr.models.flax_resnet_groupnorm(blocks=2, channels=8, image=8, batch=8)
    plan = jdtr.plan(m.loss, m.params, m.batch, budget=0.7, autotune=False)
    assert plan.gate in ("auto", "inputs", "anchored", "cond_recompute", "cond") and plan.compiled_bytes <= plan.budget_bytes, plan.report()
    reference = jax.jit(jax.grad(m.loss))(m.params, m.batch)

    # Each variant compiled once: its program is read, measured and run.
    (tainted, tainted_bytes), (conds, _), (recomputing, _) = (
        compiled_and_total(dataclasses.replace(plan, gate=gate).grad, m.params, m.batch)
        for gate in ("auto", "cond", "cond_recompute")
    )
    assert "convolution(" in tainted.as_text() and convolutions_in_branches(tainted) == 0
    recomputed = recomputed_convolutions(plan)
    assert 0 < convolutions_in_branches(recomputing) <= recomputed < convolutions_in_branches(conds)
    if xla_strips_checkpoint_barriers():  # then plain checkpoints lose the saving a taint keeps
        plain = compiled_total(as_implementation(plan, "checkpoint").grad, m.params, m.batch)
        assert tainted_bytes < 0.95 * plain  # (a small net: a few activations saved)
    for step in (tainted, conds, recomputing):
        assert_trees_close(step(m.params, m.batch), reference, rtol=1e-4, atol=1e-6)



def test_where_the_taints_gates_are_over_the_recomputation_in_conds_fits_flat():
    """A plain CNN at 0.5, whose path's flat plans compile over the budget
    under the taint's gates ("auto", "inputs", "anchored"): under
    "cond_recompute" the same flat segments fit, before the path asks for
    less (before, it nested them: a group's leaves recomputed once per
    leaf). The conds hold the recomputed forward convolutions alone, the
    gradients run after them, no `SlowPlanWarning`, with `jax.grad`'s
    gradients and XLA's bytes within the budget."""
    m = models.plain_cnn(layers=6, channels=16, image=16, batch=8)
    loss = lambda p, x: m.loss(p, x)  # noqa: E731 - its own planning: nothing measured before
    plan = jdtr.plan(loss, m.params, m.batch, budget=0.5, autotune=False)
    assert max(seg.depth for seg in plan.segments) == 1, plan.report()
    step, nbytes = compiled_and_total(plan.grad, m.params, m.batch)
    assert nbytes == plan.compiled_bytes <= plan.budget_bytes
    if xla_strips_checkpoint_barriers():
        assert plan.gate == "cond_recompute", plan.report()
        assert 0 < convolutions_in_branches(step) <= recomputed_convolutions(plan)
    else:  # JAX 0.11's XLA keeps a checkpoint's saving: the taint's gates fit, without conds
        assert plan.gate in ("auto", "inputs", "anchored") and convolutions_in_branches(step) == 0, plan.report()
    reference = jax.jit(jax.grad(m.loss))(m.params, m.batch)
    assert_trees_close(step(m.params, m.batch), reference, rtol=1e-4, atol=1e-6)


def plain_cnn():
    """Six 3x3 convolutions with ReLU, 16 channels, no normalisation."""
    keys = jax.random.split(jax.random.PRNGKey(0), 7)
    ws = [jax.random.normal(keys[i], (3, 3, 3 if i == 0 else 16, 16)) * 0.2 for i in range(6)]
    x = jax.random.normal(keys[6], (8, 16, 16, 3))

    def loss(ws, x):
        for w in ws:
            x = jax.nn.relu(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
        return jnp.mean(x**2)

    return loss, ws, x


def test_the_inputs_gate_keeps_xla_from_holding_a_transposed_copy_of_each_saved_input():
    """Outside a cond, XLA on the CPU made the transposed copy of a saved
    activation that a convolution's weight gradient reads right after the
    forward convolution, and held it to the backward pass: a second copy of
    each (a plain CNN's tainted plan compiled to 0.79 of `jax.grad`'s bytes,
    where the cond-gated one took 0.49, 40x slower). The gate "inputs"
    selects the saved inputs by the backward pass's predicate too, so the
    copy is made when the backward pass reaches them; the planner measures
    it, and keeps it where the taint alone does not fit."""
    loss, ws, x = plain_cnn()
    full = compiled_total(jax.grad(loss), ws, x)
    plan = jdtr.plan(loss, ws, x, budget=0.7, autotune=False)
    if jax.default_backend() != "cpu":
        pytest.skip("segments are gated only on the CPU")
    assert plan.compiled_bytes <= plan.budget_bytes, plan.report()
    taint_only = compiled_total(dataclasses.replace(plan, gate="auto").grad, ws, x)
    if taint_only <= plan.budget_bytes:  # this XLA holds no such copies (JAX 0.11's): the taint alone is kept
        assert plan.gate == "auto", plan.report()
    else:
        assert plan.gate == "inputs" and plan.compiled_bytes < taint_only - 0.1 * full, plan.report()
    assert_trees_close(jax.jit(plan.grad)(ws, x), jax.grad(loss)(ws, x), rtol=1e-4, atol=1e-6)

def planned_then_nested(monkeypatch, m, budget):
    """`jdtr.plan` of the model `m` at `budget` (a planning of its own), its
    search, and the left nesting that search's last resorts take
    (`PlanSearch._nested_left`), asked for after the path fit a plan."""
    plan, search = searched_plan(monkeypatch, m, budget)
    return plan, search, search._nested_left(search._without_conds(recomputing_convolutions=True), finest=True)


def test_convolution_plans_nest_to_the_left_before_falling_back_to_conds(monkeypatch):
    """Where no tainted plan fits, the planner regroups the smallest one's
    segments to the left, ((s1, s2), s3), before the cond-gated fallback
    (~40x slower on the CPU): a group then keeps one segment's input at a
    time, and XLA fewer transposed copies for the convolutions' weight
    gradients. On this CNN at 0.5 the planner kept conds before; then a
    tainted plan fit, whose segments laid out flat do not. (The search's
    path now fits it flat, gated by "cond_recompute":
    `test_where_the_taints_gates_are_over_the_recomputation_in_conds_fits_flat`;
    the nestings are asked for of its search after it.)"""
    if jax.default_backend() != "cpu":
        pytest.skip("segments are gated only on the CPU")
    m = jdtr.models.plain_cnn(layers=6, channels=16, image=16, batch=8)
    _, _, plan = planned_then_nested(monkeypatch, m, 0.5)
    # Not conds: the taint alone, or with the saved inputs selected too (ReLU's own derivative rule,
    # kept since, compiles to an activation more under the taint alone here).
    assert plan.gate in ("auto", "inputs") and plan.compiled_bytes <= plan.budget_bytes, plan.report()
    nested = [seg for seg in plan.segments if seg.children]
    assert all(not seg.children[-1].children for seg in nested)  # the last child of a group is a leaf
    flat = dataclasses.replace(plan, segments=tuple(leaf for seg in plan.segments for leaf in seg.leaves()))
    # Nested where the same segments laid out flat do not fit (on JAX 0.10's XLA; 0.11's fits them flat).
    assert bool(nested) == (compiled_total(flat.grad, m.params, m.batch) > plan.budget_bytes), plan.report()
    reference = jax.grad(m.loss)(m.params, m.batch)
    assert_trees_close(jax.jit(plan.grad)(m.params, m.batch), reference, rtol=1e-4, atol=1e-6)


def test_a_chain_nested_deep_is_tainted_where_conds_would_hold_every_level():
    """XLA holds the temporaries of nested conds at once (issue 24: a
    16-layer MLP nested to the left in one group compiled to 26 MiB gated by
    conds, as much as `jax.grad`'s step, and to 13 tainted). On a chain without
    convolutions, where no plan fits flat or nested by conds, the planner
    nests the layers to the left, every segment tainted: at 0.45 of this
    MLP, where the smallest plan had been 0.55."""
    if jax.default_backend() != "cpu":
        pytest.skip("segments are gated only on the CPU")
    m = models.mlp_chain(16, 64, 512)
    plan = jdtr.plan(m.loss, m.params, m.batch, budget=0.45, autotune=False)
    assert plan.compiled_bytes <= plan.budget_bytes, plan.report()
    assert max(seg.depth for seg in plan.segments) >= 4 and plan.gate == "taint", plan.report()
    assert_trees_close(jax.jit(plan.grad)(m.params, m.batch), jax.grad(m.loss)(m.params, m.batch), rtol=1e-4, atol=1e-6)
    conds = compiled_total(dataclasses.replace(plan, gate="auto").grad, m.params, m.batch)
    assert conds > plan.budget_bytes, plan.report()


def test_bad_arguments():
    with pytest.raises(ValueError, match="implementation"):
        jdtr.remat_grad(lambda x: x, budget=0.5, implementation="fast")
    with pytest.raises(ValueError, match="unit"):
        jdtr.remat_grad(lambda x: x, budget="3 furlongs")
    with pytest.raises(ValueError, match="unknown heuristic"):
        jdtr.remat_grad(lambda x: x, budget=0.5, heuristic="nope")


SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jdtr
    from jdtr import models
    assert len(jax.devices()) == 8
    m = models.mlp_chain(layers=16, width=32, batch=512)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, batched = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params = jax.device_put(m.params, replicated)
    x = jax.device_put(m.batch, batched)
    def step(budget):
        return jax.jit(jdtr.remat_grad(m.loss, budget=budget), in_shardings=(replicated, batched), out_shardings=replicated)
    try:
        got = step(0.5)(params, x)
    except jdtr.OutOfBudgetError as err:  # (no plan at exactly half: at the budget the planner verified)
        got = step(err.suggested_budget_bytes)(params, x)
    ref = jax.jit(jax.grad(m.loss), in_shardings=(replicated, batched), out_shardings=replicated)(params, x)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    print("sharded ok", len(got))
    # Eager calls on arrays committed to another device than the default:
    # the autotuned candidates are compiled for it and timed there.
    device = jax.devices()[3]
    p3, x3 = jax.device_put(m.params, device), jax.device_put(m.batch, device)
    try:
        plan = jdtr.plan(m.loss, p3, x3, budget=0.5)
    except jdtr.OutOfBudgetError as err:
        plan = jdtr.plan(m.loss, p3, x3, budget=err.suggested_budget_bytes)
    assert plan.timings and plan.compiled_bytes <= plan.budget_bytes, plan.report()
    got = jdtr.remat_grad(m.loss, budget=plan.budget_bytes)(p3, x3)
    assert all(g.devices() == {device} for g in got)
    for a, b in zip(got, jax.jit(jax.grad(m.loss))(p3, x3)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    print("device ok")
    """
)


def test_data_parallel_sharded_step_on_8_cpu_devices():
    stdout = run_on_8_devices(SHARDED, timeout=600)
    assert "sharded ok 16" in stdout and "device ok" in stdout


def test_device_peak_script_refuses_a_backend_without_allocator_stats():
    """benchmarks/device_peak.py reads the allocator's peak, which the CPU
    does not report: it must say so and fail, not write a table of zeros."""
    script = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "device_peak.py")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "reports no memory_stats()" in done.stderr and done.stdout == ""


def test_planning_reuses_work_across_budgets_and_does_not_keep_the_function_alive():
    """Planning the same function for the same shapes again starts from the
    same traced programs and compiled candidates; once the user drops the
    function (and its plans), the cache drops them too."""
    import gc
    import weakref

    from jdtr.transform import planning as cpn

    w = jax.random.normal(jax.random.PRNGKey(0), (64, 64)) / 8
    x = jax.random.normal(jax.random.PRNGKey(1), (512, 64))
    loss = tanh_chain(12)
    first = jdtr.plan(loss, w, x, budget=0.7, autotune=False)
    second = biting_plan(loss, w, x, fraction=0.5, autotune=False)
    assert second.program is first.program  # traced once
    (entries,) = [e for f, e in cpn.planning_cache.items() if f is loss]
    (planning,) = entries.values()
    assert {cpn.layout(first), cpn.layout(second)} <= set(planning.steps)
    again = jdtr.plan(loss, w, x, budget=0.7, autotune=False)
    assert cpn.layout(again) == cpn.layout(first) and again.compiled_bytes == first.compiled_bytes
    assert_trees_close(jax.jit(second.grad)(w, x), jax.grad(loss)(w, x), rtol=1e-4, atol=1e-5)
    alive = weakref.ref(loss)
    del loss, first, second, again, entries, planning
    gc.collect()
    assert alive() is None
    assert all(f is not None for f in cpn.planning_cache.keys())


def test_the_arrays_a_planned_function_closes_over_are_freed_with_it():
    """A program keeps what the segment search computes for it on itself
    (`ProgramMemo`). Kept in weak maps keyed by the program, those values
    held the program, so it was never freed, nor were the arrays the user's
    function closed over: one copy on the device per function planned (a
    loss made in a loop leaked at every call). Once the function and its
    plans are dropped, none is left."""
    import gc

    w = jax.random.normal(jax.random.PRNGKey(0), (64, 64)) / 8
    x = jax.random.normal(jax.random.PRNGKey(1), (512, 64))
    shape = (333, 1031)  # (no other test's)

    def made():
        table = jax.random.normal(jax.random.PRNGKey(2), shape)

        def loss(w, x):
            h = x @ table[:64, :64]
            for _ in range(16):
                h = jnp.tanh(h @ w)
            return jnp.sum(h**2)

        return loss

    def held():
        gc.collect()
        return sum(1 for a in jax.live_arrays() if a.shape == shape)

    for call in range(2):
        loss = made()
        plan = biting_plan(loss, w, x, fraction=0.6, autotune=False)
        assert plan.segments and plan.program.memo.flat_cuts  # the search cut the body
        jax.block_until_ready(jax.jit(plan.grad)(w, x))
        jax.block_until_ready(jax.jit(jdtr.remat_grad(loss, budget=plan.budget_bytes, autotune=False))(w, x))
        assert held() > 0
        del loss, plan
        assert held() == 0, call


def test_several_processes_plan_by_memory_alone(monkeypatch):
    """Across processes every one must run the same plan (their collectives
    meet), and step timings differ between them: no autotuning there."""
    m = model("mlp")
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    loss = lambda p, x: m.loss(p, x)  # noqa: E731 - a function of its own: nothing planned before
    plan = jdtr.plan(loss, m.params, m.batch, budget=0.5)
    assert plan.timings == ()
    with pytest.warns(UserWarning, match="several processes"):
        jdtr.plan(lambda p, x: m.loss(p, x), m.params, m.batch, budget=0.5, autotune=True)


def test_where_the_search_finds_none_it_takes_the_fitting_plan_measured_before():
    """A search whose own path finds no plan within its target takes, among
    every plan measured for the step (by earlier budgets' searches too), one
    whose convolutions run outside conds before a cond-gated one (~40x
    slower on the CPU), then the one that recomputes least (the most bytes);
    none where none fits. A cond-gated plan kept is said (`SlowPlanWarning`),
    unless one without conds within the target is among the search's plans."""
    from types import SimpleNamespace

    from jdtr.transform.checkpoint_plan import layout
    from jdtr.transform.plan_search import PlanSearch

    def plan(gate, nbytes):
        segment = SimpleNamespace(start=0, stop=nbytes, saved=(), children=(), signatures=frozenset())
        return SimpleNamespace(gate=gate, tied=False, compiled_bytes=nbytes, segments=(segment,))

    search = PlanSearch.__new__(PlanSearch)
    search.target = 1000
    plans = [plan("cond", 990), plan("inputs", 940), plan("auto", 960), plan("auto", 1001)]
    search.planning = SimpleNamespace(measured={layout(p): p for p in plans})
    search.tried = {layout(p) for p in plans}  # measured by this search: returned as recorded
    assert search._measured_before() is plans[2]
    search.planning.measured = {layout(p): p for p in (plans[0], plans[3])}
    assert search._measured_before() is plans[0]  # only a cond-gated plan fits
    search.planning.measured = {layout(plans[3]): plans[3]}
    assert search._measured_before() is None
    # A cond-gated plan kept says so, with the bytes of the smallest plan without conds.
    search.planning.measured = {layout(p): p for p in plans}
    search.compiled = []
    message = search.slow_plan_message(plans[0])
    assert "inside lax.cond" in message and "budget=940 (bytes)" in message
    assert search.slow_plan_message(plans[2]) is None
    search.compiled = [plans[1]]  # one without conds within the target is the search's (`adopt_measured`): nothing to say
    assert search.slow_plan_message(plans[0]) is None
    search.compiled = []
    search.planning.measured = {layout(plans[0]): plans[0]}
    assert search.slow_plan_message(plans[0]) is None  # none without conds to point to


def test_the_cond_gated_fallback_is_compiled_only_where_nothing_without_conds_fits(monkeypatch):
    """A conv net's plans over the budget, gated by conds, are the search's
    last resort (~20x slower on the CPU): compiled after every plan without
    conds failed, and not at all where one fits (a compile saved); the
    first, then, where it is over, the one asked for least. Planned at the
    budget its error suggests, the fallback is the plan, said by a
    `SlowPlanWarning`, with `jax.grad`'s gradients."""
    from jdtr.transform.planning import Planning

    compiled = []  # (gate, bytes) of each plan compiled, in order
    real = Planning.compile

    def recording(self, plans, run=False):
        results = real(self, plans, run)
        compiled.extend((p.gate, step.nbytes) for p, step in results)
        return results

    monkeypatch.setattr(Planning, "compile", recording)
    m = model("resnet")  # tiny: XLA's fixed buffers leave no plan without conds at 0.8 or 0.7, one at 0.95
    loss = lambda p, x: m.loss(p, x)  # noqa: E731 - planned afresh, whatever other tests planned for m.loss
    plan = jdtr.plan(loss, m.params, m.batch, budget=0.95, autotune=False)
    assert plan.gate != "cond" and plan.compiled_bytes <= plan.budget_bytes
    over = [gate for gate, nbytes in compiled if nbytes > plan.budget_bytes]
    assert "cond" not in {gate for gate, _ in compiled}
    if not xla_strips_checkpoint_barriers():  # JAX 0.11's XLA keeps a checkpoint's saving
        assert not over and "anchored" not in {gate for gate, _ in compiled}  # the first plan fit: nothing to fall back from
        pytest.skip("the budgets below are where JAX 0.10's XLA leaves no plan without conds; 0.11's keeps checkpoints")
    assert {"auto", "inputs"} <= set(over)  # a first plan over the budget: a fallback was at hand
    # "anchored" is measured only where the same segments under "inputs" are over.
    anchored = [i for i, (gate, _) in enumerate(compiled) if gate == "anchored"]
    assert anchored and all(compiled[i - 1][0] == "inputs" and compiled[i - 1][1] > plan.budget_bytes for i in anchored)

    # At 0.8 the path's first plan gated by conds is over (XLA holds more
    # of a plan asked for more); the one asked for least fits.
    compiled.clear()
    with pytest.warns(jdtr.SlowPlanWarning):
        plan = jdtr.plan(loss, m.params, m.batch, budget=0.8, autotune=False)
    conds = [nbytes for gate, nbytes in compiled if gate == "cond"]
    assert [gate for gate, _ in compiled][-2:] == ["cond", "cond"] and len(compiled) > 2
    # Each path plan over under "inputs" and "anchored" was measured under "cond_recompute" next (over on this tiny net).
    after = [compiled[i + 1] for i, (gate, _) in enumerate(compiled[1:], 1) if gate == "anchored" and compiled[i - 1][0] == "inputs"]
    assert after and all(gate == "cond_recompute" and nbytes > plan.budget_bytes for gate, nbytes in after)
    assert conds[0] > plan.budget_bytes >= conds[1] == plan.compiled_bytes and plan.gate == "cond"
    reference = jax.jit(jax.grad(m.loss))(m.params, m.batch)
    assert_trees_close(jax.jit(plan.grad)(m.params, m.batch), reference, rtol=1e-4, atol=1e-6)

    compiled.clear()
    with pytest.raises(jdtr.OutOfBudgetError) as info:
        jdtr.plan(loss, m.params, m.batch, budget=0.7, autotune=False)
    conds = [nbytes for gate, nbytes in compiled if gate == "cond"]
    assert 1 <= len(conds) <= 2 and compiled[-1][0] == "cond"
    assert info.value.suggested_budget_bytes == min(nbytes for _, nbytes in compiled)
    with pytest.warns(jdtr.SlowPlanWarning):
        plan = jdtr.plan(loss, m.params, m.batch, budget=info.value.suggested_budget_bytes, autotune=False)
    assert plan.gate == "cond" and plan.compiled_bytes <= plan.budget_bytes
    assert_trees_close(jax.jit(plan.grad)(m.params, m.batch), reference, rtol=1e-4, atol=1e-6)


def test_a_vgg_like_cnn_plans_within_the_budget_with_jax_grads():
    """`models.plain_cnn` with max pools (the conv benchmark's VGG-like net):
    its pools are entries without arrays among the layers, kept through
    `jax.checkpoint` segments; a plan keeps the budget and gives `jax.grad`'s gradients.

    The memory model predicts the same bytes for this net's plans that save
    more and less (the backward pass's transients set it), so asking for
    less after a plan compiled over the budget proposed the same plan again
    and the search gave up: at 0.8 it raised (smallest plan found: 0.92 of
    the step) where a plan saving one ReLU output less compiles to 0.76. A
    plan measured is no longer proposed: the bisection goes on to lower
    simulated budgets."""
    from jdtr.transform.checkpoint_plan import layout
    from jdtr.transform.simulated_plans import search_simulated_budget
    from jdtr.transform.planning import planning_cache

    m = jdtr.models.plain_cnn(layers=4, channels=8, image=16, batch=4, pools=(1,))
    assert [None if isinstance(p, tuple) else p.shape[-1] for p in m.params["convs"]] == [8, 8, None, 16, 16]
    reference = jax.grad(m.loss)(m.params, m.batch)
    segmented = jdtr.models.plain_cnn(layers=4, channels=8, image=16, batch=4, pools=(1,), segment=jax.checkpoint, every=2)
    assert_trees_close(jax.grad(segmented.loss)(m.params, m.batch), reference, rtol=1e-5, atol=1e-6)
    plan = jdtr.plan(m.loss, m.params, m.batch, budget=0.8, autotune=False)
    assert plan.segments and plan.compiled_bytes <= plan.budget_bytes, plan.report()
    assert_trees_close(jax.jit(plan.grad)(m.params, m.batch), reference, rtol=1e-4, atol=1e-6)

    (planning,) = planning_cache[m.loss].values()  # the step's programs and simulations, as the search had them
    peak, roomy = planning.vg.unconstrained_peak(), float(planning.unconstrained)
    first = search_simulated_budget(planning, peak, roomy, "dtr_eq")
    second = search_simulated_budget(planning, peak, roomy, "dtr_eq", measured=frozenset({layout(first)}))
    assert second is not None and layout(second) != layout(first) and second.predicted_bytes <= roomy
    third = search_simulated_budget(planning, peak, roomy, "dtr_eq", measured=frozenset({layout(first), layout(second)}))
    assert third is None or layout(third) not in {layout(first), layout(second)}


def test_no_plan_fits_suggests_the_smallest_plan_measured_for_the_step():
    """Searches at other budgets pass by other plans: where none fits, the
    error suggests the smallest plan measured for the step by any of them
    (a search at 0.7 after one at 0.5 suggested a plan larger than one
    the first had measured)."""
    m = jdtr.models.plain_cnn(layers=4, channels=8, image=16, batch=4, pools=(1,))
    loss = lambda p, b: m.loss(p, b)  # noqa: E731 - its own planning
    suggested = []
    # (Both below this net's smallest plan: 0.41 of its step, with max
    # pooling's pullback computed from slices; 0.73 with XLA's
    # select-and-scatter, where these fractions were 0.5 and 0.7.)
    for fraction in (0.25, 0.35):
        try:
            jdtr.plan(loss, m.params, m.batch, budget=fraction, autotune=False)
        except jdtr.OutOfBudgetError as err:
            assert err.suggested_budget_bytes is not None
            suggested.append(err.suggested_budget_bytes)
    assert len(suggested) == 2, suggested
    assert suggested[1] <= suggested[0], suggested
    with warnings.catch_warnings():  # (the smallest plan recomputes in conds: slow, and said so)
        warnings.simplefilter("ignore", jdtr.SlowPlanWarning)
        plan = jdtr.plan(loss, m.params, m.batch, budget=suggested[-1], autotune=False)
    assert plan.compiled_bytes <= suggested[-1]


WARM_CACHE = textwrap.dedent(
    """
    import jax
    import jdtr
    from jdtr import models
    m = models.mlp_chain(layers=32, width=64, batch=2048)
    plan = jdtr.plan(m.loss, m.params, m.batch, budget=0.5, autotune=False)
    _, stats = jdtr.grad(m.loss, budget=0.5, chunks="always", return_stats=True)(m.params, m.batch)
    _, stats = jdtr.grad(m.loss, budget=0.5, chunks="always", return_stats=True)(m.params, m.batch)
    print(plan.unconstrained_compiled_bytes, plan.compiled_bytes, len(plan.segments), stats.execution, stats.chunks,
          stats.peak_bytes, stats.budget_bytes)
    """
)


def test_plans_and_chunks_are_the_same_with_jaxs_persistent_compilation_cache_warm(tmp_path):
    """Users turn on JAX's persistent compilation cache: an executable read
    back from it must give jdtr the same `memory_analysis()`, so a plan and a
    chunked run made with a warm cache are the ones made cold, and the warm
    run compiles nothing new."""
    env = dict(
        os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1", JAX_PLATFORMS="cpu",
    )

    def run():
        result = subprocess.run([sys.executable, "-c", WARM_CACHE], env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout.split()

    cold = run()
    entries = set(os.listdir(tmp_path))
    warm = run()
    assert len(entries) > 10 and set(os.listdir(tmp_path)) == entries  # every program read back, none compiled anew
    assert warm == cold and cold[3] == "chunks", (cold, warm)
    assert int(cold[1]) <= 0.5 * int(cold[0]) and int(cold[5]) <= int(cold[6])


def test_a_left_nesting_is_the_least_recompute_of_every_source_that_fits(monkeypatch):
    """Where no plan fits flat, the leaves of each source (the smallest
    tainted plans', then uniform ones) are nested to the left, and of the
    nestings that fit the one that recomputes least is kept, not the first
    source's: on this CNN at 0.5 DTR's leaves fit in groups of five (1.6x
    `jax.jit(jax.grad)`'s step), uniform ones in groups of four (1.2x).
    (The search's path now fits this CNN flat, gated by "cond_recompute";
    the nestings are asked for of its search after it.)"""
    from jdtr.transform.segments import LEFT_NESTED_MAX, recompute_cost, uniform_leaves

    if jax.default_backend() != "cpu":
        pytest.skip("segments are gated only on the CPU")
    m = jdtr.models.plain_cnn(layers=6, channels=32, image=32, batch=16)
    flat, search, plan = planned_then_nested(monkeypatch, m, 0.5)
    assert flat.gate == "cond_recompute" and flat.compiled_bytes <= flat.budget_bytes, flat.report()
    assert plan.compiled_bytes <= plan.budget_bytes and plan.gate != "cond", plan.report()
    assert any(seg.children for seg in plan.segments), plan.report()  # a left nesting
    forward, residuals = search.planning.forward, search.planning.residuals
    uniform = dataclasses.replace(
        plan, segments=uniform_leaves(forward, residuals, LEFT_NESTED_MAX), saved=frozenset(), origin="uniform"
    )
    # No nesting of uniform leaves that recomputes less than the plan fits.
    assert search._bisect_groups(uniform, below=recompute_cost(forward, plan.segments)) is None, plan.report()
    assert_trees_close(jax.jit(plan.grad)(m.params, m.batch), jax.grad(m.loss)(m.params, m.batch), rtol=1e-4, atol=1e-6)


def test_the_cuts_of_a_program_are_the_same_with_its_ranges_cached_or_not(monkeypatch):
    """`segments` keeps, per program, the values of every run of equations
    it cut (the search cuts one forward body at every simulated budget),
    dropped past `RANGE_VALUES_MAX`: a plan cut with that bound at 1 (no
    range kept beyond the last one) is the plan cut with them kept, nested
    segments included."""
    from jdtr.transform import segments as segmentation
    from jdtr.transform.checkpoint_plan import layout

    m = model("mlp")

    def planned():  # at 0.25, as `test_nested_segments_where_no_flat_plan_fits`
        fresh = lambda params, batch: m.loss(params, batch)  # noqa: E731 (a new trace, a new program)
        return jdtr.plan(fresh, m.params, m.batch, budget=0.25, autotune=False)

    kept = planned()
    assert any(seg.children for seg in kept.segments), kept.report()  # the nesting search ran
    held = kept.program.memo.crossings.range_values
    monkeypatch.setattr(segmentation, "RANGE_VALUES_MAX", 1)
    bounded = planned()
    assert layout(bounded) == layout(kept) and bounded.compiled_bytes == kept.compiled_bytes
    assert held > 1000  # what the bound dropped
    assert len(bounded.program.memo.crossings.ranges) <= 1


def test_the_cuts_of_a_program_are_the_same_with_its_flat_cuts_kept_or_not(monkeypatch):
    """`segments` keeps, per program and saved set, its flat candidates and
    their nestings (a search cuts one body for one simulated budget at each
    nesting depth and each attempt's target): the cuts read at simulated
    budgets revisited, at several depths and targets, are those made with
    none kept."""
    from jdtr.transform import segments as segmentation
    from jdtr.transform.arguments import flatten_arguments
    from jdtr.transform.simulated_plans import plan_at
    from jdtr.transform.planning import _planning_for

    m = model("mlp")
    _, arguments = flatten_arguments(0, (m.params, m.batch), {}, eager=False)
    planning = _planning_for(lambda p, b: m.loss(p, b), 0, False, "dtr_eq", "auto", arguments)
    peak, full = planning.vg.unconstrained_peak(), planning.unconstrained

    def cuts():
        found = []
        for fraction in (0.9, 0.5, 0.3, 0.9, 0.5, 0.3):  # revisited, as a search does
            for depth, target in ((1, 0.6), (3, 0.6), (1, 0.25), (3, 0.25), (5, 0.2)):
                plan = plan_at(planning, int(fraction * peak), target * full, "dtr_eq", depth)
                found.append(None if plan is None else (plan.segments, plan.predicted_bytes))
        return found

    kept = cuts()
    assert len({k for k in kept if k is not None}) > 3  # saved sets and targets that cut differently
    assert any(seg.children for k in kept if k is not None for seg in k[0])  # nestings among them
    entries = list(planning.forward.memo.flat_cuts.values())
    assert len(entries) > 1 and any(e.memo for e in entries)
    monkeypatch.setattr(segmentation, "FLAT_CUTS_KEPT", 0)
    planning.forward.memo.flat_cuts.clear()
    assert cuts() == kept
