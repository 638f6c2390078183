"""Max pooling's pullback without XLA's select-and-scatter, on the CPU.

JAX differentiates `reduce_window_max` (and `_min`: `nnx.max_pool`,
`lax.reduce_window` with `lax.max`) through `select_and_scatter_add`. XLA
on the CPU expands that into a variadic reduce-window carrying one int32
index array per dimension, the size of the pool's input, and a scatter:
for a 2x2 pool of a (16, 32, 32, 32) float32 input, 11.8 MB of temporaries
(5.6 times the input) and 8.9 ms, against none beyond the output and
0.28 ms for what is here (docs/benchmarks.md). On a VGG-like CNN that
expansion alone was more than half of the step's memory any plan could
reach.

What is here computes the same function from strided slices: each window
offset `k` of the pool sees one slice of the (padded) input of the output's
shape, and a sequential pass over the offsets, in the window's row-major
order, keeps which one each output selects, with the same rule as XLA's
select-and-scatter on the CPU (an element replaces the one selected unless
`select(selected, element)`; padding holds -inf for a max pool and may be
selected, its cotangent dropped). That pass runs in a `lax.cond` XLA
cannot decide, so the selected offsets are an int32 array of the output's
size, not slices fused into their readers (`selected`: fused, XLA wrote a
reader's output over the pool's input while reading it). The cotangent then
goes to the selected offset of each window: a sum of the slices' transposes
(pads), which XLA fuses into one loop over the input.

Where windows do not overlap, each input element takes at most one
contribution, and the result is the same bit for bit (NaNs, ties and
infinities included; tests/test_pooling.py). Where they overlap (a 3x3
pool with stride 2), an element's contributions are summed in the
scatter's order (`scatter_selected`: the last offset first): the same bits
with JAX 0.10's XLA in every case the tests hold, 2 ulps apart on one
element of 384 with JAX 0.6's, so the tests compare those to rounding.

Used in place of the primitives themselves (`executable.binder`), where the
backend is the CPU, on what both compiled paths run:
- `reduce_window_max`/`_min` of a traced forward program binds `pooled`, a
  `custom_jvp` whose tangent is linear in the input's (so JAX's transpose of
  it is the sum of pads); `jax.grad` of `jdtr.remat_grad`'s plans, and
  forward-mode on top, go through it;
- `select_and_scatter_add` of a traced value-and-grad program (`jdtr.grad`'s)
  binds `scatter_selected`, that transpose.
Not on a GPU, where XLA runs select-and-scatter as a kernel of its own
(not measured there).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .undecided import an_element, undecided

# Offsets are unrolled, one slice each: a larger window (a global pool over
# a whole image) is left to XLA.
MAX_WINDOW = 64

_SELECT = {"reduce_window_max": "ge", "reduce_window_min": "le"}
_ORDER = {"ge": lax.ge, "le": lax.le}


@functools.lru_cache(maxsize=None)
def _enabled() -> bool:
    return jax.default_backend() == "cpu"


def substitute(primitive: Any, params: dict, dtype: Any) -> Optional[Callable[..., Any]]:
    """The function to bind in place of `primitive` with `params` on an
    operand of `dtype`, or None: `pooled` for a max or min pool,
    `scatter_selected` for the pullback JAX makes of one, where the backend
    is the CPU, the operand floating and the window small and undilated."""
    name = primitive.name
    if (name not in _SELECT and name != "select_and_scatter_add") or not _enabled():
        return None
    if not jnp.issubdtype(dtype, jnp.inexact):
        return None
    if name in _SELECT:
        if any(d != 1 for d in (*params["base_dilation"], *params["window_dilation"])):
            return None
        select = _SELECT[name]
    else:
        select = getattr(params["select_prim"], "name", None)
        if select not in _ORDER:
            return None
    window, strides = tuple(params["window_dimensions"]), tuple(params["window_strides"])
    padding = tuple(tuple(p) for p in params["padding"])
    if int(np.prod(window)) > MAX_WINDOW:
        return None
    if name == "select_and_scatter_add":
        return lambda source, operand: scatter_selected(source, operand, select, window, strides, padding)
    return pooled(primitive, select, window, strides, padding)


def _windows(x: Any, fill: Any, window, strides, padding) -> list[Any]:
    """The slice of `x` (padded with `fill`) each window offset sees, in the
    window's row-major order: the offset's element of every window."""
    padded = lax.pad(x, jnp.asarray(fill, x.dtype), [(lo, hi, 0) for lo, hi in padding])
    out = [(d + lo + hi - w) // s + 1 for d, (lo, hi), w, s in zip(x.shape, padding, window, strides)]
    slices = []
    for k in itertools.product(*(range(w) for w in window)):
        limit = [k_i + (o - 1) * s + 1 for k_i, o, s in zip(k, out, strides)]
        slices.append(lax.slice(padded, k, limit, strides))
    return slices


def selected(operand: Any, select: str, window, strides, padding) -> Any:
    """For each output of the pool, the window offset (row-major) of the
    element select-and-scatter selects. Padding holds the order's far end
    (-inf for "ge") and may be selected, as XLA's select-and-scatter on the
    CPU does (a window of padding and -inf alone keeps the padding, and its
    cotangent is dropped).

    Made in a `lax.cond` on a predicate XLA cannot decide (`undecided`), so
    that the offsets are an array of their own, not fused into what reads
    them. Fused, the slices of `operand` were read in the loop that makes
    its cotangent, and XLA on the CPU (JAX 0.10.2) wrote that loop's output
    over `operand`'s own buffer where the pool's input was a reshape (a
    bitcast) of a value the loop also reads elementwise (the backward pass
    of a `tanh`): the windows' later offsets then read cotangents instead of
    values, and every gradient of the step was wrong (tests/test_pooling.py).
    The offsets are int32 of the pool's output size."""
    return lax.cond(
        undecided(an_element([operand])),
        lambda x: _selected(x, select, window, strides, padding),
        # (placed as the offsets are: a mesh's Explicit axes type the branches' outputs)
        lambda x: jnp.zeros_like(_windows(x, 0, window, strides, padding)[0], dtype=jnp.int32),
        operand,
    )


def _selected(operand: Any, select: str, window, strides, padding) -> Any:
    order = _ORDER[select]
    fill = -jnp.inf if select == "ge" else jnp.inf
    values = _windows(operand, fill, window, strides, padding)
    # (`zeros_like`: the zeros take the input's sharding, which a select
    # between them and its slices must match on a mesh's Explicit axes.)
    best, index = values[0], jnp.zeros_like(values[0], dtype=jnp.int32)
    for k in range(1, len(values)):
        replace = ~order(best, values[k])
        best = jnp.where(replace, values[k], best)
        index = jnp.where(replace, k, index)
    return index


def gather_selected(tangent: Any, index: Any, window, strides, padding) -> Any:
    """The tangent at each window's selected element: linear in `tangent`."""
    pieces = _windows(tangent, 0, window, strides, padding)
    out = jnp.zeros_like(pieces[0])
    for k, piece in enumerate(pieces):
        out = jnp.where(index == k, piece, out)
    return out


def scatter_selected(source: Any, operand: Any, select: str, window, strides, padding) -> Any:
    """`select_and_scatter_add(source, operand)` with its parameters: each
    output's cotangent added at its window's selected element. The
    transpose of `gather_selected`, written out: each offset's share of
    `source`, padded into place (strided by the pool's strides) in the
    padded input, summed over the offsets and cropped."""
    index = selected(lax.stop_gradient(operand), select, window, strides, padding)
    padded = [d + lo + hi for d, (lo, hi) in zip(operand.shape, padding)]
    zero = jnp.zeros_like(source)
    total = None
    offsets = list(enumerate(itertools.product(*(range(w) for w in window))))
    # Last offset first: an element's contributions then come in the order
    # the scatter adds them (outputs in row-major order, which meet the
    # element at offsets in the reverse order).
    for k, offset in reversed(offsets):
        share = jnp.where(index == k, source, zero)
        config = [(o, p - (o + (n - 1) * s + 1), s - 1) for o, n, s, p in zip(offset, source.shape, strides, padded)]
        placed = lax.pad(share, jnp.zeros((), source.dtype), config)
        total = placed if total is None else total + placed
    return lax.slice(total, [lo for lo, _ in padding], [lo + d for (lo, _), d in zip(padding, operand.shape)])


@functools.lru_cache(maxsize=None)
def pooled(reduce: Any, select: str, window, strides, padding) -> Callable[[Any], Any]:
    """The pool (`reduce`: `reduce_window_max` for "ge", `_min` for "le")
    with its tangent taken at each window's selected element, whose
    transpose is `scatter_selected`'s sum of pads rather than a
    select-and-scatter."""
    params = dict(
        window_dimensions=window, window_strides=strides, padding=padding,
        base_dilation=(1,) * len(window), window_dilation=(1,) * len(window),
    )

    @jax.custom_jvp
    def pool(x):
        return reduce.bind(x, **params)

    @pool.defjvp
    def pool_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        index = selected(x, select, window, strides, padding)
        return pool(x), gather_selected(t, index, window, strides, padding)

    return pool
