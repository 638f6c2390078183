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
Where `vmap(jax.grad)` fits, it runs as it is.

Where a shared argument is differentiated (per-example gradients of shared
parameters), its copies are arguments of the planned step, and XLA holds
them whole in the batched call too: on a ViT (1.6 MiB of parameters, 8
examples) they took 11 MiB, and no plan compiled below 0.54 of
`vmap(jax.grad)`'s bytes. There a plan of one example, mapped by `vmap`
(`BatchedPlan.mapped`), is tried first: it has no copies (0.38 on that
ViT), and it is asked for less until its batched call, compiled, fits.
Where it does not, the batched step is planned with the copies.

Only a `vmap` applied to the call itself is seen (its arguments are batch
tracers); under `vmap(jit(remat_grad(...)))` the call is planned per example.
A batched call cannot be differentiated again in reverse mode (a
`custom_vmap` limit).
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class BatchedPlan:
    """How a call under `vmap` runs: by `plan`, a plan of the batched step,
    or, where `mapped`, a plan of one example's step, mapped by `vmap`."""

    plan: Plan
    mapped: bool = False


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
    unbatched = [0 if b else None for b in in_batched]

    def total(*ys):
        out = jax.vmap(per_example, in_axes=axes)(*ys)
        values, aux = out if remat.has_aux else (out, None)
        return jnp.sum(values), (values, aux)

    def result(out, grads) -> Any:  # what the rule returns: `_per_example`'s outputs, batched
        grads = _gradients_as_arguments(remat, arguments, diff, grads)
        if remat.value:
            return out, grads
        return (grads, out[1]) if remat.has_aux else grads

    def run(batched: BatchedPlan, xs) -> Any:  # the batched call by a plan: what the rule returns, and what is measured
        if batched.mapped:
            return result(*jax.vmap(batched.plan.value_and_grad, in_axes=unbatched)(*xs))
        (_, (values, aux)), grads = batched.plan.value_and_grad(*_copies(xs, in_batched, diff, axis_size))
        return result((values, aux) if remat.has_aux else values, grads)

    def step(plan: Optional[BatchedPlan], xs) -> Any:
        if plan is None:  # `vmap(jax.grad)` itself fits
            return jax.vmap(lambda *x: _per_example(remat, arguments, per_example, x), in_axes=unbatched)(*xs)
        return run(plan, xs)

    key = ("vmap", arguments.key, axis_size, tuple(in_batched))
    if key not in remat.plans:
        remat.plans[key] = _plan_batched(remat, total, run, per_example, diff, axis_size, in_batched, xs)
    plan = remat.plans[key]
    if any(_jax_core.is_tracer(x) for x in xs):  # under jit or another transformation: the caller's trace compiles it
        return step(plan, xs)
    # A `vmap` called on arrays: the batched step compiled, as `remat_grad` runs its step on arrays.
    # Run operation by operation, its memory and speed were not the plan's, and on JAX 0.7 JAX's own
    # eager evaluation of a checkpoint's pullback failed (`add_any` of a literal: a KeyError).
    jitted = remat.steps.get(key)
    if jitted is None:
        jitted = remat.steps[key] = jax.jit(lambda *ys: step(plan, ys))
    return jitted(*xs)


def _copies(xs: Sequence, in_batched: Sequence[bool], diff: Sequence[int], axis_size: int) -> list:
    """The planned step's arguments: `xs`, with each shared differentiated one broadcast over the batch."""
    return [
        x if batched or i not in diff else jnp.broadcast_to(x, (axis_size, *jnp.shape(x)))
        for i, (x, batched) in enumerate(zip(xs, in_batched))
    ]


def _plan_batched(
    remat: Any, total: Callable, run: Callable, per_example: Callable, diff, axis_size: int, in_batched, xs
) -> Optional[BatchedPlan]:
    """The plan of the batched call, or None where `vmap(jax.grad)` compiles
    within the budget (a budget of 1.0 never raises).

    Without shared differentiated arguments, the planned step is the batched
    call itself, measured by the planner. With them, a plan of one example,
    mapped, is tried first, then the batched step with the copies. The
    copies are the planned step's arguments, but in the batched call they
    are made inside it, where XLA need not hold them whole (per-example
    gradients of 16 MiB: the copies took 3 MiB more than `vmap(jax.grad)`,
    not 16), so that planner is given the budget plus their bytes. Either
    way, the batched call itself is compiled to check it, as it runs (`run`:
    the outputs it returns, not a plan's step with all of its outputs: on
    JAX 0.11 a call at a budget suggested from that measure compiled to 6%
    more than it), and a plan over is followed by one asked for less, in
    proportion to its excess, `BATCHED_ATTEMPTS` times at most."""
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

    def copied(budget: int, autotune: Optional[bool] = False) -> BatchedPlan:
        return BatchedPlan(make_plan(total, ys, {}, budget, tuple(diff), True, remat.heuristic, remat.implementation,
                                     autotune))

    if not copies:  # the planned step is the batched call, measured by the planner itself
        return copied(target, remat.autotune)

    def batched_bytes(plan: BatchedPlan) -> int:
        return compiled_bytes(lambda *x: run(plan, x), specs)

    # One example's step, mapped: its budget is asked of one example's plan,
    # and only what is not arguments and outputs scales with the batch.
    one = [jax.ShapeDtypeStruct(s.shape[1:], s.dtype) if b else s for s, b in zip(specs, in_batched)]
    alone, alone_fixed = compiled_sizes(jax.grad(per_example, diff, has_aux=remat.has_aux), one)

    def mapped(budget: int, autotune: Optional[bool] = False) -> BatchedPlan:
        # (never autotuned below: one example's step times nothing of the batch's)
        return BatchedPlan(make_plan(per_example, tuple(one), {}, budget, tuple(diff), remat.has_aux, remat.heuristic,
                                     remat.implementation, autotune), mapped=True)

    found: list[int] = []  # the batched calls' bytes, measured, of both kinds
    error: Optional[OutOfBudgetError] = None
    fraction = (target - fixed) / (unconstrained - fixed)
    for plan_at, budget, scaled_from, autotune in (
        (mapped, alone_fixed + fraction * max(alone - alone_fixed, 0), alone_fixed, False),
        (copied, target + copies, 0, remat.autotune),
    ):
        for _ in range(BATCHED_ATTEMPTS):
            floor = False  # whether this is the smallest plan the planner found
            try:
                plan = plan_at(int(budget), autotune)
            except OutOfBudgetError as raised:
                if raised.suggested_budget_bytes is None:
                    error = raised
                    break
                plan, floor = plan_at(raised.suggested_budget_bytes), True
            found.append(batched_bytes(plan))
            if found[-1] <= target:
                return plan
            if floor:
                break
            # Asked for less, in proportion to the batched call's excess
            # (over what it needs beside its arguments and outputs, where
            # that is what the budget asked of one example scales).
            share = (target - fixed) / (found[-1] - fixed) if scaled_from else target / found[-1]
            budget = scaled_from + (budget - scaled_from) * share * BATCHED_MARGIN
            if budget <= scaled_from:
                break
    if not found:
        raise error
    smallest = min(found)
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
