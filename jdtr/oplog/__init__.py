"""Operator logs of one training step, in the DTR prototype's format (paper App. C.6).

`Trace.from_log(path)` reads a log, `trace.to_log(path)` writes it back, and
`trace.program` is what it means: pure operator calls on numbered values,
with `MUTATE` made copy-on-write; `replay` runs such a program on the DTR
runtime. `jdtr.simulate` replays a trace under a memory budget. A
`TraceRecorder` writes the log of what a jdtr program asks of the runtime
(`jdtr.trace`, `jdtr.grad(..., log=path)`).

This was `jdtr.trace` before 0.2, a name now left to the function alone.
"""

from ._errors import LogFormatError as LogFormatError
from ._floor import Floor as Floor
from ._floor import floor as floor
from ._program import AnnounceStep as AnnounceStep
from ._program import ComputeStep as ComputeStep
from ._program import Future as Future
from ._program import Program as Program
from ._program import ReadStep as ReadStep
from ._program import ReleaseStep as ReleaseStep
from ._program import RetainStep as RetainStep
from ._program import Step as Step
from ._records import Annotate as Annotate
from ._records import Call as Call
from ._records import Constant as Constant
from ._records import Copy as Copy
from ._records import CopyFrom as CopyFrom
from ._records import Mutate as Mutate
from ._records import Record as Record
from ._records import Release as Release
from ._recorder import TraceRecorder as TraceRecorder
from ._replay import replay as replay
from ._trace import Trace as Trace

__all__ = [
    "AnnounceStep",
    "Annotate",
    "Call",
    "ComputeStep",
    "Constant",
    "Copy",
    "CopyFrom",
    "Future",
    "LogFormatError",
    "Mutate",
    "Program",
    "ReadStep",
    "Record",
    "Release",
    "ReleaseStep",
    "RetainStep",
    "Step",
    "Trace",
    "TraceRecorder",
    "replay",
]
