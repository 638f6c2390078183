"""`holomorphic=True` on the compiled path (`jdtr.remat_grad`), by an identity of JAX's.

`jax.grad(f, holomorphic=True)` is f's VJP with the cotangent 1, and so is
`jax.grad` of f's real part: the VJP of `real` passes 1 + 0j on to f's. So
the compiled path differentiates the real part, planned as any real loss
(one `real` more at the end of the step), with the complex value carried
out beside it as aux data where `value_and_grad` returns it, and it checks
the dtypes `jax.grad` checks, with its words. (`jdtr.grad` hands
`holomorphic` to JAX's own trace.)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence, Union

import jax
import jax.numpy as jnp

from .arguments import argnums_tuple


def _complex(value: Any, what: str) -> None:
    dtype = jnp.result_type(value)
    if not jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(f"grad with holomorphic=True requires {what} with complex dtype, but got {dtype.name}.")


def real_part(fun: Callable, has_aux: bool, keep_value: bool) -> Callable:
    """`fun`'s real part as the value, and `(value, aux)` as aux data, the
    value None unless `keep_value`: an output more, that XLA holds (7% more
    bytes for a gradient step of a 12-layer complex MLP)."""

    def real(*args, **kwargs):
        out = fun(*args, **kwargs)
        value, aux = out if has_aux else (out, None)
        _complex(value, "outputs")
        return jnp.real(value), (value if keep_value else None, aux)

    functools.update_wrapper(real, fun)
    return real


class Holomorphic:
    """The gradient function of a holomorphic `fun`, made by `make` (a
    function and its `argnums` -> its gradient function with aux data) of
    its real part. `value`: it returns the value too."""

    def __init__(self, fun: Callable, argnums: Union[int, Sequence[int]], has_aux: bool, value: bool,
                 make: Callable[[Callable, Any], Callable]):
        self.positions = argnums_tuple(argnums)
        self.has_aux, self.value = has_aux, value
        self.inner = make(real_part(fun, has_aux, keep_value=value), argnums)
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        for i in self.positions:
            if -len(args) <= i < len(args):  # (past them: the inner function's error)
                for leaf in jax.tree_util.tree_leaves(args[i]):
                    _complex(leaf, "inputs")
        out = self.inner(*args, **kwargs)
        if self.value:
            (_, (value, aux)), grads = out
            return ((value, aux) if self.has_aux else value), grads
        grads, (_, aux) = out
        return (grads, aux) if self.has_aux else grads
