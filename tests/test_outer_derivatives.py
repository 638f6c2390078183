"""`remat_grad` differentiated again, as `jax.grad` is: with respect to what
it does not differentiate too (a gradient penalty's parameters, the inputs
of a double-backprop loss), under `jax.grad`, `jax.jvp` and `jax.jit`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jdtr
from jdtr.transform import checkpoint_plan
from program_strategies import assert_trees_close

KEY = jax.random.PRNGKey(0)
WS = [jax.random.normal(jax.random.fold_in(KEY, i), (64, 64)) * 64**-0.5 for i in range(8)]
X = jax.random.normal(jax.random.fold_in(KEY, 99), (1024, 64))


def critic(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x) / x.shape[0]


def loss(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.mean(x**2)


def planned_segments(fun, *args, **options) -> int:
    plan = jdtr.plan(fun, *args, budget=0.8, autotune=False, **options)
    return len(plan.segments)


def count_planned_runs(monkeypatch) -> list:
    """The planned forward's runs (the segments), as `Plan` makes them."""
    runs = []
    real = checkpoint_plan.run_segments

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_plan, "run_segments", counted)
    return runs


def test_a_gradient_penalty_differentiated_by_the_critic_s_parameters():
    """WGAN-GP: the penalty is the norm of the critic's gradient with
    respect to its input, differentiated by its parameters, which the inner
    gradient does not differentiate (they entered its segments through
    `stop_gradient`, and their derivatives were zero)."""
    assert planned_segments(critic, WS, X, argnums=1) > 0

    def penalty(grad_of_input):
        def objective(ws, x):
            g = grad_of_input(ws, x)
            return jnp.mean((jnp.sqrt(jnp.sum(g**2, axis=1) + 1e-12) - 1.0) ** 2)

        return objective

    planned = penalty(jdtr.remat_grad(critic, argnums=1, budget=0.8, autotune=False))
    reference = penalty(jax.grad(critic, argnums=1))
    expected = jax.grad(reference)(WS, X)
    assert max(float(jnp.abs(g).max()) for g in expected) > 1e-4  # (the derivative is not zero)
    assert_trees_close(jax.grad(planned)(WS, X), expected)
    assert_trees_close(jax.jit(jax.grad(planned))(WS, X), expected)
    # Both leaves differentiated by the outer level.
    assert_trees_close(jax.grad(planned, argnums=(0, 1))(WS, X), jax.grad(reference, argnums=(0, 1))(WS, X))


def test_double_backprop_by_the_inputs_under_grad_jit_and_jvp():
    step = jdtr.remat_grad(loss, budget=0.8, autotune=False)
    assert planned_segments(loss, WS, X) > 0

    def norm_of(grad):
        return lambda x: sum(jnp.sum(g**2) for g in grad(WS, x))

    expected = jax.grad(norm_of(jax.grad(loss)))(X)
    assert float(jnp.abs(expected).max()) > 0
    assert_trees_close(jax.grad(norm_of(step))(X), expected)
    # Staged first, differentiated after: the outer level sees the jitted step's jaxpr.
    assert_trees_close(jax.grad(norm_of(jax.jit(step)))(X), expected)
    tangent = jnp.ones_like(X)
    got = jax.jvp(lambda x: step(WS, x), (X,), (tangent,))
    want = jax.jvp(lambda x: jax.grad(loss)(WS, x), (X,), (tangent,))
    assert_trees_close(got, want)


def test_a_second_order_step_by_the_differentiated_arguments_keeps_the_plan(monkeypatch):
    """MAML: the outer level differentiates the inner gradient by the
    parameters the inner one differentiates, whose derivatives the segments
    carry: the rule is the planned step's (the plan's memory); by the data,
    `jax.grad`'s without the plan."""
    step = jdtr.remat_grad(loss, budget=0.8, autotune=False)
    step(WS, X)  # (planned: what follows counts the runs of the step alone)
    runs = count_planned_runs(monkeypatch)

    def adapted(grad):
        return lambda ws, x: loss([w - 0.1 * g for w, g in zip(ws, grad(ws, x))], x)

    assert_trees_close(jax.grad(adapted(step))(WS, X), jax.grad(adapted(jax.grad(loss)))(WS, X))
    assert runs, "the outer derivative by the parameters ran without the plan"
    runs.clear()
    got = jax.grad(adapted(step), argnums=1)(WS, X)
    assert_trees_close(got, jax.grad(adapted(jax.grad(loss)), argnums=1)(WS, X))
    assert not runs, "the outer derivative by the data ran through the plan's segments"


def test_an_aux_value_differentiated_again():
    def with_aux(ws, x):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2), jnp.mean(jax.lax.stop_gradient(h) * h)

    step = jdtr.remat_value_and_grad(with_aux, has_aux=True, budget=0.8, autotune=False)
    assert planned_segments(with_aux, WS, X, has_aux=True) > 0

    def of_aux(value_and_grad):
        return lambda ws: value_and_grad(ws, X)[0][1]

    expected = jax.grad(of_aux(jax.value_and_grad(with_aux, has_aux=True)))(WS)
    assert max(float(jnp.abs(g).max()) for g in expected) > 0
    assert_trees_close(jax.grad(of_aux(step))(WS), expected)


def test_the_planned_step_compiles_as_before():
    """The outer rule is a `custom_jvp`: without an outer level, the step's
    program (and bytes) is the plan's."""
    plan = jdtr.plan(loss, WS, X, budget=0.8, autotune=False)
    compiled = jax.jit(plan.grad).lower(WS, X).compile().memory_analysis()
    nbytes = compiled.argument_size_in_bytes + compiled.output_size_in_bytes + compiled.temp_size_in_bytes
    assert nbytes - compiled.alias_size_in_bytes == plan.compiled_bytes
    np.testing.assert_allclose(
        np.concatenate([np.ravel(g) for g in plan.grad(WS, X)]),
        np.concatenate([np.ravel(g) for g in jax.grad(loss)(WS, X)]),
        rtol=1e-5, atol=1e-7,
    )
