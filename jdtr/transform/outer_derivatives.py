"""A plan's step differentiated again: exact under an outer `jax.grad`, `jvp` or `linearize`.

`Plan.grad` runs the forward program through checkpoint segments, and a
value that carries no derivative of the differentiated arguments enters a
segment through `stop_gradient` (`checkpoint.tangent_carriers`): a
protected segment's `custom_vjp` would give it a tangent, and a
`while_loop` on it would then be transposed. A `stop_gradient` stops every
level of differentiation, though. An outer one taken through the step with
respect to a leaf the step does not differentiate got zero, where
`jax.grad` gives the derivative: a gradient penalty's or an
input-gradient regularizer's parameters (`remat_grad(critic, argnums=1)`
inside a loss differentiated by the parameters), the inputs of a
double-backprop loss.

So the step is a `jax.custom_jvp` of its traced leaves. Its rule is the
planned step's own JVP where the outer level differentiates only leaves
the step differentiates (their derivatives run through the segments, as
`jax.grad`'s do: a second-order method keeps the plan's memory), and
otherwise the JVP of `jax.grad` of the traced function, without the plan.
With `has_aux`, always the latter: an aux value the loss does not read
leaves the segments through `stop_gradient` too. Without an outer level the
step is the plan's, unchanged. (A third level, differentiating a
second-order step taken through the segments with respect to a leaf
neither of the first two differentiates, meets their `stop_gradient`s
again: not handled.)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
from jax.custom_derivatives import SymbolicZero, zero_from_primal

from .arguments import Arguments


def exact_under_outer(
    planned: Callable, reference: Callable, arguments: Arguments, has_aux: bool
) -> Callable:
    """`planned(*args, **kwargs)` (a gradient step of a call with the
    structure `arguments`) as a function whose derivatives are exact:
    those of `reference` (the same step without the plan) wherever an outer
    level differentiates a leaf the step does not (any leaf, with
    `has_aux`)."""
    differentiated = set(arguments.traced_argnums)

    def on_leaves(step: Callable) -> Callable:
        def flat(*leaves):
            args, kwargs = arguments.unflatten(leaves)
            return step(*args, **kwargs)

        return flat

    flat_planned, flat_reference = on_leaves(planned), on_leaves(reference)

    @jax.custom_jvp
    def step(*leaves):
        return flat_planned(*leaves)

    def rule(primals: Sequence[Any], tangents: Sequence[Any]):
        zero = [isinstance(t, SymbolicZero) for t in tangents]
        own = not has_aux and all(z for i, z in enumerate(zero) if i not in differentiated)
        tangents = [zero_from_primal(p) if z else t for p, t, z in zip(primals, tangents, zero)]
        return jax.jvp(flat_planned if own else flat_reference, tuple(primals), tuple(tangents))

    step.defjvp(rule, symbolic_zeros=True)

    def call(*args, **kwargs):
        return step(*arguments.traced_leaves(args, kwargs))

    return call
