"""How long `jdtr.plan` takes to plan, beside `jax.jit(jax.grad)`'s compile.

Each model is planned in a fresh process (nothing cached from another
model), at each budget in turn on the same function, as a sweep of budgets
or a notebook plans it: a later budget starts from the programs traced and
the simulations run for the earlier ones. Prints a Markdown table for
docs/benchmarks.md ("Planning time"). Step times mean little here; see
remat_benchmark.py for those.

    python benchmarks/planning_time.py [--models resnet,mlp] [--budgets 0.7,0.5] [--no-autotune]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

# The models of remat_benchmark.py.
MODELS = {
    "transformer": ("Transformer, 6 blocks", "models.transformer(6, 128, 4, 128, 8, 256)"),
    "resnet": ("ResNet (BatchNorm), 8 blocks", "models.resnet(8, 32, 32, 16)"),
    "mlp": ("MLP chain, 64 layers", "models.mlp_chain(64, 256, 2048)"),
    "cnn": ("plain CNN, 6 layers", "models.plain_cnn(6, 32, 32, 16)"),
}

_ONE_MODEL = """
import json, sys, time
import jax, jdtr
from jdtr import models
m = {model}
args = (m.params, m.batch)
start = time.perf_counter()
jax.jit(jax.grad(m.loss)).lower(*args).compile()
rows = [("jax.jit(jax.grad) compile", time.perf_counter() - start, None, None)]
for budget in {budgets}:
    start = time.perf_counter()
    try:
        plan = jdtr.plan(m.loss, *args, budget=budget, autotune={autotune})
        found = (len(plan.segments), plan.compiled_bytes)
    except jdtr.OutOfBudgetError as err:
        found = ("OutOfBudgetError", err.suggested_budget_bytes)
    rows.append((budget, time.perf_counter() - start, *found))
print(json.dumps(rows))
"""


def plan_times(model: str, budgets: list[float], autotune: bool) -> list:
    script = _ONE_MODEL.format(model=MODELS[model][1], budgets=budgets, autotune=autotune)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--budgets", default="0.7,0.5")
    parser.add_argument("--no-autotune", action="store_true", help="plan with autotune=False")
    options = parser.parse_args()
    budgets = [float(b) for b in options.budgets.split(",")]
    import jax

    print(f"{time.strftime('%Y-%m-%d')}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"JAX {jax.__version__} on {jax.default_backend()}; autotune={not options.no_autotune}\n")
    print("| model | budget | planning s | segments (or error) | compiled bytes (or suggested) |")
    print("|---|---|---|---|---|")
    for name in options.models.split(","):
        for budget, seconds, found, nbytes in plan_times(name, budgets, not options.no_autotune):
            print(f"| {MODELS[name][0]} | {budget} | {seconds:.1f} | {'' if found is None else found} | "
                  f"{'' if nbytes is None else nbytes} |", flush=True)


if __name__ == "__main__":
    main()
