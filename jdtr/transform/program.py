"""The program DTR runs: a flat list of equations over values, with liveness.

A `Program` is a normalised jaxpr (see `normalize.py`): calls inlined, scans
unrolled, so that every value is a real tensor DTR can evict. Only `cond`
stays structured, because which branch runs is known at run time alone.

Liveness gives each value its last use: the paper's deallocation event.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from ._jax_core import ScanLayout


@dataclass(frozen=True, eq=False)
class Value:
    """A tensor of the program: one storage at run time."""

    id: int
    shape: tuple[int, ...]
    dtype: Any  # a numpy dtype, or a JAX extended dtype (PRNG keys)
    weak_type: bool
    nbytes: int  # on one device: the largest shard's, for a value sharded over a mesh
    sharding: Any = None  # where it is sharded over several devices (a run on a mesh), else None

    def __repr__(self) -> str:
        return f"v{self.id}:{self.dtype}{list(self.shape)}"


@dataclass(frozen=True, eq=False)
class Const:
    """A literal baked into the equation that reads it."""

    value: Any

    def __repr__(self) -> str:
        return f"Const({self.value!r})"


Atom = Union[Value, Const]


@dataclass(eq=False)
class Equation:
    """`outputs = fn(inputs)`: one operator of the DTR runtime.

    `fn` is the executable (a cached, jitted callable) that maps the
    non-literal inputs to the outputs; `trace` does the same without jit,
    for re-tracing the program inside another transformation; `cost` is its
    deterministic cost (None: measured at run time).
    """

    name: str
    inputs: tuple[Atom, ...]
    outputs: tuple[Value, ...]
    fn: Callable[..., list[Any]]
    cost: Optional[float]
    effects: bool = False
    source: Optional[object] = None  # the user's source line, as its str (found when first shown)
    trace: Optional[Callable[..., list[Any]]] = None
    executable: Any = None  # the `Executable` `fn` calls, for XLA's analyses
    workspace: int = 0  # bytes XLA takes beside inputs and outputs while it runs (`assign_workspaces`)
    scan: Optional[ScanLayout] = None  # a scan kept whole (`scans.py`): its jaxpr equation's parameters

    @functools.cached_property
    def args(self) -> tuple[Value, ...]:
        """The inputs that are values (not literals); asked at every step of every simulation."""
        return tuple(a for a in self.inputs if isinstance(a, Value))


@dataclass(eq=False)
class Cond:
    """`lax.cond`/`switch`: runs the branch its index selects, at run time."""

    index: Value
    branches: tuple["Program", ...]
    operands: tuple[Atom, ...]
    outputs: tuple[Value, ...]
    source: Optional[object] = None  # as `Equation.source`

    @property
    def args(self) -> tuple[Value, ...]:
        return (self.index, *(a for a in self.operands if isinstance(a, Value)))

    @property
    def effects(self) -> bool:
        return any(item.effects for branch in self.branches for item in branch.body)

    def largest_branch(self) -> int:
        """The branch with the largest unconstrained peak: the one a
        simulation runs, where no predicate can be read (the first of equals)."""
        peaks = [branch.unconstrained_peak() for branch in self.branches]
        return peaks.index(max(peaks))


Item = Union[Equation, Cond]


@dataclass
class ProgramMemo:
    """What later passes compute once for a program, kept on it so that it
    lives exactly as long as the program. (Kept in weak maps keyed by the
    program, values that held the program never let it go: every program
    planned stayed alive, and with it the arrays its function closed over,
    on the device.)"""

    crossings: Any = None  # `segments`: the values live across each cut of the body
    flat_cuts: dict = field(default_factory=dict)  # `segments.flat_cuts`: per saved set, the most recent last


@dataclass(eq=False)
class Program:
    """Inputs, constants, a body and outputs; `release_after[i]` are the
    values whose last use is body item i (index -1: before the body)."""

    inputs: tuple[Value, ...]
    consts: tuple[tuple[Value, Any], ...]
    body: list[Item]
    outputs: tuple[Atom, ...]
    release_after: dict[int, list[Value]] = field(default_factory=dict)
    names: dict[str, Value] = field(default_factory=dict)  # `checkpoint_name`s seen
    memo: ProgramMemo = field(default_factory=ProgramMemo, repr=False)  # (lives and dies with it)

    def __post_init__(self) -> None:
        self.release_after = liveness(self)

    @functools.cached_property
    def has_conds(self) -> bool:
        """Whether its body has a `cond` (a structure, fixed once traced)."""
        return any(isinstance(item, Cond) for item in self.body)

    @functools.cached_property
    def devices(self) -> int:
        """The devices its values are placed on: 1, or a mesh's (its
        arguments sharded over it; every byte count is then per device)."""
        return max((len(v.sharding.device_set) for v in self.inputs if v.sharding is not None), default=1)

    @functools.cached_property
    def held_bytes(self) -> int:
        """Bytes of its arguments and constants: on the device for the whole run."""
        return sum(v.nbytes for v in self.inputs) + sum(v.nbytes for v, _ in self.consts)

    @functools.cached_property
    def num_equations(self) -> int:  # (asked on every call: the body is fixed once traced)
        return sum(
            1 if isinstance(item, Equation) else max((b.num_equations for b in item.branches), default=0)
            for item in self.body
        )

    def used_values(self) -> set[Value]:
        """Every value read anywhere in the program, branches included."""
        used = {a for a in self.outputs if isinstance(a, Value)}
        for item in self.body:
            used.update(item.args)
            if isinstance(item, Cond):
                for branch in item.branches:
                    used |= branch.used_values()
        return used

    def simulated_cost(self) -> float:
        """The cost of running every equation once, each `cond` by its
        largest branch (as a simulation runs it); unknown costs count 0."""
        total = 0.0
        for item in self.body:
            if isinstance(item, Equation):
                total += item.cost or 0.0
            else:
                total += item.branches[item.largest_branch()].simulated_cost()
        return total

    def largest_equation_bytes(self) -> int:
        """The most one equation holds at once: its inputs and outputs."""
        return max(
            (sum(v.nbytes for v in (*item.args, *item.outputs)) for item in self.body if isinstance(item, Equation)),
            default=0,
        )

    def unconstrained_peak(self) -> int:
        """Peak bytes of running the program with nothing evicted, values
        freed at their last use, as the runtime accounts them; for `cond`,
        the larger branch."""
        memory = self.held_bytes
        peak, _ = _walk_peak(self, memory, memory, branch=False)
        return peak


def liveness(program: Program) -> dict[int, list[Value]]:
    """Last use of every value; values never read are released right after
    they are made; outputs are never released."""
    reads, end = last_reads(program), len(program.body)
    release: dict[int, list[Value]] = {}
    for v, defined in definitions(program).items():  # in definition order: the order of releases
        last = reads.get(v, defined)
        if last < end:
            release.setdefault(last, []).append(v)
    return release


def signature(name: str, avals: Sequence[Any]) -> tuple:
    """What a `jax.checkpoint` policy can tell values by: the primitive's
    name and its inputs' shapes and dtypes (all a policy is shown of them)."""
    return (name, tuple((tuple(a.shape), str(a.dtype)) for a in avals))


def definitions(program: Program) -> dict[Value, int]:
    """Per value, in the order they are made, the body item that makes it
    (-1 for inputs and constants)."""
    defined = {v: -1 for v in program.inputs}
    defined.update((v, -1) for v, _ in program.consts)
    for i, item in enumerate(program.body):
        defined.update((v, i) for v in item.outputs)
    return defined


def last_reads(program: Program) -> dict[Value, int]:
    """Per value read, the last body item that reads it; `len(body)` for
    the program's outputs, read when it returns."""
    last: dict[Value, int] = {}
    for i, item in enumerate(program.body):
        last.update((v, i) for v in item.args)
    last.update((a, len(program.body)) for a in program.outputs if isinstance(a, Value))
    return last


def _walk_peak(program: Program, memory: int, peak: int, branch: bool) -> tuple[int, int]:
    # Inputs belong to the caller of this program; constants are the
    # runtime's to keep (pinned) to the end: neither is freed at its last use.
    freed = {v for v in program.inputs} | {v for v, _ in program.consts}
    for v in program.release_after.get(-1, []):
        if v not in freed:
            memory -= v.nbytes
    for i, item in enumerate(program.body):
        if isinstance(item, Equation):
            memory += sum(v.nbytes for v in item.outputs)
            peak = max(peak, memory + item.workspace)
        else:
            ends, peaks = [], []
            for sub in item.branches:
                branch_peak, branch_end = _walk_peak(sub, memory, memory, branch=True)
                peaks.append(branch_peak)
                ends.append(branch_end)
            peak = max(peak, *peaks)
            memory = max(ends)
        for v in program.release_after.get(i, []):
            if v not in freed:
                memory -= v.nbytes
    # A branch output that is one of its inputs, or a literal, or a value it
    # returns twice (`lambda u: (jnp.tanh(u), jnp.tanh(u))`, deduplicated),
    # becomes a new reference the caller releases later, one buffer under two
    # of the caller's values: count it as allocated (an upper bound), or the
    # release of the first of them would count the buffer freed.
    if branch:
        returned: set[Value] = set()
        for a in program.outputs:
            if not isinstance(a, Value) or a in freed or a in returned:
                memory += _atom_nbytes(a)
            else:
                returned.add(a)
    return max(peak, memory), memory


def _atom_nbytes(atom: Atom) -> int:
    if isinstance(atom, Value):
        return atom.nbytes
    return int(np.asarray(atom.value).nbytes)
