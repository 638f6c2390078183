"""A `shard_map`'s body as equations DTR can decide one by one.

A `shard_map` is one equation of the traced step, and its differentiation
makes two: the forward body, which hands every residual to the backward
body at once, and the backward body, which needs them all at once. DTR can
evict a residual between the two, but replaying it replays the whole
forward body, and the backward body cannot start without every one: a loss
written inside one `shard_map` had no plan below its own peak.

`jdtr.grad` therefore inlines the body of a `shard_map` over all of its
mesh's axes: each equation of the body becomes a `shard_map` of its own
over the same mesh, so that the values between them are ordinary values of
the program (arrays over the mesh), each evicted and replayed alone. A
per-device value of the body (shape `s`) is the global array of shape
`(k, *s)` whose leading axis is split over the axes along which it varies
(`k` their devices; 1 for a value the same on every device), so each
device holds exactly its block: the bytes per device are the body's.

Which axes a value varies along is its type in the body (JAX's `vma`,
checked by `shard_map(check_vma=True)`, the default), so each equation
runs with its inputs typed as they were traced and its collectives see the
types they were bound for. Without those types (`check_vma=False`, older
JAX) or with axes left to the partitioner, the `shard_map` stays one
equation. Every device runs the same program, so a replayed collective
meets its peers on every device, as the whole `shard_map`'s replay did.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax

from . import _jax_core
from .executable import Executable, binder, bound_key, const_key, executable
from .program import Const


def inlinable(eqn: Any) -> bool:
    """Whether `eqn` is a `shard_map` whose body can be inlined: manual over
    all of its mesh's axes, its body's types saying how each value varies."""
    if eqn.primitive.name != "shard_map":
        return False
    params = eqn.params
    if not {"mesh", "in_specs", "out_specs", "jaxpr"} <= params.keys() or not params.get("check_vma", False):
        return False
    mesh, body = params["mesh"], params["jaxpr"]
    manual = params.get("newly_manual_axes", params.get("manual_axes"))
    if manual is None or set(manual) != set(mesh.axis_names) or getattr(body, "constvars", None):
        return False
    if any(_jax_core.is_literal(v) for v in body.outvars):
        return False
    atoms = [*body.invars, *body.outvars, *(v for e in body.eqns for v in (*e.invars, *e.outvars))]
    return all(_jax_core.is_literal(v) or _jax_core.varying_axes(v.aval) is not None for v in atoms)


def has_inlinable(jaxpr: Any) -> bool:
    """Whether `jaxpr` (or a call inside it) holds a `shard_map` `inlinable` says yes to."""
    for eqn in jaxpr.eqns:
        if inlinable(eqn):
            return True
        call = _jax_core.call_body(eqn)
        if call is not None and has_inlinable(call[0]):
            return True
    return False


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the values of one `shard_map`'s body are laid out as global arrays."""

    mesh: Any

    def spec(self, aval: Any) -> Any:
        """The leading axis split over the axes the value varies along."""
        varying = _jax_core.varying_axes(aval)
        axes = tuple(a for a in self.mesh.axis_names if a in varying)
        return jax.sharding.PartitionSpec(axes) if axes else jax.sharding.PartitionSpec()

    def sharding(self, aval: Any) -> jax.sharding.NamedSharding:
        """Where a value of the body lies, laid out: the `shard_map`s that make it fix it."""
        return jax.sharding.NamedSharding(self.mesh, self.spec(aval))

    def global_aval(self, aval: Any) -> jax.ShapeDtypeStruct:
        varying = _jax_core.varying_axes(aval)
        k = math.prod(self.mesh.shape[a] for a in self.mesh.axis_names if a in varying)
        return jax.ShapeDtypeStruct((k, *aval.shape), aval.dtype, weak_type=bool(getattr(aval, "weak_type", False)))

    def enter(self, in_spec: Any, aval: Any) -> Executable:
        """The executable that lays out an argument of the `shard_map` (split by `in_spec`) as its body sees it."""
        out_spec = self.spec(aval)
        key = ("jdtr.manual.enter", self.mesh, in_spec, out_spec)
        mesh = self.mesh

        def build():
            # An argument made on one device (a cotangent broadcast from the
            # loss) is placed by `in_spec` first: on `Explicit` axes its type
            # must match.
            laid_out = _jax_core.shard_map(lambda block: block[None], mesh, (in_spec,), out_spec)
            return lambda a: laid_out(_jax_core.constrain(a, jax.sharding.NamedSharding(mesh, in_spec)))

        return executable(key, build, multiple_results=False)

    def leave(self, aval: Any, out_spec: Any) -> Executable:
        """The executable that makes a body's output the `shard_map`'s (split by `out_spec`)."""
        in_spec = self.spec(aval)
        key = ("jdtr.manual.leave", self.mesh, in_spec, out_spec)
        build = lambda: _jax_core.shard_map(lambda stacked: stacked[0], self.mesh, (in_spec,), out_spec)  # noqa: E731
        return executable(key, build, multiple_results=False)

    def equation(self, eqn: Any, inputs: Sequence[Any]) -> Executable:
        """The executable of one equation of the body, over the mesh.

        `inputs` are its atoms: `Const`s are closed over; the others are
        passed laid out (their leading axis is this device's)."""
        literals = tuple(a.value if isinstance(a, Const) else None for a in inputs)
        is_const = tuple(isinstance(a, Const) for a in inputs)
        in_specs = tuple(self.spec(v.aval) for v, c in zip(eqn.invars, is_const) if not c)
        out_specs = [self.spec(v.aval) for v in eqn.outvars]
        multiple = eqn.primitive.multiple_results

        def build():  # on a cache miss only: a hit needs the key alone
            bind = binder(eqn, inputs)

            def per_device(*blocks):
                out = bind([block[0] for block in blocks])
                return [o[None] for o in (out if multiple else [out])]

            return _jax_core.shard_map(per_device, self.mesh, in_specs, out_specs)

        operands = (
            self.mesh,
            tuple(const_key(a) if c else None for a, c in zip(literals, is_const)),
            tuple((tuple(v.aval.shape), v.aval.dtype, _jax_core.varying_axes(v.aval)) for v in eqn.invars),
        )
        key = bound_key("jdtr.manual", eqn, operands)
        return executable(key, build, multiple_results=True)
