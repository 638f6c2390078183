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
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax.numpy as jnp

from ..offline import Baseline, Workload
from ..oplog import ComputeStep, ReleaseStep, RetainStep, TraceRecorder, replay
from ..oplog import Program as OperatorProgram
from .program import Atom, Cond, Equation, Program, Value


class _Lowering:
    """The requests of one run of a traced program, as operator-program steps."""

    def __init__(self) -> None:
        self.steps: list = []
        self.value_names: list[str] = []
        self.compute_cost = 0.0
        self.constant_bytes = 0
        self.largest_op_bytes = 0

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

    def body(self, program: Program, env: dict[Value, int]) -> None:
        release = program.release_after
        for value in release.get(-1, ()):
            self.steps.append(ReleaseStep(env.pop(value)))
        for i, item in enumerate(program.body):
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
        branch = cond.branches[cond.largest_branch()]
        branch_env: dict[Value, int] = {}
        for value, atom in zip(branch.inputs, cond.operands):
            branch_env[value] = self.atom(env, atom)
            if isinstance(atom, Value):
                self.steps.append(RetainStep(branch_env[value]))
        self.body(branch, branch_env)
        results = []
        for atom in branch.outputs:
            results.append(self.atom(branch_env, atom))
            if isinstance(atom, Value):
                self.steps.append(RetainStep(results[-1]))
        self.steps.extend(ReleaseStep(value) for value in branch_env.values())
        env.update(zip(cond.outputs, results))


def lower(program: Program, owned: Optional[Sequence[bool]] = None, arguments: Optional[Sequence[Any]] = None) -> OperatorProgram:
    """`program`'s requests of the DTR runtime as an operator program.

    `owned[i]` marks the arguments the run may free (all by default; the
    caller's own are external, as in a real run); `arguments` are what
    stands for their buffers (None each by default; a planner's slots)."""
    arguments = [None] * len(program.inputs) if arguments is None else list(arguments)
    owned = [True] * len(program.inputs) if owned is None else list(owned)
    state = _Lowering()
    env: dict[Value, int] = {}
    for value, buffer, mine in zip(program.inputs, arguments, owned):
        env[value] = state.constant(value.nbytes, buffer, "argument", external=not mine)
    for value, array in program.consts:
        env[value] = state.constant(value.nbytes, array, "constant", external=True)
    state.body(program, env)
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
) -> Workload:
    """`program` for the simulation driver (`jdtr.offline.run`): its lowering
    (`lowered`, if already made) replayed with no buffers. The buffers the run
    returns are appended to `returned`, if given. The baseline is the
    program's own accounting (`Program.unconstrained_peak`), as the online
    runtime's budget ratios are."""
    operators = lowered if lowered is not None else lower(program, owned, arguments)

    def play(runtime: Any) -> None:
        outputs = replay(operators, runtime)
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
