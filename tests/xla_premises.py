"""What the XLA under test does that some tests' premises rest on: JAX
0.10's and 0.11's differ (docs/robustness.md, "Other JAX versions")."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _compiled_bytes(fn, *args, **jit_options) -> int:
    a = jax.jit(fn, **jit_options).lower(*args).compile().memory_analysis()
    return a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes


@functools.lru_cache(maxsize=None)
def xla_strips_checkpoint_barriers() -> bool:
    """Whether this XLA merges `jax.checkpoint`'s recomputation away (its
    `cse_barrier_expander` pass; JAX 0.10's XLA does on the CPU, 0.11's
    keeps the saving): the premise of protected segments and taints."""
    w, x = jnp.ones((64, 64)) / 8, jnp.ones((1024, 64))

    def loss(w, x):
        for _ in range(8):
            x = jax.checkpoint(lambda h: jnp.tanh(h @ w), policy=jax.checkpoint_policies.nothing_saveable)(x)
        return jnp.sum(x**2)

    kept = _compiled_bytes(jax.grad(loss), w, x, compiler_options={"xla_disable_hlo_passes": "cse_barrier_expander"})
    return _compiled_bytes(jax.grad(loss), w, x) > kept
