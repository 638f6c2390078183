"""Replaying a lowered trace on the DTR runtime (the one jdtr runs on devices)."""

from __future__ import annotations

from typing import Optional

from ..runtime import Runtime, Tensor, future_uses
from ._program import ComputeStep, Program, RetainStep


def _operations(program: Program):
    """The program's operations for `future_uses`: constants are not operations."""
    for step in program.steps:
        if isinstance(step, ComputeStep) and not step.constant:
            yield step.inputs, step.cost


def replay(program: Program, runtime: Runtime, source: Optional[str] = None) -> None:
    """Runs every step of `program` on `runtime`, then holds the outputs.

    The output condition (App. C.6): every value still referenced at the end
    must be resident, so each output in turn is rematerialized if it was
    evicted and then locked, in the order its first name appeared.

    Raises:
      OutOfBudgetError: the budget cannot hold what an operator needs.
      ThrashError: rematerialization cost exceeded the runtime's limit.
    """
    values: list[Optional[Tensor]] = [None] * len(program.value_names)
    schedule = runtime.schedule  # the program's future, for heuristics that look ahead
    uses = future_uses(_operations(program), program.outputs) if schedule is not None else None
    for step in program.steps:
        if isinstance(step, ComputeStep):
            where = f"{source or 'trace'}:{step.line}" if step.line is not None else None
            if step.constant:
                values[step.outputs[0]] = runtime.constant(step.sizes[0], name=step.name)
                continue
            outputs = runtime.call(
                step.name,
                [values[v] for v in step.inputs],
                step.sizes,
                cost=step.cost,
                aliases=step.aliases,
                source=where,
                workspace=step.workspace,
            )
            for value, tensor in zip(step.outputs, outputs):
                values[value] = tensor
            if schedule is not None:
                for value, tensor in zip(step.outputs, outputs):
                    schedule.announce(tensor, uses.get(value, ()))
                schedule.advance(step.cost)
        elif isinstance(step, RetainStep):
            runtime.retain(values[step.value])
        else:
            runtime.release(values[step.value])
    runtime.hold([values[v] for v in program.outputs])
