"""What `cost_model="measured"` records: each executable's first timed run against its later ones.

A structure's first call with measured costs runs online and times every
operator; a plan is made from those times. An executable's first run in a
process pays a one-time cost beside its work, and equal layers share one
executable, so a cost read off a first run would make the first of them
look several times dearer than the others. This runs each model once with
measured costs (the models in turn, in one process) and reports, per
executable timed three times or more, its first timed run over the median
of its later ones. Prints a Markdown table for docs/benchmarks.md.

    python benchmarks/measured_costs.py [--models transformer,mlp,resnet] [--budget 0.5]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys

import jdtr
from jdtr import models
from jdtr.transform import interpreter

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from grad_benchmark import machine  # noqa: E402

MODELS = {
    "transformer": ("transformer, 4 blocks, dim 64", lambda: models.transformer(blocks=4, dim=64, heads=2, seq=64, batch=8, vocab=64)),
    "mlp": ("MLP chain, 32 layers, 64 wide", lambda: models.mlp_chain(layers=32, width=64, batch=1024)),
    "resnet": ("ResNet, 4 blocks, 16 channels", lambda: models.resnet(blocks=4, channels=16, image=16, batch=8)),
}


def timed_runs(model, budget: float) -> dict[int, list[float]]:
    """The times the backend measured, by executable, in one call."""
    runs: dict[int, list[float]] = collections.defaultdict(list)
    compute = interpreter.JaxBackend.compute

    def recording(self, op, args):
        outs, elapsed = compute(self, op, args)
        if elapsed is not None:
            runs[id(op.payload.fn)].append(elapsed)
        return outs, elapsed

    interpreter.JaxBackend.compute = recording
    try:
        jdtr.grad(model.loss, budget=budget, cost_model="measured")(model.params, model.batch)
    finally:
        interpreter.JaxBackend.compute = compute
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="transformer,mlp,resnet")
    parser.add_argument("--budget", type=float, default=0.5)
    options = parser.parse_args()
    print(f"Machine: {machine()}. Budget {options.budget}.\n")
    print("| model | executables (timed 3+ times) | first / median of later runs: median | 90th percentile | "
          "all first runs / all medians |")
    print("|---|---|---|---|---|")
    for name in options.models.split(","):
        label, make = MODELS[name]
        try:
            runs = timed_runs(make(), options.budget)
        except jdtr.OutOfBudgetError as err:
            print(f"| {label} | out of budget: {err} | | | |", flush=True)
            continue
        repeated = sorted(times[0] / statistics.median(times[1:]) for times in runs.values() if len(times) >= 3)
        firsts = sum(times[0] for times in runs.values())
        medians = sum(statistics.median(times) for times in runs.values())
        p90 = repeated[min(len(repeated) - 1, int(0.9 * len(repeated)))]
        print(f"| {label} | {len(runs)} ({len(repeated)}) | {statistics.median(repeated):.2f} | {p90:.2f} | "
              f"{firsts / medians:.2f} |", flush=True)


if __name__ == "__main__":
    main()
