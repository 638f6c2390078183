"""`jdtr.plan`, `jdtr.remat_grad` and `jdtr.remat_value_and_grad`: the compiled path's API."""

from __future__ import annotations

import functools
from typing import Callable, Hashable, Optional, Sequence, Union

import jax

from ..budget import BudgetLike, parse_budget
from ..runtime import Heuristic, get_heuristic
from .arguments import Static, argnums_tuple, concrete_leaves, flatten_arguments
from .batched import BatchedPlan, batched_call, under_vmap
from .checkpoint_plan import Plan
from .holomorphic import Holomorphic
from .int_inputs import IntInputs
from .planning import IMPLEMENTATIONS, make_plan


# -------------------------------------------------------------------- API


def plan(
    fun: Callable,
    *args,
    budget: BudgetLike,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    implementation: str = "auto",
    autotune: Optional[bool] = None,
    **kwargs,
) -> Plan:
    """A checkpoint plan for `fun`'s gradient at `budget`.

    Args:
      fun: the scalar function to differentiate.
      *args, **kwargs: example arguments (arrays or `jax.ShapeDtypeStruct`s).
      budget: bytes, a size string, or a fraction (or percentage, "50%") of
        the compiled step's memory without remat (XLA's arguments + outputs + temporaries).
      argnums, has_aux: as in `jax.grad`.
      heuristic: the DTR heuristic simulated.
      implementation: "checkpoint" (plain `jax.checkpoint` segments),
        "protected" (segments XLA's CSE cannot undo) or "auto" (protected
        on the CPU, where XLA strips checkpoint barriers).
      autotune: whether to choose among plans by timing them. By default
        (None) and with True, the plans DTR makes for 0.7, 0.5, 0.35 and
        0.25 of the budget are compiled too, every plan within the budget
        runs a few steps on example inputs during planning, and the fastest
        is kept (`plan.timings` lists them; within 2% of the fastest is a
        tie, won by the smaller plan). Where recomputation is cheap (XLA on
        the CPU) the fastest plan is often one that saves less than DTR's
        cost model prefers. This makes planning a few times slower (more
        compiles); False plans by the cost model alone. Without example
        inputs (PRNG key arguments) the cost model decides; True then warns.

    Raises:
      OutOfBudgetError: if no plan's compiled step fits the budget. Its
        `suggested_budget_bytes` (and message) are the smallest plan found's
        compiled bytes: planning the same function again at that budget
        finds that plan.

    Returns:
      A `Plan`: `plan.grad`, `plan.value_and_grad`, `plan.policy`,
      `plan.segments`, `plan.report()`.

    Example:
      >>> plan = jdtr.plan(loss, params, batch, budget=0.4)
      >>> grads = jax.jit(plan.grad)(params, batch)
    """
    return make_plan(fun, args, kwargs, budget, argnums, has_aux, heuristic, implementation, autotune)


class _RematGrad:
    """The callable `jdtr.remat_grad` returns: a plan per argument structure."""

    def __init__(self, fun, argnums, has_aux, budget, heuristic, implementation, autotune, value):
        parse_budget(budget)
        get_heuristic(heuristic)
        argnums_tuple(argnums)
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
        self.fun, self.argnums, self.has_aux = fun, argnums, has_aux
        self.budget, self.heuristic, self.implementation, self.value = budget, heuristic, implementation, value
        self.autotune = autotune
        # per argument structure a Plan; under `vmap`, per batch ("vmap", ...),
        # a `batched.BatchedPlan`, or None where `vmap(jax.grad)` fits
        self.plans: dict[Hashable, Optional[Union[Plan, BatchedPlan]]] = {}
        # per argument structure (and batch, under `vmap`), the step under jit, for eager calls
        self.steps: dict[Hashable, Callable] = {}
        functools.update_wrapper(self, fun)

    def plan_for(self, *args, **kwargs) -> Plan:
        return self._plan_and_key(args, kwargs)[0]

    def _plan_and_key(self, args, kwargs) -> tuple[Plan, Hashable]:
        _, arguments = flatten_arguments(self.argnums, args, kwargs, eager=False)
        key = arguments.key
        found = self.plans.get(key)
        if found is None:
            # The arguments themselves (tracers under jit): autotuning times
            # concrete ones in place instead of a copy beside them.
            found = make_plan(
                self.fun, args, kwargs, self.budget, self.argnums, self.has_aux, self.heuristic,
                self.implementation, self.autotune,
            )
            self.plans[key] = found
        # Arrays alone (no tracer, no static value a jit would trace) can run the compiled step.
        eager = concrete_leaves(arguments, args, kwargs) is not None and not any(
            isinstance(spec, Static) for spec in arguments.specs
        )
        return found, (key if eager else None)

    def __call__(self, *args, **kwargs):
        if under_vmap(args, kwargs):  # plan the batched step (`batched`), not one example's
            return batched_call(self, args, kwargs)
        plan, eager = self._plan_and_key(args, kwargs)
        step = plan.value_and_grad if self.value else plan.grad
        if eager is None:  # under a transformation: the caller's trace compiles it
            return step(*args, **kwargs)
        # Called on arrays: the step the plan measured, compiled (for the
        # arrays' placement), not run operation by operation, whose memory
        # and speed the plan says nothing about.
        jitted = self.steps.get(eager)
        if jitted is None:
            jitted = self.steps[eager] = jax.jit(step)
        return jitted(*args, **kwargs)


def remat_grad(
    fun: Callable,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    *,
    budget: BudgetLike,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    implementation: str = "auto",
    autotune: Optional[bool] = None,
    holomorphic: bool = False,
    allow_int: bool = False,
) -> Callable:
    """Like `jax.grad`, with DTR's decisions compiled in as checkpoint segments.

    Jittable and vmappable: the plan depends only on shapes, is made on the
    first call for each argument structure, and is cached. `budget` is
    bytes, a size string, or a fraction of the memory XLA needs for
    `jax.grad(fun)` (arguments + outputs + temporaries). `implementation`
    and `autotune` as in `jdtr.plan`; `holomorphic` and `allow_int` as in
    `jax.grad` (integer leaves of the differentiated arguments get `float0`
    zeros). The step is compiled, called on arrays too, so an aux value
    (`has_aux`) holds what a jitted function may return, as under
    `jax.jit(jax.grad)`: arrays and numbers, not strings (`jdtr.grad`
    returns any aux value, as `jax.grad` does).

    Example:
      >>> step_grad = jax.jit(jdtr.remat_grad(loss, budget="2GiB"))
    """
    return _remat(fun, argnums, has_aux, budget, heuristic, implementation, autotune, holomorphic, allow_int, value=False)


def remat_value_and_grad(
    fun: Callable,
    argnums: Union[int, Sequence[int]] = 0,
    has_aux: bool = False,
    *,
    budget: BudgetLike,
    heuristic: Union[str, Heuristic] = "dtr_eq",
    implementation: str = "auto",
    autotune: Optional[bool] = None,
    holomorphic: bool = False,
    allow_int: bool = False,
) -> Callable:
    """`jax.value_and_grad` with DTR's decisions compiled in; see `remat_grad`."""
    return _remat(fun, argnums, has_aux, budget, heuristic, implementation, autotune, holomorphic, allow_int, value=True)


def _remat(fun, argnums, has_aux, budget, heuristic, implementation, autotune, holomorphic, allow_int, value) -> Callable:
    def make(f, nums, aux=has_aux):
        return _RematGrad(f, nums, aux, budget, heuristic, implementation, autotune, value)

    if holomorphic:  # its real part, differentiated (`holomorphic.py`); integer inputs are refused there, as by JAX
        return Holomorphic(fun, argnums, has_aux, value, functools.partial(make, aux=True))
    # With `allow_int`, integer leaves leave the differentiated arguments (`int_inputs.py`).
    return IntInputs(fun, argnums, make(fun, argnums), make, value, has_aux) if allow_int else make(fun, argnums)
