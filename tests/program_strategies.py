"""Hypothesis strategies for random differentiable JAX programs.

`programs()` draws a `GeneratedProgram`: the Python source of a loss function
over a random pytree of small float32 arrays, built from a broad set of
jax.numpy / lax operations, and the seed of its arguments. The source is the
program's identity: it is what hypothesis prints for a counterexample, and
what a regression test copies.

Every value the generator makes has a known shape, so each operation is drawn
among those that apply to the values already there (a value may be read by
several operations: fan-out). Arrays stay small (at most `MAX_SIZE`
elements) so an example runs in milliseconds once its executables are
compiled.

Used by tests/test_properties.py (the CI slice and `make fuzz`); importable
on its own for longer runs.
"""

from __future__ import annotations

import gc
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax
from jax.ad_checkpoint import checkpoint_name

import jdtr
from jdtr.runtime import Timeline

MAX_SIZE = 128  # elements per value: 512 bytes of float32
MAX_RANK = 4
MAX_DIM = 5


# ------------------------------------------------------------------ helpers the programs call


@jax.custom_jvp
def smooth_abs(x):
    """|x| smoothed, with a hand-written JVP (a custom_jvp sub-function)."""
    return jnp.sqrt(x * x + 0.25)


@smooth_abs.defjvp
def _smooth_abs_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = smooth_abs(x)
    return y, t * x / y


@jax.custom_vjp
def halve_grad(x):
    """The identity, whose cotangent is halved (a custom_vjp sub-function)."""
    return x


halve_grad.defvjp(lambda x: (x, None), lambda _, g: (g * 0.5,))


class CallbackLog:
    """Counts the host callbacks programs make (`record(...)` in their source)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *values: Any) -> None:
        self.calls += 1


RECORD = CallbackLog()


def namespace() -> dict[str, Any]:
    """What a program's source may name."""
    return {
        "jax": jax,
        "jnp": jnp,
        "lax": lax,
        "np": np,
        "smooth_abs": smooth_abs,
        "halve_grad": halve_grad,
        "record": RECORD,
        "checkpoint_name": checkpoint_name,
    }


# ------------------------------------------------------------------ the program


@dataclass(frozen=True)
class GeneratedProgram:
    """A loss function as source, and how to build its arguments.

    `tree` is the pytree of the arguments, `(p,)` or `(p, q)`, with each
    array leaf replaced by its name (a string); `shapes` maps names to shapes;
    `argnums` is what to differentiate. How leaves are passed varies as
    callers do: `kinds` names the leaves passed as NumPy arrays ("numpy") or
    Python floats ("python") rather than jax.Arrays, `aliases` the leaves
    that are the very array object of another leaf, and `q_keyword` passes q
    as a keyword argument.
    """

    source: str
    tree: Any
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    seed: int
    argnums: Any
    has_aux: bool
    callbacks: int  # host callbacks in the source
    kinds: tuple[tuple[str, str], ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    q_keyword: bool = False

    def loss(self) -> Callable:
        scope = namespace()
        exec(compile(self.source, "<generated program>", "exec"), scope)  # noqa: S102 - our own source
        return scope["loss"]

    def arguments(self) -> tuple[tuple, dict]:
        """(args, kwargs) to call the loss with."""
        rng = np.random.default_rng(self.seed)
        arrays = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in self.shapes}
        kinds = dict(self.kinds)
        leaves: dict[str, Any] = {}
        for name, _ in self.shapes:
            kind = kinds.get(name, "jax")
            if kind == "numpy":
                leaves[name] = arrays[name]
            elif kind == "python":
                leaves[name] = float(arrays[name])
            else:
                leaves[name] = jnp.asarray(arrays[name])
        for name, original in self.aliases:
            leaves[name] = leaves[original]
        trees = tuple(jax.tree_util.tree_map(lambda name: leaves[name], t) for t in self.tree)
        if self.q_keyword:
            return trees[:1], {"q": trees[1]}
        return trees, {}

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}{list(s)}" for n, s in self.shapes)
        return (
            f"GeneratedProgram(tree={self.tree!r}, shapes=[{shapes}], seed={self.seed}, argnums={self.argnums!r}, "
            f"has_aux={self.has_aux}, kinds={self.kinds!r}, aliases={self.aliases!r}, q_keyword={self.q_keyword})"
            f"\n{self.source}"
        )


@dataclass
class _Val:
    name: str
    shape: tuple[int, ...]
    kind: str = "f"  # "f" float32, "i" int32, "b" bool

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def rank(self) -> int:
        return len(self.shape)


def _broadcast(*shapes: tuple[int, ...]) -> Optional[tuple[int, ...]]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def _tuple(xs) -> str:
    xs = list(xs)
    return "(" + ", ".join(str(x) for x in xs) + ("," if len(xs) == 1 else "") + ")"


UNARY = (
    "jnp.sin({x})",
    "jnp.cos({x})",
    "jnp.tanh({x})",
    "jax.nn.sigmoid({x})",
    "jax.nn.softplus({x})",
    "jnp.log1p({x} * {x})",
    "jnp.sqrt({x} * {x} + 1.0)",
    "jax.nn.relu({x})",
    "jnp.abs({x})",
    "jnp.square({x})",
    "jax.nn.gelu({x})",
    "jnp.exp(-{x} * {x})",
    "lax.integer_pow({x}, 3)",
    "jax.scipy.special.erf({x})",
    "{x} * 0.5 + 1.0",
    "-{x}",
    "jnp.maximum({x}, 0.25)",
    "jnp.clip({x}, -1.0, 1.0)",
    "{x}.astype(jnp.bfloat16).astype(jnp.float32)",
    "lax.stop_gradient({x}) * {x}",
    "jnp.where({x} > 0.0, {x}, 0.1 * {x})",
    "1.0 / (1.0 + {x} * {x})",
    "smooth_abs({x})",
    "halve_grad({x})",
)

BINARY = (
    "{a} + {b}",
    "{a} - {b}",
    "{a} * {b}",
    "jnp.maximum({a}, {b})",
    "jnp.minimum({a}, {b})",
    "{a} / (1.0 + {b} * {b})",
    "jnp.where({a} > {b}, {a}, 0.5 * {b})",
    "jnp.tanh({a}) * jnp.cos({b})",
)

REDUCTIONS = ("jnp.sum", "jnp.max", "jnp.min", "jnp.mean", "jax.nn.logsumexp", "jnp.var")
CUMULATIVE = ("jnp.cumsum({x}, axis={ax})", "lax.cummax({x}, axis={ax}, reverse={rev})",
              "lax.cummin({x}, axis={ax}, reverse={rev})", "jnp.cumprod(jnp.tanh({x}), axis={ax})",
              "lax.cumlogsumexp({x}, axis={ax}, reverse={rev})", "lax.cumsum({x}, axis={ax}, reverse={rev})")


class _Builder:
    """The state of one program being drawn: its values, lines and leaves."""

    def __init__(self, draw: Callable) -> None:
        self.draw = draw
        self.lines: list[str] = []
        self.vals: list[_Val] = []
        self.leaves: list[tuple[str, tuple[int, ...]]] = []
        self.read: set[str] = set()  # values some operation used
        self.count = 0
        self.callbacks = 0

    # ---------------------------------------------------------------- values

    def fresh(self, prefix: str = "v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def shape(self, max_rank: int = 3, min_rank: int = 0) -> tuple[int, ...]:
        rank = self.draw(st.integers(min_rank, max_rank))
        dims = self.draw(st.lists(st.integers(1, MAX_DIM), min_size=rank, max_size=rank))
        while _size(dims) > MAX_SIZE:
            dims[dims.index(max(dims))] -= 1
        return tuple(dims)

    def leaf(self, shape: tuple[int, ...]) -> _Val:
        name = self.fresh("a")
        self.leaves.append((name, tuple(shape)))
        val = _Val(name, tuple(shape))
        self.vals.append(val)
        return val

    def emit(self, expr: str, shape: tuple[int, ...], kind: str = "f") -> _Val:
        val = _Val(self.fresh(), tuple(shape), kind)
        self.lines.append(f"{val.name} = {expr}")
        self.vals.append(val)
        return val

    def pick(self, kind: str = "f", where: Callable[[_Val], bool] = lambda v: True) -> Optional[_Val]:
        """A value of `kind` satisfying `where`; recent values are drawn first
        (and shrinking moves towards them), so programs are deep and reuse values."""
        found = [v for v in self.vals if v.kind == kind and where(v)]
        if not found:
            return None
        val = found[len(found) - 1 - self.draw(st.integers(0, len(found) - 1))]
        self.read.add(val.name)
        return val

    def int_scalar(self) -> str:
        """An int32 scalar computed from the data (for switch indices and
        dynamic positions): an existing one, or a new argmax."""
        index = self.pick("i", where=lambda v: v.rank == 0)
        if index is None:
            x = self.pick()
            index = self.emit(f"jnp.argmax({x.name})", (), "i")
        return index.name

    def choice(self, options):
        return self.draw(st.sampled_from(options))

    def unary(self, x: str) -> str:
        # An operand that is an expression is parenthesized, or a template
        # such as "{x}.astype(...)" would bind to its last term (found by
        # `make fuzz`: "u * 0.5 + 1.0.astype(...)").
        return self.choice(UNARY).format(x=x if x.isidentifier() else f"({x})")

    def binary(self, a: str, b: str) -> str:
        return self.choice(BINARY).format(a=a, b=b)


# ------------------------------------------------------------------ operations
#
# Each returns False when it does not apply to the values there are; the
# builder then draws another.


def op_unary(b: _Builder) -> bool:
    x = b.pick()
    b.emit(b.unary(x.name), x.shape)
    return True


def op_binary(b: _Builder) -> bool:
    a = b.pick()
    how = b.choice(("value", "param", "scalar"))
    if how == "value":
        other = b.pick(where=lambda v: (s := _broadcast(a.shape, v.shape)) is not None and _size(s) <= MAX_SIZE)
        shape = _broadcast(a.shape, other.shape)
        operand = other.name
    elif how == "param":  # a bias or a scale broadcast against `a`
        keep = b.draw(st.integers(0, a.rank))
        suffix = [d if b.draw(st.booleans()) else 1 for d in a.shape[a.rank - keep :]]
        operand, shape = b.leaf(tuple(suffix)).name, a.shape
    else:
        operand, shape = b.choice(("2.0", "0.5", "-1.5", "3")), a.shape
    if b.draw(st.booleans()):
        expr = b.binary(a.name, operand)
    else:
        expr = b.binary(operand, a.name)
    b.emit(expr, shape)
    return True


def op_matmul(b: _Builder) -> bool:
    a = b.pick(where=lambda v: v.rank >= 1)
    if a is None:
        return False
    how = b.choice(("param", "value", "gram", "einsum"))
    k = a.shape[-1]
    if how == "param":
        n = b.draw(st.integers(1, MAX_DIM))
        if _size(a.shape[:-1]) * n > MAX_SIZE:
            return False
        w = b.leaf((k, n))
        b.emit(f"{a.name} @ {w.name}", a.shape[:-1] + (n,))
    elif how == "value":
        w = b.pick(where=lambda v: v.rank == 2 and v.shape[0] == k and _size(a.shape[:-1]) * v.shape[1] <= MAX_SIZE)
        if w is None:
            return False
        b.emit(f"jnp.matmul({a.name}, {w.name})", a.shape[:-1] + (w.shape[1],))
    elif how == "gram":
        if a.rank < 2 or _size(a.shape[:-1]) * a.shape[-2] > MAX_SIZE:
            return False
        b.emit(f"{a.name} @ jnp.swapaxes({a.name}, -1, -2) / {k}.0", a.shape[:-1] + (a.shape[-2],))
    else:  # batched: 'bij,bkj->bik' with a second value of the same shape
        if a.rank != 3 or a.shape[0] * a.shape[1] * a.shape[1] > MAX_SIZE:
            return False
        c = b.pick(where=lambda v: v.shape == a.shape)
        b.emit(f"jnp.einsum('bij,bkj->bik', {a.name}, {c.name})", (a.shape[0], a.shape[1], a.shape[1]))
    return True


def op_dot_general(b: _Builder) -> bool:
    """lax.dot_general with random contracting and batch dimensions."""
    a = b.pick(where=lambda v: v.rank >= 1)
    if a is None:
        return False
    c = b.pick(where=lambda v: v.rank >= 1)
    pairs = [(i, j) for i in range(a.rank) for j in range(c.rank) if a.shape[i] == c.shape[j]]
    if not pairs:
        return False
    contract: list[tuple[int, int]] = []
    batch: list[tuple[int, int]] = []
    for pair in b.draw(st.permutations(pairs)):
        role = b.choice(("contract", "batch", "skip"))
        if role == "skip" or any(pair[0] == p[0] or pair[1] == p[1] for p in contract + batch):
            continue
        (contract if role == "contract" else batch).append(pair)
    ca, cb = [p[0] for p in contract], [p[1] for p in contract]
    ba, bb = [p[0] for p in batch], [p[1] for p in batch]
    shape = (
        tuple(a.shape[i] for i in ba)
        + tuple(a.shape[i] for i in range(a.rank) if i not in ca + ba)
        + tuple(c.shape[j] for j in range(c.rank) if j not in cb + bb)
    )
    if _size(shape) > MAX_SIZE or len(shape) > MAX_RANK + 1:
        return False
    dims = f"(({_tuple(ca)}, {_tuple(cb)}), ({_tuple(ba)}, {_tuple(bb)}))"
    b.emit(f"lax.dot_general({a.name}, {c.name}, {dims})", shape)
    return True


def op_reduce(b: _Builder) -> bool:
    x = b.pick()
    fn = b.choice(REDUCTIONS)
    keepdims = b.draw(st.booleans())
    if x.rank == 0 or b.draw(st.integers(0, 3)) == 0:
        axes: Any = None
    else:
        axes = tuple(sorted(b.draw(st.sets(st.integers(0, x.rank - 1), min_size=1, max_size=x.rank))))
    if axes is None:
        shape = tuple(1 for _ in x.shape) if keepdims else ()
    else:
        shape = tuple((1 if keepdims else None) if i in axes else d for i, d in enumerate(x.shape))
        shape = tuple(d for d in shape if d is not None)
    axis = "None" if axes is None else (str(axes[0]) if len(axes) == 1 else _tuple(axes))
    b.emit(f"{fn}({x.name}, axis={axis}, keepdims={keepdims})", shape)
    return True


def op_reshape(b: _Builder) -> bool:
    x = b.pick()
    how = b.choice(("reshape", "transpose", "expand", "squeeze", "broadcast", "flip", "roll", "pad"))
    if how == "reshape":
        rank = b.draw(st.integers(0 if x.size == 1 else 1, MAX_RANK))
        dims = [1] * rank
        for p in _prime_factors(x.size):
            dims[b.draw(st.integers(0, rank - 1))] *= p
        b.emit(f"{x.name}.reshape({_tuple(dims)})", tuple(dims))
    elif how == "transpose":
        if x.rank < 2:
            return False
        perm = b.draw(st.permutations(range(x.rank)))
        b.emit(f"jnp.transpose({x.name}, {_tuple(perm)})", tuple(x.shape[i] for i in perm))
    elif how == "expand":
        if x.rank >= MAX_RANK:
            return False
        axis = b.draw(st.integers(0, x.rank))
        b.emit(f"jnp.expand_dims({x.name}, {axis})", x.shape[:axis] + (1,) + x.shape[axis:])
    elif how == "squeeze":
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if not ones:
            return False
        axis = b.choice(ones)
        b.emit(f"jnp.squeeze({x.name}, axis={axis})", x.shape[:axis] + x.shape[axis + 1 :])
    elif how == "broadcast":
        shape = list(x.shape)
        for i, d in enumerate(shape):
            if d == 1 and b.draw(st.booleans()):
                shape[i] = b.draw(st.integers(1, MAX_DIM))
        if len(shape) < MAX_RANK and b.draw(st.booleans()):
            shape.insert(0, b.draw(st.integers(1, 3)))
        if _size(shape) > MAX_SIZE:
            return False
        b.emit(f"jnp.broadcast_to({x.name}, {_tuple(shape)})", tuple(shape))
    elif how == "flip":
        if x.rank == 0:
            return False
        b.emit(f"jnp.flip({x.name}, axis={b.draw(st.integers(0, x.rank - 1))})", x.shape)
    elif how == "roll":
        if x.rank == 0:
            return False
        shift, axis = b.draw(st.integers(-3, 3)), b.draw(st.integers(0, x.rank - 1))
        b.emit(f"jnp.roll({x.name}, {shift}, axis={axis})", x.shape)
    else:
        if x.rank == 0:
            return False
        pads = [(b.draw(st.integers(0, 2)), b.draw(st.integers(0, 2))) for _ in x.shape]
        shape = tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, pads))
        if _size(shape) > MAX_SIZE:
            return False
        b.emit(f"jnp.pad({x.name}, {_tuple(_tuple(p) for p in pads)})", shape)
    return True


def op_slice(b: _Builder) -> bool:
    x = b.pick(where=lambda v: v.rank >= 1)
    if x is None:
        return False
    how = b.choice(("static", "index", "dynamic", "dynamic_value", "update"))
    if how == "static":
        parts, shape = [], []
        for d in x.shape:
            start = b.draw(st.integers(0, d - 1))
            stop = b.draw(st.integers(start + 1, d))
            step = b.draw(st.integers(1, 3))
            if b.draw(st.integers(0, 4)) == 0:
                parts.append("::-1")
                shape.append(d)
                continue
            parts.append(f"{start}:{stop}:{step}")
            shape.append(len(range(start, stop, step)))
        b.emit(f"{x.name}[{', '.join(parts)}]", tuple(shape))
    elif how == "index":
        i = b.draw(st.integers(-x.shape[0], x.shape[0] - 1))
        b.emit(f"{x.name}[{i}]", x.shape[1:])
    elif how in ("dynamic", "dynamic_value"):
        axis = b.draw(st.integers(0, x.rank - 1))
        n = b.draw(st.integers(1, x.shape[axis]))
        start: Any = b.draw(st.integers(0, x.shape[axis]))  # out of range starts are clamped
        if how == "dynamic_value":
            start = b.int_scalar()
        b.emit(f"lax.dynamic_slice_in_dim({x.name}, {start}, {n}, axis={axis})", x.shape[:axis] + (n,) + x.shape[axis + 1 :])
    else:  # dynamic_update_slice of a piece of itself, transformed
        sizes = [b.draw(st.integers(1, d)) for d in x.shape]
        starts = [b.draw(st.integers(0, d - s)) for d, s in zip(x.shape, sizes)]
        piece = f"{x.name}[{', '.join(f':{s}' for s in sizes)}]"
        b.emit(f"lax.dynamic_update_slice({x.name}, {b.unary(piece)}, {_tuple(starts)})", x.shape)
    return True


def op_gather(b: _Builder) -> bool:
    x = b.pick(where=lambda v: v.rank >= 1)
    if x is None:
        return False
    how = b.choice(("take", "index_array", "two_arrays", "along_axis", "value_index", "one_hot"))
    if how == "take":
        axis = b.draw(st.integers(0, x.rank - 1))
        idx = b.draw(st.lists(st.integers(0, x.shape[axis] - 1), min_size=1, max_size=5))
        shape = x.shape[:axis] + (len(idx),) + x.shape[axis + 1 :]
        if _size(shape) > MAX_SIZE:
            return False
        b.emit(f"jnp.take({x.name}, jnp.array({idx}), axis={axis})", shape)
    elif how == "index_array":
        idx = b.draw(st.lists(st.integers(-x.shape[0], x.shape[0] - 1), min_size=1, max_size=5))
        shape = (len(idx),) + x.shape[1:]
        if _size(shape) > MAX_SIZE:
            return False
        b.emit(f"{x.name}[jnp.array({idx})]", shape)
    elif how == "two_arrays":
        if x.rank < 2:
            return False
        n = b.draw(st.integers(1, 4))
        i0 = b.draw(st.lists(st.integers(0, x.shape[0] - 1), min_size=n, max_size=n))
        i1 = b.draw(st.lists(st.integers(0, x.shape[1] - 1), min_size=n, max_size=n))
        b.emit(f"{x.name}[jnp.array({i0}), jnp.array({i1})]", (n,) + x.shape[2:])
    elif how == "along_axis":
        key = b.pick(where=lambda v: v.shape == x.shape)
        axis = b.draw(st.integers(0, x.rank - 1))
        b.emit(f"jnp.take_along_axis({x.name}, jnp.argsort({key.name}, axis={axis}), axis={axis})", x.shape)
    elif how == "value_index":
        b.emit(f"{x.name}[{b.int_scalar()} % {x.shape[0]}]", x.shape[1:])
    else:
        if _size(x.shape) * x.shape[-1] > MAX_SIZE * 4:
            return False
        b.emit(f"{x.name} * jax.nn.one_hot(jnp.argmax({x.name}, axis=-1), {x.shape[-1]})", x.shape)
    return True


def op_scatter(b: _Builder) -> bool:
    x = b.pick(where=lambda v: v.rank >= 1)
    if x is None:
        return False
    method = b.choice(("add", "set", "max", "min", "mul_unique"))
    n = b.draw(st.integers(1, 4))
    if method == "mul_unique":  # scatter_mul is only differentiable with unique indices
        if x.shape[0] < n:
            return False
        idx = b.draw(st.permutations(range(x.shape[0])))[:n]
    else:
        idx = b.draw(st.lists(st.integers(0, x.shape[0] - 1), min_size=n, max_size=n))
    shape = (n,) + x.shape[1:]
    how = b.choice(("self", "param", "value", "scalar"))
    if how == "self":
        other = b.draw(st.lists(st.integers(0, x.shape[0] - 1), min_size=n, max_size=n))
        update = b.unary(f"{x.name}[jnp.array({other})]")
    elif how == "param":
        update = b.leaf(shape).name
    elif how == "value":
        found = b.pick(where=lambda v: _broadcast(v.shape, shape) == shape)
        if found is None:
            return False
        update = found.name
    else:
        update = "1.5"
    if method == "mul_unique":
        b.emit(f"{x.name}.at[jnp.array({list(idx)})].mul({update}, unique_indices=True)", x.shape)
    else:
        b.emit(f"{x.name}.at[jnp.array({idx})].{method}({update})", x.shape)
    return True


def op_concatenate(b: _Builder) -> bool:
    x = b.pick(where=lambda v: v.rank >= 1)
    if x is None:
        return False
    if b.draw(st.booleans()):
        axis = b.draw(st.integers(0, x.rank - 1))
        fits = lambda v: v.rank == x.rank and all(d == e for i, (d, e) in enumerate(zip(v.shape, x.shape)) if i != axis)  # noqa: E731
        others = [x] + [b.pick(where=fits) for _ in range(b.draw(st.integers(1, 2)))]
        shape = x.shape[:axis] + (sum(v.shape[axis] for v in others),) + x.shape[axis + 1 :]
        if _size(shape) > MAX_SIZE:
            return False
        b.emit(f"jnp.concatenate([{', '.join(v.name for v in others)}], axis={axis})", shape)
    else:
        if x.rank >= MAX_RANK or 2 * x.size > MAX_SIZE:
            return False
        other = b.pick(where=lambda v: v.shape == x.shape)
        axis = b.draw(st.integers(0, x.rank))
        b.emit(f"jnp.stack([{x.name}, {b.unary(other.name)}], axis={axis})", x.shape[:axis] + (2,) + x.shape[axis:])
    return True


def op_where(b: _Builder) -> bool:
    a = b.pick()
    c = b.pick(where=lambda v: _broadcast(v.shape, a.shape) == a.shape)
    mask = b.pick("b", where=lambda v: _broadcast(v.shape, a.shape) == a.shape)
    if mask is None or b.draw(st.booleans()):
        cond = f"{a.name} > {c.name}"
    else:
        cond = mask.name
    other = b.choice((c.name, "0.0", b.unary(c.name)))
    b.emit(f"jnp.where({cond}, {a.name}, {other})", a.shape)
    return True


def op_cumulative(b: _Builder) -> bool:
    x = b.pick(where=lambda v: v.rank >= 1)
    if x is None:
        return False
    axis, rev = b.draw(st.integers(0, x.rank - 1)), b.draw(st.booleans())
    b.emit(b.choice(CUMULATIVE).format(x=x.name, ax=axis, rev=rev), x.shape)
    return True


def op_conv(b: _Builder) -> bool:
    x = b.pick(where=lambda v: v.rank in (3, 4))
    if x is None:
        return False
    spatial = x.shape[1:-1]
    channels = x.shape[-1]
    window = tuple(b.draw(st.integers(1, d)) for d in spatial)
    strides = tuple(b.draw(st.integers(1, 2)) for _ in spatial)
    padding = b.choice(("SAME", "VALID"))
    features = b.draw(st.integers(1, 3))
    if padding == "SAME":
        out = tuple(-(-d // s) for d, s in zip(spatial, strides))
    else:
        out = tuple((d - k) // s + 1 for d, k, s in zip(spatial, window, strides))
    shape = (x.shape[0],) + out + (features,)
    if _size(shape) > MAX_SIZE:
        return False
    kernel = b.leaf(window + (channels, features))
    dims = ("NWC", "WIO", "NWC") if x.rank == 3 else ("NHWC", "HWIO", "NHWC")
    b.emit(f"lax.conv_general_dilated({x.name}, {kernel.name}, {strides}, {padding!r}, dimension_numbers={dims})", shape)
    return True


def op_pool(b: _Builder) -> bool:
    """A max, min or sum pool (`lax.reduce_window`) over any of a value's
    dimensions: jdtr rewrites max and min pools and their pullbacks on the
    CPU (transform/pooling.py), here under every heuristic and budget."""
    x = b.pick(where=lambda v: v.rank >= 1)
    if x is None:
        return False
    window = tuple(b.draw(st.integers(1, min(d, 3))) for d in x.shape)
    strides = tuple(b.draw(st.integers(1, 2)) for _ in x.shape)
    padding = b.choice(("SAME", "VALID"))
    if padding == "SAME":
        shape = tuple(-(-d // s) for d, s in zip(x.shape, strides))
    else:
        shape = tuple((d - w) // s + 1 for d, w, s in zip(x.shape, window, strides))
    init, op = b.choice((("-jnp.inf", "lax.max"), ("jnp.inf", "lax.min"), ("0.0", "lax.add")))
    b.emit(f"lax.reduce_window({x.name}, {init}, {op}, {_tuple(window)}, {_tuple(strides)}, {padding!r})", shape)
    return True


def op_cond(b: _Builder) -> bool:
    a = b.pick()
    how = b.choice(("cond", "cond2", "literal_operand", "switch", "literal_pred"))
    if how == "switch":
        index = b.int_scalar()
        branches = ", ".join(f"lambda u: {b.unary('u')}" for _ in range(3))
        b.emit(f"lax.switch({index} % 3, [{branches}], {a.name})", a.shape)
        return True
    pred = b.pick(where=lambda v: True)
    mask = b.pick("b")
    if how == "literal_pred":
        test = b.choice(("True", "False"))
    elif mask is not None and b.draw(st.booleans()):
        test = f"jnp.any({mask.name})"
    else:
        test = f"jnp.sum({pred.name}) > 0.0"
    captured = b.pick(where=lambda v: _broadcast(v.shape, a.shape) == a.shape)  # read through the closure
    if how == "literal_operand":
        b.emit(
            f"lax.cond({test}, lambda u, s: {b.unary('u')} * s, lambda u, s: u - s * {captured.name}, {a.name}, 2.0)",
            a.shape,
        )
    elif how == "cond":
        other = b.pick(where=lambda v: _broadcast(v.shape, a.shape) == a.shape)
        true = b.binary("u", "w")
        false = f"{b.unary('u')} + w * {captured.name}"
        b.emit(f"lax.cond({test}, lambda u, w: {true}, lambda u, w: {false}, {a.name}, {other.name})", a.shape)
    else:  # two outputs, one of them an operand passed through
        first, second = _Val(b.fresh(), a.shape), _Val(b.fresh(), a.shape)
        b.lines.append(
            f"{first.name}, {second.name} = lax.cond({test}, lambda u: ({b.unary('u')}, u), "
            f"lambda u: (u * {captured.name}, {b.unary('u')}), {a.name})"
        )
        b.vals += [first, second]
    return True


def op_scan(b: _Builder) -> bool:
    how = b.choice(("xs", "length", "fori", "empty"))
    if how == "fori":
        x = b.pick()
        z = b.pick(where=lambda v: _broadcast(v.shape, x.shape) == x.shape)
        n = b.draw(st.integers(1, 4))
        b.emit(f"lax.fori_loop(0, {n}, lambda i, h: jnp.sin(h) * 0.9 + {z.name}, {x.name})", x.shape)
        return True
    if how == "xs":
        xs = b.pick(where=lambda v: v.rank >= 1)
        if xs is None:
            return False
        carry_shape = xs.shape[1:]
        length = xs.shape[0]
        step_input = "x"
    else:
        carry_shape = b.pick().shape
        length = 0 if how == "empty" else b.draw(st.integers(1, 5))
        xs, step_input = None, "c"
    if _size((length,) + carry_shape) > MAX_SIZE:
        return False
    init = b.pick(where=lambda v: v.shape == carry_shape)
    z = b.pick(where=lambda v: _broadcast(v.shape, carry_shape) == carry_shape)  # a scan constant
    fn = b.fresh("body")
    ys_exprs = b.draw(st.lists(st.sampled_from(("c * {x}", "jnp.sin({x})", "c")), min_size=0, max_size=2))
    ys_exprs = [e.format(x=step_input) for e in ys_exprs]
    reverse = b.draw(st.booleans())
    update = b.binary("c", step_input)
    body = [
        f"def {fn}(c, x):",
        f"    c = jnp.tanh({update}) + 0.5 * {z.name if z is not None else 'c'}",
        f"    return c, ({', '.join(ys_exprs) + (',' if len(ys_exprs) == 1 else '')})",
    ]
    b.lines += body
    call = f"lax.scan({fn}, {init.name if init is not None else f'jnp.zeros({_tuple(carry_shape)})'}, "
    call += f"{xs.name}, reverse={reverse})" if xs is not None else f"None, length={length}, reverse={reverse})"
    if how == "empty":  # zero-length: the stacked outputs are empty arrays
        b.emit(f"{call}[0] + sum(jnp.sum(y) for y in {call}[1])", carry_shape)
        return True
    carry = _Val(b.fresh(), carry_shape)
    ys = [_Val(b.fresh(), (length,) + carry_shape) for _ in ys_exprs]
    b.lines.append(f"{carry.name}, ({''.join(y.name + ', ' for y in ys)}) = {call}")
    b.vals += [carry, *ys]
    return True


def op_call(b: _Builder) -> bool:
    """jit, checkpoint, checkpoint_name, nested jit: sub-functions DTR inlines."""
    x = b.pick()
    how = b.choice(("jit", "jit2", "nested", "checkpoint", "name"))
    if how == "jit":
        b.emit(f"jax.jit(lambda u: {b.unary('u')})({x.name})", x.shape)
    elif how == "jit2":
        y = b.pick(where=lambda v: _broadcast(v.shape, x.shape) == x.shape)
        b.emit(f"jax.jit(lambda u, w: {b.binary('u', 'w')})({x.name}, {y.name})", x.shape)
    elif how == "nested":
        b.emit(f"jax.jit(lambda u: jax.jit(lambda t: {b.unary('t')})(u) * u)({x.name})", x.shape)
    elif how == "checkpoint":
        b.emit(f"jax.checkpoint(lambda u: {b.unary(b.unary('u'))})({x.name})", x.shape)
    else:
        b.emit(f"checkpoint_name({b.unary(x.name)}, {b.fresh('n')!r})", x.shape)
    return True


def op_multi(b: _Builder) -> bool:
    """Operations with several outputs: split, top_k, sort with two operands, eigh."""
    x = b.pick(where=lambda v: v.rank >= 1)
    if x is None:
        return False
    how = b.choice(("split", "top_k", "sort", "eigh"))
    if how == "split":
        axis = b.draw(st.integers(0, x.rank - 1))
        d = x.shape[axis]
        if d < 2:
            return False
        cut = b.draw(st.integers(1, d - 1))
        parts = [_Val(b.fresh(), x.shape[:axis] + (n,) + x.shape[axis + 1 :]) for n in (cut, d - cut)]
        b.lines.append(f"{parts[0].name}, {parts[1].name} = jnp.split({x.name}, [{cut}], axis={axis})")
        b.vals += parts
    elif how == "top_k":
        k = b.draw(st.integers(1, x.shape[-1]))
        values, indices = _Val(b.fresh(), x.shape[:-1] + (k,)), _Val(b.fresh(), x.shape[:-1] + (k,), "i")
        b.lines.append(f"{values.name}, {indices.name} = lax.top_k({x.name}, {k})")
        b.vals += [values, indices]
    elif how == "sort":
        other = b.pick(where=lambda v: v.shape == x.shape)
        keys, vals = _Val(b.fresh(), x.shape), _Val(b.fresh(), x.shape)
        axis = b.draw(st.integers(0, x.rank - 1))
        b.lines.append(f"{keys.name}, {vals.name} = lax.sort(({x.name}, {other.name}), dimension={axis}, num_keys=1)")
        b.vals += [keys, vals]
    else:  # eigenvalues of a well-conditioned symmetric matrix
        if x.rank < 2:
            return False
        m = x.shape[-2]
        sym = f"{x.name} @ jnp.swapaxes({x.name}, -1, -2) + {2 * m}.0 * jnp.diag(jnp.arange(1.0, {m + 1}.0))"
        b.emit(f"jnp.linalg.eigvalsh({sym})", x.shape[:-1])
    return True


def op_integer(b: _Builder) -> bool:
    """Integer and boolean side computations, and their uses as floats."""
    x = b.pick()
    how = b.choice(("argmax", "argmax_flat", "compare", "count", "to_float", "mask_mul"))
    if how == "argmax":
        if x.rank == 0:
            return False
        axis = b.draw(st.integers(0, x.rank - 1))
        fn = b.choice(("jnp.argmax", "jnp.argmin"))
        b.emit(f"{fn}({x.name}, axis={axis})", x.shape[:axis] + x.shape[axis + 1 :], "i")
    elif how == "argmax_flat":
        b.emit(f"jnp.argmax({x.name})", (), "i")
    elif how == "compare":
        y = b.pick(where=lambda v: _broadcast(v.shape, x.shape) == x.shape)
        op = b.choice((">", "<=", "=="))
        b.emit(f"{x.name} {op} {y.name}", x.shape, "b")
    elif how == "count":
        b.emit(f"jnp.sum({x.name} > 0.0).astype(jnp.int32)", (), "i")
    elif how == "to_float":
        index = b.pick("i", where=lambda v: _broadcast(v.shape, x.shape) == x.shape)
        if index is None:
            return False
        b.emit(f"{x.name} * {index.name}.astype(jnp.float32)", x.shape)
    else:
        mask = b.pick("b", where=lambda v: _broadcast(v.shape, x.shape) == x.shape)
        if mask is None:
            return False
        b.emit(f"{x.name} * {mask.name}", x.shape)
    return True


def op_random(b: _Builder) -> bool:
    """PRNG inside the program (replays must draw the same numbers)."""
    x = b.pick()
    seed = b.draw(st.integers(0, 3))
    if b.draw(st.booleans()):
        b.emit(f"{x.name} * jax.random.normal(jax.random.PRNGKey({seed}), {_tuple(x.shape)})", x.shape)
    else:
        b.emit(f"jnp.where(jax.random.bernoulli(jax.random.PRNGKey({seed}), 0.7, {_tuple(x.shape)}), {x.name}, 0.0)", x.shape)
    return True


def op_callback(b: _Builder) -> bool:
    """A host callback: effectful, so run once and never replayed."""
    x = b.pick()
    b.lines.append(f"jax.debug.callback(record, {x.name})")
    b.callbacks += 1
    return True


OPERATIONS: dict[str, Callable[[_Builder], bool]] = {
    "unary": op_unary,
    "binary": op_binary,
    "matmul": op_matmul,
    "dot_general": op_dot_general,
    "reduce": op_reduce,
    "reshape": op_reshape,
    "slice": op_slice,
    "gather": op_gather,
    "scatter": op_scatter,
    "concatenate": op_concatenate,
    "where": op_where,
    "cumulative": op_cumulative,
    "conv": op_conv,
    "pool": op_pool,
    "cond": op_cond,
    "scan": op_scan,
    "call": op_call,
    "multi": op_multi,
    "integer": op_integer,
    "random": op_random,
    "callback": op_callback,
}


# ------------------------------------------------------------------ pytrees of arguments


def _draw_tree(draw: Callable, names: list[str], depth: int = 0) -> tuple[Any, dict[str, str]]:
    """A random pytree holding `names` as leaves, and the access path of each."""
    if len(names) == 1 and (depth >= 2 or draw(st.booleans())):
        return names[0], {names[0]: ""}
    kind = draw(st.sampled_from(("dict", "list", "tuple")))
    groups: list[list[str]] = []
    rest = list(names)
    while rest:
        n = draw(st.integers(1, len(rest)))
        groups.append(rest[:n])
        rest = rest[n:]
    children = [_draw_tree(draw, g, depth + 1) for g in groups]
    empty = draw(st.sampled_from((None, None, None, "none", "empty")))  # empty subtrees flatten to nothing
    paths: dict[str, str] = {}
    if kind == "dict":
        keys = [f"k{i}" for i in range(len(children))]
        tree: Any = {k: c for k, (c, _) in zip(keys, children)}
        for k, (_, sub) in zip(keys, children):
            paths.update({n: f"[{k!r}]{p}" for n, p in sub.items()})
        if empty == "none":
            tree["unused"] = None
        elif empty == "empty":
            tree["unused"] = {}
    else:
        items = [c for c, _ in children]
        for i, (_, sub) in enumerate(children):
            paths.update({n: f"[{i}]{p}" for n, p in sub.items()})
        if empty:
            items.append(None if empty == "none" else ())
        tree = items if kind == "list" else tuple(items)
    return tree, paths


# ------------------------------------------------------------------ the strategy


@st.composite
def programs(draw: Callable, min_ops: int = 1, max_ops: int = 10, operations: Optional[tuple[str, ...]] = None) -> GeneratedProgram:
    """Random differentiable programs (see the module docstring).

    Args:
      min_ops, max_ops: how many operations to draw.
      operations: names from `OPERATIONS` to draw from (all by default).
    """
    b = _Builder(draw)
    for _ in range(draw(st.integers(1, 3))):
        b.leaf(b.shape())
    names = sorted(operations or OPERATIONS)
    target = draw(st.integers(min_ops, max_ops))
    done = attempts = 0
    while done < target and attempts < 4 * target:
        attempts += 1
        if OPERATIONS[draw(st.sampled_from(names))](b):
            done += 1
    floats = [v for v in b.vals if v.kind == "f"]
    # The loss reads every float value nothing else read, and some that were read (fan-out).
    sinks = [v for v in floats if v.name not in b.read or draw(st.integers(0, 3)) == 0]
    if not sinks:
        sinks = [floats[-1]]
    terms = []
    for v in sinks:
        weights = f"np.linspace(-1.0, 1.0, {v.size}, dtype=np.float32).reshape({_tuple(v.shape)})"
        terms.append(f"jnp.sum({v.name} * {weights})")
    has_aux = draw(st.integers(0, 4)) == 0
    # Arguments: p (differentiated) and possibly q (differentiated or data).
    leaf_names = [n for n, _ in b.leaves]
    split = draw(st.integers(1, len(leaf_names)))
    groups = [leaf_names[:split]] + ([leaf_names[split:]] if split < len(leaf_names) else [])
    trees, paths = [], {}
    for arg, group in zip("pq", groups):
        tree, sub = _draw_tree(draw, group)
        trees.append(tree)
        paths.update({n: f"{arg}{p}" for n, p in sub.items()})
    argnums: Any = 0
    if len(groups) == 2:
        argnums = draw(st.sampled_from((0, (0, 1), 1)))
    signature = ", ".join("pq"[: len(groups)])
    lines = [f"def loss({signature}):"]
    lines += [f"    {n} = {paths[n]}" for n in leaf_names]
    lines += [f"    {line}" for line in b.lines]
    result = " + ".join(terms)
    if has_aux:
        aux = b.pick(draw(st.sampled_from(("f", "i"))) if any(v.kind == "i" for v in b.vals) else "f")
        lines.append(f"    return {result}, {aux.name}")
    else:
        lines.append(f"    return {result}")
    seed = draw(st.integers(0, 2**16))
    # How the caller passes the leaves: mostly jax.Arrays.
    kinds: list[tuple[str, str]] = []
    aliases: list[tuple[str, str]] = []
    for i, (name, shape) in enumerate(b.leaves):
        kind = draw(st.sampled_from(("jax",) * 6 + ("numpy", "python")))
        if kind == "python" and shape != ():
            kind = "numpy"
        if kind != "jax":
            kinds.append((name, kind))
            continue
        plain = [n for n, s in b.leaves[:i] if s == shape and n not in dict(kinds) and n not in dict(aliases)]
        if plain and draw(st.integers(0, 3)) == 0:
            aliases.append((name, draw(st.sampled_from(plain))))
    q_keyword = len(groups) == 2 and argnums == 0 and draw(st.booleans())
    return GeneratedProgram(
        source="\n".join(lines) + "\n",
        tree=tuple(trees),
        shapes=tuple(b.leaves),
        seed=seed,
        argnums=argnums,
        has_aux=has_aux,
        callbacks=b.callbacks,
        kinds=tuple(kinds),
        aliases=tuple(aliases),
        q_keyword=q_keyword,
    )


@dataclass(frozen=True)
class RunConfig:
    """How jdtr runs a program: a budget, a heuristic and a dealloc policy.

    `budget` is a fraction of the unconstrained peak, or with `above_minimum`
    a position between the smallest budget this heuristic and policy were
    found to fit (0.0) and the unconstrained peak (1.0), where evictions are
    the most frequent.
    """

    budget: float
    heuristic: str
    dealloc: str
    above_minimum: bool = False
    cost_model: Optional[str] = None  # None (counted), "xla" or "measured"


def run_configs(heuristics: tuple[str, ...], deallocs: tuple[str, ...] = ("eager", "banish", "ignore")):
    """Budgets in [0.2, 1.0] (1.0 exactly, often) or just above the smallest
    that fits; any of `heuristics` and `deallocs`."""
    fractions = st.one_of(st.just(1.0), st.floats(0.2, 1.0), st.sampled_from((0.3, 0.5, 0.7, 0.9)))
    cost_models = st.sampled_from((None,) * 8 + ("xla", "measured"))
    ratio = st.builds(
        RunConfig, fractions, st.sampled_from(sorted(heuristics)), st.sampled_from(deallocs), st.just(False), cost_models
    )
    tight = st.builds(
        RunConfig,
        st.one_of(st.just(0.0), st.floats(0.0, 0.3)),
        st.sampled_from(sorted(heuristics)),
        st.sampled_from(deallocs),
        st.just(True),
        cost_models,
    )
    return st.one_of(ratio, ratio, tight)  # tight budgets cost the most time (bisection, thrashing)


def smallest_budget(fun: Callable, args: tuple, expected: Any, *, argnums: Any, has_aux: bool, heuristic: str,
                    dealloc: str, peak: int, kwargs: Optional[dict] = None, cost_model: Optional[str] = None,
                    tolerance: float = 0.05) -> Optional[int]:
    """About the smallest budget in bytes under which the program runs (by
    bisection; whether a budget fits need not be monotonic, so this is one
    boundary); None if even the unconstrained peak does not fit. Every run
    on the way must give `expected` or fail cleanly out of budget."""

    suggested: list[int] = []  # the budgets out-of-budget errors said fit

    def fits(nbytes: int) -> bool:
        try:
            # Step by step: the boundary is the plan's, and compiling chunks at
            # every budget probed (a structure seen before) would be most of the time.
            f = jdtr.value_and_grad(fun, argnums, has_aux, budget=nbytes, heuristic=heuristic, dealloc=dealloc,
                                    cost_model=cost_model, chunks="never")
            got = f(*args, **(kwargs or {}))
        except jdtr.OutOfBudgetError as err:
            if err.suggested_budget_bytes is not None:
                suggested.append(err.suggested_budget_bytes)
            return False
        assert_trees_close(got, expected)
        return True

    if not fits(peak):
        return None
    step = max(int(tolerance * peak), 1)
    low, high = 0, peak  # low does not fit (a budget of 0 bytes never does), high does
    while high - low > step:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
            continue
        low = middle
        # An error suggests a budget its planner found to fit, about the
        # smallest: where it does, and a step below it does not, that is the
        # boundary (two runs where bisection takes about four).
        hint = suggested[-1] if suggested else None
        if hint is not None and low < hint < high and fits(hint):
            high = hint
            if hint - step > low:
                if fits(hint - step):
                    high = hint - step
                else:
                    low = hint - step
    return high


# ------------------------------------------------------------------ the oracle

RTOL, ATOL = 1e-4, 1e-5

def live_array_ids() -> set[int]:
    return {id(a) for a in jax.live_arrays()}


def new_live_arrays(before: set[int], expected: frozenset = frozenset()) -> set[int]:
    """Ids of live arrays not in `before`. A garbage collection (slow: a
    quarter of a second in a full test process) runs only when these are not
    the `expected` ones, as reference counting frees almost everything."""
    found = live_array_ids() - before
    if found != expected:
        gc.collect()
        found = live_array_ids() - before
    return found


def reference(program: GeneratedProgram, args: tuple, kwargs: Optional[dict] = None) -> Any:
    """jax.value_and_grad of the program, under jit (one compilation per
    program; eager dispatch would re-trace every sub-function)."""
    fun = jax.value_and_grad(program.loss(), program.argnums, program.has_aux)
    return jax.block_until_ready(jax.jit(fun)(*args, **(kwargs or {})))


def is_usable(ref: Any) -> bool:
    """Programs whose value or gradients overflow say nothing about jdtr."""
    return all(
        np.all(np.isfinite(np.asarray(x))) and np.all(np.abs(np.asarray(x)) < 1e6)
        for x in jax.tree_util.tree_leaves(ref)
        if jnp.issubdtype(x.dtype, jnp.floating)
    )


def assert_trees_close(actual: Any, expected: Any) -> None:
    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected)
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        # (`np.shape`: eager `jax.value_and_grad`, which a plan without remat is, hands back a Python
        # scalar argument returned as aux as JAX's typed scalar, without `.shape`; jitted, an array.)
        assert np.shape(a) == np.shape(e) and a.dtype == e.dtype, (np.shape(a), a.dtype, np.shape(e), e.dtype)
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=RTOL, atol=ATOL)


def decisions(stats: Any) -> tuple:
    """What a run decided, without its wall-clock times."""
    return (
        stats.budget_bytes,
        stats.peak_bytes,
        stats.pinned_bytes,
        stats.evictions,
        stats.dealloc_evictions,
        stats.rematerializations,
        stats.base_cost,
        stats.remat_cost,
        stats.timeline,
    )


def check_run(
    fun: Callable,
    args: tuple,
    expected: Any,
    *,
    argnums: Any,
    has_aux: bool,
    budget: Any,
    heuristic: Any = "dtr_eq",
    dealloc: str = "eager",
    callbacks: Optional[int] = None,
    repeat: bool = False,
    peak: Optional[int] = None,
    kwargs: Optional[dict] = None,
    cost_model: Optional[str] = None,
    log_dir: Optional[str] = None,
    chunks: str = "never",
) -> Optional[Any]:
    """Runs `jdtr.value_and_grad(fun)` once under `budget` and checks it.

    Either the run succeeds, and then: its value and gradients are
    `expected`'s (jax.value_and_grad's); every byte it held stayed within the
    budget, by its own count and by `jax.live_arrays()` after every operator
    (`debug=True`); the caller's arrays are intact; exactly the returned
    arrays survive it; host callbacks ran `callbacks` times. Or it raises a
    clean `jdtr.OutOfBudgetError`, which is only allowed below the
    unconstrained peak (or with dealloc="ignore", which frees nothing), and
    leaves the caller's arrays intact and nothing behind.

    With `repeat`, the same call runs again and must take the same decisions
    (the same statistics and timeline), unless costs are measured. `peak` is
    the unconstrained peak, for budgets given in bytes. With `log_dir`, the
    run also writes its operator log there, and `jdtr.simulate` replaying it
    must take the same decisions (one runtime, two backends; see
    `check_replay`). `chunks` is `jdtr.grad`'s: "auto" runs the repeat as
    compiled chunks (a compilation per chunk: the callers pick few runs).

    Returns the run's `jdtr.Stats`, or None if it was out of budget.
    """
    kwargs = kwargs or {}
    leaves = [x for x in jax.tree_util.tree_leaves((args, kwargs)) if isinstance(x, jax.Array)]
    unconstrained = budget is None or budget == 1.0 or (isinstance(budget, int) and peak is not None and budget >= peak)
    log = None if log_dir is None else os.path.join(log_dir, "run.log")
    wrapped = jdtr.value_and_grad(
        fun, argnums, has_aux, budget=budget, heuristic=heuristic, dealloc=dealloc, cost_model=cost_model,
        return_stats=True, debug=True, timeline=repeat or log is not None, log=log, chunks=chunks,
    )
    before = live_array_ids()
    calls = RECORD.calls
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.filterwarnings("always", category=jdtr.ThrashWarning)  # other warnings stay errors
            result, stats = wrapped(*args, **kwargs)
    except jdtr.OutOfBudgetError as err:
        out_of_budget: Optional[str] = str(err)
        assert not unconstrained or dealloc == "ignore", f"out of budget at {budget}: {err}"
        if isinstance(err, jdtr.OverheadLimitError):  # no candidate fits within MAX_OVERHEAD; one was cut off there
            assert err.suggested_budget_bytes is None or err.suggested_budget_bytes > err.budget_bytes, str(err)
        else:
            assert err.needed_bytes > err.free_bytes, str(err)
    else:
        out_of_budget = None
    if out_of_budget is not None:  # (checked outside the handler, which keeps the failed call's frames alive)
        assert not any(leaf.is_deleted() for leaf in leaves), "a caller's array was deleted"
        assert new_live_arrays(before) == set(), f"a failed run left arrays behind: {out_of_budget}"
        return None
    assert not any(leaf.is_deleted() for leaf in leaves), "a caller's array was deleted"
    assert_trees_close(result, expected)
    assert stats.peak_bytes <= stats.budget_bytes, stats.summary()
    # Thrashing is said when it happens: always online (known as it ends),
    # when a plan is made planned (a plan reused says nothing again).
    thrash = [w.message for w in caught if isinstance(w.message, jdtr.ThrashWarning)]
    assert all(w.overhead > 2.0 and w.overhead == stats.overhead for w in thrash), (thrash, stats.summary())
    if stats.overhead > 2.0 and stats.execution == "online":
        assert thrash, stats.summary()
    assert stats.live_peak_bytes is not None and stats.live_peak_bytes <= stats.budget_bytes, stats.summary()
    if callbacks is not None:
        assert RECORD.calls - calls == callbacks, "host callbacks ran a different number of times than in JAX"
    if unconstrained and dealloc != "ignore":
        assert stats.evictions == 0 and stats.rematerializations == 0, stats.summary()
    returned = {id(x) for x in jax.tree_util.tree_leaves(result) if isinstance(x, jax.Array)} - before
    assert new_live_arrays(before, frozenset(returned)) == returned, "the run left arrays behind"
    if log is not None and callbacks == 0:
        jaxpr = jax.make_jaxpr(jax.value_and_grad(fun, argnums, has_aux))(*args, **kwargs)
        # With measured costs, nothing is known of an operator's cost until it
        # has run, so a run schedules the future in operations; its log holds
        # the measured costs, by which a replay schedules: a heuristic that
        # reads the schedule (lookahead) may decide otherwise (finding 11).
        by_schedule = cost_model == "measured" and jdtr.runtime.get_heuristic(heuristic).uses_schedule
        check_replay(log, stats, heuristic, dealloc, exact="cond[" not in str(jaxpr) and not by_schedule)
    if repeat:
        if cost_model == "measured":
            # Timed costs differ from run to run, and so may the decisions: with
            # dealloc="ignore" a repeat may run out of budget where the first did not
            # (found by `make fuzz`: dtr_local, ignore, budget = the peak).
            try:
                again, _ = wrapped(*args, **kwargs)
            except jdtr.OutOfBudgetError as err:
                assert not unconstrained or dealloc == "ignore", f"out of budget at {budget}: {err}"
                again = None
            if again is not None:
                assert_trees_close(again, result)
        else:
            again, stats_again = wrapped(*args, **kwargs)
            assert decisions(stats_again) == decisions(stats), "the same run took different decisions"
            assert_trees_close(again, result)
    return stats


def evictions_and_replays(events: Any) -> list:
    """The eviction sequence of a timeline: what left and came back, when."""
    return [(e.step, e.clock, e.kind, e.size) for e in events if e.kind in ("evict", "rematerialize")]


def check_replay(log: str, stats: Any, heuristic: Any, dealloc: str, exact: bool = True) -> None:
    """`jdtr.simulate` on the log of a run takes the run's decisions: the same
    peak, the same evictions and rematerializations in the same order at the
    same clock. Costs are whole nanoseconds on both sides, so this is exact.

    The log format cannot say everything a run does: it has no plain read of a
    `cond`'s predicate (the run stamps its last access) and no pinning of an
    effectful operator's outputs. So a program with a `cond` (not `exact`) is
    only checked to replay (its decisions may differ, and so, at the smallest
    budgets, may the outcome), and programs with host callbacks are not
    replayed."""
    trace = jdtr.Trace.from_log(log)
    timeline = Timeline()
    sim = jdtr.simulate(trace, stats.budget_bytes, heuristic, dealloc, overhead_limit=None, observers=[timeline])
    if not exact:
        return
    assert sim.status == "ok", sim.message
    assert (sim.peak_bytes, sim.evictions, sim.dealloc_evictions, sim.rematerializations) == (
        stats.peak_bytes, stats.evictions, stats.dealloc_evictions, stats.rematerializations
    ), "the replay of the run's log took other decisions"
    assert evictions_and_replays(timeline.events) == evictions_and_replays(stats.timeline), "another eviction sequence"
