"""`chunks="auto"`: a plan's compiled chunks timed against its step as one
XLA program, once the chunk runs paid for making it; the faster kept."""

from __future__ import annotations

import statistics
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

import jdtr
from jdtr import models
from jdtr.transform import gradients, plan_search, whole_choice
from jdtr.transform.planning import quick_plan
from jdtr.transform.whole_choice import CHUNKS, MAKE, TRIAL_RUNS, WHOLE, WholeTrial
from leaks import assert_intact_and_released, live_ids
from program_strategies import assert_trees_close


def test_the_trial_rents_then_makes_then_alternates_and_keeps_the_faster():
    trial = WholeTrial(price_s=1.0)
    assert trial.next_run(None) == CHUNKS and trial.timing
    trial.ran(CHUNKS, 0.6)
    assert trial.next_run(None) == CHUNKS
    trial.ran(CHUNKS, 0.6)  # 1.2 s paid: the program is made on the next run
    assert trial.next_run(None) == MAKE
    trial.ran(MAKE, 30.0)  # (the making's seconds are no run's)
    made = object()
    order = []
    for seconds in (2.0, 1.0, 2.0, 1.0, 0.5, 1.0):  # the program's first, 2.0 and 0.5 among them
        how = trial.next_run(made)
        order.append(how)
        trial.ran(how, seconds)
    assert order == [WHOLE, CHUNKS] * TRIAL_RUNS
    # medians: one program 2.0 (of 2.0, 2.0, 0.5), chunks 1.0: the chunks are kept.
    assert trial.chosen == CHUNKS and not trial.timing and trial.next_run(made) == CHUNKS
    trial.ran(WHOLE, 0.0)  # (decided: runs after it change nothing)
    assert trial.chosen == CHUNKS and trial.whole_s == [2.0, 2.0, 0.5]

    faster = WholeTrial(price_s=0.0)
    assert faster.next_run(None) == MAKE
    faster.ran(MAKE, 1.0)
    for _ in range(TRIAL_RUNS):
        faster.ran(faster.next_run(made), 1.0)
        faster.ran(faster.next_run(made), 1.0)
    assert faster.chosen == WHOLE  # (a tie: the one program, fewer dispatches)


def test_where_no_program_fits_the_trial_keeps_the_chunks():
    trial = WholeTrial(price_s=0.0)
    assert trial.next_run(None) == MAKE
    assert trial.next_run(False) == CHUNKS and trial.chosen == CHUNKS and not trial.timing


def test_a_program_made_by_another_call_is_timed_without_rent():
    trial = WholeTrial(price_s=100.0)  # (chunks="whole" on the same plan made it)
    assert trial.next_run(object()) == WHOLE and trial.made
    trial.ran(WHOLE, 1.0)
    assert trial.whole_s == [1.0] and trial.rent_s == 0.0


def count_makes(monkeypatch) -> list:
    made = []
    real = gradients.whole_step

    def counted(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(gradients, "whole_step", counted)
    return made


def test_auto_times_chunks_against_one_program_and_keeps_the_faster(monkeypatch):
    monkeypatch.setattr(whole_choice, "WHOLE_PRICE", 0.0)  # made once the chunks compiled
    made = count_makes(monkeypatch)
    m = models.mlp_chain(layers=16, width=64, batch=256)
    expected = jax.grad(m.loss)(m.params, m.batch)
    leaves = jax.tree_util.tree_leaves((m.params, m.batch))
    copies = [np.asarray(x) for x in leaves]
    step = jdtr.grad(m.loss, budget=0.7, return_stats=True, debug=True)
    jdtr.clear_caches()  # (cache_info counts every test's plans)
    before = live_ids()
    runs = []
    for _ in range(4 + 2 * TRIAL_RUNS):
        grads, stats = step(m.params, m.batch)
        assert stats.peak_bytes <= stats.budget_bytes and stats.live_peak_bytes <= stats.budget_bytes, stats
        assert_trees_close(grads, expected)
        runs.append(stats)
    executions = [s.execution for s in runs]
    # steps, then the chunks compiled, then the program made and run, then
    # the two alternated, then the one of the lower median.
    assert executions[:3] == ["steps", "chunks", "whole"], executions
    assert executions[3 : 3 + 2 * TRIAL_RUNS] == ["whole", "chunks"] * TRIAL_RUNS, executions
    trial = runs[3 : 3 + 2 * TRIAL_RUNS]
    whole_s = statistics.median(s.wall_time_s for s in trial[0::2])
    chunks_s = statistics.median(s.wall_time_s for s in trial[1::2])
    chosen = "whole" if whole_s <= chunks_s else "chunks"
    assert executions[-1] == chosen, (executions, whole_s, chunks_s)
    assert len(made) == 1 and made[0] is not None
    assert jdtr.cache_info().whole_steps == 1  # (kept either way: a call with chunks="whole" runs by it)
    # The caller's arrays intact, nothing left behind.
    assert_intact_and_released(leaves, copies, grads, before)


def test_auto_rents_chunk_runs_up_to_the_price_and_tries_once(monkeypatch):
    made = count_makes(monkeypatch)
    m = models.mlp_chain(layers=16, width=64, batch=256)
    monkeypatch.setattr(whole_choice, "WHOLE_PRICE", 1e6)  # (a price no test pays)
    step = jdtr.grad(m.loss, budget=0.7, return_stats=True)
    assert {step(m.params, m.batch)[1].execution for _ in range(5)} == {"steps", "chunks"}
    assert made == []
    # At 0.3 of the peak no plan of the compiled path fits (test_whole_step.py):
    # the program is tried once, and the plan keeps its chunks.
    monkeypatch.setattr(whole_choice, "WHOLE_PRICE", 0.0)
    step = jdtr.grad(m.loss, budget=0.3, heuristic="msps", return_stats=True)
    executions = [step(m.params, m.batch)[1].execution for _ in range(5)]
    assert len(made) == 1, made
    if made[0] is None:  # (JAX 0.10.2's XLA: so; another's floor could differ)
        assert executions == ["steps"] + ["chunks"] * 4, executions
    assert_trees_close(step(m.params, m.batch)[0], jax.grad(m.loss)(m.params, m.batch))


def test_steps_that_depend_on_how_a_run_is_cut_are_not_tried(monkeypatch, tmp_path):
    monkeypatch.setattr(whole_choice, "WHOLE_PRICE", 0.0)
    made = count_makes(monkeypatch)

    def loss(w, x):
        h = jnp.tanh(x @ w)
        h = jax.lax.cond(h.sum() > 0, lambda h: jnp.sin(h) @ w, lambda h: jnp.cos(h) @ w, h)
        return (jnp.tanh(h @ w) ** 2).mean()

    w = jax.random.normal(jax.random.PRNGKey(0), (128, 128)) / 12
    x = jax.random.normal(jax.random.PRNGKey(1), (256, 128))
    m = models.mlp_chain(layers=16, width=64, batch=256)
    for fun, args, options in [
        (loss, (w, x), {}),  # a cond on data: planned per path
        (m.loss, (m.params, m.batch), {"log": tmp_path / "run.log"}),  # a log of the planned run's operators
        (m.loss, (m.params, m.batch), {"chunks": "always"}),  # chunks asked for
    ]:
        step = jdtr.grad(fun, budget=0.6, return_stats=True, **options)
        executions = {step(*args)[1].execution for _ in range(5)}
        assert "whole" not in executions, (options, executions)
    assert made == []


def test_the_search_for_the_program_compiles_nothing_more_past_its_deadline(monkeypatch):
    """The trial's making is bounded by its price: past the deadline the
    compiled path's search compiles no candidate but its first (here, at 0.3
    of the MLP's peak, where none fits)."""
    measured = []
    real = plan_search.PlanSearch.measure

    def counted(self, plan):
        out = real(self, plan)
        measured.append(plan)
        return out

    monkeypatch.setattr(plan_search.PlanSearch, "measure", counted)
    m = models.mlp_chain(layers=16, width=64, batch=256)
    budget = int(0.3 * jdtr.plan(m.loss, m.params, m.batch, budget=1.0, autotune=False).compiled_bytes)
    measured.clear()
    args = (m.loss, (m.params, m.batch), {}, budget, 0, False, "dtr_eq")
    assert quick_plan(*args) is None
    unlimited = len(measured)
    measured.clear()
    assert quick_plan(*args, deadline=time.perf_counter()) is None
    assert len(measured) == 1 < unlimited, (len(measured), unlimited)


def test_one_thread_makes_the_program_while_the_others_run_the_chunks():
    trial = WholeTrial(price_s=0.0)
    assert trial.next_run(None) == MAKE and trial.making
    assert trial.next_run(None) == CHUNKS  # (another thread, while the program is being made)
    trial.ran(CHUNKS, 5.0)
    assert trial.rent_s == 0.0 and trial.chunks_s == [] and trial.timing
    trial.making = False  # (`one_program`, once made)
    assert trial.next_run(object()) == WHOLE


def test_threads_calling_a_plan_in_its_trial_make_one_program(monkeypatch):
    monkeypatch.setattr(whole_choice, "WHOLE_PRICE", 0.0)
    made = count_makes(monkeypatch)
    m = models.mlp_chain(layers=8, width=64, batch=256)
    expected = jax.grad(m.loss)(m.params, m.batch)
    step = jdtr.grad(m.loss, budget=0.7, return_stats=True)
    for _ in range(2):  # steps, then chunks: the trial is open, the program due
        step(m.params, m.batch)
    results, errors = [], []

    def worker():
        try:
            for _ in range(6):
                results.append(step(m.params, m.batch))
        except Exception as err:  # (asserted on in the test's thread)
            errors.append(err)

    pool = [threading.Thread(target=worker) for _ in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    for grads, stats in results:
        assert_trees_close(grads, expected)
        assert stats.peak_bytes <= stats.budget_bytes, stats
    assert len(made) == 1 and made[0] is not None, made
    assert "whole" in {stats.execution for _, stats in results}
