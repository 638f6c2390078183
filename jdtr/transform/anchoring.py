"""The constants of a backward pass, made only when it runs.

XLA's scheduler may run an instruction as soon as its operands exist, and an
array made of constants alone has none: the zeros a transpose rule scatters
or selects into (`broadcast_in_dim 0.0`: the pullback of a gather, of a
`select_n`, of a `pad`), and the broadcast the lowering makes of a literal
operand (`mul x 0.5`). On the CPU, where XLA's fusions take such broadcasts
as arrays of their own, both were made at the start of the step and held
through the forward pass; a literal's broadcast in a segment's
recomputation was also merged (CSE) with its twin in the forward pass, and
held from one to the other. On a small U-Net (`models.flax_unet`:
`jax.image.resize` up, a gather; GELUs) that was 7 MiB of a 21 MiB step.

`anchored(fn, anchor)` evaluates `fn` (the pullback of a segment under the
gate "anchored", `checkpoint.py`: "inputs", which keeps the saved inputs'
uses from running before the segment's predicate, and these constants too)
with those constants tied to `anchor`, the predicate: always true, but XLA
cannot decide it (it reads a cotangent's bits). An array made of constants
alone that an operation writes into (a scatter's zeros) has its operands,
or where it has none (an `iota`) its value, pass through a select on it,
and so does each literal operand of an array operation. Where each operation runs as it is the values are the same bit
for bit; under `jax.jit` they are the same numbers (XLA folds `x + 0` to `x`
for a constant zero, which differs from IEEE's sum in the sign of a zero,
and not for a tied one).

Measured (docs/benchmarks.md): the U-Net's segments of DTR's plan compile
to 0.69 of `jax.grad`'s bytes, not 0.87 (in conds, ~20x slower: 0.60); a
segment whose pullback scatters into zeros, first in its step, to what it
takes gated by a cond. Elsewhere the tie made steps larger or slower (a
plain CNN's flat plans: an activation more, or 7% slower), so it is a gate
of its own, which the planner measures only where "inputs" is over.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from . import _jax_core

# Operations whose first operand is an array they write into: XLA makes that
# array whole, so an array of constants is tied only where one of these
# writes into it. Zeros that an elementwise operation reads (ReLU's pullback
# selects between the cotangent and zeros) are fused into it as a scalar;
# tied too, the U-Net's DTR plan of 3x2 segments compiled to 0.84 of
# `jax.grad`'s bytes instead of 0.69.
_WRITES_INTO = frozenset({
    "scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter-min", "scatter-max", "dynamic_update_slice",
})

# Calls evaluated in place, so that the constants inside them are tied too
# (`jit`s of library code: `jax.image`, `jnp`'s helpers). A custom
# derivative rule's call is bound as it is: a derivative taken of this
# pullback keeps the rule.
_INLINED = frozenset({"pjit", "jit", "closed_call", "core_call", "eval_jaxpr"})
# The pullback of a checkpointed segment is a `remat` of its recomputation
# and transposes: its body is tied, with the anchor as an input of its own,
# and bound as a `remat` again. Inlined instead (its barrier gone before
# XLA's fusion and scheduling), the smallest plan found for
# `models.flax_unet` compiled to 0.84 of `jax.grad`'s bytes, not 0.69.
_REMATS = frozenset({"remat", "remat2", "checkpoint"})


def anchored(fn: Callable, anchor: Any) -> Callable:
    """`fn` with every constant it makes known only once `anchor` (a traced
    boolean scalar, always true) is."""

    def call(*args):
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        jaxpr, consts = _jax_core.open_jaxpr(closed)
        leaves = jax.tree_util.tree_leaves(args)
        outs, _ = _evaluate(jaxpr, consts, leaves, [True] * len(leaves), anchor)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    return call


def _evaluate(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], varying: Sequence[bool], anchor: Any):
    """`jaxpr`'s outputs on `args`, and whether each depends on an argument
    or the anchor (`varying`, per argument; constants do not)."""
    env: dict = {}

    def read(atom: Any) -> tuple[Any, bool]:
        return (atom.val, False) if _jax_core.is_literal(atom) else env[atom]

    env.update((v, (c, False)) for v, c in zip(jaxpr.constvars, consts))
    env.update((v, (a, d)) for v, a, d in zip(jaxpr.invars, args, varying))
    written = {
        eqn.invars[0] for eqn in jaxpr.eqns
        if eqn.primitive.name in _WRITES_INTO and not _jax_core.is_literal(eqn.invars[0])
    }
    for eqn in jaxpr.eqns:
        read_in = [read(a) for a in eqn.invars]
        operands, flags = [x for x, _ in read_in], [d for _, d in read_in]
        name = eqn.primitive.name
        calls = (name in _INLINED or name in _REMATS) and not _jax_core.has_effects(eqn)
        call = _jax_core.call_body(eqn) if calls else None
        if call is not None and name in _INLINED:
            outs, out_flags = _evaluate(*call, operands, flags, anchor)
        elif call is not None and (rebound := _tied_remat(eqn, call, operands, flags, anchor)) is not None:
            outs, out_flags = rebound
        else:
            outs, made = _bind(eqn, operands, flags, anchor, any(v in written for v in eqn.outvars))
            out_flags = [any(flags) or made] * len(outs)
        env.update((v, (out, d)) for v, out, d in zip(eqn.outvars, outs, out_flags))
    results = [read(a) for a in jaxpr.outvars]
    return [r for r, _ in results], [d for _, d in results]


def _tied_remat(eqn: Any, call: tuple, operands: list, flags: list, anchor: Any):
    """A `remat`'s outputs, its body's constants tied to `anchor`, and their
    flags; None where this JAX's `remat` cannot be bound again that way (it
    is then bound as it is: untied, the same values)."""
    body, consts = call

    def tied(anchor, *xs):
        return _evaluate(body, consts, xs, flags, anchor)[0]

    try:
        closed = jax.make_jaxpr(tied)(anchor, *operands)
        outs = _jax_core.bind_with_body(eqn, closed, [anchor, *operands])
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    return outs, [True] * len(outs)


def _bind(eqn: Any, operands: list, flags: list, anchor: Any, written: bool) -> tuple[list, bool]:
    """Binds `eqn`, its constants tied to `anchor`; and whether it made an
    array of constants (tied: one that is `written` into)."""
    tieable = not _jax_core.has_effects(eqn) and not _jax_core.has_jaxpr_params(eqn)
    made_of_constants = tieable and written and not any(flags) and _expands(eqn)
    if made_of_constants or (tieable and _makes_arrays(eqn)):
        # Every operand of an array of constants; else each literal, which the
        # lowering broadcasts: a constant again. A literal as its own type (a
        # Python scalar would take JAX's default one).
        operands = [
            tie(jnp.asarray(x, a.aval.dtype), anchor) if _jax_core.is_literal(a)
            else tie(x, anchor) if made_of_constants else x
            for a, x in zip(eqn.invars, operands)
        ]
    subfuns, params = _jax_core.bind_params(eqn)
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*subfuns, *operands, **params)
    outs = list(outs) if eqn.primitive.multiple_results else [outs]
    if made_of_constants and not operands:  # (an iota: nothing to tie but its value)
        outs = [tie(x, anchor) for x in outs]
    return outs, made_of_constants


def _makes_arrays(eqn: Any) -> bool:
    return any(getattr(v.aval, "shape", ()) for v in eqn.outvars)


def _expands(eqn: Any) -> bool:
    """Whether `eqn` makes more bytes than it reads (a broadcast, an iota)."""
    read = sum(_jax_core.aval_nbytes(a.aval) for a in eqn.invars)
    return sum(_jax_core.aval_nbytes(v.aval) for v in eqn.outvars) > read


def tie(x: Any, anchor: Any) -> Any:
    """`x`, known only once `anchor` (always true) is: a select between `x`
    and its bitwise complement, which XLA cannot fold (the two differ in
    every bit, where a select between zeros and zeros folds to zeros). A
    PRNG key is tied by its key data."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(tie(jax.random.key_data(x), anchor), impl=jax.random.key_impl(x))
    x = jnp.asarray(x)
    if x.dtype == bool or jnp.issubdtype(x.dtype, jnp.integer):
        other = ~x
    elif jnp.issubdtype(x.dtype, jnp.floating):
        bits = jnp.dtype(f"uint{8 * x.dtype.itemsize}")
        other = lax.bitcast_convert_type(~lax.bitcast_convert_type(x, bits), x.dtype)
    else:
        return x  # (complex numbers, other extended types: left as they are)
    return lax.select(jnp.broadcast_to(anchor, x.shape), x, other)
