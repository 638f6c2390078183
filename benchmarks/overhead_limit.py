"""What a planned call does where a heuristic thrashes: cut off at MAX_OVERHEAD, or simulated to its end.

For each heuristic, in a fresh process: a first `jdtr.grad` call on a fresh
TreeLSTM tree (`grad_benchmark.tree_lstm`, 44 leaves) at a fraction of its
peak, timed to its outcome (the run, or the error) with tracing included;
the plan's overhead (cost-model units) or the error's type and suggested
budget; then, after an error, a first call at that budget. Each variant sets
`planner.MAX_OVERHEAD` ("none": no cut-off, as before it existed).

    python benchmarks/overhead_limit.py [--heuristics dtr_eq dtr_full lookahead auto] [--limits 4 none]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ONE = r"""
import json, math, random, sys, time, warnings
sys.path.insert(0, sys.argv[4])
import jdtr
from jdtr.transform import planner
from grad_benchmark import random_tree, tree_lstm

heuristic, ratio, limit = sys.argv[1], float(sys.argv[2]), sys.argv[3]
planner.MAX_OVERHEAD = math.inf if limit == "none" else float(limit)
loss, params, tokens = tree_lstm(256, 64, 32, 44)
tree = random_tree(random.Random(1), 44)
warnings.simplefilter("ignore")
start = time.perf_counter()
try:
    _, stats = jdtr.grad(loss, budget=ratio, heuristic=heuristic, return_stats=True)(params, tokens, tree)
except jdtr.OutOfBudgetError as err:
    error_s = time.perf_counter() - start
    start = time.perf_counter()
    _, there = jdtr.grad(loss, budget=err.suggested_budget_bytes, heuristic=heuristic, return_stats=True)(params, tokens, tree)
    print(json.dumps([type(err).__name__, error_s, err.suggested_budget_bytes, there.overhead, time.perf_counter() - start]))
else:
    print(json.dumps(["ran", time.perf_counter() - start, stats.budget_bytes, stats.overhead, stats.planning_time_s]))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heuristics", nargs="+", default=["dtr_eq", "dtr_full", "lookahead", "auto"])
    parser.add_argument("--limits", nargs="+", default=["4", "none"], help="MAX_OVERHEAD values; none: no cut-off")
    parser.add_argument("--ratio", type=float, default=0.5)
    options = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"TreeLSTM (44 leaves, hidden 256, batch 32), a fresh tree, budget {options.ratio} of its peak.\n")
    print("| heuristic | MAX_OVERHEAD | outcome | first call s | overhead | suggested bytes | at the suggestion: overhead, s |")
    print("|---|---|---|---|---|---|---|")
    for heuristic in options.heuristics:
        for limit in options.limits:
            done = subprocess.run(
                [sys.executable, "-c", ONE, heuristic, str(options.ratio), limit, here], capture_output=True, text=True
            )
            if done.returncode != 0:
                print(f"| {heuristic} | {limit} | failed: {done.stderr.strip().splitlines()[-1]} | | | | |", flush=True)
                continue
            outcome, seconds, nbytes, overhead, extra = json.loads(done.stdout.strip().splitlines()[-1])
            if outcome == "ran":
                print(f"| {heuristic} | {limit} | ran (planning {extra:.1f} s) | {seconds:.1f} | {overhead:.3f} | | |", flush=True)
            else:
                print(f"| {heuristic} | {limit} | {outcome} | {seconds:.1f} | | {nbytes} | {overhead:.3f}, {extra:.1f} |", flush=True)


if __name__ == "__main__":
    main()
