"""Property-based tests: random programs, random budgets, every heuristic and policy.

For each program drawn by `program_strategies.programs()` (a loss over a
random pytree, built from elementwise, matmul, reduction, reshape, slicing,
gather/scatter, concatenation, select, cumulative, convolution, pooling, cond, scan,
jit, custom_jvp/vjp, multi-output, integer, PRNG and callback operations),
jdtr's value and gradients must be `jax.value_and_grad`'s:

* unconstrained (budget 1.0), where nothing may be evicted;
* for every heuristic in `jdtr.HEURISTICS`, under a random budget in
  [0.2, 1.0] and a random dealloc policy, where the run either holds every
  byte within the budget (its own count, and `jax.live_arrays()` after each
  operator) or raises a clean `jdtr.OutOfBudgetError`;

with the caller's arrays intact, nothing left behind, and the same decisions
when a run is repeated. See `program_strategies.check_run` for the oracle.

The "ci" hypothesis profile runs a fixed slice; `make fuzz` runs thousands.
"""

from __future__ import annotations

import tempfile

import jax
import jax.numpy as jnp
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from jax import lax

import jdtr
import jdtr.models
from program_strategies import (
    OPERATIONS,
    RECORD,
    check_run,
    decisions,
    is_usable,
    programs,
    reference,
    run_configs,
    smallest_budget,
)

HEURISTICS = tuple(sorted(jdtr.HEURISTICS))
CONTROL_FLOW = ("cond", "scan", "call", "callback", "multi", "integer", "unary", "binary", "matmul", "reduce")


def check_program(program, configs):
    """Runs `program` unconstrained, then under each of `configs`, and checks
    every run; returns their `jdtr.Stats` (None: out of budget)."""
    note(repr(program))
    fun, (args, kwargs) = program.loss(), program.arguments()
    calls = RECORD.calls
    expected = reference(program, args, kwargs)
    callbacks = RECORD.calls - calls
    assume(is_usable(expected))
    common = dict(argnums=program.argnums, has_aux=program.has_aux, callbacks=callbacks, kwargs=kwargs)
    unconstrained = check_run(fun, args, expected, budget=None, **common)
    assert unconstrained.evictions == unconstrained.rematerializations == 0
    peak = unconstrained.unconstrained_peak_bytes
    runs = [unconstrained]
    for config in configs:
        note(repr(config))
        budget = config.budget
        if config.above_minimum:
            low = smallest_budget(fun, args, expected, argnums=program.argnums, has_aux=program.has_aux,
                                  heuristic=config.heuristic, dealloc=config.dealloc, peak=peak, kwargs=kwargs,
                                  cost_model=config.cost_model)
            budget = peak if low is None else low + int(config.budget * (peak - low))
            note(f"smallest budget found: {low} bytes of {peak}; running at {budget}")
        with tempfile.TemporaryDirectory() as log_dir:
            # The repeat runs as compiled chunks for one heuristic of the portfolio (compiling is the slow part).
            chunks = "auto" if config.heuristic in ("estar", "lookahead") else "never"
            runs.append(check_run(fun, args, expected, budget=budget, heuristic=config.heuristic, dealloc=config.dealloc,
                                  cost_model=config.cost_model, repeat=True, peak=peak, log_dir=log_dir, chunks=chunks,
                                  **common))
    return runs


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@settings(max_examples=4)
@given(data=st.data())
def test_generator_makes_valid_programs_of_every_operation(operation, data):
    """The generator's shape bookkeeping is right for each family: programs
    made of it (and a few unary steps) trace, and their value and gradients
    have the expected structure."""
    program = data.draw(programs(min_ops=2, max_ops=4, operations=(operation, "unary")))
    note(repr(program))
    args, kwargs = program.arguments()
    out = jax.eval_shape(jax.value_and_grad(program.loss(), program.argnums, program.has_aux), *args, **kwargs)
    value = out[0][0] if program.has_aux else out[0]
    assert value.shape == () and value.dtype == jnp.float32


def one_config_per_heuristic():
    return st.tuples(*(run_configs((h,)) for h in HEURISTICS))


@pytest.mark.long
@given(programs(), one_config_per_heuristic())
def test_random_programs_match_jax_under_budget(program, configs):
    check_program(program, configs)


@given(programs(max_ops=6, operations=CONTROL_FLOW), one_config_per_heuristic())
def test_control_flow_programs_match_jax_under_budget(program, configs):
    check_program(program, configs)


@given(programs(min_ops=3, max_ops=6, operations=("cond", "unary", "binary", "matmul")), st.sampled_from([0.8, 0.9, 1.0]))
def test_cond_programs_planned_by_paths_match_jax_under_budget(program, ratio):
    """Random programs with `cond`s, planned per path of branches (no log,
    no timeline: those run online), step by step and in chunks."""
    note(repr(program))
    assume("lax.cond(" in program.source or "lax.switch(" in program.source)
    fun, (args, kwargs) = program.loss(), program.arguments()
    calls = RECORD.calls
    expected = reference(program, args, kwargs)
    callbacks = RECORD.calls - calls
    assume(is_usable(expected))
    for chunks in ("never", "always"):
        stats = check_run(fun, args, expected, budget=ratio, heuristic="auto", chunks=chunks, argnums=program.argnums,
                          has_aux=program.has_aux, callbacks=callbacks, kwargs=kwargs)
        assert stats is None or stats.execution in ("steps", "chunks", "online")


# ------------------------------------------------------------------ determinism

DEALLOCS = ("eager", "banish", "ignore")


def _determinism_cases():
    """An RNN (a scan, unrolled) and a program with a cond, a top_k, a gather
    and a scatter."""
    cases = {"rnn": jdtr.models.rnn(steps=8, hidden=8, features=4, batch=32)}

    def mixed(params, x):
        h = x
        for _ in range(3):
            h = jnp.tanh(h @ params["w"])
            h = lax.cond(jnp.sum(h) > 0, lambda a: jnp.sin(a) * 2.0, lambda a: a @ params["w"], h)
        top, idx = lax.top_k(h, 3)
        h = h.at[:, 0].add(jnp.sum(top, axis=1)) + jnp.take_along_axis(h, idx, axis=1).sum()
        return jnp.mean(jnp.cumsum(h, axis=0) ** 2)

    key = jax.random.PRNGKey(3)
    params = {"w": jax.random.normal(key, (8, 8)) / 3}
    cases["mixed"] = jdtr.models.Model("mixed", mixed, params, jax.random.normal(key, (64, 8)))
    return cases


# Budgets under which every heuristic evicts on these cases (and fits, mostly).
BUDGETS = {"rnn": 0.8, "mixed": 0.6}


def _decisions_of(loss, model, heuristic, dealloc, budget, cost_model=None):
    try:
        _, stats = jdtr.grad(loss, budget=budget, heuristic=heuristic, dealloc=dealloc, cost_model=cost_model,
                             return_stats=True, timeline=True)(model.params, model.batch)
    except jdtr.OutOfBudgetError as err:
        return ("out of budget", err.op_name, err.needed_bytes, err.free_bytes)
    return decisions(stats)


def _same_function(loss):
    """A new function object with the same code: a cache miss, so a new trace."""
    return lambda params, batch: loss(params, batch)


@pytest.mark.parametrize("heuristic", sorted(HEURISTICS))
def test_same_program_same_decisions(heuristic):
    """The default cost model counts flops and bytes, so the same program,
    inputs and budget give the same evictions, replays and timeline: on a
    repeated call, and after a re-trace. "random" is seeded."""
    evicted = 0
    cases = _determinism_cases()
    for name in ("mixed", "rnn") if heuristic == "dtr_eq" else ("mixed",):  # (LRU-like ones thrash on the RNN)
        model, budget = cases[name], BUDGETS[name]
        for dealloc in DEALLOCS:
            first = _decisions_of(model.loss, model, heuristic, dealloc, budget)
            assert _decisions_of(model.loss, model, heuristic, dealloc, budget) == first, (name, dealloc)
            assert _decisions_of(_same_function(model.loss), model, heuristic, dealloc, budget) == first, (name, dealloc)
            evicted += first[0] != "out of budget" and first[3] > 0
    assert evicted >= 2  # the decisions compared are not trivial


@pytest.mark.parametrize("heuristic", ["msps", "dtr_full"])
def test_same_decisions_with_exact_costs(heuristic):
    """With integer costs every sum is exact, whatever the order it is taken
    in: the address-dependent heuristics decide alike too."""
    cost = lambda info: 1.0 + info.flops + info.bytes_accessed  # noqa: E731
    model = _determinism_cases()["mixed"]
    for dealloc in DEALLOCS:
        first = _decisions_of(model.loss, model, heuristic, dealloc, BUDGETS["mixed"], cost)
        for _ in range(2):
            assert _decisions_of(_same_function(model.loss), model, heuristic, dealloc, BUDGETS["mixed"], cost) == first


_IN_A_FRESH_PROCESS = r"""
import hashlib, json, sys
sys.path.insert(0, {tests!r})
import jax
from test_properties import BUDGETS, _decisions_of, _determinism_cases
out = {{}}
model = _determinism_cases()["mixed"]
for heuristic in ("dtr_eq", "random"):
    got = _decisions_of(model.loss, model, heuristic, "eager", BUDGETS["mixed"])
    out[heuristic] = hashlib.sha256(repr(got).encode()).hexdigest()
print(json.dumps(out))
"""


def test_same_decisions_in_a_fresh_process():
    """Decisions do not depend on anything a process picks at random (hash
    seeds, addresses, caches)."""
    import hashlib
    import json
    import os
    import pathlib
    import subprocess
    import sys

    tests = str(pathlib.Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONHASHSEED="12345")
    done = subprocess.run([sys.executable, "-c", _IN_A_FRESH_PROCESS.format(tests=tests)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    model = _determinism_cases()["mixed"]
    assert sorted(theirs) == ["dtr_eq", "random"]
    for heuristic, digest in theirs.items():
        ours = _decisions_of(model.loss, model, heuristic, "eager", BUDGETS["mixed"])
        assert hashlib.sha256(repr(ours).encode()).hexdigest() == digest, heuristic


# ------------------------------------------------------------------ the floor


@given(programs(operations=tuple(name for name in OPERATIONS if name != "cond")), st.sampled_from(DEALLOCS))
def test_no_run_of_a_random_program_holds_less_than_its_floor(program, dealloc):
    """`jdtr.oplog.floor` is a lower bound: every run that fits, by any
    heuristic at any budget, peaks at or above it (the planner raises under
    it without simulating). Programs without `cond`s: a plan simulates each
    by its largest branch, and so does the floor."""
    from jdtr.transform.planner import _Simulation

    note(repr(program))
    fun, (args, kwargs) = program.loss(), program.arguments()
    f = jdtr.value_and_grad(fun, program.argnums, program.has_aux, return_stats=True)
    f(*args, **kwargs)
    for traced in f.cache.values():
        simulate = _Simulation(traced.program, [False] * len(traced.program.inputs), dealloc)
        least = simulate.floor.total_bytes
        peak = traced.unconstrained_peak
        assert least <= max(peak, 1)
        for heuristic in ("dtr_eq", "lru", "msps"):
            for ratio in (1.0, 0.7, 0.5, 0.35, 0.2):
                result, counters, _ = simulate(int(peak * ratio), heuristic)
                if result.ok:
                    assert counters.peak_bytes >= least, (heuristic, ratio, counters.peak_bytes, simulate.floor)
