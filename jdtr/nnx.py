"""Flax NNX front end: `jdtr.nnx.grad` / `value_and_grad` mirror `flax.nnx`'s,
and `remat_grad` / `remat_value_and_grad` are the compiled path's (`jdtr.remat_grad`).

Modules among the arguments are split into the state differentiated
(`wrt`, `nnx.Param` by default, or an `nnx.DiffState`'s filter in
`argnums`, as `flax.nnx.grad` takes it) and the rest; the function runs on the
merged modules inside `jdtr.value_and_grad`, under the budget; state the
function mutates (BatchNorm statistics, RNG counters) is written back to the
caller's modules afterwards, as `flax.nnx` does. Gradients come back as an
`nnx.State` that `nnx.Optimizer(...).update` accepts.

    grad_fn = jdtr.nnx.value_and_grad(loss_fn, budget=0.4)
    loss, grads = grad_fn(model, batch)
    optimizer.update(model, grads)

Under `nnx.jit`, the compiled path plans once per shape and compiles into
the step:

    @nnx.jit
    def train_step(model, optimizer, batch):
        loss, grads = jdtr.nnx.remat_value_and_grad(loss_fn, budget=0.5)(model, batch)
        optimizer.update(model, grads)
        return loss
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Sequence, Union

import jax

try:
    from flax import nnx
except ModuleNotFoundError as error:  # Flax is an optional dependency: say which install brings it
    raise ModuleNotFoundError(
        f"jdtr.nnx needs Flax NNX, which is not installed ({error}): pip install 'jdtr[flax]' (flax>=0.12)",
        name=error.name,
    ) from error

from .budget import BudgetLike
from .transform import remat_value_and_grad as _remat_value_and_grad
from .transform import value_and_grad as _value_and_grad
from .transform.arguments import argnums_tuple

# What `argnums` takes, as in `flax.nnx.grad`: positions, each an int (its
# modules' state of the `wrt` filter is differentiated) or an `nnx.DiffState`
# (position and filter of its own).
Argnums = Union[int, nnx.DiffState, Sequence[Union[int, nnx.DiffState]]]


try:  # any graph node: a Module, `nnx.Rngs`, a Variable container (flax.nnx splits them all)
    from flax.nnx.graph import is_graph_node as _is_graph_node
except ImportError:  # pragma: no cover - depends on the Flax version
    _is_graph_node = None


def _is_module(x: Any) -> bool:
    """Whether `x` is split and merged as `flax.nnx.grad` does, its mutated
    state written back (an `nnx.Rngs` argument's counts, issue 23 item 1):
    `flax.nnx` has no `is_graph_node` of its own, so testing it missed all but modules."""
    return _is_graph_node(x) if _is_graph_node is not None else isinstance(x, nnx.Module)


def _differentiated(argnums: Argnums, wrt: Any) -> tuple[tuple[int, ...], tuple[Any, ...], bool]:
    """`argnums` as `flax.nnx.grad` takes it: the positions, each one's
    filter (an `nnx.DiffState`'s own, else `wrt`), and whether one was
    given alone (its gradients then come back alone, not in a tuple)."""
    alone = isinstance(argnums, nnx.DiffState) or not isinstance(argnums, (tuple, list))
    entries = (argnums,) if alone else tuple(argnums)
    # The ints checked as `jax.grad` checks them (a DiffState's argnum stands in for it).
    plain = [e.argnum if isinstance(e, nnx.DiffState) else e for e in entries]
    try:
        positions = argnums_tuple(plain[0] if alone else plain)
    except TypeError:
        raise TypeError(f"argnums must be an int, an nnx.DiffState or a sequence of them; got {argnums!r}") from None
    filters = tuple(e.filter if isinstance(e, nnx.DiffState) else wrt for e in entries)
    return positions, filters, alone


def _resolved(positions: Sequence[int], filters: Sequence[Any], n: int, argnums: Argnums) -> dict[int, Any]:
    """Each differentiated position, counted from 0 among `n` positional
    arguments, with its filter; refused as `flax.nnx.grad` refuses it."""
    resolved: dict[int, Any] = {}
    for i, filter_ in zip(positions, filters):
        if not -n <= i < n:
            raise TypeError(f"argnums={argnums} is out of range for {n} positional arguments")
        if i % n in resolved:
            raise ValueError(f"argnum {i % n} is repeated in argnums={argnums}")
        resolved[i % n] = filter_
    return resolved


def _signature(f: Callable) -> Optional[inspect.Signature]:
    """`f`'s signature, read once per wrapper; None where it says nothing of
    positions (a partial's) or cannot be read."""
    if isinstance(f, functools.partial):
        return None
    try:
        return inspect.signature(f)
    except (TypeError, ValueError):
        return None


def _by_position(signature: Optional[inspect.Signature], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Keyword arguments that name positional parameters, made positional,
    as `flax.nnx.grad` resolves them: `argnums` counts them, and a module
    given by keyword is split and its state written back. Those that cannot
    be (keyword-only) stay keywords, not differentiated."""
    if not kwargs or signature is None:
        return args, kwargs
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:  # a call `f` refuses: it says so when traced
        return args, kwargs
    return bound.args, bound.kwargs


def _make(f, argnums, has_aux, wrt, return_value, options, engine=_value_and_grad):
    """The wrapper of `f` over modules; `engine` (`jdtr.value_and_grad` or
    `jdtr.remat_value_and_grad`) differentiates its pure, split form."""
    positions, filters, alone = _differentiated(argnums, wrt)
    signature = _signature(f)

    def split_pure(trainable_diff, trainable_rest, frozen, structure, kwargs):
        # `structure` (argument count, differentiated positions, and per
        # argument holding graph nodes its pytree structure and graph
        # definitions) and `kwargs` are arguments, not closed over: one traced
        # function serves every call, and jdtr's trace cache keys its traces
        # by them (a new function per call traced and planned every call).
        n, diff, graphdefs = structure
        graphdefs = dict(graphdefs)
        wrts = _resolved(positions, filters, n, argnums)
        rebuilt, nodes = [], {}
        for i in range(n):
            trainable = trainable_diff[i] if i in diff else trainable_rest[i]
            if i in graphdefs:
                treedef, defs = graphdefs[i]
                # copy: fresh Variables at this trace level, so the call may mutate them
                leaves = [
                    nnx.merge(d, t, r, copy=True) if d is not None else t for d, t, r in zip(defs, trainable, frozen[i])
                ]
                nodes[i] = leaves
                rebuilt.append(jax.tree_util.tree_unflatten(treedef, leaves))
            else:
                rebuilt.append(trainable)
        out = f(*rebuilt, **kwargs)
        value, aux = out if has_aux else (out, None)
        # What the call mutated (batch statistics, RNG counts) goes back out.
        kept = lambda i: nnx.Not(wrts[i]) if i in diff else ...  # noqa: E731
        updates = {
            i: [nnx.state(leaf, kept(i)) if d is not None else None for leaf, d in zip(nodes[i], graphdefs[i][1])]
            for i in graphdefs
        }
        return value, (aux, updates)

    step = engine(split_pure, argnums=0, has_aux=True, **options)

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        args, kwargs = _by_position(signature, args, kwargs)
        n = len(args)
        wrts = _resolved(positions, filters, n, argnums)
        diff = set(wrts)
        nodes, graphdefs, trainable, frozen = {}, {}, [], []
        for i, a in enumerate(args):
            # Graph nodes anywhere in the argument (a module, or a list or
            # dict of them, as `nnx.grad` takes) are split one by one.
            leaves, treedef = jax.tree_util.tree_flatten(a, is_leaf=_is_module)
            if not any(_is_module(leaf) for leaf in leaves):
                trainable.append(a)
                frozen.append(None)
                continue
            defs, params, rests = [], [], []
            for leaf in leaves:
                if _is_module(leaf):
                    graphdef, state, rest = nnx.split(leaf, wrts[i] if i in diff else nnx.Nothing, ...)
                    defs.append(graphdef)
                    params.append(state)
                    rests.append(rest)
                else:
                    defs.append(None)
                    params.append(leaf)
                    rests.append(None)
            nodes[i], graphdefs[i] = leaves, (treedef, tuple(defs))
            trainable.append(params)
            frozen.append(rests)

        # Differentiate only the positions in argnums: the others ride along frozen.
        trainable_diff = [trainable[i] if i in diff else None for i in range(n)]
        trainable_rest = [None if i in diff else trainable[i] for i in range(n)]
        structure = (n, tuple(sorted(diff)), tuple(sorted(graphdefs.items(), key=lambda item: item[0])))
        out = step(trainable_diff, trainable_rest, frozen, structure, kwargs)
        stats = None
        if options.get("return_stats"):
            out, stats = out
        (value, (aux, updates)), grads_list = out
        for i, leaves in nodes.items():
            for leaf, update in zip(leaves, updates[i]):
                if update is not None:
                    nnx.update(leaf, update)
        grads = tuple(
            jax.tree_util.tree_unflatten(graphdefs[i][0], grads_list[i]) if i in graphdefs else grads_list[i]
            for i in (j % n for j in positions)
        )
        grads = grads[0] if alone else grads
        if return_value:
            result = ((value, aux) if has_aux else value), grads
        else:
            result = (grads, aux) if has_aux else grads
        return (result, stats) if stats is not None else result

    return wrapper


def value_and_grad(
    f: Optional[Callable] = None,
    *,
    budget: BudgetLike = None,
    argnums: Argnums = 0,
    has_aux: bool = False,
    wrt: Any = nnx.Param,
    **options,
) -> Callable:
    """`flax.nnx.value_and_grad` under a device-memory budget.

    Args:
      f: a scalar loss over modules and arrays (omitted, a decorator that
        takes it, as `flax.nnx.value_and_grad` is used).
      budget: as in `jdtr.grad` (bytes, a size string, or a fraction; None,
        the default as there, means no constraint).
      argnums, has_aux: as in `flax.nnx.value_and_grad`: an int, an
        `nnx.DiffState(argnum, filter)` (that argument's state of `filter`
        differentiated), or a sequence of them.
      wrt: the filter of module state to differentiate at the positions
        given as ints (default `nnx.Param`, as `flax.nnx`'s).
      **options: other `jdtr.value_and_grad` options (heuristic, dealloc,
        cost_model, return_stats, debug, timeline).

    Returns:
      `(loss, grads)` (or `((loss, aux), grads)`), with `grads` an `nnx.State`
      for each module argument; mutated module state is written back.
    """
    if f is None:  # as a decorator, `@jdtr.nnx.value_and_grad(budget=...)`, as flax.nnx's are used
        return functools.partial(value_and_grad, budget=budget, argnums=argnums, has_aux=has_aux, wrt=wrt, **options)
    return _make(f, argnums, has_aux, wrt, True, dict(budget=budget, **options))


def grad(
    f: Optional[Callable] = None,
    *,
    budget: BudgetLike = None,
    argnums: Argnums = 0,
    has_aux: bool = False,
    wrt: Any = nnx.Param,
    **options,
) -> Callable:
    """`flax.nnx.grad` under a device-memory budget; see `value_and_grad`."""
    if f is None:  # as a decorator, `@jdtr.nnx.grad(budget=...)`, as flax.nnx's are used
        return functools.partial(grad, budget=budget, argnums=argnums, has_aux=has_aux, wrt=wrt, **options)
    return _make(f, argnums, has_aux, wrt, False, dict(budget=budget, **options))


def remat_value_and_grad(
    f: Optional[Callable] = None,
    *,
    budget: BudgetLike,
    argnums: Argnums = 0,
    has_aux: bool = False,
    wrt: Any = nnx.Param,
    **options,
) -> Callable:
    """`flax.nnx.value_and_grad` with DTR's decisions compiled in as checkpoint
    segments (`jdtr.remat_value_and_grad`): usable under `nnx.jit` and
    `jax.jit`, planned once per argument structure.

    Args:
      f: a scalar loss over modules and arrays.
      budget: bytes, a size string, or a fraction of `jax.grad`'s compiled bytes.
      argnums, has_aux, wrt: as in `value_and_grad`.
      **options: other `jdtr.remat_value_and_grad` options (heuristic,
        implementation, autotune).

    Returns:
      `(loss, grads)` (or `((loss, aux), grads)`), with `grads` an `nnx.State`
      for each module argument; mutated module state is written back.
    """
    if f is None:  # as a decorator, `@jdtr.nnx.remat_value_and_grad(budget=...)`, as flax.nnx's are used
        return functools.partial(remat_value_and_grad, budget=budget, argnums=argnums, has_aux=has_aux, wrt=wrt, **options)
    return _make(f, argnums, has_aux, wrt, True, dict(budget=budget, **options), engine=_remat_value_and_grad)


def remat_grad(
    f: Optional[Callable] = None,
    *,
    budget: BudgetLike,
    argnums: Argnums = 0,
    has_aux: bool = False,
    wrt: Any = nnx.Param,
    **options,
) -> Callable:
    """`flax.nnx.grad` with DTR's decisions compiled in; see `remat_value_and_grad`."""
    if f is None:  # as a decorator, `@jdtr.nnx.remat_grad(budget=...)`, as flax.nnx's are used
        return functools.partial(remat_grad, budget=budget, argnums=argnums, has_aux=has_aux, wrt=wrt, **options)
    return _make(f, argnums, has_aux, wrt, False, dict(budget=budget, **options), engine=_remat_value_and_grad)
