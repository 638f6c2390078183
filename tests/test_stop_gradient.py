"""Values without a derivative in planned segments: `stop_gradient` and
inputs not differentiated, read by what JAX cannot differentiate (a
`while_loop`), as in spectral normalisation's power iteration.

A protected segment's inputs, and the operand the "select" gate taints,
entered as values JAX differentiates, so a `while_loop` on `stop_gradient`
of the weights, nested two segments deep, failed to trace: "Reverse-mode
differentiation does not work for lax.while_loop" (`checkpoint.py`,
`tangent_carriers`). So did its dual, a segment's outputs: the iteration run
on the weights themselves and `stop_gradient` taken of its result in the
next segment (`cotangent_receivers`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import pytest

import jdtr
from jdtr.transform import checkpoint, planning
from jdtr.transform.program import Equation
from jdtr.transform.segments import Segment


def _power_iteration(w):
    """The singular vectors of `w`'s largest singular value, by 10 steps of
    power iteration in a `while_loop`."""

    def body(carry):
        u, v, i = carry
        v = w.T @ u
        v = v / jnp.linalg.norm(v)
        u = w @ v
        return u / jnp.linalg.norm(u), v, i + 1

    n = w.shape[0]
    u, v, _ = jax.lax.while_loop(lambda c: c[2] < 10, body, (jnp.ones(n) / n, jnp.ones(n) / n, 0))
    return u, v


def _spectral_norm(w):
    """`w` over its largest singular value, the iteration on
    `stop_gradient(w)` (it carries no derivative)."""
    u, v = _power_iteration(jax.lax.stop_gradient(w))
    return w / (u @ w @ v)


def _iterated_then_stopped(w):
    """`_spectral_norm` as it is also written: the power iteration on `w`
    itself, `stop_gradient` of what it finds. The loop carries a derivative
    that no cotangent reaches; `jax.grad` never transposes it."""
    u, v = jax.lax.stop_gradient(_power_iteration(w))
    return w / (u @ w @ v)


def _model(normalise=_spectral_norm):
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    ws = [jax.random.normal(keys[i], (64, 64)) * 0.3 for i in range(4)]
    x = jax.random.normal(keys[4], (128, 64))

    def loss(ws, x):
        for w in ws:
            x = jax.nn.leaky_relu(x @ normalise(w))
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


def _one_segment_per_equation(program):
    """Every equation of the forward body in a checkpoint of its own: a cut
    between each loop and the `stop_gradient` of its result."""
    last = {v: i for i, item in enumerate(program.body) for v in item.args}
    last.update((v, len(program.body)) for v in program.outputs if not hasattr(v, "value"))
    segments = []
    for i, item in enumerate(program.body):
        assert isinstance(item, Equation)
        outputs = tuple(v for v in item.outputs if last.get(v, -1) > i)
        segments.append(Segment(i, i, i + 1, tuple(dict.fromkeys(item.args)), outputs, (), ()))
    return segments


@pytest.mark.parametrize("gate", ["auto", "cond", "taint"])
def test_a_while_loop_whose_result_is_stopped_runs_in_a_segment_of_its_own(gate, monkeypatch):
    loss, ws, x = _model(_iterated_then_stopped)
    expected = jax.grad(loss)(ws, x)
    (program, _), *_ = _segments_at(loss, ws, x, 0.5, monkeypatch)
    segments = _one_segment_per_equation(program)
    loops = [seg for seg in segments if program.body[seg.start].name == "while"]
    assert len(loops) == 4 and all(seg.outputs for seg in loops)  # the premise: each loop's result leaves its segment

    def f(*leaves):
        return checkpoint.run_segments(program, segments, leaves, "protected", gate, False, [True] * 4 + [False])[0]

    _close(jax.jit(jax.grad(f, (0, 1, 2, 3)))(*ws, x), expected)
    def plain(*leaves):
        return checkpoint.run_segments(program, segments, leaves, "checkpoint", gate, False, None)[0]

    _close(jax.grad(plain, (0, 1, 2, 3))(*ws, x), expected)


def test_plans_of_a_spectral_norm_iterated_on_the_weights_give_jax_grads():
    loss, ws, x = _model(_iterated_then_stopped)
    expected = jax.grad(loss)(ws, x)
    for budget in (0.9, 0.7):
        try:
            plan = jdtr.plan(loss, ws, x, budget=budget, autotune=False)
        except jdtr.OutOfBudgetError as err:
            plan = jdtr.plan(loss, ws, x, budget=err.suggested_budget_bytes, autotune=False)
        assert plan.segments, plan.origin  # (the premise: a plan with checkpoints)
        _close(jax.jit(plan.grad)(ws, x), expected)


def test_cotangent_receivers_leave_out_what_only_stop_gradient_reads(monkeypatch):
    """What a cotangent reaches: the loss and what makes it, the weights
    among them, but not the loops' results, read by `stop_gradient` alone;
    with every output differentiated (`differentiated=None`), the same here."""
    loss, ws, x = _model(_iterated_then_stopped)
    (program, _), *_ = _segments_at(loss, ws, x, 0.5, monkeypatch)
    receivers = checkpoint.cotangent_receivers(program, [True] * 4 + [False])
    equations = [item for item in program.body if isinstance(item, Equation)]
    iterated = {v for item in equations if item.name == "while" for v in item.outputs}
    assert len(iterated) == 12 and not iterated & receivers
    assert set(program.inputs) <= receivers and set(program.outputs[:1]) <= receivers
    assert checkpoint.cotangent_receivers(program, None) == receivers


def _statistics_mlp(tap):
    """8 tanh layers of 32, batch 2,048, and a statistic each layer updates
    from its activation by `tap`, passed in and returned as aux (as a
    BatchNorm's running statistics are state)."""
    keys = jax.random.split(jax.random.PRNGKey(1), 10)
    ws = [(jax.random.normal(keys[i], (32, 32)) / 6, jnp.zeros(32)) for i in range(8)]
    x, y = jax.random.normal(keys[8], (2048, 32)), jax.random.normal(keys[9], (2048, 32))

    def loss(ws, x, y, stat):
        for w, b in ws:
            x = jnp.tanh(x @ w + b)
            stat = 0.9 * stat + 0.1 * tap(x)
        return jnp.mean((x - y) ** 2), stat

    return loss, (ws, x, y, jnp.zeros(32))


def _compiled_bytes(fn, *args) -> int:
    m = jax.jit(fn).lower(*args).compile().memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


TAPS = {
    "slice": lambda x: x[0],
    "slice_of_stop_gradient": lambda x: lax.stop_gradient(x)[0],
    "mean_of_stop_gradient": lambda x: jnp.mean(lax.stop_gradient(x), 0),
}


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the fence is the protected checkpoints' (the CPU's)")
@pytest.mark.parametrize("tap", sorted(TAPS))
def test_an_aux_value_tapped_off_every_layer_leaves_the_activations_to_the_plan(tap):
    """XLA fuses the chain of aux updates into one loop at its end, reading
    every layer's activation (`x[0]` here), so each was held through the
    forward pass whatever the segments: no plan came under `jax.grad`'s own
    bytes (the error suggested 1.0 of them). The taps are fenced where their
    segment makes them (`checkpoint._fenced`): a plan fits at 0.8 (0.73 of
    them), and the aux value is `jax.value_and_grad`'s, bit for bit (a
    mean's, to its rounding).

    Through `stop_gradient`, each statistic's cotangent is a zero: the
    segments' conds were gated on it (the smallest cotangent), XLA folded
    them, and CSE merged every recomputation back into the forward pass. Both
    taps suggested 1.0 of `jax.grad`'s bytes; the slice was not fenced
    either (`stop_gradient(x)` is as large as `x`)."""
    loss, args = _statistics_mlp(TAPS[tap])
    full = _compiled_bytes(jax.grad(loss, has_aux=True), *args)
    plan = jdtr.plan(loss, *args, budget=0.8, has_aux=True, autotune=False)
    assert plan.compiled_bytes <= 0.8 * full and plan.segments
    assert plan.compiled_bytes == _compiled_bytes(jdtr.remat_grad(loss, budget=plan.budget_bytes, has_aux=True, autotune=False), *args)
    grads, stat = jax.jit(jdtr.remat_grad(loss, budget=0.8, has_aux=True, autotune=False))(*args)
    (_, expected_stat), expected = jax.jit(jax.value_and_grad(loss, has_aux=True))(*args)
    if tap.startswith("slice"):
        np.testing.assert_array_equal(np.asarray(stat), np.asarray(expected_stat))
    else:  # a mean: XLA may sum in another order
        np.testing.assert_allclose(np.asarray(stat), np.asarray(expected_stat), rtol=1e-5, atol=1e-9)
    for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-7)


def test_aux_taps_are_the_statistics_alone(monkeypatch):
    """What is fenced: each layer's `x[0]`, made for the aux statistic alone
    from an activation. Not the statistic's own updates (made from values of
    their size), nor a softmax's `max`, which the loss reads through
    `stop_gradient`."""
    seen = []
    real = planning.run_segments

    def recording(program, segments, leaves, implementation, gate="auto", tied=False, differentiated=None):
        seen.append((program, differentiated))
        return real(program, segments, leaves, implementation, gate, tied, differentiated)

    monkeypatch.setattr(planning, "run_segments", recording)

    statistics, args = _statistics_mlp(lambda x: x[0])

    def softmax_too(ws, x, y, stat):
        loss, stat = statistics(ws, x, y, stat)
        return loss + jnp.mean(jax.nn.log_softmax(x @ ws[0][0])), stat

    through_stop_gradient, _ = _statistics_mlp(TAPS["slice_of_stop_gradient"])  # the slice, not the stop_gradient
    for loss in (statistics, softmax_too, through_stop_gradient):
        seen.clear()
        jdtr.plan(loss, *args, budget=0.9, has_aux=True, autotune=False)
        program, differentiated = seen[0]
        taps = checkpoint.aux_taps(program, differentiated)
        makers = [item for item in program.body if isinstance(item, Equation) and set(item.outputs) & taps]
        # 8 with the softmax too (it adds none); x[0] before its squeeze
        assert len(taps) == 8 and all(v.shape == (1, 32) for v in taps), taps
        assert {item.name for item in makers} == {"slice"}, makers
        assert checkpoint.aux_taps(program, None) == set()
