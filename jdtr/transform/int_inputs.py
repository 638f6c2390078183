"""`allow_int=True`: integer inputs in the differentiated arguments, as `jax.grad` takes them.

With `allow_int`, `jax.grad` accepts integer and boolean leaves (and typed
PRNG keys) in the arguments it differentiates, and gives each a gradient of
zeros of dtype `float0`: an array made on the host, which neither jdtr's
runtime nor XLA runs. Such a leaf carries no derivative, so jdtr
differentiates the same function with it moved out of the differentiated
arguments (`_Split`): the differentiated ones become lists of their inexact
leaves, and everything else is passed beside them, undifferentiated. Its
`float0` zeros are put back where `jax.grad` puts them. The function made
for a structure is kept (the last `MAX_STRUCTURES`), so calls of one
structure share one trace and plan.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence, Union

import jax
import numpy as np

from .arguments import argnums_tuple

# Structures whose functions are kept (as `caches.MAX_TRACES_PER_FUNCTION`).
MAX_STRUCTURES = 64


def _carries_derivative(leaf: Any) -> bool:
    """Whether `jax.grad` differentiates `leaf` without `allow_int`: an inexact
    array or number. Anything else that is not a valid JAX type is left
    where it is, for the differentiation to reject as it does without."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        if not isinstance(leaf, (bool, int, float, complex, np.generic)):
            return True
        dtype = np.result_type(leaf)
    return jax.dtypes.issubdtype(dtype, np.inexact)


@dataclass(frozen=True)
class _Split:
    """Where a call's leaves go: its differentiated arguments' structures and
    which of their leaves carry no derivative."""

    argnums: Union[int, tuple[int, ...]]  # as the user gave them
    positions: tuple[int, ...]
    nargs: int
    treedefs: tuple[Any, ...]  # per differentiated argument
    integer: tuple[tuple[bool, ...], ...]  # per differentiated argument, per leaf

    @property
    def inner_argnums(self) -> Union[int, tuple[int, ...]]:
        """The differentiated arguments of the split function: the leading ones."""
        return 0 if isinstance(self.argnums, int) else tuple(range(len(self.positions)))

    def arguments(self, args: Sequence[Any], flat: Sequence[list]) -> tuple[Any, ...]:
        """The split function's positional arguments: a list of inexact leaves
        per differentiated argument, then the others, then the integer leaves.
        `flat`: the leaves of each differentiated argument."""
        inexact, integer = [], []
        for leaves, mask in zip(flat, self.integer):
            inexact.append([leaf for leaf, is_int in zip(leaves, mask) if not is_int])
            integer.append(tuple(leaf for leaf, is_int in zip(leaves, mask) if is_int))
        others = tuple(arg for i, arg in enumerate(args) if i not in self.positions)
        return (*inexact, others, tuple(integer))

    def function(self, fun: Callable) -> Callable:
        """`fun` of the split arguments."""
        k = len(self.positions)

        def split(*parts, **kwargs):
            inexact, others, integer = parts[:k], iter(parts[k]), parts[k + 1]
            rebuilt = {
                position: self._merged(treedef, mask, leaves, ints)
                for position, treedef, mask, leaves, ints in zip(self.positions, self.treedefs, self.integer, inexact, integer)
            }
            args = [rebuilt[i] if i in rebuilt else next(others) for i in range(self.nargs)]
            return fun(*args, **kwargs)

        functools.update_wrapper(split, fun)
        return split

    def gradients(self, grads: Any, flat: Sequence[list]) -> Any:
        """The split function's gradients in `jax.grad`'s structure, `float0`
        zeros for the integer leaves (of `flat`, as in `arguments`)."""
        per_argument = (grads,) if isinstance(self.argnums, int) else grads
        merged = []
        for treedef, mask, leaves, inputs in zip(self.treedefs, self.integer, per_argument, flat):
            zeros = [_float0_zeros(leaf) for leaf, is_int in zip(inputs, mask) if is_int]
            merged.append(self._merged(treedef, mask, leaves, zeros))
        return merged[0] if isinstance(self.argnums, int) else tuple(merged)

    @staticmethod
    def _merged(treedef: Any, mask: Sequence[bool], inexact: Sequence[Any], integer: Sequence[Any]) -> Any:
        inexact, integer = iter(inexact), iter(integer)
        return jax.tree_util.tree_unflatten(treedef, [next(integer) if is_int else next(inexact) for is_int in mask])


def _float0_zeros(leaf: Any) -> np.ndarray:
    return np.zeros(np.shape(leaf), dtype=jax.dtypes.float0)


class IntInputs:
    """A gradient function of `fun` that takes integer leaves in its
    differentiated arguments (`allow_int=True`).

    Args:
      fun, argnums: as given to the gradient function.
      plain: the gradient function (without `allow_int`) of `fun`, for
        calls without integer leaves.
      make: makes the gradient function (without `allow_int`) of a function
        and its `argnums`.
      value: whether it returns the value too (`value_and_grad`).
      has_aux: whether `fun` returns aux data.
      extra: whether the result is followed by another value (`return_stats`).
    """

    def __init__(self, fun: Callable, argnums: Union[int, Sequence[int]], plain: Callable,
                 make: Callable[[Callable, Any], Callable], value: bool, has_aux: bool, extra: bool = False):
        self.fun, self.argnums, self.plain, self.make = fun, argnums, plain, make
        self.positions = argnums_tuple(argnums)
        self.value, self.has_aux, self.extra = value, has_aux, extra
        self._made: "OrderedDict[Hashable, tuple[_Split, Callable]]" = OrderedDict()
        self._lock = threading.Lock()
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        positions = tuple(i + len(args) if i < 0 else i for i in self.positions)  # (negative: from the end, as JAX reads them)
        if not all(0 <= i < len(args) for i in positions):  # (an error, as the plain function words it)
            return self.plain(*args, **kwargs)
        flat = [jax.tree_util.tree_flatten(args[i]) for i in positions]
        integer = tuple(tuple(not _carries_derivative(leaf) for leaf in leaves) for leaves, _ in flat)
        if not any(any(mask) for mask in integer):
            return self.plain(*args, **kwargs)
        split, gradient = self._split(positions, tuple(treedef for _, treedef in flat), integer, len(args))
        leaves = [leaves for leaves, _ in flat]
        out = gradient(*split.arguments(args, leaves), **kwargs)
        result, extra = (out[0], out[1:]) if self.extra else (out, ())
        if self.value:
            result = (result[0], split.gradients(result[1], leaves))
        elif self.has_aux:
            result = (split.gradients(result[0], leaves), result[1])
        else:
            result = split.gradients(result, leaves)
        return (result, *extra) if self.extra else result

    def _split(self, positions: tuple, treedefs: tuple, integer: tuple, nargs: int) -> tuple[_Split, Callable]:
        key = (treedefs, integer, nargs)
        with self._lock:
            found = self._made.get(key)
            if found is not None:
                self._made.move_to_end(key)
                return found
        split = _Split(self.argnums, positions, nargs, treedefs, integer)
        found = (split, self.make(split.function(self.fun), split.inner_argnums))
        with self._lock:
            self._made[key] = found
            while len(self._made) > MAX_STRUCTURES:
                self._made.popitem(last=False)
        return found
