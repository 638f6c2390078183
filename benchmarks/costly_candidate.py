"""The autotuning candidate that saves the values dearest to recompute (`costly.py`), on and off.

For each model at each budget, plans `jax.jit(jdtr.remat_grad)`'s step
(autotuned, the default) twice, in child processes taken in turns: with the
candidate and without it (`planning.costly_candidate` replaced by a no-op,
the planner before it). Each child reports the plan chosen (its origin),
its compiled bytes over `jax.jit(jax.grad)`'s, its step time over
`jax.jit(jax.grad)`'s (medians of interleaved runs in that child), the
planning seconds, and whether the candidate was compiled.

    python benchmarks/costly_candidate.py [--rounds 2] [--output docs/benchmarks.md] [sorts mlp ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time

MODELS = ("sorts", "sorts_small", "mlp", "gated_mlp", "transformer", "resnet", "gpt")


def model(name: str):
    from jdtr import models

    made = {
        "sorts": lambda: models.sorted_layers(6, 512),
        "sorts_small": lambda: models.sorted_layers(6, 256, k=8),
        "mlp": lambda: models.mlp_chain(layers=32, width=256, batch=2048),
        "gated_mlp": lambda: models.gated_mlp(blocks=8, width=256, batch=512),
        "transformer": lambda: models.transformer(6, 128, 4, 128, 8, 256),
        "resnet": lambda: models.resnet(),
        "gpt": lambda: models.flax_gpt(),
    }[name]()
    return made.loss, (made.params, made.batch)


def child(name: str, budget: float, costly: bool) -> dict:
    import jax

    import jdtr
    from jdtr.transform import planning

    if not costly:
        planning.costly_candidate = lambda search, base: None
    measured = []
    original = planning.costly_candidate

    def counting(search, base):
        found = original(search, base)
        measured.extend(p.compiled_bytes for p in search.compiled if p.origin == "costly")
        return found

    planning.costly_candidate = counting
    loss, args = model(name)
    reference = jax.jit(jax.grad(loss))
    full_exe = reference.lower(*args).compile().memory_analysis()
    full = full_exe.argument_size_in_bytes + full_exe.output_size_in_bytes + full_exe.temp_size_in_bytes
    start = time.perf_counter()
    plan = jdtr.plan(loss, *args, budget=budget)
    planned = time.perf_counter() - start
    step = jax.jit(plan.grad)
    jax.block_until_ready(step(*args))
    jax.block_until_ready(reference(*args))
    ours, theirs = [], []
    for _ in range(7):
        for fn, times in ((reference, theirs), (step, ours)):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - t)
    return dict(
        origin=plan.origin, bytes=plan.compiled_bytes / full, step=statistics.median(ours) / statistics.median(theirs),
        plan_s=planned, costly_compiled=len(measured),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, budget, costly = args.child
        print(json.dumps(child(name, float(budget), costly == "on")))
        return

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from grad_benchmark import machine, write_report

    rows = []
    for name in args.models:
        for budget in args.budgets:
            runs: dict[str, list[dict]] = {"off": [], "on": []}
            for _ in range(args.rounds):
                for mode in ("off", "on"):
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", name, str(budget), mode], capture_output=True, text=True
                    )
                    if out.returncode != 0:
                        runs[mode].append(dict(error=out.stderr.strip().splitlines()[-1][:120]))
                    else:
                        runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
            cells = []
            for mode in ("off", "on"):
                got = runs[mode]
                if any("error" in r for r in got):
                    cells.append(next(r["error"] for r in got if "error" in r))
                    continue
                origins = "/".join(r["origin"] for r in got)
                steps = ", ".join("%.2fx" % r["step"] for r in got)
                seconds = ", ".join("%.1f" % r["plan_s"] for r in got)
                cell = f"{origins}, {got[0]['bytes']:.3f}, {steps}, {seconds} s"
                if mode == "on":
                    cell += f", candidate compiled {got[-1]['costly_compiled']}x"
                cells.append(cell)
            row = f"| {name} at {budget} | {cells[0]} | {cells[1]} |"
            print(row, flush=True)
            rows.append(row)
    text = "\n".join([
        f"### The costly candidate on and off ({datetime.date.today()}, {machine()})",
        "",
        "Per cell: the plans chosen per round, their compiled bytes over `jax.jit(jax.grad)`'s, "
        "their step times over its (medians of 7 interleaved runs), and the planning seconds.",
        "",
        "| model | without the candidate | with it |",
        "|---|---|---|",
        *rows,
    ])
    write_report(args.output, text)


if __name__ == "__main__":
    main()
