"""Scan-aware plans: `jdtr.remat_grad` on models whose steps or layers sit in a `scan`.

For each model and budget: the strategy the planner chose for each kept
scan, XLA's compiled bytes of the planned step (`memory_analysis()`) against
the budget and against `jax.jit(jax.grad)`'s, planning plus compile time
(the first `jdtr.plan` call, on a fresh function), the step time against
`jax.jit(jax.grad)` (medians of interleaved runs), and the gradients'
largest difference from `jax.grad`'s.

    python benchmarks/scan_benchmark.py --output docs/benchmarks.md

With `--each-strategy`, instead: for each strategy of `jdtr/transform/scans.py`
(the planner's candidates, in its order), the step `jax.grad` with every
kept scan run under it and nothing else rematerialized, its compiled bytes
and step time against `jax.jit(jax.grad)`'s. A strategy's bytes are the
floor of the plans that use it; "pieces" (`body_pieces.py`) is there for
scans whose one iteration's working set is that floor (a transformer's).

    python benchmarks/scan_benchmark.py --each-strategy --only gpt --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jdtr
from jdtr import models
from jdtr.transform.scans import STRATEGIES, with_scans_under

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from grad_benchmark import machine, write_report  # noqa: E402

SUITE = {
    "lstm64": ("Flax LSTM in lax.scan, 64 steps, input and hidden 128, batch 32",
               lambda: models.flax_scan_lstm(64, 128, 128, 32)),
    "lstm256": ("the same LSTM, 256 steps", lambda: models.flax_scan_lstm(256, 128, 128, 32)),
    "gpt": ("GPT, 12 blocks in nnx.scan, dim 128, seq 128, batch 8", lambda: models.flax_scan_gpt(12, 128, 4, 128, 8)),
    "stacked": ("stacked LSTM, a scan over 4 layers of scans over 64 steps, hidden 128, batch 32",
                lambda: models.stacked_lstm(4, 64, 128, 32)),
}


def total_bytes(fn, args) -> tuple:
    exe = jax.jit(fn).lower(*args).compile()
    a = exe.memory_analysis()
    return exe, a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes


def interleaved_medians(exes: dict, args, repeats: int) -> dict:
    """Per label, the median seconds of its executable on `args`, the runs interleaved (after one warm-up each)."""
    for exe in exes.values():
        jax.block_until_ready(exe(*args))
    times = {label: [] for label in exes}
    for _ in range(repeats):
        for label, exe in exes.items():
            t = time.perf_counter()
            jax.block_until_ready(exe(*args))
            times[label].append(time.perf_counter() - t)
    return {label: statistics.median(found) for label, found in times.items()}


def run(key: str, ratios, repeats: int) -> list[str]:
    name, factory = SUITE[key]
    m = factory()
    args = (m.params, m.batch)
    base_exe, base_bytes = total_bytes(jax.grad(m.loss), args)
    reference = jax.grad(m.loss)(*args)
    rows, exes = [], {"jax.jit(jax.grad)": base_exe}
    for ratio in ratios:
        loss = lambda p, b: m.loss(p, b)  # noqa: E731 - a fresh function: nothing cached from another budget
        start = time.perf_counter()
        try:
            plan = jdtr.plan(loss, *args, budget=ratio)
        except jdtr.OutOfBudgetError as err:
            rows.append((ratio, None, str(err).split(":")[0]))
            continue
        seconds = time.perf_counter() - start
        exe, nbytes = total_bytes(plan.grad, args)
        grads = exe(*args)
        error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(reference)))
        exes[ratio] = exe
        strategy = "; ".join(k.strategy.describe(k.equation.scan.length) for k in plan.scans) or "(no kept scan)"
        rows.append((ratio, (plan, nbytes, seconds, error, strategy), None))
    times = interleaved_medians(exes, args, repeats)
    base_time = times["jax.jit(jax.grad)"]
    lines = [f"**{name}** (`jax.jit(jax.grad)`: {base_bytes / 2**20:.2f} MiB, {base_time * 1e3:.1f} ms per step)", "",
             "| budget | strategy per kept scan | compiled MiB | / budget | / jax.grad's | plan + compile s | step / jax.jit(jax.grad) | max grad difference |",
             "|---|---|---|---|---|---|---|---|"]
    for ratio, found, failure in rows:
        if found is None:
            lines.append(f"| {ratio} | no plan: {failure} | | | | | | |")
            continue
        plan, nbytes, seconds, error, strategy = found
        step = times[ratio]
        lines.append(
            f"| {ratio} | {strategy} | {nbytes / 2**20:.2f} | {nbytes / plan.budget_bytes:.3f} | {nbytes / base_bytes:.3f} | "
            f"{seconds:.1f} | {step / base_time:.2f} | {error:.1e} |"
        )
    return lines


def under(loss, args, strategy):
    """`loss` with its kept scans under `strategy` (nothing else rematerialized), of the same arguments."""
    closed = jax.make_jaxpr(loss)(*args)
    run = with_scans_under(closed, strategy)
    return lambda *a: run(*jax.tree_util.tree_leaves(a))[0]


def each_strategy(key: str, ratios, repeats: int) -> list[str]:
    name, factory = SUITE[key]
    m = factory()
    args = (m.params, m.batch)
    reference = jax.grad(m.loss)(*args)
    exes, found = {}, {}
    base_exe, base_bytes = total_bytes(jax.grad(m.loss), args)
    exes["jax.jit(jax.grad)"] = base_exe
    for strategy in STRATEGIES:
        exe, nbytes = total_bytes(jax.grad(under(m.loss, args, strategy)), args)
        grads = exe(*args)
        error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(reference)))
        exes[strategy], found[strategy] = exe, (nbytes, error)
    times = interleaved_medians(exes, args, repeats)
    base = times["jax.jit(jax.grad)"]
    lines = [f"**{name}** (`jax.jit(jax.grad)`: {base_bytes / 2**20:.2f} MiB, {base * 1e3:.1f} ms per step)", "",
             "| strategy (saves, levels) | compiled MiB | / jax.grad's | step / jax.jit(jax.grad) | max grad difference |",
             "|---|---|---|---|---|"]
    for strategy, (nbytes, error) in found.items():
        lines.append(
            f"| {strategy.saves}, {strategy.levels}{', inner' if strategy.inner else ''} | {nbytes / 2**20:.2f} | {nbytes / base_bytes:.3f} | "
            f"{times[strategy] / base:.2f} | {error:.1e} |"
        )
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.3])
    parser.add_argument("--only", nargs="+", choices=sorted(SUITE), default=sorted(SUITE))
    parser.add_argument("--each-strategy", action="store_true", help="each kept-scan strategy alone, no plan")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    title, what, measure = "Scan-aware plans", "", run
    if args.each_strategy:
        title, what, measure = "Kept-scan strategies, each alone", " --each-strategy", each_strategy
    report = [f"### {title} (issue 22), {datetime.date.today().isoformat()}", "",
              f"Command: `python benchmarks/scan_benchmark.py{what}`. Machine: {machine()}. Compiled bytes: XLA's arguments + "
              f"outputs + temporaries of the whole step. Step times: medians of {args.repeats} interleaved runs.", ""]
    for key in args.only:
        print(f"benchmarking {key} ...", file=sys.stderr)
        lines = measure(key, args.ratios, args.repeats)
        print("\n".join(lines), file=sys.stderr)
        report += lines + [""]
    text = "\n".join(report)
    print(text)
    write_report(args.output, text)


if __name__ == "__main__":
    main()
