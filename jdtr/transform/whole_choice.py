"""Under `chunks="auto"`: a plan's compiled chunks, or its step as one program, chosen by timing both.

A plan's compiled chunks keep the budget by cutting the run where the plan's
count of a chunk would pass it; the step as one XLA program
(`whole_step.py`) keeps it by XLA's own analysis of a `jax.checkpoint`
plan. Neither is always faster. On 2 CPU cores (docs/benchmarks.md, "A
planned step as one XLA program"): one program ran a VAE at 0.7 of its peak
in 1.19x `jax.jit`'s step against 1.78x in 25 chunks, and a Flax GPT at 0.3
in 0.85x against 1.16x; the chunks ran a transformer at 0.7 in 0.73x against
0.91x, and a ResNet at 0.3 in 1.19x against 1.62x (its convolutions
recomputed in gated segments). On an accelerator a chunk costs the host a
launch and the device a gap, so one program should win more often; what
XLA's code for either does on a given device is known only by running it.

So a plan that runs in chunks, and could run as one program, times its
chunk runs (each waited on: the only runs not returned at dispatch) until
their seconds reach the price of making the program: `WHOLE_PRICE` times
what compiling its chunks took (the compiled path's search compiles a few
candidates of the step, each about a quarter of a chunk compile's time: a
4-block transformer's chunks compiled in 5.1 s, its `jax.jit` step in 1.2
s). That is the ski-rental rule again (`rental.py`): a structure called
rarely never pays for the program, and one that pays has run at least as
long as the program is expected to cost to make. Then the program is made.
The price is an estimate, and a search can take far longer (a ResNet's at
0.3 of its peak, which compiles and measures gated convolution segments,
took 48 s against a price of 12 s), so it compiles no candidate but its
first past `SEARCH_LIMIT` times the price. Not at the price itself: a VAE's
search found its program on a second attempt, at 2.0x the price of 2.0 s,
and the program ran its step at 1.2x `jax.jit`'s against 1.4-2.2x in chunks. Where
none fits the budget by then, the plan runs in chunks from then on. Otherwise the next runs alternate, one
program and chunks, `TRIAL_RUNS` of each after the program's first run (the
making's, and its first allocations), and the plan keeps the one of the
lower median. Runs after that are not waited on. (The program, made, stays
with the plan either way: a call with `chunks="whole"` runs by it.)

Calls from several threads share a plan's trial: one makes the program
(`WholeTrial.making`), the others run the chunks meanwhile, their
seconds not counted.

Only on one process: several processes must dispatch the same programs in
the same order, which times measured in each would not ensure. And only
where `chunks="whole"` may run a step as one program (`whole_step.eligible`,
`whole_step.may_be_whole`).
"""

from __future__ import annotations

import math
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import jax

from .whole_step import WholeStep, run_whole

CHUNKS, WHOLE, MAKE = "chunks", "whole", "make"
# The price of making the one program, in seconds of the plan's chunk
# compile (the module's docstring says why about 2).
WHOLE_PRICE = 2.0
# The making's search compiles no candidate past this many times the price.
SEARCH_LIMIT = 3.0
# Runs of each kind timed against each other, interleaved.
TRIAL_RUNS = 3


@dataclass
class WholeTrial:
    """A plan's choice between its chunks and its step as one program.

    Attributes:
      price_s: seconds of chunk runs to rent before making the program.
      rent_s: seconds of chunk runs so far, before it was made.
      made: whether the program was made (and fits).
      whole_s, chunks_s: the trial's runs of each, in seconds.
      chosen: CHUNKS or WHOLE once decided, else None.
      making: whether a call is making the program now (threads: one makes,
        the others run the chunks meanwhile).
    """

    price_s: float
    rent_s: float = 0.0
    made: bool = False
    whole_s: list[float] = field(default_factory=list)
    chunks_s: list[float] = field(default_factory=list)
    chosen: Optional[str] = None
    making: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def next_run(self, whole: Any) -> str:
        """How the plan's next run goes: CHUNKS, MAKE (make the program,
        then run it) or WHOLE. `whole`: the plan's program (`PlannedRun.whole`:
        None before it is made, False where none fits). MAKE is said once,
        to the call that makes it."""
        with self._lock:
            if self.chosen is None and whole is False:
                self.chosen = CHUNKS
            if self.chosen is not None:
                return self.chosen
            if whole is None:
                if self.making or self.rent_s < self.price_s:
                    return CHUNKS
                self.making = True
                return MAKE
            self.made = True  # (by this trial, or by a call with chunks="whole" on the same plan)
            return WHOLE if len(self.whole_s) <= len(self.chunks_s) else CHUNKS

    @property
    def timing(self) -> bool:
        """Whether runs are timed (waited on): while undecided."""
        return self.chosen is None

    def ran(self, how: str, seconds: float) -> None:
        """A run went `how` (CHUNKS, MAKE or WHOLE) in `seconds`."""
        with self._lock:
            if self.chosen is not None:
                return
            if how == MAKE:  # (its seconds are the making's, and a first run's)
                self.made = True
            elif not self.made:
                if not self.making:  # (chunk runs while another thread makes the program pay nothing)
                    self.rent_s += seconds
            else:
                (self.whole_s if how == WHOLE else self.chunks_s).append(seconds)
                if len(self.whole_s) >= TRIAL_RUNS and len(self.chunks_s) >= TRIAL_RUNS:
                    faster = statistics.median(self.whole_s) <= statistics.median(self.chunks_s)
                    self.chosen = WHOLE if faster else CHUNKS


def open_trial(plan: Any, may: bool) -> None:
    """Starts the trial of `plan` (a `planner.PlannedRun` whose chunks were
    compiled, in `plan.compile_s`) where `may`: its step may run as one
    program; else marks it as having none (False)."""
    price = WHOLE_PRICE * plan.compile_s
    plan.trial = WholeTrial(price) if may and math.isfinite(price) and jax.process_count() == 1 else False  # (inf: never)


def one_program(
    policy: str, plan: Any, make: Callable[[Optional[float]], Optional[WholeStep]], inputs: Sequence[Any],
    check: Optional[Callable[[], None]], wait: bool, planning_time_s: float, equations: int,
) -> Optional[tuple[list, dict[str, Any]]]:
    """Runs `plan` (a `planner.PlannedRun`) as one program, made by
    `make(within_s)` where it is not yet: always with `chunks="whole"`
    (`run_whole`, its search unlimited), and under "auto" where its trial
    says so (past `SEARCH_LIMIT` times the trial's price its search compiles
    no candidate but the first).
    Returns the outputs and the `Stats` fields, or None: run its chunks
    (timed while the trial is open, then told by `chunks_ran`). `wait`:
    whether the caller waits for the outputs anyway (`return_stats`)."""
    if policy == WHOLE:
        return run_whole(plan, lambda: make(None), inputs, check, wait, planning_time_s, equations)
    trial = plan.trial
    if not trial:
        return None
    how = trial.next_run(plan.whole)
    if how == CHUNKS:
        return None
    within_s = SEARCH_LIMIT * trial.price_s
    try:
        ran = run_whole(plan, lambda: make(within_s), inputs, check, wait or trial.timing, planning_time_s, equations)
    finally:
        if how == MAKE:  # (made, or none fits: `plan.whole` says which; or it raised: the next may try)
            trial.making = False
    if ran is None:  # none fits: chunks from now on
        trial.next_run(plan.whole)
        return None
    trial.ran(how, ran[1]["wall_time_s"])
    return ran


def chunks_ran(plan: Any, seconds: float) -> None:
    """A run of `plan`'s chunks took `seconds` (to its outputs, where timed)."""
    if plan.trial and plan.trial.timing:
        plan.trial.ran(CHUNKS, seconds)
