"""Running a program through checkpoint segments, on traced values.

XLA on the CPU removes `jax.checkpoint`'s optimisation barriers (its
`cse_barrier_expander` pass), after which CSE merges the recomputation back
into the forward pass and nothing is saved. Segments are therefore wrapped,
by default on the CPU, in a `custom_vjp` whose backward runs the segment's
recomputation inside a `lax.cond` on a data-dependent predicate: CSE cannot
reach into a conditional's branch, so the plan survives any compiler flags.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from .program import Equation, Program, Value
from .segments import NAME_PREFIX, SavePolicy, Segment, is_float


def _run_items(items: Sequence, env: dict, names: Optional[set] = None) -> None:
    """Evaluates program items on traced values; names the outputs in `names`."""
    for item in items:
        if isinstance(item, Equation):
            outs = item.trace(*[env[v] for v in item.args])
            for v, out in zip(item.outputs, outs):
                if names is not None and v in names:
                    out = checkpoint_name(out, NAME_PREFIX + str(v.id))
                env[v] = out
        else:
            env_index = env[item.index]
            operands = [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in item.operands]
            branches = [functools.partial(_run_branch, b) for b in item.branches]
            outs = lax.switch(jnp.clip(env_index, 0, len(branches) - 1), branches, *operands)
            for v, out in zip(item.outputs, outs):
                env[v] = out


def _run_branch(branch: Program, *operands):
    env = dict(zip(branch.inputs, operands))
    for v, array in branch.consts:
        env[v] = array
    _run_items(branch.body, env)
    return [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in branch.outputs]


def named_forward(program: Program):
    """The forward function with every float value named, for the simulation."""
    named = {v for item in program.body for v in item.outputs if is_float(v)}

    def forward(*leaves):
        env = dict(zip(program.inputs, leaves))
        for v, array in program.consts:
            env[v] = array
        _run_items(program.body, env, named)
        return [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in program.outputs]

    return forward



def _protected_checkpoint(fn: Callable, policy: SavePolicy, differentiable: Sequence[bool]) -> Callable:
    """`jax.checkpoint(fn, policy)` whose backward recomputation XLA cannot merge away.

    The backward pass runs inside `lax.cond` on a predicate XLA cannot decide
    at compile time (the bits of a cotangent element, or-ed with 1, are never
    zero): CSE works within one computation and cannot reach into a branch.
    `differentiable` marks the float inputs; the others (integers, keys) are
    carried as residuals and get no cotangent.
    """
    checkpointed = jax.checkpoint(fn, policy=policy, prevent_cse=True)

    def merge(floats, others):
        floats, others = iter(floats), iter(others)
        return [next(floats) if d else next(others) for d in differentiable]

    @jax.custom_vjp
    def segment(*xs):
        return checkpointed(*xs)

    def forward(*xs):
        floats = [x for x, d in zip(xs, differentiable) if d]
        others = [x for x, d in zip(xs, differentiable) if not d]
        out, vjp_fn = jax.vjp(lambda *f: checkpointed(*merge(f, others)), *floats)
        return out, (vjp_fn, others)

    def backward(residuals, cotangents):
        vjp_fn, _ = residuals
        leaves = [x for x in jax.tree_util.tree_leaves(cotangents) if jnp.issubdtype(x.dtype, jnp.inexact)]
        zeros = lambda f, g: jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(f, g))  # noqa: E731
        if leaves:
            leaf = jnp.ravel(leaves[0])[0]
            bits = lax.bitcast_convert_type(leaf.astype(jnp.float32), jnp.int32)
            run = lambda f, g: f(g)  # noqa: E731
            grads = lax.cond((bits | 1) != 0, run, zeros, vjp_fn, cotangents)
        else:  # no float output: nothing flows back
            grads = zeros(vjp_fn, cotangents)
        return tuple(merge(grads, [None] * (len(differentiable) - len(grads))))

    segment.defvjp(forward, backward)
    return segment


def run_segments(program: Program, segments: Sequence[Segment], leaves: Sequence[Any], implementation: str):
    """Evaluates the forward program segment by segment, each in its own checkpoint."""
    if implementation == "auto":
        implementation = "protected" if jax.default_backend() == "cpu" else "checkpoint"
    env = dict(zip(program.inputs, leaves))
    consts = dict(program.consts)
    env.update(consts)
    done = 0  # equations outside every segment run as they are (all of them in a plan without remat)
    for seg in segments:
        _run_items(program.body[done : seg.start], env)
        _run_segment(program, seg, env, consts, implementation)
        done = seg.stop
    _run_items(program.body[done:], env)
    return [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in program.outputs]


def _run_segment(program: Program, seg: Segment, env: dict, consts: dict, implementation: str) -> None:
    """Runs `seg` in its own checkpoint (its children nested inside); adds its outputs to `env`.

    Every input is an explicit argument: a nested segment's backward pass is
    traced after its parent's trace has ended, so it must not close over the
    parent's values (only over the program's constants)."""
    inputs = [v for v in seg.inputs if v not in consts]

    def body(*xs):
        local = {**consts, **dict(zip(inputs, xs))}
        if seg.children:
            for child in seg.children:
                _run_segment(program, child, local, consts, implementation)
        else:
            _run_items(program.body[seg.start : seg.stop], local, set(seg.saved))
        return [local[v] for v in seg.outputs]

    if implementation == "protected":
        wrapped = _protected_checkpoint(body, seg.policy, [is_float(v) for v in inputs])
    else:
        wrapped = jax.checkpoint(body, policy=seg.policy, prevent_cse=True)
    outs = wrapped(*[env[v] for v in inputs])
    env.update(zip(seg.outputs, outs))
