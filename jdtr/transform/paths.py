"""A planned run of a program with `cond`s on data: planned per path of branches.

Which branch a `cond` takes is known only once its predicate is on the
device, and a plan is made before the run. So a plan goes by a guess for
each `cond` it does not know, reads each predicate where its `cond` starts
(a `Read`: the run waits there for that one value), and goes on by the
same line while the branches read are the ones it went by. The guess: the
branch a `cond` on the same predicate took earlier in the run (a `cond`'s
transpose in the backward pass); else the branch the `cond` took when last
run; else that of the last `cond` read with as many branches (a model's
repeated blocks tend to branch alike); else, before any run, its largest
(the one a budget fraction is measured on).

Where a branch read is another, the run follows the plan of the path read
so far: made then, by the first plan's heuristic, and cached per path on it
(at most `MAX_PATHS`), so a path seen before costs nothing more. Up to that
read its steps are the first plan's, because the lowering tells the runtime
nothing before a `cond` that depends on the branch taken there or later
(`lowering.lower_by_path`; checked here), so the run goes on with the
arrays it has.

Each plan keeps the budget by itself, as any plan does; its chunks are
compiled once its step-by-step runs took as long as that is expected to
(`rental.py`; each part of a run is cut at every `Read`).
A path whose plan does not fit raises `OutOfBudgetError` at its branch,
before any of the path's work (and again at once when it comes back): what
the run made is freed, and the caller's arrays are untouched; `jdtr.grad`
then runs the call online.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

from ..offline import Compute, Free, Read
from ..runtime import OutOfBudgetError
from .executor import Execution, chunks_for, renting
from .planner import PlannedRun, plan_path
from .program import Program

# Plans of paths that parted from a first plan, kept per first plan, least
# recently used first out: a program whose branches vary (a model that
# branches on its data) does not grow the memory without end.
MAX_PATHS = 64
_LOCK = threading.Lock()


@dataclass
class PathRun:
    """How a run by paths went.

    Attributes:
      plan: the plan it ended by; its counters are the run's (its steps are
        the whole run: those of the plans before it, up to where it parted).
      planning_time_s: planning the paths not seen before, cutting and
        compiling chunks.
      compiled: whether every part of it ran as compiled chunks.
    """

    plan: PlannedRun
    planning_time_s: float
    compiled: bool


def run_by_paths(
    first: PlannedRun,
    program: Program,
    owned: Sequence[bool],
    dealloc: str,
    execution: Execution,
    chunks: str,
    budget_bytes: int,
) -> PathRun:
    """Runs `first` (a plan of a program with `cond`s) on `execution`,
    following the plan of the path read wherever a predicate parts from it."""
    plan, path, planning, compiled = first, (), 0.0, True
    start, read = 0, 0  # where the run goes on in the plan's steps or chunks; reads done
    how: dict[int, object] = {}  # per plan this run went by: its chunks, or None (step by step)
    while True:
        if id(plan) not in how:
            how[id(plan)], elapsed = chunks_for(plan, program, chunks, budget_bytes, device=execution.device)
            planning += elapsed
        items = how[id(plan)]
        compiled = compiled and items is not None
        if start < 0:  # another plan was followed: go on after its read number `read - 1`
            start = _after_read(items if items is not None else plan.line.steps, read)
        began = time.perf_counter()
        stop = execution.chunks(items, start) if items is not None else execution.steps(start)
        rents = items is None and renting(plan, chunks)  # (its seconds count towards compiling it: rental.py)
        if stop == (len(items) if items is not None else len(plan.line.steps)):
            if rents:
                plan.rent.paid(time.perf_counter() - began)
            return PathRun(plan, planning, compiled)
        step = items[stop] if items is not None else plan.line.steps[stop]
        went_by = plan.reads[read]
        taken = min(max(execution.read(step), 0), went_by.branches - 1)  # lax.switch clamps
        if rents:
            plan.rent.paid(time.perf_counter() - began)  # to the predicate read: the steps before it are done
        first.last_taken[went_by.cond] = first.last_taken[went_by.branches] = taken
        path += (taken,)
        read += 1
        if taken == went_by.branch:
            start = stop + 1
            continue
        try:
            plan, elapsed = _follow(first, plan, program, owned, dealloc, path, read)
            planning += elapsed
        except BaseException:
            execution.abandon()
            raise
        execution.follow(plan.line)
        start = -1


def _after_read(steps: Sequence, reads: int) -> int:
    """The index after the `reads`-th `Read` of a line's steps or chunks."""
    seen = 0
    for index, step in enumerate(steps):
        if type(step) is Read:
            seen += 1
            if seen == reads:
                return index + 1
    raise AssertionError(f"jdtr: a plan by paths has fewer than {reads} reads")


def _follow(
    first: PlannedRun, plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str, path: tuple, reads: int
) -> tuple[PlannedRun, float]:
    """The plan of `path` (cached on `first`), whose steps up to its read
    number `reads` are `plan`'s; and the time planning it took now."""
    with _LOCK:
        found = first.paths.get(path)
        if found is not None:
            first.paths.move_to_end(path)
        last = dict(first.last_taken)
    if isinstance(found, OutOfBudgetError):  # a path known not to fit
        raise found.with_traceback(None)
    if found is not None:
        return found, 0.0
    # A cond's branch when last run; one not run yet, the branch of the last
    # cond read with as many branches (a model's repeated blocks branch alike).
    guess = lambda cond: last.get(cond, last.get(len(cond.branches)))  # noqa: E731
    try:
        followed = plan_path(first, program, owned, dealloc, path, guess)
    except OutOfBudgetError as err:
        err.add_note(
            f"jdtr: the path of a `cond` on data with the branches {list(path)}, planned when its last predicate "
            "was read, does not fit: none of its work was done, and the caller's arrays are intact"
        )
        followed = err
    else:
        _check_same_before(plan.line.steps, followed.line.steps, reads)
    with _LOCK:
        first.paths[path] = followed
        while len(first.paths) > MAX_PATHS:
            first.paths.popitem(last=False)
    if isinstance(followed, OutOfBudgetError):
        raise followed
    return followed, followed.planning_time_s


def _check_same_before(ran: Sequence, follows: Sequence, reads: int) -> None:
    """Fails unless two lines' steps agree up to and including their read
    number `reads`: what the run did is what the plan it follows did."""
    end = _after_read(ran, reads)
    same = len(follows) >= end and all(_same(a, b) for a, b in zip(ran[:end], follows[:end]))
    if not same:
        raise AssertionError("jdtr: the plans of two paths differ before the paths part (a bug: please report it)")


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is Compute:
        return a.payload is b.payload and a.inputs == b.inputs and a.outputs == b.outputs
    assert type(a) in (Free, Read)
    return a.slot == b.slot
