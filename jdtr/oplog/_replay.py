"""Replaying a lowered trace on the DTR runtime (the one jdtr runs on devices)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..runtime import Runtime, Tensor, future_uses, operation_costs
from ._program import AnnounceStep, ComputeStep, Program, ReadStep, RetainStep


def replay(
    program: Program, runtime: Runtime, source: Optional[str] = None, on_read: Optional[Callable[[Any], None]] = None
) -> list[Any]:
    """Runs every step of `program` on `runtime`, then holds the outputs and
    returns their buffers.

    The output condition (App. C.6): every value still referenced at the end
    must be resident, so each output in turn is rematerialized if it was
    evicted and then locked, in the order of `program.outputs`. A
    `ReadStep`'s value is made resident and its buffer handed to `on_read`.

    Raises:
      OutOfBudgetError: the budget cannot hold what an operator needs.
      ThrashError: rematerialization cost exceeded the runtime's limit.
    """
    values: list[Optional[Tensor]] = [None] * len(program.value_names)
    schedule = runtime.schedule  # the program's future, for heuristics that look ahead
    future = program.future
    if schedule is not None and future is None:  # constants are not operations
        operations = [s for s in program.steps if isinstance(s, ComputeStep) and not s.constant]
        costs = operation_costs(step.cost for step in operations)
        uses = future_uses(zip((step.inputs for step in operations), costs), program.outputs)
        advances = iter(costs)
    elif future is not None:
        uses = future.uses
    for index, step in enumerate(program.steps):
        if isinstance(step, ComputeStep):
            if step.constant:
                tensor = runtime.constant(step.sizes[0], step.payload, name=step.name, external=step.external)
                values[step.outputs[0]] = tensor
                continue
            if schedule is not None and future is not None:
                schedule.advance(future.positions[index] - schedule.position)
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
                if future is None:
                    schedule.advance(next(advances))
        elif isinstance(step, RetainStep):
            runtime.retain(values[step.value])
        elif isinstance(step, ReadStep):
            if schedule is not None and future is not None:
                schedule.advance(future.positions[index] - schedule.position)
            buffer = runtime.get(values[step.value])
            if on_read is not None:
                on_read(buffer)
        elif isinstance(step, AnnounceStep):
            if schedule is not None:
                schedule.announce(values[step.value], step.positions)
        else:
            runtime.release(values[step.value])
    if schedule is not None and future is not None:
        schedule.advance(future.end - schedule.position)
    return runtime.hold([values[v] for v in program.outputs])
