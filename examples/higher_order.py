"""Differentiate through an unrolled inner optimisation (grad of grad) under a budget.

The paper's Unrolled GAN differentiates the generator's loss through K
unrolled discriminator updates. The same pattern here, in its plainest
form (MAML-style meta-learning, Finn et al., 2017): the outer parameters
are a small MLP's initial weights; for each task (a sine wave of random
amplitude and phase) the inner loop takes `--inner-steps` SGD steps on the
task's support points with `jax.grad`, and the outer loss is the adapted
model's error on the task's query points. `jdtr.value_and_grad` of the
outer loss therefore differentiates through K gradient computations: its
backward pass runs second-order derivatives, all under `--budget`. The
first outer gradient is checked against `jax.grad`.

    python examples/higher_order.py --budget 0.5 --steps 60
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax
from _common import BudgetMeter, Progress, add_budget_argument  # examples/_common.py

import jdtr


def init_mlp(key, width: int, depth: int):
    sizes = [1] + [width] * depth + [1]
    keys = jax.random.split(key, len(sizes) - 1)
    return [
        {"w": jax.random.normal(k, (m, n)) * jnp.sqrt(2.0 / m), "b": jnp.zeros(n)} for k, m, n in zip(keys, sizes[:-1], sizes[1:])
    ]


def mlp(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def mse(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def adapt(params, x, y, inner_steps: int, inner_lr: float):
    """K unrolled SGD steps on one task: each step's gradient is itself differentiated by the outer loss."""
    for _ in range(inner_steps):
        grads = jax.grad(mse)(params, x, y)
        params = jax.tree_util.tree_map(lambda p, g: p - inner_lr * g, params, grads)
    return params


def outer_loss(params, tasks, inner_steps: int, inner_lr: float):
    """The adapted models' query error, averaged over a batch of tasks.

    The tasks are adapted one after another (a Python loop, not `vmap`), so
    each task's inner loop is its own stretch of the program that DTR can
    evict and recompute separately.
    """
    x_support, y_support, x_query, y_query = tasks
    total = 0.0
    for i in range(x_support.shape[0]):
        adapted = adapt(params, x_support[i], y_support[i], inner_steps, inner_lr)
        total = total + mse(adapted, x_query[i], y_query[i])
    return total / x_support.shape[0]


def sample_tasks(key, tasks: int, points: int):
    """Sine waves A sin(x + phase), A in [0.1, 5], phase in [0, pi], x in [-5, 5]: support and query points."""
    k_amp, k_phase, k_support, k_query = jax.random.split(key, 4)
    amplitude = jax.random.uniform(k_amp, (tasks, 1, 1), minval=0.1, maxval=5.0)
    phase = jax.random.uniform(k_phase, (tasks, 1, 1), maxval=jnp.pi)
    x_support = jax.random.uniform(k_support, (tasks, points, 1), minval=-5.0, maxval=5.0)
    x_query = jax.random.uniform(k_query, (tasks, points, 1), minval=-5.0, maxval=5.0)
    return x_support, amplitude * jnp.sin(x_support + phase), x_query, amplitude * jnp.sin(x_query + phase)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_budget_argument(parser, 0.5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--inner-steps", type=int, default=5)
    parser.add_argument("--inner-lr", type=float, default=0.01)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per outer step")
    parser.add_argument("--points", type=int, default=100, help="support (and query) points per task")
    parser.add_argument("--width", type=int, default=40)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--heuristic", default=jdtr.DEFAULT_HEURISTIC, choices=sorted(jdtr.HEURISTICS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    key = jax.random.PRNGKey(args.seed)
    key, k_init = jax.random.split(key)
    params = init_mlp(k_init, args.width, args.depth)
    optimizer = optax.adam(args.lr)
    opt_state = optimizer.init(params)

    @jax.jit
    def update(params, opt_state, grads):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    key, k_held_out = jax.random.split(key)
    held_out = sample_tasks(k_held_out, 16, args.points)  # never trained on
    evaluate = jax.jit(outer_loss, static_argnums=(2, 3))
    held_out_before = float(evaluate(params, held_out, args.inner_steps, args.inner_lr))

    step_fn = jdtr.value_and_grad(outer_loss, budget=args.budget, heuristic=args.heuristic, return_stats=True)
    meter, progress = BudgetMeter(), Progress(args.steps)
    loss, worst_error = float("nan"), None
    for step in range(1, args.steps + 1):
        key, k = jax.random.split(key)
        tasks = sample_tasks(k, args.tasks, args.points)
        (loss_value, grads), stats = step_fn(params, tasks, args.inner_steps, args.inner_lr)
        if step == 1:  # the check against jax.grad
            reference = jax.grad(outer_loss)(params, tasks, args.inner_steps, args.inner_lr)
            worst_error = max(
                float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(reference))
            )
        params, opt_state = update(params, opt_state, grads)
        loss = float(loss_value)
        meter.add(stats)
        progress(step, loss=loss)

    held_out_after = float(evaluate(params, held_out, args.inner_steps, args.inner_lr))
    print(
        f"{meter.report()}, {args.inner_steps} unrolled inner steps, final outer loss {loss:.4f}, "
        f"held-out tasks {held_out_before:.3f} -> {held_out_after:.3f}, max |jdtr - jax.grad| = {worst_error:.2e}"
    )
    return loss


if __name__ == "__main__":
    main()
