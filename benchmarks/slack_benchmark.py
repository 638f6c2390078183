"""Chunks run by a plan made for a little less than the budget, side by side
with the plan made at the budget (issue 21, `jdtr/transform/slack.py`).

For each model and budget ratio, in one process: `jax.jit(jax.grad)`, and
`jdtr.grad` planned twice, once with the slack turned off
(`slack.SLACKS = ()` while its plan is made) and once as shipped. Each is
called until its plan runs as compiled chunks and no longer reads the
allocator (the first call runs step by step; on a GPU, the first runs
teach the allocator's margin); the step times are medians of `--repeats`
interleaved runs from then on. Printed per row: chunks, the plan's peak
count against the budget, its compute overhead, the warm-up calls and
their planning and compiling time, and the step time against
`jax.jit(jax.grad)`; on a GPU also the allocator's peak above the
arguments after all calls, against the budget (a process's peak cannot be
reset, so this is the largest of the contenders run so far: read it in
`device_peak.py --variants planned noslack` for each alone).

    python benchmarks/slack_benchmark.py --models mlp transformer --ratios 0.5 0.3
    python benchmarks/slack_benchmark.py --models transformer --ratios 0.5 --slacks 0.1 0.2 0.3

`--slacks`: also the plan made for each fraction less than the budget,
chosen whatever the chunks' price (`slack.CHUNK_PRICE`) says: fewer chunks
for more recomputation, to measure what a chunk is worth on a machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
from typing import Optional

import jax

import jdtr
import jdtr.transform.slack as slack
from jdtr import models
from jdtr.transform import rental

rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from a plan's second run, as these tables measure (rental_benchmark.py: the rule)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grad_benchmark import machine, timed, write_report  # noqa: E402

WARMUP_CALLS = 10  # at most, per contender
MODELS = {
    "mlp": lambda: models.mlp_chain(layers=64, width=256, batch=2048),
    "mlp-small": lambda: models.mlp_chain(layers=64, width=16, batch=64),
    "resnet": lambda: models.resnet(blocks=4, channels=32, image=32, batch=16),
    "transformer": lambda: models.transformer(blocks=4, dim=128, heads=4, seq=128, batch=8, vocab=256),
    "flax_gpt": lambda: models.flax_gpt(layers=4, dim=128, heads=4, seq=128, batch=8, vocab=256),
}


@contextlib.contextmanager
def slack_off(off: bool, only: Optional[float] = None):
    """The slack off, or (`only`) the plan made for that fraction less than
    the budget wherever it fits, whatever the chunks' price says."""
    saved = slack.SLACKS, slack.CHUNK_PRICE
    if off:
        slack.SLACKS = ()
    elif only is not None:
        slack.SLACKS, slack.CHUNK_PRICE = (only,), 1e9
    try:
        yield
    finally:
        slack.SLACKS, slack.CHUNK_PRICE = saved


def warm_up(fn, args) -> list:
    """The `Stats` of calls of `fn` (a `jdtr.grad` with `return_stats`): the
    first plans and runs step by step, then until the plan runs as chunks
    and the allocator is no longer read (on a GPU, its first runs teach a
    margin, and a plan made for it: allocator.py), at most WARMUP_CALLS."""
    runs = [timed(fn, *args)[1][1]]
    while len(runs) < WARMUP_CALLS and not (runs[-1].execution == "chunks" and runs[-1].allocator_peak_bytes is None):
        runs.append(timed(fn, *args)[1][1])
    return runs


def report(title: str, repeats: int, header: str, names, rows_of, output) -> int:
    """Prints (and appends to `output`) a table of `rows_of(name)` for each
    model name, under `header` (its column names, `|`-separated)."""
    columns = header.count("|") - 1
    lines = [
        f"### {title}, {datetime.date.today().isoformat()}", "",
        f"Machine: {machine()}. Medians of {repeats} interleaved runs, once each plan runs as chunks.", "",
        header, "|" + "---|" * columns,
    ]
    for name in names:
        print(f"benchmarking {name} ...", file=sys.stderr)
        rows = rows_of(name)
        print("\n".join(rows), file=sys.stderr)
        lines += rows
    text = "\n".join(lines)
    print(text)
    write_report(output, text)
    return 0


def bench(model, ratios, repeats, slacks=()) -> list[str]:
    args = (model.params, model.batch)
    jit = jax.jit(jax.grad(model.loss))
    timed(jit, *args)
    contenders = {"jit": jit}
    stats = {}
    variants = [(True, None, "at the budget"), (False, None, "with slack")]
    variants += [(False, s, f"for {s:.0%} less") for s in slacks]
    for ratio in ratios:
        for off, only, label in variants:
            name = (ratio, label)
            loss = lambda *a, loss=model.loss: loss(*a)  # noqa: E731 (a function of its own: jdtr caches plans per function)
            fn = jdtr.grad(loss, budget=ratio, return_stats=True)
            try:
                with slack_off(off, only):
                    runs = warm_up(fn, args)
            except jdtr.OutOfBudgetError:
                continue
            contenders[name], stats[name] = fn, (runs, runs[-1])
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            times[name].append(timed(fn, *args)[0])
    med = {name: statistics.median(t) for name, t in times.items()}
    device = jax.devices()[0]
    peak = device.memory_stats()["peak_bytes_in_use"] if device.memory_stats() else None
    rows = []
    for name, (runs, last) in stats.items():
        ratio, variant = name
        rows.append(
            f"| {model.name} | {ratio} | {variant} | {last.chunks} | {last.peak_bytes / last.budget_bytes:.3f} "
            f"| {last.overhead:.3f} | {len(runs)}, {sum(s.planning_time_s for s in runs[1:]):.2f} | {med[name] / med['jit']:.2f} |"
        )
    jit_ms = f"{med['jit'] * 1e3:.2f} ms"
    return [*rows, f"| {model.name} | jax.jit(jax.grad) {jit_ms} | | | | | | allocator peak so far {peak / 2**20:.1f} MiB |" if peak else
            f"| {model.name} | jax.jit(jax.grad) {jit_ms} | | | | | | |"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["mlp", "transformer"])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.3])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slacks", type=float, nargs="*", default=[],
                        help="also the plans made for each of these fractions less than the budget, whatever the chunks' price")
    parser.add_argument("--output", help="append the markdown report here")
    args = parser.parse_args(argv)
    header = "| model | budget | plan | chunks | peak/budget (count) | overhead | warm-up calls, their planning and compiling s | jdtr / jit |"
    return report("Slack side by side", args.repeats, header, args.models,
                  lambda name: bench(MODELS[name](), args.ratios, args.repeats, args.slacks), args.output)


if __name__ == "__main__":
    sys.exit(main())
