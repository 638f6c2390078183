"""What an eviction decision costs: the pool index against the paper's full scan.

Replays traces of about 100,000 tensors through `jdtr.simulate`'s runtime
with h_DTR^eq three ways:

* index: `DTREqClass()`, the default: the pool is kept in a `RatioIndex`
  and only the storages that could beat the best are scored;
* full scan: `DTREqClass(indexed=False)`, the paper's simulator, scoring
  every evictable storage at every eviction (the exact reference);
* sampled: `Sampled("dtr_eq")`, App. E.2's approximation, scoring a random
  sample of ceil(sqrt(n)) of the n evictable storages.

For each: the time per decision, the share of the whole replay spent
deciding, and the resulting simulated overhead (compute / baseline compute).
Where a full scan of the whole run would take too long, the full scan is
timed in the index run's states instead: every k-th decision is also taken
by a full scan, which must pick the same storage (it is checked), and the
full scan's replay time is projected from those samples. Times are CPU time
of this process (`time.process_time`), which the other work on a shared
machine disturbs less than wall time.

    python benchmarks/eviction_cost.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Optional

from jdtr.runtime import Counters, Heuristic, NullBackend, OutOfBudgetError, Runtime, Sampled, ThrashError
from jdtr.offline import run_baseline
from jdtr.oplog import Annotate, Call, Constant, Release, Trace, replay
from jdtr.runtime.heuristics import DTREqClass


def chain_trace(n: int) -> Trace:
    """Theorem 3.1's network (tests/test_theorem31.py): unit sizes and costs, 2n + 1 tensors."""
    records: list = [Annotate("START"), Constant("t0", 1)]
    for i in range(1, n + 1):
        records.append(Call("f", (f"t{i - 1}",), (f"t{i}",), 1, (1,), (-1,)))
    records += [Release(f"t{n}"), Call("df", (f"t{n - 1}",), (f"g{n}",), 1, (1,), (-1,)), Release(f"t{n - 1}")]
    for i in range(n - 1, 0, -1):
        records.append(Call("df", (f"g{i + 1}", f"t{i - 1}"), (f"g{i}",), 1, (1,), (-1,)))
        records.append(Release(f"g{i + 1}"))
        if i > 1:
            records.append(Release(f"t{i - 1}"))
    return Trace(records)


def dag_trace(forward: int, seed: int = 0, skip: float = 0.3, window: int = 64) -> Trace:
    """A random network with skip connections, forward and backward: 2 * forward + 2 tensors.

    Forward op i reads the previous output and, with probability `skip`, one
    of the `window` before it; its backward op reads the incoming gradient
    and the forward op's inputs. Sizes 1..64 MiB, costs proportional to size
    (1 ns per kB) times a random factor in [0.5, 2]. Each value is released
    after its last use.
    """
    rng = random.Random(seed)

    def size() -> int:
        return rng.randint(1, 64) << 20

    def cost(nbytes: int) -> int:
        return max(1, int(nbytes / 1000 * rng.uniform(0.5, 2.0)))

    records: list = [Annotate("START"), Constant("x", size())]
    inputs, previous = [], "x"
    for i in range(1, forward + 1):
        args = [previous]
        if i > 2 and rng.random() < skip:
            args.append(f"f{rng.randint(max(1, i - window), i - 2)}")
        inputs.append(tuple(args))
        nbytes = size()
        records.append(Call("fwd", tuple(args), (f"f{i}",), cost(nbytes), (nbytes,), (-1,)))
        previous = f"f{i}"
    nbytes = size()
    records.append(Call("loss", (previous,), ("g",), cost(nbytes), (nbytes,), (-1,)))
    gradient = "g"
    for i in range(forward, 0, -1):
        nbytes = size()
        records.append(Call("bwd", (gradient, *inputs[i - 1]), (f"g{i}",), cost(nbytes), (nbytes,), (-1,)))
        records.append(Release(gradient))
        if i > 1:
            records.append(Release(f"f{i - 1}"))
        gradient = f"g{i}"
    records.append(Release(f"f{forward}"))
    return Trace(records)


def timed(heuristic: Heuristic, shadow_every: int = 0) -> Heuristic:
    """`heuristic`, timing its decisions; with `shadow_every`, every such
    decision is also taken by a full scan, timed, and checked to agree."""
    base = type(heuristic)

    class Timed(base):  # type: ignore[misc, valid-type]
        def choose(self, pool, now):
            start = time.process_time()
            victim = super().choose(pool, now)
            self.decide_s += time.process_time() - start
            self.decisions += 1
            self.pool_sizes.append(len(pool))
            if shadow_every and self.decisions % shadow_every == 0:
                start = time.process_time()
                scanned = Heuristic.choose(self, pool, now)
                self.scan_s.append(time.process_time() - start)
                assert scanned is victim, "the index and the full scan disagree"
            return victim

    heuristic.__class__ = Timed
    heuristic.decide_s, heuristic.decisions, heuristic.pool_sizes, heuristic.scan_s = 0.0, 0, [], []
    return heuristic


@dataclass
class Row:
    trace: str
    tensors: int
    budget: str
    method: str
    decisions: int
    pool_mean: float
    pool_max: int
    evaluations_per_decision: float
    us_per_decision: float
    decide_share: float  # of the replay's CPU time
    replay_s: float
    overhead: Optional[float]
    status: str
    projected: bool = False


def run(
    name: str, trace: Trace, budget_bytes: int, budget_label: str, method: str, shadow_every: int = 0
) -> tuple[Row, list[float]]:
    """One replay; returns its row and the times of the shadow full scans."""
    program = trace.program
    baseline = run_baseline(program)
    heuristic = {"index": lambda: DTREqClass(), "full scan": lambda: DTREqClass(indexed=False),
                 "sampled": lambda: Sampled("dtr_eq", seed=0)}[method]()  # fmt: skip
    heuristic = timed(heuristic, shadow_every)
    counters = Counters()
    runtime = Runtime(NullBackend(), budget_bytes, heuristic=heuristic, observers=[counters], remat_limit=baseline.cost)
    status = "ok"
    start = time.process_time()
    try:
        replay(program, runtime)
    except OutOfBudgetError:
        status = "OOM"
    except ThrashError:
        status = "thrash"
    replay_s = time.process_time() - start - sum(heuristic.scan_s)
    decisions = max(heuristic.decisions, 1)
    tensors = len(program.value_names)
    return Row(
        name, tensors, budget_label, method, heuristic.decisions, statistics.fmean(heuristic.pool_sizes or [0]),
        max(heuristic.pool_sizes or [0]), counters.heuristic_evaluations / decisions, 1e6 * heuristic.decide_s / decisions,
        heuristic.decide_s / replay_s if replay_s else 0.0, replay_s,
        runtime.clock / baseline.cost if status == "ok" else None, status,
    ), heuristic.scan_s  # fmt: skip


def projected_scan(index_row: Row, scan_s: list[float]) -> Row:
    """The full scan's row, from the scans timed in the index run's states."""
    per = statistics.fmean(scan_s)
    non_decision = index_row.replay_s - index_row.decisions * index_row.us_per_decision / 1e6
    replay_s = non_decision + index_row.decisions * per
    return Row(
        index_row.trace, index_row.tensors, index_row.budget, "full scan", index_row.decisions, index_row.pool_mean,
        index_row.pool_max, index_row.pool_mean, 1e6 * per, index_row.decisions * per / replay_s, replay_s,
        index_row.overhead, index_row.status, projected=True,
    )  # fmt: skip


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def table(rows: list[Row]) -> str:
    lines = [
        "| trace | tensors | budget | method | decisions | pool mean / max | scores per decision | µs per decision "
        "| deciding / replay | replay CPU s | simulated overhead |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        overhead = f"{r.overhead:.4f}" if r.overhead is not None else r.status
        mark = " (projected)" if r.projected else ""
        lines.append(
            f"| {r.trace} | {r.tensors:,} | {r.budget} | {r.method}{mark} | {r.decisions:,} | "
            f"{r.pool_mean:,.0f} / {r.pool_max:,} | {r.evaluations_per_decision:,.1f} | {r.us_per_decision:,.0f} | "
            f"{100 * r.decide_share:.0f}% | {r.replay_s:,.1f} | {overhead} |"
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forward", type=int, default=50_000, help="forward ops of the random DAG (2x + 2 tensors)")
    parser.add_argument("--chain", type=int, default=50_000, help="layers of the linear chain (2x + 1 tensors)")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.2], help="DAG budgets (of the peak)")
    parser.add_argument("--every", type=int, default=250, help="on the DAG, time a full scan every this many decisions")
    parser.add_argument("--output", help="append the results as a section of this markdown file")
    args = parser.parse_args(argv)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1_000_000))  # long rematerialization chains recurse
    rows: list[Row] = []
    started = time.time()

    chain = chain_trace(args.chain)
    budget = 2 * math.ceil(math.sqrt(args.chain)) + 1
    label = f"2⌈√N⌉+1 = {budget} units"
    for method in ("index", "full scan", "sampled"):
        rows.append(run(f"chain N={args.chain:,}", chain, budget, label, method)[0])
        print(table(rows[-1:]).splitlines()[-1], flush=True)

    dag = dag_trace(args.forward)
    peak = run_baseline(dag.program).peak_bytes
    for ratio in args.ratios:
        name, label = f"random DAG F={args.forward:,}", f"{ratio:g} of peak"
        index_row, scans = run(name, dag, int(peak * ratio), label, "index", shadow_every=args.every)
        rows.append(index_row)
        rows.append(projected_scan(index_row, scans))
        rows.append(run(name, dag, int(peak * ratio), label, "sampled")[0])
        for row in rows[-3:]:
            print(table([row]).splitlines()[-1], flush=True)

    report = table(rows)
    print(report)
    if args.output:
        section = f"""
## Eviction decisions: pool index vs full scan

Measured {datetime.date.today().isoformat()} on {machine()}, by
`python benchmarks/eviction_cost.py` (total {time.time() - started:.0f} s).
h_DTR^eq on traces of about 100,000 tensors replayed by `jdtr.simulate`'s
runtime. *index*: the default (`jdtr.runtime.index.RatioIndex`; the
decisions are the full scan's, checked at every sampled decision);
*full scan*: the paper's simulator (`DTREqClass(indexed=False)`), where
marked projected timed on every {args.every}th decision of the index run
(a full run would take hours); *sampled*: App. E.2's sqrt(n) sampling
(`Sampled("dtr_eq")`), which changes decisions. Times are CPU seconds of
the benchmark process. The chain is Theorem 3.1's network at budget
2⌈√N⌉ (+1 for the pinned input); the DAG has random sizes (1-64 MiB) and
costs, and skip connections (see `dag_trace`).

{report}
"""
        with open(args.output, "a", encoding="utf-8") as f:
            f.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
