"""What JAX's persistent compilation cache saves jdtr when a process starts
again: a training script run a second time, a notebook restarted.

jdtr compiles programs of its own: one per distinct equation on a first
`jdtr.grad` call, its plan's chunks on the second, and the candidate steps
`jdtr.plan` measures and times. With `JAX_COMPILATION_CACHE_DIR` set, each
is read back from disk in a later process instead of compiled (jdtr reads
XLA's `memory_analysis()` of what is read back; tests/test_plan.py checks
that plans and chunks come out the same).

Each measurement runs in a fresh process: "no cache", then "cold" (an empty
cache directory, filled by that run), then "warm" (the same directory
again), round after round, each round with a new directory. Prints a
Markdown table of medians for docs/benchmarks.md.

    python benchmarks/warm_cache.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {  # name: (label, expression)
    "gpt": ("flax GPT 4x128, seq 128, batch 8", "models.flax_gpt()"),
    "resnet": ("flax ResNet (GroupNorm) 4x32", "models.flax_resnet_groupnorm(blocks=4)"),
    "transformer": ("transformer 4x128, seq 128, batch 8",
                    "models.transformer(blocks=4, dim=128, heads=4, seq=128, batch=8, vocab=256)"),
}
VARIANTS = ("no cache", "cold", "warm")

_CHILD = """
import json, time
import jax, jdtr
from jdtr import models
from jdtr.transform import rental
rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks on the second call, as measured
m = {model}
args = (m.params, m.batch)
jax.block_until_ready(args)
times = {{}}
start = time.perf_counter()
jax.block_until_ready(jax.jit(jax.grad(m.loss))(*args))
times["jax.jit(jax.grad) first call"] = time.perf_counter() - start
f = jdtr.grad(m.loss, budget={budget})
for name in ("jdtr.grad first call", "jdtr.grad second call"):
    start = time.perf_counter()
    jax.block_until_ready(f(*args))
    times[name] = time.perf_counter() - start
start = time.perf_counter()
jdtr.plan(m.loss, *args, budget={budget})
times["jdtr.plan (autotuned)"] = time.perf_counter() - start
print(json.dumps(times))
"""


def measure(model: str, budget: float, cache: str | None) -> dict:
    env = dict(os.environ)
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                 "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"):
        env.pop(name, None)
    if cache is not None:
        # Every program cached, however small or quick to compile.
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    script = _CHILD.format(model=MODELS[model][1], budget=budget)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names of MODELS")
    options = parser.parse_args()
    import jax

    print(f"{time.strftime('%Y-%m-%d')}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"JAX {jax.__version__} on {jax.default_backend()}; budget {options.budget}; "
          f"medians of {options.rounds} rounds, seconds\n")
    for model in options.models.split(","):
        runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for _ in range(options.rounds):
            with tempfile.TemporaryDirectory() as cache:
                runs["no cache"].append(measure(model, options.budget, None))
                runs["cold"].append(measure(model, options.budget, cache))
                runs["warm"].append(measure(model, options.budget, cache))
        print(f"**{MODELS[model][0]}**\n")
        print("| measure | " + " | ".join(VARIANTS) + " | warm / no cache |")
        print("|---|" + "---|" * (len(VARIANTS) + 1))
        for name in runs["no cache"][0]:
            medians = [statistics.median(r[name] for r in runs[v]) for v in VARIANTS]
            cells = " | ".join(f"{m:.2f}" for m in medians)
            print(f"| {name} | {cells} | {medians[2] / medians[0]:.2f} |")
        print(flush=True)


if __name__ == "__main__":
    main()
