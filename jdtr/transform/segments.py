"""Where a plan cuts the forward pass: checkpoint segments and what they save.

A value crossing a cut becomes an input of the next segment, which JAX
keeps for that segment's backward pass; so cuts go first where every
crossing value is one DTR kept anyway (its persistent checkpoints), then
where a segment's recomputation would grow too large, at the cheapest
crossings; where no flat cut fits, segments nest. Also Chen et al.'s
uniform segments, and the memory model every candidate is judged by.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from .program import Equation, Program, Value, definitions, last_reads
from .save_policy import NAME_PREFIX, SavePolicy
from .scans import ScanMemory


# Groups nested to the left (`_nest_left`) hold at most this many leaves: a
# group recomputes its leaves quadratically often, and its depth (one level
# per leaf) is traced and compiled as nested checkpoints. 16: a 16-layer MLP
# whose arguments and gradients take 9 of `jax.grad`'s 26 MiB comes to half
# of them only in groups of 14 layers or more (13 MiB; groups of 8 take 14).
LEFT_NESTED_MAX = 16

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
    # Also saved: the outputs of equations JAX's derivatives bind with these
    # signatures (`signature`), values no name reaches (`costly.hidden_residuals`).
    signatures: frozenset = frozenset()

    @property
    def policy(self) -> SavePolicy:
        return SavePolicy(frozenset(NAME_PREFIX + str(v.id) for v in self.saved), self.signatures)

    @property
    def depth(self) -> int:
        """Levels of nesting: 1 for a leaf."""
        return 1 + max((c.depth for c in self.children), default=0)

    def leaves(self) -> tuple["Segment", ...]:
        if not self.children:
            return (self,)
        return tuple(leaf for c in self.children for leaf in c.leaves())


def is_float(v: Value) -> bool:
    return _is_float_dtype(v.dtype)


@functools.lru_cache(maxsize=None)
def _is_float_dtype(dtype) -> bool:
    try:
        return bool(jnp.issubdtype(dtype, jnp.inexact))
    except TypeError:  # extended dtypes (PRNG keys)
        return False


# -------------------------------------------------------------- segmentation


@dataclass
class _Crossings:
    """Liveness of the forward body at every cut position."""

    defined_at: dict
    last_use: dict
    live: list  # live[i]: values crossing a cut placed before item i (i = 1..n-1)
    # (start, stop) -> the values made in that run of items, those it reads
    # from before it and those read after it (`_segment`): what is saved
    # does not change them.
    ranges: dict = field(default_factory=dict)
    range_values: int = 0  # the references `ranges` holds, bounded by RANGE_VALUES_MAX


# One per program, kept on it (its body is not changed once built): the
# search cuts the same forward body for every simulated budget it tries.
# Planning a transformer in `nnx.scan` at 12 MiB cut it 148 times, building
# 818k segments, most of them of ranges seen in an earlier cut.
# A program's `ranges` are dropped past this many value references (8 bytes
# each): a 430-equation GPT's search held 118k of them.
RANGE_VALUES_MAX = 4_000_000


def _crossings(program: Program) -> _Crossings:
    found = program.memo.crossings
    if found is None:
        found = program.memo.crossings = _liveness_at_cuts(program)
    return found


def _liveness_at_cuts(program: Program) -> _Crossings:
    body = program.body
    defined_at, last_use = definitions(program), last_reads(program)
    live_now: set[Value] = set()
    live = [frozenset()]
    for i, item in enumerate(body[:-1]):
        live_now.update(v for v in item.outputs if last_use.get(v, -1) > i)
        live_now = {v for v in live_now if last_use.get(v, -1) > i}
        live.append(frozenset(live_now))
    return _Crossings(defined_at, last_use, live)


def _free_to_cross(v: Value, saved: set) -> bool:
    """Crossing a cut costs nothing for saved values (and for small integer ones)."""
    return v in saved or (not is_float(v) and v.nbytes <= 1024)


class _Cuts:
    """The cuts of one forward body for one saved set, under any cap on a
    segment's recomputation: what does not depend on the cap (the
    persistent checkpoints, each item's recomputed bytes, each crossing's
    cost) computed once, since `segments` tries a cap per halving."""

    def __init__(self, program: Program, crossings: _Crossings, saved: set, residuals: set, scans: Mapping = {}):
        body = program.body
        self.n = n = len(body)
        self.crossings, self.saved = crossings, saved
        persistent = {i for i in range(1, n) if all(_free_to_cross(v, saved) for v in crossings.live[i])}
        self.persistent = sorted(persistent | {j for i in scans for j in (i, i + 1) if 0 < j < n})
        self.recomputed = [sum(v.nbytes for v in item.outputs if v in residuals and v not in saved) for item in body]
        self._extra: dict[int, int] = {}

    def _extra_bytes(self, i: int) -> int:
        found = self._extra.get(i)
        if found is None:
            found = self._extra[i] = _crossing_bytes(self.crossings, i, self.saved)
        return found

    def under(self, cap: float) -> list[int]:
        """DTR's persistent checkpoints as cuts, plus cuts that keep every
        segment's recomputation under `cap` bytes (at the cheapest crossing
        in reach), and cuts around every kept scan (which runs outside the
        segments)."""
        recomputed, result, bounds = self.recomputed, [], [0, *self.persistent, self.n]
        for start, stop in zip(bounds[:-1], bounds[1:]):
            last, acc = start, 0.0
            for i in range(start, stop):
                acc += recomputed[i]
                if acc > cap and i > last:
                    best = min(range(last + 1, i + 1), key=lambda j: (self._extra_bytes(j), -j))
                    result.append(best)
                    last = best
                    acc = sum(recomputed[best : i + 1])
            if stop < self.n:
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
        inside, reads, leaving = _range(program, crossings, start, stop)
        staying = [v for v in inside if v not in leaving]
        kept = () if children else saved
        fields = (
            reads,
            tuple(leaving),
            tuple(v for v in staying if v in kept),
            tuple(v for v in staying if v not in kept and v in residuals),
        )
        if memo is not None:
            memo[key] = fields
    inputs, outputs, kept_inside, recomputed = fields
    return Segment(index, start, stop, inputs, outputs, kept_inside, recomputed, tuple(children))


def _range(program: Program, crossings: _Crossings, start: int, stop: int) -> tuple[tuple, tuple, dict]:
    """The values items [start, stop) make, in order; those they read from
    before them, in order of first read; and those read after them (as a
    dict: ordered, and read by membership)."""
    found = crossings.ranges.get((start, stop))
    if found is None:
        items = program.body[start:stop]
        inside = tuple(v for item in items for v in item.outputs)
        inside_set = set(inside)
        reads: dict = {}
        for item in items:
            for v in item.args:
                if v not in inside_set:
                    reads[v] = None
        last_use = crossings.last_use
        leaving = {v: None for v in inside if last_use.get(v, -1) >= stop}
        found = (inside, tuple(reads), leaving)
        size = len(inside) + len(reads) + len(leaving)
        if crossings.range_values + size > RANGE_VALUES_MAX:
            crossings.ranges.clear()
            crossings.range_values = 0
        crossings.ranges[(start, stop)] = found
        crossings.range_values += size
    return found


def _build_segments(
    program: Program, crossings: _Crossings, saved: set, residuals: set, cuts: Sequence[int], scans: Mapping = {}
) -> tuple[Segment, ...]:
    bounds = [0, *cuts, len(program.body)]
    segments = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if start < stop and not (stop == start + 1 and start in scans):  # a kept scan runs outside
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


def fixed_bytes(program: Program, gradient_bytes: int) -> int:
    return program.held_bytes + gradient_bytes


def _transient_bytes(seg: Segment, kept: frozenset, held: frozenset = frozenset()) -> int:
    """What a segment's backward pass holds beyond the values kept for the
    whole step: its recomputed values, or, with children, their inputs and
    saved values and then the largest child's own. (`held`: what the levels
    above hold meanwhile; apart from `kept`, which is the whole step's and
    large, so that no level copies it.)"""
    if not seg.children:
        return sum(v.nbytes for v in seg.recomputed)
    # (a set's difference iterates over the smaller side: `kept` is not walked)
    inner = {v for c in seg.children for v in (*c.inputs, *c.saved)} - kept
    inner -= held
    inner.difference_update(seg.inputs)
    nested = held | inner
    return sum(v.nbytes for v in inner) + max(_transient_bytes(c, kept, nested) for c in seg.children)


def predicted_bytes(
    program: Program, segments: Sequence[Segment], gradient_bytes: int, scans: Optional[Mapping[int, ScanMemory]] = None
) -> int:
    """A model of the compiled step: arguments and gradients, every value kept
    for the backward pass, and the largest segment's transient values. A kept
    scan (`scans`, by position; outside every segment) keeps its inputs and
    what its strategy keeps, and holds its transient bytes in its backward pass."""
    scans = scans or {}
    scan_inputs = (v for i in scans for v in program.body[i].args if is_float(v))
    kept = frozenset(v for s in segments for v in (*s.inputs, *s.saved) if v not in program.inputs)
    kept |= frozenset(v for v in scan_inputs if v not in program.inputs)
    base = frozenset(program.inputs) | kept
    transient = max(
        (*(_transient_bytes(s, base) for s in segments), *(m.transient for m in scans.values())), default=0
    )
    scan_kept = sum(m.kept for m in scans.values())
    return fixed_bytes(program, gradient_bytes) + sum(v.nbytes for v in kept) + scan_kept + transient


def recompute_cost(program: Program, segments: Sequence[Segment], reruns_whole: Optional[Callable] = None) -> float:
    """What the compiled backward pass reruns of `segments` (cost-model units):
    a leaf reruns every equation a recomputed residual is made of, through
    values it does not save, and each equation `reruns_whole(leaf, item)`
    names, with what it reads (`costly.keeps_hidden`: derivatives that keep
    values no name reaches); a segment with children runs forward again
    whole first."""
    producers = _crossings(program).defined_at  # (`definitions`, kept per program)
    return sum(_recompute_cost(program, producers, seg, reruns_whole) for seg in segments)


def _recompute_cost(program: Program, producers: dict, seg: Segment, reruns_whole) -> float:
    body = program.body
    if seg.children:
        again = sum(item_cost(item) for item in body[seg.start : seg.stop])
        return again + sum(_recompute_cost(program, producers, c, reruns_whole) for c in seg.children)
    known = {*seg.inputs, *seg.saved}
    rerun = {i for i in range(seg.start, seg.stop) if reruns_whole is not None and reruns_whole(seg, body[i])}
    pending = [*seg.recomputed, *(v for i in rerun for v in body[i].args)]
    while pending:
        v = pending.pop()
        i = producers.get(v, -1)  # (-1: an input of the program)
        if i in rerun or not seg.start <= i < seg.stop or v in known:
            continue
        rerun.add(i)
        pending.extend(body[i].args)
    return sum(item_cost(body[i]) for i in rerun)


def item_cost(item) -> float:
    """An item's cost in the cost model's units (1 where it has none: a cond, a measured cost)."""
    return item.cost if isinstance(item, Equation) and item.cost is not None else 1.0


def _nest_left(
    program: Program, crossings: _Crossings, saved: set, residuals: set, leaves: Sequence[Segment],
    size: int, memo: Optional[dict] = None,
) -> tuple[Segment, ...]:
    """Groups of `size` consecutive `leaves`, each nested to the left:
    ((l1, l2), l3) for three. While a group's backward pass runs, it keeps
    its own input and the input of the one leaf whose backward pass runs,
    recomputing the leaves before it once per leaf (quadratic in `size`), as
    the binomial checkpointing of Griewank's `revolve` does with one
    checkpoint. Where XLA's backward work on a saved activation may start as
    soon as that activation exists (the transposed copies of a convolution's
    weight gradient on the CPU), a group keeps fewer of them at once than
    groups whose leaves are its direct children (uniform `_nest`)."""
    out = []
    for run in _adjacent_runs(leaves):  # a group must not span what runs outside every segment (a kept scan)
        for i in range(0, len(run), size):
            group = run[i : i + size]
            seg = group[0]
            for leaf in group[1:]:
                seg = _segment(program, crossings, saved, residuals, seg.start, leaf.stop, 0, (seg, leaf), memo)
            out.append(seg)
    return tuple(dataclasses.replace(seg, index=i) for i, seg in enumerate(out))


def _adjacent_runs(leaves: Sequence[Segment]) -> list[list[Segment]]:
    """`leaves` split where one does not start where the one before it stops."""
    runs: list[list[Segment]] = []
    for leaf in leaves:
        if runs and runs[-1][-1].stop == leaf.start:
            runs[-1].append(leaf)
        else:
            runs.append([leaf])
    return runs


def nested_left(
    program: Program, segments: Sequence[Segment], residuals: set[Value], below: float = float("inf")
) -> list[tuple[Segment, ...]]:
    """The leaves of `segments` regrouped to the left (`_nest_left`), one
    plan per group size that recomputes less than `below`, least recompute
    first (larger groups keep less and recompute more). XLA's bytes for
    them are not what `predicted_bytes` says on convolutions on the CPU, so
    the planner measures them (`plan_search.PlanSearch`)."""
    leaves = [leaf for seg in segments for leaf in seg.leaves()]
    crossings, memo = _crossings(program), {}
    found = []
    for size in range(2, min(LEFT_NESTED_MAX, len(leaves)) + 1):
        nested = _nest_left(program, crossings, set(), residuals, leaves, size, memo)
        found.append((recompute_cost(program, nested), nested))
    return [nested for cost, nested in sorted(found, key=lambda c: c[0]) if cost < below]


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


class FlatCuts:
    """The flat candidates of one forward body for one saved set, in the
    order `segments` tries them (a cap on a segment's recomputation, halved
    each time), with their predicted bytes, made as far as a call needs
    them; and the memo of their nestings. A search cuts the same body for
    the same saved set (one simulated budget) at each nesting depth and at
    each attempt's target: unrolled, the 8-block scan transformer's error
    cut it 118 times for 12 saved sets, 16 s of its 62."""

    def __init__(self, program: Program, saved: set, residuals: set, gradient_bytes: int, scans: Mapping):
        self.program, self.saved, self.residuals, self.gradient_bytes, self.scans = program, saved, residuals, gradient_bytes, scans
        self.cutter = _Cuts(program, _crossings(program), saved, residuals, scans)
        self.cap = float(sum(v.nbytes for v in residuals)) + 1
        self.seen: set = set()
        self.made: list[tuple[tuple[Segment, ...], int]] = []
        self.memo: dict = {}

    def flat(self):
        yield from self.made  # (a caller that returns early leaves the rest unmade)
        while self.cap >= 1:
            cuts = tuple(self.cutter.under(self.cap))
            self.cap /= 2
            if cuts in self.seen:
                continue
            self.seen.add(cuts)
            leaves = _build_segments(self.program, _crossings(self.program), self.saved, self.residuals, cuts, self.scans)
            self.made.append((leaves, predicted_bytes(self.program, leaves, self.gradient_bytes, self.scans)))
            yield self.made[-1]


# Per program (on it), the `FlatCuts` of its last saved sets.
FLAT_CUTS_KEPT = 32


def flat_cuts(program: Program, saved: set, residuals: set, gradient_bytes: int, scans: Mapping) -> FlatCuts:
    """The flat candidates of `program` for `saved` (kept for its recent saved sets)."""
    kept = program.memo.flat_cuts
    key = (frozenset(saved), frozenset(residuals), gradient_bytes, tuple(sorted(scans.items())))
    found = kept.pop(key, None) or FlatCuts(program, saved, residuals, gradient_bytes, scans)
    kept[key] = found  # the most recent last
    while len(kept) > FLAT_CUTS_KEPT:
        del kept[next(iter(kept))]
    return found


def segments(
    program: Program, saved: set[Value], residuals: set[Value], target_bytes: float, gradient_bytes: int,
    max_depth: int = 1, scans: Optional[Mapping[int, ScanMemory]] = None,
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

    Kept scans (`scans`, by position, with what their strategy keeps) run
    outside every segment: cuts fall on both sides of them, and segments do
    not nest across them.
    """
    scans = scans or {}
    if scans:
        max_depth = 1
    crossings = _crossings(program)
    cuts = flat_cuts(program, saved, residuals, gradient_bytes, scans)
    for leaves, predicted in cuts.flat():
        if predicted <= target_bytes:
            return leaves  # the largest cap that fits: the fewest cuts
    candidates = [leaves for leaves, _ in cuts.flat()]
    fitting, smallest, memo = None, None, cuts.memo
    for i, leaves in enumerate(candidates):
        for depth in range(2, max_depth + 1):
            for branching in _branchings(len(leaves), depth):
                key = ("nested", i, depth, branching)  # (the candidates' order is kept: `FlatCuts.made`)
                if key not in memo:
                    nested = _nest(program, crossings, saved, residuals, leaves, depth, branching, memo)
                    memo[key] = (nested, predicted_bytes(program, nested, gradient_bytes))
                segments, predicted = memo[key]
                if smallest is None or predicted < smallest[0]:
                    smallest = (predicted, segments)
                if predicted <= target_bytes:
                    cost = recompute_cost(program, segments)
                    if fitting is None or cost < fitting[0]:
                        fitting = (cost, segments)
    flat = min(((predicted, c) for c, predicted in cuts.flat()), key=lambda c: c[0])
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


class _Uniform:
    """Flat segments that save nothing inside, by count: of about equal
    residual bytes, or with `by_cost`, of about equal compute."""

    def __init__(self, program: Program, residuals: set[Value], by_cost: bool = False):
        self.program, self.residuals = program, residuals
        self.crossings = crossings = _crossings(program)
        self.before = [0]
        for item in program.body:
            weight = item_cost(item) if by_cost else sum(v.nbytes for v in item.outputs if v in residuals)
            self.before.append(self.before[-1] + weight)
        self.crossing = [0, *(_crossing_bytes(crossings, i, set()) for i in range(1, len(program.body)))]
        self.memo: dict = {}

    def segments(self, count: int) -> tuple[Segment, ...]:
        bounds = [0, *_uniform_cuts(self.before, self.crossing, count), len(self.program.body)]
        return tuple(
            _segment(self.program, self.crossings, set(), self.residuals, start, stop, i, memo=self.memo)
            for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:]))
        )


def uniform_leaves(program: Program, residuals: set[Value], most: int) -> tuple[Segment, ...]:
    """As many flat segments as the cuts allow, at most `most`, of about
    equal compute and saving nothing inside: leaves to nest (`nested_left`),
    each recomputed as often as its place in a group says. (Asked for more
    runs than a chain has layers, the even split points fall between
    layers, and some find no cut near them.)"""
    uniform = _Uniform(program, residuals, by_cost=True)
    return max((uniform.segments(count) for count in range(most, 1, -1)), key=len, default=())


def uniform_segments(program: Program, residuals: set[Value], gradient_bytes: int) -> tuple[Segment, ...]:
    """Chen et al.'s checkpointing (2016) in jdtr's terms: flat segments that
    save nothing inside, of equal residual bytes, as many as minimise the
    predicted memory (about sqrt(N) for a chain of N layers).

    Every such plan recomputes the whole forward pass once, so they differ
    in memory only; DTR's plans recompute less but, where recomputation is
    nearly free (XLA on the CPU fuses it into the backward pass), can take
    longer for what they store. Autotuning times this plan beside DTR's.
    """
    uniform = _Uniform(program, residuals)
    found = []
    limit = 2 * int(np.sqrt(len(program.body))) + 2
    for count in range(2, max(limit, 3)):
        segments = uniform.segments(count)
        found.append((predicted_bytes(program, segments, gradient_bytes), segments))
    # The predicted memory is flat around its minimum (kept inputs trade
    # against the largest recomputation); XLA's own count is lowest in the
    # middle of that plateau, where k + N/k is (measured on chains).
    least = min(predicted for predicted, _ in found)
    plateau = [segments for predicted, segments in found if predicted == least]
    return plateau[len(plateau) // 2]
