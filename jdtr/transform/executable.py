"""One cached, jitted callable per distinct equation, and the memory XLA
needs to run it beside its outputs.

`prim.bind` on concrete arrays re-dispatches through JAX's eager path each
time; a jitted callable per (primitive, params, input types) is ~3x cheaper
to call, and equal layers share one (so they also share one compilation).

An executable may take device memory of its own while it runs: XLA's
temporaries, and on a GPU the matrix library's workspace (4 MiB for a
cuBLAS matmul on an H100, measured). `assign_workspaces` reads it from
XLA's `memory_analysis()`; the runtime reserves it under the budget with
the operator's outputs each time the operator runs and gives it back after
(`Runtime.call(workspace=...)`; logs carry it, so replays reserve it too).
Without it, the device's allocator peaked above budgets that jdtr's own
count kept (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional, Sequence

import jax
import numpy as np

from . import _jax_core, pooling, repeats
from .program import Const, Cond, Equation, Program
from .xla_options import compiler_options


@dataclass
class Executable:
    fn: Callable[..., list[Any]]  # jitted: concrete arrays in, list of arrays out
    jitted: Any  # the jax.jit object, for lowering (XLA cost analysis)
    trace: Callable[..., list[Any]]  # not jitted: binds the primitive under any trace
    info: Any = None  # cached OpInfo under the XLA cost model
    cost: Any = None  # cached cost under the default (roofline) model: an executable's key fixes its shapes
    analyses: dict = field(default_factory=dict)  # `Analysis` per input types (and shardings)
    placed: bool = False  # its outputs' shardings are fixed (`placed_executable`)


@dataclass(frozen=True)
class Analysis:
    """What XLA's compilation of an executable for given inputs says:
    its temporary bytes (per device, for a partitioned program) and the
    shardings it gives its outputs (None where it cannot say)."""

    temps: int
    out_shardings: Optional[tuple[Any, ...]]


# Least recently used first out: a model whose shapes keep changing would
# otherwise keep every executable (and XLA's code for it) it ever made. A
# trace holds its equations' executables, so what a cached trace runs stays.
MAX_EXECUTABLES = 4096
# Programs compiled side by side, at most: single equations (`analyses`);
# chunks take the same default (`chunks.COMPILE_THREADS`, set apart).
COMPILE_THREADS = max(1, min(8, os.cpu_count() or 1))
_CACHE: "OrderedDict[Hashable, Executable]" = OrderedDict()
_LOCK = threading.Lock()


def _hashable(x: Any) -> Hashable:
    hash(x)
    return x


def const_key(value: Any) -> Hashable:
    """A literal's part of a cache key: its dtype, shape and bytes."""
    array = np.asarray(value)
    return (array.dtype.str, array.shape, array.tobytes())


def executable(
    key: Hashable,
    build: Callable[[], Callable[..., Any]],
    multiple_results: bool,
    out_shardings: Optional[tuple] = None,
) -> Executable:
    """The cached executable for `key`, built by `build()` on first use
    (with `out_shardings`, compiled to give its outputs those shardings)."""
    with _LOCK:
        found = _CACHE.get(key)
        if found is not None:
            _CACHE.move_to_end(key)
            return found
    impl = build()
    options: dict[str, Any] = {"compiler_options": compiler_options() or None}
    if out_shardings is not None:
        options["out_shardings"] = out_shardings
    fn = jax.jit(impl, **options)
    if multiple_results:
        call = lambda *args: list(fn(*args))  # noqa: E731
        trace = lambda *args: list(impl(*args))  # noqa: E731
    else:
        call = lambda *args: [fn(*args)]  # noqa: E731
        trace = lambda *args: [impl(*args)]  # noqa: E731
    made = Executable(call, fn, trace, placed=out_shardings is not None)
    try:
        with _LOCK:
            _CACHE[key] = made
            while len(_CACHE) > MAX_EXECUTABLES:
                _CACHE.popitem(last=False)
    except TypeError:  # unhashable params: this equation keeps its own
        pass
    return made


def executable_cache_size() -> int:
    """The executables of single equations cached."""
    with _LOCK:
        return len(_CACHE)


def clear_executable_cache() -> None:
    """Drops every cached executable (traces made before keep theirs)."""
    with _LOCK:
        _CACHE.clear()


def primitive_executable(eqn: "_jax_core.JaxprEqn", inputs: Sequence[Any]) -> Executable:
    """An executable binding `eqn.primitive` with literals baked in.

    `inputs` are the equation's atoms: program values (passed at call time)
    or `Const`s (closed over, so no device array is made for them per call).
    """

    def build():  # on a cache miss only: a hit needs the key alone
        bind = binder(eqn, inputs)
        return lambda *args: bind(args)

    operands = tuple(const_key(a.value) if isinstance(a, Const) else (a.shape, a.dtype, a.weak_type) for a in inputs)
    return executable(bound_key("prim", eqn, operands), build, eqn.primitive.multiple_results)


def binder(eqn: "_jax_core.JaxprEqn", inputs: Sequence[Any]) -> Callable[[Sequence[Any]], Any]:
    """A function binding `eqn.primitive` (as `eval_jaxpr` does, inside the
    equation's context) on the operands that are not `Const`s among
    `inputs`, the `Const`s' values put in their places. Several results
    come back as a list: some primitives bind to a sequence of their own,
    which jit does not take as an output (e.g. shard_map's)."""
    primitive = eqn.primitive
    subfuns, params = _jax_core.bind_params(eqn)
    slots = tuple(None if not isinstance(a, Const) else a.value for a in inputs)
    is_const = tuple(isinstance(a, Const) for a in inputs)
    # A custom derivative's rules are Python functions that get these values
    # as they are: a NumPy constant (a literal once its `jit` is inlined)
    # reaching a `custom_vjp`'s residuals fails when the backward pass
    # indexes it with a traced index (`jax.experimental.ode.odeint`'s does).
    # JAX's own trace would have made it an array; so does bind, below.
    as_array = primitive.name in _jax_core.CUSTOM_DERIVATIVES and any(
        const and _host_array(slot) for slot, const in zip(slots, is_const)
    )
    ctx = eqn.ctx
    multiple = primitive.multiple_results
    # Pullbacks that XLA expands expensively (a pool's select-and-scatter on
    # the CPU, a nearest resize's scatter-add): the same function, computed
    # another way (`pooling.py`, `repeats.py`).
    rewritten = None
    if eqn.invars:
        rewritten = pooling.substitute(primitive, params, eqn.invars[-1].aval.dtype) or repeats.substitute(
            primitive, params, [tuple(v.aval.shape) for v in eqn.invars], slots
        )

    apply = rewritten if rewritten is not None else lambda *xs: primitive.bind(*subfuns, *xs, **params)

    def bind(args: Sequence[Any]) -> Any:
        it = iter(args)
        full = [slot if const else next(it) for slot, const in zip(slots, is_const)]
        if as_array:
            full = [_as_array(x) for x in full]
        with ctx.manager:  # (in a `shard_map` body, re-traced: with the casts JAX's own operations make)
            out = bound_alike(apply, full)
        return list(out) if multiple else out

    return bind


def vary_alike(args: Sequence[Any]) -> Optional[list]:
    """`args` cast to vary along every manual mesh axis one of them varies
    along, or None where they agree. In a `shard_map` body (types checked,
    JAX's default) JAX's operations cast an invariant operand so (`x @ w`,
    `w` replicated: the cast's transpose sums `w`'s cotangent over the
    axis); a plan's program, traced outside the body, binds its primitives
    without those casts, which JAX then refuses."""
    axes = [_jax_core.varying_axes(_jax_core.aval_of(a)) or frozenset() for a in args]
    union = frozenset().union(*axes)
    if all(a == union for a in axes):
        return None
    return [x if a == union else _jax_core.pvary(x, tuple(sorted(union - a, key=str))) for x, a in zip(args, axes)]


def bound_alike(bind: Callable[..., Any], operands: Sequence[Any]) -> Any:
    """`bind(*operands)`, or, where JAX refuses it, `bind` of the operands
    cast by `vary_alike` (JAX's error stands where they agree already)."""
    try:
        return bind(*operands)
    except ValueError:
        matched = vary_alike(operands)
        if matched is None:
            raise
        return bind(*matched)


def varying_function(closed: "_jax_core.ClosedJaxpr") -> Callable[..., list]:
    """`closed` as a function, as `jaxpr_function` makes it, each primitive
    bound with the casts `vary_alike` makes where JAX refuses it without
    them: a kept scan's body, traced outside a `shard_map` body and run
    inside one (`scans.run_scan`)."""
    jaxpr = closed.jaxpr

    def run(*args) -> list:
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, args))
        read = lambda v: v.val if _jax_core.is_literal(v) else env[v]  # noqa: E731
        for eqn in jaxpr.eqns:
            bind = lambda *operands: _jax_core.bind_equation(eqn, operands)  # noqa: E731
            env.update(zip(eqn.outvars, bound_alike(bind, [read(v) for v in eqn.invars])))
        return [read(v) for v in jaxpr.outvars]

    return run


def _host_array(value: Any) -> bool:
    """Whether `value` is an array on the host that is not a scalar: a NumPy
    array, or JAX's literal of one (a class of its own before JAX 0.8)."""
    return not isinstance(value, jax.Array) and len(getattr(value, "shape", ())) > 0


def _as_array(value: Any) -> Any:
    """`value` as a JAX value of the same type where it is `_host_array`:
    under a trace, a constant of the traced program."""
    return jax.numpy.asarray(np.asarray(value), dtype=value.dtype) if _host_array(value) else value


def bound_key(tag: Hashable, eqn: "_jax_core.JaxprEqn", operands: Hashable) -> Hashable:
    """The cache key of an executable that binds `eqn`'s primitive (with the
    parameters and sub-functions `bind_params` makes of its own) on operands
    described by `operands`: equal equations share one executable, jaxprs
    in their parameters compared by structure. One of its own where the
    parameters do not hash."""
    try:
        return (tag, eqn.primitive, _jax_core.structural_key(eqn.params), operands, _hashable(_jax_core.context_key(eqn.ctx)))
    except TypeError:
        return ("unique", id(eqn), object())


def placed_executable(exe: Executable, out_shardings: tuple) -> Executable:
    """`exe` giving its outputs `out_shardings` (None: XLA's choice)."""
    original = exe.trace  # (the new executable holds it: its id in the key stays its own)
    return executable(("placed", id(original), out_shardings), lambda: lambda *args: tuple(original(*args)), True, out_shardings)


def _types(args: Sequence[Any]) -> tuple:
    # (dtypes as themselves: hashable, and `str` of a dtype is slow in numpy)
    return tuple((tuple(a.shape), a.dtype, a.weak_type, getattr(a, "sharding", None)) for a in args)


def analysis(exe: Executable, args: Sequence[Any]) -> Analysis:
    """XLA's analysis of one run of `exe` on values like `args` (anything
    with a shape, a dtype, a weak type and, for values sharded over a mesh,
    a `sharding`): the compilation a first call makes, so it is not paid
    twice. No temporaries and no shardings where XLA cannot say."""
    return analyses([(exe, args)])[0]


def analyses(runs: Sequence[tuple[Executable, Sequence[Any]]]) -> list[Analysis]:
    """`analysis` of each (executable, arguments) of `runs`, the missing ones
    compiled side by side (`COMPILE_THREADS`): a new structure's first call
    compiles one program per distinct equation, hundreds of small ones, and
    XLA compiles without the GIL. Lowering (tracing: Python) stays here."""
    keys = [_types(args) for _, args in runs]
    pending: dict[tuple[int, tuple], tuple[Executable, tuple, Any]] = {}
    for (exe, args), key in zip(runs, keys):
        if key in exe.analyses or (id(exe), key) in pending:
            continue
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type, sharding=getattr(a, "sharding", None)) for a in args]
        try:
            lowered = exe.jitted.lower(*structs)
        except Exception:  # noqa: BLE001 - no analysis (effects, backends without one): nothing to add
            exe.analyses[key] = Analysis(0, None)
            continue
        pending[(id(exe), key)] = (exe, key, lowered)
    work = list(pending.values())
    if len(work) > 1 and COMPILE_THREADS > 1:
        with ThreadPoolExecutor(min(COMPILE_THREADS, len(work))) as pool:
            found = list(pool.map(lambda entry: _analysed(entry[2]), work))
    else:
        found = [_analysed(lowered) for _, _, lowered in work]
    for (exe, key, _), result in zip(work, found):
        exe.analyses[key] = result
    return [exe.analyses[key] for (exe, _), key in zip(runs, keys)]


def _analysed(lowered: Any) -> Analysis:
    try:
        compiled = lowered.compile()
    except Exception:  # noqa: BLE001 - as above
        return Analysis(0, None)
    memory = compiled.memory_analysis()
    temps = max(int(memory.temp_size_in_bytes), 0) if memory is not None else 0
    shardings = compiled.output_shardings
    return Analysis(temps, tuple(shardings) if isinstance(shardings, (list, tuple)) else (shardings,))


def assign_workspaces(program: Program) -> None:
    """Sets each equation's `workspace` (branches included): the bytes XLA
    takes beside its inputs and outputs while it runs. Equations with
    effects keep 0: they run once, pinned, and are never replayed."""
    equations = [item for item in _equations(program) if item.executable is not None and not item.effects]
    for item, found in zip(equations, analyses([(item.executable, item.args) for item in equations])):
        item.workspace = found.temps


def _equations(program: Program):
    for item in program.body:
        if isinstance(item, Equation):
            yield item
        elif isinstance(item, Cond):
            for branch in item.branches:
                yield from _equations(branch)
