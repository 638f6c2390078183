"""A scan of checkpointed segments whose backward pass holds one set of cotangents.

The nested strategies (`scans.ScanStrategy` with `levels` > 1) keep a scan's
carry only where a segment of about sqrt(T) iterations starts, and replay a
segment forward when the backward pass reaches it (Chen et al.'s sqrt(T)).
Written as `jax.checkpoint` on a scan of scans, JAX transposes each inner
scan on its own: it accumulates the cotangents of the scan's constants (the
weights of an RNN) from zeros per segment and adds them to the outer loop's
after, so a second copy of every weight-sized cotangent lives while a
segment's backward pass runs. On a 64-step LSTM (hidden 128) at 0.3 of its
compiled bytes that copy was 512 KiB of 4.85 MiB, and the step did not fit.

Here the backward pass is written out (`jax.custom_vjp`): one reverse loop
over segments, each replaying its iterations to recover their carries and
then pulling the cotangents back one iteration at a time, with the
constants' cotangents threaded through both loops as a single accumulator.
It computes what `jax.checkpoint` on the segments computes (the same
replays, the same order); only the accumulator is shared.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def segmented_scan(
    body: Callable,
    consts: list,
    carry: list,
    xs: list,
    ys_avals: Sequence[Any],
    length: int,
    inner: Callable[[int, int], int],
    levels: int,
):
    """`lax.scan` of `body(*consts, *carry, *x) -> [*carry, *y]` over `xs`
    (forward; one iteration's `y`s have types `ys_avals`), in `levels` nested
    levels of segments of `inner(length, levels)` iterations each; returns
    (carry, ys).

    Its gradient keeps the carries at the outer segments' starts, replays
    one segment at a time (itself in segments at the next level down) and
    holds one accumulator of the constants' cotangents throughout."""
    num_carry = len(carry)
    floats = _Floats(consts, carry, xs, ys_avals)
    k = inner(length, levels)
    has_tail = length % k != 0
    carry_shapes = [jax.ShapeDtypeStruct(np.shape(c), c.dtype) for c in carry]

    @jax.custom_vjp
    def scan(consts, carry, xs):
        return _plain(body, consts, carry, xs, num_carry, length)

    def forward(consts, carry, xs):
        starts, tail_start, final, ys = _starts(body, consts, carry, xs, length, k, num_carry, keep_ys=True)
        # Where there is no tail, its start is the final carry: not kept.
        return (final, ys), (consts, starts, tail_start if has_tail else None, xs)

    def backward(residuals, cotangents):
        consts, starts, tail_start, xs = residuals
        ct_carry, ct_ys = cotangents
        ct_k = [jnp.zeros_like(c) for c in floats.pick_consts(consts)]
        ct_c, ct_k, ct_xs = _back_from_starts(
            body, floats, consts, starts, tail_start, xs, floats.pick_carry(ct_carry), ct_k, floats.pick_ys(ct_ys),
            length, k, inner, levels, num_carry,
        )
        return floats.cotangents(consts, ct_k, carry_shapes, ct_c, xs, ct_xs)

    scan.defvjp(forward, backward)
    final, ys = scan(list(consts), list(carry), list(xs))
    return list(final), list(ys)


class _Floats:
    """Which operands and outputs carry cotangents (inexact dtypes): the
    backward pass pulls back through those alone, and gives the others
    JAX's zero cotangent (`float0`)."""

    def __init__(self, consts: Sequence[Any], carry: Sequence[Any], xs: Sequence[Any], ys: Sequence[Any]):
        inexact = lambda a: jnp.issubdtype(a.dtype, jnp.inexact)  # noqa: E731
        self.consts = [inexact(a) for a in consts]
        self.carry = [inexact(a) for a in carry]
        self.xs = [inexact(a) for a in xs]
        self.ys = [inexact(a) for a in ys]

    @staticmethod
    def _pick(values: Sequence[Any], mask: Sequence[bool]) -> list:
        return [v for v, m in zip(values, mask) if m]

    def pick_consts(self, values):
        return self._pick(values, self.consts)

    def pick_carry(self, values):
        return self._pick(values, self.carry)

    def pick_xs(self, values):
        return self._pick(values, self.xs)

    def pick_ys(self, values):
        return self._pick(values, self.ys)

    def pullback(self, body: Callable, consts: list, carry: list, x: list, num_carry: int):
        """`jax.vjp` of one iteration with respect to its float operands, to its float outputs."""

        def floats_only(k, c, xf):
            ks, cs, xxs = iter(k), iter(c), iter(xf)
            args = [next(ks) if m else a for a, m in zip(consts, self.consts)]
            args += [next(cs) if m else a for a, m in zip(carry, self.carry)]
            args += [next(xxs) if m else a for a, m in zip(x, self.xs)]
            outs = body(*args)
            return self.pick_carry(outs[:num_carry]), self.pick_ys(outs[num_carry:])

        return jax.vjp(floats_only, self.pick_consts(consts), self.pick_carry(carry), self.pick_xs(x))[1]

    def cotangents(self, consts, ct_k, carry_like, ct_c, xs, ct_xs):
        def fill(values, mask, cts):
            cts = iter(cts)
            return [next(cts) if m else np.zeros(np.shape(v), jax.dtypes.float0) for v, m in zip(values, mask)]

        return fill(consts, self.consts, ct_k), fill(carry_like, self.carry, ct_c), fill(xs, self.xs, ct_xs)


def _plain(body: Callable, consts: list, carry: list, xs: list, num_carry: int, length: int):
    def step(c, x):
        outs = body(*consts, *c, *x)
        return list(outs[:num_carry]), list(outs[num_carry:])

    final, ys = lax.scan(step, list(carry), list(xs), length=length)
    return list(final), list(ys)


def _rows(xs: list, start: Any, size: int) -> list:
    return [lax.dynamic_slice_in_dim(x, start, size) for x in xs]


def _starts(body, consts, carry, xs, length: int, k: int, num_carry: int, keep_ys: bool = False):
    """Where each segment of `k` iterations starts (the carries, stacked),
    where the tail past the last whole segment starts, the final carry,
    and (with `keep_ys`) the outputs."""
    whole = length // k * k

    def segment(c, i):
        end, ys = _plain(body, consts, c, _rows(xs, i * k, k), num_carry, k)
        return end, (c, ys if keep_ys else [])

    tail_start, (starts, ys) = lax.scan(segment, list(carry), jnp.arange(whole // k))
    ys = [y.reshape((whole, *y.shape[2:])) for y in ys]
    final = tail_start
    if whole < length and keep_ys:  # (a backward pass needs the tail's start alone)
        final, tail_ys = _plain(body, consts, tail_start, [x[whole:] for x in xs], num_carry, length - whole)
        ys = [jnp.concatenate([y, t]) for y, t in zip(ys, tail_ys)]
    return list(starts), list(tail_start), list(final), ys


def _back_flat(body, floats: _Floats, consts, carry, xs, ct_c, ct_k, ct_ys, num_carry: int, length: int):
    """The backward pass of a flat run from `carry`: its carries replayed,
    then pulled back one iteration at a time."""

    def replay(c, x):
        outs = body(*consts, *c, *x)
        return list(outs[:num_carry]), c

    _, carries = lax.scan(replay, list(carry), list(xs), length=length)

    def pull(acc, inputs):
        ct_c, ct_k = acc
        c, x, ct_y = inputs
        d_k, d_c, d_x = floats.pullback(body, consts, list(c), list(x), num_carry)((list(ct_c), list(ct_y)))
        return (list(d_c), [a + b for a, b in zip(ct_k, d_k)]), list(d_x)

    (ct_c, ct_k), ct_xs = lax.scan(
        pull, (list(ct_c), list(ct_k)), (carries, list(xs), list(ct_ys)), length=length, reverse=True
    )
    return list(ct_c), list(ct_k), list(ct_xs)


def _back(body, floats, consts, carry, xs, ct_c, ct_k, ct_ys, length, inner, levels, num_carry):
    """The backward pass of a run of `length` iterations from `carry`, in `levels` levels."""
    k = inner(length, levels) if levels > 1 else 1
    if k <= 1:
        return _back_flat(body, floats, consts, carry, xs, ct_c, ct_k, ct_ys, num_carry, length)
    starts, tail_start, _, _ = _starts(body, consts, carry, xs, length, k, num_carry)
    return _back_from_starts(
        body, floats, consts, starts, tail_start, xs, ct_c, ct_k, ct_ys, length, k, inner, levels, num_carry
    )


def _back_from_starts(
    body, floats, consts, starts, tail_start, xs, ct_c, ct_k, ct_ys, length, k, inner, levels, num_carry
):
    """The backward pass of a run in segments of `k` from their starts: the
    tail first, then each segment in reverse, a level down."""
    whole = length // k * k
    tail_ct_xs = None
    if whole < length:  # the tail ran last: pulled back first
        ct_c, ct_k, tail_ct_xs = _back_flat(
            body, floats, consts, tail_start, [x[whole:] for x in xs], ct_c, ct_k, [y[whole:] for y in ct_ys],
            num_carry, length - whole,
        )

    def segment(acc, inputs):
        ct_c, ct_k = acc
        start, i = inputs
        ct_c, ct_k, ct_x = _back(
            body, floats, consts, list(start), _rows(xs, i * k, k), ct_c, ct_k, _rows(ct_ys, i * k, k),
            k, inner, levels - 1, num_carry,
        )
        return (ct_c, ct_k), ct_x

    (ct_c, ct_k), ct_xs = lax.scan(
        segment, (list(ct_c), list(ct_k)), (list(starts), jnp.arange(whole // k)), reverse=True
    )
    ct_xs = [c.reshape((whole, *c.shape[2:])) for c in ct_xs]
    if tail_ct_xs is not None:
        ct_xs = [jnp.concatenate([h, t]) for h, t in zip(ct_xs, tail_ct_xs)]
    return list(ct_c), list(ct_k), ct_xs
