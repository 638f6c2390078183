"""Runs a `Program` eagerly on device buffers, through the DTR runtime.

The loop is `eval_jaxpr`'s: an environment from values to runtime tensors,
one step per equation, values released at their last use. The runtime
decides what stays on the device; this module only feeds it operators and
references, and hands it a backend that runs executables on `jax.Array`s
and frees them with `.delete()`.
"""

from __future__ import annotations

import time
import weakref
from collections import defaultdict
from typing import Any, Callable, Iterable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..oplog import TraceRecorder
from ..runtime import Operator, Runtime, Tensor, future_uses, operation_costs
from .costs import nanoseconds
from .devices import device_bytes
from .program import Cond, Equation, Program, Value


# Executables that have run in this process. An executable's first run pays
# a one-time cost beside its work: on the CPU, a transformer's, an MLP's and
# a ResNet's executables took a median 4.5-5.4x their later runs the first
# time, which a measured cost would keep, and equal layers share one
# (docs/benchmarks.md, "Measured costs without an executable's first run").
_RUN_BEFORE: "weakref.WeakSet[Callable]" = weakref.WeakSet()


class JaxBackend:
    """Runs equations on `jax.Array`s; eviction deletes the array's buffer.

    With `measure=True` every operator is timed synchronously (the paper's
    prototype mode), after an untimed run of an executable that has not run
    in this process yet, unless the equation has effects (which run once);
    with `serial=True` each waits for its outputs, untimed
    (`executor.serial_dispatch`); `after_compute` is called when the outputs
    exist, the moment the most memory is live (used by the debug budget check).
    """

    def __init__(self, measure: bool = False, after_compute: Optional[Callable[[], None]] = None, serial: bool = False):
        self.measure = measure
        self.after_compute = after_compute
        self.serial = serial

    def compute(self, op: Operator, args: list[Any]) -> tuple[list[Any], Optional[float]]:
        fn = op.payload.fn
        if self.measure:
            if fn not in _RUN_BEFORE and not getattr(op.payload, "effects", True):
                # Its outputs take the bytes the runtime reserved for the timed run's, and are gone
                # (unreferenced, not deleted: one may be an input, forwarded) before it starts.
                jax.block_until_ready(fn(*args))
            _RUN_BEFORE.add(fn)
            start = time.perf_counter()
            outs = fn(*args)
            jax.block_until_ready(outs)
            elapsed = nanoseconds(time.perf_counter() - start)
        else:
            outs, elapsed = fn(*args), None
            if self.serial:
                jax.block_until_ready(outs)
        if self.after_compute is not None:
            self.after_compute()
        return outs, elapsed

    def free(self, buffer: Any) -> None:
        if buffer is not None and not buffer.is_deleted():
            buffer.delete()


class LiveArrayCheck:
    """Debug check: the device bytes of every live array the run made or holds
    (summed over `jax.live_arrays()`, not the runtime's own counter) stay
    within the budget, on each device: an array sharded over a mesh counts
    its shard on each device that holds one."""

    def __init__(self, budget_bytes: int, held: Sequence[Any]):
        held_ids = {id(a) for a in held}
        # Arrays that were alive before the run and are not its inputs: not ours.
        self._others = [a for a in jax.live_arrays() if id(a) not in held_ids]
        self._other_ids = {id(a) for a in self._others}
        self.budget_bytes = budget_bytes
        self.peak_bytes = 0

    def __call__(self) -> None:
        live = per_device_bytes(a for a in jax.live_arrays() if id(a) not in self._other_ids)
        self.peak_bytes = max(self.peak_bytes, live)
        if live > self.budget_bytes:
            raise AssertionError(f"jdtr: {live} live device bytes exceed the budget of {self.budget_bytes} bytes")

    def release(self) -> None:
        self._others = []


class Interpreter:
    """Evaluates a program with `runtime`; one instance per run.

    A `recorder` (`jdtr.TraceRecorder`) stands between the program and
    the runtime and writes down what the program asks of it, as an operator
    log; without one, the program talks to the runtime directly.
    """

    def __init__(
        self,
        runtime: Runtime,
        recorder: Optional[TraceRecorder] = None,
    ):
        self.runtime = runtime if recorder is None else recorder.attach(runtime)
        self.schedule = runtime.schedule  # the program's future, when the heuristic looks ahead
        self._future: Optional[tuple[dict[Value, list[float]], list[float]]] = None
        self._top: Optional[Program] = None

    def run(self, program: Program, args: Sequence[Any], owned: Sequence[bool]) -> list[Any]:
        """Runs `program` on `args`; `owned[i]` marks arguments jdtr created
        itself (it may free those), the others belong to the caller and are
        never deleted. Returns the output arrays; every other buffer the run
        made is freed, also when an error interrupts it."""
        runtime = self.runtime
        env: dict[Value, Tensor] = {}
        outputs: list[Tensor] = []
        try:
            for value, array, mine in zip(program.inputs, args, owned):
                env[value] = runtime.constant(value.nbytes, array, name="argument", external=not mine)
            for value, array in program.consts:
                env[value] = runtime.constant(value.nbytes, array, name="constant", external=True)
            if self.schedule is not None:
                self._future, self._top = program_future(program), program
            self._body(program, env)
            outputs = [self._tensor(env, atom) for atom in program.outputs]
            buffers = runtime.hold(outputs)
        except BaseException:
            runtime.free_all()
            raise
        runtime.free_all(keep=outputs)
        return buffers

    def _tensor(self, env: dict[Value, Tensor], atom: Any) -> Tensor:
        if isinstance(atom, Value):
            return env[atom]
        array = jnp.asarray(atom.value)
        return self.runtime.constant(int(array.nbytes), array, name="literal")

    def _body(self, program: Program, env: dict[Value, Tensor]) -> None:
        runtime = self.runtime
        release = program.release_after
        for value in release.get(-1, ()):
            runtime.release(env.pop(value))
        for i, item in enumerate(program.body):
            if type(item) is Equation:
                outs = runtime.call(
                    item.name,
                    [env[v] for v in item.args],
                    [v.nbytes for v in item.outputs],
                    cost=item.cost,
                    payload=item,
                    replayable=not item.effects,
                    source=item.source,
                    workspace=item.workspace,  # XLA's temporaries, while it runs
                )
                for value, tensor in zip(item.outputs, outs):
                    env[value] = tensor
                self._announce(item.outputs, outs)
            else:
                self._cond(item, env)
            for value in release.get(i, ()):
                runtime.release(env.pop(value))
            if self._future is not None and program is self._top:
                self.schedule.advance(self._future[1][i])

    def _cond(self, cond: Cond, env: dict[Value, Tensor]) -> None:
        """Reads the branch index from the device and runs only that branch."""
        runtime = self.runtime
        index = int(np.asarray(runtime.get(env[cond.index])))
        branch = cond.branches[min(max(index, 0), len(cond.branches) - 1)]  # lax.switch clamps
        branch_env: dict[Value, Tensor] = {}
        for value, atom in zip(branch.inputs, cond.operands):
            tensor = self._tensor(env, atom)
            if isinstance(atom, Value):
                runtime.retain(tensor)
            branch_env[value] = tensor
        self._body(branch, branch_env)
        results = []
        for atom in branch.outputs:
            tensor = self._tensor(branch_env, atom)
            if isinstance(atom, Value):
                runtime.retain(tensor)
            results.append(tensor)
        for tensor in branch_env.values():
            runtime.release(tensor)
        for value, tensor in zip(cond.outputs, results):
            env[value] = tensor
        self._announce(cond.outputs, results)

    def _announce(self, values: Sequence[Value], tensors: Sequence[Tensor]) -> None:
        """Tells the schedule when the program will read these new tensors."""
        if self._future is not None:
            uses = self._future[0]
            for value, tensor in zip(values, tensors):
                self.schedule.announce(tensor, uses.get(value, ()))


# ------------------------------------------------------------------ the program's future


def program_future(program: Program) -> tuple[dict[Value, list[float]], list[float]]:
    """For a `jdtr.runtime.Schedule`: the positions at which `program` reads
    each value (`jdtr.runtime.future_uses`), and the cost of each top-level item.

    A position is the cost of the items before (1 per item when a cost is
    unknown, as with measured costs); a value read inside a `cond` branch is
    read at the `cond`'s position, and the outputs are read at the end.
    """
    costs = operation_costs(_item_cost(item) for item in program.body)
    outputs = [atom for atom in program.outputs if isinstance(atom, Value)]
    return future_uses(zip(map(_reads, program.body), costs), outputs), costs


def _item_cost(item: Any) -> Optional[float]:
    """An item's cost for positions: a `cond` by its costliest branch."""
    if isinstance(item, Equation):
        return item.cost
    branches = [[_item_cost(inner) for inner in branch.body] for branch in item.branches]
    if any(cost is None for costs in branches for cost in costs):
        return None
    return max((sum(costs) for costs in branches), default=0.0)


def _reads(item: Any) -> list[Value]:
    """The values an item reads; for a `cond`, also those read and made inside its branches."""
    if isinstance(item, Equation):
        return list(item.args)
    reads = list(item.args)
    for branch in item.branches:
        for inner in branch.body:
            reads.extend(_reads(inner))
        reads.extend(atom for atom in branch.outputs if isinstance(atom, Value))
    return reads


def per_device_bytes(arrays: Iterable[Any]) -> int:
    """The most bytes `arrays` hold on any one device (each array's largest
    shard on every device it is placed on), each buffer once.

    Reading a sharded array on the host (`np.asarray`: a `cond`'s predicate,
    read to choose a path) leaves a single-device array over each shard it
    read, cached on it, whose buffer is that shard's: `jax.live_arrays()`
    lists it beside the array it views, and counting both would count the
    shard twice."""
    arrays = list(arrays)
    totals: dict[Any, int] = defaultdict(int)
    sharded = False
    for a in arrays:
        nbytes = device_bytes(a)
        devices = a.sharding.device_set
        sharded = sharded or len(devices) > 1
        for device in devices:
            totals[device] += nbytes
    if sharded:  # (only a sharded array has shard views; `debug` checks at every step)
        for view in _shard_views(arrays):
            totals[next(iter(view.sharding.device_set))] -= device_bytes(view)
    return max(totals.values(), default=0)


def _shard_views(arrays: Sequence[Any]) -> list[Any]:
    """The single-device arrays among `arrays` whose buffer is a shard of
    another of them. Only the arrays that could have such a view (same dtype,
    a shard of the view's shape) are asked for their shards' buffers, since
    asking makes (and caches) a view of each shard."""
    singles = {}
    for a in arrays:
        if len(a.sharding.device_set) == 1:
            singles.setdefault((a.dtype, tuple(a.shape)), []).append(a)
    if not singles:
        return []
    views = []
    for a in arrays:
        devices = a.sharding.device_set
        if len(devices) == 1:
            continue
        candidates = singles.get((a.dtype, tuple(a.sharding.shard_shape(a.shape))))
        if not candidates:
            continue
        candidates = [v for v in candidates if next(iter(v.sharding.device_set)) in devices]
        if not candidates:
            continue
        shards = {s.data.unsafe_buffer_pointer() for s in a.addressable_shards}
        views.extend(v for v in candidates if v.unsafe_buffer_pointer() in shards)
    return views

