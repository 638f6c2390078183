"""`jdtr.grad(..., chunks="whole")`: a planned step run as one XLA program,
the compiled path's plan at the call's budget in bytes, where XLA's own
analysis of it fits that budget; the planned run in chunks elsewhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jdtr
import jdtr.nnx
from jdtr import models
from leaks import assert_intact_and_released, live_ids
from program_strategies import assert_trees_close


@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_a_step_that_fits_as_one_program_runs_as_one_within_the_budget(ratio):
    m = models.mlp_chain(layers=16, width=64, batch=256)
    expected = jax.grad(m.loss)(m.params, m.batch)
    leaves = jax.tree_util.tree_leaves((m.params, m.batch))
    copies = [np.asarray(x) for x in leaves]
    step = jdtr.grad(m.loss, budget=ratio, chunks="whole", return_stats=True, debug=True)
    before = live_ids()
    for call in range(2):
        grads, stats = step(m.params, m.batch)
        assert stats.execution == "whole" and stats.chunks == 1, stats
        assert stats.peak_bytes <= stats.budget_bytes and stats.live_peak_bytes <= stats.budget_bytes, stats
        assert (stats.rematerializations > 0) == (ratio < 1.0), stats
        assert stats.planning_time_s > 0 if call == 0 else stats.planning_time_s == 0, stats
        assert_trees_close(grads, expected)
    assert jdtr.cache_info().whole_steps >= 1  # (its code's bytes: 0 on the CPU, which reports none)
    # Its bytes are XLA's for the compiled path's plan at the same budget (the
    # loss's value, not asked for, is one scalar more).
    plan = jdtr.plan(m.loss, m.params, m.batch, budget=stats.budget_bytes, autotune=False)
    assert 0 <= stats.peak_bytes - plan.compiled_bytes <= 64, (stats.peak_bytes, plan.compiled_bytes)
    # The caller's arrays intact, nothing left behind.
    assert_intact_and_released(leaves, copies, grads, before)
    jdtr.clear_caches()
    assert jdtr.cache_info().whole_steps == 0


@pytest.mark.parametrize("ratio", [0.4, 0.3])
def test_where_no_plan_fits_as_one_program_it_runs_in_chunks(ratio):
    """One program exactly where the compiled path has a plan at the budget
    (here, at 0.3 of the peak, it has none: XLA's floor for the step is
    higher than the planned run's); compiled chunks, as `"always"`, elsewhere."""
    m = models.mlp_chain(layers=16, width=64, batch=256)
    # (one heuristic that plans 0.3: the portfolio's refinement runs the solver, a minute here)
    step = jdtr.grad(m.loss, budget=ratio, chunks="whole", heuristic="msps", return_stats=True, debug=True)
    budget = step(m.params, m.batch)[1].budget_bytes
    try:
        fits = jdtr.plan(m.loss, m.params, m.batch, budget=budget, heuristic="msps", autotune=False).compiled_bytes <= budget
    except jdtr.OutOfBudgetError:
        fits = False
    assert fits or ratio < 0.4  # (both cases are met, on the JAX versions tried)
    for _ in range(2):
        grads, stats = step(m.params, m.batch)
        assert stats.execution == ("whole" if fits else "chunks"), stats
        assert stats.peak_bytes <= stats.budget_bytes and stats.live_peak_bytes <= stats.budget_bytes, stats
    assert_trees_close(grads, jax.grad(m.loss)(m.params, m.batch))


def test_value_aux_and_argnums_as_one_program():
    def loss(a, b, x):
        h = jnp.tanh(x @ a["w1"]) * jax.nn.sigmoid(x @ b)
        out = h @ a["w2"]
        return jnp.mean(out**2), {"norm": jnp.linalg.norm(h, axis=-1).mean(), "count": jnp.int32(3)}

    k = jax.random.split(jax.random.PRNGKey(0), 4)
    a = {"w1": jax.random.normal(k[0], (32, 128)) * 0.2, "w2": jax.random.normal(k[1], (128, 8)) * 0.2}
    b, x = jax.random.normal(k[2], (32, 128)) * 0.2, jax.random.normal(k[3], (512, 32))
    expected = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(a, b, x)
    for value in (True, False):
        make = jdtr.value_and_grad if value else jdtr.grad
        step = make(loss, argnums=(0, 1), has_aux=True, budget=0.75, chunks="whole", return_stats=True)
        for _ in range(2):
            got, stats = step(a, b, x)
            assert stats.execution == "whole" and stats.peak_bytes <= stats.budget_bytes, stats
        if value:
            (v, aux), grads = got
            np.testing.assert_allclose(v, expected[0][0], rtol=1e-5)
        else:
            grads, aux = got
        assert aux["count"] == 3
        np.testing.assert_allclose(aux["norm"], expected[0][1]["norm"], rtol=1e-5)
        assert_trees_close(grads, expected[1])


def test_steps_that_depend_on_how_a_run_is_cut_keep_the_planned_run():
    """A `cond` on data (planned per path), an effect (run once, pinned), and
    an aux value with a leaf `jax.jit` cannot return (a string)."""
    ws = [jax.random.normal(jax.random.PRNGKey(i), (64, 64)) * 0.2 for i in range(8)]
    x = jax.random.normal(jax.random.PRNGKey(9), (256, 64))
    seen = []

    def branching(ws, x):
        for i, w in enumerate(ws):
            x = jnp.tanh(x @ w)
            if i == 3:
                x = jax.lax.cond(jnp.mean(x) > 0, lambda h: h * 0.5, lambda h: h * 2.0, x)
        return jnp.mean(x**2)

    def effectful(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        jax.debug.callback(lambda v: seen.append(float(v)), jnp.mean(x))
        return jnp.mean(x**2)

    def labelled(ws, x):
        return branching(ws[:3] + ws[4:], x), "a label"

    for loss, has_aux in ((branching, False), (effectful, False), (labelled, True)):
        step = jdtr.grad(loss, budget=0.5, chunks="whole", has_aux=has_aux, return_stats=True)
        for _ in range(2):
            got, stats = step(ws, x)
            assert stats.execution == "chunks", (loss.__name__, stats)
        if has_aux:
            got, label = got
            assert label == "a label"
        assert_trees_close(got, jax.grad(loss, has_aux=has_aux)(ws, x)[0] if has_aux else jax.grad(loss)(ws, x))
    assert len(seen) == 3  # jax.grad's once, each of the two calls' once


def test_nnx_and_a_bad_policy():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(64, 64, rngs=rngs) for _ in range(6)])

        def __call__(self, x):
            for layer in self.layers:
                x = jnp.tanh(layer(x))
            return x

    model, x = Net(nnx.Rngs(0)), jax.random.normal(jax.random.PRNGKey(1), (512, 64))
    objective = lambda net, x: jnp.mean(net(x) ** 2)  # noqa: E731
    expected = nnx.grad(objective)(model, x)
    for _ in range(2):
        got, stats = jdtr.nnx.grad(objective, budget=0.5, chunks="whole", return_stats=True)(model, x)
        assert stats.execution == "whole" and stats.peak_bytes <= stats.budget_bytes, stats
    assert_trees_close(nnx.state(got), nnx.state(expected))
    with pytest.raises(ValueError, match="whole"):
        jdtr.grad(objective, chunks="entire")
