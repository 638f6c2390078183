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

"Layer floor": for the plain CNNs, what any plan that runs the fast
convolution gradient holds at least, over `jax.grad`'s bytes: the
parameters, their gradients and the batch, plus the largest backward pass
of one convolution-and-ReLU layer as XLA compiles it alone (its input and
cotangent in, the input's and kernel's cotangents out, and the transposed
copies it makes). A budget below it has no such plan.

    python benchmarks/conv_benchmark.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

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


def _layer(w, h):
    """One layer of `models.plain_cnn`: a 3x3 convolution and ReLU."""
    return jax.nn.relu(lax.conv_general_dilated(h, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))


def _layer_backward(w, h, g):
    return jax.vjp(_layer, w, h)[1](g)


def layer_floor(model) -> Optional[int]:
    """The bytes any fast-path plan of a `models.plain_cnn` holds at least
    (the module docstring's "layer floor"); None for other models."""
    convs = model.params.get("convs") if isinstance(model.params, dict) else None
    if convs is None:
        return None
    x = model.batch[0]
    batch, image = x.shape[0], x.shape[1]
    worst = 0
    for kernel in convs:
        if isinstance(kernel, tuple):  # a 2x2 max pool (an entry with no arrays)
            image //= 2
            continue
        cin, cout = kernel.shape[2], kernel.shape[3]
        h = jax.ShapeDtypeStruct((batch, image, image, cin), jnp.float32)
        g = jax.ShapeDtypeStruct((batch, image, image, cout), jnp.float32)
        worst = max(worst, compiled(_layer_backward, (kernel, h, g))[1])
    leaves = jax.tree_util.tree_leaves(model.params)
    fixed = 2 * sum(a.nbytes for a in leaves) + sum(a.nbytes for a in jax.tree_util.tree_leaves(model.batch))
    return fixed + worst


def rows(name: str, model, ratios, repeats: int) -> list[str]:
    args = (model.params, model.batch)
    base_exe, base_bytes = compiled(jax.grad(model.loss), args)
    floor = layer_floor(model)
    floor_text = f"{floor / base_bytes:.3f}" if floor else "n/a"
    plans, out = [], {}
    for ratio in ratios:
        start = time.perf_counter()
        try:
            plan = jdtr.plan(model.loss, *args, budget=ratio)
        except jdtr.OutOfBudgetError as err:
            works = err.suggested_budget_bytes
            verified = f"{works / base_bytes:.3f}" if works else "none"
            out[ratio] = f"| {name} | {ratio} | no plan fits; verified budget {verified} | | | {floor_text} | | |"
            continue
        planning = time.perf_counter() - start
        exe, nbytes = compiled(plan.grad, args)
        plans.append((ratio, plan, exe, nbytes, planning))
    seconds = steps([base_exe, *(p[2] for p in plans)], args, repeats)
    for (ratio, plan, _, nbytes, planning), s in zip(plans, seconds[1:]):
        depth = max((seg.depth for seg in plan.segments), default=0)
        out[ratio] = (
            f"| {name} | {ratio} | {plan.gate}, {len(plan.segments)} segments (depth {depth}) | "
            f"{nbytes / base_bytes:.3f} | {s / seconds[0]:.2f} | {floor_text} | {planning:.0f} | "
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
        "| model | budget | plan (gate, segments) | bytes / jax.grad's | step / jax.jit(jax.grad) | layer floor | planning s | jax.jit(jax.grad) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, factory in chosen.items():
        print(f"benchmarking {name} ...", file=sys.stderr)
        lines += rows(name, factory(), args.ratios, args.repeats)
    text = "\n".join(lines) + "\n"
    print(text)
    write_report(args.output, text)


if __name__ == "__main__":
    main()
