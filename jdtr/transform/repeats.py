"""Nearest upsampling's gather, and the scatter-add of its pullback, as a
broadcast and a sum of strided slices.

`jax.image.resize(x, ..., "nearest")` by a whole factor gathers each
resized axis with indices `j // r`, computed from an `iota` (`normalize`
computes them and hands them to the gather as a constant). JAX's pullback
of a gather is a scatter-add into zeros, which XLA on the CPU expands into
a loop over the indices that holds copies of the operand: on a U-Net (`models.flax_unet`),
12 MiB for one resize, the floor of every plan, which no plan compiled
below 0.69 of `jax.jit(jax.grad)`'s bytes.

A gather along one axis whose static indices repeat each position `r`
times in order is a broadcast and a reshape (the same values: copies); JAX
differentiates that into a sum over the repeats, which XLA fuses. A
scatter-add with those indices (in `jdtr.grad`'s value-and-grad program) is
its operand plus each of the `r` strided slices of the updates, added in
the scatter's order (update after update): the same bits as XLA's.

Any backend: a broadcast and a sum are what XLA makes of a resize that
is written as one (`jnp.repeat`), and the values are the same.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
from jax import lax

# A scatter-add adds one strided slice per repeat (unrolled): past this
# many, left to XLA.
MAX_REPEATS = 64
# The operand each rewrite needs as a constant (the indices), which
# `normalize` computes where it is made of constants alone.
CONSTANT_OPERAND = {"gather": 1, "scatter-add": 1}


def substitute(primitive: Any, params: dict, shapes: Sequence[tuple], consts: Sequence[Any]) -> Optional[Callable[..., Any]]:
    """The function to bind in place of `primitive` with `params` on
    operands of `shapes`, or None: a repeat for a gather along one axis with
    constant indices (`consts`: each operand's value where it is a
    constant, else None) that repeat each position in order, and the
    matching sum for a scatter-add."""
    name = primitive.name
    if name == "gather" and len(shapes) == 2:
        axis = _one_axis(params["dimension_numbers"], "gather", shapes[0], params.get("slice_sizes"))
        r = None if axis is None else _repeat(consts[1], shapes[0][axis])
        if r is None:
            return None
        return lambda operand, _indices: _repeated(operand, axis, r)
    if name == "scatter-add" and len(shapes) == 3:
        axis = _one_axis(params["dimension_numbers"], "scatter", shapes[0], None, shapes[2])
        r = None if axis is None else _repeat(consts[1], shapes[0][axis])
        if r is None or r > MAX_REPEATS or shapes[2][axis] != r * shapes[0][axis]:
            return None
        return lambda operand, _indices, updates: _summed(operand, updates, axis, r)
    return None


def _one_axis(dnums: Any, kind: str, operand_shape: tuple, slice_sizes, updates_shape: Optional[tuple] = None) -> Optional[int]:
    """The axis of a gather (or scatter) that takes whole slices of every
    other axis, one index per position along it, in place: `jnp.take`'s
    form. None otherwise."""
    ndim = len(operand_shape)
    if kind == "gather":
        collapsed, index_map, windows = dnums.collapsed_slice_dims, dnums.start_index_map, dnums.offset_dims
        batching = (*getattr(dnums, "operand_batching_dims", ()), *getattr(dnums, "start_indices_batching_dims", ()))
    else:
        collapsed, index_map, windows = dnums.inserted_window_dims, dnums.scatter_dims_to_operand_dims, dnums.update_window_dims
        batching = (*getattr(dnums, "operand_batching_dims", ()), *getattr(dnums, "scatter_indices_batching_dims", ()))
    if batching or len(collapsed) != 1 or tuple(index_map) != tuple(collapsed):
        return None
    (axis,) = collapsed
    if tuple(windows) != tuple(i for i in range(ndim) if i != axis):
        return None  # (the index's dimension lands elsewhere than the axis)
    if slice_sizes is not None and tuple(slice_sizes) != tuple(1 if i == axis else d for i, d in enumerate(operand_shape)):
        return None
    if updates_shape is not None and tuple(d for i, d in enumerate(updates_shape) if i != axis) != tuple(
        d for i, d in enumerate(operand_shape) if i != axis
    ):
        return None
    return axis


def _repeat(indices: Any, size: int) -> Optional[int]:
    """`r` > 1 where the constant `indices` (shape (m, 1)) are `j // r` for
    `j < m = r * size`; None where they are not constants or not that."""
    if indices is None:
        return None
    indices = np.asarray(indices)
    if indices.ndim != 2 or indices.shape[1] != 1 or indices.shape[0] == 0 or size == 0:
        return None
    m = indices.shape[0]
    if m % size or m == size:  # (all once, in order: an identity, whose output would be its input)
        return None
    r = m // size
    return r if np.array_equal(indices[:, 0], np.arange(m) // r) else None


def _repeated(x: Any, axis: int, r: int) -> Any:
    """Each position of `x` along `axis` `r` times in a row."""
    shape = x.shape
    wide = lax.broadcast_in_dim(x, (*shape[: axis + 1], r, *shape[axis + 1 :]), (*range(axis + 1), *range(axis + 2, x.ndim + 1)))
    return lax.reshape(wide, (*shape[:axis], shape[axis] * r, *shape[axis + 1 :]))


def _summed(operand: Any, updates: Any, axis: int, r: int) -> Any:
    """`operand` plus, at each position along `axis`, its `r` updates in a
    row, added one after another as the scatter adds them."""
    out = operand
    for k in range(r):
        out = out + lax.slice_in_dim(updates, k, updates.shape[axis], stride=r, axis=axis)
    return out
