"""Regressions: each test is the minimal program of a bug the property tests
(tests/test_properties.py, `make fuzz`) or the fault tests found, with what
went wrong. Bugs not fixed yet are strict xfails: they start passing (and so
failing the suite) the day the fix lands, and then lose their mark.
"""

from __future__ import annotations

import gc
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jdtr
from jdtr import models
from jdtr.runtime.graph import Storage
from jdtr.runtime.heuristics import get_heuristic

from budgets import biting


def assert_trees_close(actual, expected):
    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected)
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-5, atol=1e-6)


def run_unconstrained(loss, *args, dealloc="eager"):
    """At the default budget (1.0 of the unconstrained peak) nothing may be evicted."""
    grads, stats = jdtr.grad(loss, return_stats=True, debug=True, dealloc=dealloc)(*args)
    assert_trees_close(grads, jax.grad(loss)(*args))
    assert stats.peak_bytes <= stats.budget_bytes
    assert stats.live_peak_bytes <= stats.budget_bytes
    if dealloc != "ignore":
        assert stats.evictions == 0 and stats.rematerializations == 0, stats.summary()
    return stats


# ------------------------------------------------------ fixed in jdtr/transform


@pytest.mark.parametrize("dealloc", ["eager", "banish"])
def test_literal_gradient_of_an_unused_scalar_fits_the_default_budget(dealloc):
    """Found by the property tests. The gradient of an unused scalar argument
    is the literal 0.0 in the jaxpr's outputs; the interpreter made it a
    pinned constant after the last equation, which the unconstrained peak did
    not count, so the default budget raised OutOfBudgetError (`jdtr.grad(loss)(p)`
    failed outright). Fixed in normalize.py: literal outputs become `constant`
    equations, counted and freed like any value."""

    def loss(p):
        return jnp.sum(p["w"])

    run_unconstrained(loss, {"w": jnp.ones(4), "s": jnp.float32(1.0)}, dealloc=dealloc)


@pytest.mark.parametrize("dealloc", ["eager", "banish"])
def test_cond_with_a_literal_operand_fits_the_default_budget(dealloc):
    """Found by the property tests (shrunk from a 10-operation program). A
    Python scalar operand of a run-time `lax.cond` is a literal; the
    interpreter made it a pinned constant that the unconstrained peak omitted
    and eager deallocation could never free, so every run evicted at budget
    1.0, and each cond executed leaked its bytes until the end of the run.
    Fixed in normalize.py: literal cond operands and literal branch outputs
    become `constant` equations."""

    def loss(x):
        y = lax.cond(jnp.sum(x) > 0.0, lambda u, s: jnp.sin(u) * s, lambda u, s: u - s, x, 2.0)
        return jnp.sum(y)

    for x in (jnp.ones(1), -jnp.ones(1)):
        run_unconstrained(loss, x, dealloc=dealloc)


def test_branch_returning_a_literal_fits_the_default_budget():
    """The same for a literal branch output (2.0 when the sum is positive):
    its pinned constant outlived its last use and the later peak overflowed."""

    def loss(x):
        y = lax.cond(jnp.sum(x) > 0, lambda a: jnp.float32(2.0), lambda a: jnp.sum(a**2), x)
        h = jnp.sin(x) + lax.stop_gradient(y)
        return jnp.sum(jnp.tanh(jnp.outer(h, h)))

    for x in (jnp.arange(3.0), -jnp.arange(3.0)):
        run_unconstrained(loss, x)


@pytest.mark.parametrize("dealloc", ["eager", "banish"])
def test_literal_cond_operand_kept_for_the_backward_pass_fits_the_default_budget(dealloc):
    """Found by `make fuzz` (seed 2 of the long run). A Python `2.0` operand
    of a cond became a float64 `constant` (numpy's dtype for the value, not
    the literal's float32); the branch that returns it as a residual for the
    backward pass handed the 8-byte buffer on as a 4-byte value, so the
    unconstrained peak undercounted by 4 bytes and budget 1.0 evicted.
    Fixed in normalize.py: literals keep their jaxpr dtype."""

    def loss(p, q):  # the program hypothesis found, as it wrote it
        a1, a2, a3 = p["k0"][0][0], p["k0"][0][1], p["k0"][1]
        v4 = jnp.tanh(a1)
        v5 = jnp.where(a3 > 3, a3, 0.5 * 3)
        v7 = lax.cond(jnp.sum(v4) > 0.0, lambda u, s: jax.scipy.special.erf(u) * s, lambda u, s: u - s * a2, v4, 2.0)
        v9 = a1 @ q
        w = lambda n, shape: np.linspace(-1.0, 1.0, n, dtype=np.float32).reshape(shape)  # noqa: E731
        return (jnp.sum(a2 * w(1, ())) + jnp.sum(v4 * w(3, (3, 1))) + jnp.sum(v5 * w(2, (2, 1, 1)))
                + jnp.sum(jnp.tanh(v4) * w(3, (3, 1))) + jnp.sum(v7 * w(3, (3, 1))) + jnp.sum(q * w(2, (1, 2)))
                + jnp.sum(v9 * w(6, (3, 2))))

    a1 = np.array([[0.0824943], [-0.4644184], [0.05051506]], np.float32)
    a3 = jnp.array([[[-1.7567905]], [[1.6844316]]], jnp.float32)
    q = jnp.array([[-0.45784283, -0.5964201]], jnp.float32)
    for sign in (1.0, -1.0):  # both branches
        p = {"k0": ((sign * a1, 0.6862308382987976, None), a3), "unused": None}
        grads, stats = jdtr.grad(loss, return_stats=True, debug=True, dealloc=dealloc)(p, q)
        assert_trees_close(grads, jax.grad(loss)(p, q))
        assert stats.evictions == 0 and stats.rematerializations == 0, stats.summary()


def test_float64_numpy_arguments_become_float32_silently_as_in_jax():
    """Found writing the bad-input tests: a float64 NumPy argument (what
    `np.ones(3)` makes) emitted "Explicitly requested dtype float64 ... will
    be truncated" on every call, which jax.grad does not, and which the test
    suite's warnings-as-errors turned into a failure. Fixed in grad.py:
    NumPy dtypes are canonicalized as JAX does."""

    def loss(x, data):
        return jnp.sum(jnp.sin(x) * data)

    x, data = np.linspace(-1.0, 1.0, 6), np.ones(6)  # float64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grads = jdtr.grad(loss)(x, data)
    assert grads.dtype == jnp.float32
    assert_trees_close(grads, jax.grad(loss)(x, data))


# ------------------------------------- found by the property and fault tests


class _AtAddress(Storage):
    """A storage whose hash is chosen. CPython hashes an object by its memory
    address, so this stands for two runs that allocated the same storages at
    different addresses."""

    __slots__ = ("address",)

    def __init__(self, id, size, address):
        super().__init__(id, size)
        self.address = address

    def __hash__(self):
        return self.address


def _score_with_evicted_inputs(heuristic, addresses):
    """The score of a resident storage whose three inputs are evicted, with
    costs whose float sum depends on the order they are added in."""
    target = _AtAddress(0, 4, 0)
    target.resident, target.last_access, target.cost = True, 0.0, 1.0
    for i, (cost, address) in enumerate(zip((1e16, 1.0, 1.0), addresses), start=1):
        dep = _AtAddress(i, 4, address)
        dep.cost = cost  # not resident: evicted
        target.deps.append(dep)
        dep.dependents.append(target)
    return get_heuristic(heuristic).score(target, now=1.0)


@pytest.mark.parametrize("heuristic", ["msps", "dtr_full"])
def test_scores_do_not_depend_on_memory_addresses(heuristic):
    """Found by the property tests: `heuristic="msps"`, `dealloc="ignore"`,
    budget 1.0 on a 10-operation program evicted a different storage in about
    one run in ten (same program, inputs, budget, default cost model). The
    scores sum `cost` over `_evicted_closure(...)` (a set): floating-point
    addition in address order. With costs (1e16, 1, 1) that is 1e16 or
    1e16 + 2 depending on which comes first."""
    assert _score_with_evicted_inputs(heuristic, (1, 2, 3)) == _score_with_evicted_inputs(heuristic, (3, 2, 1))


@pytest.mark.parametrize("heuristic", ["dtr_eq", "dtr_local", "estar", "lru", "size"])
def test_other_scores_do_not_depend_on_memory_addresses(heuristic):
    assert _score_with_evicted_inputs(heuristic, (1, 2, 3)) == _score_with_evicted_inputs(heuristic, (3, 2, 1))


def test_a_heuristic_instance_does_not_keep_buffers_alive():
    """Found by the fault tests. A heuristic passed as an instance lives with
    the caller (`jdtr.grad(f, heuristic=Largest())`), and `attach` stores the
    run's Runtime on it: after the call, the loss value that `jdtr.grad`
    drops (an output of the program, so never freed by the runtime) stays on
    the device until the next call with the same instance."""

    class Stalest(jdtr.Heuristic):
        name = "stalest"

        def score(self, storage, now):
            return storage.last_access

    heuristic = Stalest()
    x = jnp.ones(4)
    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    grads = jdtr.grad(lambda v: jnp.sum(jnp.sin(v)), heuristic=heuristic)(x)
    gc.collect()
    assert {id(a) for a in jax.live_arrays()} - before == {id(grads)}


def test_dropped_gradients_leave_the_device_without_waiting_for_the_cycle_collector():
    """Found on a GPU by benchmarks/device_peak.py. The runtime's graph
    (storages, tensors, operators) is full of reference cycles, so it lives
    on after the call until Python's cycle collector runs; its tensors still
    held the outputs' buffers. A training loop that dropped last step's
    gradients kept them on the device all the same, past the budget, until
    some later collection. The runtime now lets go of every buffer when the
    run ends. Checked with the collector off, as between two collections."""
    model = models.mlp_chain(layers=8, width=32, batch=64)
    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    gc.disable()
    try:
        for budget in (1.0, 0.6):
            grads = jdtr.grad(model.loss, budget=budget)(model.params, model.batch)
            value, more = jdtr.value_and_grad(model.loss, budget=budget)(model.params, model.batch)
            jax.block_until_ready((grads, value, more))
            del grads, value, more
            assert {id(a) for a in jax.live_arrays()} - before == set()
    finally:
        gc.enable()


def test_lookahead_replay_of_a_scan_program_takes_the_run_decisions(tmp_path):
    """Found by `make fuzz` (seed 102 of the second long run), flaky: with
    `cost_model="measured"` the replay of a lookahead run's log took other
    decisions. Not a runtime bug: a run with measured costs knows no cost
    before an operator runs, so it schedules the future one step per
    operator, while the log holds the measured costs and its replay
    schedules by them. The property now asks for exact replays with
    deterministic costs only (what jdtr promises); this is the program,
    replayed exactly under them at the budgets where lookahead evicts, and
    replayed within budget when costs are measured."""

    def loss(p, q):  # the program hypothesis found, as it wrote it
        a1, a2 = p[0][0], q
        v4 = jnp.sqrt(a1 * a1 + 1.0)
        v5 = jax.scipy.special.erf(a1)
        v6 = a1 * 0.5 + 1.0

        def body7(c, x):
            c = jnp.tanh(c + x) + 0.5 * c
            return c, (jnp.sin(x), c)

        v8, (v9, v10) = lax.scan(body7, jnp.zeros((4,)), v5)
        v11 = jnp.linalg.eigvalsh(v9 @ jnp.swapaxes(v9, -1, -2) + 2.0 * jnp.diag(jnp.arange(1.0, 2.0)))
        w = lambda n, shape: np.linspace(-1.0, 1.0, n, dtype=np.float32).reshape(shape)  # noqa: E731
        total = (jnp.sum(a2 * w(4, (4, 1))) + jnp.sum(v4 * w(4, (1, 4))) + jnp.sum(v6 * w(4, (1, 4)))
                 + jnp.sum(v8 * w(4, (4,))) + jnp.sum(v9 * w(4, (1, 4))) + jnp.sum(v10 * w(4, (1, 4)))
                 + jnp.sum(v11 * w(1, (1,))))
        return total, v8

    p = ((jnp.array([[0.3, -1.2, 0.7, 0.05]], jnp.float32),),)
    q = jnp.array([[0.5], [-0.25], [1.5], [0.1]], jnp.float32)
    expected = jax.value_and_grad(loss, (0, 1), has_aux=True)(p, q)
    evicted = 0
    for ratio in (0.55, 0.6, 0.75):  # 0.5 no longer holds eigh's LAPACK workspace (136 B), counted since
        log = str(tmp_path / f"run{ratio}.log")
        f = jdtr.value_and_grad(loss, (0, 1), has_aux=True, budget=ratio, heuristic="lookahead", return_stats=True,
                                timeline=True, log=log)
        got, stats = f(p, q)
        assert_trees_close(got, expected)
        sim = jdtr.simulate(jdtr.Trace.from_log(log), stats.budget_bytes, "lookahead", overhead_limit=None)
        assert (sim.peak_bytes, sim.evictions, sim.rematerializations) == (
            stats.peak_bytes, stats.evictions, stats.rematerializations)
        evicted += stats.evictions
    assert evicted > 0  # the budgets make lookahead choose
    log = str(tmp_path / "measured.log")
    f = jdtr.value_and_grad(loss, (0, 1), has_aux=True, budget=0.55, heuristic="lookahead", cost_model="measured",
                            return_stats=True, log=log)
    got, stats = f(p, q)
    assert_trees_close(got, expected)
    sim = jdtr.simulate(jdtr.Trace.from_log(log), stats.budget_bytes, "lookahead", overhead_limit=None)
    assert sim.status == "ok" and sim.peak_bytes <= stats.budget_bytes


@pytest.mark.parametrize("mode", ["planned", "online"])
def test_budget_one_fits_when_a_constant_is_last_read_before_the_peak(mode):
    """The unconstrained peak freed a jaxpr constant at its last read, where
    the runtime keeps constants (pinned) to the end: at budget 1.0 the run was
    out of budget by a few bytes."""
    constant = jnp.arange(1000.0)

    def loss(x):
        return jnp.sum(jnp.tanh(x) * constant[: x.shape[0]])

    x = jnp.ones((3,))
    grads, stats = jdtr.grad(loss, budget=1.0, return_stats=True, mode=mode)(x)
    assert stats.peak_bytes <= stats.budget_bytes == stats.unconstrained_peak_bytes
    assert stats.evictions == 0 and stats.pinned_bytes >= constant.nbytes
    np.testing.assert_allclose(np.asarray(grads), np.asarray(jax.grad(loss)(x)), rtol=1e-6)


@pytest.mark.parametrize(
    "budget, expected",
    [
        (np.float32(0.875), jdtr.Budget(fraction=0.875)),  # exact in float32; fits JAX 0.10's and 0.11's programs
        (jnp.float32(0.875), jdtr.Budget(fraction=0.875)),
        (np.int64(2**20), jdtr.Budget(nbytes=2**20)),
        (jnp.int32(2**20), jdtr.Budget(nbytes=2**20)),
        (np.float64(1.0), jdtr.Budget(fraction=1.0)),
    ],
)
def test_budgets_given_as_numpy_or_jax_scalars_are_their_python_values(budget, expected):
    """Issue 23, item 3: np.float32(0.5) was refused, jnp.float32(0.5) failed in `__index__`."""
    assert jdtr.parse_budget(budget) == expected
    # Activations over parameters, so that 0.875 of the peak leaves room to evict on any JAX's program.
    model = models.mlp_chain(layers=8, width=16, batch=64)
    grads, stats = jdtr.grad(model.loss, budget=budget, return_stats=True)(model.params, model.batch)
    assert stats.budget_bytes == expected.resolve(stats.unconstrained_peak_bytes) and stats.peak_bytes <= stats.budget_bytes


def test_a_percentage_budget_is_the_same_fraction():
    """"50%" is budget=0.5, for `jdtr.grad` and `jdtr.remat_grad` alike; a
    percentage outside (0%, 100%] is refused, as a fraction outside (0, 1] is."""
    assert jdtr.parse_budget("50%") == jdtr.parse_budget(" 50 % ") == jdtr.Budget(fraction=0.5)
    assert jdtr.parse_budget("100%") == jdtr.Budget(fraction=1.0) and jdtr.parse_budget("12.5%") == jdtr.Budget(fraction=0.125)
    for bad in ("0%", "150%", "-5%", "%"):
        with pytest.raises(ValueError, match="percentage|cannot read"):
            jdtr.parse_budget(bad)
    model = models.mlp_chain(layers=8, width=16, batch=64)
    _, stats = jdtr.grad(model.loss, budget="50%", return_stats=True)(model.params, model.batch)
    _, half = jdtr.grad(model.loss, budget=0.5, return_stats=True)(model.params, model.batch)
    assert stats.budget_bytes == half.budget_bytes == int(0.5 * stats.unconstrained_peak_bytes) >= stats.peak_bytes
    model = models.mlp_chain(layers=16, width=64, batch=1024)  # (activations over parameters, in XLA's bytes too)
    plan = jdtr.plan(model.loss, model.params, model.batch, budget="50%", autotune=False)
    assert plan.budget_bytes == int(0.5 * plan.unconstrained_compiled_bytes) >= plan.compiled_bytes


def test_an_array_budget_that_is_not_a_scalar_is_refused():
    with pytest.raises(TypeError):
        jdtr.parse_budget(np.array([0.5, 0.5]))
    with pytest.raises(TypeError):
        jdtr.parse_budget(np.bool_(True))


def test_budget_one_is_one_byte_and_the_error_says_what_was_meant():
    """Issue 23, item 3: budget=1 (an int) is one byte; the error asks whether 1.0 was meant."""
    model = models.mlp_chain(layers=2, width=8, batch=4)
    with pytest.raises(jdtr.OutOfBudgetError) as info:
        jdtr.grad(model.loss, budget=1)(model.params, model.batch)
    assert "did you mean budget=1.0" in "".join(getattr(info.value, "__notes__", []))
    with pytest.raises(jdtr.OutOfBudgetError) as info:
        jdtr.grad(model.loss, budget=2)(model.params, model.batch)
    assert not getattr(info.value, "__notes__", [])


def test_a_run_by_paths_that_falls_back_online_makes_again_the_inputs_it_freed():
    """Finding 13: arguments passed as NumPy arrays are made device arrays the
    run owns, and a plan may free them once read. A run by paths of `cond`s
    whose path read then did not fit went on online, from the start, on the
    inputs the path run had freed: `RuntimeError: Array has been deleted`
    (the gated model of `test_paths.py`'s fallback test, its parameters as
    NumPy arrays; the property tests found it on a 9-operation program). The
    online run now gets those inputs made again from the caller's values."""
    model = models.gated_mlp(blocks=6, width=32, batch=64)
    budget = biting(model.loss, (model.params, model.batch), 0.35, mode="online")
    params, batch = jax.tree_util.tree_map(np.asarray, (model.params, model.batch))
    f = jdtr.grad(lambda *args: model.loss(*args), budget=budget, return_stats=True)
    expected = jax.grad(model.loss)(model.params, model.batch)
    for _ in range(2):
        grads, stats = f(params, batch)
        assert_trees_close(grads, expected)
        assert stats.execution == "online" and stats.peak_bytes <= stats.budget_bytes


@pytest.mark.parametrize("mode", ["planned", "online"])
def test_a_branch_returning_one_value_twice_holds_it_under_two_names(mode):
    """Finding 14: a branch returning one value twice (the forward `switch` of
    identical branches returns `tanh(u)` as the result and as its residual)
    gives the caller two values over one buffer. The unconstrained peak freed
    the buffer at the first one's last read, where the runtime holds it until
    both are released: at budget 1.0 a run evicted (4 bytes short)."""

    def loss(p, q):
        v4 = (q + q) + (q + q)
        v6 = lax.switch(jnp.argmax(v4) % 3, [jnp.tanh, jnp.tanh, jnp.tanh], v4)
        return jnp.sum(p["k0"] * 0.5) + jnp.sum(q) + jnp.sum(v4) + jnp.sum(v6 * 0.25)

    p, q = {"k0": jnp.float32(0.3)}, jnp.asarray([-0.7], jnp.float32)
    for chunks in ("never", "always"):
        (value, grads), stats = jdtr.value_and_grad(loss, (0, 1), return_stats=True, mode=mode, chunks=chunks)(p, q)
        assert stats.evictions == 0 and stats.peak_bytes <= stats.budget_bytes == stats.unconstrained_peak_bytes
        assert_trees_close(grads, jax.grad(loss, (0, 1))(p, q))
