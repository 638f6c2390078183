"""Aux values (`has_aux=True`) as `jax.value_and_grad` returns them.

JAX hands aux back unchanged: a string, a Python int or float, a NumPy
array stay what they are. A traced program can only return arrays, so the
aux value is split when the step is traced: the leaves that depend on the
inputs (tracers) and JAX arrays go through the program, every other leaf is
kept, with the tree's structure, as part of the traced structure (`Aux`),
and put back on each call, cached ones included, as `jax.jit` keeps static
values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax

from . import _jax_core


@dataclass(frozen=True, eq=False)
class Aux:
    """An aux value's tree, and the leaves that are not arrays, by position."""

    treedef: Any
    kept: dict[int, Any]

    def rebuild(self, arrays: list[Any]) -> Any:
        """The aux value, with `arrays` (the program's aux outputs) in their places."""
        arrays = iter(arrays)
        leaves = [self.kept[i] if i in self.kept else next(arrays) for i in range(self.treedef.num_leaves)]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def arrays_of_aux(value_and_grad: Callable, box: list) -> Callable:
    """`value_and_grad` (of `has_aux=True`) returning only the array leaves of
    its aux value; the `Aux` to rebuild it is appended to `box` when traced."""

    def split(*args, **kwargs):
        (value, aux), grads = value_and_grad(*args, **kwargs)
        leaves, treedef = jax.tree_util.tree_flatten(aux)
        arrays = array_leaves(leaves)
        box.append(Aux(treedef, {i: leaf for i, leaf in enumerate(leaves) if not _is_array_like(leaf)}))
        return (value, arrays), grads

    return split


def array_leaves(leaves: list) -> list:
    """The leaves (of an aux value) that go through a traced program."""
    return [leaf for leaf in leaves if _is_array_like(leaf)]


def _is_array_like(leaf: Any) -> bool:
    return _jax_core.is_tracer(leaf) or _jax_core.is_array(leaf)
