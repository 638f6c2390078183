"""The fixed cost of a `jdtr.grad` call (issue 21): what a call costs besides its chunks.

A 64-layer MLP of width 16, batch 256 (65 argument leaves), planned, from
the call after its plan runs as compiled chunks on, against
`jax.jit(jax.grad)`: medians of `--calls` interleaved calls, and the time
`jdtr.grad` takes to flatten its arguments. Run it in two checkouts to
compare versions, each in its own process, in turns:

    python benchmarks/call_overhead.py --rounds 2
"""

from __future__ import annotations

import argparse
import sys
import timeit

import jax

import jdtr
from jdtr import models
from jdtr.transform import rental
from jdtr.transform.arguments import flatten_arguments

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from scan_benchmark import interleaved_medians  # noqa: E402

rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from a plan's second run, as these tables measure (rental_benchmark.py: the rule)


def measure(ratios, calls: int) -> dict:
    model = models.mlp_chain(layers=64, width=16, batch=256)
    args = (model.params, model.batch)
    contenders = {"jit": jax.jit(jax.grad(model.loss))}
    for ratio in ratios:
        contenders[ratio] = jdtr.grad(lambda *a: model.loss(*a), budget=ratio)  # a function of its own: plans are cached per function
    for fn in contenders.values():
        for _ in range(4):  # plans and runs step by step, compiles the chunks, runs them
            jax.block_until_ready(fn(*args))
    med = interleaved_medians(contenders, args, calls)
    flatten = min(timeit.repeat(lambda: flatten_arguments(0, args, {}, eager=True), number=500, repeat=3)) / 500
    return {"flatten_us": flatten * 1e6, **{r: med[r] / med["jit"] for r in ratios}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.5])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    for _ in range(args.rounds):
        result = measure(args.ratios, args.calls)
        ratios = ", ".join(f"{r}: {result[r]:.2f}" for r in args.ratios)
        print(f"flattening {result['flatten_us']:.0f} us; jdtr / jit at {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
