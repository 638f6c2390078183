"""Values without a derivative in planned segments: `stop_gradient` and
inputs not differentiated, read by what JAX cannot differentiate (a
`while_loop`), as in spectral normalisation's power iteration.

A protected segment's inputs, and the operand the "select" gate taints,
entered as values JAX differentiates, so a `while_loop` on `stop_gradient`
of the weights, nested two segments deep, failed to trace: "Reverse-mode
differentiation does not work for lax.while_loop" (`checkpoint.py`,
`tangent_carriers`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdtr
from jdtr.transform import checkpoint, planning


def _spectral_norm(w):
    """`w` over its largest singular value, by 10 steps of power iteration
    in a `while_loop` on `stop_gradient(w)` (the iteration carries no derivative)."""
    frozen = jax.lax.stop_gradient(w)

    def body(carry):
        u, v, i = carry
        v = frozen.T @ u
        v = v / jnp.linalg.norm(v)
        u = frozen @ v
        return u / jnp.linalg.norm(u), v, i + 1

    n = w.shape[0]
    u, v, _ = jax.lax.while_loop(lambda c: c[2] < 10, body, (jnp.ones(n) / n, jnp.ones(n) / n, 0))
    return w / (u @ w @ v)


def _model():
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    ws = [jax.random.normal(keys[i], (64, 64)) * 0.3 for i in range(4)]
    x = jax.random.normal(keys[4], (128, 64))

    def loss(ws, x):
        for w in ws:
            x = jax.nn.leaky_relu(x @ _spectral_norm(w))
        return jnp.mean(x**2)

    return loss, ws, x


def _close(actual, expected):
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-4, atol=1e-9)


def _segments_at(loss, ws, x, budget, monkeypatch):
    """The program and segments the planner measured first at `budget`."""
    seen = []
    real = planning.run_segments

    def recording(program, segments, *args, **kwargs):
        seen.append((program, segments))
        return real(program, segments, *args, **kwargs)

    monkeypatch.setattr(planning, "run_segments", recording)
    try:
        jdtr.plan(loss, ws, x, budget=budget, autotune=False)
    except jdtr.OutOfBudgetError:
        pass  # (what matters is the plans it traced on the way)
    return seen


@pytest.mark.parametrize("gate", ["auto", "cond"])
def test_a_while_loop_on_stop_gradient_runs_in_nested_protected_segments(gate, monkeypatch):
    loss, ws, x = _model()
    expected = jax.grad(loss)(ws, x)
    traced = _segments_at(loss, ws, x, 0.5, monkeypatch)
    nested = [(p, s) for p, s in traced if max(seg.depth for seg in s) > 1]
    assert nested, "the premise: a plan nesting its segments"
    program, segments = nested[0]
    leaves = [*ws, x]

    def f(*leaves):
        return checkpoint.run_segments(program, segments, leaves, "protected", gate, False, [True] * 4 + [False])[0]

    _close(jax.jit(jax.grad(f, (0, 1, 2, 3)))(*leaves), expected)


def test_plans_of_a_spectrally_normalised_mlp_give_jax_grads():
    loss, ws, x = _model()
    expected = jax.grad(loss)(ws, x)
    try:
        plan = jdtr.plan(loss, ws, x, budget=0.5, autotune=False)
    except jdtr.OutOfBudgetError as err:  # (never the ValueError of before)
        plan = jdtr.plan(loss, ws, x, budget=err.suggested_budget_bytes, autotune=False)
    _close(jax.jit(plan.grad)(ws, x), expected)
    _close(jdtr.grad(loss, budget=1.0)(ws, x), expected)


def test_tangent_carriers_leave_out_stop_gradient_and_inputs_not_differentiated(monkeypatch):
    """What carries a derivative: the weights and what they make, but not
    `stop_gradient` of them nor what the power iteration makes of that;
    the batch only where it may be differentiated."""
    loss, ws, x = _model()
    (program, _), *_ = _segments_at(loss, ws, x, 0.5, monkeypatch)
    carriers = checkpoint.tangent_carriers(program, [True] * 4 + [False])
    equations = [item for item in program.body if hasattr(item, "name")]
    frozen = {v for item in equations if item.name == "stop_gradient" for v in item.outputs}
    iterated = {v for item in equations if item.name == "while" for v in item.outputs}
    assert len(frozen) == len(iterated) / 3 == 4 and not (frozen | iterated) & carriers
    assert set(program.inputs[:4]) <= carriers and program.inputs[4] not in carriers
    assert set(program.outputs[:1]) <= carriers  # the loss
    assert program.inputs[4] in checkpoint.tangent_carriers(program, None)
