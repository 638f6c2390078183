"""How long `jdtr.plan` takes to plan, beside `jax.jit(jax.grad)`'s compile.

Each model is planned in a fresh process (nothing cached from another
model), at each budget in turn on the same function, as a sweep of budgets
or a notebook plans it: a later budget starts from the programs traced and
the simulations run for the earlier ones. Prints a Markdown table for
docs/benchmarks.md ("Planning time"). Step times mean little here; see
remat_benchmark.py for those.

    python benchmarks/planning_time.py [--models resnet,mlp] [--budgets 0.7,0.5] [--no-autotune]
    python benchmarks/planning_time.py --models gpt12,gpt24 --before /path/to/an/older/checkout

With `--before`, each model is also planned by the jdtr of another
checkout (its directory first on `PYTHONPATH`), in a process of its own
run just before this tree's, and the table gives both times; with
`--repeats`, the medians of that many such pairs. The time DTR's
simulations took is in parentheses.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# The models of remat_benchmark.py.
MODELS = {
    "transformer": ("Transformer, 6 blocks", "models.transformer(6, 128, 4, 128, 8, 256)"),
    "resnet": ("ResNet (BatchNorm), 8 blocks", "models.resnet(8, 32, 32, 16)"),
    "mlp": ("MLP chain, 64 layers", "models.mlp_chain(64, 256, 2048)"),
    "cnn": ("plain CNN, 6 layers", "models.plain_cnn(6, 32, 32, 16)"),
    # Deep unrolled stacks, where DTR's simulations dominate planning.
    "gpt12": ("Flax GPT, 12 blocks", "models.flax_gpt(layers=12, dim=128, seq=128, batch=8)"),
    "gpt24": ("Flax GPT, 24 blocks", "models.flax_gpt(layers=24, dim=128, seq=128, batch=8)"),
}

_ONE_MODEL = """
import json, sys, time
import jax, jdtr
from jdtr import models
from jdtr.transform import simulated_plans
simulating = [0.0]
def timed_run(*args, _run=simulated_plans.run, **kwargs):  # DTR's simulations, timed apart
    start = time.perf_counter()
    try:
        return _run(*args, **kwargs)
    finally:
        simulating[0] += time.perf_counter() - start
simulated_plans.run = timed_run
m = {model}
args = (m.params, m.batch)
start = time.perf_counter()
jax.jit(jax.grad(m.loss)).lower(*args).compile()
rows = [("jax.jit(jax.grad) compile", time.perf_counter() - start, None, None, 0.0)]
for budget in {budgets}:
    start, simulating[0] = time.perf_counter(), 0.0
    try:
        plan = jdtr.plan(m.loss, *args, budget=budget, autotune={autotune})
        found = (len(plan.segments), plan.compiled_bytes)
    except jdtr.OutOfBudgetError as err:
        found = ("OutOfBudgetError", err.suggested_budget_bytes)
    rows.append((budget, time.perf_counter() - start, *found, simulating[0]))
print(json.dumps(rows))
"""


def plan_times(model: str, budgets: list[float], autotune: bool, tree: str = "") -> list:
    """The rows of one model planned in a fresh process; by the jdtr of `tree` (a checkout) if given."""
    script = _ONE_MODEL.format(model=MODELS[model][1], budgets=budgets, autotune=autotune)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH", "")) if p))
    # (Run from `tree`: `python -c` puts its working directory first on the path.)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env if tree else None, cwd=tree or None
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--budgets", default="0.7,0.5")
    parser.add_argument("--no-autotune", action="store_true", help="plan with autotune=False")
    parser.add_argument("--repeats", type=int, default=1, help="processes per model (and tree), interleaved; medians")
    parser.add_argument("--before", default="", help="a checkout whose jdtr plans each model too, just before this one")
    options = parser.parse_args()
    budgets = [float(b) for b in options.budgets.split(",")]
    import jax

    print(f"{time.strftime('%Y-%m-%d')}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"JAX {jax.__version__} on {jax.default_backend()}; autotune={not options.no_autotune}\n")
    before = " before: planning s (simulations) |" if options.before else ""
    print(f"| model | budget |{before} planning s (simulations) | segments (or error) | compiled bytes (or suggested) |")
    print("|---|---|---|---|---|" + ("---|" if options.before else ""))
    for name in options.models.split(","):
        earlier, now = [], []
        for _ in range(options.repeats):  # interleaved: the older tree's process, then this one's
            if options.before:
                earlier.append(plan_times(name, budgets, not options.no_autotune, options.before))
            now.append(plan_times(name, budgets, not options.no_autotune))
        for i, (budget, _, found, nbytes, _) in enumerate(now[0]):
            then = ""
            if earlier:
                f0, n0 = earlier[0][i][2:4]
                then = f" {_medians(earlier, i)}" + ("" if (f0, n0) == (found, nbytes) else f" ({f0}, {n0})") + " |"
            print(f"| {MODELS[name][0]} | {budget} |{then} {_medians(now, i)} | {'' if found is None else found} | "
                  f"{'' if nbytes is None else nbytes} |", flush=True)


def _medians(runs: list, i: int) -> str:
    """Row `i`'s median planning seconds (and simulation seconds) over `runs`."""
    seconds = statistics.median(run[i][1] for run in runs)
    simulating = statistics.median(run[i][4] for run in runs)
    return f"{seconds:.1f} ({simulating:.1f})"


if __name__ == "__main__":
    main()
