"""DTR decisions exported as `jax.checkpoint` segments for compiled code.

`jdtr.grad` pays Python dispatch per equation. For a static computation one
can instead *simulate* DTR once on the traced forward+backward at the
budget, read off which forward values it kept resident until the backward
pass needed them (its persistent checkpoints), and compile that decision:

1. The forward function is traced and normalised (scans unrolled), and every
   forward value gets a `checkpoint_name`.
2. The value-and-grad of that named forward is simulated under the budget
   (the same runtime, with a backend that holds no buffers). A named value
   the backward pass reads and DTR never had to rematerialize is *saved*.
3. The forward equations are cut into segments at points where every value
   crossing the cut is saved: each segment becomes one `jax.checkpoint`
   whose policy saves the segment's saved names, so its other values are
   recomputed when the backward pass reaches it.
4. The compiled step's memory (`memory_analysis()`: arguments + outputs +
   temporaries) is checked against the budget; if XLA needs more than the
   simulation predicted, the plan is redone for a proportionally smaller
   simulated budget.

XLA on the CPU removes `jax.checkpoint`'s optimisation barriers (its
`cse_barrier_expander` pass), after which CSE merges the recomputation back
into the forward pass and nothing is saved. Segments are therefore wrapped,
by default on the CPU, in a `custom_vjp` whose backward runs the segment's
recomputation inside a `lax.cond` on a data-dependent predicate: CSE cannot
reach into a conditional's branch, so the plan survives any compiler flags.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import os
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from ..budget import BudgetLike, parse_budget
from ..runtime import (
    Counters,
    Heuristic,
    NullBackend,
    Observer,
    OutOfBudgetError,
    Runtime,
    ThrashError,
    format_bytes,
    get_heuristic,
)
from .autotune import Timing, can_autotune, example_inputs, median_step_seconds
from .grad import _argnums_tuple, _describe, _leaf_spec, _Static
from .interpreter import Interpreter
from .normalize import normalize
from .program import Cond, Equation, Program, Value

NAME_PREFIX = "jdtr:"
# XLA's buffer assignment is not fully predictable from the plan: a plan
# whose compiled step exceeds the budget by at most this fraction is accepted;
# beyond it, `plan` raises `OutOfBudgetError`.
PLAN_SLACK = 0.10
IMPLEMENTATIONS = ("auto", "checkpoint", "protected")
# Autotuning: step times within this fraction of the fastest count as equal.
TIE_TOLERANCE = 0.02
# Autotuning's candidates: DTR's plans for these fractions of the budget.
# Fine steps matter: on the CPU the fastest transformer plan came from 0.35.
AUTOTUNE_SCALES = (0.7, 0.5, 0.35, 0.25)


# --------------------------------------------------------------------- policy


@dataclass(frozen=True)
class SavePolicy:
    """A `jax.checkpoint` policy: save the values named in `names`.

    Frozen and hashable, so it can be passed to `jax.checkpoint`,
    `flax.nnx.remat` and `flax.linen.remat`. `signatures` additionally saves
    outputs of a primitive with given input shapes and dtypes: this is how a
    plan's decisions carry over to code that does not use jdtr's names (for
    example a Flax module wrapped in `nnx.remat(..., policy=plan.policy)`).
    """

    names: frozenset[str] = frozenset()
    signatures: frozenset[tuple] = frozenset()

    def __call__(self, prim, *avals, **params) -> bool:
        if prim.name == "name":
            return params.get("name") in self.names
        if self.signatures:
            return (prim.name, tuple((tuple(a.shape), str(a.dtype)) for a in avals)) in self.signatures
        return False


# ------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Segment:
    """A run of forward equations wrapped in one `jax.checkpoint`."""

    index: int
    start: int  # first equation (index into the forward program's body)
    stop: int  # one past the last
    inputs: tuple[Value, ...]  # values it reads from earlier segments (saved for its backward)
    outputs: tuple[Value, ...]  # values later segments or the result read
    saved: tuple[Value, ...]  # values inside it kept for the backward pass
    recomputed: tuple[Value, ...]  # values inside it the backward pass recomputes
    # Nested checkpoints, in forward order (empty for a leaf). A segment with
    # children saves nothing but its inputs; when the backward pass reaches
    # it, it is run forward again, its children keep their own inputs and
    # saved values, and then each child recomputes itself in turn.
    children: tuple["Segment", ...] = ()

    @property
    def policy(self) -> SavePolicy:
        return SavePolicy(frozenset(NAME_PREFIX + str(v.id) for v in self.saved))

    @property
    def depth(self) -> int:
        """Levels of nesting: 1 for a leaf."""
        return 1 + max((c.depth for c in self.children), default=0)

    def leaves(self) -> tuple["Segment", ...]:
        if not self.children:
            return (self,)
        return tuple(leaf for c in self.children for leaf in c.leaves())


@dataclass(frozen=True, eq=False)
class Plan:
    """Where a value-and-grad saves and where it recomputes, as checkpoint segments.

    Attributes:
      budget_bytes: the budget the plan was made for (bytes of the whole step).
      segments: the `jax.checkpoint` segments, in forward order.
      saved: every forward value kept for the backward pass (segment inputs included).
      simulated: the DTR simulation the plan was read from (a `jdtr.SimResult`).
      compiled_bytes: XLA's argument + output + temporary bytes of the planned step
        (None if not compiled yet).
      unconstrained_compiled_bytes: the same for `jax.grad` without remat.
      timings: when autotuned (the default), every candidate plan within
        the budget that was compiled and timed (a `Timing` each; one is
        `chosen`); empty with `autotune=False`.
      policy: one `SavePolicy` for the whole plan (names and signatures).
      origin: "dtr" where the segments are read from `simulated`; "uniform"
        for the autotuning candidate of evenly spaced segments that save
        nothing inside (Chen et al.'s sqrt(N) checkpointing; `simulated`
        is then DTR's run at the budget, for comparison).
    """

    budget_bytes: int
    segments: tuple[Segment, ...]
    saved: frozenset[Value]
    simulated: Any  # a jdtr.SimResult
    program: Program = dataclasses.field(repr=False)
    _config: Any = dataclasses.field(repr=False)
    compiled_bytes: Optional[int] = None
    unconstrained_compiled_bytes: Optional[int] = None
    predicted_bytes: int = 0  # the plan's own model of the compiled step
    timings: tuple[Timing, ...] = ()
    origin: str = "dtr"

    @functools.cached_property
    def policy(self) -> SavePolicy:
        names = frozenset(NAME_PREFIX + str(v.id) for s in self.segments for leaf in s.leaves() for v in leaf.saved)
        signatures = set()
        for item in self.program.body:
            if isinstance(item, Equation) and any(v in self.saved for v in item.outputs):
                signatures.add((item.name, tuple((tuple(a.shape), str(a.dtype)) for a in item.args)))
        return SavePolicy(names, frozenset(signatures))

    # ---------------------------------------------------------------- running

    def forward(self, *args, **kwargs):
        """The user's function, run through the plan's checkpoint segments."""
        config = self._config
        leaves = config.traced_leaves(args, kwargs)
        outs = run_segments(self.program, self.segments, leaves, config.implementation)
        return config.unflatten_outputs(outs)

    def value_and_grad(self, *args, **kwargs):
        config = self._config
        return jax.value_and_grad(self.forward, config.argnums, config.has_aux)(*args, **kwargs)

    def grad(self, *args, **kwargs):
        config = self._config
        return jax.grad(self.forward, config.argnums, config.has_aux)(*args, **kwargs)

    # --------------------------------------------------------------- reading

    def report(self) -> str:
        """What each segment saves and recomputes, like `print_saved_residuals`."""
        simulation = (
            f"simulated peak {format_bytes(self.simulated.peak_bytes)} "
            f"(unconstrained {format_bytes(self.simulated.unconstrained_peak_bytes)}), "
            f"simulated overhead {self.simulated.overhead:.3f}x"
        )
        if self.origin == "uniform":
            head = f"{len(self.segments)} uniform segments saving nothing inside (DTR at this budget: {simulation})"
        else:
            head = f"{len(self.segments)} segments, {simulation}"
        lines = [f"jdtr plan: budget {format_bytes(self.budget_bytes)}, {head}"]
        if self.compiled_bytes is not None:
            lines.append(
                f"compiled step: {format_bytes(self.compiled_bytes)} (arguments + outputs + temporaries; "
                f"without remat {format_bytes(self.unconstrained_compiled_bytes or 0)})"
            )
        if self.timings:
            chosen = next(t for t in self.timings if t.chosen)
            others = ", ".join(
                f"{format_bytes(t.compiled_bytes)} {t.seconds * 1e3:.1f} ms" + (" (uniform)" if t.origin == "uniform" else "")
                for t in self.timings
                if not t.chosen
            )
            lines.append(
                f"autotuned: fastest of {len(self.timings)} plans within the budget, "
                f"{chosen.seconds * 1e3:.1f} ms per step (others: {others or 'none'})"
            )
        producer = {v: item for item in self.program.body if isinstance(item, Equation) for v in item.outputs}
        total_in = total_saved = total_recomputed = 0

        def describe(seg: Segment, indent: str) -> None:
            nin, nsaved, nrec = (sum(v.nbytes for v in vs) for vs in (seg.inputs, seg.saved, seg.recomputed))
            nested = f", {len(seg.children)} nested segments" if seg.children else ""
            lines.append(
                f"{indent}segment {seg.index}: equations {seg.start}..{seg.stop - 1}, inputs {format_bytes(nin)}, "
                f"saved {format_bytes(nsaved)}, recomputed {format_bytes(nrec)}{nested}"
            )
            for v in seg.saved:
                item = producer.get(v)
                where = f"{item.name} at {item.source}" if item is not None else "input"
                lines.append(f"{indent}  {v.dtype}{list(v.shape)} saved: output of {where}")
            for child in seg.children:
                describe(child, indent + "  ")

        for seg in self.segments:
            total_in += sum(v.nbytes for v in seg.inputs)
            total_saved += sum(v.nbytes for leaf in seg.leaves() for v in leaf.saved)
            total_recomputed += sum(v.nbytes for v in seg.recomputed)
            describe(seg, "")
        lines.append(
            f"total: segment inputs {format_bytes(total_in)}, saved inside segments {format_bytes(total_saved)}, "
            f"recomputed {format_bytes(total_recomputed)}"
        )
        return "\n".join(lines)


# ------------------------------------------------------------ configuration


@dataclass(frozen=True, eq=False)
class _Config:
    """How the user's function is flattened for planning (not the function
    itself: plans and the planning cache must not keep it alive)."""

    argnums: Union[int, tuple[int, ...]]
    has_aux: bool
    treedef: Any
    specs: tuple
    out_tree: Any
    implementation: str
    differentiated: tuple[bool, ...]  # per leaf: part of a differentiated argument

    def traced_leaves(self, args, kwargs) -> list:
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        return [x for x, s in zip(leaves, self.specs) if not isinstance(s, _Static)]

    def unflatten_outputs(self, outs):
        return jax.tree_util.tree_unflatten(self.out_tree, outs)


def _flatten(fun, argnums, args, kwargs):
    argnum_tuple = _argnums_tuple(argnums)
    for i in argnum_tuple:
        if i >= len(args) or i < -len(args):
            raise TypeError(
                f"differentiating with respect to argnums={argnums} requires at least {max(argnum_tuple) + 1} "
                f"positional arguments to be passed by the caller, but got only {len(args)} positional arguments"
            )
    diff = {i % len(args) for i in argnum_tuple}
    paths, treedef = jax.tree_util.tree_flatten_with_path((args, kwargs))
    specs, flags = [], []
    for path, leaf in paths:
        differentiated = path[0].idx == 0 and path[1].idx in diff
        flags.append(differentiated)
        if isinstance(leaf, jax.core.Tracer):  # inside jit / vmap: only the shape matters
            specs.append(jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=getattr(leaf.aval, "weak_type", False)))
        elif isinstance(leaf, jax.ShapeDtypeStruct):
            specs.append(jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=leaf.weak_type))
        else:
            specs.append(_leaf_spec(leaf, differentiated, f"argument {_describe(path)}"))
    return treedef, tuple(specs), tuple(flags)


def _forward_program(fun, treedef, specs):
    """The forward function's normalised program; inputs are the traced leaves."""
    traced_positions = [i for i, s in enumerate(specs) if not isinstance(s, _Static)]

    def flat_forward(*traced):
        leaves = [s.value if isinstance(s, _Static) else None for s in specs]
        for i, x in zip(traced_positions, traced):
            leaves[i] = x
        args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        return fun(*args, **kwargs)

    closed, out_shape = jax.make_jaxpr(flat_forward, return_shape=True)(*[specs[i] for i in traced_positions])
    return normalize(closed), jax.tree_util.tree_structure(out_shape)


# ----------------------------------------------------- re-tracing a program


def _is_float(v: Value) -> bool:
    return _is_float_dtype(v.dtype)


@functools.lru_cache(maxsize=None)
def _is_float_dtype(dtype) -> bool:
    try:
        return bool(jnp.issubdtype(dtype, jnp.inexact))
    except TypeError:  # extended dtypes (PRNG keys)
        return False


def _run_items(items: Sequence, env: dict, names: Optional[set] = None) -> None:
    """Evaluates program items on traced values; names the outputs in `names`."""
    for item in items:
        if isinstance(item, Equation):
            outs = item.trace(*[env[v] for v in item.args])
            for v, out in zip(item.outputs, outs):
                if names is not None and v in names:
                    out = checkpoint_name(out, NAME_PREFIX + str(v.id))
                env[v] = out
        else:
            env_index = env[item.index]
            operands = [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in item.operands]
            branches = [functools.partial(_run_branch, b) for b in item.branches]
            outs = lax.switch(jnp.clip(env_index, 0, len(branches) - 1), branches, *operands)
            for v, out in zip(item.outputs, outs):
                env[v] = out


def _run_branch(branch: Program, *operands):
    env = dict(zip(branch.inputs, operands))
    for v, array in branch.consts:
        env[v] = array
    _run_items(branch.body, env)
    return [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in branch.outputs]


def _named_forward(program: Program):
    """The forward function with every float value named, for the simulation."""
    named = {v for item in program.body for v in item.outputs if _is_float(v)}

    def forward(*leaves):
        env = dict(zip(program.inputs, leaves))
        for v, array in program.consts:
            env[v] = array
        _run_items(program.body, env, named)
        return [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in program.outputs]

    return forward


# ------------------------------------------------------------ simulation


class _Rematerialized(Observer):
    def __init__(self):
        self.values: set[Value] = set()

    def on_compute(self, op, cost, rematerialization, clock):
        if rematerialization and isinstance(op.payload, Equation):
            self.values.update(op.payload.outputs)


def _largest_branch(cond: Cond) -> int:
    peaks = [b.unconstrained_peak() for b in cond.branches]
    return int(np.argmax(peaks))


def simulate_program(
    program: Program, budget_bytes: int, heuristic, remat_limit_factor: float = 1.0
) -> tuple[Counters, set[Value], Runtime]:
    """DTR on `program` with no buffers; a `cond` takes its most memory-hungry branch."""
    counters, remat = Counters(), _Rematerialized()
    # A plan that recomputes more than the whole step again is not worth reading.
    base = sum(item.cost or 0.0 for item in program.body if isinstance(item, Equation))
    runtime = Runtime(
        NullBackend(),
        budget_bytes,
        heuristic=get_heuristic(heuristic),
        observers=[counters, remat],
        remat_limit=remat_limit_factor * base,
    )
    args = [None] * len(program.inputs)
    Interpreter(runtime, choose_branch=_largest_branch).run(program, args, [True] * len(args))
    return counters, remat.values, runtime


# -------------------------------------------------------------- segmentation


@dataclass
class _Crossings:
    """Liveness of the forward body at every cut position."""

    defined_at: dict
    last_use: dict
    live: list  # live[i]: values crossing a cut placed before item i (i = 1..n-1)


def _crossings(program: Program) -> _Crossings:
    body = program.body
    n = len(body)
    defined_at = {v: -1 for v in program.inputs}
    for v, _ in program.consts:
        defined_at[v] = -1
    last_use = {}
    for i, item in enumerate(body):
        for v in item.outputs:
            defined_at[v] = i
        for v in item.args:
            last_use[v] = i
    for a in program.outputs:
        if isinstance(a, Value):
            last_use[a] = n
    live_now: set[Value] = set()
    live = [frozenset()]
    for i, item in enumerate(body[:-1]):
        live_now.update(v for v in item.outputs if last_use.get(v, -1) > i)
        live_now = {v for v in live_now if last_use.get(v, -1) > i}
        live.append(frozenset(live_now))
    return _Crossings(defined_at, last_use, live)


def _free_to_cross(v: Value, saved: set) -> bool:
    """Crossing a cut costs nothing for saved values (and for small integer ones)."""
    return v in saved or (not _is_float(v) and v.nbytes <= 1024)


def _cut_positions(program: Program, crossings: _Crossings, saved: set, residuals: set, cap: float) -> list[int]:
    """DTR's persistent checkpoints as cuts, plus cuts that keep every segment's
    recomputation under `cap` bytes (at the cheapest crossing in reach)."""
    body = program.body
    n = len(body)
    cuts = [i for i in range(1, n) if all(_free_to_cross(v, saved) for v in crossings.live[i])]
    extra = functools.lru_cache(maxsize=None)(lambda i: _crossing_bytes(crossings, i, saved))
    result, bounds = [], [0, *cuts, n]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        last, acc = start, 0.0
        for i in range(start, stop):
            acc += sum(v.nbytes for v in body[i].outputs if v in residuals and v not in saved)
            if acc > cap and i > last:
                best = min(range(last + 1, i + 1), key=lambda j: (extra(j), -j))
                result.append(best)
                last = best
                acc = sum(v.nbytes for item in body[best : i + 1] for v in item.outputs if v in residuals and v not in saved)
        if stop < n:
            result.append(stop)
    return sorted(set(result))


def _segment(
    program: Program, crossings: _Crossings, saved: set, residuals: set, start: int, stop: int,
    index: int, children: tuple = (), memo: Optional[dict] = None,
) -> Segment:
    """The segment of equations [start, stop); with `children`, a segment that
    saves nothing inside and nests them. `memo` caches the value lists of
    ranges already seen (the nesting search builds the same groups often)."""
    key = (start, stop, bool(children))
    if memo is not None and key in memo:
        fields = memo[key]
    else:
        body = program.body
        inside = [v for item in body[start:stop] for v in item.outputs]
        inside_set = set(inside)
        reads = []
        for item in body[start:stop]:
            for v in item.args:
                if v not in inside_set and v not in reads:
                    reads.append(v)
        leaving = tuple(v for v in inside if crossings.last_use.get(v, -1) >= stop)
        kept = set() if children else saved
        fields = (
            tuple(reads),
            leaving,
            tuple(v for v in inside if v in kept and v not in leaving),
            tuple(v for v in inside if v not in kept and v not in leaving and v in residuals),
        )
        if memo is not None:
            memo[key] = fields
    inputs, outputs, kept_inside, recomputed = fields
    return Segment(index, start, stop, inputs, outputs, kept_inside, recomputed, tuple(children))


def _build_segments(
    program: Program, crossings: _Crossings, saved: set, residuals: set, cuts: Sequence[int]
) -> tuple[Segment, ...]:
    bounds = [0, *cuts, len(program.body)]
    segments = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if start < stop:
            segments.append(_segment(program, crossings, saved, residuals, start, stop, len(segments)))
    return tuple(segments)


def _nest(
    program: Program, crossings: _Crossings, saved: set, residuals: set, leaves: Sequence[Segment],
    depth: int, branching: int, memo: Optional[dict] = None,
) -> tuple[Segment, ...]:
    """Groups consecutive `leaves` into a tree of `depth` levels in which every
    segment holds `branching` segments of the level below (the last fewer)."""
    level = tuple(leaves)
    for _ in range(depth - 1):
        groups = [level[i : i + branching] for i in range(0, len(level), branching)]
        if len(groups) == len(level):
            break
        level = tuple(
            g[0] if len(g) == 1 else _segment(program, crossings, saved, residuals, g[0].start, g[-1].stop, 0, g, memo)
            for g in groups
        )
    return tuple(dataclasses.replace(seg, index=i) for i, seg in enumerate(level))


def _fixed_bytes(program: Program, gradient_bytes: int) -> int:
    return sum(v.nbytes for v in program.inputs) + sum(v.nbytes for v, _ in program.consts) + gradient_bytes


def _transient_bytes(seg: Segment, kept: frozenset) -> int:
    """What a segment's backward pass holds beyond the values kept for the
    whole step: its recomputed values, or, with children, their inputs and
    saved values and then the largest child's own."""
    if not seg.children:
        return sum(v.nbytes for v in seg.recomputed)
    inner = {v for c in seg.children for v in (*c.inputs, *c.saved)} - kept - set(seg.inputs)
    nested = kept | inner
    return sum(v.nbytes for v in inner) + max(_transient_bytes(c, nested) for c in seg.children)


def _predicted_bytes(program: Program, segments: Sequence[Segment], gradient_bytes: int) -> int:
    """A model of the compiled step: arguments and gradients, every value kept
    for the backward pass, and the largest segment's transient values."""
    kept = frozenset(v for s in segments for v in (*s.inputs, *s.saved) if v not in program.inputs)
    base = frozenset(program.inputs) | kept
    transient = max((_transient_bytes(s, base) for s in segments), default=0)
    return _fixed_bytes(program, gradient_bytes) + sum(v.nbytes for v in kept) + transient


def _recompute_cost(program: Program, seg: Segment) -> float:
    """Compute the backward pass spends re-running `seg`: a leaf recomputes
    what it did not save; a segment with children runs forward again first."""
    if not seg.children:
        recomputed = set(seg.recomputed)
        items = program.body[seg.start : seg.stop]
        return sum(_item_cost(item) for item in items if any(v in recomputed for v in item.outputs))
    again = sum(_item_cost(item) for item in program.body[seg.start : seg.stop])
    return again + sum(_recompute_cost(program, c) for c in seg.children)


def _item_cost(item) -> float:
    if isinstance(item, Equation):
        return item.cost if item.cost is not None else 1.0
    return 1.0


def _branchings(count: int, depth: int) -> list[int]:
    """Branching factors worth trying for `count` leaves at `depth` levels:
    those that change the number of top-level segments."""
    if depth == 1 or count < 4:
        return [count]
    found, tops_seen = [], set()
    for b in range(2, count):
        if b ** (depth - 2) * 2 > count:  # the level below the top would hold everything
            break
        tops = -(-count // b ** (depth - 1))
        if tops not in tops_seen:
            tops_seen.add(tops)
            found.append(b)
    return found


def _segments(
    program: Program, saved: set[Value], residuals: set[Value], target_bytes: float, gradient_bytes: int,
    max_depth: int = 1,
) -> tuple[Segment, ...]:
    """Cuts the forward body into checkpoint segments.

    A value crossing a cut becomes an input of the next segment, which JAX
    keeps for that segment's backward pass; so cuts go first where every
    crossing value is one DTR kept anyway (its persistent checkpoints).
    A segment recomputes all of its values at once when the backward pass
    reaches it (DTR would recompute them one by one, recursively), so long
    segments are split further, at the cheapest crossings, under a cap on a
    segment's recomputation. Where even the best flat split does not fit,
    segments are nested (as DTR recomputes recursively): a group of segments
    in one outer checkpoint keeps only the group's inputs for the whole
    step, and the inner segments' inputs only while the group's backward
    runs, for one more forward run of the group.

    Of the candidates (caps x nestings), the least predicted recompute
    among those whose predicted memory fits the target; else the smallest.
    """
    crossings = _crossings(program)
    total = sum(v.nbytes for v in residuals)
    candidates, seen = [], set()
    cap = float(total) + 1
    while cap >= 1:
        cuts = tuple(_cut_positions(program, crossings, saved, residuals, cap))
        cap /= 2
        if cuts in seen:
            continue
        seen.add(cuts)
        leaves = _build_segments(program, crossings, saved, residuals, cuts)
        if _predicted_bytes(program, leaves, gradient_bytes) <= target_bytes:
            return leaves  # the largest cap that fits: the fewest cuts
        candidates.append(leaves)
    fitting, smallest, memo = None, None, {}
    for leaves in candidates:
        for depth in range(2, max_depth + 1):
            for branching in _branchings(len(leaves), depth):
                segments = _nest(program, crossings, saved, residuals, leaves, depth, branching, memo)
                predicted = _predicted_bytes(program, segments, gradient_bytes)
                if smallest is None or predicted < smallest[0]:
                    smallest = (predicted, segments)
                if predicted <= target_bytes:
                    cost = sum(_recompute_cost(program, seg) for seg in segments)
                    if fitting is None or cost < fitting[0]:
                        fitting = (cost, segments)
    flat = min(((_predicted_bytes(program, c, gradient_bytes), c) for c in candidates), key=lambda c: c[0])
    if fitting is not None:
        return fitting[1]
    return min(smallest, flat, key=lambda c: c[0])[1] if smallest is not None else flat[1]


def _uniform_cuts(before: Sequence[int], crossing: Sequence[int], count: int) -> list[int]:
    """Cuts into `count` runs of about equal residual bytes (`before[i]`: the
    residual bytes ahead of item i), each at the cheapest crossing
    (`crossing[i]`) within half a run of its even split point."""
    total = before[-1]
    if total == 0:
        return []
    half = total / (2 * count)
    cuts = []
    for j in range(1, count):
        goal = total * j / count
        window = [i for i in range(cuts[-1] + 1 if cuts else 1, len(before) - 1) if abs(before[i] - goal) <= half]
        if window:
            cuts.append(min(window, key=lambda i: (crossing[i], abs(before[i] - goal))))
    return cuts


def _crossing_bytes(crossings: _Crossings, i: int, saved: set) -> int:
    """What a cut before item `i` keeps beyond `saved`: its other crossing values."""
    return sum(v.nbytes for v in crossings.live[i] if not _free_to_cross(v, saved))


def _uniform_segments(program: Program, residuals: set[Value], gradient_bytes: int) -> tuple[Segment, ...]:
    """Chen et al.'s checkpointing (2016) in jdtr's terms: flat segments that
    save nothing inside, of equal residual bytes, as many as minimise the
    predicted memory (about sqrt(N) for a chain of N layers).

    Every such plan recomputes the whole forward pass once, so they differ
    in memory only; DTR's plans recompute less but, where recomputation is
    nearly free (XLA on the CPU fuses it into the backward pass), can take
    longer for what they store. Autotuning times this plan beside DTR's.
    """
    crossings = _crossings(program)
    before = [0]
    for item in program.body:
        before.append(before[-1] + sum(v.nbytes for v in item.outputs if v in residuals))
    crossing = [0, *(_crossing_bytes(crossings, i, set()) for i in range(1, len(program.body)))]
    memo, found = {}, []
    limit = 2 * int(np.sqrt(len(program.body))) + 2
    for count in range(2, max(limit, 3)):
        cuts = _uniform_cuts(before, crossing, count)
        bounds = [0, *cuts, len(program.body)]
        segments = tuple(
            _segment(program, crossings, set(), residuals, start, stop, i, memo=memo)
            for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:]))
        )
        found.append((_predicted_bytes(program, segments, gradient_bytes), segments))
    # The predicted memory is flat around its minimum (kept inputs trade
    # against the largest recomputation); XLA's own count is lowest in the
    # middle of that plateau, where k + N/k is (measured on chains).
    least = min(predicted for predicted, _ in found)
    plateau = [segments for predicted, segments in found if predicted == least]
    return plateau[len(plateau) // 2]


def _protected_checkpoint(fn: Callable, policy: SavePolicy, differentiable: Sequence[bool]) -> Callable:
    """`jax.checkpoint(fn, policy)` whose backward recomputation XLA cannot merge away.

    The backward pass runs inside `lax.cond` on a predicate XLA cannot decide
    at compile time (the bits of a cotangent element, or-ed with 1, are never
    zero): CSE works within one computation and cannot reach into a branch.
    `differentiable` marks the float inputs; the others (integers, keys) are
    carried as residuals and get no cotangent.
    """
    checkpointed = jax.checkpoint(fn, policy=policy, prevent_cse=True)

    def merge(floats, others):
        floats, others = iter(floats), iter(others)
        return [next(floats) if d else next(others) for d in differentiable]

    @jax.custom_vjp
    def segment(*xs):
        return checkpointed(*xs)

    def forward(*xs):
        floats = [x for x, d in zip(xs, differentiable) if d]
        others = [x for x, d in zip(xs, differentiable) if not d]
        out, vjp_fn = jax.vjp(lambda *f: checkpointed(*merge(f, others)), *floats)
        return out, (vjp_fn, others)

    def backward(residuals, cotangents):
        vjp_fn, _ = residuals
        leaves = [x for x in jax.tree_util.tree_leaves(cotangents) if jnp.issubdtype(x.dtype, jnp.inexact)]
        zeros = lambda f, g: jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(f, g))  # noqa: E731
        if leaves:
            leaf = jnp.ravel(leaves[0])[0]
            bits = lax.bitcast_convert_type(leaf.astype(jnp.float32), jnp.int32)
            run = lambda f, g: f(g)  # noqa: E731
            grads = lax.cond((bits | 1) != 0, run, zeros, vjp_fn, cotangents)
        else:  # no float output: nothing flows back
            grads = zeros(vjp_fn, cotangents)
        return tuple(merge(grads, [None] * (len(differentiable) - len(grads))))

    segment.defvjp(forward, backward)
    return segment


def run_segments(program: Program, segments: Sequence[Segment], leaves: Sequence[Any], implementation: str):
    """Evaluates the forward program segment by segment, each in its own checkpoint."""
    if implementation == "auto":
        implementation = "protected" if jax.default_backend() == "cpu" else "checkpoint"
    env = dict(zip(program.inputs, leaves))
    consts = dict(program.consts)
    env.update(consts)
    for seg in segments:
        _run_segment(program, seg, env, consts, implementation)
    return [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in program.outputs]


def _run_segment(program: Program, seg: Segment, env: dict, consts: dict, implementation: str) -> None:
    """Runs `seg` in its own checkpoint (its children nested inside); adds its outputs to `env`.

    Every input is an explicit argument: a nested segment's backward pass is
    traced after its parent's trace has ended, so it must not close over the
    parent's values (only over the program's constants)."""
    inputs = [v for v in seg.inputs if v not in consts]

    def body(*xs):
        local = {**consts, **dict(zip(inputs, xs))}
        if seg.children:
            for child in seg.children:
                _run_segment(program, child, local, consts, implementation)
        else:
            _run_items(program.body[seg.start : seg.stop], local, set(seg.saved))
        return [local[v] for v in seg.outputs]

    if implementation == "protected":
        wrapped = _protected_checkpoint(body, seg.policy, [_is_float(v) for v in inputs])
    else:
        wrapped = jax.checkpoint(body, policy=seg.policy, prevent_cse=True)
    outs = wrapped(*[env[v] for v in inputs])
    env.update(zip(seg.outputs, outs))


# ---------------------------------------------------------------- planning


def _lower(fn: Callable, specs: Sequence) -> Any:
    structs = [s for s in specs if not isinstance(s, _Static)]
    return jax.jit(fn).lower(*structs)


def _compile_all(lowered: Sequence[Any]) -> list[tuple[Any, int]]:
    """Compiles in threads: XLA compiles without the GIL, so candidates overlap."""
    if len(lowered) < 2:
        return [_compiled_and_bytes(x.compile()) for x in lowered]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(lowered), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda x: _compiled_and_bytes(x.compile()), lowered))


def _compiled_and_bytes(compiled: Any) -> tuple[Any, int]:
    analysis = compiled.memory_analysis()
    if analysis is None:  # some backends do not report
        return compiled, 0
    nbytes = analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
    return compiled, int(nbytes - analysis.alias_size_in_bytes)


def _compiled_bytes(fn: Callable, specs: Sequence) -> int:
    """XLA's argument + output + temporary bytes for `fn` compiled for these shapes."""
    return _compiled_and_bytes(_lower(fn, specs).compile())[1]


def _layout(plan: Plan) -> tuple:
    """What makes two plans the same step: their cuts, nesting and what they save."""

    def of(segments: Sequence[Segment]) -> tuple:
        return tuple((seg.start, seg.stop, tuple(v.id for v in seg.saved), of(seg.children)) for seg in segments)

    return of(plan.segments)


def _backward_reads(forward: Program, vg: Program) -> dict[Value, Value]:
    """The forward values the backward pass reads (the residuals), each with
    its named counterpart in the value-and-grad program."""
    names = {int(k[len(NAME_PREFIX) :]): v for k, v in vg.names.items() if k.startswith(NAME_PREFIX)}
    forward_values = {v.id: v for item in forward.body for v in item.outputs}
    position, last_use = {}, {}
    for i, item in enumerate(vg.body):
        for v in item.outputs:
            position[v] = i
        for v in item.args:
            last_use[v] = i
    # Where the forward pass ends in the value-and-grad program: the last named value.
    forward_end = max((position.get(v, -1) for v in names.values()), default=-1)
    reads = {}
    for value_id, vg_value in names.items():
        fwd_value = forward_values.get(value_id)
        if fwd_value is not None and last_use.get(vg_value, -1) > forward_end:
            reads[fwd_value] = vg_value
    return reads


def _plan_for(planning: "_Planning", sim_budget: int, target: float, heuristic, max_depth: int = 1) -> Optional[Plan]:
    """The plan read from DTR's run at `sim_budget`, or None if DTR runs out
    of memory or thrashes there."""
    config, forward, vg = planning.config, planning.forward, planning.vg
    simulations = planning.simulations  # by simulated budget: searches revisit budgets
    if sim_budget not in simulations:
        try:
            simulations[sim_budget] = simulate_program(vg, sim_budget, heuristic)
        except (OutOfBudgetError, ThrashError):
            # None, not the error: a cached error's traceback would keep
            # this call's frames (and the user's function) alive.
            simulations[sim_budget] = None
    if simulations[sim_budget] is None:
        return None
    counters, rematerialized, runtime = simulations[sim_budget]
    saved = {fwd_value for fwd_value, vg_value in planning.reads.items() if vg_value not in rematerialized}
    gradient_bytes = planning.gradient_bytes
    segments = _segments(forward, saved, planning.residuals, target, gradient_bytes, max_depth)
    saved_all = frozenset(saved | {v for s in segments for v in s.inputs})
    from ..simulator import SimResult  # lazy: the simulator package imports the trace tools

    largest = max(
        (sum(v.nbytes for v in (*item.args, *item.outputs)) for item in vg.body if isinstance(item, Equation)), default=0
    )
    simulated = SimResult(
        status="ok",
        overhead=counters.overhead,
        budget_bytes=sim_budget,
        peak_bytes=counters.peak_bytes,
        unconstrained_peak_bytes=vg.unconstrained_peak(),
        baseline_cost=counters.base_cost,
        remat_cost=counters.remat_cost,
        evictions=counters.evictions,
        dealloc_evictions=counters.dealloc_evictions,
        rematerializations=counters.rematerializations,
        heuristic_evaluations=runtime.heuristic.evaluations,
        metadata_accesses=runtime.heuristic.metadata_accesses,
        constant_bytes=counters.pinned_bytes,
        largest_op_bytes=largest,
        heuristic=runtime.heuristic.name,
        dealloc=runtime.dealloc,
    )
    predicted = _predicted_bytes(forward, segments, gradient_bytes)
    return Plan(0, segments, saved_all, simulated, forward, config, predicted_bytes=predicted)


def _uniform_plan(planning: "_Planning", base: Plan) -> Plan:
    """The uniform-segments candidate, beside DTR's `base` plan for the same step."""
    forward, gradient_bytes = planning.forward, planning.gradient_bytes
    segments = _uniform_segments(forward, planning.residuals, gradient_bytes)
    saved = frozenset(v for s in segments for v in s.inputs)
    predicted = _predicted_bytes(forward, segments, gradient_bytes)
    return dataclasses.replace(
        base, segments=segments, saved=saved, predicted_bytes=predicted, compiled_bytes=None, origin="uniform"
    )


def _value_and_grad_program(config: _Config, forward: Program) -> Program:
    named = _named_forward(forward)
    n_outputs = len(forward.outputs)

    def scalar(*leaves):
        outs = named(*leaves)
        return (outs[0], outs[1:]) if config.has_aux else outs[0]

    traced = [s for s in config.specs if not isinstance(s, _Static)]
    positions = _traced_argnums(config)
    closed = jax.make_jaxpr(jax.value_and_grad(scalar, positions, has_aux=config.has_aux))(*traced)
    del n_outputs
    return normalize(closed)


def _traced_flags(config: _Config) -> list[bool]:
    """Per traced leaf: whether it belongs to a differentiated argument."""
    return [d for d, s in zip(config.differentiated, config.specs) if not isinstance(s, _Static)]


def _traced_argnums(config: _Config) -> tuple[int, ...]:
    """Positions, among the traced leaves, of the leaves of the differentiated arguments."""
    return tuple(i for i, d in enumerate(_traced_flags(config)) if d)


@dataclass(eq=False)
class _Planning:
    """What planning one function for one argument structure computes once
    for every budget: its programs, XLA's bytes without remat, the DTR
    simulations (by simulated budget) and the compiled candidate plans (by
    layout). Reused, like `jax.jit`'s cache, by the function's identity."""

    config: _Config
    forward: Program
    vg: Program
    unconstrained: int
    simulations: dict = dataclasses.field(default_factory=dict)
    executables: dict = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def reads(self) -> dict[Value, Value]:
        """The residuals, each with its counterpart in the value-and-grad program."""
        return _backward_reads(self.forward, self.vg)

    @functools.cached_property
    def residuals(self) -> set[Value]:
        return set(self.reads)

    @functools.cached_property
    def gradient_bytes(self) -> int:
        """Bytes of the gradients the step returns (one per differentiated input)."""
        return sum(v.nbytes for v, d in zip(self.forward.inputs, _traced_flags(self.config)) if d)

    def compile(self, plans: Sequence[Plan]) -> list[tuple[Any, int]]:
        """Each plan's compiled step and XLA's bytes; new layouts are lowered
        one by one, then compiled side by side."""
        new = {}
        for plan in plans:
            layout = _layout(plan)
            if layout not in self.executables and layout not in new:
                new[layout] = _lower(_step_of(plan, self.config), self.config.specs)
        self.executables.update(zip(new, _compile_all(list(new.values()))))
        return [self.executables[_layout(plan)] for plan in plans]


# Planning a function again for the same shapes (another budget, a sweep of
# budgets, a notebook) starts from what was computed before. Held weakly by
# the function, as `jax.jit` does, so that dropping the function frees its
# programs (and any arrays they captured); per function, the last few
# argument structures.
PLANNING_CACHE_SIZE = 8
_planning_cache: "weakref.WeakKeyDictionary[Callable, collections.OrderedDict]" = weakref.WeakKeyDictionary()


def _planning_for(fun, argnums, has_aux, heuristic, implementation, treedef, specs, flags) -> _Planning:
    key = (_argnums_tuple(argnums), has_aux, heuristic, implementation, treedef, specs)
    try:
        entries = _planning_cache.setdefault(fun, collections.OrderedDict())
        found = entries.get(key)
    except TypeError:  # a callable without weak references, or an unhashable heuristic: plan from scratch
        entries, found = None, None
    if found is not None:
        entries.move_to_end(key)
        return found
    forward, out_tree = _forward_program(fun, treedef, specs)
    config = _Config(argnums, has_aux, treedef, specs, out_tree, implementation, flags)
    vg = _value_and_grad_program(config, forward)

    def plain(*traced):
        leaves = [s.value if isinstance(s, _Static) else None for s in specs]
        it = iter(traced)
        leaves = [next(it) if x is None and not isinstance(s, _Static) else x for x, s in zip(leaves, specs)]
        a, kw = jax.tree_util.tree_unflatten(treedef, leaves)
        return jax.grad(fun, argnums, has_aux)(*a, **kw)

    planning = _Planning(config, forward, vg, _compiled_bytes(plain, specs))
    if entries is not None:
        entries[key] = planning
        while len(entries) > PLANNING_CACHE_SIZE:
            entries.popitem(last=False)
    return planning


def make_plan(
    fun: Callable,
    args: tuple,
    kwargs: dict,
    budget: BudgetLike,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    implementation: str = "auto",
    autotune: Optional[bool] = None,
    max_attempts: int = 6,
) -> Plan:
    """Simulates DTR at `budget` and exports its decisions as checkpoint segments."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    budget_spec = parse_budget(budget)
    get_heuristic(heuristic)
    treedef, specs, flags = _flatten(fun, argnums, args, kwargs)
    planning = _planning_for(fun, argnums, has_aux, heuristic, implementation, treedef, specs, flags)
    forward, unconstrained = planning.forward, planning.unconstrained
    target = budget_spec.resolve(unconstrained)
    sim_peak = planning.vg.unconstrained_peak()
    best = chosen = None
    effective_target = float(target)
    tried: set = set()
    compiled: list[tuple[Plan, Any]] = []  # every plan measured, with its executable

    def record(candidate: Plan, executable_and_bytes: tuple[Any, int]) -> Plan:
        executable, nbytes = executable_and_bytes
        measured = dataclasses.replace(
            candidate, budget_bytes=target, compiled_bytes=nbytes, unconstrained_compiled_bytes=unconstrained
        )
        compiled.append((measured, executable))
        return measured

    for _ in range(max_attempts):
        plan = _search_simulated_budget(planning, sim_peak, effective_target, heuristic)
        if plan is None:
            break
        if _layout(plan) in tried:
            break  # asking for less no longer changes the plan: nothing better to find
        tried.add(_layout(plan))
        plan = record(plan, planning.compile([plan])[0])
        if best is None or plan.compiled_bytes < best.compiled_bytes:
            best = plan
        if plan.compiled_bytes <= target:
            chosen = plan
            break
        # XLA needed more than the plan's memory model predicted: plan for
        # proportionally less.
        effective_target *= target / plan.compiled_bytes * 0.97
    if chosen is None and best is not None and best.compiled_bytes <= target * (1 + PLAN_SLACK):
        chosen = best
    if chosen is None:
        # No plan fits: say so rather than hand back a step over the budget.
        fixed = _fixed_bytes(forward, planning.gradient_bytes)
        needed = unconstrained if best is None else best.compiled_bytes
        source = "the smallest checkpoint plan found" if best is not None else None
        if implementation == "checkpoint" and jax.default_backend() == "cpu":
            source = (
                'the smallest plan found with implementation="checkpoint" (XLA on the CPU removes '
                'checkpoint barriers and merges the recomputation away; use implementation="auto")'
            )
        raise OutOfBudgetError(
            needed_bytes=max(needed - fixed, 0),
            free_bytes=max(int(target) - fixed, 0),
            pinned_bytes=fixed,
            locked_bytes=0,
            budget_bytes=int(target),
            op_name="the compiled step",
            source=source,
        )
    if autotune is False:
        return chosen
    structs = [s for s in specs if not isinstance(s, _Static)]
    if not can_autotune(structs):
        if autotune:  # asked for explicitly: say why it did not happen
            warnings.warn(
                "autotune needs example inputs and cannot make PRNG keys; the plan is chosen by memory", stacklevel=3
            )
        return chosen
    # Candidates: the plans DTR makes for smaller budgets, which also fit.
    # Coarser searches suffice for them (within 1/64 of the peak), and they
    # are lowered first, then compiled side by side.
    candidates = []
    for scale in AUTOTUNE_SCALES:
        plan = _search_simulated_budget(planning, sim_peak, effective_target * scale, heuristic, steps=6)
        if plan is not None and _layout(plan) not in tried:
            tried.add(_layout(plan))
            candidates.append(plan)
    uniform = _uniform_plan(planning, chosen)
    if uniform.predicted_bytes <= effective_target and _layout(uniform) not in tried:
        candidates.append(uniform)
    for candidate, executable_and_bytes in zip(candidates, planning.compile(candidates)):
        record(candidate, executable_and_bytes)
    # The steps are timed on the caller's own arrays where they are concrete:
    # example inputs would sit on the device beside them, and a candidate
    # within the budget plus a second copy of the arguments is not (on an
    # H100 autotuning peaked 8% over the budget that way). Under a trace
    # there are none, so a candidate is timed only if it fits with the copy.
    inputs = _concrete_inputs(args, kwargs, specs)
    copies = 0
    if inputs is None:
        inputs = example_inputs(structs)
        copies = sum(int(x.nbytes) for x in inputs)
    limit = max(target, chosen.compiled_bytes)
    fitting = [(plan, executable) for plan, executable in compiled if plan.compiled_bytes + copies <= limit]
    if not fitting:
        return chosen  # none can run beside the copy within the budget: chosen by memory
    seconds = median_step_seconds([executable for _, executable in fitting], inputs)
    # Within 2% of the fastest is a tie (timing noise): the smallest of those wins.
    ties = [i for i, s in enumerate(seconds) if s <= min(seconds) * (1 + TIE_TOLERANCE)]
    fastest = min(ties, key=lambda i: fitting[i][0].compiled_bytes)
    timings = tuple(
        Timing(plan.compiled_bytes, s, len(plan.segments), chosen=i == fastest, origin=plan.origin)
        for i, ((plan, _), s) in enumerate(zip(fitting, seconds))
    )
    return dataclasses.replace(fitting[fastest][0], timings=timings)


def _concrete_inputs(args: tuple, kwargs: dict, specs: Sequence[Any]) -> Optional[list]:
    """The caller's traced leaves as they are, when none is abstract (a
    tracer or a `ShapeDtypeStruct`): what the compiled steps take."""
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    if any(isinstance(leaf, (jax.core.Tracer, jax.ShapeDtypeStruct)) for leaf in leaves):
        return None
    return [leaf for leaf, spec in zip(leaves, specs) if not isinstance(spec, _Static)]


def _search_simulated_budget(
    planning: _Planning, sim_peak: int, target: float, heuristic, steps: int = 10
) -> Optional[Plan]:
    """The plan for the largest simulated budget whose predicted compiled
    memory fits `target` (bisection: less budget, fewer values kept), flat
    if any flat plan fits, else with nested segments.

    The simulation and XLA count differently (XLA fuses, so it keeps fewer
    and smaller residuals), so the simulated budget is searched for rather
    than scaled: what must fit is the plan's prediction in XLA's terms.
    """
    smallest = None
    for max_depth in (1, 3):  # nest segments only where no flat plan fits
        lo, hi = 0.0, float(sim_peak)
        fitting = None
        for _ in range(steps):
            mid = (lo + hi) / 2
            plan = _plan_for(planning, max(int(mid), 1), target, heuristic, max_depth)
            if plan is None:  # infeasible at this budget: go higher
                lo = mid
                continue
            if smallest is None or plan.predicted_bytes < smallest.predicted_bytes:
                smallest = plan
            if plan.predicted_bytes <= target:
                fitting, lo = plan, mid
            else:
                hi = mid
        if fitting is not None:
            return fitting
    return smallest


def _step_of(plan: Plan, config: _Config) -> Callable:
    return lambda *traced: _grad_of(plan, config, traced)


def _grad_of(plan: Plan, config: _Config, traced):
    positions = _traced_argnums(config)

    def f(*leaves):
        outs = run_segments(plan.program, plan.segments, leaves, config.implementation)
        return (outs[0], outs[1:]) if config.has_aux else outs[0]

    return jax.grad(f, positions, has_aux=config.has_aux)(*traced)


# -------------------------------------------------------------------- API


def plan(
    fun: Callable,
    *args,
    budget: BudgetLike,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    implementation: str = "auto",
    autotune: Optional[bool] = None,
    **kwargs,
) -> Plan:
    """A checkpoint plan for `fun`'s gradient at `budget`.

    Args:
      fun: the scalar function to differentiate.
      *args, **kwargs: example arguments (arrays or `jax.ShapeDtypeStruct`s).
      budget: bytes, a size string, or a fraction of the compiled step's
        memory without remat (XLA's arguments + outputs + temporaries).
      argnums, has_aux: as in `jax.grad`.
      heuristic: the DTR heuristic simulated.
      implementation: "checkpoint" (plain `jax.checkpoint` segments),
        "protected" (segments XLA's CSE cannot undo) or "auto" (protected
        on the CPU, where XLA strips checkpoint barriers).
      autotune: whether to choose among plans by timing them. By default
        (None) and with True, the plans DTR makes for 0.7, 0.5, 0.35 and
        0.25 of the budget are compiled too, every plan within the budget
        runs a few steps on example inputs during planning, and the fastest
        is kept (`plan.timings` lists them; within 2% of the fastest is a
        tie, won by the smaller plan). Where recomputation is cheap (XLA on
        the CPU) the fastest plan is often one that saves less than DTR's
        cost model prefers. This makes planning a few times slower (more
        compiles); False plans by the cost model alone. Without example
        inputs (PRNG key arguments) the cost model decides; True then warns.

    Raises:
      OutOfBudgetError: if no plan's compiled step fits the budget (within
        `PLAN_SLACK`, 10%, of XLA's buffer assignment); the message says how
        much the smallest plan found needs.

    Returns:
      A `Plan`: `plan.grad`, `plan.value_and_grad`, `plan.policy`,
      `plan.segments`, `plan.report()`.

    Example:
      >>> plan = jdtr.plan(loss, params, batch, budget=0.4)
      >>> grads = jax.jit(plan.grad)(params, batch)
    """
    return make_plan(fun, args, kwargs, budget, argnums, has_aux, heuristic, implementation, autotune)


class _RematGrad:
    def __init__(self, fun, argnums, has_aux, budget, heuristic, implementation, autotune, value):
        parse_budget(budget)
        get_heuristic(heuristic)
        _argnums_tuple(argnums)
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
        self.fun, self.argnums, self.has_aux = fun, argnums, has_aux
        self.budget, self.heuristic, self.implementation, self.value = budget, heuristic, implementation, value
        self.autotune = autotune
        self.plans: dict[Hashable, Plan] = {}
        functools.update_wrapper(self, fun)

    def plan_for(self, *args, **kwargs) -> Plan:
        treedef, specs, _ = _flatten(self.fun, self.argnums, args, kwargs)
        key = (treedef, specs)
        found = self.plans.get(key)
        if found is None:
            # The arguments themselves (tracers under jit): autotuning times
            # concrete ones in place instead of a copy beside them.
            found = make_plan(
                self.fun, args, kwargs, self.budget, self.argnums, self.has_aux, self.heuristic,
                self.implementation, self.autotune,
            )
            self.plans[key] = found
        return found

    def __call__(self, *args, **kwargs):
        plan = self.plan_for(*args, **kwargs)
        return plan.value_and_grad(*args, **kwargs) if self.value else plan.grad(*args, **kwargs)


def remat_grad(
    fun: Callable,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    *,
    budget: BudgetLike,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    implementation: str = "auto",
    autotune: Optional[bool] = None,
) -> Callable:
    """Like `jax.grad`, with DTR's decisions compiled in as checkpoint segments.

    Jittable and vmappable: the plan depends only on shapes, is made on the
    first call for each argument structure, and is cached. `budget` is
    bytes, a size string, or a fraction of the memory XLA needs for
    `jax.grad(fun)` (arguments + outputs + temporaries). `implementation`
    and `autotune` as in `jdtr.plan`.

    Example:
      >>> step_grad = jax.jit(jdtr.remat_grad(loss, budget="2GiB"))
    """
    return _RematGrad(fun, argnums, has_aux, budget, heuristic, implementation, autotune, value=False)


def remat_value_and_grad(
    fun: Callable,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    *,
    budget: BudgetLike,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    implementation: str = "auto",
    autotune: Optional[bool] = None,
) -> Callable:
    """`jax.value_and_grad` with DTR's decisions compiled in; see `remat_grad`."""
    return _RematGrad(fun, argnums, has_aux, budget, heuristic, implementation, autotune, value=True)
