"""jdtr.plot: residency intervals and the drawings made from them."""

from __future__ import annotations

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import jdtr  # noqa: E402
from jdtr import models  # noqa: E402
from jdtr.plot import FORWARD, GRADIENT, NOT_RESIDENT, find_backward_start, residency  # noqa: E402
from jdtr.runtime.observer import TimelineEvent  # noqa: E402


def make_stats(events, dealloc="eager", budget=1000, peak=400):
    return jdtr.Stats(
        budget_bytes=budget,
        peak_bytes=peak,
        unconstrained_peak_bytes=500,
        pinned_bytes=50,
        evictions=sum(e.kind == "evict" for e in events),
        dealloc_evictions=sum(e.kind == "dealloc" for e in events),
        rematerializations=sum(e.kind == "rematerialize" for e in events),
        base_cost=1.0,
        remat_cost=0.0,
        overhead=1.0,
        wall_time_s=0.0,
        trace_time_s=0.0,
        equations=5,
        cache_hit=False,
        heuristic="dtr_eq",
        dealloc=dealloc,
        timeline=tuple(events),
    )


# A small run, by hand: a (storage 10) and b (11) forward, a evicted to make
# room for the loss (12), b dead after it; the backward pass rematerializes a
# for the gradient g (13), then computes the gradient output w (14).
EVENTS = [
    TimelineEvent(1, 1.0, 10, 100, "compute", 150),
    TimelineEvent(2, 2.0, 11, 100, "compute", 250),
    TimelineEvent(2, 2.0, 10, 100, "evict", 150),
    TimelineEvent(3, 3.0, 12, 4, "compute", 154),
    TimelineEvent(3, 3.0, 11, 100, "dealloc", 54),
    TimelineEvent(4, 4.0, 10, 100, "rematerialize", 154),
    TimelineEvent(5, 5.0, 13, 100, "compute", 254),
    TimelineEvent(5, 5.0, 10, 100, "dealloc", 154),
    TimelineEvent(6, 6.0, 14, 100, "compute", 254),
]


def test_residency_by_hand():
    stats = make_stats(EVENTS)
    assert find_backward_start(stats) == 4  # the loss (12) is the first value that stays: step 3
    res = residency(stats)
    assert res.storage_ids == (10, 11, 12, 13, 14)
    assert res.steps == 6 and res.backward_start == 4
    F, G, _ = FORWARD, GRADIENT, NOT_RESIDENT
    expected = np.array(
        [
            [F, F, _, F, F, _],  # a: steps 1-2, evicted, rematerialized at 4, dead after 5
            [_, F, F, _, _, _],  # b: steps 2-3
            [_, _, F, F, F, F],  # the loss: step 3 to the end
            [_, _, _, _, G, G],  # g: computed at step 5, never freed
            [_, _, _, _, _, G],  # w: the last step
        ],
        np.uint8,
    )
    np.testing.assert_array_equal(res.matrix(), expected)
    by_storage = {(i.storage_id, i.start): i for i in res.intervals}
    assert by_storage[(10, 1)].end == "evict" and by_storage[(10, 1)].stop == 3
    assert by_storage[(10, 4)].rematerialized and by_storage[(10, 4)].end == "dealloc" and not by_storage[(10, 4)].backward
    assert by_storage[(14, 6)].end == "end" and by_storage[(14, 6)].backward


def test_backward_start_needs_eager_deallocation_or_a_hint():
    stats = make_stats(EVENTS, dealloc="ignore")
    assert find_backward_start(stats) is None
    assert not any(i.backward for i in residency(stats).intervals)
    res = residency(stats, backward_start=5)
    assert [i.storage_id for i in res.intervals if i.backward] == [13, 14]


def test_without_a_timeline_the_error_says_how_to_get_one():
    stats = make_stats(EVENTS)
    stats = jdtr.Stats(**{**stats.__dict__, "timeline": None})
    with pytest.raises(ValueError, match="timeline=True"):
        residency(stats)


def test_drawings_hold_the_data():
    stats = make_stats(EVENTS)
    figure, (top, bottom) = plt.subplots(2, 1)
    image = jdtr.plot.timeline(stats, ax=top)
    np.testing.assert_array_equal(np.asarray(image.get_array()), residency(stats).matrix())
    assert [line.get_xdata()[0] for line in top.get_lines()] == [3.5]  # the backward pass begins after step 3
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["forward value", "gradient-side value", "backward pass begins"]
    line = jdtr.plot.memory(stats, ax=bottom)
    np.testing.assert_array_equal(line.get_xdata(), [e.step for e in EVENTS])
    np.testing.assert_allclose(line.get_ydata(), [e.memory for e in EVENTS])  # bytes: all below 1 KiB
    assert bottom.get_ylabel() == "memory (B)"
    budget_line = [ln for ln in bottom.get_lines() if ln.get_label() == "budget"][0]
    assert budget_line.get_ydata()[0] == 1000
    plt.close(figure)


def test_a_real_run():
    model = models.mlp_chain(layers=8, width=32, batch=256)
    _, stats = jdtr.grad(model.loss, budget=0.5, return_stats=True, timeline=True)(model.params, model.batch)
    assert stats.rematerializations > 0
    res = residency(stats)
    computes = [e for e in stats.timeline if e.kind in ("compute", "rematerialize")]
    assert res.steps == len(computes)  # one operator output per step in this model
    assert sum(i.rematerialized for i in res.intervals) == stats.rematerializations
    # The backward pass starts after the loss: a scalar, computed once, resident to the end.
    loss_step = res.backward_start - 1
    (loss,) = [e for e in computes if e.step == loss_step]
    assert loss.size == 4 and loss.kind == "compute"
    assert all(e.kind == "compute" for e in stats.timeline if e.storage_id == loss.storage_id)
    # The gradients of the 8 weights are outputs: gradient-side values resident at the end.
    assert sum(i.backward and i.end == "end" for i in res.intervals) == 8
    # Every column holds exactly the bytes the runtime reported after that step's operator ran,
    # less the arguments (pinned, never in the timeline).
    matrix = res.matrix()
    sizes = np.array([next(e.size for e in stats.timeline if e.storage_id == sid) for sid in res.storage_ids])
    held = (matrix != NOT_RESIDENT).astype(np.int64).T @ sizes
    np.testing.assert_array_equal(held + stats.pinned_bytes, [e.memory for e in computes])
    assert held.max() + stats.pinned_bytes == stats.peak_bytes <= stats.budget_bytes
    figure, ax = plt.subplots()
    line = jdtr.plot.memory(stats, ax=ax)
    assert stats.unconstrained_peak_bytes < 2**20 and ax.get_ylabel() == "memory (KiB)"
    assert max(line.get_ydata()) == pytest.approx(stats.peak_bytes / 2**10)
    plt.close(figure)
