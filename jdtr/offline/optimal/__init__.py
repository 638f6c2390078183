"""`jdtr.optimal`: the least compute a trace needs under a budget, by Checkmate's MILP.

Modules: `graph` (the graph and the solvers' vocabulary), `model` (a MILP
for HiGHS), `milp` (Checkmate's), `relaxation` (the interval relaxation),
`stages` (decisions run as stage schedules; DTR runs read as such),
`refine` (the relaxation refined where it is wrong), `solve` (`optimal`).

Checkmate (Jain et al., "Checkmate: Breaking the memory wall with optimal
tensor rematerialization", MLSys 2020, §4) schedules a computation graph in
*stages*: stage t computes node t for the first time, and may recompute any
earlier nodes before it, each at most once and in graph order. Binary
variables say what each stage does:

  R[t, i] = 1   node i is computed in stage t (R[t, t] = 1: the frontier advances),
  S[t, i] = 1   node i's value is kept (checkpointed) from stage t-1 into stage t,

and continuous ones account for memory within a stage:

  FREE[t, i, k] = 1   i's memory is freed right after node k runs in stage t,
  U[t, k]             the memory in use while node k runs in stage t.

Constraints (t = stage, k = node, i in deps(k)):

  R[t, k] <= R[t, i] + S[t, i]                 an input is computed or kept
  S[t+1, i] <= S[t, i] + R[t, i]               only what was present can be kept
  FREE[t, i, k] <= R[t, k],  <= 1 - S[t+1, i],  <= 1 - R[t, j] for every later
                                               user j of i in the stage
  U[t, first] = constants + sum_i M_i S[t, i] + M_first R[t, first]
  U[t, next]  = U[t, k] - sum_i M_i FREE[t, i, k] + M_next R[t, next]
  U[t, k] <= budget
  S[T+1, o] = 1 for every output o             outputs are resident at the end

and the objective is the total compute, sum C_i R[t, i]. Cuts that exclude
only wasteful schedules help the solver: a stage recomputes or holds a value
only if it reads it or keeps it, and never recomputes a value it holds.
It is solved with HiGHS through `scipy.optimize.milp`.

Most of its rows and continuous variables are the memory within stages
(U, FREE), and they are what make HiGHS slow. So `milp.checkmate` leaves them
out at first, with one row per stage in their place (the moment its
frontier node runs), solves that relaxation, runs its solution as a stage
schedule, and adds the full memory rows of just the stages that overflow,
until the schedule fits: then it is Checkmate's optimum. The solutions
rarely overflow (a stage would have to recompute much at once), so one or
two solves usually do, each much faster than the full model.

Even so the MILP has on the order of n^2 binaries, beyond HiGHS for the
paper's logs (several hundred nodes). So `optimal` first solves a
relaxation with one binary per read of a value (`interval_bound`; seconds
even for those logs) and runs its decisions as a stage schedule: where the
schedule costs no more than the relaxation's bound, that proves it optimal
and the MILP is skipped. Else it refines that relaxation where the
schedule shows it wrong (Checkmate's own variables for those nodes only)
and tries again; then, on graphs of at most `MILP_MAX_BINARIES` binaries,
it solves the MILP in the time left. It reports the best schedule and the
best bound when the time limit comes first.

DTR's own runs at the budget are stage schedules too (`stages.StageRecorder`),
often the best known at tight budgets, where HiGHS's are poor: `optimal`
starts from the cheapest of them.

The graph is Checkmate's linear graph of the trace (`checkmate_graph`): one
node per storage a `CALL` creates, with its size and cost, and edges from the
storages its arguments live in. Constants (weights, inputs) are not nodes:
they are pinned, resident and counted in memory throughout. An operator's
workspace (XLA's temporaries, a log's `workspace<n>` results) counts while
it runs (`CheckmateGraph.transient`), as in the simulator.

Every limit but `time_limit` is on work (HiGHS's branch-and-bound nodes,
rounds of refinement), so that with `time_limit=None` a trace always gets
the same answer: `jdtr.grad`'s planner solves so (`OptimalResult.stages`,
written as a run by `jdtr.offline.stage_line`).
"""

from .graph import CheckmateGraph as CheckmateGraph
from .graph import checkmate_graph as checkmate_graph
from .milp import MILP_MAX_BINARIES as MILP_MAX_BINARIES
from .relaxation import INTERVAL_TIME_LIMIT as INTERVAL_TIME_LIMIT
from .relaxation import interval_bound as interval_bound
from .solve import METHODS as METHODS
from .solve import OptimalResult as OptimalResult
from .solve import optimal as optimal
from .stages import SEED_HEURISTICS as SEED_HEURISTICS

__all__ = [
    "CheckmateGraph",
    "INTERVAL_TIME_LIMIT",
    "METHODS",
    "MILP_MAX_BINARIES",
    "OptimalResult",
    "SEED_HEURISTICS",
    "checkmate_graph",
    "interval_bound",
    "optimal",
]
