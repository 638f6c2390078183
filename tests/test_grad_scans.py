"""`jdtr.grad` with scans kept whole (`jdtr/transform/scan_variants.py`).

A scan of `MIN_KEPT_LENGTH` iterations or more stays one equation of the
planned program, under the scan strategy whose plan computes least. Each
test checks the gradients against `jax.grad`'s, the peak against the budget
(by the runtime's count and by `jax.live_arrays()`), and what the plan chose
against the alternatives it had.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jdtr
import jdtr.nnx
from jdtr import models
from jdtr.transform.arguments import flatten_arguments
from jdtr.transform.planner import plan_run
from jdtr.transform.scans import STRATEGIES
from jdtr.runtime import OutOfBudgetError


def assert_grads(actual, expected, rtol=1e-4, atol=1e-5):
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


def traced_for(step, *args):
    """The trace `step` made for these arguments. Its cache is shared by every
    wrapper of the same function, so it may hold other tests' traces of
    `lstm_like` too (other lengths): the first entry is not always this call's."""
    traced = step.cache.get(flatten_arguments(step.argnums, args, {}, eager=True)[1].key)
    assert traced is not None, "not traced for these arguments"
    return traced


def lstm_like(params, xs, reverse=False):
    """Two carries, two stacked outputs, a constant, and a scan inside `jax.jit`."""

    @jax.jit
    def body(h, c, xs):
        def cell(carry, x):
            h, c = carry
            z = jnp.tanh(x @ params["w"] + h @ params["u"])
            c = 0.9 * c + jnp.sin(z)
            h = jnp.tanh(c) * z
            return (h, c), (h @ params["v"], jnp.sum(z, axis=-1))

        return lax.scan(cell, (h, c), xs, reverse=reverse)

    zeros = jnp.zeros((xs.shape[1], params["u"].shape[0]))
    (h, c), (ys, sums) = body(zeros, zeros, xs)
    return jnp.mean(ys**2) + jnp.mean(h * c) + 1e-3 * jnp.sum(sums)


def lstm_arguments(steps=24, hidden=48, features=16, batch=16):
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    params = {
        "w": jax.random.normal(k[0], (features, hidden)) / 4.0,
        "u": jax.random.normal(k[1], (hidden, hidden)) / 7.0,
        "v": jax.random.normal(k[2], (hidden, 4)) / 7.0,
    }
    return params, jax.random.normal(k[3], (steps, batch, features))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("ratio", [1.0, 0.5, 0.35])
def test_a_kept_scan_matches_jax_grad_within_the_budget(ratio, reverse):
    params, xs = lstm_arguments()
    fun = lambda p, x: lstm_like(p, x, reverse)  # noqa: E731
    f = jdtr.grad(fun, budget=ratio, return_stats=True, debug=True)
    expected = jax.grad(fun)(params, xs)
    for call in range(2):  # planned step by step, then by compiled chunks
        grads, stats = f(params, xs)
        assert_grads(grads, expected)
        assert stats.peak_bytes <= stats.budget_bytes and stats.live_peak_bytes <= stats.budget_bytes
        assert stats.execution == ("steps", "chunks")[call]
    # The scan stayed one equation: the program does not grow with its 24 steps.
    online = jdtr.grad(fun, budget=ratio, return_stats=True, mode="online")(params, xs)[1]
    assert stats.equations < online.equations / 5
    assert stats.scans is not None and stats.scans.startswith("kept whole (24 iterations)")
    if ratio == 1.0:  # nothing to recompute: the scan as JAX differentiates it
        assert "every residual" in stats.scans and stats.overhead == 1.0 and stats.remat_cost == 0.0
    else:  # less kept, more recomputed, and the strategy's recomputation is counted
        assert "every residual" not in stats.scans and stats.overhead > 1.0 and stats.remat_cost > 0.0


def test_the_strategy_kept_computes_least_of_those_that_fit():
    """At each budget the plan's total compute (strategy and DTR together) is
    the least of every strategy's plan that fits (each planned alone here)."""
    params, xs = lstm_arguments()
    f = jdtr.grad(lstm_like, return_stats=True)
    for ratio in (0.6, 0.45, 0.35):
        stats = jdtr.grad(lstm_like, budget=ratio, return_stats=True)(params, xs)[1]
        traced = traced_for(f, params, xs)
        owned = [False, False, False, False]
        totals = {}
        for strategy in STRATEGIES:
            if strategy.inner:
                continue  # (with no scan in the body, the program of the same strategy without)
            program = traced.variants.program(strategy)
            try:
                plan = plan_run(program, stats.budget_bytes, "auto", "eager", owned, quick=True)
            except OutOfBudgetError:
                continue
            totals[strategy] = program.simulated_cost() + plan.counters.remat_cost
        assert totals, f"no strategy fits at {ratio}"
        baseline = traced.variants.first.simulated_cost()
        assert stats.base_cost == pytest.approx(baseline * 1e-9)
        assert stats.overhead == pytest.approx(min(totals.values()) / baseline, rel=1e-9)


def test_a_stacked_rnn_keeps_its_scans_with_the_inner_ones_under_the_strategy():
    """A scan over layers of scans over time, at 0.3 of its peak: no strategy
    of the layers' scan alone fits (each layer's backward pass makes all of
    its time steps' residuals), and the step was unrolled (a 4-layer LSTM
    of 64 steps: 12,194 equations, at 7x `jax.jit(jax.grad)`'s step). With
    the inner scans under the strategy too, the program keeps both scans."""
    m = models.stacked_lstm()
    loss, params, seq = m.loss, m.params, m.batch
    f = jdtr.grad(loss, budget=0.3, return_stats=True, debug=True)
    expected = jax.grad(loss)(params, seq)
    for _ in range(2):  # planned step by step, then by compiled chunks
        grads, stats = f(params, seq)
        assert_grads(grads, expected)
        assert stats.peak_bytes <= stats.budget_bytes and stats.live_peak_bytes <= stats.budget_bytes
    assert stats.scans.startswith("kept whole (4 iterations)") and "the scans in its body" in stats.scans
    assert stats.equations < 20


def test_a_loss_on_the_last_carry_holds_no_stacked_outputs():
    """A scan whose stacked outputs nothing reads: JAX's dead-code
    elimination drops them from the kept scan (XLA would under `jax.jit`),
    and a nested strategy reads its segments' rows of xs where they are
    instead of reshaping a copy. Before, the unread outputs and the copy
    left no strategy within half the peak, and DTR unrolled the scan."""
    params, xs = lstm_arguments(steps=64, hidden=64, features=64, batch=256)

    def last_carry(params, xs):
        def cell(h, x):
            h = jnp.tanh(x @ params["w"] + h @ params["u"])
            return h, h @ params["v"]

        h, _ = lax.scan(cell, jnp.zeros((xs.shape[1], params["u"].shape[0])), xs)
        return jnp.mean(h**2)

    # 0.55: on JAX 0.11's program (whose tanh keeps `one_minus_square` of its output per step) the
    # nested strategy needs 0.51 of the peak; on 0.10's it fits 0.5.
    step = jdtr.grad(last_carry, budget=0.55, return_stats=True, debug=True)
    grads, stats = step(params, xs)
    assert_grads(grads, jax.grad(last_carry)(params, xs))
    assert stats.scans.startswith("kept whole"), stats.scans
    assert stats.peak_bytes <= stats.budget_bytes and stats.live_peak_bytes <= stats.budget_bytes
    traced = traced_for(step, params, xs)
    stacked = (64, 256, 4)  # the cell's second output over every step, which the loss does not read
    for program in (traced.variants.first, traced.variants.program(None)):
        assert all(v.shape != stacked for item in program.body for v in item.outputs), "unread outputs were made"


def test_the_flax_lstm_keeps_its_carry():
    """The benchmark's Flax LSTM (an `nnx` module's scan), smaller."""
    model = models.flax_scan_lstm(steps=16, hidden=64, features=8, batch=16)
    expected = jax.grad(model.loss)(model.params, model.batch)
    f = jdtr.grad(model.loss, budget=0.45, return_stats=True, debug=True)
    for _ in range(2):
        grads, stats = f(model.params, model.batch)
        assert_grads(grads, expected, rtol=2e-4, atol=1e-5)
        assert stats.live_peak_bytes <= stats.budget_bytes
    assert stats.execution == "chunks" and stats.scans == "kept whole (16 iterations): each iteration saves its carry"


def test_aux_values_go_through_a_strategy():
    params, xs = lstm_arguments()

    def fun(p, x):
        loss = lstm_like(p, x)
        return loss, {"loss": loss, "name": "lstm", "steps": x.shape[0]}

    value, grads = jax.value_and_grad(fun, has_aux=True)(params, xs)
    ((_, aux), got), stats = jdtr.value_and_grad(fun, has_aux=True, budget=0.4, return_stats=True)(params, xs)
    assert "every residual" not in stats.scans
    assert_grads(got, grads)
    assert aux["name"] == "lstm" and aux["steps"] == 24 and float(aux["loss"]) == pytest.approx(float(value[0]), rel=1e-6)


def test_scans_too_big_for_every_strategy_are_unrolled():
    """A scan's stacked output that a later scan reads: kept whole, all of it
    is resident at once; unrolled, DTR evicts its items and recomputes them
    as the second scan needs them. Where no strategy fits, the plan unrolls."""
    k = jax.random.split(jax.random.PRNGKey(2), 3)
    w = jax.random.normal(k[0], (32, 32)) / 6.0
    x = jax.random.normal(k[1], (8, 32))

    def fun(w, x):
        def up(h, _):
            h = jnp.tanh(h @ w)
            return h, jnp.tile(h, (1, 16))  # a wide item per step

        def down(s, y):
            return s + jnp.sum(jnp.sin(y) ** 2), None

        _, ys = lax.scan(up, x, None, length=32)
        s, _ = lax.scan(down, 0.0, ys)
        return s

    expected = jax.grad(fun)(w, x)
    peak = jdtr.grad(fun, return_stats=True)(w, x)[1].unconstrained_peak_bytes
    for ratio in (0.5, 0.35):
        try:
            grads, stats = jdtr.grad(fun, budget=ratio, return_stats=True, debug=True)(w, x)
        except OutOfBudgetError as err:  # then it says a budget at which the call runs
            grads, stats = jdtr.grad(fun, budget=err.suggested_budget_bytes, return_stats=True, debug=True)(w, x)
        assert_grads(grads, expected)
        assert stats.live_peak_bytes <= stats.budget_bytes and stats.budget_bytes < peak
    assert stats.scans == "unrolled: no scan strategy fits"


def test_traces_with_kept_scans_do_not_keep_the_function_alive():
    import weakref

    params, xs = lstm_arguments(steps=8)

    def fun(p, x):
        return lstm_like(p, x)

    jdtr.grad(fun, budget=0.4)(params, xs)  # the strategies' programs traced
    alive = weakref.ref(fun)
    del fun
    gc.collect()
    assert alive() is None


def test_scans_policy():
    params, xs = lstm_arguments(steps=6)
    with pytest.raises(ValueError, match="unknown scans policy 'whole'"):
        jdtr.grad(lstm_like, scans="whole")
    kept = jdtr.grad(lstm_like, return_stats=True)(params, xs)[1]
    unrolled = jdtr.grad(lstm_like, return_stats=True, scans="unroll")(params, xs)[1]
    assert kept.scans == "kept whole (6 iterations): each iteration saves every residual" and unrolled.scans is None
    assert unrolled.equations > 3 * kept.equations


def test_jdtr_nnx_with_a_scan_trains_like_flax():
    """`jdtr.nnx.value_and_grad` on a module whose LSTM cell runs in a scan
    and whose BatchNorm mutates its statistics, with an aux value that is not
    an array: the strategy's program gives flax's value, gradients and state."""
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.cell = nnx.OptimizedLSTMCell(8, 32, rngs=rngs)
            self.bn = nnx.BatchNorm(32, rngs=rngs)
            self.out = nnx.Linear(32, 1, rngs=rngs)

        def __call__(self, xs):
            zeros = jnp.zeros((xs.shape[1], 32))
            _, hs = lax.scan(lambda carry, x: self.cell(carry, x), (zeros, zeros), xs)
            return self.out(self.bn(hs[-1]))

    def loss(model, xs):
        y = model(xs)
        return jnp.mean(y**2), y.shape[0]

    xs = jax.random.normal(jax.random.PRNGKey(0), (16, 8, 8))
    flax_model, model = Model(nnx.Rngs(0)), Model(nnx.Rngs(0))
    (value, aux), grads = nnx.value_and_grad(loss, has_aux=True)(flax_model, xs)
    ((got_value, got_aux), got), stats = jdtr.nnx.value_and_grad(loss, has_aux=True, budget=0.5, return_stats=True)(model, xs)
    assert "every residual" not in stats.scans and got_aux == aux == 8
    assert float(got_value) == pytest.approx(float(value), rel=1e-6)
    assert_grads(nnx.state(got), nnx.state(grads))
    assert_grads(nnx.state(model, nnx.BatchStat), nnx.state(flax_model, nnx.BatchStat))
