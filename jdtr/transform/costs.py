"""What an equation costs: counts of flops and bytes, and models over them.

DTR's heuristics need a compute cost per operator. The default is
deterministic, so the same program always takes the same decisions (App. E.3
suggests as much): flops and bytes are counted from the equation's shapes
(matmuls and convolutions by their contraction sizes, everything else by its
elements), then a roofline on a nominal device turns them into seconds.
`cost_model="xla"` takes the counts from XLA's cost analysis of each
equation instead (exact for fused HLO, but it lowers every distinct
equation once, which is slower to start); `"measured"` times each operator
synchronously at run time, as the paper's prototype did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import jax
import numpy as np

from ..runtime import Observer

MEASURED = "measured"
XLA = "xla"

# Primitives that cost one transcendental per output element.
TRANSCENDENTAL = frozenset(
    "exp exp2 expm1 log log1p tanh logistic sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh "
    "erf erfc erf_inv lgamma digamma igamma pow rsqrt sqrt cbrt".split()
)
# Primitives that order their operand along one axis: costed as a bitonic
# sorting network over it, L(L+1)/2 passes of its bytes for L = ceil(log2 n)
# (what XLA's sort kernel on a GPU runs; a comparison loop on the CPU costs
# more). Counted as one op per element, a sort of 512x128 floats cost about a
# matmul of the same bytes, where it ran 30x longer on the CPU (6 against 0.2
# ms), and a plan that kept the matmul's output recomputed the sort. `top_k`
# is costed as the sort of its operand: an upper bound (on the CPU it took a
# sixth of that sort's time).
SORTING = frozenset(("sort", "top_k"))
# Primitives that only move or view data: no arithmetic.
DATA_MOVEMENT = frozenset(
    "broadcast_in_dim reshape transpose squeeze expand_dims slice dynamic_slice dynamic_update_slice gather "
    "concatenate pad rev copy copy_p convert_element_type bitcast_convert_type iota select_n split index stack "
    "constant stop_gradient device_put".split()
)


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
class RooflineCostModel:
    """Seconds on a nominal device: launch + max(flops / F, bytes / B).

    Only ratios between operations matter to DTR, so the nominal device need
    not be the real one; it must rank matmuls against elementwise ops
    sensibly. Deterministic: the same program always gets the same costs.
    """

    flops_per_second: float = 1e12
    bytes_per_second: float = 1e11
    launch_seconds: float = 1e-6

    def __call__(self, info: OpInfo) -> float:
        compute = (info.flops + info.transcendentals) / self.flops_per_second
        memory = info.bytes_accessed / self.bytes_per_second
        return self.launch_seconds + max(compute, memory)


CostModel = Union[Callable[[OpInfo], float], str, None]

# The runtime counts cost in whole nanoseconds of the cost model's seconds, as
# the DTR prototype's logs do (`TIME`). Integers add exactly in any order, so a
# run and the replay of its log (`jdtr.simulate`) compute the same clock, the
# same scores and the same ties: one runtime, two backends, the same decisions.
NANOSECOND = 1e-9


def nanoseconds(seconds: float) -> float:
    """A cost in seconds as the runtime's unit: whole nanoseconds, at least 1."""
    return float(max(1, round(seconds / NANOSECOND)))


def check_cost_model(cost_model: CostModel) -> CostModel:
    if cost_model is None or cost_model in (MEASURED, XLA) or (callable(cost_model) and not isinstance(cost_model, str)):
        return cost_model
    raise ValueError(
        f"cost_model must be None (counted flops and bytes), {XLA!r} (XLA's cost analysis), "
        f"{MEASURED!r} (timed at run time) or a callable jdtr.OpInfo -> float; got {cost_model!r}"
    )


def _size(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64))


def count(name: str, params: dict, in_avals: Sequence[Any], out_avals: Sequence[Any], nbytes: Sequence[int]) -> OpInfo:
    """Flops and bytes of one equation from its shapes.

    `nbytes` are the physical bytes of inputs then outputs (PRNG keys count
    their words).
    """
    out_elems = sum(_size(a) for a in out_avals)
    flops = transcendentals = 0.0
    if name == "dot_general":
        (contract, _), _ = params["dimension_numbers"]
        k = int(np.prod([in_avals[0].shape[d] for d in contract], dtype=np.int64)) if contract else 1
        flops = 2.0 * out_elems * k
    elif name == "conv_general_dilated":
        rhs = in_avals[1]
        spec = params["dimension_numbers"].rhs_spec  # (out feature, in feature, spatial...)
        window = int(np.prod([rhs.shape[d] for d in spec[2:]], dtype=np.int64))
        in_features = rhs.shape[spec[1]]
        flops = 2.0 * out_elems * window * in_features
    elif name in TRANSCENDENTAL:
        transcendentals = float(out_elems)
    elif name in SORTING and in_avals and in_avals[0].shape:
        axis = params.get("dimension", -1) if name == "sort" else -1
        levels = int(np.ceil(np.log2(max(in_avals[0].shape[axis], 2))))
        flops = float(max(out_elems, sum(_size(a) for a in in_avals)))
        nbytes = [sum(nbytes) * levels * (levels + 1) // 2]
    elif name not in DATA_MOVEMENT:
        # elementwise, reductions, scans, scatters: one op per input element
        flops = float(max(out_elems, sum(_size(a) for a in in_avals)))
    structs = lambda avals: tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals)  # noqa: E731
    return OpInfo(name, structs(in_avals), structs(out_avals), flops, transcendentals, float(sum(nbytes)))


def xla_count(jitted: Any, name: str, in_avals: Sequence[Any], out_avals: Sequence[Any], nbytes: Sequence[int]) -> OpInfo:
    """Flops and bytes from XLA's cost analysis of the lowered equation."""
    in_structs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in in_avals)
    out_structs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals)
    analysis: Optional[dict] = None
    try:
        analysis = jitted.lower(*in_structs).cost_analysis()
        if isinstance(analysis, list):  # older JAX: one dict per computation
            analysis = analysis[0] if analysis else None
    except Exception:  # noqa: BLE001 - fall back to bytes moved
        analysis = None
    analysis = analysis or {}
    total = float(sum(nbytes))
    return OpInfo(
        name,
        in_structs,
        out_structs,
        max(float(analysis.get("flops", 0.0) or 0.0), 0.0),
        max(float(analysis.get("transcendentals", 0.0) or 0.0), 0.0),
        max(float(analysis.get("bytes accessed", total) or total), 0.0),
    )


class MeasuredCosts(Observer):
    """An observer of an online run that times every operator
    (`cost_model="measured"`): what each equation cost the first time it ran,
    in the runtime's unit (whole nanoseconds, at least 1), for plans made
    from that run on."""

    def __init__(self) -> None:
        self.costs: dict[int, tuple[Any, float]] = {}  # id(equation) -> (the equation, its cost)

    def on_compute(self, op: Any, cost: float, rematerialization: bool, clock: float) -> None:
        if not rematerialization and op.payload is not None:
            self.costs.setdefault(id(op.payload), (op.payload, max(1.0, float(cost))))

    def cost_of(self, equation: Any) -> Optional[float]:
        found = self.costs.get(id(equation))
        return found[1] if found is not None else None
