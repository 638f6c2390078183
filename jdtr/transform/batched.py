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
Where `vmap(jax.grad)` fits, it runs as it is. (Planning one example and
mapping its plan was measured too: its segments compiled under `vmap` to
1.4-1.7x `vmap(jax.grad)`'s bytes.)

Only a `vmap` applied to the call itself is seen (its arguments are batch
tracers); under `vmap(jit(remat_grad(...)))` the call is planned per example.
A batched call cannot be differentiated again in reverse mode (a
`custom_vmap` limit).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from ..budget import parse_budget
from ..runtime import OutOfBudgetError, format_bytes
from . import _jax_core
from .arguments import Arguments, flatten_arguments
from .checkpoint_plan import Plan
from .compiled import compiled_bytes, compiled_sizes
from .plan_search import arguments_exceed
from .planning import make_plan

# Where shared arguments are copied per example: how many plans are
# compiled as the batched call before saying that none fits, and how much
# less than the proportion measured each next one is asked for (so that a
# plan just over is not found again).
BATCHED_ATTEMPTS = 4
BATCHED_MARGIN = 0.98


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

    def total(*ys):
        out = jax.vmap(per_example, in_axes=axes)(*ys)
        values, aux = out if remat.has_aux else (out, None)
        return jnp.sum(values), (values, aux)

    def run(plan: Plan, xs) -> Any:  # the batched call by `plan`: what the rule returns, and what is measured
        (_, (values, aux)), grads = plan.value_and_grad(*_copies(xs, in_batched, diff, axis_size))
        grads = _gradients_as_arguments(remat, arguments, diff, grads)
        if remat.value:
            return ((values, aux) if remat.has_aux else values), grads
        return (grads, aux) if remat.has_aux else grads

    key = ("vmap", arguments.key, axis_size, tuple(in_batched))
    if key not in remat.plans:
        remat.plans[key] = _plan_batched(remat, total, run, per_example, diff, axis_size, in_batched, xs)
    plan = remat.plans[key]
    if plan is None:  # `vmap(jax.grad)` itself fits
        unbatched = [0 if b else None for b in in_batched]
        return jax.vmap(lambda *x: _per_example(remat, arguments, per_example, x), in_axes=unbatched)(*xs)
    return run(plan, xs)


def _copies(xs: Sequence, in_batched: Sequence[bool], diff: Sequence[int], axis_size: int) -> list:
    """The planned step's arguments: `xs`, with each shared differentiated one broadcast over the batch."""
    return [
        x if batched or i not in diff else jnp.broadcast_to(x, (axis_size, *jnp.shape(x)))
        for i, (x, batched) in enumerate(zip(xs, in_batched))
    ]


def _plan_batched(
    remat: Any, total: Callable, run: Callable, per_example: Callable, diff, axis_size: int, in_batched, xs
) -> Optional[Plan]:
    """The plan of the batched step `total`, or None where `vmap(jax.grad)`
    compiles within the budget (a budget of 1.0 never raises).

    A shared argument's per-example copies are the planned step's arguments,
    but in the batched call they are made inside it, where XLA need not hold
    them whole (per-example gradients of 16 MiB: the copies took 3 MiB more
    than `vmap(jax.grad)`, not 16). So where there are copies, the planner
    is given the budget plus their bytes, and the batched call itself is
    compiled to check it: a plan over is followed by one asked for less, in
    proportion to its excess. What is compiled is the call as it runs
    (`run`: the outputs it returns), not the plan's step with all of its
    outputs: on JAX 0.11 a call at the budget suggested from that measure
    compiled to 6% more than it."""
    unbatched = [0 if b else None for b in in_batched]
    plain = jax.vmap(jax.grad(per_example, diff, has_aux=remat.has_aux), in_axes=unbatched)
    specs = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in xs]
    unconstrained, fixed = compiled_sizes(plain, specs)
    target = parse_budget(remat.budget).resolve(unconstrained)
    if unconstrained <= target:
        return None
    if fixed >= target:
        raise arguments_exceed(fixed, target, unconstrained)
    ys = tuple(_copies(xs, in_batched, diff, axis_size))
    copies = sum((axis_size - 1) * _jax_core.aval_nbytes(specs[i]) for i in diff if not in_batched[i])

    def plan_at(budget: int, autotune: Optional[bool]) -> Plan:
        return make_plan(total, ys, {}, budget, tuple(diff), True, remat.heuristic, remat.implementation, autotune)

    if not copies:  # the planned step is the batched call, measured by the planner itself
        return plan_at(target, remat.autotune)

    def batched_bytes(plan: Plan) -> int:
        return compiled_bytes(lambda *x: run(plan, x), specs)

    budget, smallest = target + copies, None
    for _ in range(BATCHED_ATTEMPTS):
        floor = False  # whether this is the smallest plan the planner found
        try:
            plan = plan_at(int(budget), remat.autotune)
        except OutOfBudgetError as error:
            if error.suggested_budget_bytes is None:
                raise
            plan, floor = plan_at(error.suggested_budget_bytes, False), True
        measured = batched_bytes(plan)
        smallest = measured if smallest is None else min(smallest, measured)
        if measured <= target:
            return plan
        if floor:
            break
        budget = budget * target / measured * BATCHED_MARGIN
    error = OutOfBudgetError(
        needed_bytes=smallest, free_bytes=target - fixed, pinned_bytes=fixed, locked_bytes=0, budget_bytes=target,
        op_name="the batched step",
    )
    error.args = (
        f"under vmap, the smallest plan found compiles the batched step to {format_bytes(smallest)} ({smallest} "
        f"bytes), more than the budget of {format_bytes(target)} ({target} bytes); `vmap(jax.grad)` compiles to "
        f"{format_bytes(unconstrained)}, {format_bytes(fixed)} of it arguments and outputs.",
    )
    raise error.suggest(smallest, "compiling the batched step of that plan (XLA's bytes)")


def _gradients_as_arguments(remat: Any, arguments: Arguments, diff, grads) -> Any:
    """Gradients per traced leaf, in the differentiated arguments' structure (as `jax.grad` returns them)."""
    by_leaf = dict(zip(diff, grads))
    count = len(arguments.traced_specs)
    args, _ = arguments.unflatten([by_leaf.get(i) for i in range(count)], statics=False)
    if isinstance(remat.argnums, int):
        return args[remat.argnums]
    return tuple(args[i] for i in remat.argnums)
