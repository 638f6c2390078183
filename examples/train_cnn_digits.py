"""Train a small ResNet with BatchNorm (flax.nnx + optax) on scikit-learn's digits under a budget.

The data are scikit-learn's bundled handwritten digits (1797 8x8 images, no
download), split into train and test sets. Every gradient step runs with
`jdtr.nnx.value_and_grad` under `--budget`; BatchNorm's running statistics
are updated as `flax.nnx` updates them. With `--compare`, a second model with
the same seed is trained alongside with plain `nnx.value_and_grad`: its
gradients equal jdtr's to float precision, so both reach the same test
accuracy.

    python examples/train_cnn_digits.py --budget 0.4 --steps 300 --compare
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import BudgetMeter, Progress, add_budget_argument  # examples/_common.py
from flax import nnx
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import jdtr
import jdtr.nnx


class Block(nnx.Module):
    """conv-BN-ReLU-conv-BN plus the identity, then ReLU."""

    def __init__(self, channels: int, rngs: nnx.Rngs):
        # No conv bias before BatchNorm: its gradient is zero.
        self.conv1 = nnx.Conv(channels, channels, (3, 3), use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(channels, momentum=0.9, rngs=rngs)
        self.conv2 = nnx.Conv(channels, channels, (3, 3), use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(channels, momentum=0.9, rngs=rngs)

    def __call__(self, x):
        r = nnx.relu(self.bn1(self.conv1(x)))
        return nnx.relu(x + self.bn2(self.conv2(r)))


class ResNet(nnx.Module):
    def __init__(self, blocks: int, channels: int, rngs: nnx.Rngs, classes: int = 10):
        self.stem = nnx.Conv(1, channels, (3, 3), use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(channels, momentum=0.9, rngs=rngs)
        self.blocks = nnx.List([Block(channels, rngs) for _ in range(blocks)])
        self.head = nnx.Linear(channels, classes, rngs=rngs)

    def __call__(self, x):
        h = nnx.relu(self.bn(self.stem(x)))
        for block in self.blocks:
            h = block(h)
        return self.head(jnp.mean(h, axis=(1, 2)))


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@nnx.jit
def apply_update(optimizer, model, grads):
    optimizer.update(model, grads)


@nnx.jit
def predict(model, x):
    return jnp.argmax(model(x), axis=-1)


def accuracy(model, x, y) -> float:
    model.eval()  # BatchNorm uses its running statistics
    correct = int(jnp.sum(predict(model, x) == y))
    model.train()
    return correct / len(y)


def digits(seed: int):
    """scikit-learn's digits as NHWC float32 images in [0, 1], split 80/20."""
    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(
        images, data.target.astype(np.int32), test_size=0.2, random_state=seed, stratify=data.target
    )
    return jnp.asarray(x_train), jnp.asarray(x_test), jnp.asarray(y_train), jnp.asarray(y_test)


def max_difference(a, b) -> float:
    return max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_budget_argument(parser, 0.4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--heuristic", default=jdtr.DEFAULT_HEURISTIC, choices=sorted(jdtr.HEURISTICS))
    parser.add_argument("--compare", action="store_true", help="also train with plain nnx.value_and_grad and compare")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    x_train, x_test, y_train, y_test = digits(args.seed)

    def make():
        model = ResNet(args.blocks, args.channels, nnx.Rngs(args.seed))
        return model, nnx.Optimizer(model, optax.adam(args.lr), wrt=nnx.Param)

    model, optimizer = make()
    grad_fn = jdtr.nnx.value_and_grad(loss_fn, budget=args.budget, heuristic=args.heuristic, return_stats=True)
    if args.compare:
        plain_model, plain_optimizer = make()
        plain_grad_fn = nnx.value_and_grad(loss_fn)

    rng = np.random.default_rng(args.seed)
    meter, progress = BudgetMeter(), Progress(args.steps)
    loss, worst_error = float("nan"), 0.0
    for step in range(1, args.steps + 1):
        index = rng.choice(len(y_train), args.batch, replace=False)
        x, y = x_train[index], y_train[index]
        (loss_value, grads), stats = grad_fn(model, x, y)
        apply_update(optimizer, model, grads)
        if args.compare:
            _, plain_grads = plain_grad_fn(plain_model, x, y)
            worst_error = max(worst_error, max_difference(grads, plain_grads))
            apply_update(plain_optimizer, plain_model, plain_grads)
        loss = float(loss_value)
        meter.add(stats)
        progress(step, loss=loss)

    test_accuracy = accuracy(model, x_test, y_test)
    if args.compare:
        plain_accuracy = accuracy(plain_model, x_test, y_test)
        print(
            f"test accuracy: jdtr.nnx.value_and_grad {test_accuracy:.4f}, nnx.value_and_grad {plain_accuracy:.4f} "
            f"(max |gradient difference| over all steps {worst_error:.2e})"
        )
    print(f"{meter.report()}, final loss {loss:.4f}, test accuracy {test_accuracy:.4f}")
    return test_accuracy


if __name__ == "__main__":
    main()
