"""`jdtr.grad` run as compiled chunks (`chunks="always"`), as the step as
one XLA program (`chunks="whole"`, `jdtr/transform/whole_step.py`), and as
the default chooses between them by timing both (`chunks="auto"`,
`jdtr/transform/whole_choice.py`), side by side with `jax.jit(jax.grad)`, in
one process (docs/benchmarks.md, "A planned step as one XLA program").

"auto" is measured once its choice is made: chunks from a plan's second run
and the trial from its third (compile and making priced at nothing, as the
other tables of chunks measure), so its cells say how many calls and seconds
that took in all.

Per model and budget: how each ran ("whole" falls back to chunks where the
compiled path's plan does not fit), its chunks, its bytes over the budget
(XLA's for the whole step, the plan's count for chunks), the first call's
seconds (tracing, planning, compiling) and the step time over
`jax.jit(jax.grad)`'s, medians of `--repeats` interleaved runs from the
fourth call.

    python benchmarks/whole_step.py --models vae triplet transformer --ratios 0.7 0.5 0.3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import jax

import jdtr
from jdtr.transform import rental, whole_choice

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import beyond_models  # noqa: E402
from chunk_cost import MODELS as CHUNK_COST_MODELS  # noqa: E402
from scan_benchmark import interleaved_medians  # noqa: E402
from slack_benchmark import report  # noqa: E402

REPOSITORY = {name: CHUNK_COST_MODELS[name] for name in ("mlp", "resnet", "transformer", "flax_gpt")}
MODES = ("always", "whole", "auto")
rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from a plan's second run
whole_choice.WHOLE_PRICE = 0.0  # the trial from its third
SETTLED = 3 + 2 * whole_choice.TRIAL_RUNS  # calls until "auto" has chosen


def load(name: str):
    if name in REPOSITORY:
        m = REPOSITORY[name]()
        return name, m.loss, m.params, m.batch
    return beyond_models.MODELS[name]()


def bench(name: str, ratios, repeats: int) -> list[str]:
    label, loss, params, x = load(name)
    jit = jax.jit(jax.grad(loss))
    expected = jit(params, x)
    contenders, rows = {"jit": jit}, {}
    for ratio in ratios:
        for mode in MODES:
            step = jdtr.grad(loss, budget=ratio, chunks=mode, return_stats=True)
            start = time.perf_counter()
            try:
                got, stats = step(params, x)
                jax.block_until_ready(got)
            except jdtr.OutOfBudgetError:
                rows[ratio, mode] = "raises"
                continue
            first = time.perf_counter() - start
            for _ in range(SETTLED if mode == "auto" else 2):
                got, stats = step(params, x)
            settled = time.perf_counter() - start
            error = beyond_models.relative_error(got, expected)
            rows[ratio, mode] = (
                f"{stats.execution}, {stats.chunks} chunks, {stats.peak_bytes / stats.budget_bytes:.3f} of the budget, "
                + (f"{SETTLED + 1} calls {settled:.1f} s" if mode == "auto" else f"first call {first:.1f} s")
                + f", error {error:.0e}"
            )
            contenders[ratio, mode] = (lambda s: lambda *a: s(*a)[0])(step)
    medians = interleaved_medians(contenders, (params, x), repeats)
    base = medians["jit"]
    lines = []
    for ratio in ratios:
        cells = []
        for mode in MODES:
            cell = rows[ratio, mode]
            if (ratio, mode) in medians:
                cell = f"{medians[ratio, mode] / base:.2f}x ({cell})"
            cells.append(cell)
        lines.append(f"| {label} | {base * 1e3:.1f} ms | {ratio} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    choices = sorted(REPOSITORY) + sorted(beyond_models.MODELS)
    parser.add_argument("--models", nargs="+", choices=choices, default=["vae", "triplet", "mixer", "transformer", "flax_gpt", "resnet"])
    parser.add_argument("--ratios", nargs="+", type=float, default=[0.7, 0.5, 0.3])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", help="append the markdown report here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # (the thrash and slow-plan warnings)
    header = (
        "| model | `jax.jit(jax.grad)` | budget | chunks (`\"always\"`) | one program (`\"whole\"`) "
        "| chosen by timing (`\"auto\"`) |"
    )
    rows = lambda name: bench(name, args.ratios, args.repeats)  # noqa: E731
    return report("A planned step as one XLA program", args.repeats, header, args.models, rows, args.output)


if __name__ == "__main__":
    sys.exit(main())
