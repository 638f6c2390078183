"""Choosing victims: the pool index decides as the paper's full scan does, and
the `lookahead` heuristic reads the program's future from a `Schedule`.

The reference for every indexed decision is `Heuristic.choose`, the scan of
the paper's simulator: the same storage must come out, decision by decision.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

import jdtr
from jdtr.runtime import (
    HEURISTICS,
    Counters,
    Heuristic,
    NullBackend,
    Observer,
    OutOfBudgetError,
    Runtime,
    Sampled,
    Schedule,
    Storage,
    ThrashError,
    get_heuristic,
)
from jdtr.offline import run_baseline
from jdtr.oplog import Annotate, Call, Constant, Copy, Mutate, Release, Trace, replay
from jdtr.runtime.heuristics.lookahead import Lookahead
from jdtr.runtime.index import RatioIndex

LOGS = Path(__file__).resolve().parents[2] / "shared" / "dtr-logs"
INDEXED = sorted(name for name, cls in HEURISTICS.items() if name != "random")


def shared_log(name: str) -> Trace:
    path = LOGS / name
    if not path.is_file():
        pytest.skip(f"{path} not found: the shared DTR prototype logs are expected at <checkout>/../shared/dtr-logs")
    return Trace.from_log(path)


class Decisions(Observer):
    def __init__(self) -> None:
        self.evicted: list[tuple[int, float]] = []

    def on_evict(self, storage, by_heuristic, clock):
        if by_heuristic:
            self.evicted.append((storage.id, clock))


def decisions(trace: Trace, ratio: float, heuristic: Heuristic, dealloc: str = "eager"):
    """The run's status, final clock and every eviction the heuristic chose."""
    baseline = run_baseline(trace.program)
    observer = Decisions()
    runtime = Runtime(
        NullBackend(), int(baseline.peak_bytes * ratio), heuristic=heuristic, dealloc=dealloc,
        observers=[observer], remat_limit=baseline.cost,
    )  # fmt: skip
    status = "ok"
    try:
        replay(trace.program, runtime)
    except OutOfBudgetError:
        status = "oom"
    except ThrashError:
        status = "thrash"
    return status, runtime.clock, observer.evicted


def random_trace(seed: int, steps: int = 60) -> Trace:
    """Views, multi-output and in-place calls, copies, releases; costs of 0
    (scores of 0), few distinct sizes and costs (ties), views of size 0."""
    rng = random.Random(seed)
    records: list = [Annotate("START"), Constant("c0", 8), Constant("c1", 16)]
    refs = {"c0": [1], "c1": [1]}
    counter = iter(range(10**6))
    for _ in range(steps):
        live = [name for name, count in refs.items() if count[0] > 0]
        kind = rng.random()
        if kind < 0.55 or len(live) < 4:
            args = tuple(rng.choice(live[-6:]) for _ in range(rng.randint(1, 3)))
            result = tuple(f"t{next(counter)}" for _ in range(rng.choice([1, 1, 1, 2, 3])))
            alias = tuple(rng.randrange(len(args)) if rng.random() < 0.15 else -1 for _ in result)
            memory = tuple(rng.choice([8, 8, 16, 64]) for _ in result)
            records.append(Call("op", args, result, rng.choice([0, 1, 1, 5, 40]), memory, alias))
            refs.update({name: [1] for name in result})
        elif kind < 0.62:
            name = rng.choice(live)
            records.append(Mutate("add_", (name,), (0,), rng.choice([1, 5])))
            refs[name][0] -= 1
            refs[name] = [1]
        elif kind < 0.67:
            src, dst = rng.choice(live), f"t{next(counter)}"
            records.append(Copy(dst, src))
            refs[src][0] += 1
            refs[dst] = refs[src]
        else:
            name = rng.choice(live[:-2] or live)
            records.append(Release(name))
            refs[name][0] -= 1
    return Trace(records)


# ------------------------------------------------------------- index == full scan


@pytest.mark.parametrize("name", ["resnet32-56.log", "unet-6.log"])
def test_index_takes_the_scans_decisions_on_the_shared_logs(name):
    trace = shared_log(name)
    for ratio in (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.12, 0.1):
        indexed = decisions(trace, ratio, HEURISTICS["dtr_eq"]())
        scanned = decisions(trace, ratio, HEURISTICS["dtr_eq"](indexed=False))
        assert indexed == scanned, ratio
    for heuristic in INDEXED:
        for ratio in (0.5, 0.2):
            assert decisions(trace, ratio, HEURISTICS[heuristic]()) == decisions(
                trace, ratio, HEURISTICS[heuristic](indexed=False)
            ), (heuristic, ratio)


@pytest.mark.parametrize("seed", range(16))
def test_index_takes_the_scans_decisions_on_random_traces(seed):
    trace = random_trace(seed)
    dealloc = ("eager", "banish", "ignore")[seed % 3]
    for heuristic in INDEXED:
        for ratio in (0.7, 0.5, 0.3):
            indexed = decisions(trace, ratio, HEURISTICS[heuristic](), dealloc)
            scanned = decisions(trace, ratio, HEURISTICS[heuristic](indexed=False), dealloc)
            assert indexed == scanned, (heuristic, ratio)


@pytest.mark.parametrize("seed, ratio", [(46, 0.7), (114, 0.3), (146, 0.2)])
def test_lookahead_keys_stay_bounds_where_a_need_rises_or_a_set_costs_less_than_nothing(seed, ratio):
    """Random traces where an index with a stale key decided otherwise than
    the scan (found by a search over 500 seeds). Seed 114: an evicted
    storage's read was passed while it was evicted (a cost-0 operation read
    it, then it was freed), so its next use rose, and with it the need of
    its resident dependency, whose key still held the old need. Seeds 46
    and 146: sets that cost less than nothing, where a storage's own cost
    no longer bounds its numerator (`Lookahead.evaluate`'s cheap key, and
    the frontier's touches `Lookahead.touch_all` leaves out)."""
    trace = random_trace(seed)
    dealloc = ("eager", "banish", "ignore")[seed % 3]
    indexed = decisions(trace, ratio, HEURISTICS["lookahead"](), dealloc)
    scanned = decisions(trace, ratio, HEURISTICS["lookahead"](indexed=False), dealloc)
    assert indexed == scanned


@pytest.mark.parametrize("seed, ratio", [(211, 0.5), (301, 0.7)])
def test_banishing_waits_for_a_view_its_operator_still_has_to_rebuild(seed, ratio):
    """Random traces with `dealloc="banish"` where a storage was banished
    once the storage of a view it is read by was rebuilt, but before the
    view's own operator replayed: that replay then needed it, and the run
    raised "freed but cannot be recomputed" (the runtime's bug). Now it
    waits for the view, under every heuristic."""
    trace = random_trace(seed)
    assert seed % 3 == 1  # (banish: the rule `random_trace`'s tests follow)
    for heuristic in INDEXED:
        indexed = decisions(trace, ratio, HEURISTICS[heuristic](), "banish")
        scanned = decisions(trace, ratio, HEURISTICS[heuristic](indexed=False), "banish")
        assert indexed == scanned, heuristic
        assert indexed[0] in ("ok", "oom", "thrash")


def test_index_takes_the_scans_decisions_with_measured_costs():
    """A cost known only after running (cost=None) joins the pool at 0 and
    grows afterwards: its key is a stale lower bound until it is scored."""
    results = []
    for indexed in (True, False):
        observer = Decisions()
        rt = Runtime(NullBackend(), 40, heuristic=HEURISTICS["dtr_eq"](indexed=indexed), observers=[observer])
        x = [rt.constant(4)]
        rng = random.Random(0)
        for i in range(60):
            cost = None if i % 3 == 0 else float(rng.choice([1, 2, 3]))
            x.append(rt.call("f", [x[-1]], [4], cost=cost)[0])
        for t in reversed(x[1:]):
            rt.get(t)
        results.append(observer.evicted)
    assert results[0] == results[1] and results[0]


class Fixed(Heuristic):
    """Scores a / (now - b) from per-storage numbers: the form `RatioIndex` serves."""

    def __init__(self, keys: dict):
        super().__init__()
        self.keys = keys

    def score(self, storage, now):
        a, b = self.keys[storage]
        return a / (now - b) if storage.size > 0 and now - b > 0 else math.inf


@pytest.mark.parametrize("seed", range(40))
def test_ratio_index_tie_rules_against_a_scan(seed):
    """Ties go to the later pool member, the first 0 ends the scan, a pool
    of infinite scores yields its last member: with many equal keys."""
    rng = random.Random(seed)
    now, keys, pool = 10.0, {}, {}
    scan = Fixed(keys)
    index = RatioIndex(lambda storage, t, limit: (scan.score(storage, t), keys[storage]))
    for i in range(rng.randint(1, 30)):
        storage = Storage(i, rng.choice([0, 1, 1, 1]))
        keys[storage] = (rng.choice([0.0, 1.0, 1.0, 2.0, 3.0, 0.5]), rng.choice([0.0, 2.0, 5.0, 10.0]))
        pool[storage] = None
        index.add(storage, now)
    for storage in rng.sample(list(pool), len(pool) // 3):  # leave, and maybe come back at the end
        del pool[storage]
        index.remove(storage)
        if rng.random() < 0.5:
            pool[storage] = None
            index.add(storage, now)
    if pool:
        assert index.choose(pool, now) is scan.choose(pool, now)


def test_a_touched_storage_is_filed_again():
    """A key that no longer bounds the score (it dropped) is refreshed on `touch`."""
    keys: dict = {}
    index = RatioIndex(lambda s, t, limit: (keys[s][0] / (t - keys[s][1]), keys[s]))
    a, b = Storage(1, 1), Storage(2, 1)
    keys[a], keys[b] = (4.0, 0.0), (2.0, 0.0)
    pool = {a: None, b: None}
    index.add(a, 1.0)
    index.add(b, 1.0)
    assert index.choose(pool, 2.0) is b
    keys[a] = (1.0, 0.0)  # a's cost dropped
    index.touch(a)
    assert index.choose(pool, 2.0) is a


# ------------------------------------------------------------------ the schedule


def test_schedule_next_use_and_passed_reads():
    rt = Runtime(NullBackend(), 100, heuristic=get_heuristic("lookahead"))
    schedule = rt.schedule
    assert isinstance(schedule, Schedule) and schedule.position == 0
    x = rt.constant(1)
    y = rt.call("f", [x], [4], cost=1.0)[0]
    z = rt.call("view", [y], [0], cost=1.0, aliases=[0])[0]
    schedule.announce(y, [3.0, 7.0])
    schedule.announce(z, [5.0])
    assert schedule.next_storage_use(y.storage) == 3.0
    schedule.advance(4.0)
    assert schedule.next_use(y) == 7.0 and schedule.next_storage_use(y.storage) == 5.0
    assert list(schedule.passed_reads()) == [y]
    schedule.announce(z, [6.0])  # the value under a second name: the uses add up
    schedule.advance(2.0)
    assert schedule.next_use(z) == 6.0
    schedule.advance(2.0)
    assert schedule.next_storage_use(y.storage) == math.inf
    assert schedule.next_storage_use(x.storage) is None  # never announced


def drive_with_future(heuristic: str, budget: int) -> list[str]:
    """a, b, c (same size and cost) are made, then read in the order a, b, c;
    d is never read again; then e is made. Returns what was evicted."""
    rt = Runtime(NullBackend(), budget, heuristic=get_heuristic(heuristic))
    schedule = rt.schedule or Schedule()
    evicted: list[Storage] = []

    class Watch(Observer):
        def on_evict(self, storage, by_heuristic, clock):
            if by_heuristic:
                evicted.append(storage)

    rt.observers.append(Watch())
    w = rt.constant(1)
    made = {}
    for name, reads in (("a", [7.0]), ("b", [8.0]), ("c", [9.0]), ("d", []), ("e", [10.0])):
        made[name] = rt.call(name, [w], [4], cost=1.0)[0]
        schedule.announce(made[name], reads)
        schedule.advance(1.0)
    names = {t.storage: n for n, t in made.items()}
    return [names[s] for s in evicted]


def test_lookahead_evicts_what_is_needed_furthest_ahead():
    # Room for four: making e evicts one; for three: making d evicts one too.
    assert drive_with_future("lookahead", 1 + 4 * 4) == ["d"]  # never read again: score 0
    assert drive_with_future("lookahead", 1 + 4 * 3) == ["c", "d"]  # c is read last
    assert drive_with_future("dtr_eq", 1 + 4 * 3) == ["a", "b"]  # staleness: the oldest first


def test_lookahead_without_a_schedule_is_dtr_eq():
    """Storages no driver announced are scored by staleness, as h_DTR^eq does."""
    runs = []
    for heuristic in ("lookahead", "dtr_eq"):
        counters, observer = Counters(), Decisions()
        rt = Runtime(NullBackend(), 12, heuristic=get_heuristic(heuristic), observers=[counters, observer])
        xs = [rt.constant(1)]
        for _ in range(40):
            xs.append(rt.call("f", [xs[-1]], [1], cost=1.0)[0])
        for t in reversed(xs[1:]):
            rt.get(t)
        runs.append(observer.evicted)
    assert runs[0] == runs[1]


def test_lookahead_on_the_shared_logs():
    """docs/heuristics.md: lookahead fits U-Net in 40% of its peak (h_DTR^eq:
    out of memory) and runs ResNet-32 at 20% with less recomputation."""
    unet, resnet = shared_log("unet-6.log"), shared_log("resnet32-56.log")
    assert jdtr.simulate(unet, 0.4).status == "oom"
    assert round(jdtr.simulate(unet, 0.4, "lookahead").overhead, 4) == 1.1961
    assert round(jdtr.simulate(resnet, 0.2).overhead, 4) == 1.3322
    assert round(jdtr.simulate(resnet, 0.2, "lookahead").overhead, 4) == 1.2751


class WalkChecked(Lookahead):
    """The lookahead, checking each need it scores by (kept as the evicted
    region changes) against its definition, a walk of the evicted region."""

    def __init__(self):
        super().__init__()
        self.checked = 0

    def evaluate(self, storage, now, limit):
        score, key = super().evaluate(storage, now, limit)
        schedule = self.run.schedule
        if limit != -math.inf and storage.size > 0 and schedule.next_storage_use(storage) is not None:
            assert -key[1] == self.walked_need(storage)
            self.checked += 1
        return score, key


@pytest.mark.parametrize("dealloc", ["eager", "banish"])
def test_the_lookaheads_kept_needs_are_the_walks_on_a_log(dealloc):
    checked = WalkChecked()
    result = jdtr.simulate(shared_log("resnet32-56.log"), 0.2, checked, dealloc=dealloc)
    assert result.status == "ok" and checked.checked > 100
    if dealloc == "eager":  # (test_lookahead_on_the_shared_logs)
        assert round(result.overhead, 4) == 1.2751


def test_the_lookaheads_kept_needs_are_the_walks_past_conds(monkeypatch):
    """A `cond` moves an evicted storage's next use: the branch not taken
    passes its reads, the branch taken announces its own."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    moved = {"announced": 0, "passed": 0}
    late, passed = Schedule.late_announcements, Schedule.passed_reads

    def counted_late(self):
        found = late(self)
        moved["announced"] += len(found)
        return found

    def counted_passed(self):
        for tensor in passed(self):
            moved["passed"] += not tensor.storage.resident
            yield tensor

    monkeypatch.setattr(Schedule, "late_announcements", counted_late)
    monkeypatch.setattr(Schedule, "passed_reads", counted_passed)

    def layered(w, x, s):
        h = jnp.tanh(x @ w)
        for i in range(3):
            h = jax.lax.cond(s[i] > 0, lambda a: jnp.tanh(jnp.tanh(a @ w) @ w) * 2, lambda a: jnp.sin(a) - 1, h)
            h = jnp.tanh(h @ w)
        return jnp.sum(h**2)

    w = jax.random.normal(jax.random.PRNGKey(0), (48, 48)) * 0.2
    x = jax.random.normal(jax.random.PRNGKey(1), (96, 48))
    checked = WalkChecked()
    for signs in ([1.0, 1.0, 1.0], [-1.0, 1.0, -1.0]):
        for mode in ("online", "planned"):
            jdtr.grad(layered, budget=0.5, heuristic=checked, mode=mode)(w, x, jnp.asarray(signs))
    assert checked.checked > 200 and moved["announced"] > 0 and moved["passed"] > 0


def test_lookahead_in_jdtr_grad_matches_jax_grad():
    jax = pytest.importorskip("jax")
    from jdtr import models

    model = models.mlp_chain(layers=16, width=64, batch=128)
    expected = jax.grad(model.loss)(model.params, model.batch)
    grads, stats = jdtr.grad(model.loss, budget=0.5, heuristic="lookahead", return_stats=True, debug=True)(
        model.params, model.batch
    )
    _, eq_stats = jdtr.grad(model.loss, budget=0.5, return_stats=True)(model.params, model.batch)
    for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(expected)):
        assert (got == want).all()
    assert stats.peak_bytes <= stats.budget_bytes
    assert stats.overhead <= eq_stats.overhead


# -------------------------------------------------------------------- sampling


def test_sampled_heuristic_is_reproducible_and_keeps_the_budget():
    trace = shared_log("resnet32-56.log")
    first = decisions(trace, 0.4, Sampled("dtr_eq", seed=3))
    again = decisions(trace, 0.4, Sampled("dtr_eq", seed=3))
    assert first == again and first[0] == "ok"
    sampled = Sampled("dtr_eq")
    assert sampled.name == "dtr_eq_sampled" and get_heuristic(sampled) is sampled
