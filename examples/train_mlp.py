"""Train a deep MLP under a device-memory budget with jdtr (the `make demo` job).

A student MLP learns a random teacher network. Every gradient step runs with
`jdtr.value_and_grad` under `--budget` (a fraction of the step's
unconstrained peak, or bytes like "64MiB"); the first step is checked
against `jax.grad`.

    python examples/train_mlp.py --budget 0.4 --steps 60
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from _common import BudgetMeter, Progress, add_budget_argument  # examples/_common.py

import jdtr


def init_mlp(key, layers: int, width: int, features: int):
    keys = jax.random.split(key, layers + 1)
    params = [
        {"w": jax.random.normal(k, (features if i == 0 else width, width)) / jnp.sqrt(width), "b": jnp.zeros(width)}
        for i, k in enumerate(keys[:-1])
    ]
    params.append({"w": jax.random.normal(keys[-1], (width, 1)) / jnp.sqrt(width), "b": jnp.zeros(1)})
    return params


def apply_mlp(params, x):
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, batch):
    x, y = batch
    return jnp.mean((apply_mlp(params, x) - y) ** 2)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_budget_argument(parser, 0.4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--heuristic", default=jdtr.DEFAULT_HEURISTIC, choices=sorted(jdtr.HEURISTICS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    key = jax.random.PRNGKey(args.seed)
    k_teacher, k_student, k_data = jax.random.split(key, 3)
    features = 32
    teacher = init_mlp(k_teacher, 2, 64, features)
    params = init_mlp(k_student, args.layers, args.width, features)

    step_fn = jdtr.value_and_grad(loss_fn, budget=args.budget, heuristic=args.heuristic, return_stats=True)
    sgd = jax.jit(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - args.lr * b, p, g))

    worst_error, meter, progress = None, BudgetMeter(), Progress(args.steps)
    loss = float("nan")
    for step in range(1, args.steps + 1):
        k_data, k = jax.random.split(k_data)
        x = jax.random.normal(k, (args.batch, features))
        batch = (x, apply_mlp(teacher, x))
        (loss_value, grads), stats = step_fn(params, batch)
        if step == 1:  # the check against jax.grad
            reference = jax.grad(loss_fn)(params, batch)
            worst_error = max(
                float(jnp.max(jnp.abs(a - b)))
                for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(reference))
            )
            del reference
        params = sgd(params, grads)
        loss = float(loss_value)
        meter.add(stats)
        progress(step, loss=loss)

    print(f"{meter.report()}, final loss {loss:.4f}, max |jdtr - jax.grad| = {worst_error:.2e}")
    return loss


if __name__ == "__main__":
    main()
