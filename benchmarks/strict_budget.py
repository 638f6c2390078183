"""Budgets that fit no compiled plan exactly: what `jdtr.plan` returns or raises.

For each model and budget: the plan's XLA bytes over the budget, or, where
`jdtr.plan` raises `OutOfBudgetError`, its suggested budget over the one
asked for and the plan made at that suggestion; the warnings said; the
seconds taken. Run it on two commits (PYTHONPATH=<checkout>) to compare.

    python benchmarks/strict_budget.py
"""

from __future__ import annotations

import time
import warnings

import jax
import jax.numpy as jnp

import jdtr
from jdtr import models


def tanh_mlp(layers: int = 16, width: int = 256, batch: int = 4096):
    """Issue 22's tanh MLP (its `plan.policy` case)."""
    keys = jax.random.split(jax.random.PRNGKey(0), layers + 1)
    params = [jax.random.normal(k, (width, width)) / 16 for k in keys[:layers]]
    x = jax.random.normal(keys[layers], (batch, width))

    def loss(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x**2)

    return loss, (params, x)


def as_loss(m):
    return m.loss, (m.params, m.batch)


CASES = [
    ("MLP 64x64, batch 1024", lambda: as_loss(models.mlp_chain(layers=64, width=64, batch=1024)), 0.25),
    ("test transformer 4x32", lambda: as_loss(models.transformer(blocks=4, dim=32, heads=2, seq=64, batch=8, vocab=64)), 0.25),
    ("tiny ResNet 1x4", lambda: as_loss(models.resnet(blocks=1, channels=4, image=8, batch=4)), 0.7),
    ("tanh MLP 16x256, batch 4096", tanh_mlp, 0.5),
    ("Flax LSTM in lax.scan, 64x128, batch 32", lambda: as_loss(models.flax_scan_lstm(64, 128, 128, 32)), 0.3),
    ("Flax GroupNorm ResNet 2x8", lambda: as_loss(models.flax_resnet_groupnorm(blocks=2, channels=8, image=8, batch=8)), 0.7),
]


def outcome(loss, args, ratio: float) -> str:
    try:
        plan = jdtr.plan(loss, *args, budget=ratio, autotune=False)
        return f"{plan.compiled_bytes / plan.budget_bytes:.4f} of the budget, gate {plan.gate}"
    except jdtr.OutOfBudgetError as err:
        suggested = err.suggested_budget_bytes
        plan = jdtr.plan(loss, *args, budget=suggested, autotune=False)
        asked = ratio * plan.unconstrained_compiled_bytes
        return (
            f"raises; suggests {suggested / asked:.4f} of the budget; the plan there: "
            f"{plan.compiled_bytes / suggested:.4f} of it, gate {plan.gate}"
        )


def main() -> None:
    print("| model | budget | outcome | warnings | s |")
    print("|---|---|---|---|---|")
    for name, make, ratio in CASES:
        fun, args = make()
        loss = lambda *a, fun=fun: fun(*a)  # noqa: E731 - a function of its own: nothing planned before
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            text = outcome(loss, args, ratio)
        said = ", ".join(sorted({w.category.__name__ for w in seen})) or "-"
        print(f"| {name} | {ratio} | {text} | {said} | {time.perf_counter() - start:.1f} |", flush=True)


if __name__ == "__main__":
    main()
