"""The traced program as every DTR simulation reads it: an operator program.

A traced `Program` (equations with executables, structured `cond`s) is
what runs on a device; what DTR decides on is the sequence of requests it
makes of the runtime: pinned constants, operator calls, new and dropped
references, the outputs held at the end. `lower` writes that sequence down
once as the operator log's `jdtr.oplog.Program`, the representation the log
simulator, `jdtr.optimal` and the planner share, and `oplog.replay` plays it
on a runtime as often as a planner needs.

The requests are those `Interpreter.run` makes, in the same order, so that
a replay takes the decisions of the online run exactly: arguments and
jaxpr constants first (the caller's arguments and the constants external:
never freed), each equation with its cost, workspace, effects and source,
each value released after its last read; a `cond` runs its largest branch
(no predicate can be read ahead), taking a reference to each operand and
result, as the interpreter does. The equation rides along as the step's
`payload`, so that a `RecordingBackend` run writes down what to execute.

`lower_by_path` lowers a run along a path of branches instead, for plans
made per path (`paths.py`): each `cond` reached takes the branch the path
names (beyond it, the branch of a `cond` on the same predicate before it,
as a `cond`'s transpose in the backward pass is, or the branch a caller
guesses, or else its largest), and its predicate is read first (a
`ReadStep`: the runtime makes it resident, and a planned run reads it
there). What the runtime is told before a `cond` does not depend on the
branch taken there or later, so that the plans of two paths agree up to
where the paths part: positions advance by a `cond`'s costliest branch
whichever runs, a value is announced at its making with the reads of its
own body only (a `cond` reads its operands at its position), a branch's
reads of its operands are announced once it is entered, and a `cond`'s
results' later reads once it has run (`AnnounceStep`s).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax.numpy as jnp

from ..offline import Baseline, Workload
from ..oplog import AnnounceStep, ComputeStep, Future, ReadStep, ReleaseStep, RetainStep, TraceRecorder, replay
from ..oplog import Program as OperatorProgram
from .program import Atom, Cond, Equation, Program, Value


class BranchRead(NamedTuple):
    """A `cond` a run by paths reaches: the branch it goes on by, how many
    branches the `cond` has, and the `cond` itself."""

    branch: int
    branches: int
    cond: Cond


class _Lowering:
    """The requests of one run of a traced program, as operator-program steps."""

    def __init__(self, path: Optional[Sequence[int]] = None, guess: Optional[Callable[[Cond], Optional[int]]] = None) -> None:
        self.steps: list = []
        self.value_names: list[str] = []
        self.compute_cost = 0.0
        self.constant_bytes = 0
        self.largest_op_bytes = 0
        # By path (None: every cond by its largest branch, positions by the replay).
        self.path = None if path is None else tuple(path)
        self.taken: list[BranchRead] = []  # per cond reached
        self.known: dict[Value, int] = {}  # predicates read on this path: their branches
        self.guess = guess  # beyond the path: the branch a cond is thought to take (None: no guess)
        self.positions: dict[int, float] = {}  # step index -> the program's position there
        self.uses: dict[int, tuple[float, ...]] = {}  # value -> positions of its reads
        self.here = 0.0  # the position of the item being lowered
        self.frame: tuple[float, dict[Value, list[float]]] = (0.0, {})  # the body's start and reads
        self._spans: dict[int, float] = {}

    def new_value(self, name: str) -> int:
        self.value_names.append(name)
        return len(self.value_names) - 1

    def constant(self, nbytes: int, buffer: Any, name: str, external: bool) -> int:
        value = self.new_value(name)
        self.constant_bytes += nbytes
        self.steps.append(ComputeStep(name, (), (value,), (nbytes,), (-1,), 0, True, payload=buffer, external=external))
        return value

    def atom(self, env: dict[Value, int], atom: Atom) -> int:
        """The value of `atom`; a literal becomes a constant the run holds."""
        if isinstance(atom, Value):
            return env[atom]
        array = jnp.asarray(atom.value)
        return self.constant(int(array.nbytes), array, "literal", external=False)

    def body(self, program: Program, env: dict[Value, int], start: float = 0.0, top: bool = False) -> None:
        if self.path is not None:
            offsets = self.offsets(program)
            self.frame = (start, self.reads(program, offsets, top))
            if not top:  # a branch entered: its reads of its operands, from here on
                reads = self.frame[1]
                for value in program.inputs:
                    if reads.get(value):
                        self.steps.append(AnnounceStep(env[value], tuple(start + offset for offset in reads[value])))
        release = program.release_after
        for value in release.get(-1, ()):
            self.steps.append(ReleaseStep(env.pop(value)))
        for i, item in enumerate(program.body):
            if self.path is not None:
                self.here = start + offsets[i]
            if type(item) is Equation:
                self.equation(item, env)
            else:
                self.cond(item, env)
            for value in release.get(i, ()):
                self.steps.append(ReleaseStep(env.pop(value)))

    def equation(self, item: Equation, env: dict[Value, int]) -> None:
        inputs = tuple(env[v] for v in item.args)
        outputs = tuple(self.new_value(f"v{v.id}") for v in item.outputs)
        sizes = tuple(v.nbytes for v in item.outputs)
        read = sum(v.nbytes for v in item.args)
        self.largest_op_bytes = max(self.largest_op_bytes, read + sum(sizes) + item.workspace)
        self.compute_cost += item.cost or 0.0
        if self.path is not None:
            self.positions[len(self.steps)] = self.here
            start, reads = self.frame
            for value, new in zip(item.outputs, outputs):
                self.uses[new] = tuple(start + offset for offset in reads.get(value, ()))
        self.steps.append(
            ComputeStep(
                item.name,
                inputs,
                outputs,
                sizes,
                (-1,) * len(outputs),
                item.cost,
                workspace=item.workspace,
                payload=item,
                replayable=not item.effects,
                source=item.source,
            )
        )
        env.update(zip(item.outputs, outputs))

    def cond(self, cond: Cond, env: dict[Value, int]) -> None:
        by_path = self.path is not None
        reached = len(self.taken)
        taken = cond.largest_branch()
        if by_path:
            if reached < len(self.path):
                taken = self.path[reached]
            elif cond.index in self.known:  # a predicate read before (a cond's transpose): the same branch
                taken = min(self.known[cond.index], len(cond.branches) - 1)
            elif self.guess is not None and (guessed := self.guess(cond)) is not None:
                taken = min(max(guessed, 0), len(cond.branches) - 1)
            self.known[cond.index] = taken
            self.taken.append(BranchRead(taken, len(cond.branches), cond))
            self.positions[len(self.steps)] = self.here
            self.steps.append(ReadStep(env[cond.index]))
        branch = cond.branches[taken]
        branch_env: dict[Value, int] = {}
        for value, atom in zip(branch.inputs, cond.operands):
            branch_env[value] = self.atom(env, atom)
            if isinstance(atom, Value):
                self.steps.append(RetainStep(branch_env[value]))
        frame, here = self.frame, self.here
        self.body(branch, branch_env, start=here)
        results = []
        for atom in branch.outputs:
            results.append(self.atom(branch_env, atom))
            if isinstance(atom, Value):
                self.steps.append(RetainStep(results[-1]))
        self.steps.extend(ReleaseStep(value) for value in branch_env.values())
        env.update(zip(cond.outputs, results))
        if by_path:  # the results' reads after the cond, in the body that holds it
            self.frame, self.here = frame, here
            start, outer = frame
            for value, result in zip(cond.outputs, results):
                if outer.get(value):
                    self.steps.append(AnnounceStep(result, tuple(start + offset for offset in outer[value])))

    def span(self, program: Program) -> float:
        """How far a body moves the program: its items' costs, each `cond` by
        its costliest branch (so, whichever branch runs)."""
        key = id(program)
        if key not in self._spans:
            self._spans[key] = sum(self.item_cost(item) for item in program.body)
        return self._spans[key]

    def item_cost(self, item: Any) -> float:
        if type(item) is Equation:
            return item.cost or 0.0
        return max((self.span(branch) for branch in item.branches), default=0.0)

    def offsets(self, program: Program) -> list[float]:
        """Per item of a body, how far into it the item runs."""
        offsets, at = [], 0.0
        for item in program.body:
            offsets.append(at)
            at += self.item_cost(item)
        return offsets

    def reads(self, program: Program, offsets: Sequence[float], top: bool) -> dict[Value, list[float]]:
        """Per value, the offsets at which the items of one body read it (a
        `cond` reads its index and operands at its own); the top body's
        outputs are read at its end."""
        reads: dict[Value, list[float]] = {}
        for item, offset in zip(program.body, offsets):
            for value in dict.fromkeys(item.args):
                reads.setdefault(value, []).append(offset)
        if top:
            end = self.span(program)
            for atom in dict.fromkeys(a for a in program.outputs if isinstance(a, Value)):
                reads.setdefault(atom, []).append(end)
        return reads


def lower(program: Program, owned: Optional[Sequence[bool]] = None, arguments: Optional[Sequence[Any]] = None) -> OperatorProgram:
    """`program`'s requests of the DTR runtime as an operator program.

    `owned[i]` marks the arguments the run may free (all by default; the
    caller's own are external, as in a real run); `arguments` are what
    stands for their buffers (None each by default; a planner's slots)."""
    return _lower(_Lowering(), program, owned, arguments)


def lower_by_path(
    program: Program,
    path: Sequence[int],
    owned: Optional[Sequence[bool]] = None,
    arguments: Optional[Sequence[Any]] = None,
    guess: Optional[Callable[[Cond], Optional[int]]] = None,
) -> tuple[OperatorProgram, tuple[BranchRead, ...]]:
    """`program`'s requests on a run whose `cond`s take the branches of
    `path` in the order they are reached (the rest: the branch a `cond` on
    the same predicate took before, else the branch `guess(cond)` names,
    else their largest), each predicate read first, with positions that do not
    depend on the branches (see the module's docstring). Returns the
    operator program and each `cond` reached. Every cost must be known."""
    state = _Lowering(path, guess)
    lowered = _lower(state, program, owned, arguments)
    future = Future(tuple(state.positions.get(i) for i in range(len(state.steps))), state.uses, state.span(program))
    return replace(lowered, future=future), tuple(state.taken)


def _lower(state: _Lowering, program: Program, owned: Optional[Sequence[bool]], arguments: Optional[Sequence[Any]]) -> OperatorProgram:
    arguments = [None] * len(program.inputs) if arguments is None else list(arguments)
    owned = [True] * len(program.inputs) if owned is None else list(owned)
    env: dict[Value, int] = {}
    for value, buffer, mine in zip(program.inputs, arguments, owned):
        env[value] = state.constant(value.nbytes, buffer, "argument", external=not mine)
    for value, array in program.consts:
        env[value] = state.constant(value.nbytes, array, "constant", external=True)
    state.body(program, env, top=True)
    outputs = tuple(state.atom(env, atom) for atom in program.outputs)
    return OperatorProgram(
        steps=tuple(state.steps),
        value_names=tuple(state.value_names),
        outputs=outputs,
        compute_cost=state.compute_cost,
        constant_bytes=state.constant_bytes,
        largest_op_bytes=state.largest_op_bytes,
    )


def simulation(
    program: Program,
    owned: Optional[Sequence[bool]] = None,
    arguments: Optional[Sequence[Any]] = None,
    returned: Optional[list] = None,
    lowered: Optional[OperatorProgram] = None,
    on_read: Optional[Callable[[Any], None]] = None,
) -> Workload:
    """`program` for the simulation driver (`jdtr.offline.run`): its lowering
    (`lowered`, if already made) replayed with no buffers. The buffers the run
    returns are appended to `returned`, if given. The baseline is the
    program's own accounting (`Program.unconstrained_peak`), as the online
    runtime's budget ratios are. `on_read` gets the buffer of each value
    the lowering reads (a `cond`'s predicate, `lower_by_path`)."""
    operators = lowered if lowered is not None else lower(program, owned, arguments)

    def play(runtime: Any) -> None:
        outputs = replay(operators, runtime, on_read=on_read)
        if returned is not None:
            returned.extend(outputs)

    baseline = Baseline(peak_bytes=program.unconstrained_peak(), cost=program.simulated_cost())
    return Workload(play, baseline, program.held_bytes, program.largest_equation_bytes())


def recording(workload: Workload, recorder: TraceRecorder) -> Workload:
    """`workload` with its requests written down by `recorder` (an operator log)."""
    return Workload(
        lambda runtime: workload.play(recorder.attach(runtime)),
        workload.baseline,
        workload.constant_bytes,
        workload.largest_op_bytes,
    )
