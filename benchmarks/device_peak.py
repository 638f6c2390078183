"""Real device memory of jdtr.remat_grad steps, from the allocator (GPU/TPU).

XLA's `memory_analysis()` is what jdtr plans against; this script checks the
device's own allocator: `device.memory_stats()["peak_bytes_in_use"]` while a
planned step runs, against the budget. The allocator reports the peak since
the process started and cannot be reset, so every (model, budget) runs in a
fresh process, which first places the arguments, then plans, then steps:

- `autotune=False`: planning only compiles, so the peak is the step's own
  (plus the arguments, which the budget includes);
- default (autotuned): planning also runs every candidate plan within the
  budget, so the peak is the largest of them and the step.

On the CPU `memory_stats()` is None and the script says so and stops.

    python benchmarks/device_peak.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

MODELS = {
    "MLP chain, 64 layers, width 256, batch 2048": ("mlp_chain", (64, 256, 2048)),
    "Transformer, 6 blocks, dim 128, seq 128, batch 8": ("transformer", (6, 128, 4, 128, 8, 256)),
}


def measure(model: str, ratio: float | None, autotune: bool) -> dict:
    """One step in this process: the allocator's peak and XLA's numbers."""
    import jax

    import jdtr
    from jdtr import models

    factory, shape = MODELS[model]
    m = getattr(models, factory)(*shape)
    params, batch = jax.device_put((m.params, m.batch))
    jax.block_until_ready((params, batch))
    device = jax.devices()[0]
    arguments = device.memory_stats()["bytes_in_use"]
    if ratio is None:
        step, budget, xla = jax.jit(jax.grad(m.loss)), None, None
    else:
        plan = jdtr.plan(m.loss, params, batch, budget=ratio, autotune=autotune)
        step, budget, xla = jax.jit(plan.grad), plan.budget_bytes, plan.compiled_bytes
    jax.block_until_ready(step(params, batch))
    stats = device.memory_stats()
    return {"peak": stats["peak_bytes_in_use"], "arguments": arguments, "budget": budget, "xla": xla}


def run_child(model: str, ratio: float | None, autotune: bool) -> dict:
    command = [sys.executable, __file__, "--child", model, str(ratio), str(autotune)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=os.environ)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.7, 0.5, 0.35])
    parser.add_argument("--output")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        model, ratio, autotune = args.child
        print(json.dumps(measure(model, None if ratio == "None" else float(ratio), autotune == "True")))
        return 0

    import jax

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from grad_benchmark import machine

    if jax.devices()[0].memory_stats() is None:
        print(f"device_peak: {jax.devices()[0].platform} reports no memory_stats(); run this on a GPU or TPU", file=sys.stderr)
        return 1
    mib = 2**20
    lines = [
        f"### Allocator peaks of remat_grad steps, {datetime.date.today().isoformat()}", "",
        f"Machine: {machine()}. Peak = `memory_stats()['peak_bytes_in_use']` in a fresh process "
        "(arguments placed, planned, one step); XLA = the plan's `memory_analysis()` bytes.", "",
        "| model | budget | autotune | budget MiB | XLA MiB | peak MiB | peak / budget |", "|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        plain = run_child(model, None, False)
        lines.append(f"| {model} | jax.grad, no remat |  |  |  | {plain['peak'] / mib:.1f} |  |")
        for ratio in args.ratios:
            for autotune in (False, True):
                r = run_child(model, ratio, autotune)
                lines.append(
                    f"| {model} | {ratio} | {'default' if autotune else 'False'} | {r['budget'] / mib:.1f} | "
                    f"{r['xla'] / mib:.1f} | {r['peak'] / mib:.1f} | {r['peak'] / r['budget']:.3f} |"
                )
                print(lines[-1], file=sys.stderr)
    text = "\n".join(lines)
    print(text)
    if args.output:
        with open(args.output, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
