"""The JAX side of jdtr: tracing, jaxpr normalisation, the eager interpreter, plan export.

Modules, by the path a call takes:

* `arguments`: a call's argument structure (the trace-cache key);
* `normalize`, `program`, `executable`, `costs`: a jaxpr made a `Program`
  of equations DTR can run, each a compiled executable with a cost;
* `interpreter`: runs a program on the runtime (device buffers, or none in
  simulation: online runs, and the planner's simulations);
* `planner`, `executor`, `chunks`: a run decided before it starts, run
  step by step or as compiled chunks;
* `gradients`: `jdtr.grad`, `jdtr.value_and_grad`, `jdtr.trace`;
* `segments`, `checkpoint`, `checkpoint_plan`, `compiled`, `autotune`,
  `planning`, `remat`: `jdtr.plan` and `jdtr.remat_grad`.

Every touch of JAX's internals goes through `_jax_core`.
"""

from .caches import CacheInfo as CacheInfo
from .caches import cache_info as cache_info
from .caches import clear_caches as clear_caches
from .costs import OpInfo as OpInfo
from .costs import RooflineCostModel as RooflineCostModel
from .gradients import grad as grad
from .gradients import value_and_grad as value_and_grad
from .normalize import normalize as normalize
from .checkpoint_plan import Plan as Plan
from .allocator import AllocatorWarning as AllocatorWarning
from .checkpoint_plan import PolicyWarning as PolicyWarning
from .plan_search import SlowPlanWarning as SlowPlanWarning
from .gradients import trace as trace
from .program import Program as Program
from .remat import plan as plan
from .remat import remat_grad as remat_grad
from .remat import remat_value_and_grad as remat_value_and_grad
from .save_policy import SavePolicy as SavePolicy
from .segments import Segment as Segment

__all__ = [
    "CacheInfo",
    "OpInfo",
    "Plan",
    "PolicyWarning",
    "AllocatorWarning",
    "Program",
    "RooflineCostModel",
    "SavePolicy",
    "Segment",
    "SlowPlanWarning",
    "cache_info",
    "clear_caches",
    "grad",
    "normalize",
    "plan",
    "remat_grad",
    "remat_value_and_grad",
    "trace",
    "value_and_grad",
]
