"""What `jdtr.grad` keeps between calls, bounded, and what it holds.

Three caches, each least recently used first out:

- traces (`Traced`: the normalised program of one argument structure),
  `MAX_TRACES_PER_FUNCTION` per function and configuration, shared by every
  wrapper of the same function as `jax.jit`'s are, and dropped with the
  function;
- plans, `MAX_PLANS_PER_TRACE` per trace (budgets, heuristics, owned
  arguments);
- compiled chunks (`chunks.py`), shared by all, keyed by content.

A dynamic model (a TreeLSTM, a new tree each call) makes a trace per
structure: the bound keeps its memory from growing with the number of
structures seen. `cache_info()` reports what the caches hold, device bytes
included (a trace keeps its jaxpr's constants alive), and `clear_caches()`
empties them, as `jax.clear_caches()` does JAX's.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Optional

from . import chunks, executable
from .allocator import Margins
from .planner import PlannedRun
from .program import Equation, Program

# Traces kept per function and configuration (argument structures).
MAX_TRACES_PER_FUNCTION = 64
# Plans kept per traced structure (budgets, heuristics, owned arguments).
MAX_PLANS_PER_TRACE = 8


@dataclass
class Traced:
    """A traced, normalised value-and-grad, cached per argument structure, with its plans."""

    program: Program
    out_tree: Any
    unconstrained_peak: int
    trace_time_s: float
    plans: "OrderedDict[Hashable, PlannedRun]" = field(default_factory=OrderedDict, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    refining: set = field(default_factory=set, repr=False)  # keys a thread is refining the plan of
    aux: Any = None  # with has_aux: the aux value's structure and non-array leaves (`aux.Aux`)
    # With scans kept whole: the programs of the other scan strategies, and
    # the unrolled one (`scan_variants.ScanVariants`).
    variants: Any = None
    # With `shard_map`s whose bodies can be inlined: the program with them
    # inlined (`manual.py`), made when a plan needs it (`inlined`).
    make_inlined: Optional[Callable[[], Program]] = field(default=None, repr=False)
    # What its plans keep below each budget for the device's allocator (`allocator.py`).
    margins: Margins = field(default_factory=Margins, repr=False)
    arguments: Any = None  # the argument structure it was traced for (`arguments.Arguments`)
    _inlined: Optional[Program] = field(default=None, repr=False)

    def inlined(self) -> Optional[Program]:
        """The program with its `shard_map`s' bodies inlined, or None where it has none."""
        if self.make_inlined is None:
            return None
        if self._inlined is None:
            made = self.make_inlined()  # (normalising compiles: not under the lock)
            with self.lock:
                if self._inlined is None:
                    self._inlined = made
        return self._inlined

    def online_program(self) -> Program:
        """The program an online run interprets: scans unrolled (the paper's
        algorithm decides on every iteration's tensors)."""
        return self.program if self.variants is None else self.variants.program(None)

    def plan(self, key: Hashable, make: Callable[[], PlannedRun]) -> tuple[PlannedRun, bool]:
        """The cached plan for `key`, made if there is none; and whether it was cached."""
        with self.lock:
            found = self.plans.get(key)
            if found is not None:
                self.plans.move_to_end(key)
                return found, True
        return self.replan(key, make()), False

    def claim(self, key: Hashable) -> bool:
        """Whether this thread is the one to refine `key`'s plan (no other is)."""
        with self.lock:
            if key in self.refining:
                return False
            self.refining.add(key)
            return True

    def replan(self, key: Hashable, plan: PlannedRun) -> PlannedRun:
        """Caches `plan` for `key` (in place of any before it) and returns it."""
        with self.lock:
            self.refining.discard(key)
            self.plans[key] = plan
            self.plans.move_to_end(key)
            while len(self.plans) > MAX_PLANS_PER_TRACE:
                self.plans.popitem(last=False)
        return plan

    def measured(self, cost_of: Callable[[Any], Optional[float]]) -> bool:
        """Gives every equation of the program the cost `cost_of` says (a
        run's measurement), once, and only if it knows them all: from then on
        the program is planned like one with a deterministic cost model.
        Whether the costs are the program's now."""
        equations = list(self.program.body)
        costs = [cost_of(item) if isinstance(item, Equation) else None for item in equations]
        if any(cost is None for cost in costs):
            return False  # a cond (its branches' costs are unknown) or an operator that did not run
        with self.lock:
            if all(item.cost is None for item in equations):
                for item, cost in zip(equations, costs):
                    item.cost = cost
        return True

    @property
    def constant_bytes(self) -> int:
        """Device bytes of the jaxpr constants this trace keeps alive."""
        return sum(int(getattr(array, "nbytes", 0)) for _, array in self.program.consts)


class TraceCache:
    """Traces of one function and configuration by argument structure, least recently used first out."""

    def __init__(self, capacity: Optional[int] = None) -> None:
        self.capacity = MAX_TRACES_PER_FUNCTION if capacity is None else capacity  # (read when made: settable)
        self._traces: "OrderedDict[Hashable, Traced]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Optional[Traced]:
        with self._lock:
            found = self._traces.get(key)
            if found is not None:
                self._traces.move_to_end(key)
            return found

    def __setitem__(self, key: Hashable, traced: Traced) -> None:
        with self._lock:
            self._traces[key] = traced
            self._traces.move_to_end(key)
            while len(self._traces) > self.capacity:
                self._traces.popitem(last=False)

    def values(self) -> list[Traced]:
        with self._lock:
            return list(self._traces.values())

    def clear(self) -> None:
        with self._lock:
            self._traces.clear()

    def __len__(self) -> int:
        return len(self._traces)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._traces))


_TRACES: "weakref.WeakKeyDictionary[Callable, dict[Hashable, TraceCache]]" = weakref.WeakKeyDictionary()
_UNSHARED: "weakref.WeakSet[TraceCache]" = weakref.WeakSet()  # caches of wrappers that could not share
_LOCK = threading.Lock()


def trace_cache(fun: Callable, *config: Hashable) -> TraceCache:
    """The traces of `fun` under `config`, shared by every wrapper of the
    same function and configuration, so a new budget does not re-trace."""
    with _LOCK:
        try:
            per_fun = _TRACES.setdefault(fun, {})
            return per_fun.setdefault(config, TraceCache())
        except TypeError:  # not weak-referenceable, or an unhashable cost model: the wrapper keeps its own
            cache = TraceCache()
            _UNSHARED.add(cache)
            return cache


def _all_caches() -> list[TraceCache]:
    with _LOCK:
        shared = [cache for per_fun in list(_TRACES.values()) for cache in per_fun.values()]
        return shared + list(_UNSHARED)


@dataclass(frozen=True)
class CacheInfo:
    """What `jdtr.grad`'s caches hold (`jdtr.cache_info()`).

    Attributes:
      traces: traced argument structures, over all functions.
      plans: plans of those traces.
      compiled_chunks: compiled chunk programs (shared by all plans).
      constant_bytes: device bytes of jaxpr constants the traces keep alive.
      chunk_code_bytes: XLA's generated code of the compiled chunks, by its
        `memory_analysis()` (0 where it reports none).
      executables: the jitted executables of single equations (shared by
        all traces; `executable.MAX_EXECUTABLES` at most).
      whole_steps: plans' steps compiled as one program (`chunks="whole"`,
        or tried by "auto"; one per plan at most), and `whole_step_code_bytes`
        their generated code.
    """

    traces: int
    plans: int
    compiled_chunks: int
    constant_bytes: int
    chunk_code_bytes: int
    executables: int = 0
    whole_steps: int = 0
    whole_step_code_bytes: int = 0


def cache_info() -> CacheInfo:
    """What `jdtr.grad`'s trace, plan and chunk caches hold now."""
    traces = [traced for cache in _all_caches() for traced in cache.values()]
    count, code = chunks.chunk_cache_size()
    wholes = [plan.whole for t in traces for plan in list(t.plans.values()) if plan.whole]
    return CacheInfo(
        traces=len(traces),
        plans=sum(len(t.plans) for t in traces),
        compiled_chunks=count,
        constant_bytes=sum(t.constant_bytes for t in traces),
        chunk_code_bytes=code,
        executables=executable.executable_cache_size(),
        whole_steps=len(wholes),
        whole_step_code_bytes=sum(w.code_bytes for w in wholes),
    )


def clear_caches() -> None:
    """Empties `jdtr.grad`'s caches: traces, plans, compiled chunks and the
    executables of single equations. Later calls trace, plan and compile again."""
    for cache in _all_caches():
        cache.clear()
    chunks.clear_chunk_cache()
    executable.clear_executable_cache()
