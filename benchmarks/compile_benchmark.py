"""What a new structure costs `jdtr.grad` in compiling (issue 21): its first
call (an executable per distinct equation, run step by step) and its second
(its plan's chunks compiled), against `jax.jit(jax.grad)`'s one compile.

Each measurement runs in a fresh process (compile caches are per process),
the variants in turns, round after round:

- "default": jdtr as it is;
- "xla emitters": jdtr's own programs compiled with XLA's default options
  (`xla_options.CPU_OPTIONS = {}`);
- "older emitters for chunks": the chunks compiled with `xla_options`' older
  emitters too (`chunks.CHUNK_OPTIONS`), as before 2026-11-27;
- "one thread": a plan's chunks compiled one at a time (`chunks.COMPILE_THREADS = 1`);
- "equations one at a time": the first call's programs of single equations
  compiled one at a time (`executable.COMPILE_THREADS = 1`), as before 2026-11-29.

    python benchmarks/compile_benchmark.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

MODELS = {
    "transformer4x128_s128_b8": "models.transformer(blocks=4, dim=128, heads=4, seq=128, batch=8, vocab=256)",
    "resnet4x32_b16": "models.resnet(blocks=4, channels=32, batch=16)",
    "flax_gpt4x128_s128_b8": "models.flax_gpt()",
    "flax_resnet_gn4x32_i32_b16": "models.flax_resnet_groupnorm(blocks=4)",
    # Narrow matmuls (the test suite's sizes), and the benchmarks' chain.
    "mlp64x32_b256": "models.mlp_chain(layers=64, width=32, batch=256)",
    "mlp64x256_b2048": "models.mlp_chain(layers=64, width=256, batch=2048)",
}
VARIANTS = ("default", "xla emitters", "older emitters for chunks", "one thread", "equations one at a time")


def child(variant: str, model_name: str, ratio: float, steps: int) -> dict:
    import jax

    import jdtr
    from jdtr import models
    from jdtr.transform import chunks, executable, rental, xla_options

    rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from a plan's second run, as these tables measure (rental_benchmark.py: the rule)

    if variant == "xla emitters":
        xla_options.CPU_OPTIONS = {}
    elif variant == "older emitters for chunks":
        chunks.CHUNK_OPTIONS = xla_options.compiler_options()
    elif variant == "one thread":
        chunks.COMPILE_THREADS = 1
    elif variant == "equations one at a time":
        executable.COMPILE_THREADS = 1
    model = eval(MODELS[model_name], {"models": models})  # noqa: S307  (this file's own expressions)
    args = (model.params, model.batch)
    f = jdtr.grad(model.loss, budget=ratio)
    calls = []
    for _ in range(2):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        calls.append(time.perf_counter() - start)
    grad = jax.jit(jax.grad(model.loss))
    start = time.perf_counter()
    compiled = grad.lower(*args).compile()
    jit_compile = time.perf_counter() - start
    times = {"jdtr": [], "jit": []}
    for _ in range(steps):
        for name, fn in (("jdtr", f), ("jit", compiled)):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return {
        "first": calls[0],
        "second": calls[1],
        "jit_compile": jit_compile,
        "ratio": statistics.median(times["jdtr"]) / statistics.median(times["jit"]),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.ratio, args.steps)))
        return 0
    results: dict = {}
    for _ in range(args.rounds):
        for model in args.models:
            for variant in args.variants:
                command = [sys.executable, __file__, "--child", variant, model, "--ratio", str(args.ratio), "--steps", str(args.steps)]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                results.setdefault((model, variant), []).append(json.loads(out.strip().splitlines()[-1]))
    print(f"budget {args.ratio}; medians of {args.rounds} rounds (each a fresh process)\n")
    print("| model | variant | first call s | second call s | jax.jit compile s | step: jdtr / jit |")
    print("|---|---|---|---|---|---|")
    for (model, variant), runs in results.items():
        med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        spread = lambda key: "-".join(f"{v:.2f}" for v in sorted({min(r[key] for r in runs), max(r[key] for r in runs)}))  # noqa: E731
        print(f"| {model} | {variant} | {spread('first')} | {spread('second')} | {med['jit_compile']:.2f} | {med['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
