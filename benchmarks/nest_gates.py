"""Nested segments on the CPU gated by conds or by the taint: XLA's bytes of each.

For a tanh MLP chain, the leaves jdtr nests (`segments.uniform_leaves`, one
layer each where the chain allows) are regrouped to the left in groups of
each size (`segments.nested_left`), and each structure is compiled gated by
conds (the gate "auto" on a program without convolutions) and tainted (the
gate "taint"): XLA's arguments + outputs + temporaries of `jax.jit` of the
step, against `jax.jit(jax.grad)`'s. XLA holds the temporaries of nested
conds at once, so the deeper the nest, the more the conds cost. Then the
planner's own plan at half of `jax.grad`'s bytes, or where none fits, at
the budget its error suggests: its bytes, groups, and step time against
`jax.jit(jax.grad)` (median of interleaved runs).

    python benchmarks/nest_gates.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import sys

import jax

import jdtr
from jdtr import models
from jdtr.transform.segments import LEFT_NESTED_MAX, nested_left, uniform_leaves

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from grad_benchmark import machine, timed, write_report  # noqa: E402
from remat_benchmark import compiled  # noqa: E402

MODELS = {
    "mlp16x256_b1024": lambda: models.mlp_chain(16, 256, 1024),
    "mlp16x64_b512": lambda: models.mlp_chain(16, 64, 512),
}


def compiled_bytes(fn, *args) -> int:
    """XLA's arguments + outputs + temporaries of `jax.jit(fn)`."""
    return compiled(fn, args)[1]


def rows(name: str) -> list[str]:
    m = MODELS[name]()
    args = (m.params, m.batch)
    full = compiled_bytes(jax.grad(m.loss), *args)
    # Any plan with segments carries the traced program and its configuration.
    plan = jdtr.plan(m.loss, *args, budget=0.7, autotune=False)
    leaves = uniform_leaves(plan.program, set(), LEFT_NESTED_MAX)
    structures = [("flat", leaves)] + [
        (" + ".join(str(len(seg.leaves())) for seg in nested), nested) for nested in nested_left(plan.program, leaves, set())
    ]
    out = []
    for label, segments in structures:
        measured = [
            compiled_bytes(dataclasses.replace(plan, segments=segments, gate=gate).grad, *args) for gate in ("auto", "taint")
        ]
        out.append(
            f"| {name} | {len(leaves)} | {label} | {measured[0] / 2**20:.2f} ({measured[0] / full:.3f}) | "
            f"{measured[1] / 2**20:.2f} ({measured[1] / full:.3f}) |"
        )
    out.append(f"| {name} | | no remat | {full / 2**20:.2f} (1.000) | |")
    return out


def planned(name: str, repeats: int = 15) -> str:
    """The planner's plan at 0.5, or at the budget its error suggests."""
    m = MODELS[name]()
    args = (m.params, m.batch)
    try:
        plan, at = jdtr.plan(m.loss, *args, budget=0.5, autotune=False), "0.5"
    except jdtr.OutOfBudgetError as err:
        over = err.suggested_budget_bytes - err.budget_bytes
        plan = jdtr.plan(m.loss, *args, budget=err.suggested_budget_bytes, autotune=False)
        at = f"suggested: {over} B over 0.5"
    steps = {"plan": jax.jit(plan.grad), "jit": jax.jit(jax.grad(m.loss))}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for step in steps.values():
        jax.block_until_ready(step(*args))
    for _ in range(repeats):
        for k, step in steps.items():
            times[k].append(timed(step, *args)[0])
    groups = " + ".join(str(len(seg.leaves())) for seg in plan.segments)
    ratio = statistics.median(times["plan"]) / statistics.median(times["jit"])
    fraction = plan.compiled_bytes / plan.unconstrained_compiled_bytes
    return f"| {name} | {at} | {plan.gate} | {groups} | {plan.compiled_bytes / 2**20:.4f} ({fraction:.6f}) | {ratio:.2f} |"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    if jax.default_backend() != "cpu":
        print("segments are gated only on the CPU", file=sys.stderr)
        return
    lines = [
        f"### Nested segments gated by conds or by the taint (issue 24), {datetime.date.today().isoformat()}", "",
        f"Command: `python benchmarks/nest_gates.py`. Machine: {machine()}. MiB: XLA's arguments + outputs + "
        "temporaries of the step (in parentheses: of `jax.jit(jax.grad)`'s). Leaves regrouped to the left in "
        "groups of the sizes given (one leaf per layer here).", "",
        "| model | leaves | groups | gated by conds | tainted |",
        "|---|---|---|---|---|",
    ]
    for name in MODELS:
        print(f"benchmarking {name} ...", file=sys.stderr)
        lines += rows(name)
    lines += ["", "| model | budget | gate | groups | plan MiB (of jax.grad's) | step / jax.jit(jax.grad) |",
              "|---|---|---|---|---|---|"]
    lines += [planned(name) for name in MODELS]
    text = "\n".join(lines)
    print(text)
    write_report(args.output, text)


if __name__ == "__main__":
    main()
