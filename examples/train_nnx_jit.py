"""Train a Flax NNX model under `nnx.jit` with jdtr's compiled path.

`jdtr.nnx.remat_value_and_grad` is `nnx.value_and_grad` with DTR's decisions
compiled into the step as checkpoint segments: it plans once per shape
(simulating DTR at `--budget`, a fraction of `jax.grad`'s compiled bytes),
then every step is one XLA program. Batch statistics and dropout RNG counts
are written back to the model as `nnx.value_and_grad` writes them.

A student MLP (BatchNorm, dropout, `--layers` tanh layers) learns a random
teacher. The script checks the first step's gradients against
`nnx.value_and_grad` and reports the compiled gradient step's bytes
(`memory_analysis()`) against the budget and against `jax.grad`'s.

    python examples/train_nnx_jit.py --budget 0.5 --steps 50
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax
from _common import add_budget_argument  # examples/_common.py
from flax import nnx

import jdtr
import jdtr.nnx
from jdtr.budget import parse_budget
from jdtr.runtime import format_bytes


class Student(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, layers: int, width: int, features: int):
        self.bn = nnx.BatchNorm(features, rngs=rngs)
        self.inp = nnx.Linear(features, width, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(layers)])
        self.drop = nnx.Dropout(0.05, rngs=rngs)
        self.out = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, x):
        x = jnp.tanh(self.inp(self.bn(x)))
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return self.out(self.drop(x))


def loss_fn(model: Student, x, y):
    return jnp.mean((model(x) - y) ** 2)


def compiled_bytes(fn, *args) -> int:
    a = jax.jit(fn).lower(*args).compile().memory_analysis()
    return a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_budget_argument(parser, 0.5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    features = 32
    keys = jax.random.split(jax.random.PRNGKey(args.seed), 3)
    teacher = jax.random.normal(keys[0], (features, 1)) / jnp.sqrt(features)
    model = Student(nnx.Rngs(args.seed), args.layers, args.width, features)
    optimizer = nnx.Optimizer(model, optax.sgd(args.lr), wrt=nnx.Param)
    value_and_grad = jdtr.nnx.remat_value_and_grad(loss_fn, budget=args.budget)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = value_and_grad(model, x, y)
        optimizer.update(model, grads)
        return loss

    def batch(key):
        x = jax.random.normal(key, (args.batch, features))
        return x, jnp.sin(x @ teacher)

    # The gradient step alone, compiled, against jax.grad's (the budget's unit).
    graphdef, state = nnx.split(model)
    x, y = batch(keys[1])
    remat_grad = jdtr.nnx.remat_grad(loss_fn, budget=args.budget)
    planned = compiled_bytes(lambda s, x, y: remat_grad(nnx.merge(graphdef, s), x, y), state, x, y)
    plain = compiled_bytes(lambda s, x, y: nnx.grad(loss_fn)(nnx.merge(graphdef, s), x, y), state, x, y)
    budget = args.budget
    # The first step's gradients against nnx.value_and_grad's, on copies of the model.
    ours = value_and_grad(nnx.clone(model), x, y)[1]
    theirs = nnx.value_and_grad(loss_fn)(nnx.clone(model), x, y)[1]
    pairs = zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs))
    error = max(float(jnp.max(jnp.abs(a - b))) for a, b in pairs)

    key, loss = keys[2], float("nan")
    for step in range(1, args.steps + 1):
        key, k = jax.random.split(key)
        loss = float(train_step(model, optimizer, *batch(k)))
        if step == 1 or step % max(args.steps // 5, 1) == 0:
            print(f"step {step}: loss {loss:.4f}")
    budget = parse_budget(budget).resolve(plain)
    print(
        f"compiled gradient step {format_bytes(planned)}, {planned / budget:.2f} of the budget {format_bytes(budget)} "
        f"(jax.grad {format_bytes(plain)}); max |jdtr - nnx.grad| = {error:.2e}; final loss {loss:.4f}"
    )
    return loss


if __name__ == "__main__":
    main()
