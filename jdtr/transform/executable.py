"""One cached, jitted callable per distinct equation, and what it costs.

`prim.bind` on concrete arrays re-dispatches through JAX's eager path each
time; a jitted callable per (primitive, params, input types) is ~3x cheaper
to call, and equal layers share one. The same cache holds each equation's
cost, from XLA's cost analysis of that equation (deterministic, so decisions
repeat run to run), or nothing when costs are measured at run time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence, Union

import jax
import numpy as np

from . import _jax_core
from .program import Const


@dataclass(frozen=True)
class OpInfo:
    """What a cost model may read about one equation."""

    name: str
    in_avals: tuple[jax.ShapeDtypeStruct, ...]
    out_avals: tuple[jax.ShapeDtypeStruct, ...]
    flops: float
    transcendentals: float
    bytes_accessed: float


@dataclass(frozen=True)
class XlaCostModel:
    """Roofline estimate in seconds on a nominal device, from XLA's counts.

    cost = launch + max(flops / flops_per_second, bytes / bytes_per_second).
    Only ratios between operations matter to DTR, so the nominal device need
    not be the real one; it must only rank matmuls against elementwise ops
    sensibly. Deterministic: the same program always gets the same costs.
    """

    flops_per_second: float = 1e12
    bytes_per_second: float = 1e11
    launch_seconds: float = 1e-6

    def __call__(self, info: OpInfo) -> float:
        compute = (info.flops + info.transcendentals) / self.flops_per_second
        memory = info.bytes_accessed / self.bytes_per_second
        return self.launch_seconds + max(compute, memory)


MEASURED = "measured"
CostModel = Union[Callable[[OpInfo], float], str, None]


def check_cost_model(cost_model: CostModel) -> CostModel:
    if cost_model is None or cost_model == MEASURED or (callable(cost_model) and not isinstance(cost_model, str)):
        return cost_model
    raise ValueError(
        f"cost_model must be None (XLA's cost analysis), {MEASURED!r} (timed at run time) "
        f"or a callable OpInfo -> float; got {cost_model!r}"
    )


@dataclass
class Executable:
    fn: Callable[..., list[Any]]
    info: Optional[OpInfo] = None


_CACHE: dict[Hashable, Executable] = {}
_LOCK = threading.Lock()


def _hashable(x: Any) -> Hashable:
    hash(x)
    return x


def _const_key(value: Any) -> Hashable:
    array = np.asarray(value)
    return (array.dtype.str, array.shape, array.tobytes())


def executable(
    key: Hashable,
    build: Callable[[], Callable[..., Any]],
    multiple_results: bool,
) -> Executable:
    """The cached executable for `key`, built by `build()` on first use."""
    with _LOCK:
        found = _CACHE.get(key)
        if found is not None:
            return found
    fn = jax.jit(build())
    if multiple_results:
        call = lambda *args: list(fn(*args))  # noqa: E731
    else:
        call = lambda *args: [fn(*args)]  # noqa: E731
    call.jitted = fn  # type: ignore[attr-defined]
    made = Executable(call)
    try:
        with _LOCK:
            _CACHE[key] = made
    except TypeError:  # unhashable params: this equation keeps its own
        pass
    return made


def primitive_executable(eqn: "_jax_core.JaxprEqn", inputs: Sequence[Any]) -> Executable:
    """An executable binding `eqn.primitive` with literals baked in.

    `inputs` are the equation's atoms: program values (passed at call time)
    or `Const`s (closed over, so no device array is made for them per call).
    """
    primitive = eqn.primitive
    params = _jax_core.bind_params(eqn)
    slots = tuple(None if not isinstance(a, Const) else a.value for a in inputs)
    is_const = tuple(isinstance(a, Const) for a in inputs)
    ctx = eqn.ctx

    def build():
        def fn(*args):
            it = iter(args)
            full = [slot if const else next(it) for slot, const in zip(slots, is_const)]
            with ctx.manager:
                return primitive.bind(*full, **params)

        return fn

    try:
        key = (
            "prim",
            primitive,
            _hashable(tuple(sorted(params.items()))),
            tuple(_const_key(a.value) if isinstance(a, Const) else (a.shape, np.dtype(a.dtype).str, a.weak_type) for a in inputs),
            _hashable(ctx),
        )
    except TypeError:
        key = ("unique", id(eqn), object())
    return executable(key, build, primitive.multiple_results)


def analyse(exe: Executable, name: str, in_avals: Sequence[Any], out_avals: Sequence[Any]) -> OpInfo:
    """XLA's flop and byte counts for one executable, computed once."""
    if exe.info is None:
        in_structs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in in_avals)
        out_structs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals)
        flops = transcendentals = 0.0
        nbytes = float(sum(_nbytes(a) for a in (*in_avals, *out_avals)))
        try:
            analysis = exe.fn.jitted.lower(*in_structs).cost_analysis()  # type: ignore[attr-defined]
            if isinstance(analysis, list):  # older JAX: one dict per computation
                analysis = analysis[0] if analysis else {}
            analysis = analysis or {}
            flops = float(analysis.get("flops", 0.0) or 0.0)
            transcendentals = float(analysis.get("transcendentals", 0.0) or 0.0)
            nbytes = float(analysis.get("bytes accessed", nbytes) or nbytes)
        except Exception:  # noqa: BLE001 - fall back to bytes moved
            pass
        exe.info = OpInfo(name, in_structs, out_structs, max(flops, 0.0), max(transcendentals, 0.0), max(nbytes, 0.0))
    return exe.info


def _nbytes(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize
