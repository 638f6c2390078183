"""The simulator: operator logs (`jdtr.Trace`) replayed on jdtr's own runtime.

The reference is the paper authors' simulator: on the DTR prototype's logs
of ResNet-32 and U-Net, `jdtr.simulate` must give the figures listed in
shared/dtr-logs/README.md (their simulator's output) exactly.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

import jdtr
from jdtr.cli import main
from jdtr.runtime import NullBackend, Runtime
from jdtr.budget import parse_budget
from jdtr.simulator import checkmate_graph, format_table, interval_bound, run_baseline, sweep
from jdtr.oplog import (
    Annotate,
    Call,
    ComputeStep,
    Constant,
    Copy,
    CopyFrom,
    LogFormatError,
    Mutate,
    Release,
    ReleaseStep,
    RetainStep,
    Trace,
)

# The repository is checked out at X/main, the shared logs live at X/shared.
LOGS = Path(__file__).resolve().parents[2] / "shared" / "dtr-logs"


def shared_log(name: str) -> Path:
    path = LOGS / name
    if not path.is_file():
        pytest.skip(f"{path} not found: the shared DTR prototype logs are expected at <checkout>/../shared/dtr-logs")
    return path


# ------------------------------------------------------------------ README figures

# shared/dtr-logs/README.md: the authors' simulator, h_DTR^eq with eager eviction.
RESNET_RATIOS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.12, 0.1)
RESNET_RESULTS = ("1.0021", "1.0248", "1.0737", "1.1068", "1.1404", "1.1786", "1.2103", "1.3322", "1.4325",
                  "thrash", "OOM")  # fmt: skip
UNET_RATIOS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
UNET_RESULTS = ("1.0027", "1.0577", "1.1489", "1.1587", "OOM", "OOM", "OOM", "OOM")

FIGURES = {  # unconstrained peak MB, baseline compute ms, constants MB, largest single op MB
    "resnet32-56.log": (10061.18, 291.91, 35.58, 539.51),
    "unet-6.log": (8415.76, 435.28, 93.39, 1943.08),
}


@pytest.fixture(scope="module", params=["resnet32-56.log", "unet-6.log"])
def paper_log(request):
    path = shared_log(request.param)
    return request.param, Trace.from_log(path)


@pytest.mark.parametrize(
    "name, ratios, expected",
    [("resnet32-56.log", RESNET_RATIOS, RESNET_RESULTS), ("unet-6.log", UNET_RATIOS, UNET_RESULTS)],
)
def test_readme_overheads_reproduced_exactly(name, ratios, expected):
    results = sweep(Trace.from_log(shared_log(name)), ratios, ["dtr_eq"], "eager")
    got = tuple(f"{r.overhead:.4f}" if r.ok else {"oom": "OOM", "thrash": "thrash"}[r.status] for r in results)
    assert got == expected
    for result, want in zip(results, expected):
        if result.ok:  # the brief's tolerance, implied by the exact match above
            assert result.overhead == pytest.approx(float(want), rel=0.02)
            assert result.peak_bytes <= result.budget_bytes


@pytest.mark.parametrize(
    "name, ratios, expected",
    [("resnet32-56.log", RESNET_RATIOS, RESNET_RESULTS), ("unet-6.log", UNET_RATIOS, UNET_RESULTS)],
)
def test_optimum_lower_bound_lies_below_the_readme_figures(name, ratios, expected):
    """Checkmate's MILP is out of HiGHS's reach on these logs; the interval
    relaxation still bounds the optimum from below, so it must lie under the
    compute the paper's DTR achieved, and above the baseline when memory is short."""
    pytest.importorskip("scipy")
    trace = Trace.from_log(shared_log(name))
    graph = checkmate_graph(trace.program)
    peak = run_baseline(trace.program).peak_bytes
    for ratio, want in zip(ratios, expected):
        if want in ("OOM", "thrash"):
            continue
        bound = interval_bound(graph, parse_budget(ratio).resolve(peak)) / sum(graph.costs)
        assert bound <= float(want), (ratio, bound)
        assert bound > 1.0 or ratio == 1.0, (ratio, bound)


def test_refinement_proves_an_optimum_of_the_paper_log_where_the_first_relaxation_cannot():
    """At half of ResNet-32's peak the first relaxation's bound (1.0536) is
    below every schedule it yields (1.0677); refining the 32 nodes those
    schedules recompute more than it charged closes the gap, with no MILP:
    the optimum is 1.0538, below the paper's DTR (1.1068)."""
    pytest.importorskip("scipy")
    trace = Trace.from_log(shared_log("resnet32-56.log"))
    graph = checkmate_graph(trace.program)
    result = jdtr.optimal(trace, 0.5, time_limit=60, rel_gap=1e-4)
    assert result.status == "optimal" and result.variables == 0 and "refined relaxation" in result.message
    first = interval_bound(graph, result.budget_bytes)
    assert first < result.bound <= result.total_cost <= result.bound * (1 + 1e-4)
    assert result.overhead == pytest.approx(1.0538, abs=1e-4)
    assert result.overhead < float(RESNET_RESULTS[RESNET_RATIOS.index(0.5)])
    # Tighter, the gap stays open in a few seconds; Checkmate's MILP (224k binaries) is not even built.
    rushed = jdtr.optimal(trace, 0.3, time_limit=3, rel_gap=1e-4)
    assert rushed.status == "timeout" and rushed.variables == 0 and "not built" in rushed.message
    assert interval_bound(graph, rushed.budget_bytes) <= rushed.bound < rushed.total_cost


def test_readme_trace_figures(paper_log):
    name, trace = paper_log
    result = jdtr.simulate(trace, 1.0)
    peak_mb, compute_ms, constants_mb, largest_mb = FIGURES[name]
    assert round(result.unconstrained_peak_bytes / 1e6, 2) == peak_mb
    assert round(result.baseline_cost / 1e6, 2) == compute_ms
    assert round(result.constant_bytes / 1e6, 2) == constants_mb
    assert round(result.largest_op_bytes / 1e6, 2) == largest_mb
    # simrd's budget is int(peak * ratio); the baseline run frees constants, so
    # ratio 1.0 needs one rematerialization (README: 1.0021 / 1.0027).
    assert result.budget_bytes == result.unconstrained_peak_bytes
    assert result.rematerializations >= 1


def test_budget_forms_agree_and_truncate():
    trace = Trace.from_log(shared_log("resnet32-56.log"))
    by_ratio = jdtr.simulate(trace, 0.3)
    assert by_ratio.budget_bytes == int(0.3 * by_ratio.unconstrained_peak_bytes) == 3018353745
    by_bytes = jdtr.simulate(trace, by_ratio.budget_bytes)
    assert by_bytes == by_ratio
    by_path = jdtr.simulate(shared_log("resnet32-56.log"), "3018353745B")
    assert by_path == by_ratio


def test_thrash_and_oom_are_results_with_reasons():
    trace = Trace.from_log(shared_log("resnet32-56.log"))
    thrash = jdtr.simulate(trace, 0.12)
    assert thrash.status == "thrash" and thrash.overhead is None
    assert thrash.remat_cost > thrash.baseline_cost  # overhead limit 2x
    oom = jdtr.simulate(trace, 0.1)
    assert oom.status == "oom" and "needs" in oom.message
    unlimited = jdtr.simulate(trace, 0.12, overhead_limit=None)
    assert unlimited.status in ("ok", "oom")


# ------------------------------------------------------------------ the log format


def test_shared_logs_round_trip_byte_for_byte(paper_log, tmp_path):
    name, trace = paper_log
    out = tmp_path / name
    trace.to_log(out)
    assert out.read_bytes() == shared_log(name).read_bytes()
    again = Trace.from_log(out)
    assert again == trace and again.records == trace.records


def test_shared_log_contents(paper_log):
    name, trace = paper_log
    calls = [r for r in trace.records if isinstance(r, Call)]
    mutates = [r for r in trace.records if isinstance(r, Mutate)]
    constants = [r for r in trace.records if isinstance(r, Constant)]
    expected = {"resnet32-56.log": (286, 0, 223), "unet-6.log": (210, 37, 152)}[name]
    assert (len(calls), len(mutates), len(constants)) == expected
    assert trace.records[0] == Annotate("START")
    assert trace.program.compute_cost == sum(r.time for r in calls + mutates)


TINY = """\
{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}
{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":"10"}
{"INSTRUCTION":"CALL","NAME":"f","ARGS":["w"],"RESULT":["a"],"TIME":"100"}
{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"100"}
{"INSTRUCTION":"ALIAS","NAME":"a","ALIAS":"-1"}
{"INSTRUCTION":"CALL","NAME":"g","ARGS":["a"],"RESULT":["b"],"TIME":"200"}
{"INSTRUCTION":"MEMORY","NAME":"b","MEMORY":"100"}
{"INSTRUCTION":"ALIAS","NAME":"b","ALIAS":"-1"}
{"INSTRUCTION":"CALL","NAME":"h","ARGS":["b"],"RESULT":["c"],"TIME":"300"}
{"INSTRUCTION":"MEMORY","NAME":"c","MEMORY":"100"}
{"INSTRUCTION":"ALIAS","NAME":"c","ALIAS":"-1"}
{"INSTRUCTION":"CALL","NAME":"k","ARGS":["a","c"],"RESULT":["d"],"TIME":"400"}
{"INSTRUCTION":"MEMORY","NAME":"d","MEMORY":"10"}
{"INSTRUCTION":"ALIAS","NAME":"d","ALIAS":"-1"}
{"INSTRUCTION":"RELEASE","NAME":"a"}
{"INSTRUCTION":"RELEASE","NAME":"b"}
{"INSTRUCTION":"RELEASE","NAME":"c"}
"""


@pytest.fixture
def tiny_log(tmp_path):
    path = tmp_path / "tiny.log"
    path.write_text(TINY)
    return path


def test_tiny_log_by_hand(tiny_log):
    """w(10 B) -> a -> b -> c, then d = k(a, c); every step worked out by hand.

    Baseline: everything is live at d, peak 10 + 3 * 100 + 10 = 320 B, compute
    1000 ns. Under 250 B: computing c evicts a (b is locked); d needs a back,
    whose replay evicts b (c is locked); then d fits (220 B). Clock 1 + 1000 +
    100, overhead 1.101. Releasing a and c at the end frees them eagerly.
    """
    trace = Trace.from_log(tiny_log)
    result = jdtr.simulate(trace, 250)
    assert result.status == "ok"
    assert result.unconstrained_peak_bytes == 320 and result.baseline_cost == 1000
    assert result.budget_bytes == 250 and result.budget_ratio == 250 / 320
    assert result.overhead == pytest.approx(1101 / 1000, abs=1e-15)
    assert (result.evictions, result.dealloc_evictions, result.rematerializations) == (2, 2, 1)
    assert result.remat_cost == 100 and result.peak_bytes == 220
    assert (result.constant_bytes, result.largest_op_bytes) == (10, 210)  # d: 10 out + a, c in
    assert jdtr.simulate(trace, 0.78125) == result  # the same budget as a ratio of 320 B
    assert jdtr.simulate(trace, 250, overhead_limit=1.05).status == "thrash"  # 100 > 1000 * 0.05
    assert jdtr.simulate(trace, 219).status == "oom"  # d needs w, a, c and itself
    unconstrained = jdtr.simulate(trace, 1.0)
    assert unconstrained.overhead == pytest.approx(1001 / 1000) and unconstrained.evictions == 0


def test_tiny_log_round_trip_and_programmatic_trace(tiny_log, tmp_path):
    trace = Trace.from_log(tiny_log)
    assert trace.records[:3] == (
        Annotate("START"),
        Constant("w", 10),
        Call("f", ("w",), ("a",), 100, (100,), (-1,)),
    )
    built = Trace(trace.records)
    assert built == trace and hash(built) == hash(trace)
    out = tmp_path / "out.log"
    built.to_log(out)
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        json.loads(line) for line in TINY.splitlines()
    ]
    assert Trace.from_log(out) == trace


def test_copy_on_write_mutation_copies_alias_and_outputs():
    """MUTATE as App. C.6: a pure op writing a fresh copy of each overwritten
    argument, as large as the whole storage it views; COPY/COPY_FROM move
    references; records before START are not replayed; a RELEASE of a name
    never defined is ignored; still-referenced values are outputs."""
    records = [
        Constant("junk", 7),  # before START: not replayed
        Annotate("START"),
        Constant("x", 64),
        Call("view", ("x",), ("v",), 5, (16,), (0,)),  # a view of x: no memory of its own
        Mutate("add_", ("v", "x"), (0,), 9),  # overwrites the view: copies all 64 bytes
        Copy("y", "v"),
        CopyFrom("x", "y"),  # x now names v's new value; x's old value loses a reference
        Release("never-defined"),
        Release("y"),
    ]
    trace = Trace(records)
    program = trace.program
    x, v, v_new = 0, 1, 2
    assert program.value_names == ("x", "v", "v$")
    assert program.steps == (
        ComputeStep("x", (), (x,), (64,), (-1,), 0, constant=True),
        ComputeStep("view", (x,), (v,), (0,), (0,), 5),
        ComputeStep("add_", (v, x), (v_new,), (64,), (-1,), 9),
        ReleaseStep(v),
        RetainStep(v_new),
        RetainStep(v_new),
        ReleaseStep(x),
        ReleaseStep(v_new),
    )
    assert program.outputs == (v_new,)  # x's name now holds v_new; the old x is released
    assert program.compute_cost == 14 and program.constant_bytes == 64
    assert program.largest_op_bytes == 64 + 0 + 64  # add_: its copy plus its inputs (the view counts 0)
    result = jdtr.simulate(trace, 1.0)
    assert result.status == "ok" and result.unconstrained_peak_bytes == 128


def test_copy_from_onto_the_same_value_keeps_it_alive():
    # `x = x` in the program: the reference simulator would free x first.
    trace = Trace([Constant("w", 4), Call("f", ("w",), ("x",), 3, (8,), (-1,)), Copy("y", "x"), CopyFrom("y", "x"),
                   Call("g", ("y",), ("z",), 3, (8,), (-1,))])  # fmt: skip
    assert jdtr.simulate(trace, 1.0).status == "ok"


def line(obj) -> str:
    return json.dumps(obj)


START = line({"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"})
CONST_W = [line({"INSTRUCTION": "CONSTANT", "NAME": "w"}), line({"INSTRUCTION": "MEMORY", "NAME": "w", "MEMORY": "8"})]


def call(args, result, time="5"):
    return line({"INSTRUCTION": "CALL", "NAME": "f", "ARGS": args, "RESULT": result, "TIME": time})


def memory(name, size="8"):
    return line({"INSTRUCTION": "MEMORY", "NAME": name, "MEMORY": size})


def alias(name, index="-1"):
    return line({"INSTRUCTION": "ALIAS", "NAME": name, "ALIAS": index})


MALFORMED = {
    "bad json": ([START, '{"INSTRUCTION": "CONSTANT", "NAME": "w"'], 2, "not valid JSON"),
    "not an object": ([START, "[1, 2]"], 2, "expected a JSON object"),
    "no instruction": ([START, '{"NAME": "w"}'], 2, "no INSTRUCTION"),
    "instruction not a string": ([START, '{"INSTRUCTION": ["CALL"]}'], 2, "unknown instruction \\['CALL'\\]"),
    "unknown instruction": ([START, '{"INSTRUCTION": "FREE", "NAME": "w"}'], 2, "unknown instruction 'FREE'"),
    "missing field": ([START, *CONST_W, '{"INSTRUCTION": "CALL", "NAME": "f", "ARGS": ["w"], "RESULT": ["a"]}'], 4,
                      "lacks field.*TIME"),
    "unexpected field": ([START, '{"INSTRUCTION": "RELEASE", "NAME": "w", "EXTRA": "1"}'], 2,
                         "unexpected field.*EXTRA"),
    "undefined argument": ([START, *CONST_W, call(["w", "q"], ["a"]), memory("a"), alias("a")], 4,
                           "argument 'q' is not defined"),
    "undefined copy source": ([START, line({"INSTRUCTION": "COPY", "DST": "b", "SRC": "nope"})], 2,
                              "COPY source 'nope' is not defined"),
    "undefined copy_from destination": ([START, *CONST_W, line({"INSTRUCTION": "COPY_FROM", "DST": "z", "SRC": "w"})],
                                        4, "'z' is not defined"),
    "negative size": ([START, line({"INSTRUCTION": "CONSTANT", "NAME": "w"}), memory("w", "-8")], 3,
                      "MEMORY must not be negative"),
    "non-numeric time": ([START, *CONST_W, call(["w"], ["a"], "fast"), memory("a"), alias("a")], 4,
                         "TIME must be an integer.*'fast'"),
    "number not a string": ([START, *CONST_W, call(["w"], ["a"], 5), memory("a"), alias("a")], 4,
                            "TIME must be a number written as a string"),
    "negative time": ([START, *CONST_W, call(["w"], ["a"], "-5"), memory("a"), alias("a")], 4,
                      "TIME must not be negative"),
    "non-numeric size": ([START, *CONST_W, call(["w"], ["a"]), memory("a", "1e3"), alias("a")], 5,
                         "MEMORY must be an integer"),
    "missing memory after call": ([START, *CONST_W, call(["w"], ["a"]), alias("a")], 5,
                                  "expected the MEMORY line of 'a'.*found ALIAS"),
    "missing alias after call": ([START, *CONST_W, call(["w"], ["a", "b"]), memory("a"), memory("b"), alias("b")], 6,
                                 "expected the ALIAS line of 'a'"),
    "log ends inside a call": ([START, *CONST_W, call(["w"], ["a"]), memory("a")], 4, "log ends where the ALIAS"),
    "memory of another tensor": ([START, line({"INSTRUCTION": "CONSTANT", "NAME": "w"}), memory("v")], 3,
                                 "found one for 'v'"),
    "stray memory": ([START, *CONST_W, memory("w")], 4, "MEMORY line for 'w' does not follow"),
    "alias out of range": ([START, *CONST_W, call(["w"], ["a"]), memory("a"), alias("a", "1")], 4,
                           "ALIAS of 'a' must be -1 or an index"),
    "mutate out of range": ([START, *CONST_W, line({"INSTRUCTION": "MUTATE", "NAME": "add_", "ARGS": ["w"],
                                                    "MUTATE": [3], "TIME": "1"})], 4, "MUTATE index 3"),
    "defined twice": ([START, *CONST_W, call(["w"], ["w"]), memory("w"), alias("w")], 4, "'w' is already defined"),
    "released too often": ([START, *CONST_W, line({"INSTRUCTION": "RELEASE", "NAME": "w"}),
                            line({"INSTRUCTION": "RELEASE", "NAME": "w"})], 5, "released more often"),
    "used after release": ([START, *CONST_W, line({"INSTRUCTION": "RELEASE", "NAME": "w"}), call(["w"], ["a"]),
                            memory("a"), alias("a")], 5, "used after every reference"),
    "call without results": ([START, *CONST_W, call(["w"], [])], 4, "has no RESULT"),
    "names not strings": ([START, *CONST_W, call(["w", 3], ["a"]), memory("a"), alias("a")], 4,
                          "ARGS must be a tensor name"),
    "huge size": ([START, line({"INSTRUCTION": "CONSTANT", "NAME": "w"}), memory("w", "9" * 5000)], 3,
                  "MEMORY is too large \\(5000 digits"),
    "huge time": ([START, *CONST_W, call(["w"], ["a"], "1" + "0" * 19), memory("a"), alias("a")], 4,
                  "TIME is too large"),
    "a call reading its own result (a cycle)": ([START, *CONST_W, call(["a"], ["a"]), memory("a"), alias("a")], 4,
                                                "argument 'a' is not defined"),
    "code is data": ([START, line({"INSTRUCTION": "CONSTANT", "NAME": "w"}),
                      memory("w", "__import__('os').getpid()")], 3, "MEMORY must be an integer"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_logs_name_the_line(case, tmp_path):
    lines, number, pattern = MALFORMED[case]
    path = tmp_path / "bad.log"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogFormatError, match=pattern) as info:
        Trace.from_log(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.line == number
    assert str(err).startswith(f"{path}, line {number}: ")


def test_non_utf8_and_blank_lines(tmp_path):
    path = tmp_path / "bytes.log"
    path.write_bytes(b"\n".join([START.encode(), b"", *(c.encode() for c in CONST_W), b'{"INSTRUCTION": "\xff"}']))
    with pytest.raises(LogFormatError, match="not UTF-8") as info:
        Trace.from_log(path)
    assert info.value.line == 5  # the blank line 2 is skipped but still counted


def test_programmatic_records_are_checked():
    with pytest.raises(LogFormatError, match="record 1: argument 'nope' is not defined"):
        Trace([Constant("w", 1), Call("f", ("nope",), ("a",), 1, (1,), (-1,))])
    with pytest.raises(LogFormatError, match="1 results but 2 MEMORY"):
        Call("f", ("w",), ("a",), 1, (1, 2), (-1,))
    with pytest.raises(LogFormatError, match="MEMORY must not be negative"):
        Constant("w", -1)
    with pytest.raises(LogFormatError, match="lists an argument position twice"):
        Mutate("add_", ("a", "b"), (0, 0), 1)


def random_trace(seed: int, steps: int = 40) -> Trace:
    """A valid trace with views, multi-output calls, in-place calls, copies and releases."""
    rng = random.Random(seed)
    records: list = [Annotate("START")]
    refs: dict[str, list[int]] = {}  # name -> its value's reference count, shared by COPY
    counter = iter(range(10**6))

    def live() -> list[str]:
        return [name for name, count in refs.items() if count[0] > 0]

    for _ in range(rng.randint(1, 3)):
        name = f"c{next(counter)}"
        records.append(Constant(name, rng.choice([8, 16, 64])))
        refs[name] = [1]
    for _ in range(steps):
        names, kind = live(), rng.random()
        if kind < 0.45 or len(names) < 3:
            args = tuple(rng.choice(names[-5:]) for _ in range(rng.randint(1, 3)))
            result = tuple(f"t{next(counter)}" for _ in range(rng.choice([1, 1, 2, 3])))
            alias = tuple(rng.randrange(len(args)) if rng.random() < 0.2 else -1 for _ in result)
            memory = tuple(rng.choice([8, 16, 16, 64]) for _ in result)
            records.append(Call("op", args, result, rng.choice([5, 10, 40]), memory, alias))
            refs.update({name: [1] for name in result})
        elif kind < 0.52:
            name = rng.choice(names)
            records.append(Mutate("add_", (name,), (0,), rng.choice([5, 10])))
            refs[name][0] -= 1  # the old value loses this name's reference...
            refs[name] = [1]  # ...which now holds the fresh copy
        elif kind < 0.58:
            src, dst = rng.choice(names), f"t{next(counter)}"
            records.append(Copy(dst, src))
            refs[src][0] += 1
            refs[dst] = refs[src]
        else:
            name = rng.choice(names[:-2] or names)
            records.append(Release(name))
            refs[name][0] -= 1
    return Trace(records)


@pytest.mark.parametrize("seed", range(12))
def test_random_traces_keep_the_budget_and_account_exactly(seed):
    trace = random_trace(seed)
    assert Trace.from_lines(trace.to_lines()) == trace
    cost = trace.program.compute_cost
    roomy = jdtr.simulate(trace, 10**9)  # holds everything: nothing to evict or recompute
    assert roomy.status == "ok" and roomy.evictions == roomy.rematerializations == 0
    assert roomy.overhead == pytest.approx((1 + cost) / cost)
    for heuristic in sorted(jdtr.HEURISTICS):
        for ratio in (1.0, 0.8, 0.6):
            result = jdtr.simulate(trace, ratio, heuristic)
            assert result.status in ("ok", "oom", "thrash")
            assert result.peak_bytes <= result.budget_bytes
            if result.ok:
                assert result.overhead * cost == pytest.approx(1 + cost + result.remat_cost)
                assert result.remat_cost <= cost  # otherwise it would have thrashed
    for dealloc in ("banish", "ignore"):
        assert jdtr.simulate(trace, 0.7, dealloc=dealloc).status in ("ok", "oom", "thrash")


# ------------------------------------------------------- runtime order the simulator relies on


def test_pool_order_follows_the_reference_simulator():
    """New outputs join the pool before their inputs are unlocked, the
    requested output last: the pool's order breaks ties between equal scores."""
    rt = Runtime(NullBackend(), 10**6)
    w = rt.constant(1)
    x = rt.call("x", [w], [4], cost=1)[0]
    a, b, c = rt.call("split", [x], [4, 4, 4], cost=1)
    assert list(rt.pool) == [b.storage, c.storage, a.storage, x.storage]
    rt._evict(b.storage, by_heuristic=True)
    rt._rematerialize(b)  # replays split for b: a and c are duplicates, freed at once
    assert list(rt.pool)[-2:] == [b.storage, x.storage]
    assert rt.memory == 1 + 4 * 4


def test_view_cost_charged_once_per_storage_when_called():
    rt = Runtime(NullBackend(), 10**6)
    w = rt.constant(1)
    x = rt.call("x", [w], [4], cost=2)[0]
    rt.call("unbind", [x], [0, 0], cost=3, aliases=[0, 0])  # two views of x from one op
    assert x.storage.cost == 2 + 3


# ------------------------------------------------------------------------- the CLI


def test_cli_replay_json(capsys):
    status = main(["replay", str(shared_log("resnet32-56.log")), "--ratio", "0.5", "--json"])
    assert status == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "ok" and round(out["overhead"], 4) == 1.1068
    assert out["budget_bytes"] == 5030589576 and out["unconstrained_peak_bytes"] == 10061179152
    assert 0 < out["peak_bytes"] <= out["budget_bytes"]
    assert out["heuristic"] == "dtr_eq" and out["dealloc"] == "eager"


def test_cli_replay_text_and_budget(capsys, tiny_log):
    assert main(["replay", str(tiny_log), "--budget", "250B", "--heuristic", "lru"]) == 0
    text = capsys.readouterr().out
    assert "ok, overhead 1.1010 (lru, eager deallocation)" in text
    assert "unconstrained peak    320 B" in text


def test_cli_reports_malformed_logs(capsys, tmp_path):
    path = tmp_path / "bad.log"
    path.write_text(START + "\n" + '{"INSTRUCTION":"FROB"}\n')
    assert main(["replay", str(path), "--ratio", "0.5"]) == 2
    assert "line 2: unknown instruction 'FROB'" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.log"), "--ratio", "0.5"]) == 2
    assert main(["replay", str(path), "--ratio", "1.5"]) == 2  # a fraction must lie in (0, 1]


def test_cli_sweep_table_progress_and_plot(capsys, tiny_log, tmp_path):
    png = tmp_path / "fig2.png"
    argv = ["sweep", str(tiny_log), "--ratios", "1.0", "0.78125", "0.5", "--heuristics", "dtr_eq", "size"]
    assert main([*argv, "--plot", str(png)]) == 0
    captured = capsys.readouterr()
    rows = captured.out.splitlines()
    assert rows[1].split() == ["heuristic", "\\", "ratio", "1", "0.78125", "0.5"]
    assert rows[2].split() == ["dtr_eq", "1.0010", "1.1010", "OOM"]
    assert rows[3].split()[0] == "size"
    assert "[6/6] size at 0.5: OOM" in captured.err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_sweep_json_matches_library(capsys, tiny_log):
    assert main(["sweep", str(tiny_log), "--ratios", "1.0", "0.78125", "--heuristics", "dtr_eq", "--json",
                 "--quiet"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert captured.err == ""
    out = json.loads(captured.out)
    expected = sweep(tiny_log, [1.0, 0.78125], ["dtr_eq"])
    assert [r["overhead"] for r in out["results"]] == [r.overhead for r in expected]
    assert format_table([1.0, 0.78125], expected).splitlines()[1].split() == ["dtr_eq", "1.0010", "1.1010"]


def test_python_dash_m_jdtr(tiny_log):
    done = subprocess.run(
        [sys.executable, "-m", "jdtr", "replay", str(tiny_log), "--ratio", "1.0", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    out = json.loads(done.stdout)
    assert out["status"] == "ok" and math.isclose(out["overhead"], 1.001)


SHIPPED_LOG = Path(__file__).resolve().parents[1] / "examples" / "data" / "transformer-2x32.log"


def test_cli_on_the_shipped_log(capsys):
    """The README's commands on the log in the repository (issue 23, item 7),
    against the library's own reading of it."""
    assert main(["replay", str(SHIPPED_LOG), "--ratio", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = jdtr.simulate(jdtr.Trace.from_log(SHIPPED_LOG), 0.5)
    assert out["status"] == "ok" and out["overhead"] == expected.overhead and round(expected.overhead, 3) == 1.164
    assert out["rematerializations"] == expected.rematerializations > 0
    assert main(["replay", str(SHIPPED_LOG), "--budget", str(out["unconstrained_peak_bytes"]), "--json"]) == 0
    at_peak = json.loads(capsys.readouterr().out)  # plain digits are bytes: the peak, where nothing is replayed
    assert at_peak["budget_ratio"] == 1.0 and at_peak["rematerializations"] == 0


def test_cli_refuses_what_has_no_meaning(capsys, tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    only_start = tmp_path / "start.log"
    only_start.write_text(START + "\n")
    for log in (empty, only_start):
        for command in ("replay", "optimal", "sweep"):
            argv = [command, str(log)] + (["--ratio", "0.5"] if command != "sweep" else [])
            assert main(argv) == 2
            assert "no operator calls" in capsys.readouterr().err
    for limit in ("nan", "-1", "0.5", "two"):
        with pytest.raises(SystemExit) as exit:
            main(["replay", str(SHIPPED_LOG), "--ratio", "0.5", "--overhead-limit", limit])
        assert exit.value.code == 2
        assert "--overhead-limit" in capsys.readouterr().err
    assert main(["replay", str(SHIPPED_LOG), "--ratio", "0.5", "--overhead-limit", "inf"]) == 0
    assert main(["replay", str(SHIPPED_LOG), "--budget", "4000000000"]) == 0
    assert "budget                4000000000 B" in capsys.readouterr().out


@pytest.mark.parametrize("heuristic", ["dtr_eq", "lookahead", "dtr_full"])
def test_a_simulation_leaves_nothing_for_the_cycle_collector(heuristic):
    """A run's graph (storages, tensors, operators, union-find sets) is
    unlinked when it ends: freed by reference count, not left to a
    collection that walks tens of thousands of objects in the caller's time."""
    import gc

    trace = jdtr.Trace.from_log(str(Path(__file__).parent.parent / "examples" / "data" / "transformer-2x32.log"))
    gc.collect()
    gc.disable()
    try:
        result = jdtr.simulate(trace, 0.4, heuristic=heuristic, overhead_limit=None)
        assert result.ok and result.evictions > 0  # a run that built evicted sets
        assert gc.collect() < 20, "a simulation left reference cycles behind"
    finally:
        gc.enable()
