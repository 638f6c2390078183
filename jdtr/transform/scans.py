"""Scan-aware plans: a `scan` stays a scan, and a strategy decides what its iterations keep.

Unrolling a scan gives DTR one tensor per iteration to decide on, but the
program grows with the trip count, and so do planning and compile time (a
64-step LSTM: 3,479 equations, and at tight budgets no plan at all). A
scan's iterations are alike, so one decision for the body, repeated, is as
good as T of them. A *kept* scan is one equation of the forward program,
run outside every checkpoint segment, under a `ScanStrategy`:

* "all": the body's residuals for every iteration (the scan as JAX makes it);
* "dots": the body under `jax.checkpoint` saving its matmul outputs (no
  batch dimensions), the rest recomputed per iteration in the backward scan;
* "carry": the body under `jax.checkpoint` saving nothing, so only its
  inputs (the carry, per iteration) are kept;
* "pieces": the body cut into pieces, each rematerialized alone (saving
  only its inputs), so each iteration keeps the pieces' inputs and its backward pass
  holds one piece's residuals, not the whole iteration's
  (`body_pieces.py`: where one iteration's working set is the floor);
* "carry" (or "pieces") in 2 (or 3) levels: a scan of scans, T/k outer iterations of a
  checkpointed inner scan of k = sqrt(T): the outer level keeps only the
  carries at segment boundaries, and the backward pass of one segment holds
  k carries (Chen et al.'s sqrt(T)); in 3 levels, T^(1/3) at each. Its
  backward pass is written out (`segmented_scan`), so that every level
  shares one accumulator of the constants' cotangents.

Each saves less than the one before and recomputes more ("pieces" keeps
more than "carry" per iteration and holds less while an iteration's
backward pass runs; both recompute the forward pass once). The planner takes
them in that order and keeps the first whose compiled step fits the budget
(`planning.make_plan`). The program stays a scan, so planning and compile
time do not grow with T.

The memory each strategy keeps (`ScanMemory`) is read from JAX itself: the
residuals of the strategy's `jax.vjp`, traced on shapes.

Inside a scan body, `jax.checkpoint` needs no protection from XLA's CSE on
the CPU: the backward scan's loop recomputes from saved values, and the
forward loop's values are not in reach of it.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import jax
from jax import lax

from ..runtime import format_bytes
from . import _jax_core
from ._jax_core import ScanLayout
from .body_pieces import CutBody, cut_body
from .executable import bound_alike, vary_alike, varying_function
from .normalize import MIN_KEPT_LENGTH, keepable_scan
from .program import Const, Equation, Program, signature
from .save_policy import DOTS, EVERYTHING
from .segmented_scan import segmented_scan


@dataclass(frozen=True)
class ScanStrategy:
    """What every iteration of a kept scan keeps for the backward pass."""

    saves: str = "all"  # "all", "dots", "carry" or "pieces"
    levels: int = 1  # nested scans (2: a scan of checkpointed segments of about sqrt(T) iterations)
    # The scans in its body run under it too (`body_function`): a stacked
    # RNN's scans over time, inside its scan over layers.
    inner: bool = False

    def describe(self, length: int) -> str:
        kept = {
            "all": "every residual",
            "dots": "its matmul outputs",
            "carry": "its carry",
            "pieces": "the inputs of the rematerialized pieces its body is cut into",
        }[self.saves]
        k = _inner_length(length, self.levels)
        nested = f", in {self.levels} nested levels of checkpointed segments ({k} iterations each)" if k > 1 else ""
        inner = ", and so do the iterations of the scans in its body" if self.inner else ""
        return f"each iteration saves {kept}{nested}{inner}"

    @property
    def policy(self):
        """The `jax.checkpoint` policy of one iteration's body."""
        return {
            "all": EVERYTHING,  # (but complex values: `save_policy`)
            "dots": DOTS,
            "carry": jax.checkpoint_policies.nothing_saveable,
            # (no policy on the body cuts it: applied there, it saves the carry)
            "pieces": jax.checkpoint_policies.nothing_saveable,
        }[self.saves]

    @property
    def expressible(self) -> bool:
        """Whether a policy on the scan's body means this strategy (not
        nested levels, not pieces, not its inner scans' iterations:
        structures no policy can make)."""
        return self.levels == 1 and self.saves != "pieces" and not self.inner


# Least recompute first: the planner keeps the first whose step fits.
STRATEGIES = (
    ScanStrategy("all"),
    ScanStrategy("dots"),
    ScanStrategy("carry"),
    ScanStrategy("pieces"),
    ScanStrategy("carry", 2),
    ScanStrategy("pieces", 2),
    ScanStrategy("carry", 3),
    ScanStrategy("pieces", 3),
    # The carry strategies with the scans in their bodies under them: those
    # recompute their own forward pass once more (where no body holds a
    # scan, the programs above: `as_run`). Not "pieces": a piece runs JAX's
    # own inner scan when it is recomputed.
    *(ScanStrategy("carry", levels, inner=True) for levels in (1, 2, 3)),
)


@dataclass(frozen=True)
class ScanMemory:
    """Bytes a kept scan holds for the backward pass: `kept` for the whole
    step (beyond its inputs), `transient` while its backward pass runs."""

    kept: int
    transient: int
    per_iteration: tuple[str, ...] = ()  # what one iteration saves, for `Plan.report`


@dataclass(frozen=True, eq=False)
class KeptScan:
    """A kept scan of a plan's forward program, under its strategy (for `Plan.report`)."""

    position: int  # in the forward program's body
    equation: Equation
    strategy: ScanStrategy
    memory: ScanMemory

    def describe(self) -> str:
        length = self.equation.scan.length
        saved = ", ".join(self.memory.per_iteration) or "nothing"
        return (
            f"scan at {self.equation.source} (equation {self.position}): {length} iterations, "
            f"{self.strategy.describe(length)}: {saved}; {format_bytes(self.memory.kept)} kept in all"
        )


# ------------------------------------------------------------------ running


def run_scan(layout: ScanLayout, strategy: ScanStrategy, *args, varying: bool = False):
    """The scan of `layout` (a jaxpr `scan` equation's) on `args`, under
    `strategy`; with `varying`, its body's primitives bound with the casts
    a `shard_map` body asks for (`executable.varying_function`)."""
    num_consts, num_carry, length, reverse = layout.num_consts, layout.num_carry, layout.length, layout.reverse
    consts, carry, xs = args[:num_consts], args[num_consts : num_consts + num_carry], args[num_consts + num_carry :]
    fun = body_function(layout, strategy, varying)
    if varying:  # the carries vary along every axis an operand does, as the body's outputs will
        carry = (vary_alike([*carry, *consts, *xs]) or carry)[:num_carry]
    # "pieces": each piece rematerialized, the iteration not (`body_pieces`:
    # CSE); where the body has no cut worth making, it runs as "carry" would.
    pieces = body_cut(layout, strategy)
    if pieces is not None:
        fun = pieces.function()
    elif strategy.saves == "pieces":
        strategy = dataclasses.replace(strategy, saves="carry")
    if strategy.levels > 1 and not reverse and pieces is None:
        # Nested segments with one accumulator of the constants' cotangents
        # (`segmented_scan`); a reverse scan keeps `jax.checkpoint`'s nesting.
        body = lambda *a: list(fun(*a))  # noqa: E731
        ys_avals = layout.body.out_avals[num_carry:]
        carry, ys = segmented_scan(
            body, list(consts), list(carry), list(xs), ys_avals, length, _inner_length, strategy.levels
        )
        return [*carry, *ys]

    def step(c, x):
        outs = fun(*consts, *c, *x)
        return list(outs[:num_carry]), list(outs[num_carry:])

    if strategy.saves != "all" and pieces is None:
        step = jax.checkpoint(step, policy=strategy.policy, prevent_cse=False)
    carry, ys = _nested_scan(step, list(carry), list(xs), length, strategy.levels, reverse)
    return [*carry, *ys]


# Call primitives whose body is evaluated in place, so that the scans in
# them are kept too (`jax.jit` inside a model, Flax's lifted transforms).
# Others (`custom_vjp`, `checkpoint`) are bound as they are: their scans
# differentiate by the user's rule.
INLINED_CALLS = ("pjit", "jit", "closed_call", "core_call")


def keepable_scans_in(jaxpr: Any) -> Iterator[Any]:
    """The scan equations of `jaxpr` that could be kept, at any depth of inlined calls."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "scan" and keepable_scan(eqn):
            yield eqn
        elif name in INLINED_CALLS and (call := _jax_core.call_body(eqn)) is not None:
            yield from keepable_scans_in(call[0])


def with_scans_under(closed: Any, strategy: ScanStrategy, varying: bool = False) -> Callable[..., list]:
    """The closed jaxpr as a function, every kept scan (at any depth of
    inlined calls) run under `strategy`: the same values, differentiated
    with what the strategy keeps. With `varying`, bound with the casts a
    `shard_map` body asks for (`executable.varying_function`)."""

    def evaluate(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list:
        env: dict = {}

        def read(atom: Any) -> Any:
            return atom.val if _jax_core.is_literal(atom) else env[atom]

        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            operands = [read(a) for a in eqn.invars]
            name = eqn.primitive.name
            if name == "scan" and keepable_scan(eqn):
                layout = _jax_core.scan_layout(eqn.params)
                outs = run_scan(layout, for_length(strategy, layout.length), *operands, varying=varying)  # stays kept
            elif name in INLINED_CALLS and (call := _jax_core.call_body(eqn)) is not None:
                outs = evaluate(*call, operands)
            elif varying:
                outs = bound_alike(lambda *ops, eqn=eqn: _jax_core.bind_equation(eqn, ops), operands)
            else:
                outs = _jax_core.bind_equation(eqn, operands)
            env.update(zip(eqn.outvars, outs))
        return [read(a) for a in jaxpr.outvars]

    jaxpr, consts = _jax_core.open_jaxpr(closed)
    return lambda *args: evaluate(jaxpr, consts, args)


def nested_scans(layout: ScanLayout) -> list[Any]:
    """The scans in a kept scan's body that could be kept themselves (a
    stacked RNN: a scan over layers of scans over time)."""
    return list(keepable_scans_in(layout.body.jaxpr))


def body_function(layout: ScanLayout, strategy: ScanStrategy, varying: bool = False):
    """A kept scan's body as a function of (consts, carry, one row of xs),
    returning its outputs; with `varying`, bound with a `shard_map` body's
    casts. With `strategy.inner`, the scans nested in it run under
    `strategy` too, in the levels their own length allows. Otherwise an
    inner scan is JAX's own, which makes all of its iterations' residuals
    at once while one outer iteration's backward pass runs (a 4-layer LSTM
    of 64 steps: 8 MiB per layer, and no strategy fitted 0.3 of its step)."""
    if strategy.inner and nested_scans(layout):
        return with_scans_under(layout.body, strategy, varying)
    return varying_function(layout.body) if varying else _jax_core.jaxpr_function(layout.body)


def body_cut(layout: ScanLayout, strategy: ScanStrategy) -> Optional[CutBody]:
    """The pieces a scan's body runs in under `strategy` (None: whole)."""
    if strategy.saves != "pieces":
        return None
    return cut_body(layout.body, layout.num_consts, layout.num_carry, held_iterations(layout.length, strategy.levels))


def for_length(strategy: ScanStrategy, length: int) -> ScanStrategy:
    """`strategy` for a kept scan of `length` iterations: in fewer levels
    where its outer scan would be shorter than `MIN_KEPT_LENGTH`. Such a
    scan is unrolled in the planned program, and so, then, is every segment
    in it: a 12-block scan GPT in 3 levels planned 5,414 equations (8,764 in
    pieces), against 162 in 2, and its search for a plan took minutes."""
    return dataclasses.replace(strategy, levels=levels_within(length, strategy.levels, MIN_KEPT_LENGTH))


def cuts_a_body(strategy: ScanStrategy, layouts: Iterable[ScanLayout]) -> bool:
    """Whether `strategy` cuts the body of any of these kept scans, each in
    the levels its length allows (else "pieces" runs as "carry")."""
    return any(body_cut(layout, for_length(strategy, layout.length)) is not None for layout in layouts)


def as_run(strategy: ScanStrategy, equations: Iterable[Equation]) -> ScanStrategy:
    """`strategy` as these kept scans run it (`with_strategy`): in the most
    levels any of them runs it in (`for_length`), and "pieces" as "carry"
    where no body has a cut (`run_scan`). Where that is not `strategy`, its
    program is one of a strategy before it, which a planner need not try twice.
    `inner` only where a body holds a scan (`nested_scans`)."""
    scans = [e.scan for e in equations]
    if not scans:
        return strategy
    levels = max(for_length(strategy, scan.length).levels for scan in scans)
    carry = strategy.saves == "pieces" and not cuts_a_body(strategy, scans)
    inner = strategy.inner and any(nested_scans(scan) for scan in scans)
    return dataclasses.replace(strategy, levels=levels, saves="carry" if carry else strategy.saves, inner=inner)


def _nested_scan(step, carry: list, xs: list, length: int, levels: int, reverse: bool):
    """`lax.scan(step)` as `levels` nested scans: the outer one over
    checkpointed segments of about length^((levels-1)/levels) iterations,
    each itself nested one level less; a remainder runs as a flat tail."""
    k = _inner_length(length, levels)
    if k == 1:
        return lax.scan(step, carry, xs, length=length, reverse=reverse)
    whole = length // k * k  # iterations in full segments

    def segment(c, i):
        # A segment reads its rows of `xs` where they are (a loop invariant
        # of the outer scan): reshaped to (segments, k, ...) outside it, they
        # would be a copy of every `xs` wherever the reshape runs on its own,
        # as in `jdtr.grad`'s program, while the outer scan keeps only carries.
        x = [lax.dynamic_slice_in_dim(x, i * k, k) for x in xs]
        return _nested_scan(step, c, x, k, levels - 1, reverse)

    segment = jax.checkpoint(segment, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False)

    def run_head(c):
        c, ys = lax.scan(segment, c, jax.numpy.arange(whole // k), length=whole // k, reverse=reverse)
        return c, [y.reshape((whole, *y.shape[2:])) for y in ys]

    def run_tail(c):
        if whole == length:
            return c, None
        return lax.scan(step, c, [x[whole:] for x in xs], length=length - whole, reverse=reverse)

    if reverse:  # the tail's iterations come first
        carry, tail_ys = run_tail(carry)
        carry, head_ys = run_head(carry)
    else:
        carry, head_ys = run_head(carry)
        carry, tail_ys = run_tail(carry)
    if tail_ys is None:
        return carry, head_ys
    return carry, [jax.numpy.concatenate([h, t]) for h, t in zip(head_ys, tail_ys)]


def _inner_length(length: int, levels: int) -> int:
    """Iterations per segment of a `levels`-deep scan (1: a flat scan)."""
    if levels <= 1:
        return 1
    ideal = length ** ((levels - 1) / levels)
    # A divisor of the length near the ideal needs no tail (whose slices and
    # concatenations XLA copies); else the ideal, with a tail.
    divisors = [d for d in range(2, length) if length % d == 0 and ideal / 2 <= d <= ideal * 2]
    k = min(divisors, key=lambda d: abs(math.log(d / ideal))) if divisors else round(ideal)
    return k if 1 < k < length else 1


def held_iterations(length: int, levels: int) -> int:
    """Iterations whose saved values a `levels`-deep scan's backward pass
    holds at once: all of them in one level, else an innermost segment's."""
    k = _inner_length(length, levels)
    while k > 1:
        length, levels = k, levels - 1
        k = _inner_length(length, levels)
    return length


def levels_within(length: int, levels: int, shortest: int) -> int:
    """`levels`, or fewer, so that the outer scan of a nested one keeps at
    least `shortest` iterations (a shorter scan would be unrolled)."""
    while levels > 1 and length // _inner_length(length, levels) < shortest:
        levels -= 1
    return levels


def carries_held(length: int, levels: int) -> int:
    """Carries a nested scan's backward pass holds below its outer level:
    one segment's at each inner level."""
    held, k = 0, _inner_length(length, levels)
    while k > 1:
        inner = _inner_length(k, levels - 1)
        held += k // inner if inner > 1 else k
        length, levels, k = k, levels - 1, inner
    return held


def with_strategy(program: Program, strategy: ScanStrategy) -> Program:
    """The program with every kept scan run under `strategy` (the same values:
    only what the backward pass keeps differs)."""
    body = [_under(item, strategy) if isinstance(item, Equation) and item.scan is not None else item for item in program.body]
    made = Program(program.inputs, program.consts, body, program.outputs)
    made.names = program.names
    return made


def _under(equation: Equation, strategy: ScanStrategy) -> Equation:
    """A kept scan's equation run under `strategy`, in the levels its length
    allows (one function to trace and to run)."""
    run = _traced(equation.scan, for_length(strategy, equation.scan.length), equation.inputs)
    return dataclasses.replace(equation, trace=run, fn=run)


def _traced(layout: ScanLayout, strategy: ScanStrategy, inputs: Optional[Sequence[Any]] = None):
    """`run_scan` on the equation's values, its literal operands put back in
    place; run again with `varying` where JAX refuses its body's binds (in
    a `shard_map` body: an invariant weight meeting a varying carry)."""

    literals = inputs is not None and any(isinstance(a, Const) for a in inputs)

    def run(*args):
        if literals:
            it = iter(args)
            args = tuple(jax.numpy.asarray(a.value) if isinstance(a, Const) else next(it) for a in inputs)
        try:
            return run_scan(layout, strategy, *args)
        except (ValueError, TypeError):
            # Only a body's binds in a `shard_map` are refused for their
            # types: elsewhere the error is the program's own, raised as is.
            if not any(_jax_core.varying_axes(_jax_core.aval_of(a)) for a in args):
                raise
            return run_scan(layout, strategy, *args, varying=True)

    return run


def kept_scans(program: Program) -> dict[int, Equation]:
    """The kept scans of a program's body, by position."""
    return {i: item for i, item in enumerate(program.body) if isinstance(item, Equation) and item.scan is not None}


# ------------------------------------------------------------------- memory


def scan_memory(equation: Equation, strategy: ScanStrategy) -> ScanMemory:
    """What a kept scan keeps under `strategy`, read from its `jax.vjp`'s
    residuals (traced on shapes, once per equation and strategy)."""
    memo = _MEMORY.setdefault(equation, {})
    found = memo.get(strategy)
    if found is None:
        if "iteration" not in memo:  # one iteration's residuals: the same under every strategy
            memo["iteration"] = _iteration_residuals(equation)
        found = memo[strategy] = _measure(equation, strategy, *memo["iteration"])
    return found


# Per kept-scan equation (weakly: a program's equations die with it).
_MEMORY: "weakref.WeakKeyDictionary[Equation, dict]" = weakref.WeakKeyDictionary()


def _specs(equation: Equation) -> tuple[list, list]:
    """The specs of a kept scan's operands (literals too, as `run_scan`
    takes them), and of its body's (one row of each scanned-over operand)."""
    specs = [_spec(a) for a in equation.inputs]
    return specs, _body_specs(equation.scan, specs)


def _body_specs(layout: ScanLayout, specs: list) -> list:
    """The body's operand specs, of the scan's: one row of each scanned-over operand."""
    split = layout.num_consts + layout.num_carry
    return [*specs[:split], *(_row(s) for s in specs[split:])]


def _step(equation: Equation):
    """A kept scan's body as a function of its operands, returning a list."""
    return _listed(_jax_core.jaxpr_function(equation.scan.body))


def _iteration_residuals(equation: Equation) -> tuple[int, tuple[str, ...]]:
    """Bytes and types of what one iteration of the body keeps for its backward pass."""
    return hidden_residuals(_step(equation), _specs(equation)[1], describe=True)


def _measure(equation: Equation, strategy: ScanStrategy, one: int, described: tuple[str, ...]) -> ScanMemory:
    cotangents = sum(v.nbytes for v in equation.outputs[equation.scan.num_carry :])
    return _layout_memory(equation.scan, _specs(equation)[0], cotangents, strategy, one, described)


def _layout_memory(
    layout: ScanLayout, specs: list, cotangents: int, strategy: ScanStrategy, one: int, described: tuple[str, ...]
) -> ScanMemory:
    """`ScanMemory` of a scan on operands of `specs`: `cotangents`, the
    bytes of its stacked outputs (whose cotangents its backward pass
    holds); `one`, one iteration's residuals with its body as JAX makes it."""
    num_consts, num_carry = layout.num_consts, layout.num_carry
    body_specs = _body_specs(layout, specs)
    kept, _ = hidden_residuals(_traced(layout, strategy), specs)
    if strategy.saves == "all":
        return ScanMemory(kept, cotangents, described)
    # It recomputes one iteration's full residuals at a time; a nested
    # strategy also holds one segment's carries at each inner level.
    carry = body_specs[num_consts : num_consts + num_carry]
    carry_bytes = sum(_jax_core.aval_nbytes(s) for s in carry)
    held = carry_bytes * (1 + carries_held(layout.length, strategy.levels))
    pieces = body_cut(layout, strategy)
    if pieces is not None:
        # One piece's residuals at a time, and, nested, the pieces' inputs
        # of an innermost segment's iterations (one level: in `kept`).
        largest = max(hidden_residuals(fn, specs)[0] for fn, specs in pieces.each_piece())
        saved = pieces.saved_inputs()
        per_iteration = sum(_jax_core.aval_nbytes(aval) for aval, _ in saved)
        inner = held_iterations(layout.length, strategy.levels) if strategy.levels > 1 else 0
        described = tuple(f"{_short(s)} (carry)" for s in carry) + tuple(f"{_short(a)} ({what})" for a, what in saved)
        return ScanMemory(kept, cotangents + largest + held + inner * per_iteration, described)
    transient = cotangents + _one_iteration(layout, body_specs, strategy, one) + held
    if strategy.saves in ("carry", "pieces"):
        described = tuple(f"{_short(s)} (carry)" for s in carry)
    else:
        saving = jax.checkpoint(_listed(_jax_core.jaxpr_function(layout.body)), policy=strategy.policy)
        _, saved = hidden_residuals(saving, body_specs, describe=True, producers=False)
        described = tuple(f"{d} (dot_general)" for d in saved)
    return ScanMemory(kept, transient, described)


def _one_iteration(layout: ScanLayout, body_specs: list, strategy: ScanStrategy, one: int) -> int:
    """What one iteration's backward pass holds at once under `strategy`:
    `one`, its residuals as JAX makes them, unless scans nested in its body
    run under the strategy too (`body_function`); then the residuals of the
    body so run, and the largest of those scans' own backward passes."""
    inner = nested_scans(layout) if strategy.inner else []
    if not inner:
        return one
    residuals, _ = hidden_residuals(_listed(body_function(layout, strategy)), body_specs)
    return residuals + max(_nested_transient(eqn, strategy) for eqn in inner)


def _nested_transient(eqn: Any, strategy: ScanStrategy) -> int:
    """What a nested scan's backward pass holds while it runs, under `strategy`
    in the levels its length allows (as `body_function` runs it)."""
    layout = _jax_core.scan_layout(eqn.params)
    specs = [_aval_spec(v.aval) for v in eqn.invars]
    body_specs = _body_specs(layout, specs)
    one, described = hidden_residuals(_listed(_jax_core.jaxpr_function(layout.body)), body_specs, describe=True)
    cotangents = sum(_jax_core.aval_nbytes(v.aval) for v in eqn.outvars[layout.num_carry :])
    own = for_length(strategy, layout.length)
    return _layout_memory(layout, specs, cotangents, own, one, described).transient


def _listed(fun):
    return lambda *args: list(fun(*args))


def _aval_spec(aval: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def _spec(atom: Any) -> jax.ShapeDtypeStruct:
    if isinstance(atom, Const):
        return _aval_spec(_jax_core.aval_of(atom.value))
    return jax.ShapeDtypeStruct(atom.shape, atom.dtype, weak_type=atom.weak_type)


def _short(spec: jax.ShapeDtypeStruct) -> str:
    return f"{spec.dtype}{list(spec.shape)}"


def _row(spec: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(spec.shape[1:], spec.dtype, weak_type=spec.weak_type)


def body_decisions(equation: Equation, strategy: ScanStrategy) -> list[tuple[tuple, bool]]:
    """What a `jax.checkpoint` policy is asked in a kept scan's body, and
    what `strategy` answers: (signature, saved) for each equation JAX's
    partial evaluation shows the policy (the body's linearized primal
    equations, not its own: a `custom_jvp` shows its rule's). Read from JAX
    itself, by a recording policy under `jax.vjp` traced on shapes. Nested
    levels are no policy's to mirror: see `Plan.policy`."""
    answer = strategy.policy
    asked: list[tuple[tuple, bool]] = []

    def recording(prim, *avals, **params):
        saved = bool(answer(prim, *avals, **params))
        asked.append((signature(prim.name, avals), saved))
        return saved

    step = jax.checkpoint(_step(equation), policy=recording, prevent_cse=False)
    hidden_residuals(step, _specs(equation)[1])
    return asked


def hidden_residuals(
    fun, specs: Sequence[jax.ShapeDtypeStruct], describe: bool = False, producers: bool = True
) -> tuple[int, tuple[str, ...]]:
    """Bytes of what `jax.vjp(fun)` keeps for its backward pass beyond its
    own inputs, and (with `describe`) each such residual's type (and the
    primitive that makes it, with `producers`)."""

    def residuals(*args):
        _, pullback = jax.vjp(fun, *args)
        return jax.tree_util.tree_leaves(pullback)

    closed = jax.make_jaxpr(residuals)(*specs)
    jaxpr = closed.jaxpr
    inputs = set(jaxpr.invars)
    for eqn in jaxpr.eqns:  # a reshape of an input is the input's own buffer to XLA
        if eqn.primitive.name in ("reshape", "squeeze", "expand_dims") and eqn.invars[0] in inputs:
            inputs.update(eqn.outvars)
    producer = {v: eqn.primitive.name for eqn in jaxpr.eqns for v in eqn.outvars} if describe else {}
    seen, total, described = set(), 0, []
    for v in jaxpr.outvars:
        if _jax_core.is_literal(v) or v in inputs or v in seen or v in jaxpr.constvars:
            continue
        seen.add(v)
        total += _jax_core.aval_nbytes(v.aval)
        if describe:
            made_by = f" ({producer.get(v, 'constant')})" if producers else ""
            described.append(f"{v.aval.dtype}{list(v.aval.shape)}{made_by}")
    return total, tuple(described)
