"""Recording what a program asks of the DTR runtime, as an operator log (App. C.6).

A `TraceRecorder` stands between an interpreter and its `jdtr.runtime.Runtime`:
every request the program makes — a constant, an operator call, a new or a
dropped reference, the outputs held at the end — goes on to the runtime and
is written down as a record of the DTR prototype's log format. What the
runtime does on its own (evictions, rematerializations) is not written down:
replaying the log (`jdtr.simulate`) decides it again, on the same runtime, so
the replay takes the run's decisions.

The log a recorder writes:

* `ANNOTATE START`, then one `CONSTANT` + `MEMORY` per argument, jaxpr
  constant and literal the program holds (named "argument<n>", "constant<n>",
  "literal<n>");
* one `CALL` per operator the program runs, each result a new storage
  (`ALIAS -1`) named "v<n>", with its size in bytes and `TIME` the operator's
  cost in the runtime's unit (jdtr's interpreter counts whole nanoseconds),
  as an integer of at least 1; the memory the operator needs only while it
  runs (XLA's temporaries), where it needs any, is one more result named
  "workspace<n>", released right after the call (`jdtr.oplog._program`
  reads it back as such);
* `COPY` for a new reference (a `cond` branch taking its operands), `RELEASE`
  for a dropped one (each value's last use), except for the caller's
  arguments and the program's constants, which outlive the call (the
  runtime never frees them; in a replay they are outputs, resident at the end);
* the outputs: every value still referenced at the end. A replay holds them
  (App. C.6's output condition) in the order their names first appeared,
  the runtime in the program's output order; when the two differ, the log
  names the outputs up front, as 0-byte constants "output<n>" right after
  `START`, and re-points those names at the results at the end (`COPY_FROM`,
  then a `RELEASE` of the result's own name), so that a replay holds them in
  the program's order too. Neither step changes what the runtime does.

What the format cannot say (see `TraceRecorder`'s notes) is approximated.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..runtime import Runtime, Tensor
from ._program import WORKSPACE_PREFIX
from ._records import Annotate, Call, Constant, Copy, CopyFrom, Record, Release
from ._trace import Trace


def log_time(cost: Optional[float]) -> int:
    """A cost in the runtime's unit (nanoseconds for jdtr's interpreter) as a
    log's `TIME`: an integer of at least 1."""
    return max(1, round(cost or 0.0))


class TraceRecorder:
    """A runtime front that writes down the program's requests as a `Trace`.

    It offers the methods of `Runtime` that an interpreter or a replay calls
    (`constant`, `call`, `retain`, `release`, `get`, `hold`, `free_all`,
    `schedule`), forwards each to
    the runtime it is attached to, and records the program-level ones.

    Example:
      >>> recorder = TraceRecorder()                                    # doctest: +SKIP
      >>> Interpreter(runtime, recorder=recorder).run(program, args, owned)  # doctest: +SKIP
      >>> jdtr.simulate(recorder.trace(), 0.5)                          # doctest: +SKIP

    Notes — what the log format cannot express, and how it is approximated:

    * An operator without outputs (a callback) becomes a `CALL` with one
      0-byte result, released at once: its cost still advances the clock.
    * Outputs of effectful operators are pinned by the runtime; the format has
      no pinning, so in a replay they are ordinary, evictable values.
    * Reading a `cond`'s predicate (`get`) is not recorded: the format has no
      plain read. The run stamps the predicate's last access (and, if it was
      evicted, rematerializes it); the replay does not.
    * jdtr's interpreter already counts costs in whole nanoseconds, so the
      log's `TIME`s are the run's costs exactly, and a replay computes the
      same scores (and breaks the same ties).
    """

    def __init__(self) -> None:
        self.runtime: Optional[Runtime] = None
        self.records: list[Record] = [Annotate("START")]
        self._names: dict[Tensor, str] = {}  # a tensor's first name, in the order they were defined
        self._counts: dict[str, int] = {}

    def attach(self, runtime: Runtime) -> "TraceRecorder":
        """Forwards to `runtime` from now on; returns the recorder, to be used in its place."""
        self.runtime = runtime
        return self

    def trace(self) -> Trace:
        """The log recorded so far."""
        return Trace(tuple(self.records))

    def _new_name(self, kind: str) -> str:
        count = self._counts.get(kind, 0)
        self._counts[kind] = count + 1
        return f"{kind}{count}"

    # --------------------------------------------------------- recorded requests

    def constant(self, size: int, buffer: Any = None, name: Optional[str] = None, external: bool = False) -> Tensor:
        tensor = self.runtime.constant(size, buffer, name=name, external=external)
        self._names[tensor] = label = self._new_name(name or "constant")
        self.records.append(Constant(label, int(size)))
        return tensor

    def call(self, name: str, inputs: Sequence[Tensor], sizes: Sequence[int], **options: Any) -> list[Tensor]:
        """`Runtime.call` (its keyword options as they are), written down as a `CALL`."""
        outputs = self.runtime.call(name, inputs, sizes, **options)
        cost, aliases, workspace = options.get("cost"), options.get("aliases"), options.get("workspace", 0)
        if cost is None and outputs:  # measured by the backend
            cost = outputs[0].op.cost
        args = tuple(self._names[t] for t in inputs)
        results = [self._new_name("v") for _ in outputs]
        for tensor, label in zip(outputs, results):
            self._names[tensor] = label
        memory = [int(size) for size in sizes]
        alias = [-1 if aliases is None or aliases[i] is None else aliases[i] for i in range(len(results))]
        if not outputs:  # the format needs a result: a 0-byte one, dropped at once
            results, memory, alias = [self._new_name("v")], [0], [-1]
        released = [] if outputs else [results[0]]
        if workspace:  # one more result by the workspace naming rule (see `jdtr.oplog._program`), dropped at once
            released.append(self._new_name(WORKSPACE_PREFIX))
            results.append(released[-1])
            memory.append(int(workspace))
            alias.append(-1)
        self.records.append(Call(name, args, tuple(results), log_time(cost), tuple(memory), tuple(alias)))
        self.records.extend(Release(label) for label in released)
        return outputs

    def retain(self, tensor: Tensor) -> None:
        self.runtime.retain(tensor)
        self.records.append(Copy(self._new_name("v"), self._names[tensor]))

    def release(self, tensor: Tensor) -> None:
        self.runtime.release(tensor)
        if not tensor.storage.external:
            # The caller's arguments (and jaxpr constants) outlive the call:
            # the runtime never frees them, so a replay must not either.
            self.records.append(Release(self._names[tensor]))

    # ------------------------------------------------------ forwarded as they are

    @property
    def schedule(self) -> Any:
        """The runtime's view of the program's future (for a replay that announces it)."""
        return self.runtime.schedule

    def get(self, tensor: Tensor) -> Any:
        return self.runtime.get(tensor)

    def hold(self, tensors: Sequence[Tensor]) -> list[Any]:
        self._name_outputs(tensors)
        return self.runtime.hold(tensors)

    def _name_outputs(self, tensors: Sequence[Tensor]) -> None:
        """Makes a replay hold `tensors` in this order (see the module's docstring)."""
        held = list(dict.fromkeys(tensors))
        rank = {tensor: i for i, tensor in enumerate(self._names)}
        if held == sorted(held, key=rank.__getitem__):
            return  # the order their names appeared in already
        placeholders = [Constant(self._new_name("output"), 0) for _ in held]
        self.records[1:1] = placeholders  # right after START
        for placeholder, tensor in zip(placeholders, held):
            self.records.append(CopyFrom(placeholder.name, self._names[tensor]))
            self.records.append(Release(self._names[tensor]))

    def free_all(self, keep: Sequence[Tensor] = ()) -> None:
        self.runtime.free_all(keep)
