"""`jax.jit(jdtr.remat_grad)` on conv nets: compiled bytes and step time against `jax.jit(jax.grad)`.

Issue 22's goal for convolutions: at budget 0.5, at most half of
`jax.jit(jax.grad)`'s compiled bytes (XLA's arguments + outputs +
temporaries) in at most 1.5x its step time, on the CPU with default
compiler options. For each model and budget: the plan's gate (how its
segments keep XLA from merging the recomputation away: "auto" and "inputs"
keep convolutions out of conds; "cond" runs them in one, ~20-40x slower on
the CPU), its nesting, its bytes and its step time beside `jax.jit(jax.grad)`
(medians of interleaved runs), or, where no plan fits, the budget the
error verified. Plans are autotuned (the default).

The "layer floor" column of earlier runs (one layer's backward pass as XLA
compiles it alone, plus the parameters, gradients and batch) is gone: plans
compiled below it (a 6-layer CNN at 0.329 against 0.472, the VGG-like net
at 0.490 against 0.533), since XLA shares that layer's buffers with the
rest of the step; it was no bound.

    python benchmarks/conv_benchmark.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time

import jax

import jdtr
from jdtr import models

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from grad_benchmark import machine, write_report  # noqa: E402
from remat_benchmark import compiled  # noqa: E402

MODELS = {
    "plain CNN, 6 layers, 32 channels": lambda: models.plain_cnn(6, 32, 32, 16),
    "plain CNN, 10 layers, 32 channels": lambda: models.plain_cnn(10, 32, 32, 16),
    "plain CNN, 6 layers, 64 channels": lambda: models.plain_cnn(6, 64, 32, 16),
    "VGG-like, 8 layers, pools after 2 and 4": lambda: models.plain_cnn(8, 32, 32, 16, pools=(1, 3)),
    "GroupNorm ResNet, 8 blocks": lambda: models.flax_resnet_groupnorm(8, 32, 32, 16),
    "U-Net, 2 levels, 16 channels (resize up, GELU)": lambda: models.flax_unet(16, 32, 16),
    "U-Net, 3 levels, 16 channels (transposed convolutions up, GroupNorm)": lambda: models.flax_unet3(16, 32, 16),
}


def steps(executables, args, repeats: int) -> list[float]:
    for exe in executables:
        jax.block_until_ready(exe(*args))
    times = [[] for _ in executables]
    for _ in range(repeats):
        for exe, t in zip(executables, times):
            start = time.perf_counter()
            jax.block_until_ready(exe(*args))
            t.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def rows(name: str, model, ratios, repeats: int) -> list[str]:
    args = (model.params, model.batch)
    base_exe, base_bytes = compiled(jax.grad(model.loss), args)
    plans, out = [], {}
    for ratio in ratios:
        start = time.perf_counter()
        try:
            plan = jdtr.plan(model.loss, *args, budget=ratio)
        except jdtr.OutOfBudgetError as err:
            works = err.suggested_budget_bytes
            verified = f"{works / base_bytes:.3f}" if works else "none"
            out[ratio] = f"| {name} | {ratio} | no plan fits; verified budget {verified} | | | | |"
            continue
        planning = time.perf_counter() - start
        exe, nbytes = compiled(plan.grad, args)
        plans.append((ratio, plan, exe, nbytes, planning))
    seconds = steps([base_exe, *(p[2] for p in plans)], args, repeats)
    for (ratio, plan, _, nbytes, planning), s in zip(plans, seconds[1:]):
        depth = max((seg.depth for seg in plan.segments), default=0)
        out[ratio] = (
            f"| {name} | {ratio} | {plan.gate}, {len(plan.segments)} segments (depth {depth}) | "
            f"{nbytes / base_bytes:.3f} | {s / seconds[0]:.2f} | {planning:.0f} | "
            f"{base_bytes / 2**20:.1f} MiB, {seconds[0] * 1e3:.1f} ms |"
        )
    return [out[ratio] for ratio in ratios]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.7, 0.5, 0.35])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="+", help="models whose name contains one of these words")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    chosen = {k: v for k, v in MODELS.items() if not args.only or any(w.lower() in k.lower() for w in args.only)}
    lines = [
        f"### jax.jit(jdtr.remat_grad) on conv nets, {datetime.date.today().isoformat()}", "",
        f"Command: `python benchmarks/conv_benchmark.py {' '.join(argv or sys.argv[1:])}`. Machine: {machine()}. "
        f"Images 32x32, batch 16. Step times: medians of {args.repeats} interleaved runs beside `jax.jit(jax.grad)`.", "",
        "| model | budget | plan (gate, segments) | bytes / jax.grad's | step / jax.jit(jax.grad) | planning s | jax.jit(jax.grad) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, factory in chosen.items():
        print(f"benchmarking {name} ...", file=sys.stderr)
        lines += rows(name, factory(), args.ratios, args.repeats)
    text = "\n".join(lines) + "\n"
    print(text)
    write_report(args.output, text)


if __name__ == "__main__":
    main()
