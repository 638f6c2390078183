"""How long an `OutOfBudgetError` takes, and what a call at its suggestion does.

For each model and budget (a fraction of the unconstrained peak) in a fresh
process: the seconds a first `jdtr.grad` call takes to raise (tracing
included), the budget the error suggests, and a first call at that budget:
its overhead (cost-model units), whether it kept the budget, whether it was
warned of thrashing, and its seconds. Then a second error: a new `jdtr.grad`
at 0.8 of the budget (a user trying budgets), its seconds and suggestion.

    python benchmarks/suggestion_benchmark.py [--cases transformer:0.1 resnet:0.1 ...]

To compare two versions, run it with each on PYTHONPATH, in turns.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = ("transformer:0.1", "transformer:0.2", "resnet:0.1", "rnn:0.1", "cnn:0.4", "mlp:0.1")

ONE = r"""
import json, sys, time, warnings
import jdtr
from jdtr import models

name, ratio = sys.argv[1], float(sys.argv[2])
model = {"transformer": models.transformer, "resnet": models.resnet, "rnn": models.rnn,
         "cnn": models.batchnorm_cnn, "mlp": models.mlp_chain}[name]()
args = (model.params, model.batch)
start = time.perf_counter()
try:
    jdtr.grad(model.loss, budget=ratio)(*args)
    print(json.dumps(None))
    sys.exit()
except jdtr.OutOfBudgetError as err:
    suggested, error_s = err.suggested_budget_bytes, time.perf_counter() - start
start = time.perf_counter()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _, stats = jdtr.grad(model.loss, budget=suggested, return_stats=True)(*args)
call_s = time.perf_counter() - start
thrash = any(isinstance(w.message, jdtr.ThrashWarning) for w in caught)
start = time.perf_counter()
try:
    jdtr.grad(model.loss, budget=0.8 * ratio)(*args)
    again, again_s = None, time.perf_counter() - start
except jdtr.OutOfBudgetError as err:
    again, again_s = err.suggested_budget_bytes, time.perf_counter() - start
print(json.dumps([error_s, suggested, stats.overhead, stats.peak_bytes <= suggested, thrash, call_s, again_s, again]))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), help="model:ratio, models: transformer resnet rnn cnn mlp")
    options = parser.parse_args()
    print("| model | budget | error s | suggested bytes | overhead there | kept | thrash warning | call there s "
          "| error at 0.8 of it s | its suggestion |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in options.cases:
        name, ratio = case.split(":")
        done = subprocess.run([sys.executable, "-c", ONE, name, ratio], capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        if row is None:
            print(f"| {name} | {ratio} | fits | | | | | | | |")
            continue
        error_s, suggested, overhead, kept, thrash, call_s, again_s, again = row
        same = "ran" if again is None else ("the same" if again == suggested else f"{again:,}")
        print(f"| {name} | {ratio} | {error_s:.1f} | {suggested:,} | {overhead:.3f} | {'yes' if kept else 'NO'} "
              f"| {'yes' if thrash else 'no'} | {call_s:.1f} | {again_s:.1f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
