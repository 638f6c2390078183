"""How a call's arguments enter a trace: one flattening for `grad`, `plan` and `nnx`.

A function jdtr differentiates is traced per *argument structure*: the
pytree of the call, each array leaf's shape and dtype, and the value of
every non-array leaf of an argument not differentiated (static, as under
`jax.jit` with `static_argnums`: part of the cache key). `flatten_arguments`
reads a call as that structure (`Arguments`), checking what `jax.grad`
would reject, and `Arguments.bind` turns a function of the original
arguments into one of the traced leaves alone.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import _jax_core


@dataclass(frozen=True)
class Static:
    """A non-array leaf of a non-differentiated argument: part of the cache key."""

    value: Any


Spec = Union[jax.ShapeDtypeStruct, Static]


def argnums_tuple(argnums: Union[int, Sequence[int]]) -> tuple[int, ...]:
    """`argnums` as a tuple of ints, checked as `jax.grad` checks it."""
    if isinstance(argnums, (int, np.integer)) and not isinstance(argnums, bool):
        return (int(argnums),)
    if isinstance(argnums, (tuple, list)) and all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in argnums):
        if len(argnums) == 0:
            raise ValueError("argnums must not be empty")
        return tuple(int(a) for a in argnums)
    raise TypeError(f"argnums must be an int or a tuple of ints; got {argnums!r}")


def describe(path: Any) -> str:
    """'x' style names for error messages: args[0]['w'] -> positional 0 ['w']."""
    kind, rest = path[0].idx, path[1:]
    if kind == 0:
        head = f"{rest[0].idx}"
        tail = jax.tree_util.keystr(tuple(rest[1:]))
        return f"{head}{tail}" if tail else head
    return f"{jax.tree_util.keystr(tuple(rest))} (keyword)"


class _Where:
    """'argument 0['w']', made when an error message asks for it: naming
    every leaf on every call would cost more than the rest of the check."""

    __slots__ = ("path",)

    def __init__(self, path: Any):
        self.path = path

    def __str__(self) -> str:
        return f"argument {describe(self.path)}"


class _WhereAt(_Where):
    """`_Where` of the leaf at `index` of a call's `(args, kwargs)`, whose path is found only when asked for."""

    __slots__ = ("tree", "index")

    def __init__(self, tree: Any, index: int):
        self.tree, self.index = tree, index

    def __str__(self) -> str:
        path, _ = jax.tree_util.tree_flatten_with_path(self.tree)[0][self.index]
        return f"argument {describe(path)}"


def leaf_spec(leaf: Any, differentiated: bool, where: Any) -> Spec:
    """How a concrete leaf enters the trace: an abstract array, or a static value."""
    if _jax_core.is_tracer(leaf):
        raise TypeError(
            f"jdtr.grad runs eagerly and cannot be traced by jit, vmap or another transformation, but {where} "
            "is a tracer. Use jdtr.remat_grad inside jit, or call jdtr.grad outside the transformation."
        )
    if _jax_core.is_array(leaf):
        return _concrete_array_spec(leaf, where)
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
    return Static(leaf)


def _concrete_array_spec(leaf: Any, where: Any) -> jax.ShapeDtypeStruct:
    """The spec of a concrete array; an error for a deleted one. (`jdtr.grad`'s
    own flattening does the same inline, on its hot path.)"""
    if leaf.is_deleted():
        raise _deleted(where)
    return _live_array_spec(leaf)


def _live_array_spec(leaf: Any) -> jax.ShapeDtypeStruct:
    """The spec of a concrete array known not to be deleted."""
    return _array_spec(leaf.shape, leaf.dtype, getattr(leaf, "weak_type", False), _placement(leaf.sharding))


def _deleted(where: Any) -> ValueError:
    return ValueError(f"{where} is a deleted jax.Array; its buffer was freed before the call")


def _placement(sharding: Any) -> Any:
    """The sharding a spec carries: an array sharded over several devices runs
    there, its values as XLA shards them, so its sharding is part of the
    structure; a single device's is not."""
    return None if _jax_core.one_device(sharding) else sharding


def _array_spec(shape: tuple, dtype: Any, weak_type: bool, sharding: Any) -> jax.ShapeDtypeStruct:
    """The spec of an array of this type, one object per type: a call's
    structure is made on every call, and a spec made once is compared by
    identity when the structure is looked up (a model's 65 leaves: 0.1 ms a call)."""
    key = (shape, dtype, weak_type, sharding)
    spec = _SPECS.get(key)
    if spec is None:
        if len(_SPECS) >= _MAX_SPECS:  # shapes that keep changing (a dynamic model): start again
            _SPECS.clear()
        spec = _SPECS.setdefault(key, jax.ShapeDtypeStruct(shape, dtype, weak_type=weak_type, sharding=sharding))
    return spec


_SPECS: dict = {}
_MAX_SPECS = 4096


def _abstract_spec(leaf: Any) -> Optional[jax.ShapeDtypeStruct]:
    """The spec of a leaf known by its shape alone (a tracer under jit or
    vmap, a `ShapeDtypeStruct`); None for a concrete leaf."""
    if _jax_core.is_tracer(leaf):
        weak_type = getattr(leaf.aval, "weak_type", False)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=weak_type, sharding=_jax_core.traced_sharding(leaf))
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=leaf.weak_type, sharding=leaf.sharding)
    return None


def unseen_mesh(args: tuple, kwargs: dict) -> int:
    """Devices of a mesh that traced arguments are on but whose shardings
    their types do not say (a mesh with `Auto` axes under `jax.jit`): a
    plan for them sees whole arrays. 1 where there is none."""
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    if any(_jax_core.is_tracer(leaf) and _jax_core.traced_sharding(leaf) is not None for leaf in leaves):
        return 1
    return max((_jax_core.traced_mesh_devices(leaf) for leaf in leaves if _jax_core.is_tracer(leaf)), default=1)


def on_planning_mesh(arguments: "Arguments") -> "Arguments":
    """`arguments` with the shardings of their types over an abstract mesh
    (`jax.jit` over arrays on an `Explicit` mesh, with `jax.set_mesh` or
    without) placed on a concrete mesh of its shape
    (`_jax_core.planning_mesh`): a plan's programs are then normalised and
    measured per device, and autotuned on example inputs placed as the
    arguments are, as for the arrays themselves. Unchanged otherwise."""
    mesh = _jax_core.planning_mesh(arguments.traced_specs)
    if mesh is None:
        return arguments

    def placed(spec):
        if isinstance(spec, Static):
            return spec
        # (A type that says nothing is replicated over the jit's mesh, as its
        # concrete array would be: a dot of such a weight and a sharded batch
        # must see both on one mesh.)
        sharding = getattr(spec, "sharding", None)
        concrete = jax.sharding.NamedSharding(mesh, sharding.spec if sharding is not None else jax.sharding.PartitionSpec())
        return _array_spec(tuple(spec.shape), spec.dtype, spec.weak_type, concrete)

    return dataclasses.replace(arguments, specs=tuple(placed(s) for s in arguments.specs))


def _check_device(leaf: Any, where: Any, devices: Optional[tuple[frozenset, Any]]) -> Optional[tuple[frozenset, Any]]:
    """Every operation runs on the devices whose memory the budget bounds
    (each device's): committed arguments must all be on them, one device or
    one mesh's (uncommitted ones follow, as under jit). Returns the (devices,
    argument) seen first."""
    if not _jax_core.is_array(leaf) or not getattr(leaf, "committed", False):
        return devices
    here = frozenset(leaf.sharding.device_set)
    if devices is None:
        return here, where
    if here != devices[0]:
        raise ValueError(
            f"{where} is on {_places(here)} but {devices[1]} is on {_places(devices[0])}; jdtr runs every "
            "operation on the arguments' devices, under a budget per device, so put all arguments on the same "
            "device (jax.device_put(x, device)) or shard them over the same mesh (jax.sharding.NamedSharding)"
        )
    return devices


def _places(devices: frozenset) -> str:
    if len(devices) == 1:
        return str(next(iter(devices)))
    ordered = sorted(devices, key=lambda d: d.id)
    return f"{len(devices)} devices ({', '.join(map(str, ordered[:4]))}{', ...' if len(ordered) > 4 else ''})"


class StructureKey:
    """A call's structure as a cache key, hashed once: a trace cache looks a
    key up twice a call (found, then moved to the end), and hashing 65
    leaves' specs took 17 µs each time."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple):
        self.parts, self._hash = parts, hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, StructureKey) and self._hash == other._hash and self.parts == other.parts
        )


@dataclass(frozen=True, eq=False)
class Arguments:
    """A call's argument structure: what a trace depends on.

    Attributes:
      treedef: the pytree of `(args, kwargs)`.
      specs: per leaf, an abstract array or a `Static` value.
      differentiated: per leaf, whether it belongs to a differentiated argument.
    """

    treedef: Any
    specs: tuple[Spec, ...]
    differentiated: tuple[bool, ...]
    # What `jdtr.grad`'s flattening also learns of a call (the defaults say
    # nothing): every leaf is a concrete array (the leaves are the inputs as
    # they are), and whether a leaf's sharding may carry a mesh (one that is
    # not a single device's: `explicit_mesh` has something to find).
    arrays_only: bool = field(default=False, compare=False)
    meshed: bool = field(default=True, compare=False)

    @functools.cached_property
    def key(self) -> "StructureKey":
        """What traces are cached by."""
        return StructureKey((self.treedef, self.specs))

    @property
    def traced_specs(self) -> list[jax.ShapeDtypeStruct]:
        """The specs of the leaves that are traced (every one but the statics)."""
        return [s for s in self.specs if not isinstance(s, Static)]

    @property
    def traced_argnums(self) -> tuple[int, ...]:
        """Positions, among the traced leaves, of the differentiated ones."""
        flags = [d for d, s in zip(self.differentiated, self.specs) if not isinstance(s, Static)]
        return tuple(i for i, d in enumerate(flags) if d)

    def traced_leaves(self, args: tuple, kwargs: dict) -> list:
        """The leaves of a call with this structure that are traced."""
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        return [x for x, s in zip(leaves, self.specs) if not isinstance(s, Static)]

    def unflatten(self, traced: Sequence[Any], statics: bool = True) -> tuple[tuple, dict]:
        """`(args, kwargs)` of a call with this structure from its traced
        leaves; the statics filled in, or None with `statics=False` (a
        structure for per-leaf results, such as gradients)."""
        it = iter(traced)
        leaves = [(s.value if statics else None) if isinstance(s, Static) else next(it) for s in self.specs]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def bind(self, fun: Callable) -> Callable:
        """`fun(*args, **kwargs)` as a function of the traced leaves, the statics filled in."""

        @functools.wraps(fun)  # (JAX's errors about what `fun` returns name it, not `flat`)
        def flat(*traced):
            args, kwargs = self.unflatten(traced)
            return fun(*args, **kwargs)

        return flat


def flatten_arguments(
    argnums: Union[int, Sequence[int]], args: tuple, kwargs: dict, *, eager: bool
) -> tuple[list, Arguments]:
    """The leaves of a call and its argument structure.

    Args:
      argnums: the differentiated positional arguments.
      eager: True for `jdtr.grad`, which runs on concrete arrays: a tracer
        is an error, and committed arrays must share one device or one mesh. False for
        planning, where tracers and `ShapeDtypeStruct`s count by shape.
    """
    argnum_tuple = argnums_tuple(argnums)
    for i in argnum_tuple:
        if i >= len(args) or i < -len(args):
            needed = max(a + 1 if a >= 0 else -a for a in argnum_tuple)  # (a negative index counts from the end)
            raise TypeError(
                f"differentiating with respect to argnums={argnums} requires at least {needed} "
                f"positional arguments to be passed by the caller, but got only {len(args)} positional arguments"
            )
    diff = {i % len(args) for i in argnum_tuple}
    if eager:
        if _jax_core.staging():
            # Its arrays may be concrete (closed over), but what it would run is
            # staged into the caller's program: freeing and counting buffers means nothing there.
            raise TypeError(
                "jdtr.grad runs eagerly and cannot be called inside jit, or in a scan, cond or checkpoint body, "
                "even on arrays that are not traced. Use jdtr.remat_grad inside jit, or call jdtr.grad outside it."
            )
        return _flatten_concrete(args, kwargs, diff)
    paths, treedef = jax.tree_util.tree_flatten_with_path((args, kwargs))
    leaves, specs, flags = [], [], []
    for path, leaf in paths:
        differentiated = path[0].idx == 0 and path[1].idx in diff
        abstract = _abstract_spec(leaf)
        leaves.append(leaf)
        flags.append(differentiated)
        spec = abstract if abstract is not None else leaf_spec(leaf, differentiated, _Where(path))
        if abstract is None and _jax_core.is_array(leaf) and getattr(leaf, "committed", False):
            # Planning compiles and times steps on the call's own arrays: for
            # arrays committed to a device (or sharded), the steps must be
            # compiled for their placement, which is part of the cache key.
            spec = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=spec.weak_type, sharding=leaf.sharding)
        specs.append(spec)
    return leaves, Arguments(treedef, tuple(specs), tuple(flags))


_ARRAY = _jax_core.concrete_array_type()


def _flatten_concrete(args: tuple, kwargs: dict, diff: set) -> tuple[list, Arguments]:
    """`flatten_arguments` of a `jdtr.grad` call. On every call of a training
    loop, so its arrays take a path of their own: a class checked by
    identity, their spec found by their abstract value and sharding (objects
    an executable's outputs share from call to call), their devices compared
    only where the sharding object differs from the one checked before, and
    no leaf named unless an error says so (65 leaves: 120 µs a call at first,
    53 after; `benchmarks/call_overhead.py`)."""
    tree = (args, kwargs)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    flags: list[bool] = []  # a differentiated argument's leaves, contiguous in the flat order
    for i, arg in enumerate(treedef.children()[0].children()):
        flags += [i in diff] * arg.num_leaves
    flags += [False] * (len(leaves) - len(flags))  # the keyword arguments'
    specs: list[Spec] = []
    devices: Optional[tuple[frozenset, Any]] = None
    checked = None  # the sharding whose devices were compared last
    arrays_only, meshed = True, False
    for index, leaf in enumerate(leaves):
        if type(leaf) is _ARRAY:  # `_concrete_array_spec`, inline
            if leaf.is_deleted():
                raise _deleted(_WhereAt(tree, index))
            sharding = leaf.sharding
            typed = _TYPED.get((leaf.aval, sharding))
            if typed is None:
                typed = _typed(leaf, sharding)
            specs.append(typed[0])
            meshed = meshed or typed[1]
            if sharding is not checked and leaf.committed:
                devices, checked = _check_device(leaf, _WhereAt(tree, index), devices), sharding
            continue
        arrays_only = False
        meshed = meshed or _jax_core.is_array(leaf)  # (another kind of array: `explicit_mesh` looks)
        where = _WhereAt(tree, index)
        specs.append(leaf_spec(leaf, flags[index], where))
        devices = _check_device(leaf, where, devices)
    return leaves, Arguments(treedef, tuple(specs), tuple(flags), arrays_only, meshed)


def _typed(leaf: Any, sharding: Any) -> tuple[jax.ShapeDtypeStruct, bool]:
    """A concrete array's spec, and whether its sharding may carry a mesh,
    by its abstract value and sharding (`_TYPED`)."""
    if len(_TYPED) >= _MAX_SPECS:  # types that keep changing (a dynamic model): start again
        _TYPED.clear()
    return _TYPED.setdefault((leaf.aval, sharding), (_live_array_spec(leaf), type(sharding) is not _jax_core.SINGLE_DEVICE))


_TYPED: dict = {}


def concrete_leaves(arguments: Arguments, args: tuple, kwargs: dict) -> Optional[list]:
    """The call's traced leaves as they are, when none is abstract (a tracer
    or a `ShapeDtypeStruct`): what a compiled step takes."""
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    if any(_abstract_spec(leaf) is not None for leaf in leaves):
        return None
    return [leaf for leaf, spec in zip(leaves, arguments.specs) if not isinstance(spec, Static)]


def run_inputs(leaves: list, arguments: Arguments) -> tuple[list, list]:
    """A `jdtr.grad` call's input arrays (its traced leaves), and which of
    them jdtr made (from NumPy arrays and Python scalars: the run may free those)."""
    if arguments.arrays_only:  # (a training loop's call: each leaf an input, the caller's)
        return leaves, [False] * len(leaves)
    inputs, owned = [], []
    for leaf, spec in zip(leaves, arguments.specs):
        if type(spec) is Static:
            continue
        if _jax_core.is_array(leaf):
            inputs.append(leaf)
            owned.append(False)
        else:
            inputs.append(jnp.asarray(leaf, dtype=spec.dtype))
            owned.append(True)
    return inputs, owned
