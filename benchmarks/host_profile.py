"""Where the host spends a compiled `jdtr.grad` call (issue 21), by profile.

On a GPU a small model's step under `jax.jit(jax.grad)` takes about a
millisecond, so the host's work per call (flattening the arguments,
looking up the plan, dispatching each chunk, the deletes between chunks)
can set the pace. This profiles `--calls` calls of each model and budget,
once its plan runs as chunks, without waiting for the device inside the
profile (dispatch is asynchronous; each call's results are waited on
outside it), and prints the functions that took the most time.

    python benchmarks/host_profile.py --models transformer resnet --ratios 1.0 0.5
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import jax

import jdtr
from jdtr.transform import rental

rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from a plan's second run, as these tables measure (rental_benchmark.py: the rule)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chunk_cost import MODELS  # noqa: E402
from grad_benchmark import machine  # noqa: E402
from slack_benchmark import warm_up  # noqa: E402


def profile(fn, args, calls: int) -> tuple[float, str]:
    """The median host time of a call in ms, and the profile's top rows."""
    profiler = cProfile.Profile()
    host = []
    for _ in range(calls):
        start = time.perf_counter()
        profiler.enable()
        result = fn(*args)
        profiler.disable()
        host.append((time.perf_counter() - start) * 1e3)
        jax.block_until_ready(result)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(18)
    stats.sort_stats("cumulative").print_stats(18)
    return sorted(host)[len(host) // 2], text.getvalue()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["transformer", "resnet"])
    parser.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.5])
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    print(f"Machine: {machine()}. {args.calls} calls a row, profiled (cProfile slows the host's part).")
    for name in args.models:
        model = MODELS[name]()
        call_args = (model.params, model.batch)
        for ratio in args.ratios:
            loss = lambda *a: model.loss(*a)  # noqa: E731 (a function of its own: plans are cached per function)
            stats = warm_up(jdtr.grad(loss, budget=ratio, return_stats=True), call_args)[-1]
            # The same plans, returning as jit does (with stats, a call waits for its results).
            host, text = profile(jdtr.grad(loss, budget=ratio), call_args, args.calls)
            print(f"\n## {name} at {ratio}: {stats.chunks} chunks, execution {stats.execution}, host {host:.2f} ms a call (median, profiled)\n")
            print(text, flush=True)


if __name__ == "__main__":
    main()
