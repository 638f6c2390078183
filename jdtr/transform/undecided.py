"""A predicate that is always true, which XLA cannot decide when it compiles.

Read from a value's bits (`bits | 1 != 0`), it keeps what depends on it
where it was put: a `lax.cond` on it stays a conditional, whose branches
XLA neither merges with the rest of the program (common subexpressions)
nor fuses into their consumers. The protected checkpoints gate their
recomputation on it (`checkpoint.py`), and max pooling's selection is made
under it (`pooling.py`).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap

from . import _jax_core


def an_element(arrays: Sequence[Any]) -> Any:
    """A scalar read from the smallest of `arrays`: its first element, or,
    where its type says it is sharded (a mesh's `Explicit` axes, which may
    not be sliced across shards), its maximum (a reduction to a scalar)."""
    smallest = min(arrays, key=lambda a: a.size)
    if _jax_core.sharded_type(smallest):
        return jnp.max(smallest)
    return jnp.ravel(smallest)[0]


def undecided(element: Any) -> Any:
    """A predicate read from a scalar's bits, or-ed with 1: always true;
    XLA cannot tell. Under `vmap` (a value per example), one for the
    whole batch (`_one_for_the_batch`)."""
    predicate = (lax.bitcast_convert_type(element.astype(jnp.float32), jnp.int32) | 1) != 0
    return _one_for_the_batch(predicate) if _jax_core.is_batched(predicate) else predicate


# Under `vmap` of a planned step (per-example gradients), each example's
# cotangent made a predicate per example, and so a taint per example: added
# to a convolution's kernel, it made the shared kernel one per example, and
# XLA ran the recomputed convolutions grouped by example, its slow form on
# the CPU (a WaveNet's mapped step: 1.2-1.33x `vmap(jax.grad)`'s, with
# 28-35 grouped convolutions against its 17; one predicate for the batch:
# 17, and 0.94-1.07x). A cond on a predicate per example also runs as a
# select of both branches. Every example's predicate is true, so the
# batch's is too.
@custom_vmap
def _one_for_the_batch(predicate: Any) -> Any:
    return predicate


@_one_for_the_batch.def_vmap
def _one_for_the_batch_rule(axis_size: int, in_batched: Sequence[bool], predicate: Any) -> tuple[Any, bool]:
    return (jnp.all(predicate) if in_batched[0] else predicate), False
