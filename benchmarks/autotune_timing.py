"""What autotuning timed for each candidate, against the candidate's step timed again, warm.

Plans each model at each budget in turn on the same function, in one
process (as a sweep of budgets or a notebook does), then runs every
candidate that autotuning timed again, after warm-up runs, and compares:
a candidate first timed beside others already run in an earlier plan
must not be judged by the one-time cost of its first run. Prints a
Markdown table for docs/benchmarks.md.

    python benchmarks/autotune_timing.py [--models transformer,cnn] [--budgets 0.7,0.5,0.35] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import jax

import jdtr
from jdtr import models
from jdtr.transform import planning as planning_module
from jdtr.transform.checkpoint_plan import layout

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from grad_benchmark import machine, timed  # noqa: E402

MODELS = {
    "transformer": lambda: models.transformer(blocks=3, dim=32, heads=2, seq=64, batch=8, vocab=64),
    "cnn": lambda: models.plain_cnn(layers=6),
    "mlp": lambda: models.mlp_chain(layers=32, width=128, batch=512),
    "resnet": lambda: models.resnet(blocks=2, channels=8, image=16, batch=8),
}


def warm_seconds(executable, leaves, repeats: int) -> float:
    """The median of `repeats` runs, after two runs that are not counted."""
    for _ in range(2):
        jax.block_until_ready(executable(*leaves))
    return statistics.median(timed(executable, *leaves)[0] for _ in range(repeats))


def candidates(loss):
    """Every plan measured for `loss`, with its compiled step (one argument structure planned)."""
    [entries] = [e for f, e in planning_module.planning_cache.items() if f is loss]
    [planning] = entries.values()
    return [(plan, planning.steps.get(layout(plan))) for plan in planning.measured.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="transformer,cnn,mlp")
    parser.add_argument("--budgets", default="0.7,0.5,0.35")
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args()
    budgets = [float(b) for b in options.budgets.split(",")]
    print(f"Machine: {machine()}.\n")
    print("| model | budget | candidate (bytes, segments, origin) | autotuning's ms | warm ms | autotuning / warm | chosen |")
    print("|---|---|---|---|---|---|---|")
    for name in options.models.split(","):
        m = MODELS[name]()
        leaves = jax.tree_util.tree_leaves((m.params, m.batch))
        for budget in budgets:
            try:
                plan = jdtr.plan(m.loss, m.params, m.batch, budget=budget)
            except jdtr.OutOfBudgetError:
                print(f"| {name} | {budget} | no plan fits | | | | |", flush=True)
                continue
            measured = candidates(m.loss)
            for timing in plan.timings:
                step = next(
                    s for p, s in measured
                    if (p.compiled_bytes, len(p.segments), p.origin) == (timing.compiled_bytes, timing.segments, timing.origin)
                    and s is not None and s.executable is not None
                )
                warm = warm_seconds(step.executable, leaves, options.repeats)
                print(f"| {name} | {budget} | {timing.compiled_bytes}, {timing.segments}, {timing.origin} | "
                      f"{timing.seconds * 1e3:.1f} | {warm * 1e3:.1f} | {timing.seconds / warm:.2f} | "
                      f"{'yes' if timing.chosen else ''} |", flush=True)


if __name__ == "__main__":
    main()
