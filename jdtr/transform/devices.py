"""Per-device memory of a sharded step, against a plan's memory model.

With arguments sharded over a mesh (`jax.sharding.NamedSharding`), the
step that is compiled is XLA's partitioned program, and its
`memory_analysis()` counts one device's bytes: a budget means bytes per
device. On a concrete mesh (arrays, `ShapeDtypeStruct`s with shardings)
the plan's programs are normalised with the arguments' shardings
(`placements`): every value is placed as XLA shards it, equation by
equation, and counted on one device, so the model is per device already
(`placed_scale` maps it one to one). Under `jax.jit` a mesh's shardings are
types over an abstract mesh, and no equation can be compiled on its own;
there the model counts every value whole, as on one device, and a
`DeviceScale` relates the two: the arguments, constants and gradients are
counted exactly, per device, from their shardings; everything else
(activations, residuals, temporaries) is taken to shrink by one factor,
measured on the step without remat, as XLA's bytes per device over its
bytes on one device. Either way, where the model is off for a plan (XLA
partitions the whole step, not one equation at a time), the planner's
compile-and-measure loop corrects the target, as it does for XLA's buffer
assignment on one device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import jax
import numpy as np

from . import _jax_core


def run_devices(inputs: Sequence[Any]) -> list:
    """The devices a run on `inputs` is placed on: the committed arguments'
    (all on one device, or one mesh's: `arguments._check_device`), else
    where JAX puts uncommitted work."""
    committed = next((a for a in inputs if _jax_core.is_array(a) and getattr(a, "committed", False)), None)
    return list(committed.sharding.device_set) if committed is not None else [_jax_core.default_device()]


def is_sharded(specs: Sequence) -> bool:
    """Whether any spec is placed on more than one device."""
    return any(_devices(getattr(s, "sharding", None)) > 1 for s in specs)


def _devices(sharding) -> int:
    if sharding is None:
        return 1
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None:  # a NamedSharding, on a concrete or an abstract mesh (a type under jit)
        return int(mesh.size)
    return len(sharding.device_set)


def spread(sharding: Any) -> Optional[Any]:
    """`sharding` where it places an array over several devices, else None:
    a value on one device runs where JAX puts uncommitted work, as before."""
    return sharding if _devices(sharding) > 1 else None


def replicated(sharding: Any) -> Any:
    """The whole array on every device `sharding` places over."""
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or _jax_core.on_abstract_mesh(sharding):
        mesh = jax.sharding.Mesh(np.array(sorted(sharding.device_set, key=lambda d: d.id)), ("devices",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def placements(specs: Sequence) -> Optional[list]:
    """The shardings a program of `specs` is normalised with, to place its
    values per device (`normalize`): where they are sharded over a concrete
    mesh; None otherwise (one device, or the abstract mesh of a type under
    `jax.jit`, for which no equation can be compiled on its own)."""
    shardings = [getattr(s, "sharding", None) for s in specs]
    if not is_sharded(specs):
        return None
    if any(_jax_core.on_abstract_mesh(s) for s in shardings):
        return None
    return shardings


def device_bytes(spec) -> int:
    """One device's bytes of a (possibly sharded) array: its largest shard."""
    sharding = getattr(spec, "sharding", None)
    shape = tuple(spec.shape)
    if sharding is not None and hasattr(sharding, "shard_shape"):
        shape = tuple(sharding.shard_shape(shape))
    dtype = spec.dtype
    # NumPy dtypes directly: the debug check asks this of every live array at every step.
    itemsize = dtype.itemsize if isinstance(dtype, np.dtype) else _jax_core.aval_nbytes(jax.ShapeDtypeStruct((), dtype))
    return math.prod(shape) * itemsize


def unsharded(spec) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(spec.shape, spec.dtype, weak_type=getattr(spec, "weak_type", False))


@dataclass(frozen=True)
class DeviceScale:
    """Bytes per device against the plan's model of whole values.

    `fixed_model` / `fixed_device`: the arguments, constants and gradients,
    whole and on one device; `activations`: one device's share of every
    other byte."""

    fixed_model: int
    fixed_device: int
    activations: float

    def to_model(self, per_device: float) -> float:
        """The model's bytes for a step of `per_device` bytes per device."""
        return self.fixed_model + max(per_device - self.fixed_device, 0.0) / self.activations

    def to_device(self, model: float) -> float:
        """The bytes per device of a step of `model` bytes in the model (`to_model`'s inverse)."""
        return self.fixed_device + max(model - self.fixed_model, 0.0) * self.activations

    def shrink(self, model_target: float, per_device_target: float, compiled: float) -> float:
        """The model's target after a plan for `model_target` compiled to
        `compiled` bytes per device, over a budget of `per_device_target`:
        its activations scaled by what they must lose, a little more, as on
        one device (or may gain, where the plan left room)."""
        room = max(per_device_target - self.fixed_device, 0.0)
        used = max(compiled - self.fixed_device, 1.0)
        return self.fixed_model + (model_target - self.fixed_model) * room / used * 0.97


def placed_scale(specs: Sequence, differentiated: Sequence[bool], consts_bytes: int) -> DeviceScale:
    """The scale of a model whose values are placed (`placements`): it
    counts bytes per device already, so it maps one to one; its fixed bytes
    are the arguments', the gradients' (sharded as their arguments) and the
    constants', per device."""
    local = [device_bytes(s) for s in specs]
    fixed = sum(local) + sum(b for b, d in zip(local, differentiated) if d) + consts_bytes
    return DeviceScale(fixed, fixed, 1.0)


def device_scale(
    specs: Sequence, differentiated: Sequence[bool], consts_bytes: int, unconstrained_device: int,
    unconstrained_whole: int,
) -> Optional[DeviceScale]:
    """The scale of a step over sharded `specs` (None on one device): from
    its arguments' shardings (gradients sharded as their arguments, as
    `jax.grad` gives them) and its compiled bytes per device and whole."""
    if not is_sharded(specs):
        return None
    whole = [_jax_core.aval_nbytes(s) for s in specs]
    local = [device_bytes(s) for s in specs]
    fixed_model = sum(whole) + sum(b for b, d in zip(whole, differentiated) if d) + consts_bytes
    fixed_device = sum(local) + sum(b for b, d in zip(local, differentiated) if d) + consts_bytes
    rest_whole = unconstrained_whole - fixed_model
    rest_device = unconstrained_device - fixed_device
    activations = rest_device / rest_whole if rest_whole > 0 and rest_device > 0 else 1.0
    return DeviceScale(fixed_model, fixed_device, min(max(activations, 1e-3), 1.0))
