"""A scan's body cut into rematerialized pieces: a plan that cuts inside one iteration.

Every other kept-scan strategy (`scans.py`) recomputes, or keeps, one
iteration whole: the backward pass of the "carry" strategy holds all of one
iteration's residuals at once. On a transformer whose blocks are in a scan,
that is a whole block's working set (its attention probabilities, its MLP's
activations), many times the layer's carry, and it is the floor of every
such strategy (issue 22: a 12-block scan GPT raised below 0.16 of
`jax.grad`'s bytes). Here the body runs as consecutive pieces, each
rematerialized (saving nothing but its inputs): each iteration keeps the
pieces' inputs, and its backward pass recomputes and pulls back one piece
at a time, so it holds one piece's residuals.

Each piece is rematerialized by a `jax.custom_vjp` of its own rather than
`jax.checkpoint`, for two orders XLA would otherwise lose:
* Its backward rule recomputes the piece only once the cotangent of its
  outputs exists (`_after`: the recomputation's inputs depend on it). Under
  `jax.checkpoint` every piece's recomputation depends on saved values
  alone, and XLA's scheduler on the CPU (which strips the barriers that
  would order it) runs them all first: one iteration's residuals held at
  once again, plus the pieces' inputs, more than the "carry" strategy.
* The iteration as a whole is not checkpointed (the "carry" strategy's):
  its backward pass would recompute the iteration and then each piece in
  the same loop body, which CSE merges. Saved per iteration, the pieces'
  inputs are made by the forward loop and recomputed from in the backward
  loop, which CSE cannot merge.
(A `custom_vjp` has no forward-mode rule: the strategy is for reverse-mode
steps, which is what plans make.) Nested levels of segments of iterations (`scans._nested_scan`) keep the
inputs of one segment's iterations at a time.

Where the cuts go (`cut_body`): the body is flattened (its calls and
checkpoints inlined; a custom derivative's call stays one step, its rule
kept), and cut into k pieces for the k that minimizes the bytes an
iteration's backward pass holds in the model of `estimate`: the inputs of
every piece for every iteration whose inputs are kept together, plus the
largest piece's own values. Each cut is the position of least crossing
bytes near an even share of the body's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

from . import _jax_core

# The most pieces one body is cut into: past a few, the pieces' inputs kept
# per iteration outgrow what a smaller piece saves.
MAX_PIECES = 8

# Calls whose body is cut through like the caller's own equations: a user's
# `jax.checkpoint` (`nnx.remat` on a block) is subsumed by the pieces'.
# A call with a custom derivative stays one step: inlined, its rule is lost.
_INLINED = frozenset(_jax_core.CALL_PRIMITIVES) - _jax_core.CUSTOM_DERIVATIVES


@dataclass(frozen=True)
class Step:
    """One equation of a flattened body, its operands and results by key
    (ints; an operand may be a literal)."""

    eqn: Any
    reads: tuple[Any, ...]
    writes: tuple[int, ...]


@dataclass(frozen=True)
class Piece:
    """A run of steps rematerialized together: what it reads from before
    it (saved per iteration) and what it writes for after it."""

    start: int
    stop: int
    reads: tuple[int, ...]
    writes: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class FlatBody:
    """A scan body as one list of steps, every call inlined."""

    steps: tuple[Step, ...]
    inputs: tuple[int, ...]  # the body's invars: consts, carry, one row of each xs
    outputs: tuple[Any, ...]  # keys or literals
    constants: dict  # key -> the closed jaxprs' constants
    avals: dict  # key -> abstract value
    num_consts: int  # leading inputs that are loop invariants
    num_carry: int  # then the carry; the rest are rows of the scanned-over inputs

    def nbytes(self, key: Any) -> int:
        return _jax_core.aval_nbytes(self.avals[key]) if key in self.avals else 0

    def free(self) -> set:
        """Keys that cost nothing to keep per iteration: loop invariants
        (the scan's constants, the body's own) and rows of the scanned-over
        inputs (JAX's scan forwards a residual that is an input's row
        instead of stacking a copy of it)."""
        split = self.num_consts + self.num_carry
        return set(self.inputs[: self.num_consts]) | set(self.inputs[split:]) | set(self.constants)


@dataclass(frozen=True, eq=False)
class CutBody:
    """A body and the pieces it runs in (two or more)."""

    body: FlatBody
    pieces: tuple[Piece, ...]

    def function(self):
        """The body as a function of its inputs returning its outputs, each
        piece rematerialized in its backward pass (`_rematerialized`)."""
        body, pieces = self.body, self.pieces
        free = body.free()
        checkpointed = [
            _rematerialized(_piece_function(body, piece), tuple(k not in free for k in piece.reads)) for piece in pieces
        ]

        def run(*args):
            env = dict(zip(body.inputs, args))
            for piece, fn in zip(pieces, checkpointed):
                env.update(zip(piece.writes, fn(*(env[k] for k in piece.reads))))
            return [_read(env, a) for a in body.outputs]

        return run

    def each_piece(self) -> list[tuple[Any, list]]:
        """Each piece as (function, the specs of its inputs), unwrapped: to
        read its residuals from `jax.vjp` on shapes."""
        return [
            (_piece_function(self.body, piece), [_spec(self.body.avals[k]) for k in piece.reads])
            for piece in self.pieces
        ]

    def saved_inputs(self) -> list[tuple[Any, str]]:
        """(abstract value, what it is) of each piece's inputs saved per
        iteration: the pieces after the first, loop invariants left out."""
        free = self.body.free()
        found = []
        for i, piece in enumerate(self.pieces[1:], start=2):
            found += [(self.body.avals[k], f"input of piece {i}") for k in piece.reads if k not in free]
        return found


def flatten(closed: Any, num_consts: int, num_carry: int) -> Optional[FlatBody]:
    """`closed` (a scan body) as one list of steps, or None where it has
    effects (a piece would run them again)."""
    steps: list[Step] = []
    avals: dict = {}
    constants: dict = {}
    counter = iter(range(1 << 62))

    def fresh(var: Any) -> int:
        key = next(counter)
        avals[key] = var.aval
        return key

    def walk(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> Optional[list]:
        env: dict = {}
        for var, value in zip(jaxpr.constvars, consts):
            env[var] = key = fresh(var)
            constants[key] = value
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            if _jax_core.has_effects(eqn):
                return None
            reads = [a if _jax_core.is_literal(a) else env[a] for a in eqn.invars]
            call = _jax_core.call_body(eqn) if eqn.primitive.name in _INLINED else None
            if call is not None:
                outs = walk(*call, reads)
                if outs is None:
                    return None
            else:
                outs = [fresh(v) for v in eqn.outvars]
                steps.append(Step(eqn, tuple(reads), tuple(outs)))
            env.update(zip(eqn.outvars, outs))
        return [a if _jax_core.is_literal(a) else env[a] for a in jaxpr.outvars]

    jaxpr, consts = _jax_core.open_jaxpr(closed)
    inputs = [fresh(v) for v in jaxpr.invars]
    outputs = walk(jaxpr, consts, inputs)
    if outputs is None:
        return None
    return FlatBody(tuple(steps), tuple(inputs), tuple(outputs), constants, avals, num_consts, num_carry)


def cut_body(closed: Any, num_consts: int, num_carry: int, held_iterations: int) -> Optional[CutBody]:
    """`closed` cut into the pieces whose estimated backward pass holds
    least (`estimate`) when the inputs of `held_iterations` iterations are
    kept at once; None where no cut helps or the body has effects."""
    body = flatten(closed, num_consts, num_carry)
    if body is None or len(body.steps) < 2:
        return None
    crossing, made = _crossings(body), [sum(body.nbytes(k) for k in s.writes) for s in body.steps]
    best = (estimate(made, crossing, (), held_iterations), ())
    for k in range(2, min(MAX_PIECES, len(body.steps)) + 1):
        cuts = _even_cuts(made, crossing, k)
        if cuts:
            best = min(best, (estimate(made, crossing, cuts, held_iterations), cuts))
    return CutBody(body, _pieces(body, best[1])) if best[1] else None


def estimate(made: Sequence[int], crossing: Sequence[int], cuts: Sequence[int], held_iterations: int) -> int:
    """Bytes one iteration's backward pass holds, cut at `cuts` (positions
    of steps that start a piece): the values crossing each cut, for every
    iteration held, and the largest piece's values (its residuals, at most)."""
    bounds = [0, *cuts, len(made)]
    largest = max(sum(made[a:b]) for a, b in zip(bounds, bounds[1:]))
    return held_iterations * sum(crossing[c] for c in cuts) + largest


def _crossings(body: FlatBody) -> list[int]:
    """Per position p, bytes of the values made before step p (or the
    body's inputs other than its loop invariants) that step p or a later
    one reads, or the body returns: what a cut before p saves per iteration
    (less what costs nothing to keep, `FlatBody.free`)."""
    n = len(body.steps)
    last = {}  # key -> last step reading it (n: the body returns it)
    for i, step in enumerate(body.steps):
        for k in step.reads:
            if not _jax_core.is_literal(k):
                last[k] = i
    for k in body.outputs:
        if not _jax_core.is_literal(k):
            last[k] = n
    free = body.free()
    delta = [0] * (n + 2)  # live bytes by a sweep: +at definition, -after the last read
    for k in body.inputs:
        if k in last and k not in free:
            delta[0] += body.nbytes(k)
            delta[last[k] + 1] -= body.nbytes(k)
    for i, step in enumerate(body.steps):
        for k in step.writes:
            if k in last:
                delta[i + 1] += body.nbytes(k)
                delta[last[k] + 1] -= body.nbytes(k)
    crossing, live = [], 0
    for p in range(n):
        live += delta[p]
        crossing.append(live)
    return crossing


def _even_cuts(made: Sequence[int], crossing: Sequence[int], k: int) -> tuple[int, ...]:
    """k - 1 cuts, each where the least bytes cross within half a share of
    the j-th even share of the body's values (the nearer of ties)."""
    total = sum(made)
    if total == 0:
        return ()
    before, cumulative = [], 0
    for m in made:
        before.append(cumulative)
        cumulative += m
    share, cuts, floor = total / k, [], 1
    for j in range(1, k):
        aim = j * share
        window = [p for p in range(floor, len(made)) if abs(before[p] - aim) <= share / 2]
        if not window:
            return ()
        p = min(window, key=lambda p: (crossing[p], abs(before[p] - aim)))
        cuts.append(p)
        floor = p + 1
    return tuple(cuts)


def _pieces(body: FlatBody, cuts: Sequence[int]) -> tuple[Piece, ...]:
    bounds = [0, *cuts, len(body.steps)]
    later = {k for k in body.outputs if not _jax_core.is_literal(k)}
    pieces_rev = []
    for a, b in reversed(list(zip(bounds, bounds[1:]))):
        written = {k for s in body.steps[a:b] for k in s.writes}
        reads = {k for s in body.steps[a:b] for k in s.reads if not _jax_core.is_literal(k)} - written
        reads -= set(body.constants)  # closed over by the piece
        pieces_rev.append(Piece(a, b, tuple(sorted(reads)), tuple(sorted(written & later))))
        later = (later - written) | reads
    return tuple(reversed(pieces_rev))


def _piece_function(body: FlatBody, piece: Piece):
    steps = body.steps[piece.start : piece.stop]

    def run(*args):
        env = {**body.constants, **dict(zip(piece.reads, args))}
        for step in steps:
            env.update(zip(step.writes, _jax_core.bind_equation(step.eqn, [_read(env, a) for a in step.reads])))
        return [env[k] for k in piece.writes]

    return run


def _rematerialized(fn, ordered: Sequence[bool]):
    """`fn` saving only its inputs, its backward rule recomputing it from
    them once its outputs' cotangents exist (`ordered`: which inputs to make
    wait for them; the rest, loop invariants and scanned-over rows, are
    read by nothing the order is for)."""

    @jax.custom_vjp
    def piece(*args):
        return fn(*args)

    def forward(*args):
        return fn(*args), args

    def backward(args, cotangents):
        args = _after(cotangents, args, ordered)
        _, pullback = jax.vjp(fn, *args)
        return pullback(cotangents)

    piece.defvjp(forward, backward)
    return piece


def _after(cotangents: Sequence[Any], args: Sequence[Any], ordered: Sequence[bool]) -> tuple:
    """`args`, unchanged, computed from one element of a floating cotangent
    too, so that XLA cannot schedule what reads them before it. (A select on
    a predicate that is always false but that XLA's simplifier does not fold:
    exact, for any value, NaN included; an optimization barrier would do on
    the GPU, but the CPU's XLA strips those.)"""
    floating = [g for g in cotangents if jnp.issubdtype(g.dtype, jnp.inexact) and g.size]
    if not floating:
        return tuple(args)
    first = jnp.ravel(floating[0])[0]
    never = jnp.isnan(first) & ~jnp.isnan(first)
    return tuple(
        jnp.where(never, jnp.zeros_like(a), a) if wait and _numeric(a) else a for a, wait in zip(args, ordered)
    )


def _numeric(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and (jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_))


def _spec(aval: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def _read(env: dict, atom: Any) -> Any:
    return atom.val if _jax_core.is_literal(atom) else env[atom]
