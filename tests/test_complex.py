"""Programs with complex values (FFTs, spectral layers): plans that save
them, policies that meet them, and `jdtr.grad` through them, against
`jax.grad`.

`jax.checkpoint` rounds what it saves with `reduce_precision`, which
refuses complex dtypes: a policy saving a complex value failed to trace
("reduce_precision does not accept dtype complex64"), an FNO-style model's
`remat_grad` among them (`transform/save_policy.py`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdtr
from jdtr.transform import save_policy
from jdtr.transform.program import Equation

N = 256


def _spectral(layers: int = 6, batch: int = 8):
    """A chain of spectral layers: FFT, a complex filter, a square, back."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2 * layers + 1)
    params = [(jax.random.normal(keys[i], (N // 2 + 1,)) * 0.3, jax.random.normal(keys[layers + i], (N // 2 + 1,)) * 0.3)
              for i in range(layers)]
    x = jax.random.normal(keys[-1], (batch, N))

    def loss(params, x):
        h = x
        for a, b in params:
            z = jnp.fft.rfft(h) * (a + 1j * b)
            z = z * jnp.conj(z) * 0.1 + z
            h = jnp.tanh(jnp.fft.irfft(z, n=N)) + h
        return jnp.mean(h**2)

    return loss, params, x


def _close(actual, expected):
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=2e-4, atol=1e-6)


def test_a_complex_value_a_plan_saves_is_saved_as_its_two_parts():
    """A plan whose segment saves a complex value inside it (the filter's
    output): before, tracing its step failed in `jax.checkpoint`; now the
    value is saved as its real and imaginary parts, with `jax.grad`'s
    gradients."""
    loss, params, x = _spectral()
    plan = jdtr.plan(loss, params, x, budget=0.6, autotune=False)
    seg = max(plan.segments, key=lambda s: s.stop - s.start)
    inside = [v for item in plan.program.body[seg.start : seg.stop] if isinstance(item, Equation) for v in item.outputs]
    complex_values = [v for v in inside if jnp.issubdtype(v.dtype, jnp.complexfloating) and v not in seg.outputs]
    assert complex_values, "the premise: a complex value inside a segment"
    value = complex_values[len(complex_values) // 2]
    saving = dataclasses.replace(seg, saved=(*seg.saved, value), recomputed=tuple(v for v in seg.recomputed if v != value))
    changed = dataclasses.replace(plan, segments=tuple(saving if s is seg else s for s in plan.segments))
    _close(jax.jit(changed.grad)(params, x), jax.grad(loss)(params, x))


def test_policies_save_no_value_an_equation_may_make_complex():
    """JAX's own rules (a kept scan's "all" strategy) and signatures leave
    out equations that may make complex values: the function traces, with
    `jax.grad`'s gradients; a complex value saved by name is saved by its
    parts."""
    x = jax.random.normal(jax.random.PRNGKey(1), (4, N))

    def f(x):
        z = jnp.fft.rfft(jnp.sin(x))
        z = save_policy.named(z * z, "jdtr:7")
        return jnp.sum(jnp.fft.irfft(z, n=N) ** 2)

    expected = jax.grad(f)(x)
    for policy in (save_policy.EVERYTHING, save_policy.DOTS, save_policy.SavePolicy(frozenset({"jdtr:7"}))):
        _close(jax.grad(jax.checkpoint(f, policy=policy))(x), expected)
    call = jax.make_jaxpr(jnp.fft.rfft)(x).eqns[-1]  # a `jit` of the `fft`
    for fft in (call, call.params["jaxpr"].eqns[0]):
        signature = jdtr.transform.program.signature(fft.primitive.name, [v.aval for v in fft.invars])
        policy = save_policy.SavePolicy(signatures=frozenset({signature}))
        assert not policy(fft.primitive, *[v.aval for v in fft.invars], **fft.params)
    sin = jax.make_jaxpr(jnp.sin)(x).eqns[0]
    assert save_policy.SavePolicy(signatures=frozenset({jdtr.transform.program.signature("sin", [sin.invars[0].aval])}))(
        sin.primitive, sin.invars[0].aval, **sin.params)
    assert save_policy.value_id("jdtr:12/re") == save_policy.value_id("jdtr:12") == 12
    # JAX's premise, while it holds: its own rule saving the complex product fails.
    try:
        jax.grad(jax.checkpoint(f, policy=jax.checkpoint_policies.everything_saveable))(x)
    except TypeError as err:
        assert "reduce_precision" in str(err)


@pytest.mark.parametrize("budget", [0.7, 0.5])
def test_jdtr_grad_and_remat_grad_of_a_spectral_model(budget):
    loss, params, x = _spectral()
    expected = jax.grad(loss)(params, x)
    f = jdtr.grad(loss, budget=budget, return_stats=True)
    for _ in range(2):  # step by step, then in chunks
        grads, stats = f(params, x)
        _close(grads, expected)
        assert stats.peak_bytes <= stats.budget_bytes
    try:
        plan = jdtr.plan(loss, params, x, budget=budget)
    except jdtr.OutOfBudgetError as err:
        plan = jdtr.plan(loss, params, x, budget=err.suggested_budget_bytes)
    _close(jax.jit(plan.grad)(params, x), expected)
    assert plan.compiled_bytes <= plan.budget_bytes
