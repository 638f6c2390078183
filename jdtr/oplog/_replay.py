"""Replaying a lowered trace on the DTR runtime (the one jdtr runs on devices)."""

from __future__ import annotations

from typing import Any, Optional

from ..runtime import Runtime, Tensor, future_uses
from ._program import ComputeStep, Program, RetainStep


def positions(program: Program) -> list[float]:
    """Per operation (constants are not operations), how far it moves the
    program on: its cost, or 1 each where a cost is measured at run time
    (none is known ahead, so an operation is the unit)."""
    costs = [step.cost for step in program.steps if isinstance(step, ComputeStep) and not step.constant]
    if any(cost is None for cost in costs):
        return [1.0] * len(costs)
    return costs


def _operations(program: Program, costs: list[float]):
    """The program's operations for `future_uses`."""
    operations = (s for s in program.steps if isinstance(s, ComputeStep) and not s.constant)
    return ((step.inputs, cost) for step, cost in zip(operations, costs))


def replay(program: Program, runtime: Runtime, source: Optional[str] = None) -> list[Any]:
    """Runs every step of `program` on `runtime`, then holds the outputs and
    returns their buffers.

    The output condition (App. C.6): every value still referenced at the end
    must be resident, so each output in turn is rematerialized if it was
    evicted and then locked, in the order of `program.outputs`.

    Raises:
      OutOfBudgetError: the budget cannot hold what an operator needs.
      ThrashError: rematerialization cost exceeded the runtime's limit.
    """
    values: list[Optional[Tensor]] = [None] * len(program.value_names)
    schedule = runtime.schedule  # the program's future, for heuristics that look ahead
    if schedule is not None:
        costs = positions(program)
        uses = future_uses(_operations(program, costs), program.outputs)
        advances = iter(costs)
    for step in program.steps:
        if isinstance(step, ComputeStep):
            if step.constant:
                tensor = runtime.constant(step.sizes[0], step.payload, name=step.name, external=step.external)
                values[step.outputs[0]] = tensor
                continue
            where = step.source
            if where is None and step.line is not None:
                where = f"{source or 'trace'}:{step.line}"
            outputs = runtime.call(
                step.name,
                [values[v] for v in step.inputs],
                step.sizes,
                cost=step.cost,
                payload=step.payload,
                replayable=step.replayable,
                source=where,
                aliases=step.aliases,
                workspace=step.workspace,
            )
            for value, tensor in zip(step.outputs, outputs):
                values[value] = tensor
            if schedule is not None:
                for value, tensor in zip(step.outputs, outputs):
                    schedule.announce(tensor, uses.get(value, ()))
                schedule.advance(next(advances))
        elif isinstance(step, RetainStep):
            runtime.retain(values[step.value])
        else:
            runtime.release(values[step.value])
    return runtime.hold([values[v] for v in program.outputs])
