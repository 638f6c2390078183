"""`jax.vmap(jdtr.remat_grad(loss, budget=B))`: the batched step against its budget.

Per-example gradients of shared parameters (`in_axes=(None, 0)`) and an
ensemble (`in_axes=(0, 0)`), on tanh MLPs where the per-example gradients
dominate the step and where activations do, on a GRU in `lax.scan` and on
a WaveNet of dilated causal convolutions (shared weights, per-example
gradients; `--only WaveNet` runs one). For each budget (a fraction
of `vmap(jax.grad)`'s compiled bytes): the jitted batched step's XLA bytes
over `vmap(jax.grad)`'s and over the budget, its step time over
`vmap(jax.grad)`'s (medians of interleaved runs), the largest difference
from its gradients, the seconds planning took; or, where planning raises,
what the error says. Run it on two commits (PYTHONPATH=<checkout>) to
compare.

    python benchmarks/vmap_budget.py
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import jax
import jax.numpy as jnp

import jdtr
from jdtr import models

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from conv_benchmark import steps  # noqa: E402
from grad_benchmark import machine  # noqa: E402
from remat_benchmark import compiled  # noqa: E402


def tanh_mlp(layers: int, width: int, examples: int, rows: int, ensemble: bool):
    keys = jax.random.split(jax.random.PRNGKey(0), layers + 1)
    params = [jax.random.normal(k, (width, width)) / width**0.5 for k in keys[:layers]]
    if ensemble:
        params = [jnp.stack([w * (1 + 0.01 * i) for i in range(examples)]) for w in params]
    xs = jax.random.normal(keys[-1], (examples, rows, width))

    def loss(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x**2)

    return loss, (params, xs), ((0, 0) if ensemble else (None, 0))


def gru(steps: int, features: int, hidden: int, examples: int):
    """One example's loss: a GRU over `steps` inputs in `lax.scan`, then a linear read-out of its last state."""
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "x": jax.random.normal(keys[0], (features, 3 * hidden)) / features**0.5,
        "h": jax.random.normal(keys[1], (hidden, 3 * hidden)) / hidden**0.5,
        "out": jax.random.normal(keys[2], (hidden, 10)) / hidden**0.5,
    }
    xs = jax.random.normal(keys[3], (examples, steps, features))

    def loss(p, x):
        def cell(h, xt):
            gx, gh = xt @ p["x"], h @ p["h"]
            r = jax.nn.sigmoid(gx[:hidden] + gh[:hidden])
            z = jax.nn.sigmoid(gx[hidden : 2 * hidden] + gh[hidden : 2 * hidden])
            n = jnp.tanh(gx[2 * hidden :] + r * gh[2 * hidden :])
            return (1 - z) * n + z * h, None

        h, _ = jax.lax.scan(cell, jnp.zeros(hidden), x)
        return jnp.sum((h @ p["out"]) ** 2)

    return loss, (params, xs), (None, 0)


def wavenet(layers: int, channels: int, length: int, examples: int):
    """`models.wavenet`: per-example gradients of shared weights."""
    made = models.wavenet(layers, channels, length, examples)
    return made.loss, (made.params, made.batch), (None, 0)


MODELS = {
    "per-example gradients dominate: 4x128, 64 examples of 32 rows":
        lambda: tanh_mlp(layers=4, width=128, examples=64, rows=32, ensemble=False),
    "activations dominate: 8x64, 16 examples of 512 rows":
        lambda: tanh_mlp(layers=8, width=64, examples=16, rows=512, ensemble=False),
    "ensemble: 8x64, 16 members, 512 rows": lambda: tanh_mlp(layers=8, width=64, examples=16, rows=512, ensemble=True),
    "GRU in lax.scan, 128 steps, hidden 128, 8 examples": lambda: gru(steps=128, features=64, hidden=128, examples=8),
    "GRU in lax.scan, 512 steps, hidden 256, 16 examples": lambda: gru(steps=512, features=64, hidden=256, examples=16),
    "WaveNet: 8 dilated causal conv layers, 32 channels, length 2048, 8 examples":
        lambda: wavenet(layers=8, channels=32, length=2048, examples=8),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.7, 0.5])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", nargs="+", default=(), help="models whose name contains one of these")
    args = parser.parse_args()
    print(machine())
    print("| model | budget | bytes / vmap(jax.grad)'s | bytes / budget | step / vmap(jax.grad)'s | max error | planning s |")
    print("|---|---|---|---|---|---|---|")
    for name, model in MODELS.items():
        if args.only and not any(word in name for word in args.only):
            continue
        loss, example, in_axes = model()
        plain = jax.vmap(jax.grad(loss), in_axes=in_axes)
        full = compiled(plain, example)[1]
        reference = jax.jit(plain)(*example)
        for ratio in args.ratios:
            planned = jax.vmap(jdtr.remat_grad(loss, budget=ratio, autotune=False), in_axes=in_axes)
            start = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = jax.jit(planned)(*example)
            except jdtr.OutOfBudgetError as error:
                suggested = error.suggested_budget_bytes
                said = f"raises: {str(error).split(':')[0][:60]}..."
                if suggested:
                    said += f" suggests {suggested / full:.3f}"
                print(f"| {name} | {ratio} | {said} | | | | {time.perf_counter() - start:.1f} |")
                continue
            seconds = time.perf_counter() - start
            nbytes = compiled(planned, example)[1]
            error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(reference)))
            mine, theirs = steps([jax.jit(planned), jax.jit(plain)], example, args.repeats)
            print(f"| {name} | {ratio} | {nbytes / full:.3f} | {nbytes / (ratio * full):.3f} | {mine / theirs:.2f} "
                  f"| {error:.1e} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
