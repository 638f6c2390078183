"""The least memory any run of an operator program holds at some moment.

Whatever a heuristic evicts, the runtime holds the caller's constants for
the whole run (external: never freed), and, at once, an operator's inputs,
outputs and workspace while it first runs, and at the end every output (the
output condition, App. C.6). A budget under the largest of these fails on
every heuristic; a planner can say so before simulating any, which, near
such a budget, thrash for seconds before they fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ._program import ComputeStep, Program

# The name the floor gives the moment the outputs are held (not an operator).
OUTPUTS = "the outputs, held at the end"


@dataclass(frozen=True)
class Floor:
    """Where a program needs the most memory that no eviction can free.

    Attributes:
      external_bytes: the caller's constants, held throughout.
      held_bytes: besides those, what that moment holds: an operator's
        inputs, outputs and workspace, or the outputs at the end.
      op_name: that operator's name, or `OUTPUTS`.
      source: where that operator comes from, when known.
    """

    external_bytes: int
    held_bytes: int
    op_name: str
    source: Optional[object] = None

    @property
    def total_bytes(self) -> int:
        return self.external_bytes + self.held_bytes


def floor(program: Program) -> Floor:
    """The least memory any run of `program` needs (see the module's docstring).

    Counted by storage, as the runtime counts: a view adds nothing, a value
    read twice counts once, and an external constant is in `external_bytes`
    only. Constants the run owns count where an operator reads them: a run
    may free them once they are released."""
    external = 0
    storage: dict[int, int] = {}  # value -> the value owning its storage
    own: dict[int, int] = {}  # storage -> its bytes, outside the external ones
    best: tuple[int, str, Optional[object]] = (0, OUTPUTS, None)
    for step in program.steps:
        if not isinstance(step, ComputeStep):
            continue
        if step.constant:
            value = step.outputs[0]
            storage[value] = value
            own[value] = 0 if step.external else step.sizes[0]
            external += step.sizes[0] if step.external else 0
            continue
        for index, (value, size) in enumerate(zip(step.outputs, step.sizes)):
            alias = step.aliases[index] if index < len(step.aliases) else -1
            if alias is not None and alias >= 0:
                storage[value] = storage[step.inputs[alias]]
            else:
                storage[value], own[value] = value, size
        held = sum(own[s] for s in {storage[v] for v in (*step.inputs, *step.outputs)}) + step.workspace
        if held > best[0]:
            best = (held, step.name, step.source)
    outputs = sum(own[s] for s in {storage[v] for v in program.outputs if v in storage})
    if outputs >= best[0]:
        best = (outputs, OUTPUTS, None)
    return Floor(external, *best)
