"""The budget an out-of-budget error suggests: the least at which a candidate
fits, verified by simulating it.

`suggest_budget` bisects, between a budget that fails and the unconstrained
peak, for the least budget at which one of the heuristics tried fits within
an overhead. The answer is searched from the program's floor (no run fits
below it, `oplog.floor`) rather than from the budget that failed, so that it
is the program's, not the call's: another call on the same program at
another budget too small (a user trying budgets, each a `jdtr.grad` of its
own, or a search for the smallest) gets the same answer without simulating
again. Answers are kept by what the simulations read (`_requests`: the
lowered program's operators, sizes, costs and order, a digest of them) with
the candidates' names, dealloc policy and overhead: two traces of one
function lower to the same requests.

Whether a budget fits need not be monotonic in the budget (DTR's decisions
change with it), so an answer at or below the budget that failed is not
suggested: the bisection is then made above that budget (and that answer,
a function of the call's budget, is not kept).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Hashable, Optional, Protocol, Sequence, Union

from ..oplog import ComputeStep
from ..runtime import Heuristic

# The suggested budget is searched by bisection to within this fraction of
# the unconstrained peak.
SUGGESTION_TOLERANCE = 1 / 256
# Answers kept, least recently used first out (a key and an int each).
MAX_SUGGESTIONS = 1024


class Simulates(Protocol):
    """What the search needs of a program's simulation (`planner._Simulation`)."""

    lowered: Any  # `oplog.Program`: the requests every run replays
    dealloc: str
    workload: Any  # its `baseline`: the unconstrained run (peak bytes, cost)
    floor: Any  # `oplog.Floor`: no run fits under its `total_bytes`

    def __call__(self, budget_bytes: int, heuristic: Union[str, Heuristic], remat_limit: Optional[float] = None) -> tuple:
        ...


_SUGGESTED: "OrderedDict[Hashable, int]" = OrderedDict()
_LOCK = threading.Lock()


def suggest_budget(simulate: Simulates, heuristics: Sequence[Union[str, Heuristic]], failed: int, overhead: float) -> int:
    """The least budget (within `SUGGESTION_TOLERANCE` of the peak) above
    `failed` at which one of `heuristics` fits within `overhead` (compute over
    the step's): the program's least such budget where that is above
    `failed`, else the least found by bisection above `failed`."""
    key = _key(simulate, heuristics, overhead)
    with _LOCK:
        least = _SUGGESTED.get(key) if key is not None else None
        if least is not None:
            _SUGGESTED.move_to_end(key)
    if least is None:
        least = _bisect(simulate, heuristics, simulate.floor.total_bytes - 1, overhead)
        if key is not None:
            with _LOCK:
                _SUGGESTED[key] = least
                while len(_SUGGESTED) > MAX_SUGGESTIONS:
                    _SUGGESTED.popitem(last=False)
    return least if least > failed else _bisect(simulate, heuristics, failed, overhead)


def _key(simulate: Simulates, heuristics: Sequence[Union[str, Heuristic]], overhead: float) -> Optional[Hashable]:
    """What the answer depends on, or None where it cannot be kept: a
    caller's heuristic instance may hold state of its own."""
    if not all(isinstance(h, str) for h in heuristics):
        return None
    baseline = simulate.workload.baseline
    return _requests(simulate.lowered), tuple(heuristics), simulate.dealloc, overhead, baseline.peak_bytes, baseline.cost


def _requests(lowered: Any) -> bytes:
    """A digest of what a run of `lowered` asks of the runtime, and so of
    every decision a built-in heuristic takes on it: each step's values,
    sizes, costs and flags, not what runs the operators or where they come
    from (a new trace's payloads and sources are new objects)."""
    digest = hashlib.blake2b(digest_size=32)
    for step in lowered.steps:
        if type(step) is ComputeStep:
            fields = (step.inputs, step.outputs, step.sizes, step.aliases, step.cost, step.constant,
                      step.workspace, step.replayable, step.external)
        else:
            fields = (type(step).__name__, *vars(step).values())
        digest.update(repr(fields).encode())
    digest.update(repr((lowered.outputs, lowered.compute_cost, lowered.constant_bytes, lowered.largest_op_bytes,
                        lowered.future)).encode())
    return digest.digest()


def _bisect(simulate: Simulates, heuristics: Sequence[Union[str, Heuristic]], low: int, overhead: float) -> int:
    """The least budget found by bisection between `low` (taken not to fit)
    and the unconstrained peak at which a heuristic fits within `overhead`
    (a probe each, tried in turn until one fits)."""
    limit = simulate.workload.baseline.cost * (overhead - 1.0)
    order = list(heuristics)

    def fits(budget: int) -> bool:
        if budget < simulate.floor.total_bytes:
            return False  # no run fits: none is simulated (the bisection's probes are those it would make)
        for candidate in order:
            if simulate(budget, candidate, remat_limit=limit)[0].ok:
                # Tried first from now on: the one that fit a budget most often
                # fits the next, a little lower (the answer is the same in any order).
                order.remove(candidate)
                order.insert(0, candidate)
                return True
        return False

    peak = simulate.workload.baseline.peak_bytes
    high = max(peak, low + 1)
    while not fits(high):  # the unconstrained peak fits by construction; this guards literals it omits
        low, high = high, 2 * high
    step = max(int(peak * SUGGESTION_TOLERANCE), 1)
    while high - low > step:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high
