"""Train a TreeLSTM, a dynamic model, on random binary trees under a byte budget.

Each step draws a tree shape, and Python recursion over it builds the
computation (the binary TreeLSTM of Tai et al., 2015), so the graph changes
from batch to batch, as in the paper's TreeLSTM experiments. A tree is a
static Python structure, a nested tuple where `()` is a leaf and
`(left, right)` a node; it is passed to the loss as a non-array argument,
so jdtr's trace cache keys on it: each distinct shape is traced once and
reused when it comes back.

The task: every leaf holds a digit token, a batch holds `--batch` trees of
one shape, and the model regresses the mean of the leaf digits, read off
the root's hidden state.

The budget is in bytes, below the unconstrained peak of the largest tree
(`--budget` is a fraction of that peak, or bytes): a plain run of that tree
would not fit, and every step holds that one byte budget.

    python examples/treelstm.py --budget 0.8 --steps 60
"""

from __future__ import annotations

import argparse
import jax
import jax.numpy as jnp
import numpy as np
from _common import BudgetMeter, Progress, add_budget_argument  # examples/_common.py

import jdtr
from jdtr.runtime import format_bytes

Tree = tuple  # () is a leaf, (left, right) a node

VOCAB = 10  # digit tokens


def random_tree(rng: np.random.Generator, leaves: int) -> Tree:
    """A random binary tree with `leaves` leaves (split points drawn uniformly)."""
    if leaves == 1:
        return ()
    left = int(rng.integers(1, leaves))
    return (random_tree(rng, left), random_tree(rng, leaves - left))


def distinct_trees(rng: np.random.Generator, count: int, min_leaves: int, max_leaves: int) -> list[Tree]:
    """Up to `count` different random shapes (fewer if the leaf range does not have that many)."""
    shapes: dict[Tree, None] = {}
    for _ in range(100 * count):
        shapes[random_tree(rng, int(rng.integers(min_leaves, max_leaves + 1)))] = None
        if len(shapes) == count:
            break
    return list(shapes)


def count_leaves(tree: Tree) -> int:
    return 1 if tree == () else count_leaves(tree[0]) + count_leaves(tree[1])


def depth(tree: Tree) -> int:
    return 0 if tree == () else 1 + max(depth(tree[0]), depth(tree[1]))


def init_params(key, hidden: int, embed: int):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return {
        "embed": jax.random.normal(k1, (VOCAB, embed)) * 0.5,
        "leaf": {"w": jax.random.normal(k2, (embed, 3 * hidden)) / jnp.sqrt(embed), "b": jnp.zeros(3 * hidden)},
        # gates of a node: input, forget-left, forget-right, output, update (Tai et al., N-ary TreeLSTM)
        "node": {"w": jax.random.normal(k3, (2 * hidden, 5 * hidden)) / jnp.sqrt(2 * hidden), "b": jnp.zeros(5 * hidden)},
        "out": {"w": jax.random.normal(k4, (hidden, 1)) / jnp.sqrt(hidden), "b": jnp.zeros(1)},
    }


def encode(params, tree: Tree, leaf_inputs: list):
    """(h, c) of `tree`'s root; consumes one embedded leaf per leaf, left to right."""
    if tree == ():
        i, o, u = jnp.split(leaf_inputs.pop(0) @ params["leaf"]["w"] + params["leaf"]["b"], 3, axis=-1)
        c = jax.nn.sigmoid(i) * jnp.tanh(u)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c
    h_left, c_left = encode(params, tree[0], leaf_inputs)
    h_right, c_right = encode(params, tree[1], leaf_inputs)
    gates = jnp.concatenate([h_left, h_right], axis=-1) @ params["node"]["w"] + params["node"]["b"]
    i, f_left, f_right, o, u = jnp.split(gates, 5, axis=-1)
    c = jax.nn.sigmoid(i) * jnp.tanh(u) + jax.nn.sigmoid(f_left) * c_left + jax.nn.sigmoid(f_right) * c_right
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def loss_fn(params, tokens, targets, tree: Tree):
    """Mean squared error over a batch of trees of one shape; `tokens` is (batch, leaves)."""
    embedded = params["embed"][tokens]  # (batch, leaves, embed)
    h, _ = encode(params, tree, [embedded[:, j] for j in range(tokens.shape[1])])
    prediction = (h @ params["out"]["w"] + params["out"]["b"])[:, 0]
    return jnp.mean((prediction - targets) ** 2)


def batch_for(rng: np.random.Generator, tree: Tree, batch: int):
    tokens = rng.integers(0, VOCAB, (batch, count_leaves(tree)))
    targets = tokens.mean(axis=1) / (VOCAB - 1) * 2 - 1  # in [-1, 1]
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(targets, jnp.float32)


def unconstrained_peak(params, tree: Tree, rng: np.random.Generator, batch: int) -> int:
    """jdtr's unconstrained peak of one step on `tree` (a run with no budget; the trace stays cached)."""
    _, stats = jdtr.grad(loss_fn, return_stats=True)(params, *batch_for(rng, tree, batch), tree)
    return stats.unconstrained_peak_bytes


def next_shape(rng: np.random.Generator, shapes: list[Tree], current: int) -> int:
    """Another shape than the current one, uniformly."""
    index = int(rng.integers(len(shapes) - 1))
    return index + 1 if index >= current else index


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_budget_argument(parser, 0.8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--shapes", type=int, default=8, help="distinct tree shapes to draw from")
    parser.add_argument("--min-leaves", type=int, default=4)
    parser.add_argument("--max-leaves", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--embed", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--heuristic", default=jdtr.DEFAULT_HEURISTIC, choices=sorted(jdtr.HEURISTICS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    shapes = sorted(distinct_trees(rng, args.shapes, args.min_leaves, args.max_leaves), key=count_leaves, reverse=True)
    if len(shapes) < 2:
        parser.error("need at least two tree shapes: raise --shapes or widen --min-leaves..--max-leaves")
    params = init_params(jax.random.PRNGKey(args.seed), args.hidden, args.embed)
    largest_peak = unconstrained_peak(params, shapes[0], rng, args.batch)
    budget_bytes = jdtr.parse_budget(args.budget).resolve(largest_peak)  # a fraction of the largest tree's peak, or bytes

    step_fn = jdtr.value_and_grad(loss_fn, budget=budget_bytes, heuristic=args.heuristic, return_stats=True)
    sgd = jax.jit(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - args.lr * b, p, g))
    meter, progress = BudgetMeter(), Progress(args.steps)
    loss, current, worst_error = float("nan"), 0, None
    for step in range(1, args.steps + 1):
        current = next_shape(rng, shapes, current) if step > 1 else 0
        tree = shapes[current]
        tokens, targets = batch_for(rng, tree, args.batch)
        (loss_value, grads), stats = step_fn(params, tokens, targets, tree)
        if step == 1:  # the largest tree, checked against jax.grad
            reference = jax.grad(loss_fn)(params, tokens, targets, tree)
            worst_error = max(
                float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(reference))
            )
        params = sgd(params, grads)
        loss = float(loss_value)
        meter.add(stats)
        progress(step, loss=loss, leaves=count_leaves(tree))

    sizes = sorted({count_leaves(t) for t in shapes})
    print(
        f"{len(shapes)} tree shapes, {sizes[0]}-{sizes[-1]} leaves, depth up to {max(map(depth, shapes))}; "
        f"the largest tree's unconstrained peak {format_bytes(largest_peak)} "
        f"{'>' if largest_peak > budget_bytes else '<='} budget {format_bytes(budget_bytes)}"
    )
    print(
        f"{meter.report()}, re-traces {step_fn.cache_misses} (+1: the largest tree, traced when measuring its peak), "
        f"trace-cache hits {step_fn.cache_hits}, final loss {loss:.4f}, max |jdtr - jax.grad| = {worst_error:.2e}"
    )
    return loss


if __name__ == "__main__":
    main()
