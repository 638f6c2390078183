"""The DTR runtime: allocation, eviction, rematerialization, deallocation.

This is Figure 1 of the paper made exact by App. C.4: every operator call
locks its inputs, rematerializes the undefined ones (recursively in the
paper; here on a stack of frames, so a chain of thousands of evicted values
is rebuilt without reaching Python's recursion limit), reserves
memory for its outputs by evicting the storages the heuristic scores lowest,
and runs. The runtime knows nothing of JAX: a `Backend` runs operators on
buffers (device arrays, or nothing at all in simulation), so the same
decisions are taken on a GPU and in the simulator.

Invariant kept at every step: `memory <= budget_bytes`, where `memory` is the
sum of the sizes of resident storages plus the outputs being allocated.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

from .errors import OutOfBudgetError
from .graph import Operator, Storage, Tensor
from .heuristics.base import Heuristic
from .heuristics.dtr import DTREqClass
from .observer import Observer
from .schedule import Schedule

DEALLOC_POLICIES = ("eager", "banish", "ignore")


class Backend(Protocol):
    """Runs operators on buffers. Buffers are opaque to the runtime."""

    def compute(self, op: Operator, args: list[Any]) -> tuple[list[Any], Optional[float]]:
        """Runs `op` on the input buffers; returns its output buffers and,
        if it measured one, the elapsed time (used when `op.cost` is None)."""

    def free(self, buffer: Any) -> None:
        """Releases a buffer the runtime owns."""


class NullBackend:
    """A backend without buffers: the simulator's."""

    def compute(self, op: Operator, args: list[Any]) -> tuple[list[Any], Optional[float]]:
        return [None] * len(op.outputs), None

    def free(self, buffer: Any) -> None:
        pass


class ThrashError(RuntimeError):
    """Rematerialization compute exceeded the limit (the simulator's "thrash")."""


class Runtime:
    """One DTR run under a byte budget.

    Args:
      backend: runs operators and frees buffers.
      budget_bytes: the most memory resident at any time.
      heuristic: a `Heuristic` (names are resolved by the caller, with
        `jdtr.runtime.get_heuristic`); None for the paper's h_DTR^eq.
      dealloc: what a dropped last reference does (App. C.5): "eager" evicts
        the storage, "banish" frees it for good once nothing evicted needs it,
        "ignore" does nothing.
      observers: telemetry receivers.
      remat_limit: raise `ThrashError` once rematerialization cost exceeds it.
      schedule: the program's future accesses, for heuristics that look ahead
        (`jdtr.runtime.Schedule`); made empty when the heuristic reads one and
        none is given. The driver of the run fills it.
      device_bytes: the bytes the run holds on the device by the device's own
        count, which can exceed the runtime's (allocator rounding, buffers not
        yet returned); where given, eviction also keeps the larger of the two
        within the budget, as far as evicting helps. Decisions then depend on
        the allocator, so a replay without it (the simulator) may take others.
    """

    def __init__(
        self,
        backend: Backend,
        budget_bytes: float,
        heuristic: Optional[Heuristic] = None,
        dealloc: str = "eager",
        observers: Sequence[Observer] = (),
        remat_limit: Optional[float] = None,
        schedule: Optional[Schedule] = None,
        device_bytes: Optional[Callable[[], int]] = None,
    ):
        if dealloc not in DEALLOC_POLICIES:
            raise ValueError(f"unknown dealloc policy {dealloc!r}; expected one of {DEALLOC_POLICIES}")
        self.backend = backend
        self.budget_bytes = budget_bytes
        if heuristic is None:
            heuristic = DTREqClass()
        elif not isinstance(heuristic, Heuristic):
            raise TypeError(
                f"Runtime takes a Heuristic instance, not {heuristic!r}; resolve a name with jdtr.runtime.get_heuristic"
            )
        self.heuristic = heuristic
        self.dealloc = dealloc
        self.observers = list(observers)
        self.remat_limit = remat_limit
        self.device_bytes = device_bytes
        self.memory = 0
        self.pinned_bytes = 0
        self.clock = 1.0  # as the paper's simulator: overhead = clock / baseline
        self.remat_cost = 0.0
        self.pool: dict[Storage, None] = {}  # evictable storages, oldest first
        self.storages: list[Storage] = []
        self._pending_banish: dict[Storage, None] = {}
        self._ids = 0
        if schedule is None and self.heuristic.uses_schedule:
            schedule = Schedule()
        self.schedule = schedule
        self.heuristic.reset()
        self.heuristic.attach(self)  # the runtime is the heuristic's `RunView`

    # ----------------------------------------------------------------- creation

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def constant(self, size: int, buffer: Any = None, name: Optional[str] = None, external: bool = False) -> Tensor:
        """A pinned, never-rematerialized tensor (weights, inputs). `external`
        buffers belong to the caller and are never freed."""
        self._reserve(size, None, name or "constant")
        storage = Storage(self._next_id(), size)
        storage.external = external
        tensor = Tensor(self._next_id(), storage, None, 0, name)
        storage.root = tensor
        storage.tensors.append(tensor)
        self.storages.append(storage)
        tensor.buffer, tensor.defined = buffer, True
        storage.resident = True
        storage.last_access = self.clock
        self._ref(tensor)
        self._pin(storage)
        return tensor

    def call(
        self,
        name: str,
        inputs: Sequence[Tensor],
        sizes: Sequence[int],
        cost: Optional[float] = None,
        payload: Any = None,
        replayable: bool = True,
        source: Optional[object] = None,
        aliases: Optional[Sequence[int]] = None,
        workspace: int = 0,
    ) -> list[Tensor]:
        """Runs `outputs = name(inputs)` and returns the outputs, each holding one reference.

        `sizes[i]` is the byte size of output i; `aliases[i] = j >= 0` makes
        output i a view of input j's storage (size 0). `cost=None` takes the
        time the backend measured. `workspace` bytes are reserved with the
        outputs each time the operator runs (first and replayed) and given
        back when it has run: memory it needs only while running.
        """
        op = Operator(self._next_id(), name, tuple(inputs), cost, payload, replayable, source, workspace)
        for index, size in enumerate(sizes):
            alias = aliases[index] if aliases is not None else -1
            if alias is not None and alias >= 0:
                storage = inputs[alias].storage
                tensor = Tensor(self._next_id(), storage, op, index)
            else:
                storage = Storage(self._next_id(), size)
                self.storages.append(storage)
                tensor = Tensor(self._next_id(), storage, op, index)
                storage.root = tensor
            storage.tensors.append(tensor)
            op.outputs.append(tensor)
        if op.cost is not None:
            # As in the paper's simulator, a view's operator is charged to the
            # viewed storage when it is called, before it runs (running it may
            # rematerialize that storage).
            self._charge(op)
            self._perform(op, rematerialization=False)
        else:
            self._perform(op, rematerialization=False)  # measures op.cost
            self._charge(op)
        input_storages = dict.fromkeys(t.storage for t in op.inputs)
        for storage in dict.fromkeys(t.storage for t in op.outputs):
            for dep in input_storages:
                if dep is not storage and dep not in storage.deps:
                    storage.deps.append(dep)
                    dep.dependents.append(storage)
        for tensor in op.outputs:
            self._ref(tensor)
        new_storages = dict.fromkeys(t.storage for t in op.outputs if not t.is_alias)
        for storage in new_storages:
            self.heuristic.on_compute(storage)
            if not replayable:
                self._pin(storage)
        return op.outputs

    @staticmethod
    def _charge(op: Operator) -> None:
        """Adds `op`'s cost to the storages of its outputs (App. C.2: a
        storage costs the sum over the distinct operators of its tensors, so
        an operator with two views of one storage counts once)."""
        for storage in dict.fromkeys(t.storage for t in op.outputs):
            storage.cost += op.cost

    # ------------------------------------------------------------- references

    def _ref(self, tensor: Tensor) -> None:
        tensor.refs += 1
        tensor.storage.refs += 1

    def retain(self, tensor: Tensor) -> None:
        """A new external reference to `tensor` (the log's COPY)."""
        self._ref(tensor)

    def release(self, tensor: Tensor) -> None:
        """Drops one external reference; the last one triggers deallocation."""
        if tensor.refs <= 0:
            raise RuntimeError(f"{tensor!r} released more often than referenced")
        tensor.refs -= 1
        storage = tensor.storage
        storage.refs -= 1
        if storage.refs == 0:
            self._deallocate(storage)

    def get(self, tensor: Tensor) -> Any:
        """The buffer of `tensor`, rematerialized if it was evicted."""
        if not tensor.defined:
            self._lock(tensor.storage)
            try:
                self._rematerialize(tensor)
            finally:
                self._unlock(tensor.storage)
        tensor.storage.last_access = self.clock
        return tensor.buffer

    def hold(self, tensors: Sequence[Tensor]) -> list[Any]:
        """Makes `tensors` resident and keeps them so (App. C.6's output
        condition): each in turn is rematerialized if needed, then locked for
        good. Returns their buffers."""
        for tensor in tensors:
            if not tensor.defined:
                self._rematerialize(tensor)
            self._lock(tensor.storage)
        return [t.buffer for t in tensors]

    # ------------------------------------------------------------ the algorithm

    def _perform(self, op: Operator, rematerialization: bool, target: Optional[Tensor] = None) -> None:
        """Runs `op` and every rematerialization it needs (App. C.4).

        The paper's recursion (an undefined input rematerializes its own
        inputs first) is kept in its order, but on an explicit stack: each
        frame is a `_steps` generator that yields the input it needs rebuilt,
        and gets that input's frame pushed above it. An unrolled RNN or a deep
        MLP evicts chains longer than Python's recursion limit. An exception
        in a frame is thrown into the frame below, which unlocks what it
        locked, as a `try` around a recursive call would.
        """
        frames = [self._steps(op, rematerialization, target)]
        error: Optional[BaseException] = None
        while frames:
            try:
                if error is None:
                    tensor = next(frames[-1])
                else:
                    pending, error = error, None
                    tensor = frames[-1].throw(pending)
            except StopIteration:
                frames.pop()
                continue
            except BaseException as exc:
                frames.pop()
                if not frames:
                    raise
                error = exc
                continue
            try:
                frames.append(self._steps(self._replay_of(tensor), True, tensor))
            except BaseException as exc:
                error = exc

    def _steps(self, op: Operator, rematerialization: bool, target: Optional[Tensor]) -> Iterator[Tensor]:
        """One frame of `_perform`: locks the inputs, has the undefined ones
        rematerialized, reserves the outputs' memory and runs `op` (App. C.4,
        (Re)materialization).

        `target` is the output asked for (the first one for a first
        computation). The order of every step follows the paper's simulator,
        because the pool's order breaks ties between equal scores:

        * the inputs' last access is the time the op is requested, before any
          nested rematerialization; a first computation's outputs are stamped
          when it finishes;
        * the defined inputs are locked first; each undefined one is then
          rematerialized (unless a sibling's replay defined it meanwhile) and
          locked in turn;
        * the outputs that became resident join the pool (the target last)
          before the inputs are unlocked, in input order.
        """
        for tensor in op.inputs:
            tensor.storage.last_access = self.clock
        ready = [t for t in op.inputs if t.defined]
        pending = [t for t in op.inputs if not t.defined]
        locked: list[Storage] = []
        try:
            for tensor in ready:
                self._lock(tensor.storage)
                locked.append(tensor.storage)
            for tensor in pending:
                if not tensor.defined:
                    yield tensor  # `_perform` rematerializes it, then resumes this frame
                self._lock(tensor.storage)
                locked.append(tensor.storage)
            needed = sum(t.size for t in op.outputs) + op.workspace
            self._reserve(needed, op, op.name)
            try:
                buffers, elapsed = self.backend.compute(op, [t.buffer for t in op.inputs])
            except BaseException:
                self._unreserve(needed)
                raise
            self._finish(op, buffers, elapsed, rematerialization, target or (op.outputs[0] if op.outputs else None))
            if op.workspace:
                self._unreserve(op.workspace)
        except BaseException:
            for storage in locked:
                self._unlock(storage)
            raise
        for tensor in op.inputs:
            self._unlock(tensor.storage)
        if rematerialization and self.remat_limit is not None and self.remat_cost > self.remat_limit:
            raise ThrashError(f"rematerialization cost {self.remat_cost:g} exceeded {self.remat_limit:g}")
        if self._pending_banish:
            for storage in dict.fromkeys(t.storage for t in op.inputs):
                if storage in self._pending_banish:
                    self._try_banish(storage)

    def _finish(
        self,
        op: Operator,
        buffers: list[Any],
        elapsed: Optional[float],
        rematerialization: bool,
        target: Optional[Tensor],
    ) -> None:
        """Accounts for `op` having run: the clock, its outputs' buffers and residency."""
        if op.cost is None:
            op.cost = float(elapsed) if elapsed is not None else 0.0
        self.clock += op.cost
        if rematerialization:
            self.remat_cost += op.cost
        for observer in self.observers:
            observer.on_compute(op, op.cost, rematerialization, self.clock)
        became_resident: list[Storage] = []
        for tensor, buffer in zip(op.outputs, buffers):
            storage = tensor.storage
            if tensor.defined:
                # A multi-output op replayed for one output: the others were
                # still defined, so their fresh copies are freed at once.
                if not tensor.is_alias:
                    self.backend.free(buffer)
                    self._unreserve(storage.size)
                continue
            tensor.buffer, tensor.defined = buffer, True
            if not storage.resident:
                storage.resident = True
                if rematerialization:
                    self.heuristic.on_rematerialize(storage)
            if not rematerialization:
                storage.last_access = self.clock
            if tensor is not target:
                became_resident.append(storage)
        # The target joins the pool last, as in the paper's simulator.
        for storage in (*became_resident, *((target.storage,) if target is not None else ())):
            self._update_pool(storage)

    def _rematerialize(self, tensor: Tensor) -> None:
        self._perform(self._replay_of(tensor), rematerialization=True, target=tensor)

    @staticmethod
    def _replay_of(tensor: Tensor) -> Operator:
        """The operator that recomputes `tensor`. A view of an evicted storage
        reads a tensor of that storage, so replaying it rebuilds the storage
        first."""
        op = tensor.op
        if op is None or not op.replayable:
            raise RuntimeError(f"{tensor!r} was freed but cannot be recomputed; this is a jdtr bug")
        return op

    def _reserve(self, nbytes: int, op: Optional[Operator], name: str) -> None:
        """Evicts until `nbytes` more fit under the budget, then takes them."""
        while self.memory + nbytes > self.budget_bytes:
            victim = self.heuristic.choose(self.pool, self.clock)
            if victim is None:
                self._raise_out_of_budget(nbytes, op, name)
            self._evict(victim, by_heuristic=True)
        if self.device_bytes is not None:
            self._reserve_on_device(nbytes)
        self.memory += nbytes
        for observer in self.observers:
            observer.on_allocate(nbytes, self.memory, op)

    def _reserve_on_device(self, nbytes: int) -> None:
        """Evicts further while the device holds more than the runtime counts
        and the two together leave no room for `nbytes`: an allocator rounds
        buffers up to blocks, so a budget kept by count can be exceeded on the
        device. Best effort: it stops when nothing is evictable, or when an
        eviction did not lower the device's use (its buffer is still read by
        an operator in flight), and never raises: the count's budget holds."""
        used = max(self.memory, self.device_bytes())
        while used + nbytes > self.budget_bytes:
            victim = self.heuristic.choose(self.pool, self.clock)
            if victim is None:
                return
            self._evict(victim, by_heuristic=True)
            now = max(self.memory, self.device_bytes())
            if now >= used:
                return
            used = now

    def _unreserve(self, nbytes: int) -> None:
        self.memory -= nbytes
        for observer in self.observers:
            observer.on_free(nbytes, self.memory)

    def _raise_out_of_budget(self, nbytes: int, op: Optional[Operator], name: str) -> None:
        locked = sum(s.size for s in self.storages if s.resident and s.locks and not s.pinned)
        free = max(int(self.budget_bytes) - self.memory, 0)
        raise OutOfBudgetError(
            needed_bytes=int(nbytes),
            free_bytes=free,
            pinned_bytes=int(self.pinned_bytes),
            locked_bytes=int(locked),
            budget_bytes=int(self.budget_bytes),
            op_name=name,
            source=op.source if op is not None else None,
        )

    def _evict(self, storage: Storage, by_heuristic: bool) -> None:
        """Frees a storage's buffer; its tensors become undefined (App. C.4)."""
        self._release_buffer(storage)
        self.heuristic.on_evict(storage)
        for observer in self.observers:
            observer.on_evict(storage, by_heuristic, self.clock)

    def _release_buffer(self, storage: Storage) -> None:
        """The memory side of evicting or banishing: the buffer goes back,
        the storage's tensors become undefined and it leaves the pool."""
        self.backend.free(storage.root.buffer)
        for tensor in storage.tensors:
            tensor.buffer, tensor.defined = None, False
        storage.resident = False
        self._pool_remove(storage)
        self._unreserve(storage.size)

    # ------------------------------------------------------------ bookkeeping

    def _lock(self, storage: Storage) -> None:
        storage.locks += 1
        self._pool_remove(storage)

    def _unlock(self, storage: Storage) -> None:
        storage.locks -= 1
        self._update_pool(storage)

    def _update_pool(self, storage: Storage) -> None:
        if storage.evictable:
            if storage not in self.pool:  # a member keeps its place
                self.pool[storage] = None
                self.heuristic.on_pool_add(storage, self.clock)
        else:
            self._pool_remove(storage)

    def _pool_remove(self, storage: Storage) -> None:
        if self.pool.pop(storage, 0) is None:
            self.heuristic.on_pool_remove(storage)

    def _pin(self, storage: Storage) -> None:
        if not storage.pinned:
            storage.pinned = True
            if storage.resident:
                self.pinned_bytes += storage.size
            self._pool_remove(storage)
            for observer in self.observers:
                observer.on_pin(storage)

    # ----------------------------------------------------------- deallocation

    def _deallocate(self, storage: Storage) -> None:
        """The program dropped its last reference to `storage` (App. C.5)."""
        if self.dealloc == "eager":
            if storage.evictable:
                self._evict(storage, by_heuristic=False)
        elif self.dealloc == "banish":
            self._try_banish(storage)

    def _try_banish(self, storage: Storage) -> None:
        """Frees `storage` for good once no evicted storage depends on it;
        its resident dependents are pinned, as they can no longer be rebuilt."""
        if storage.banished or storage.refs > 0 or storage.external or storage.locks > 0:
            self._pending_banish.pop(storage, None)
            return
        if any(not d.banished and not (d.resident and all(t.defined for t in d.tensors)) for d in storage.dependents):
            # Retried when a dependent returns. A resident dependent may still
            # lack a view (its storage rebuilt, the view's own operator not
            # yet replayed), and that operator may read this storage.
            self._pending_banish[storage] = None
            return
        self._pending_banish.pop(storage, None)
        if storage.resident:
            if storage.pinned:
                self.pinned_bytes -= storage.size
            self._release_buffer(storage)
        storage.banished = True
        self.heuristic.on_banish(storage)
        for observer in self.observers:
            observer.on_banish(storage, self.clock)
        for dependent in storage.dependents:
            if not dependent.banished:
                self._pin(dependent)

    # --------------------------------------------------------------- teardown

    def free_all(self, keep: Sequence[Tensor] = ()) -> None:
        """Frees every buffer the runtime owns except those of `keep`; also
        after an error, so that nothing leaks. Ends the run: the heuristic
        lets go of it."""
        kept = {t.storage for t in keep}
        for storage in self.storages:
            if storage.resident and storage not in kept and not storage.external:
                try:
                    self.backend.free(storage.root.buffer)
                except Exception:  # noqa: BLE001 - a failed free must not hide the first error
                    pass
                for tensor in storage.tensors:
                    tensor.buffer, tensor.defined = None, False
                storage.resident = False
        # The runtime's graph is full of reference cycles and outlives the
        # call until Python's cycle collector runs; it must not keep the
        # caller's outputs (or arguments) alive past the caller's own references.
        for storage in self.storages:
            for tensor in storage.tensors:
                tensor.buffer = None
        for storage in list(self.pool):
            self._pool_remove(storage)
        self.heuristic.detach()

    def close(self) -> None:
        """Ends the run for good (after `free_all`, or a simulation's last
        step): unlinks the graph, whose storages, tensors and operators refer
        to one another, so that reference counting frees it at once. Left to
        Python's cycle collector, a simulation's tens of thousands of objects
        cost a collection that walks them all, in the caller's time."""
        for storage in self.storages:
            for tensor in storage.tensors:
                tensor.op = None
                tensor.buffer = None
            storage.tensors, storage.root = [], None
            storage.deps, storage.dependents = [], []
            storage.heuristic_state = None
        self.storages = []
        self.pool.clear()
        self.heuristic.detach()  # it refers to the runtime, which refers to it
