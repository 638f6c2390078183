"""What a checkpoint segment saves: values by jdtr's names, and equations by signature.

`jax.checkpoint` rounds every residual it saves to its own dtype's
precision (`reduce_precision`, jax-ml/jax#22244) and takes complex dtypes
for floating ones there: a policy that saves a complex value fails to
trace ("reduce_precision does not accept dtype complex64"), in JAX 0.10
and 0.11 alike. So a complex value saved by name is saved as its real and
imaginary parts (`named`: the same bytes), and a policy saving by
signature or by a rule of JAX's (`refusing_complex`) leaves out equations
that may make complex values, which are recomputed instead: the budget
holds (less is saved), at some compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from .program import signature

NAME_PREFIX = "jdtr:"
PART = "/"  # a complex value's part: NAME_PREFIX + id + PART + "re" or "im"


def named(x: Any, name: str) -> Any:
    """`checkpoint_name(x, name)`; a complex `x` by its two parts."""
    if not jnp.iscomplexobj(x):
        return checkpoint_name(x, name)
    return lax.complex(checkpoint_name(lax.real(x), name + PART + "re"), checkpoint_name(lax.imag(x), name + PART + "im"))


def value_id(name: str) -> int:
    """The id of the value a name of jdtr's (NAME_PREFIX...) stands for."""
    return int(name[len(NAME_PREFIX) :].partition(PART)[0])


def _complex(dtype: Any) -> bool:
    try:
        return bool(jnp.issubdtype(dtype, jnp.complexfloating))
    except TypeError:  # extended dtypes (PRNG keys)
        return False


def may_make_complex(prim: Any, avals: Any, params: dict) -> bool:
    """Whether an equation may make a complex value, from what a policy is
    shown (its primitive, input types and parameters): it reads one, it
    makes one of real values (an FFT, `lax.complex`, a conversion), or it
    calls a jaxpr that returns one (`jnp.fft.rfft` is a `jit`)."""
    body = params.get("jaxpr", params.get("call_jaxpr"))
    return (
        prim.name in ("fft", "complex")
        or any(_complex(getattr(a, "dtype", None)) for a in avals)
        or _complex(params.get("new_dtype"))
        or any(_complex(getattr(a, "dtype", None)) for a in getattr(body, "out_avals", ()))
    )


def refusing_complex(policy: Callable[..., bool]) -> Callable[..., bool]:
    """`policy`, but saving nothing an equation that may make a complex value makes."""

    def saves(prim, *avals, **params) -> bool:
        return not may_make_complex(prim, avals, params) and policy(prim, *avals, **params)

    return saves


EVERYTHING = refusing_complex(jax.checkpoint_policies.everything_saveable)
DOTS = refusing_complex(jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


@dataclass(frozen=True)
class SavePolicy:
    """A `jax.checkpoint` policy: save the values named in `names`.

    Frozen and hashable, so it can be passed to `jax.checkpoint`,
    `flax.nnx.remat` and `flax.linen.remat`. `signatures` additionally saves
    outputs of a primitive with given input shapes and dtypes: this is how a
    plan's decisions carry over to code that does not use jdtr's names (for
    example a Flax module wrapped in `nnx.remat(..., policy=plan.policy)`);
    never an equation that may make a complex value.
    """

    names: frozenset[str] = frozenset()
    signatures: frozenset[tuple] = frozenset()

    def __call__(self, prim, *avals, **params) -> bool:
        if prim.name == "name":
            name = params.get("name")
            return name in self.names or (isinstance(name, str) and name.rpartition(PART)[0] in self.names)
        if self.signatures and signature(prim.name, avals) in self.signatures:
            return not may_make_complex(prim, avals, params)
        return False
