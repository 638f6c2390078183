"""Every touch of JAX internals, in one module, so a JAX upgrade is one file's work.

Public names come from `jax.extend.core`; the few things it does not expose
(source line summaries) are guarded with fallbacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import weakref
from typing import Any, Iterable, Optional, Sequence

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Primitive, Var  # noqa: F401

try:  # a readable "file:line (function)" for error messages
    from jax._src import source_info_util as _source_info_util
except ImportError:  # pragma: no cover - depends on the JAX version
    _source_info_util = None

try:  # JAX's own dead-code elimination, whose rules prune a scan's unused outputs
    from jax._src.interpreters.partial_eval import dce_jaxpr as _dce_jaxpr
except ImportError:  # pragma: no cover - depends on the JAX version
    _dce_jaxpr = None


# Primitives whose body is inlined into the caller: DTR must see the real
# tensors inside them, and a user's own remat is subsumed by DTR's.
CALL_PRIMITIVES = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "eval_jaxpr": "call_jaxpr",  # JAX 0.11's call primitive (`closed_call` is its alias there)
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
}


# Calls whose derivative is a rule of their own: inlined into a program that
# JAX differentiates again, the rule would be lost (`normalize`'s `keep_custom`).
CUSTOM_DERIVATIVES = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})


class SourceLine:
    """The user's source line of an equation, e.g. 'model.py:12 (layer)', as
    its `str`, found when first shown. Finding it walks the equation's
    traceback: a tenth of normalising a fresh structure's thousands of
    equations, for a line only an error message or a report shows."""

    __slots__ = ("_info", "_text")

    def __init__(self, info: Any):
        self._info, self._text = info, None

    def __str__(self) -> str:
        if self._text is None:
            try:
                self._text = _source_info_util.summarize(self._info)
            except Exception:  # noqa: BLE001 - only a nicety for error messages
                self._text = "unknown"
            self._info = None
        return self._text

    def __repr__(self) -> str:
        return repr(str(self))


def source_line(eqn: JaxprEqn) -> Optional[SourceLine]:
    """The user's source line of an equation (its `str`), e.g. 'model.py:12 (layer)'."""
    if _source_info_util is None:
        return None
    return SourceLine(eqn.source_info)


def call_body(eqn: JaxprEqn) -> Optional[tuple[Jaxpr, list[Any]]]:
    """(jaxpr, consts) of an inlinable call primitive, or None."""
    key = CALL_PRIMITIVES.get(eqn.primitive.name)
    if key is None or key not in eqn.params:
        return None
    return open_jaxpr(eqn.params[key])


def without_dead_code(closed: ClosedJaxpr) -> ClosedJaxpr:
    """`closed` after JAX's dead-code elimination, every input kept. Its
    rules reach inside equations: a `scan` loses the outputs nothing reads
    (a stacked `ys` of a loss on the last carry) and the work only they
    needed, which XLA would drop under `jax.jit` but a scan jdtr runs as
    one operation would otherwise make and hold. Unchanged where this JAX
    has no such pass."""
    if _dce_jaxpr is None:  # pragma: no cover - depends on the JAX version
        return closed
    try:
        jaxpr, _ = _dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    except Exception:  # noqa: BLE001 - an optimisation only: a primitive without a rule keeps the jaxpr
        return closed
    return ClosedJaxpr(jaxpr, closed.consts)


class _Same:
    """A value that keys by identity (a jaxpr's constant: arrays do not
    hash), kept alive with the key so that its id stays its own."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value


class _Structure:
    """A jaxpr's structure as a key: equal for jaxprs that compute the same
    function in the same way (equations, parameters, types, literals; its
    constants by identity), whatever their variables' names and objects.
    Its hash is computed once: a scan body's key is large."""

    __slots__ = ("key", "_hash")

    def __init__(self, key: tuple):
        self.key, self._hash = key, hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Structure) and (other is self or (other._hash == self._hash and other.key == self.key))


# id(jaxpr) -> (a weak reference to it, its structure): a jitted function called
# in a loop binds one jaxpr many times, and its structure is walked once. Weak,
# so that the memo keeps no jaxpr (nor the device arrays among its constants)
# alive; an entry goes with its jaxpr (plain dict operations, atomic, so a
# collection in any thread may drop one).
_STRUCTURES: dict[int, tuple[Any, "_Structure"]] = {}


def structural_key(params: dict) -> Any:
    """An equation's parameters as a hashable key in which every jaxpr
    counts by its structure, not its identity. `shard_map` and `scan` trace
    a fresh jaxpr at every call: by identity, each of a model's identical
    layers was an executable of its own, compiled once more for XLA's
    analysis on a mesh (a loss of 24 `shard_map` layers: 131 compilations,
    17 of its 20 s of planning). Raises TypeError where a parameter does
    not hash (a callable, such as a custom derivative's rule, counts by
    identity)."""
    key = tuple((name, _param_key(value)) for name, value in sorted(params.items()))
    hash(key)
    return key


def context_key(ctx: Any) -> Any:
    """An equation's context (compute type, PRNG partitioning, mesh, XLA
    metadata) as a key by value: JAX 0.7 on interns contexts, JAX 0.6
    makes one per equation, equal ones compared by identity."""
    values = []
    for name in getattr(type(ctx), "__slots__", ()):
        if name != "__weakref__":
            value = getattr(ctx, name, None)
            values.append(tuple(sorted(value.items())) if isinstance(value, dict) else value)
    return (type(ctx), tuple(values)) if values else ctx


def _param_key(value: Any) -> Any:
    if isinstance(value, (Jaxpr, ClosedJaxpr)):
        return _jaxpr_structure(value)
    if type(value) is tuple and any(isinstance(v, (Jaxpr, ClosedJaxpr)) for v in value):  # a cond's branches
        return tuple(_param_key(v) for v in value)
    return value  # (a jaxpr deeper inside counts by identity: no sharing, never a wrong one)


def _jaxpr_structure(jaxpr: "Jaxpr | ClosedJaxpr") -> _Structure:
    found = _STRUCTURES.get(id(jaxpr))
    if found is not None and found[0]() is jaxpr:
        return found[1]
    inner = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    if inner is not jaxpr:  # a closed jaxpr that wraps an open one (JAX 0.10 and before)
        key = ("closed", _jaxpr_structure(inner), tuple(_Same(c) for c in jaxpr.consts))
    else:  # an open jaxpr; on JAX 0.11, where the two are one class, it carries its constants itself
        key = ("open", *_open_structure(jaxpr), tuple(_Same(c) for c in getattr(jaxpr, "consts", ())))
    structure = _Structure(key)
    ident = id(jaxpr)

    def forget(ref: Any) -> None:
        if _STRUCTURES.get(ident, (None,))[0] is ref:
            _STRUCTURES.pop(ident, None)

    _STRUCTURES[ident] = (weakref.ref(jaxpr, forget), structure)
    return structure


def _open_structure(jaxpr: Jaxpr) -> tuple:
    index: dict[Any, int] = {}

    def bind(var: Any) -> Any:  # (a dropped output too: never read, its index is harmless)
        index[var] = len(index)
        return var.aval

    def read(atom: Any) -> Any:
        if isinstance(atom, Literal):
            array = np.asarray(atom.val)
            return ("literal", array.dtype.str, array.shape, array.tobytes(), getattr(atom.aval, "weak_type", False))
        return index[atom]

    head = (tuple(bind(v) for v in jaxpr.constvars), tuple(bind(v) for v in jaxpr.invars))
    equations = []
    for eqn in jaxpr.eqns:
        ins = tuple(read(a) for a in eqn.invars)
        params = structural_key(eqn.params)
        equations.append((eqn.primitive, params, ins, tuple(bind(v) for v in eqn.outvars), context_key(eqn.ctx), frozenset(eqn.effects)))
    return head, tuple(equations), tuple(read(a) for a in jaxpr.outvars), frozenset(jaxpr.effects)


def open_jaxpr(jaxpr: "Jaxpr | ClosedJaxpr") -> tuple[Jaxpr, list[Any]]:
    if isinstance(jaxpr, ClosedJaxpr):
        return jaxpr.jaxpr, list(jaxpr.consts)
    return jaxpr, []


def jaxpr_function(closed: ClosedJaxpr):
    """A closed jaxpr as a function of its inputs (returning its outputs), traceable by any transformation."""
    try:
        from jax.extend.core import jaxpr_as_fun
    except ImportError:  # pragma: no cover - older JAX
        from jax.core import jaxpr_as_fun
    return jaxpr_as_fun(closed)


@dataclasses.dataclass(frozen=True)
class ScanLayout:
    """A `scan` equation's parameters as jdtr reads them. Its operands are
    `num_consts` loop invariants, `num_carry` carries and the scanned-over
    inputs; its outputs, the final carries and the stacked per-iteration
    outputs; `body` maps (consts, carry, one row of each xs) to (carry, ys)."""

    length: int
    reverse: bool
    num_consts: int
    num_carry: int
    body: ClosedJaxpr


def scan_layout(params: dict) -> Optional[ScanLayout]:
    """The layout of a `scan` equation's `params`, or None where this JAX
    spells it in a way jdtr does not know (jdtr then runs the scan as one
    operator, as it runs any primitive). JAX 0.10 and earlier count the
    constants and carries (`num_consts`, `num_carry`); JAX 0.11 groups the
    operands in `ft_in`, a tree of (consts, carry, xs), whose body is a
    jaxpr that may carry its constants itself (`Jaxpr` and `ClosedJaxpr`
    are one class there)."""
    try:
        length, reverse, body = params["length"], params["reverse"], params["jaxpr"]
        if "num_consts" in params:
            num_consts, num_carry = params["num_consts"], params["num_carry"]
        else:
            consts, carry, _ = params["ft_in"].unpack()
            num_consts, num_carry = len(consts), len(carry)
    except (KeyError, AttributeError, TypeError, ValueError):
        return None
    if not isinstance(body, ClosedJaxpr):  # an open body without constants
        body = ClosedJaxpr(body, [])
    return ScanLayout(int(length), bool(reverse), int(num_consts), int(num_carry), body)


def bind_params(eqn: JaxprEqn) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What `bind` takes besides the operands, as in `eval_jaxpr`: the leading
    sub-functions (none for a plain primitive) and the parameters. JAX 0.8
    and earlier return both from `get_bind_params`; later JAX, the
    parameters alone."""
    got = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(got, tuple):
        subfuns, params = got
        return tuple(subfuns), params
    return (), got


def bind_equation(eqn: JaxprEqn, operands: Sequence[Any], **replaced: Any) -> list[Any]:
    """`eqn` bound on `operands` as `eval_jaxpr` binds it, `replaced` among its parameters; its outputs, a list."""
    subfuns, params = bind_params(eqn)
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*subfuns, *operands, **{**params, **replaced})
    return list(outs) if eqn.primitive.multiple_results else [outs]


def has_jaxpr_params(eqn: JaxprEqn) -> bool:
    """Whether an equation's parameters hold a jaxpr (a scan's body, a
    `cond`'s branches, a call's body): its operands are that jaxpr's inputs."""
    jaxprs = (Jaxpr, ClosedJaxpr)
    return any(
        isinstance(v, jaxprs) or (type(v) is tuple and any(isinstance(x, jaxprs) for x in v)) for v in eqn.params.values()
    )


def bind_with_body(eqn: JaxprEqn, body: ClosedJaxpr, operands: Sequence[Any]) -> list[Any]:
    """Binds `eqn`'s call primitive (one of `CALL_PRIMITIVES`, its other
    parameters kept: a `checkpoint`'s policy and barrier) with `body` in
    place of its jaxpr, on `operands` (`body`'s inputs); its constants
    become leading inputs, as a call's jaxpr takes none of its own. Raises
    (TypeError, ValueError, KeyError) where this JAX spells the call another
    way (JAX 0.11, whose call bodies are closed jaxprs: not yet tested there)."""
    key = CALL_PRIMITIVES[eqn.primitive.name]
    if not isinstance(eqn.params[key], Jaxpr) or isinstance(eqn.params[key], ClosedJaxpr):
        raise TypeError("a call whose body is not an open jaxpr")  # (JAX 0.11: one class; closed calls)
    open_body = body.jaxpr.replace(constvars=[], invars=[*body.jaxpr.constvars, *body.jaxpr.invars])
    return bind_equation(eqn, [*body.consts, *operands], **{key: open_body})


def is_literal(atom: Any) -> bool:
    return isinstance(atom, Literal)


def has_effects(eqn: JaxprEqn) -> bool:
    return bool(eqn.effects)


def has_side_effects(eqn: JaxprEqn) -> bool:
    """Whether an equation of a `shard_map`'s body has effects other than
    naming a mesh axis (a collective's: the `shard_map` has none)."""
    return any(type(e).__name__ != "NamedAxisEffect" for e in eqn.effects)


def aval_nbytes(aval: Any) -> int:
    """Device bytes of an abstract value (or anything with a shape and a
    dtype: a `ShapeDtypeStruct`, an array); PRNG keys count their physical words."""
    import numpy as np

    dtype = aval.dtype
    if isinstance(dtype, np.dtype):  # the common case, asked of every value a trace makes (extended dtypes are not)
        return math.prod(aval.shape) * dtype.itemsize
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        from jax._src import core as _core

        # (`physical_aval` maps an abstract value only: a `ShapeDtypeStruct`
        # of a key came back unchanged, and its dtype is no NumPy dtype.)
        aval = _core.physical_aval(_core.ShapedArray(tuple(aval.shape), dtype))
        dtype = aval.dtype
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def is_array(x: Any) -> bool:
    return isinstance(x, jax.Array)


def concrete_array_type() -> type:
    """The class of a concrete `jax.Array` (never a tracer): a call's
    leaves are checked against it by identity, the cheapest test there is."""
    from jax._src.array import ArrayImpl

    return ArrayImpl


SINGLE_DEVICE = jax.sharding.SingleDeviceSharding


def chosen_default_device() -> Optional[Any]:
    """`jax.default_device`'s device (a context or the config), None where
    none is set: uncommitted work then runs on the default backend's first."""
    chosen = getattr(jax.config, "jax_default_device", None)
    return jax.devices(chosen)[0] if isinstance(chosen, str) else chosen


def default_device() -> Any:
    """Where JAX runs uncommitted work."""
    chosen = chosen_default_device()
    return chosen if chosen is not None else jax.devices()[0]


@functools.lru_cache(maxsize=None)
def first_device(platform: str) -> Any:
    """The first device of a platform (backends do not change in a process)."""
    return jax.devices(platform)[0]


def one_device(sharding: Any) -> bool:
    """Whether a sharding is a single device's, without asking for its device set (a set built per call)."""
    return type(sharding) is SINGLE_DEVICE or len(sharding.device_set) == 1


def is_batched(x: Any) -> bool:
    """Whether `x` is a tracer of a `vmap` under way (the innermost trace)."""
    from jax._src.interpreters import batching

    return isinstance(x, batching.BatchTracer)


def is_tracer(x: Any) -> bool:
    """Whether `x` is a tracer of some transformation (jit, vmap, grad)."""
    return isinstance(x, jax.core.Tracer)


def staging() -> bool:
    """Whether operations are staged into a program now rather than run: under
    `jit`, or in a `scan`, `cond` or `checkpoint` body, where even an
    operation on concrete arrays gives a tracer. (Under `vmap` or `grad`
    alone, one on arrays they do not trace still runs.)"""
    from jax._src import core

    if isinstance(core.trace_ctx.trace, core.EvalTrace):  # (the top level: every jdtr.grad call asks)
        return False
    return is_tracer(jax.lax.neg(np.float32(0)))


def traced_sharding(x: Any) -> Optional[Any]:
    """The sharding a tracer's type carries (a mesh with `Explicit` axes),
    over an abstract mesh: the context's (`jax.set_mesh`), or, where none is
    set, one that `planning_mesh` makes concrete to compile for. None where
    the type says nothing (`Auto` axes) or the context sets another mesh."""
    if not sharded_type(x):
        return None
    sharding = x.aval.sharding
    context = _context_mesh()
    if context is not None and dict(context.shape) != dict(sharding.mesh.shape):
        return None
    return sharding


def _context_mesh() -> Optional[Any]:
    """The abstract mesh the context sets (`jax.set_mesh`), if any."""
    get_abstract_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
    context = get_abstract_mesh() if get_abstract_mesh is not None else None
    return None if context is None or getattr(context, "empty", True) else context


def on_abstract_mesh(sharding: Any) -> bool:
    """Whether a sharding names a mesh of no devices (a type's under a trace),
    for which nothing can be compiled or placed."""
    mesh = getattr(sharding, "mesh", None)
    return mesh is not None and not isinstance(mesh, jax.sharding.Mesh)


def planning_mesh(specs: Iterable[Any]) -> Optional[Any]:
    """Where `specs` are sharded over an abstract mesh (arrays on a mesh with
    `Explicit` axes, traced by `jax.jit`): a concrete mesh of its shape,
    names and axis types over this process's first devices, to plan on.
    Under a trace JAX gives no concrete mesh (`jax.sharding.get_mesh`
    refuses), even where `jax.set_mesh` set one; XLA's bytes per device for
    a partitioned step are the same on any devices of one kind, and the
    step the caller's jit compiles is its own. None otherwise."""
    for spec in specs:
        sharding = getattr(spec, "sharding", None)
        if not on_abstract_mesh(sharding) or getattr(sharding.mesh, "empty", True):
            continue
        mesh = sharding.mesh
        platform = getattr(getattr(mesh, "abstract_device", None), "platform", None)  # (the mesh's kind of device)
        try:
            devices = jax.devices(platform)
        except RuntimeError:  # a platform this process has no backend for
            devices = jax.devices()
        if len(devices) < mesh.size:
            return None
        try:
            return jax.make_mesh(
                tuple(mesh.axis_sizes), tuple(mesh.axis_names), axis_types=tuple(mesh.axis_types),
                devices=devices[: mesh.size],
            )
        except TypeError:  # a JAX whose `make_mesh` takes no axis types: planned as before, whole arrays
            return None
    return None


def explicit_mesh(leaves: Iterable[Any]) -> Optional[Any]:
    """The mesh with `Explicit` axes (the default of `jax.make_mesh` since
    JAX 0.7) that a concrete array is sharded over, if any: its arrays'
    shardings are part of their types, and JAX evaluates an operation on
    such types (one that makes a sharded value from none, a broadcast
    constant) only with that mesh set as the context's."""
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    if explicit is None:
        return None
    single = SINGLE_DEVICE
    for leaf in leaves:
        if not is_array(leaf):
            continue
        sharding = leaf.sharding
        if type(sharding) is single:
            continue  # no mesh (the common case: checked per leaf, per call)
        mesh = getattr(sharding, "mesh", None)
        if explicit in tuple(getattr(mesh, "axis_types", ()) or ()):
            return mesh
    return None


def mesh_context(mesh: Optional[Any]):
    """`mesh` set as the context's mesh (`jax.set_mesh`), unless it is
    already or there is none."""
    setter = getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh", None)
    if mesh is None or setter is None:
        return contextlib.nullcontext()
    get_abstract_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
    current = get_abstract_mesh() if get_abstract_mesh is not None else None
    if current is not None and not getattr(current, "empty", True) and current == getattr(mesh, "abstract_mesh", None):
        return contextlib.nullcontext()
    return setter(mesh)


def sharded_type(x: Any) -> bool:
    """Whether a traced value's type says it is sharded (`Explicit` axes)."""
    spec = getattr(getattr(getattr(x, "aval", None), "sharding", None), "spec", None)
    return spec is not None and any(p is not None for p in spec)


def traced_mesh_devices(x: Any) -> int:
    """Devices of the mesh a tracer's type names (1 where it names none)."""
    mesh = getattr(getattr(getattr(x, "aval", None), "sharding", None), "mesh", None)
    try:
        return int(mesh.size) if mesh is not None and not mesh.empty else 1
    except (AttributeError, TypeError):
        return 1


def aval_of(x: Any) -> Any:
    """The abstract value (shape, dtype, weak type) of a concrete value."""
    return jax.typeof(x) if hasattr(jax, "typeof") else jax.core.get_aval(x)


def varying_axes(aval: Any) -> Optional[frozenset]:
    """The mesh axes along which a value in a `shard_map`'s body varies (its
    type, checked with `check_vma=True`); None where the type does not say
    (JAX 0.7-0.9 name it `vma`, later JAX `mat.varying`)."""
    found = getattr(aval, "vma", None)
    if found is None:
        found = getattr(getattr(aval, "mat", None), "varying", None)
    return None if found is None else frozenset(found)


def pvary(x: Any, axes: tuple) -> Any:
    """`x` cast to vary along the manual mesh `axes` (JAX 0.6-0.9 `pvary`, later `pcast`)."""
    return jax.lax.pvary(x, axes) if hasattr(jax.lax, "pvary") else jax.lax.pcast(x, axes, to="varying")


def shard_map(fn, mesh: Any, in_specs: Any, out_specs: Any):
    """`jax.shard_map(fn)` over all of `mesh`'s axes, its types checked."""
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=True)


def constrain(x: Any, sharding: Any) -> Any:
    """`x` placed by `sharding` inside a traced function: `jax.reshard` on a
    mesh with `Explicit` axes (whose types must match), else a sharding
    constraint."""
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    reshard = getattr(jax, "reshard", None) or getattr(jax.sharding, "reshard", None)
    if reshard is not None and explicit is not None and explicit in tuple(getattr(sharding.mesh, "axis_types", ()) or ()):
        return reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)


def rebound_under_jvp(
    fn: Any, structs: Sequence[Any], differentiable: Sequence[bool], name: str, outputs: int
) -> list[tuple[tuple, tuple]]:
    """The input avals, and the avals of the outputs past the first
    `outputs`, of each `name` equation that JAX's derivative of `fn` (one
    primitive, on `structs`) binds with more than `outputs` outputs:
    values its rule makes beside the primal ones and keeps for the backward
    pass, which no `checkpoint_name` can reach (a `sort`'s permutation, from
    an iota sorted with the keys). A policy can save them only by the
    primitive and the avals it is shown (`SavePolicy.signatures`)."""

    def tangents_of(*xs):
        floats = [x for x, d in zip(xs, differentiable) if d]

        def of_floats(*fs):
            it = iter(fs)
            return fn(*(next(it) if d else x for x, d in zip(xs, differentiable)))

        return jax.jvp(of_floats, floats, floats)

    jaxpr = jax.make_jaxpr(tangents_of)(*structs).jaxpr
    return [
        (tuple(v.aval for v in eqn.invars), tuple(v.aval for v in eqn.outvars[outputs:]))
        for eqn in jaxpr.eqns
        if eqn.primitive.name == name and len(eqn.outvars) > outputs
    ]




def key_data_shape(dtype: Any) -> Optional[tuple]:
    """The words of one typed PRNG key of `dtype` (its implementation's
    `key_shape`); None where this JAX does not keep the implementation in
    the dtype (then no key of it can be made from its type alone)."""
    return getattr(getattr(dtype, "_impl", None), "key_shape", None)


def zero_keys(shape: tuple, dtype: Any) -> Any:
    """Typed PRNG keys of `dtype` (its own implementation) and `shape`, of
    zero bits (`key_data_shape` must know the dtype)."""
    words = key_data_shape(dtype)
    return jax.random.wrap_key_data(np.zeros((*shape, *words), np.uint32), impl=dtype._impl)
