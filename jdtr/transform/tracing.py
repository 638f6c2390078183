"""Tracing `jdtr.grad`'s value-and-grad, once per argument structure.

The value-and-grad of the user's function is traced on the structure's
shapes and normalised to a `Program` (`normalize.py`), with the temporaries
XLA needs for each operation (`assign_workspaces`). Scans of
`MIN_KEPT_LENGTH` iterations or more stay whole (`scan_variants.py`),
except with `cost_model="measured"`, whose first run times each operator
online; the programs of the other scan strategies, and the unrolled one,
are traced when a plan or an online run first needs them.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence

import jax

from . import _jax_core, manual
from .arguments import Arguments
from .aux import array_leaves, arrays_of_aux
from .caches import Traced
from .collection import collection_paused
from .compiled import compiled_to_measure
from .costs import MEASURED, CostModel
from .devices import placements
from .executable import assign_workspaces
from .normalize import normalize
from .program import Program
from .scan_variants import ScanVariants, run_as
from .scans import ScanStrategy, kept_scans, with_scans_under

_TRACED_CONTROL_FLOW = (
    "jdtr traces the whole step before it runs it (as jax.jit does: it plans the run ahead), so Python "
    "control flow on a value computed from the arguments (`if`, `float()`, `int()`, a loop bound) has no "
    "value to read. Use lax.cond / lax.switch or jnp.where for branches, lax.scan or a fori_loop with "
    "Python bounds for loops, or pass the value as a Python number: arguments that are not arrays are "
    "static (part of the traced structure). Eager jax.grad runs such code; jax.jit(jax.grad) fails the same way."
)


@collection_paused()
def trace_value_and_grad(
    fun: Callable,
    argnums: Sequence[int],
    has_aux: bool,
    holomorphic: bool,
    cost_model: CostModel,
    arguments: Arguments,
    keep_scans: bool = True,
) -> Traced:
    """The traced, normalised value-and-grad of `fun` for this argument
    structure; with `keep_scans`, its scans whole (`scan_variants.py`)."""
    start = time.perf_counter()
    closed, out_tree, aux = _value_and_grad_jaxpr(fun, argnums, has_aux, holomorphic, arguments)
    keep = keep_scans and cost_model != MEASURED
    shardings = [spec.sharding for spec in arguments.traced_specs]
    outs = _step_out_shardings(closed, arguments)
    program = _normalized(closed, cost_model, keep, shardings, outs)
    variants = None
    if keep and kept_scans(program):
        trace, run_as = _strategy_tracer(_weak(fun), argnums, has_aux, holomorphic, cost_model, arguments, aux, outs)
        unroll = lambda: _normalized(closed, cost_model, False, shardings, outs)  # noqa: E731
        variants = ScanVariants(program, trace, unroll=unroll, run_as=run_as)
    traced = Traced(program, out_tree, program.unconstrained_peak(), time.perf_counter() - start, variants=variants)
    if any(s is not None for s in shardings) and manual.has_inlinable(closed.jaxpr):
        # The step as written first (a whole `shard_map` runs fastest); its
        # bodies inlined where a budget needs DTR to decide inside them.
        traced.make_inlined = lambda: _normalized(closed, cost_model, keep, shardings, outs, inline_manual=True)
    traced.aux = aux
    return traced


def _value_and_grad_jaxpr(fun: Callable, argnums, has_aux: bool, holomorphic: bool, arguments: Arguments):
    """The closed jaxpr of the value-and-grad, its output tree and, with
    `has_aux`, the aux value's `Aux`."""
    value_and_grads = jax.value_and_grad(fun, argnums, has_aux, holomorphic)
    box: list = []
    if has_aux:
        value_and_grads = arrays_of_aux(value_and_grads, box)
    try:
        closed, out_shape = jax.make_jaxpr(arguments.bind(value_and_grads), return_shape=True)(*arguments.traced_specs)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError) as err:
        err.add_note(_TRACED_CONTROL_FLOW)  # JAX's message names jdtr's wrapper, not what to do
        raise
    return closed, jax.tree_util.tree_structure(out_shape), box[-1] if box else None


def _normalized(
    closed: Any, cost_model: CostModel, keep_scans: bool, shardings: Sequence[Any], out_shardings: Optional[Sequence[Any]],
    inline_manual: bool = False,
) -> Program:
    """The program of a traced jaxpr, its values placed where the arguments'
    `shardings` lead (a mesh: bytes per device), its outputs where
    `out_shardings` say, and with XLA's temporaries; with `inline_manual`,
    its `shard_map`s' bodies inlined (`manual.py`)."""
    program = normalize(
        closed, cost_model, keep_scans=keep_scans, shardings=shardings, inline_manual=inline_manual, out_shardings=out_shardings
    )
    assign_workspaces(program)
    return program


def _step_out_shardings(closed: Any, arguments: Arguments) -> Optional[list]:
    """Where `jax.jit` of the traced step places its outputs, for arguments
    sharded over a mesh (None otherwise, or where it cannot be compiled).
    The partitioner shards each equation for its own inputs, and the whole
    step may shard a gradient otherwise (on Auto axes, a GPT's attention
    kernel and LayerNorm biases); the step is compiled once per structure
    to read its choice, and the gradients are made there. It never runs,
    so on the CPU it compiles without LLVM's optimizations (placements are
    decided before code is generated: `compiled_to_measure`)."""
    specs = arguments.traced_specs
    if placements(specs) is None:
        return None
    try:
        compiled = compiled_to_measure(_jax_core.jaxpr_function(closed), specs)
        return list(compiled.output_shardings)
    except Exception:  # noqa: BLE001 - the step's own placements stand, as before
        return None


def _strategy_tracer(
    fun_ref, argnums, has_aux: bool, holomorphic: bool, cost_model: CostModel, arguments: Arguments, aux, out_shardings
):
    """What traces the value-and-grad with its scans under a strategy, and
    what says which strategy that runs (`run_as`): the function is traced
    once on shapes (its forward jaxpr, shared by the strategies), and
    evaluated with each kept scan under the strategy."""
    forward: list = []  # the forward jaxpr, once traced
    lock = threading.Lock()

    def traced_forward() -> Any:
        with lock:
            if not forward:
                fun = fun_ref()
                if fun is None:
                    raise ReferenceError("the function was collected")
                forward.append(jax.make_jaxpr(_flat_loss(fun, arguments, has_aux))(*arguments.traced_specs))
            return forward[0]

    def strategy_run(strategy: ScanStrategy) -> ScanStrategy:
        try:
            return run_as(traced_forward(), strategy)
        except Exception:  # noqa: BLE001 - `trace` fails the same way, and `ScanVariants.program` says why
            return strategy

    def trace(strategy: ScanStrategy) -> Program:
        run = with_scans_under(traced_forward(), strategy)

        def under_strategy(*args, **kwargs):
            outs = run(*arguments.traced_leaves(args, kwargs))
            return (outs[0], aux.rebuild(outs[1:])) if has_aux else outs[0]

        closed, _, _ = _value_and_grad_jaxpr(under_strategy, argnums, has_aux, holomorphic, arguments)
        return _normalized(closed, cost_model, True, [spec.sharding for spec in arguments.traced_specs], out_shardings)

    return trace, functools.lru_cache(maxsize=None)(strategy_run)


def _flat_loss(fun: Callable, arguments: Arguments, has_aux: bool) -> Callable:
    """`fun` as a function of the traced leaves, returning its value (and the
    array leaves of its aux value)."""

    def flat(*traced):
        args, kwargs = arguments.unflatten(traced)
        out = fun(*args, **kwargs)
        if not has_aux:
            return out
        value, aux = out
        return value, array_leaves(jax.tree_util.tree_leaves(aux))

    return flat


def _weak(fun: Callable) -> Callable[[], Optional[Callable]]:
    """A reference to `fun` that does not keep it alive: the trace cache is
    keyed weakly by the function, and its traces must not hold it."""
    try:
        return weakref.ref(fun)
    except TypeError:
        return lambda: fun
