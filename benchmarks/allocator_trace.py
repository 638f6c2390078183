"""A GPU allocator's bytes in use against `offline.bfc`'s model, dispatch by dispatch.

For each model and budget, in a fresh process: the first `jdtr.grad` call's
plan (made at the budget: the model's foresight off), run step by step,
with the device's `bytes_in_use` read after every dispatch (as a plan's
first run reads it), beside the model's bytes in use at the same point.
Prints the first step where they part by more than 64 KiB, with the steps
before it, and writes the whole record (the line's requests, sizes,
workspaces, both readings) as a line of JSON appended to `--out`, so that
the model can be compared with the device again without one.

    python benchmarks/allocator_trace.py --out /tmp/traces.jsonl      # on a GPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = {
    "resnet-1.0": ("resnet", 1.0),
    "resnet-0.5": ("resnet", 0.5),
    "transformer-0.5": ("transformer", 0.5),
    "mlp-0.3": ("mlp", 0.3),
}


def trace(case: str, out: str) -> None:
    import jax

    import jdtr
    from jdtr import models
    from jdtr.offline.bfc import allocator_peak
    from jdtr.offline.straightline import Compute, Free
    from jdtr.transform import allocator

    name, ratio = CASES[case]
    m = {
        "resnet": lambda: models.resnet(blocks=4, channels=32, image=32, batch=16),
        "transformer": lambda: models.transformer(blocks=4, dim=128, heads=4, seq=128, batch=8, vocab=256),
        "mlp": lambda: models.mlp_chain(layers=64, width=256, batch=2048),
    }[name]()
    allocator.FORESIGHTS = 0
    readings: list[int] = []
    real_reader = allocator.allocator_bytes

    def recording(inputs, held):
        read = real_reader(inputs, held)
        if read is None:
            return None

        def reader() -> int:
            readings.append(read())
            return readings[-1]

        return reader

    allocator.allocator_bytes = recording
    f = jdtr.grad(m.loss, budget=ratio, return_stats=True, chunks="never")
    grads, stats = f(m.params, m.batch)
    jax.block_until_ready(grads)
    (traced,) = f.cache.values()
    plan = next(iter(traced.plans.values()))
    line = plan.line
    # The model, read at the same points: after each computation's dispatch.
    modelled: list[int] = []
    model_peak = allocator_peak(line, modelled)
    records = [
        ["c", getattr(step.payload, "name", "?"), list(step.outputs), [line.sizes[s] for s in step.outputs], step.workspace]
        if type(step) is Compute else ["f", step.slot]
        for step in line.steps if type(step) in (Compute, Free)
    ]
    first = readings[0] if readings else None  # read before the run: the arguments and constants
    real = readings[1:]
    held = sum(line.sizes[s] for s in (*line.arguments, *line.externals))
    part = next((i for i, (r, mo) in enumerate(zip(real, modelled)) if abs(r - mo) > 65536), None)
    print(f"{case}: budget {stats.budget_bytes}, count peak {stats.peak_bytes}, device peak {stats.allocator_peak_bytes}, "
          f"model peak {model_peak}, held {held}, first reading {first}, {len(real)} readings / {len(modelled)} computations, "
          f"first parting at computation {part}")
    if part is not None:
        computes = [r for r in records if r[0] == "c"]
        for i in range(max(0, part - 6), min(part + 3, len(real))):
            print(f"  {i}: {computes[i][1]} outputs {computes[i][3]} workspace {computes[i][4]}: device {real[i]} model {modelled[i]} (+{real[i] - modelled[i]})")
    with open(out, "a") as file:
        json.dump({"case": case, "budget": stats.budget_bytes, "sizes": line.sizes, "arguments": list(line.arguments),
                   "externals": list(line.externals), "steps": records, "device": real, "model": modelled,
                   "device_peak": stats.allocator_peak_bytes, "first_reading": first}, file)
        file.write("\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/allocator_traces.jsonl")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--child")
    args = parser.parse_args(argv)
    if args.child:
        trace(args.child, args.out)
        return
    for case in args.cases:  # each in a fresh process: an allocator with no history
        subprocess.run([sys.executable, __file__, "--child", case, "--out", args.out], check=False)


if __name__ == "__main__":
    main()
