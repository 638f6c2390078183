"""Gradients of the reference models under budgets, for every heuristic.

Each run must give jax.grad's gradients, hold at most `budget` bytes (by the
runtime's count and by `jax.live_arrays()` after every operator), or fail
with a clean OutOfBudgetError that leaves the caller's arrays intact.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import jdtr
from jdtr import models

# Small enough for CI, with activations (not weights) dominating the peak.
MODELS = {
    "mlp": lambda: models.mlp_chain(layers=64, width=32, batch=256),
    "resnet": lambda: models.resnet(blocks=3, channels=8, image=16, batch=8),
    "transformer": lambda: models.transformer(blocks=2, dim=32, heads=4, seq=64, batch=8, vocab=64),
    "rnn": lambda: models.rnn(steps=24, hidden=32, features=8, batch=64),
}

# (model, budget) pairs where dtr_eq, the default, must succeed.
DTR_EQ_MUST_FIT = {("mlp", 1.0), ("mlp", 0.5), ("mlp", 0.3), ("resnet", 1.0), ("resnet", 0.5),
                   ("transformer", 1.0), ("transformer", 0.5), ("rnn", 1.0), ("rnn", 0.5)}


@functools.lru_cache(maxsize=None)
def model_and_reference(name):
    model = MODELS[name]()
    return model, jax.grad(model.loss)(model.params, model.batch)


def assert_trees_close(actual, expected, rtol=1e-5, atol=1e-6):
    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected)
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


# Every heuristic at half the peak (where most fit, so gradients are
# compared); dtr_eq, the paper's, also unconstrained (nothing is evicted,
# as asserted below) and at 0.3. The transformer, by far the slowest to run
# with debug=True, runs the default and the paper's heuristics at 0.5 and
# dtr_eq at 0.3. The property tests run every heuristic under random budgets too.
BUDGETS_AND_HEURISTICS = [(1.0, "dtr_eq"), (0.3, "dtr_eq")] + [(0.5, h) for h in sorted(jdtr.HEURISTICS)]
CASES = [
    (name, budget, heuristic)
    for name in sorted(MODELS)
    for budget, heuristic in BUDGETS_AND_HEURISTICS
    if name != "transformer" or (budget, heuristic) in {(0.3, "dtr_eq"), (0.5, "dtr_eq"), (0.5, jdtr.DEFAULT_HEURISTIC)}
]


@pytest.mark.parametrize("name,budget,heuristic", CASES)
def test_model_gradients_under_budget(name, budget, heuristic):
    model, reference = model_and_reference(name)
    grad_fn = jdtr.grad(model.loss, budget=budget, heuristic=heuristic, return_stats=True, debug=True)
    try:
        grads, stats = grad_fn(model.params, model.batch)
    except jdtr.OutOfBudgetError as err:
        assert not (heuristic == "dtr_eq" and (name, budget) in DTR_EQ_MUST_FIT), str(err)
        if isinstance(err, jdtr.OverheadLimitError):
            assert err.suggested_budget_bytes > err.budget_bytes
        else:
            assert err.needed_bytes > err.free_bytes
        for leaf in jax.tree_util.tree_leaves((model.params, model.batch)):
            assert not leaf.is_deleted()
        return
    assert_trees_close(grads, reference)
    assert stats.peak_bytes <= stats.budget_bytes
    assert stats.live_peak_bytes <= stats.budget_bytes
    assert stats.budget_bytes == int(budget * stats.unconstrained_peak_bytes)
    if budget == 1.0:
        assert stats.evictions == 0 and stats.rematerializations == 0
        assert stats.peak_bytes == stats.unconstrained_peak_bytes
    else:  # recomputed by DTR, or by the strategy of a scan kept whole
        assert stats.overhead > 1.0 and (stats.rematerializations > 0 or stats.scans is not None)


def test_live_arrays_match_the_runtime_count_at_full_budget():
    model, _ = model_and_reference("mlp")
    _, stats = jdtr.grad(model.loss, budget=1.0, return_stats=True, debug=True)(model.params, model.batch)
    # jax.live_arrays() and the runtime's own counter agree on the peak.
    assert stats.live_peak_bytes == stats.peak_bytes


def test_dtr_eq_beats_lru_on_the_mlp_chain():
    """The paper's comparison, of its online algorithm: a planned run is cut
    off where LRU thrashes (past overhead 4 here on JAX 0.11; 3.56 on 0.10)."""
    model, _ = model_and_reference("mlp")
    overhead = {}
    for heuristic in ("dtr_eq", "lru"):
        f = jdtr.grad(model.loss, budget=0.5, heuristic=heuristic, return_stats=True, mode="online")
        _, stats = f(model.params, model.batch)
        overhead[heuristic] = stats.overhead
    assert overhead["dtr_eq"] < overhead["lru"]


def test_scan_gives_per_step_tensors():
    """The RNN's scan is unrolled: DTR sees per-step values, not one stacked residual."""
    model, _ = model_and_reference("rnn")
    closed = jax.make_jaxpr(jax.value_and_grad(model.loss))(model.params, model.batch)
    program = jdtr.transform.normalize(closed)
    names = [item.name for item in program.body]
    assert "scan" not in names
    assert names.count("tanh") == 24
    steps = 24 * 64 * 32 * 4  # every per-step state, stacked
    assert max(v.nbytes for item in program.body for v in item.outputs) < steps


def test_mlp_chain_64_layers_at_30_percent_within_1_5x_overhead():
    """The issue's target: batch 2048, width 256, budget 0.3, dtr_eq, overhead <= 1.5x
    (in the deterministic cost model, so this is not a timing test)."""
    model = models.mlp_chain(layers=64, width=256, batch=2048)
    grads, stats = jdtr.grad(model.loss, budget=0.3, return_stats=True)(model.params, model.batch)
    assert stats.peak_bytes <= stats.budget_bytes == int(0.3 * stats.unconstrained_peak_bytes)
    assert 1.0 < stats.overhead <= 1.5
    reference = jax.jit(jax.grad(model.loss))(model.params, model.batch)
    assert_trees_close(grads, reference, rtol=1e-4, atol=1e-6)


def test_timeline_records_residency():
    model, _ = model_and_reference("mlp")
    _, stats = jdtr.grad(model.loss, budget=0.5, return_stats=True, timeline=True)(model.params, model.batch)
    kinds = {e.kind for e in stats.timeline}
    assert {"compute", "rematerialize", "evict", "dealloc"} <= kinds
    assert sum(e.kind == "evict" for e in stats.timeline) == stats.evictions
    assert sum(e.kind == "rematerialize" for e in stats.timeline) >= stats.rematerializations
    assert max(e.memory for e in stats.timeline) <= stats.budget_bytes
