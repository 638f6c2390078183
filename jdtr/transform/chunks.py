"""A planned run cut into chunks, each compiled into one XLA program.

A chunk is a run of consecutive computations of the plan (first ones and
rematerializations); the values made and freed inside it are XLA's
temporaries, and only what outlives it comes back as arrays. One dispatch
per chunk instead of one per equation is what brings a planned run near
`jax.jit`'s speed.

The budget stays hard. A chunk holds, while it runs, what was resident
before it (its inputs included: a value the plan frees inside the chunk is
deleted only once the chunk has run, unless it is donated to it), its
outputs, and XLA's temporaries. The cut is made where the plan's own count
of that passes the budget, and each compiled chunk is checked against the
budget with XLA's `memory_analysis()`; one that XLA makes larger than
planned (its schedule is not the plan's) is halved until its parts fit,
down to single equations, whose memory the plan already counted exactly.
On the CPU a chunk holds at most `MAX_CHUNK_EQUATIONS` computations
(`chunk_cap`) where the plan's computations are long: XLA's code for a
whole step can run slower there.

A chunk never computes one equation twice: XLA would merge the copies
(common subexpressions) and keep the value the plan evicted, so a
rematerialization of something the chunk already computed starts a new one.
Equations with effects run alone, once, as the plan pins them. A `Read` (a
`cond`'s predicate, read by the driver) ends a chunk and stays an item of
its own: the run goes on from there by the branch read.

Compiled chunks are cached by content (the executables, how they are wired,
the input types), so identical chunks — repeated layers, the same cell of a
recursive model in another tree — compile once, across calls and budgets.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Callable, Hashable, Optional, Sequence, Union

import jax

from ..offline import Compute, Free, Read, StraightLine
from ..quiet import ignoring
from .costs import NANOSECOND
from .devices import replicated
from .executable import COMPILE_THREADS as _DEFAULT_THREADS
from .program import Value

# Compiled chunks kept, least recently used first out.
MAX_COMPILED_CHUNKS = 1024
# A chunk XLA makes larger than the budget is halved, and each half that is
# still too large halved again, until they fit: XLA's excess is local (near
# the plan's peak it allocates every output of the program from its start,
# and its temporaries beside them), so the halves away from it fit and stay
# long. A flax scan-LSTM (3,479 equations) at its unconstrained peak: 22
# chunks, where two halvings and then single equations gave 2,611 dispatches
# and 1.95x `jax.jit`'s step time. A piece of at most MIN_HALVED computations
# that does not fit runs them one by one (each is counted exactly by the
# plan), sparing compilations that rarely fit.
MIN_HALVED = 4
# At most this many computations a chunk on the CPU, where XLA's code for a
# whole step can run slower than for its parts (a 4-block transformer at its
# unconstrained peak: one chunk 1.04x `jax.jit`'s step, chunks of 512 0.85x;
# docs/benchmarks.md), while a dispatch per 512 equations costs the host
# little. No cap elsewhere: on a GPU a small model's step is shorter than
# what the host spends on each chunk and on each array crossing between
# chunks (an H200, the same transformer: 5 chunks 2.62x `jax.jit`, 2 chunks
# uncapped 1.24x). (It was set for compile time, when the unrolled scan LSTM
# took 19 s as one chunk; a whole step now compiles about as fast as its parts.)
MAX_CHUNK_EQUATIONS = 512
CAPPED_PLATFORMS = frozenset({"cpu"})
# Nor on the CPU where the plan's computations cost less than this on
# average, in the cost model's seconds: there a step is short, and each cut
# costs it the arrays written out and read again that XLA would have fused,
# and, near the budget, cuts more (a chunk holds what crosses into it to its
# end, so XLA's peak passes the budget and the chunk is halved). At their
# unconstrained peaks, by the default cost model: a 7 ms linear recurrence by
# `lax.associative_scan` (1,405 computations of 3.6 us each) ran at 1.51x
# `jax.jit`'s step capped, in 13 chunks, and 1.03-1.11x as one; a small
# transformer (1.8 us) 1.12x and 1.03-1.09x. Above it, the 4-block
# transformer (18 us), a Flax GPT (16 us) and a Flax ResNet (23 us) ran at
# 0.79x, 1.02x and 0.73x capped, 1.00x, 1.01x and 1.00x as one chunk
# (docs/benchmarks.md, "The chunk cap only where computations are long").
CAPPED_ABOVE_SECONDS = 1e-5


def chunk_cap(line: StraightLine) -> Optional[int]:
    """At most how many computations a chunk of `line` holds on the default
    backend (where chunks run, unless the arguments are placed elsewhere),
    or None. The plan's costs are whole nanoseconds (`costs.nanoseconds`).
    Where none is known (`cost_model="measured"` before a run has timed
    them): no cap. Timed costs include each equation's dispatch, tens of
    microseconds on the CPU, so plans made from them are capped."""
    if jax.default_backend() not in CAPPED_PLATFORMS:
        return None
    total, known = 0.0, 0
    for step in line.steps:
        cost = getattr(step.payload, "cost", None) if type(step) is Compute else None
        if cost is not None:
            total, known = total + cost, known + 1
    return MAX_CHUNK_EQUATIONS if known and total / known * NANOSECOND >= CAPPED_ABOVE_SECONDS else None


@dataclass(eq=False)
class Chunk:
    """Computations run as one program, then the frees the plan made meanwhile.

    Attributes:
      steps: the computations, in order.
      inputs: the slots it reads that exist before it.
      outputs: the slots it makes that outlive it.
      frees: the slots deleted once it has run (inputs the plan freed).
      resident_bytes: what the run holds when it starts.
      call: runs it: input arrays in, output arrays out.
      peak_bytes: resident bytes plus its outputs and XLA's temporaries
        (less what reuses donated inputs), by XLA's analysis; the plan's
        count for a single computation.
    """

    steps: tuple[Compute, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    frees: tuple[int, ...]
    resident_bytes: int
    call: Callable[..., Sequence[Any]]
    peak_bytes: int


@dataclass(frozen=True)
class Delete:
    """Buffers the plan frees between chunks."""

    slots: tuple[int, ...]


Item = Union[Chunk, Delete, Read]


# ---------------------------------------------------------------- cutting


@dataclass(frozen=True)
class _Span:
    """Steps [start, end) to run as one chunk, less the frees done before it
    (`hoisted`: the steps of those frees)."""

    start: int
    end: int
    hoisted: frozenset[int] = frozenset()


def _spans(
    line: StraightLine,
    budget_bytes: float,
    resident: Sequence[int],
    cap: Optional[int],
    start: int = 0,
    end: Optional[int] = None,
    cuts: frozenset[int] = frozenset(),
    deleted: frozenset[int] = frozenset(),
) -> list[Union[_Span, Delete, Read]]:
    """The plan's steps [start, end) as spans to run as chunks, with the
    frees between them, cut where the plan's count of a chunk's memory would
    pass the budget, once `cap` computations are in one (`chunk_cap`, asked
    once per line by the caller), and before each step of `cuts`.

    A free inside a span of a value from before it is done before the span
    when the span does not read that value first (an eviction of a stale
    value, mostly): memory is then lower than planned, never higher. A value
    the span reads and then frees is held until the span has run. The frees
    at the steps of `deleted` were done before the range (by the span being
    split): each span of it keeps them as hoisted."""
    sizes = line.sizes
    end = len(line.steps) if end is None else end
    items: list[Union[_Span, Delete, Read]] = []
    opened: Optional[int] = None
    produced: set[int] = set()
    read: set[int] = set()
    payloads: set[int] = set()
    hoisted: list[int] = []  # steps of the frees done before the open span
    held = 0  # values read, then freed inside the open span: kept until it ends
    computations = 0  # in the open span

    def close(at: int) -> None:
        nonlocal opened, held, computations
        if opened is not None:
            if hoisted:
                items.append(Delete(tuple(line.steps[h].slot for h in hoisted)))
            items.append(_Span(opened, at, deleted | frozenset(hoisted)))
        opened, held, computations = None, 0, 0
        for pending in (produced, read, payloads, hoisted):
            pending.clear()

    for t in range(start, end):
        step = line.steps[t]
        if type(step) is Read:
            close(t)
            items.append(step)
            continue
        if type(step) is Free:
            if step.slot in produced or t in deleted:
                continue  # made and dead inside the span (a temporary), or deleted before it
            if opened is None:
                items.append(Delete((step.slot,)))
            elif step.slot in read:
                held += sizes[step.slot]
            else:
                hoisted.append(t)
            continue
        equation = step.payload
        need = resident[t] + held + sum(sizes[s] for s in step.outputs) + step.workspace
        alone = bool(getattr(equation, "effects", False))
        full = cap is not None and computations >= cap
        if opened is not None and (t in cuts or need > budget_bytes or id(equation) in payloads or alone or full):
            close(t)
        if opened is None:
            opened = t
        read.update(s for s in step.inputs if s not in produced)
        produced.update(step.outputs)
        payloads.add(id(equation))
        computations += 1
        if alone:
            close(t + 1)
    close(end)
    return items


def count(line: StraightLine, budget_bytes: float) -> int:
    """How many chunks the plan's count cuts `line` into at `budget_bytes`
    (before XLA's analysis halves any): what `cut` compiles, without compiling."""
    return sum(1 for item in _spans(line, budget_bytes, line.resident_before(), chunk_cap(line)) if type(item) is _Span)


def _split(
    line: StraightLine, span: _Span, budget_bytes: float, resident: Sequence[int], cap: Optional[int]
) -> list[Union[_Span, Delete]]:
    """A span cut in two, before the computation of its middle half where
    the fewest values cross (`_narrowest`), or, when it has at most
    `MIN_HALVED`, into single computations (nothing if it has one).

    Each part is laid out as `_spans` lays out a span: a value from before a
    part that the part frees without reading it is deleted before the part
    runs. The span held such a value (an earlier part reads it), and on the
    tight stretches of a plan that is what made XLA's peak pass the budget:
    a GPT's backward pass at 0.5, halved down to pieces of 4 computations
    that held 2-5% of the budget in values the plan had already freed."""
    computes = [t for t in range(span.start, span.end) if type(line.steps[t]) is Compute]
    n = len(computes)
    if n < 2:
        return []
    cuts = [_narrowest(line, span, computes[n // 4 : n - n // 4], computes[n // 2])] if n > MIN_HALVED else computes[1:]
    return _spans(line, budget_bytes, resident, cap, span.start, span.end, frozenset(cuts), span.hoisted)  # type: ignore[return-value]


def _narrowest(line: StraightLine, span: _Span, candidates: Sequence[int], middle: int) -> int:
    """Of `candidates` (steps of `span`), the one before which the fewest
    values cross a cut: made (or first read, from before the span) before it
    and read again from it on. Each crossing value is an output of the first
    part and an input of the second, an array more a call: a dispatch's cost
    on the host grows with its arrays (a transformer's chunk of 256
    computations with 104 arrays in and out: 0.3 ms to dispatch on the CPU,
    where `jax.jit` runs that transformer's whole step in 1.3 ms on an H200).
    Ties go to the one nearest `middle`: halves, fewest halvings."""
    crossing = [0] * (span.end - span.start + 1)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t in range(span.start, span.end):
        step = line.steps[t]
        if type(step) is not Compute:
            continue
        for slot in step.inputs:
            first.setdefault(slot, t)
            last[slot] = t
        for slot in step.outputs:
            first.setdefault(slot, t)
    for slot, t in last.items():
        if first[slot] < t:  # crosses a cut anywhere in (first, last]
            crossing[first[slot] + 1 - span.start] += 1
            crossing[t + 1 - span.start] -= 1
    crossing_at = list(accumulate(crossing))  # values crossing a cut before each step of the span
    return min(candidates, key=lambda t: (crossing_at[t - span.start], abs(t - middle)))


def cut(line: StraightLine, avals: Sequence[Any], budget_bytes: float, device: Any = None) -> list[Item]:
    """The plan as chunks and deletes, each chunk compiled (or taken from the
    cache) and within the budget by XLA's analysis; on `device` where one
    is given (not the backend's first: `executor.run_device`).

    Chunks are compiled in waves: every span of the cut at once, then the
    halves of those XLA made too large, and so on. A wave's distinct programs
    compile side by side (`COMPILE_THREADS`): XLA releases the GIL while it
    compiles, and a wave of a transformer's plan is dozens of programs of
    0.05-0.7 s each."""
    resident = line.resident_before()
    whole = _whole(avals) if device is None else jax.sharding.SingleDeviceSharding(device)
    cap = chunk_cap(line)
    items: list[Union[Item, _Span]] = list(_spans(line, budget_bytes, resident, cap))
    while True:
        spans = [item for item in items if type(item) is _Span]
        if not spans:
            return items  # type: ignore[return-value]  (no span left)
        layouts = {}
        for span in spans:
            # Frees done before the span that the plan's count at its start still holds.
            gone = sum(line.sizes[line.steps[h].slot] for h in span.hoisted if h >= span.start)
            layouts[span] = _layout(line, avals, span, resident[span.start] - gone, whole)
        compiled = _compile_all([layout for layout in layouts.values() if layout.key is not None], avals)
        following: list[Union[Item, _Span]] = []
        for item in items:
            if type(item) is not _Span:
                following.append(item)
                continue
            chunk = layouts[item].chunk(compiled)
            parts = _split(line, item, budget_bytes, resident, cap) if chunk.peak_bytes > budget_bytes else []
            following.extend(parts if parts else [chunk])
        items = following


# ---------------------------------------------------------------- one chunk


@dataclass(eq=False)
class _Layout:
    """A span's chunk before it is compiled: its computations and how they
    are wired (`key`: its program's content, None for a single computation,
    which runs as its own executable)."""

    steps: tuple[Compute, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    frees: tuple[int, ...]
    resident_bytes: int
    key: Optional[Hashable]
    alone_peak_bytes: int = 0  # a single computation's peak, by the plan's exact count
    donated: tuple[int, ...] = ()
    output_bytes: int = 0
    wiring: tuple[tuple[int, ...], ...] = ()
    out_refs: tuple[int, ...] = ()
    out_shardings: tuple[Any, ...] = ()
    sharded: bool = False  # an input or output on a mesh: its outputs' shardings are fixed
    in_shardings: tuple[Any, ...] = ()

    def chunk(self, compiled: dict[Hashable, tuple[Callable, tuple[int, int, int]]]) -> Chunk:
        if self.key is None:
            step = self.steps[0]
            return Chunk(self.steps, self.inputs, self.outputs, self.frees, self.resident_bytes, step.payload.fn, self.alone_peak_bytes)
        call, (out, alias, temps) = compiled[self.key]
        peak = self.resident_bytes + out - alias + temps
        return Chunk(self.steps, self.inputs, self.outputs, self.frees, self.resident_bytes, call, peak)


def _layout(line: StraightLine, avals: Sequence[Any], span: _Span, resident_bytes: int, whole: Any = None) -> _Layout:
    """The span's chunk, but for its program: its computations, the slots
    it reads and keeps, the inputs it frees (donated to it) and its key."""
    steps, frees, produced, dead = [], [], set(), set()
    inputs: dict[int, None] = {}
    for t in range(span.start, span.end):
        step = line.steps[t]
        if type(step) is Free:
            if step.slot in produced:
                dead.add(step.slot)
            elif t not in span.hoisted:
                frees.append(step.slot)
            continue
        steps.append(step)
        for slot in step.inputs:
            if slot not in produced:
                inputs.setdefault(slot, None)
        produced.update(step.outputs)
    outputs = tuple(s for step in steps for s in step.outputs if s not in dead)
    if len(steps) == 1:  # its own executable, which returns every output: the dead ones are deleted after
        step = steps[0]
        peak = resident_bytes + sum(line.sizes[s] for s in step.outputs) + step.workspace
        frees += [s for s in step.outputs if s in dead]
        return _Layout(tuple(steps), tuple(step.inputs), step.outputs, tuple(frees), resident_bytes, None, alone_peak_bytes=peak)
    inputs_t = tuple(inputs)
    freed = set(frees)
    donated = tuple(k for k, slot in enumerate(inputs_t) if slot in freed)
    position = {slot: k for k, slot in enumerate(inputs_t)}
    wiring = []
    for step in steps:
        wiring.append(tuple(position[s] for s in step.inputs))
        for slot in step.outputs:
            position[slot] = len(position)
    out_refs = tuple(position[s] for s in outputs)
    # On a mesh, a chunk's outputs keep the shardings its equations give them
    # (the plan counted their bytes per device by those): XLA would otherwise
    # choose for the chunk as a whole, and could replicate what was sharded.
    in_shardings = _placed([avals[s] for s in inputs_t], whole)
    out_shardings = _placed([avals[s] for s in outputs], whole)
    in_types = tuple(
        (tuple(avals[s].shape), str(avals[s].dtype), bool(avals[s].weak_type), sharding)
        for s, sharding in zip(inputs_t, in_shardings)
    )
    key = (tuple(id(step.payload.executable) for step in steps), tuple(wiring), out_refs, donated, in_types, out_shardings)
    output_bytes = sum(line.sizes[s] for s in outputs)
    return _Layout(
        tuple(steps), inputs_t, outputs, tuple(frees), resident_bytes, key,
        donated=donated, output_bytes=output_bytes, wiring=tuple(wiring), out_refs=out_refs, out_shardings=out_shardings,
        sharded=any(x is not None for x in (*in_shardings, *out_shardings)), in_shardings=in_shardings,
    )


def _whole(avals: Sequence[Any]) -> Any:
    """Whole on every device of the mesh the program's values are placed
    over (None: the program runs on one device)."""
    placed = next((a.sharding for a in avals if isinstance(a, Value) and a.sharding is not None), None)
    return None if placed is None else replicated(placed)


def _placed(avals: Sequence[Any], whole: Any) -> tuple[Any, ...]:
    """The shardings a chunk takes or gives these slots with: their values'
    (`Value.sharding`). On one device other than the default, `whole` is
    that device: every value is there. On a mesh, a value counted whole on
    one device (made from unsharded values alone) is `whole`: left to XLA,
    a chunk could shard it as an output, or expect it sharded as an input,
    while another chunk made it whole (on a GPT's step the loss's broadcast
    cotangent: replicated by one chunk, expected split over the batch by
    the next, which JAX refuses). Uncommitted arrays (what a single
    equation makes of such values) are placed there as they enter.
    External arrays (not `Value`s) are expected where they are; on one
    device, uncommitted, as XLA chooses."""
    shardings = tuple(_sharding(a) for a in avals)
    if whole is None:
        return shardings
    return tuple(whole if s is None and isinstance(a, Value) else s for s, a in zip(shardings, avals))


# key -> (the compiled program, (output, alias, temporary) bytes, the executables, code bytes)
_COMPILED: "OrderedDict[Hashable, tuple[Callable, tuple[int, int, int], tuple, int]]" = OrderedDict()
_LOCK = threading.Lock()
# Chunk programs compiled side by side, at most. XLA on the CPU already uses
# both of 2 cores for part of a compile: there, second calls are about 10%
# shorter with threads (docs/benchmarks.md, "Compiling jdtr's own programs").
COMPILE_THREADS = _DEFAULT_THREADS  # (its own: a benchmark sets it apart)
# XLA's options for chunks: its defaults, not `xla_options`' older emitters
# (asked for the executables of single equations). With those, a 64-layer MLP
# of width 32 ran its step 20-25% slower and compiled its chunks 9x longer;
# other models' steps ran as fast or slower (up to 13%), their chunks
# compiled up to 2x faster, once (docs/benchmarks.md): a step runs many
# times. A benchmark sets this to compare.
CHUNK_OPTIONS: dict = {}


def _compile_all(layouts: Sequence[_Layout], avals: Sequence[Any]) -> dict[Hashable, tuple[Callable, tuple[int, int, int]]]:
    """Each layout's compiled program and (output, alias, temporary) bytes by
    XLA's analysis: from the cache, else compiled, each distinct program
    once, side by side."""
    found: dict[Hashable, tuple[Callable, tuple[int, int, int]]] = {}
    missing: dict[Hashable, _Layout] = {}
    with _LOCK:
        for layout in layouts:
            entry = _COMPILED.get(layout.key)
            if entry is not None:
                _COMPILED.move_to_end(layout.key)
                found[layout.key] = (entry[0], entry[1])
            else:
                missing.setdefault(layout.key, layout)
    # Lowered here, one by one: lowering is Python (tracing) and holds the GIL.
    lowered = [(layout, _lower(layout, avals)) for layout in missing.values()]
    options = CHUNK_OPTIONS or None
    if len(lowered) > 1 and COMPILE_THREADS > 1:
        with ThreadPoolExecutor(min(COMPILE_THREADS, len(lowered))) as pool:
            programs = list(pool.map(lambda pair: pair[1].compile(options), lowered))
    else:
        programs = [low.compile(options) for _, low in lowered]
    for (layout, _), compiled in zip(lowered, programs):
        found[layout.key] = _keep(layout, compiled)
    return found


def _lower(layout: _Layout, avals: Sequence[Any]) -> Any:
    traces = tuple(step.payload.trace for step in layout.steps)
    wiring, out_refs = layout.wiring, layout.out_refs

    def program(*args):
        env = list(args)
        for trace, refs in zip(traces, wiring):
            env.extend(trace(*[env[r] for r in refs]))
        return tuple(env[r] for r in out_refs)

    structs = [
        jax.ShapeDtypeStruct(avals[s].shape, avals[s].dtype, weak_type=avals[s].weak_type, sharding=sharding)
        for s, sharding in zip(layout.inputs, layout.in_shardings)
    ]
    options = dict(out_shardings=layout.out_shardings) if layout.sharded else {}
    # Donated inputs XLA cannot reuse for an output are only deleted after
    # the chunk: as planned, so JAX's warning about them says nothing new.
    with ignoring("Some donated buffers were not usable"):
        return jax.jit(program, donate_argnums=layout.donated, **options).lower(*structs)


def _keep(layout: _Layout, compiled: Any) -> tuple[Callable, tuple[int, int, int]]:
    """A compiled chunk's (output, alias, temporary) bytes, cached with it."""
    analysis = compiled.memory_analysis()
    code = 0
    if analysis is None:  # no analysis: count every output and no temporaries
        sizes = (layout.output_bytes, 0, 0)
    else:
        sizes = (
            int(analysis.output_size_in_bytes),
            int(analysis.alias_size_in_bytes),
            max(int(analysis.temp_size_in_bytes), 0),
        )
        code = max(int(getattr(analysis, "generated_code_size_in_bytes", 0) or 0), 0)
    executables = tuple(step.payload.executable for step in layout.steps)
    with _LOCK:
        # The executables stay referenced with the entry: their ids in the key stay theirs.
        _COMPILED[layout.key] = (compiled, sizes, executables, code)
        while len(_COMPILED) > MAX_COMPILED_CHUNKS:
            _COMPILED.popitem(last=False)
    return compiled, sizes


def _sharding(aval: Any) -> Any:
    """A slot's sharding over a mesh (`Value.sharding`; an external array's,
    `jax.ShapeDtypeStruct`, as it is committed: a sharded constant the loss
    closes over), None on one device."""
    return aval.sharding if isinstance(aval, (Value, jax.ShapeDtypeStruct)) else None


def compiled_chunks() -> int:
    """How many compiled chunks the cache holds."""
    with _LOCK:
        return len(_COMPILED)


def chunk_cache_size() -> tuple[int, int]:
    """The compiled chunks cached, and the bytes of their generated code."""
    with _LOCK:
        return len(_COMPILED), sum(entry[3] for entry in _COMPILED.values())


def clear_chunk_cache() -> None:
    """Drops every compiled chunk (plans compiled before keep theirs)."""
    with _LOCK:
        _COMPILED.clear()
