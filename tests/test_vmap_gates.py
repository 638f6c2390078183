"""A plan's gates under `vmap`: one predicate for the whole batch.

The gates of a planned step read a predicate from a cotangent
(`checkpoint._undecided`). Under `vmap` of the step (per-example
gradients) that predicate was one per example, and so was the taint added
to a recomputed convolution's kernel: the shared kernel became one per
example, and XLA ran the recomputed convolutions grouped by example
(`feature_group_count`), its slow form on the CPU.
"""

from __future__ import annotations

import jax

import jdtr
from jdtr import models

from test_plan import assert_trees_close, compiled_total


def _grouped_convolutions(fn, *args) -> int:
    """Convolutions of `jax.jit(fn)`'s compiled program grouped by example (`feature_group_count` > 1)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    return sum(
        1 for line in text.splitlines()
        if " convolution(" in line and "feature_group_count=" in line and "feature_group_count=1," not in line
    )


def test_per_example_gradients_recompute_convolutions_with_the_shared_kernel():
    """`vmap` of a plan that recomputes convolutions (gated by the taint)
    compiles no more convolutions grouped by example than `vmap(jax.grad)`
    (the per-example weight gradients), within the budget, with its
    gradients. Before, the plan of one example, mapped, grouped every
    recomputed convolution too, and compiled over the budget, so the
    batched step was planned with a copy of the weights per example
    instead: 66 grouped convolutions against 13, planned in 46 s, not 7."""
    wavenet = models.wavenet(layers=6, channels=16, length=512, examples=4)
    loss, params, xs = wavenet.loss, wavenet.params, wavenet.batch
    plain = jax.vmap(jax.grad(loss), in_axes=(None, 0))
    planned = jax.vmap(jdtr.remat_grad(loss, budget=0.5, autotune=False), in_axes=(None, 0))
    full = compiled_total(plain, params, xs)
    assert compiled_total(planned, params, xs) <= 0.5 * full
    assert _grouped_convolutions(planned, params, xs) <= _grouped_convolutions(plain, params, xs)
    assert_trees_close(jax.jit(planned)(params, xs), plain(params, xs), rtol=1e-5, atol=1e-6)

