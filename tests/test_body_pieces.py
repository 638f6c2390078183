"""A scan's body run in rematerialized pieces (`jdtr/transform/body_pieces.py`).

Where one iteration's working set is what a budget cannot hold (a block of
a transformer, scanned), the "pieces" strategy cuts the body where little
crosses and rematerializes each piece alone: each iteration keeps the
pieces' inputs, and its backward pass holds one piece's residuals. These
tests check its gradients against `jax.grad`, its compiled bytes against
the "carry" strategy's and against what it says it holds, where it cuts, and
that both planners take it where it fits and nothing before it does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import jdtr
from jdtr.transform._jax_core import scan_layout
from jdtr.transform.body_pieces import cut_body, estimate
from jdtr.transform.scans import ScanStrategy, body_cut, hidden_residuals, run_scan

from test_plan import assert_trees_close, compiled_total

SUBLAYERS, WIDTH, WIDE = 4, 32, 256


def _wide_blocks(layers=4, batch=512):
    """A residual stack in `lax.scan` whose blocks are `SUBLAYERS` wide MLPs:
    an iteration's residuals are many times its carry, a sub-layer's are
    a quarter of them."""
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.random.normal(k[0], (layers, SUBLAYERS, WIDTH, WIDE)) / WIDTH**0.5,
        "w2": jax.random.normal(k[1], (layers, SUBLAYERS, WIDE, WIDTH)) / WIDE**0.5,
    }
    x = jax.random.normal(k[2], (batch, WIDTH))

    def block(h, w):
        for i in range(SUBLAYERS):
            h = h + jnp.tanh(jnp.tanh(h @ w["w1"][i]) @ w["w2"][i])
        return h, None

    def loss(p, x):
        return jnp.mean(lax.scan(block, x, p)[0] ** 2)

    return loss, params, x


def _layout(loss, *args):
    (eqn,) = [e for e in jax.make_jaxpr(loss)(*args).jaxpr.eqns if e.primitive.name == "scan"]
    return scan_layout(eqn.params)


def _under(layout, strategy):
    """The wide-blocks loss with its scan run under `strategy` (no consts: carry, then the stacked weights)."""

    def loss(p, x):
        outs = run_scan(layout, strategy, x, *jax.tree_util.tree_leaves(p))
        return jnp.mean(outs[0] ** 2)

    return loss


def test_pieces_hold_one_pieces_residuals_where_the_carry_strategy_holds_an_iterations():
    """Compiled, the pieces' step holds what the carry strategy's does, less
    one iteration's residuals and plus the largest piece's and the pieces'
    inputs of every iteration. (Each piece under `jax.checkpoint` instead
    held the whole iteration's again: XLA ran every recomputation first.)"""
    loss, params, x = _wide_blocks()
    layout = _layout(loss, params, x)
    pieces = body_cut(layout, ScanStrategy("pieces"))
    assert pieces is not None and len(pieces.pieces) >= 2
    planned = _under(layout, ScanStrategy("pieces"))
    assert_trees_close(jax.grad(planned)(params, x), jax.grad(loss)(params, x), rtol=1e-5, atol=1e-6)

    carry = compiled_total(jax.grad(_under(layout, ScanStrategy("carry"))), params, x)
    ours = compiled_total(jax.grad(planned), params, x)
    rows = [jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for v in jax.tree_util.tree_leaves(params)]
    whole, _ = hidden_residuals(lambda *a: list(pieces.function()(*a)), [jax.ShapeDtypeStruct(x.shape, x.dtype), *rows])
    largest = max(hidden_residuals(fn, specs)[0] for fn, specs in pieces.each_piece())
    inputs = 4 * sum(aval.size * aval.dtype.itemsize for aval, _ in pieces.saved_inputs())  # 4 iterations
    iteration = sum(hidden_residuals(fn, specs)[0] for fn, specs in pieces.each_piece())
    assert whole == sum(aval.size * aval.dtype.itemsize for aval, _ in pieces.saved_inputs())
    assert ours <= carry - (iteration - largest) // 2 + inputs
    assert ours < carry


def test_the_cuts_fall_where_only_the_carry_crosses():
    """Cut between sub-layers, a piece's inputs are the residual stream
    alone (the stacked weights' rows are the scan's to forward, not saved);
    cut inside one, its wide hidden layer would be saved per iteration."""
    loss, params, x = _wide_blocks()
    pieces = body_cut(_layout(loss, params, x), ScanStrategy("pieces"))
    saved = pieces.saved_inputs()
    assert len(saved) == len(pieces.pieces) - 1
    assert all(aval.shape == x.shape for aval, _ in saved)


def test_the_estimate_counts_the_cuts_for_every_held_iteration_and_the_largest_piece():
    made, crossing = [4, 4, 4, 4], [0, 1, 2, 1]
    assert estimate(made, crossing, (), 3) == 16
    assert estimate(made, crossing, (2,), 3) == 3 * 2 + 8
    assert estimate(made, crossing, (1, 3), 3) == 3 * (1 + 1) + 8
    assert estimate(made, crossing, (1, 2, 3), 10) == 10 * 4 + 4


def test_bodies_with_effects_or_one_step_run_whole():
    """A piece would run a body's effects again, and one equation has no
    cut: those bodies stay whole, and "pieces" runs them as "carry" does."""
    xs = jnp.arange(32.0).reshape(16, 2)

    def printing(c, x):
        jax.debug.callback(lambda v: None, x)
        return jnp.tanh(c * x), None

    def single(c, x):
        return c * x, None

    for body in (printing, single):
        loss = lambda c, xs: jnp.sum(lax.scan(body, c, xs)[0])  # noqa: B023, E731
        layout = _layout(loss, jnp.ones(2), xs)
        assert cut_body(layout.body, layout.num_consts, layout.num_carry, 16) is None
        assert body_cut(layout, ScanStrategy("pieces")) is None


def test_plan_and_grad_run_the_scan_in_pieces_between_the_two_floors():
    """At a budget below the carry strategy's step and above the pieces',
    `jdtr.plan` and `jdtr.grad` both keep the scan in pieces (the first
    strategy that fits), within the budget, with `jax.grad`'s gradients; a
    policy cannot say it."""
    loss, params, x = _wide_blocks(layers=8)
    layout = _layout(loss, params, x)
    full = compiled_total(jax.grad(loss), params, x)
    carry, pieces = (compiled_total(jax.grad(_under(layout, ScanStrategy(s))), params, x) for s in ("carry", "pieces"))
    assert pieces < carry
    budget = (carry + pieces) / 2 / full
    reference = jax.grad(loss)(params, x)

    plan = jdtr.plan(loss, params, x, budget=budget, autotune=False)
    assert [k.strategy for k in plan.scans] == [ScanStrategy("pieces")]
    assert plan.compiled_bytes == compiled_total(plan.grad, params, x) <= budget * full
    assert_trees_close(jax.jit(plan.grad)(params, x), reference, rtol=1e-5, atol=1e-6)
    with pytest.warns(jdtr.PolicyWarning, match="pieces"):
        plan.policy

    grads, stats = jdtr.grad(loss, budget=budget, return_stats=True, debug=True)(params, x)
    assert "pieces" in stats.scans, stats.scans
    assert stats.live_peak_bytes <= stats.budget_bytes
    assert_trees_close(grads, reference, rtol=1e-5, atol=1e-6)


def test_pieces_with_no_cut_are_the_carry_strategy_to_the_planner():
    """A body no cut helps (an RNN cell: every value crosses) runs "pieces"
    as "carry", and the planner does not plan that program twice."""
    from jdtr import models
    from jdtr.transform.normalize import normalize
    from jdtr.transform.scans import as_run, kept_scans

    def equations(loss, *args):
        return kept_scans(normalize(jax.make_jaxpr(loss)(*args), keep_scans=True)).values()

    m = models.rnn(steps=16, hidden=32, features=8, batch=4)
    loss, params, x = _wide_blocks()
    for levels in (1, 2):
        pieces = ScanStrategy("pieces", levels)
        assert as_run(pieces, equations(m.loss, m.params, m.batch)) == ScanStrategy("carry", levels)
        assert as_run(pieces, equations(loss, params, x)) == ScanStrategy("pieces")  # 4 iterations: one level


def test_jdtr_grad_traces_pieces_only_where_a_body_is_cut():
    """`jdtr.grad`'s strategy search reads the user's scan bodies: where none
    has a cut it takes "pieces" for "carry" and neither traces nor plans it
    (before, a tight budget traced and planned the same program twice)."""
    from jdtr import models

    m = models.rnn(steps=16, hidden=32, features=8, batch=4)
    loss, params, x = _wide_blocks()
    for fun, args, cut in ((m.loss, (m.params, m.batch), False), (loss, (params, x), True)):
        jdtr.grad(fun, budget=1.0)(*args)  # traced; its variants are the function's, shared by budgets
        step = jdtr.grad(fun, budget=0.6, return_stats=True)
        variants = next(iter(step.cache.values())).variants
        traced, trace = [], variants.trace
        variants.trace = lambda s, trace=trace, traced=traced: traced.append(s) or trace(s)
        for levels in (1, 2):
            assert variants.effective(ScanStrategy("pieces", levels)).saves == ("pieces" if cut else "carry")
        grads, stats = step(*args)
        assert_trees_close(grads, jax.grad(fun)(*args), rtol=1e-4, atol=1e-5)
        if not cut:  # no strategy fits the RNN at 0.6: the search went through them all
            assert stats.scans.startswith("unrolled"), stats.scans
            assert ScanStrategy("carry") in traced and not any(s.saves == "pieces" for s in traced), traced
