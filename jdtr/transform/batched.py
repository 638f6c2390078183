"""`vmap` of `jdtr.remat_grad`: a plan for the batched step, not for one example.

Under `jax.vmap`, `remat_grad` sees one example's shapes; planned for them,
the budget bounded one example's step and the batched step compiled to
several times the budget (issue 22). A `vmap` under way therefore goes
through a batching rule (`jax.custom_batching.custom_vmap`) that plans the
batched step itself: the sum over the batch of the per-example losses,
differentiated with respect to per-example copies of the differentiated
arguments (a shared parameter is broadcast over the batch), so that its
gradient is `vmap(grad)`'s per-example gradients. The budget is bytes of
that batched step; a fraction is one of `vmap(jax.grad)`'s compiled bytes.

Only a `vmap` applied to the call itself is seen (its arguments are batch
tracers); under `vmap(jit(remat_grad(...)))` the call is planned per example.
A batched call cannot be differentiated again in reverse mode (a
`custom_vmap` limit).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from ..budget import parse_budget
from . import _jax_core
from .arguments import Arguments, flatten_arguments
from .compiled import compiled_bytes
from .planning import make_plan


def under_vmap(args: tuple, kwargs: dict) -> bool:
    """Whether a `vmap` applied to this call is under way."""
    return any(_jax_core.is_batched(leaf) for leaf in jax.tree_util.tree_leaves((args, kwargs)))


def batched_call(remat: Any, args: tuple, kwargs: dict):
    """`remat`'s result for a call under `vmap`, planned for the batched step.
    (`remat` is the `remat._RematGrad` called: its options and plan cache.)"""
    _, arguments = flatten_arguments(remat.argnums, args, kwargs, eager=False)
    traced = arguments.traced_leaves(args, kwargs)
    per_example = arguments.bind(remat.fun)
    structure: list = []  # the outputs' pytree, filled when the call is traced

    @custom_vmap
    def call(*xs):  # one example: what `vmap` batches (traced for its shapes; the rule computes)
        outputs = _per_example(remat, arguments, per_example, xs)
        flat, tree = jax.tree_util.tree_flatten(outputs)
        structure[:] = [tree]
        return flat

    @call.def_vmap
    def rule(axis_size, in_batched, *xs):
        outputs = _batched(remat, arguments, per_example, axis_size, in_batched, xs)
        flat, tree = jax.tree_util.tree_flatten(outputs)
        structure[:] = [tree]
        return flat, [True] * len(flat)  # per-example values, aux and gradients

    flat = call(*traced)
    return jax.tree_util.tree_unflatten(structure[0], flat)


def _per_example(remat: Any, arguments: Arguments, per_example: Callable, xs) -> Any:
    """One example's result, as `jax.grad` computes it (never planned: only
    its shapes are asked, the batching rule computes the values)."""
    diff = arguments.traced_argnums
    if remat.value:
        out, grads = jax.value_and_grad(per_example, diff, has_aux=remat.has_aux)(*xs)
        return out, _gradients_as_arguments(remat, arguments, diff, grads)
    out = jax.grad(per_example, diff, has_aux=remat.has_aux)(*xs)
    grads, aux = out if remat.has_aux else (out, None)
    grads = _gradients_as_arguments(remat, arguments, diff, grads)
    return (grads, aux) if remat.has_aux else grads


def _batched(remat: Any, arguments: Arguments, per_example: Callable, axis_size: int, in_batched, xs) -> Any:
    """The batched step's result, by a plan made for it (cached per batch shape)."""
    diff = arguments.traced_argnums
    # Per-example gradients of a shared (unbatched) argument need a copy per example.
    axes = [0 if batched or i in diff else None for i, batched in enumerate(in_batched)]
    ys = [
        x if batched or i not in diff else jnp.broadcast_to(x, (axis_size, *jnp.shape(x)))
        for i, (x, batched) in enumerate(zip(xs, in_batched))
    ]

    def total(*ys):
        out = jax.vmap(per_example, in_axes=axes)(*ys)
        values, aux = out if remat.has_aux else (out, None)
        return jnp.sum(values), (values, aux)

    key = ("vmap", arguments.key, axis_size, tuple(in_batched))
    plan = remat.plans.get(key)
    if plan is None:
        unbatched = [0 if b else None for b in in_batched]
        plain = jax.vmap(jax.grad(per_example, diff, has_aux=remat.has_aux), in_axes=unbatched)
        specs = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in xs]
        budget = parse_budget(remat.budget).resolve(compiled_bytes(plain, specs))
        plan = make_plan(
            total, tuple(ys), {}, budget, tuple(diff), True, remat.heuristic, remat.implementation, remat.autotune
        )
        remat.plans[key] = plan
    (_, (values, aux)), grads = plan.value_and_grad(*ys)
    grads = _gradients_as_arguments(remat, arguments, diff, grads)
    if remat.value:
        return ((values, aux) if remat.has_aux else values), grads
    return (grads, aux) if remat.has_aux else grads


def _gradients_as_arguments(remat: Any, arguments: Arguments, diff, grads) -> Any:
    """Gradients per traced leaf, in the differentiated arguments' structure (as `jax.grad` returns them)."""
    by_leaf = dict(zip(diff, grads))
    count = len(arguments.traced_specs)
    args, _ = arguments.unflatten([by_leaf.get(i) for i in range(count)], statics=False)
    if isinstance(remat.argnums, int):
        return args[remat.argnums]
    return tuple(args[i] for i in remat.argnums)
