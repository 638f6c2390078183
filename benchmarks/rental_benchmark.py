"""When compiling a plan's chunks pays (issue 21): the ski-rental rule against
compiling on a structure's second call, and against never compiling.

For each model at one budget, three policies, each in a fresh process (so
no compiled chunk or executable carries over from another), in turns over
`--rounds` rounds:
- "second call": chunks compiled on a plan's second run (the rule before
  `rental.py`; a compile rate fixed at nothing);
- "ski rental": `chunks="auto"` as it is, with the process's own rate;
- "never": `chunks="never"`, step by step throughout.
Each process calls `jdtr.grad` `--calls` times, waiting for every call, and
reports the seconds of the calls added up after 1, 2, 5, 10, ... calls, and
the call that first ran as chunks. "Best in hindsight" is, for each count
of calls, the least of the second-call and never policies: the ski-rental
rule promises at most twice it.

    python benchmarks/rental_benchmark.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODELS = {
    "transformer": "models.transformer(blocks=4, dim=128, heads=4, seq=128, batch=8, vocab=256)",
    "flax_gpt": "models.flax_gpt()",
    "flax_gpt_small": "models.flax_gpt(layers=2, dim=32, seq=32)",
    "flax_resnet": "models.flax_resnet_groupnorm(blocks=4)",
    "mlp": "models.mlp_chain(layers=64, width=32, batch=256)",
}
POLICIES = ("second call", "ski rental", "never")
MARKS = (1, 2, 5, 10, 20, 50, 100, 200, 500)

CHILD = """
import json, sys, time
import jax
import jdtr
from jdtr import models
from jdtr.transform import rental
model_source, policy, budget, calls = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
if policy == "second call":
    rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)
model = eval(model_source)
f = jdtr.grad(model.loss, budget=budget, return_stats=True, chunks="never" if policy == "never" else "auto")
seconds, switched = [], None
for call in range(calls):
    start = time.perf_counter()
    grads, stats = f(model.params, model.batch)
    jax.block_until_ready(grads)
    seconds.append(time.perf_counter() - start)
    if switched is None and stats.execution == "chunks":
        switched = call + 1
print(json.dumps(dict(seconds=seconds, switched=switched, rate=rental.COMPILE_RATE.seconds_per_operation())))
"""


def run(model: str, policy: str, budget: float, calls: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, MODELS[model], policy, str(budget), str(calls)],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["flax_gpt_small", "transformer", "flax_resnet", "mlp"])
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--output")
    options = parser.parse_args()
    marks = [m for m in MARKS if m <= options.calls]
    lines = [
        f"`python benchmarks/rental_benchmark.py --models {' '.join(options.models)} --budget {options.budget} "
        f"--calls {options.calls} --rounds {options.rounds}`, {time.strftime('%Y-%m-%d')}; seconds of the first N calls "
        "added up (medians over the rounds), and the call that first ran in chunks.",
        "",
        "| model | policy | first call in chunks | " + " | ".join(f"N = {m}" for m in marks) + " |",
        "|---|---|---|" + "---|" * len(marks),
    ]
    for model in options.models:
        results = {policy: [] for policy in POLICIES}
        for _ in range(options.rounds):
            for policy in POLICIES:
                results[policy].append(run(model, policy, options.budget, options.calls))
        sums = {}
        for policy in POLICIES:
            totals = [[sum(r["seconds"][:m]) for m in marks] for r in results[policy]]
            sums[policy] = [sorted(column)[len(column) // 2] for column in zip(*totals)]
            switched = sorted(r["switched"] or 0 for r in results[policy])[len(results[policy]) // 2]
            lines.append(
                f"| {model} | {policy} | {switched or '-'} | " + " | ".join(f"{s:.2f}" for s in sums[policy]) + " |"
            )
        best = [min(a, b) for a, b in zip(sums["second call"], sums["never"])]
        lines.append(
            f"| {model} | ski rental / best in hindsight | | "
            + " | ".join(f"{s / b:.2f}" for s, b in zip(sums["ski rental"], best)) + " |"
        )
        print("\n".join(lines[-4:]), flush=True)
    text = "\n".join(lines)
    print(text)
    if options.output:
        with open(options.output, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
