"""`jdtr.grad` and `jdtr.value_and_grad`: JAX's gradients under a byte budget.

Tracing: the value-and-grad of the user's function is traced once per
argument structure (treedef, shapes, dtypes, static values) and normalised
to a `Program`; later calls with the same structure reuse it, so a dynamic
model re-traces only when its structure changes.

Running: a fresh DTR runtime per call executes the program eagerly on the
device, evicting and rematerializing to keep every byte it holds
(arguments, constants, intermediates, outputs) within the budget.

Logging: `log=path`, and `jdtr.trace`, write down what the program asks of
the runtime as an operator log in the DTR prototype's format, which
`jdtr.simulate` replays to the same decisions.
"""

from __future__ import annotations

import functools
import math
import os
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from ..budget import Budget, BudgetLike, parse_budget
from ..runtime import (
    DEFAULT_HEURISTIC,
    DEALLOC_POLICIES,
    Counters,
    Heuristic,
    NullBackend,
    OutOfBudgetError,
    Runtime,
    Timeline,
    get_heuristic,
)
from ..stats import Stats
from ..trace import Trace, TraceRecorder
from . import _jax_core
from .costs import MEASURED, NANOSECOND, CostModel, check_cost_model
from .executable import assign_workspaces
from .interpreter import Interpreter, JaxBackend, LiveArrayCheck
from .normalize import normalize
from .program import Cond, Program


@dataclass
class Traced:
    """A traced, normalised value-and-grad, cached per argument structure."""

    program: Program
    out_tree: Any
    unconstrained_peak: int
    trace_time_s: float


@dataclass(frozen=True)
class _Static:
    """A non-array leaf of a non-differentiated argument: part of the cache key."""

    value: Any


def _argnums_tuple(argnums: Union[int, Sequence[int]]) -> tuple[int, ...]:
    if isinstance(argnums, (int, np.integer)) and not isinstance(argnums, bool):
        return (int(argnums),)
    if isinstance(argnums, (tuple, list)) and all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in argnums):
        if len(argnums) == 0:
            raise ValueError("argnums must not be empty")
        return tuple(int(a) for a in argnums)
    raise TypeError(f"argnums must be an int or a tuple of ints; got {argnums!r}")


def _path_name(path: Any) -> str:
    return jax.tree_util.keystr(path) if path else ""


def _leaf_spec(leaf: Any, differentiated: bool, where: str) -> Union[jax.ShapeDtypeStruct, _Static]:
    """How a leaf enters the trace: an abstract array, or a static value."""
    if isinstance(leaf, jax.core.Tracer):
        raise TypeError(
            f"jdtr.grad runs eagerly and cannot be traced by jit, vmap or another transformation, but {where} "
            "is a tracer. Use jdtr.remat_grad inside jit, or call jdtr.grad outside the transformation."
        )
    if _jax_core.is_array(leaf):
        if leaf.is_deleted():
            raise ValueError(f"{where} is a deleted jax.Array; its buffer was freed before the call")
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=getattr(leaf, "weak_type", False))
    if isinstance(leaf, (np.ndarray, np.generic)):
        # As jax.grad does: float64 becomes float32 unless x64 is enabled (silently).
        return jax.ShapeDtypeStruct(np.shape(leaf), jax.dtypes.canonicalize_dtype(np.asarray(leaf).dtype))
    if differentiated:
        if isinstance(leaf, (bool, int, float, complex)):
            aval = jnp.asarray(leaf)
            return jax.ShapeDtypeStruct((), aval.dtype, weak_type=not isinstance(leaf, bool))
        raise TypeError(f"{where} of type {type(leaf).__name__} is not a valid JAX type to differentiate")
    try:
        hash(leaf)
    except TypeError:
        raise TypeError(
            f"{where} of type {type(leaf).__name__} is neither an array nor hashable; jdtr treats non-array "
            "arguments as static (part of the trace-cache key), so they must be hashable"
        ) from None
    return _Static(leaf)


def _check_device(leaf: Any, where: str, device: Optional[tuple[Any, str]]) -> Optional[tuple[Any, str]]:
    """Every operation runs on one device, whose memory the budget bounds:
    committed arguments must all be on it (uncommitted ones follow, as under
    jit). Returns the (device, argument) seen first."""
    if not _jax_core.is_array(leaf) or not getattr(leaf, "committed", False):
        return device
    devices = leaf.sharding.device_set
    if len(devices) != 1:
        raise ValueError(
            f"{where} is sharded over {len(devices)} devices, but jdtr runs every operation on one device "
            "under one budget; pass arrays on a single device (jax.device_put(x, device))"
        )
    (here,) = devices
    if device is None:
        return here, where
    if here != device[0]:
        raise ValueError(
            f"{where} is on {here} but {device[1]} is on {device[0]}; jdtr runs every operation on one device "
            "under one budget, so put all arguments on the same device (jax.device_put(x, device))"
        )
    return device


_TRACES: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


def _trace_cache(fun: Callable, *config: Hashable) -> dict:
    """Traces shared by every wrapper of the same function and configuration
    (as `jax.jit` caches per function), so a new budget does not re-trace."""
    try:
        per_fun = _TRACES.setdefault(fun, {})
    except TypeError:  # not weak-referenceable: the wrapper keeps its own
        return {}
    try:
        return per_fun.setdefault(config, {})
    except TypeError:  # an unhashable cost model
        return {}


class _ValueAndGrad:
    """The callable `jdtr.value_and_grad` returns."""

    def __init__(
        self,
        fun: Callable,
        argnums: Union[int, Sequence[int]],
        has_aux: bool,
        budget: Budget,
        heuristic: Union[str, Heuristic],
        dealloc: str,
        cost_model: CostModel,
        return_stats: bool,
        debug: bool,
        timeline: bool,
        value: bool,
        log: "Optional[str | os.PathLike[str]]" = None,
    ):
        self.fun = fun
        self.argnums = argnums
        self.argnum_tuple = _argnums_tuple(argnums)
        self.has_aux = has_aux
        self.budget = budget
        self.heuristic = heuristic
        self.dealloc = dealloc
        self.cost_model = cost_model
        self.return_stats = return_stats
        self.debug = debug
        self.timeline = timeline
        self.value = value
        self.log = log
        self.cache: dict[Hashable, Traced] = _trace_cache(fun, self.argnum_tuple, has_aux, cost_model)
        self.cache_hits = 0
        self.cache_misses = 0
        functools.update_wrapper(self, fun)

    # ---------------------------------------------------------------- tracing

    def _flatten(self, args: tuple, kwargs: dict):
        for i in self.argnum_tuple:
            if i >= len(args) or i < -len(args):
                raise TypeError(
                    f"differentiating with respect to argnums={self.argnums} requires at least {max(self.argnum_tuple) + 1} "
                    f"positional arguments to be passed by the caller, but got only {len(args)} positional arguments"
                )
        diff = {i % len(args) for i in self.argnum_tuple}
        paths, treedef = jax.tree_util.tree_flatten_with_path((args, kwargs))
        leaves, specs = [], []
        device: Optional[tuple[Any, str]] = None  # the first committed argument's device
        for path, leaf in paths:
            differentiated = path[0].idx == 0 and path[1].idx in diff
            where = f"argument {_describe(path)}"
            leaves.append(leaf)
            specs.append(_leaf_spec(leaf, differentiated, where))
            device = _check_device(leaf, where, device)
        return leaves, specs, treedef

    def _trace(self, specs: list, treedef: Any) -> Traced:
        start = time.perf_counter()
        traced_positions = [i for i, s in enumerate(specs) if not isinstance(s, _Static)]

        def flat_fun(*traced):
            leaves = [s.value if isinstance(s, _Static) else None for s in specs]
            for i, x in zip(traced_positions, traced):
                leaves[i] = x
            args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
            return jax.value_and_grad(self.fun, self.argnums, self.has_aux)(*args, **kwargs)

        closed, out_shape = jax.make_jaxpr(flat_fun, return_shape=True)(*[specs[i] for i in traced_positions])
        out_tree = jax.tree_util.tree_structure(out_shape)
        program = normalize(closed, self.cost_model)
        assign_workspaces(program)
        return Traced(program, out_tree, program.unconstrained_peak(), time.perf_counter() - start)

    # ---------------------------------------------------------------- running

    def __call__(self, *args, **kwargs):
        traced, inputs, owned, cache_hit = self._prepare(args, kwargs)
        recorder = TraceRecorder() if self.log is not None else None
        outputs, stats = self._run(traced, inputs, owned, cache_hit, recorder)
        if recorder is not None:
            recorder.trace().to_log(self.log)
        value_and_grads = jax.tree_util.tree_unflatten(traced.out_tree, outputs)
        result = self._shape_result(value_and_grads)
        return (result, stats) if self.return_stats else result

    def record(self, args: tuple, kwargs: dict) -> Trace:
        """The log of the program run in simulation, with no budget (`jdtr.trace`)."""
        traced, inputs, owned, _ = self._prepare(args, kwargs)
        recorder = TraceRecorder()
        interpreter = Interpreter(Runtime(NullBackend(), math.inf), choose_branch=_largest_branch, recorder=recorder)
        # The caller's arrays are not the run's to free, here as in a real run.
        interpreter.run(traced.program, [None] * len(inputs), owned)
        return recorder.trace()

    def _prepare(self, args: tuple, kwargs: dict):
        """The traced program for these arguments (from the cache if it can) and its input arrays."""
        leaves, specs, treedef = self._flatten(args, kwargs)
        key = (treedef, tuple(specs))
        traced = self.cache.get(key)
        cache_hit = traced is not None
        if traced is None:
            self.cache_misses += 1
            traced = self._trace(specs, treedef)
            self.cache[key] = traced
        else:
            self.cache_hits += 1
        inputs, owned = [], []
        for leaf, spec in zip(leaves, specs):
            if isinstance(spec, _Static):
                continue
            if _jax_core.is_array(leaf):
                inputs.append(leaf)
                owned.append(False)
            else:
                inputs.append(jnp.asarray(leaf, dtype=spec.dtype))
                owned.append(True)
        return traced, inputs, owned, cache_hit

    def _shape_result(self, value_and_grads):
        value, grads = value_and_grads
        if self.value:
            return value_and_grads
        if self.has_aux:
            return grads, value[1]
        return grads

    def _run(
        self,
        traced: Traced,
        inputs: list,
        owned: list,
        cache_hit: bool,
        recorder: Optional[TraceRecorder] = None,
    ):
        program = traced.program
        budget_bytes = self.budget.resolve(traced.unconstrained_peak)
        held = sum(v.nbytes for v in program.inputs) + sum(v.nbytes for v, _ in program.consts)
        if held > budget_bytes:
            raise OutOfBudgetError(
                needed_bytes=held,
                free_bytes=budget_bytes,
                pinned_bytes=held,
                locked_bytes=0,
                budget_bytes=budget_bytes,
                op_name="arguments and constants",
                source=None,
            )
        check = None
        if self.debug:
            check = LiveArrayCheck(budget_bytes, [*inputs, *(a for _, a in program.consts)])
        counters = Counters()
        observers: list = [counters]
        timeline = Timeline() if self.timeline else None
        if timeline is not None:
            observers.append(timeline)
        runtime = Runtime(
            JaxBackend(measure=self.cost_model == MEASURED, after_compute=check),
            budget_bytes,
            heuristic=get_heuristic(self.heuristic),
            dealloc=self.dealloc,
            observers=observers,
            device_bytes=_device_bytes(inputs, held),
        )
        start = time.perf_counter()
        try:
            outputs = Interpreter(runtime, recorder=recorder).run(program, inputs, owned)
            jax.block_until_ready(outputs)
        finally:
            if check is not None:
                check.release()
        wall = time.perf_counter() - start
        stats = Stats(
            budget_bytes=budget_bytes,
            peak_bytes=counters.peak_bytes,
            unconstrained_peak_bytes=traced.unconstrained_peak,
            pinned_bytes=counters.pinned_bytes,
            evictions=counters.evictions,
            dealloc_evictions=counters.dealloc_evictions,
            rematerializations=counters.rematerializations,
            base_cost=counters.base_cost * NANOSECOND,
            remat_cost=counters.remat_cost * NANOSECOND,
            overhead=counters.overhead,
            wall_time_s=wall,
            trace_time_s=0.0 if cache_hit else traced.trace_time_s,
            equations=program.num_equations,
            cache_hit=cache_hit,
            heuristic=runtime.heuristic.name,
            dealloc=self.dealloc,
            live_peak_bytes=check.peak_bytes if check is not None else None,
            timeline=tuple(timeline.events) if timeline is not None else None,
        )
        return outputs, stats


def _device_bytes(inputs: Sequence[Any], held: int) -> Optional[Callable[[], int]]:
    """For a device whose allocator reports its use (GPUs, TPUs; not the
    CPU): the bytes the run holds there by the allocator's count, `held`
    (arguments, constants: on the device before the run) plus what it has
    allocated since.

    The allocator rounds buffers up to its blocks: on an H100, runs whose
    count kept the budget used up to 18% more (docs/benchmarks.md)."""
    # Where the operators run: a committed argument's device (all are on one,
    # `_check_device`), else where JAX puts uncommitted work.
    committed = [a for a in inputs if _jax_core.is_array(a) and getattr(a, "committed", False)]
    if committed:
        device = next(iter(committed[0].sharding.device_set))
    else:
        device = jax.config.jax_default_device or jax.devices()[0]
        if isinstance(device, str):  # a platform name
            device = jax.devices(device)[0]
    stats = device.memory_stats()
    if not stats or "bytes_in_use" not in stats:
        return None
    start = stats["bytes_in_use"]

    return lambda: device.memory_stats()["bytes_in_use"] - start + held


def _largest_branch(cond: Cond) -> int:
    """In simulation no predicate can be read: the branch with the largest unconstrained peak runs."""
    peaks = [branch.unconstrained_peak() for branch in cond.branches]
    return peaks.index(max(peaks))


def _describe(path: Any) -> str:
    """'x' style names for error messages: args[0]['w'] -> positional 0 ['w']."""
    kind, rest = path[0].idx, path[1:]
    if kind == 0:
        head = f"{rest[0].idx}"
        tail = jax.tree_util.keystr(tuple(rest[1:]))
        return f"{head}{tail}" if tail else head
    return f"{jax.tree_util.keystr(tuple(rest))} (keyword)"


def _make(fun, argnums, has_aux, budget, heuristic, dealloc, cost_model, return_stats, debug, timeline, value, log=None):
    if not callable(fun):
        raise TypeError(f"expected a callable to differentiate; got {fun!r}")
    if dealloc not in DEALLOC_POLICIES:
        raise ValueError(f"unknown dealloc policy {dealloc!r}; expected one of {DEALLOC_POLICIES}")
    get_heuristic(heuristic)  # fails now on an unknown name
    return _ValueAndGrad(
        fun,
        argnums,
        has_aux,
        parse_budget(budget),
        heuristic,
        dealloc,
        check_cost_model(cost_model),
        return_stats,
        debug,
        timeline,
        value,
        None if log is None else os.fspath(log),
    )


def value_and_grad(
    fun: Callable,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    *,
    budget: BudgetLike = None,
    heuristic: Union[str, Heuristic] = DEFAULT_HEURISTIC,
    dealloc: str = "eager",
    cost_model: CostModel = None,
    return_stats: bool = False,
    debug: bool = False,
    timeline: bool = False,
    log: "Optional[str | os.PathLike[str]]" = None,
) -> Callable:
    """Like `jax.value_and_grad`, run eagerly under a device-memory budget.

    Args:
      fun: the function to differentiate; it returns a scalar (and aux data
        when `has_aux`).
      argnums: which positional argument(s) to differentiate.
      has_aux: whether `fun` returns `(value, aux)`.
      budget: bytes (int), a size string ("512MiB", "2GB") or a fraction in
        (0, 1] of the computation's unconstrained peak. It bounds every byte
        the run holds on the device: arguments, constants, intermediates and
        outputs. None means no constraint.
      heuristic: eviction heuristic name (see `jdtr.HEURISTICS`) or a
        `jdtr.runtime.Heuristic` instance. The default, "lookahead", is
        h_DTR^eq with the distance to the next use (known from the traced
        program) in place of staleness; "dtr_eq" is the paper's.
      dealloc: "eager" (evict dead values), "banish" or "ignore" (App. C.5).
      cost_model: None for flops and bytes counted from shapes on a nominal
        roofline (deterministic), "xla" for XLA's cost analysis of each
        equation, "measured" to time every operator, or a callable
        `jdtr.OpInfo -> float`.
      return_stats: also return a `jdtr.Stats`.
      debug: check after every operator that the bytes of `jax.live_arrays()`
        the run holds stay within the budget (slow).
      timeline: record residency events in `Stats.timeline`.
      log: a path: each call writes there the operator log of what the
        program asked of the runtime (the branches it took, costs as
        nanoseconds), in the DTR prototype's format; `jdtr.simulate` replays
        it to this run's decisions. A call that fails writes nothing. See
        `jdtr.trace`.

    Returns:
      A function returning `(value, grads)` (or `((value, aux), grads)`),
      followed by `Stats` when `return_stats`.

    Raises:
      jdtr.OutOfBudgetError: the budget cannot hold what one operation needs.

    Example:
      >>> import jax.numpy as jnp, jdtr
      >>> f = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
      >>> value, g = jdtr.value_and_grad(f, budget=0.5)(jnp.ones((4, 4)), jnp.ones((8, 4)))
    """
    return _make(fun, argnums, has_aux, budget, heuristic, dealloc, cost_model, return_stats, debug, timeline, True, log)


def grad(
    fun: Callable,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    *,
    budget: BudgetLike = None,
    heuristic: Union[str, Heuristic] = DEFAULT_HEURISTIC,
    dealloc: str = "eager",
    cost_model: CostModel = None,
    return_stats: bool = False,
    debug: bool = False,
    timeline: bool = False,
    log: "Optional[str | os.PathLike[str]]" = None,
) -> Callable:
    """Like `jax.grad`, run eagerly under a device-memory budget.

    Takes the arguments of `jdtr.value_and_grad` and returns only the
    gradients (and aux data when `has_aux`, as `(grads, aux)`).

    Example:
      >>> import jax.numpy as jnp, jdtr
      >>> f = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
      >>> g = jdtr.grad(f, budget="1MiB")(jnp.ones((4, 4)), jnp.ones((8, 4)))
    """
    return _make(fun, argnums, has_aux, budget, heuristic, dealloc, cost_model, return_stats, debug, timeline, False, log)


def trace(fun: Callable, *args: Any, argnums: Union[int, Sequence[int]] = 0, has_aux: bool = False, **kwargs: Any) -> Trace:
    """The operator log of `jax.value_and_grad(fun)(*args, **kwargs)` as jdtr runs it.

    The value-and-grad is traced and normalised as `jdtr.grad` does, then
    run once in simulation — on jdtr's runtime with no buffers and no budget,
    so nothing is computed on the device and a model too large for it can be
    traced — and what the program asks of the DTR runtime is written down in
    the DTR prototype's log format (paper App. C.6; see
    `jdtr.trace.TraceRecorder`): a `CONSTANT` per argument and constant, a
    `CALL` per equation with sizes in bytes and `TIME` in nanoseconds of the
    default, deterministic cost model, a `RELEASE` at each value's last use;
    the outputs stay referenced. The log does not depend on a budget, so
    `jdtr.simulate(jdtr.trace(f, *args), b)` takes the decisions of
    `jdtr.grad(f, budget=b)(*args)` for a budget of `b` bytes.

    Nothing runs, but each distinct operation is compiled once, to read the
    temporaries XLA needs for it (a `CALL` result named "workspace<n>"; the
    compilation a first `jdtr.grad` call would make): seconds for models of
    a thousand operations, where the simulation alone takes a fraction of one.

    A simulation cannot read a `cond`'s predicate: each `cond` contributes
    its branch with the largest unconstrained peak (the branch the budget
    fraction of `jdtr.grad` is measured on). `jdtr.grad(..., log=path)` writes
    the log of a real run instead, with the branches actually taken.

    Args:
      fun: the function `jdtr.grad` would differentiate.
      *args: its positional arguments.
      argnums: which positional argument(s) to differentiate.
      has_aux: whether `fun` returns `(value, aux)`.
      **kwargs: its keyword arguments.

    Returns:
      A `jdtr.Trace`.

    Example:
      >>> import jax.numpy as jnp, jdtr
      >>> f = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
      >>> log = jdtr.trace(f, jnp.ones((4, 4)), jnp.ones((8, 4)))
      >>> result = jdtr.simulate(log, 0.8)
      >>> result.status, result.rematerializations
      ('ok', 5)
    """
    return _make(fun, argnums, has_aux, None, "dtr_eq", "eager", None, False, False, False, True).record(args, kwargs)
