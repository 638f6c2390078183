"""Running a program through checkpoint segments, on traced values.

XLA on the CPU removes `jax.checkpoint`'s optimisation barriers (its
`cse_barrier_expander` pass), after which CSE merges the recomputation back
into the forward pass and nothing is saved. Segments are therefore wrapped,
by default on the CPU, in a `custom_vjp` whose backward pass depends on a
predicate XLA cannot decide at compile time (from a cotangent's bits), in
one of these ways (the *gate*):

* "cond": the recomputation runs inside a `lax.cond` on it; CSE cannot
  reach into a conditional's branch. Under "cond" the whole pullback runs
  there; under "cond_recompute", where the segment recomputes a
  convolution, the recomputation alone does, the cond returning the
  residuals of its linearization, and the pullback reads them after it.
* "select": every recomputed operation reads a *taint*, a float zero the
  segment takes as an input, added to its smallest float operand (for a
  convolution, its kernel). The backward pass replaces the taint among the
  residuals by `where(predicate, taint, 1)`: still zero, but XLA cannot
  tell, so no recomputed operation has the same operands as its forward
  twin. A nested segment takes its parent's taint as its own, so that the
  parent's recomputation of it differs from the forward pass too.

XLA on the CPU runs a convolution's gradient inside a `lax.cond` about 20x
slower than outside one (issue 22: an 8-block ResNet took 31x
`jax.jit(jax.grad)`'s step under a cond; about 1.0x with the taint). The
taint costs a scalar add per operation, fused into it or into its operand's
producer. A segment that recomputes a convolution is gated by "select", any
other by "cond" (which cost nothing where no convolution suffers).

A forward convolution inside a cond runs at its speed; only the gradients
are slow there. Under "cond_recompute" they run outside the cond, after it,
reading what it returns, so nothing of the backward pass can run before the
segment's turn and CSE cannot merge what the cond computes: a 6-layer CNN
in 3 segments took 1.37x `jax.jit(jax.grad)`'s step in 0.51 of its bytes,
where the whole pullback in the cond took 32x in 0.54, and a 3-level U-Net
at 0.5 of its bytes 1.4x instead of 15-20x. The cond's outputs are copies,
the segment's inputs among them, and the segment keeps its inputs alone
(what its policy would save is recomputed in the cond with the rest): on
tiny nets, where XLA's fixed buffers are most of the step, it compiled up
to 1.8x larger than "cond". The planner measures each plan of its
search's path under it where the taint's gates are over, and under "cond"
only as its last resort (`plan_search.PlanSearch`).

Outside a cond, XLA may also move work of the backward pass into the
forward: the transposed copy of a segment's input that a convolution's
weight gradient reads (XLA's fast path on the CPU) was made right after the
forward convolution and held until the backward pass, a second copy of each
saved activation (a 6-layer CNN: 20.7 MiB where the cond-gated step took
12.6). The gate "inputs" selects every float residual by the predicate too,
so nothing that reads one can run before the backward pass reaches the
segment (14.6 MiB there). The gate "anchored" also ties the constants its
pullback makes to the predicate (`anchoring.py`: the zeros a gather's
pullback scatters into, which XLA otherwise made at the start of the step
and held through it). Which gate XLA compiles smaller varies with the
model, so the planner measures them in turn (`plan_search.PlanSearch`).

Nested segments gated by conds nest conds, and XLA assigns a conditional's
temporaries apart from its caller's, so a nest n deep can hold n levels of
them at once: a 16-layer tanh MLP nested to the left in one group compiled
to 26 MiB gated by conds, as much as `jax.grad`'s step, and to 13 MiB with
every segment tainted (the gate "taint"; `benchmarks/nest_gates.py`). On a
transformer's nests of DTR's plans, 2 or 3 deep, the conds compiled
smaller as often as not (2.5 against 2.8 MiB; 2.9 against 2.8), so those
stay gated by conds; the taint gates the left nestings the planner tries
where no plan fits (`plan_search.PlanSearch`), as deep as their groups.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from .anchoring import anchored, tie
from .program import Cond, Equation, Program, Value
from .save_policy import NAME_PREFIX, SavePolicy, named
from .segments import Segment, is_float
from .undecided import an_element, undecided


# Random bits: XLA makes them (on the CPU, a loop of hash rounds) as soon as
# their operands exist, and a key is an argument. Made of the key alone,
# every layer's dropout bits were made at the start of the step and held
# until their layer ran: a 12-layer MLP with dropout compiled to 54 MiB
# under `jax.grad`, 31 MiB with masks made from the activations instead, and
# no plan of it below 32 MiB at 0.5. So in a plan's forward pass they can
# be tied (`anchoring.tie`) to the value computed last before them
# (`Plan.tied`, which the search measures where a plan untied is over).
_RANDOM_BITS = frozenset({"random_bits", "threefry2x32", "rng_bit_generator"})


class _Anchor:
    """The float array computed last (program order) in a scope: what random
    bits made there are tied to, through a predicate read from one of its
    elements (always true; XLA cannot tell). With a taint (the "select"
    gate) the element reads it, so a segment's recomputation of the bits is
    not its forward twin, which CSE would merge and hold until the backward pass."""

    def __init__(self, constants: Iterable[Value] = ()):
        self.value: Any = None
        self.constants = set(constants)  # values of constants alone, which XLA folds: no anchors

    def see(self, values: Sequence[Value], arrays: Sequence[Any], reads: Optional[Sequence[Value]] = None) -> None:
        """`values` were made (by an equation reading `reads`)."""
        if reads is not None and all(v in self.constants for v in reads):
            self.constants.update(values)
            return
        for v, array in zip(values, arrays):
            if is_float(v) and v.shape:
                self.value = array

    def tie(self, item: Equation, args: list, taint: Any) -> list:
        if self.value is None or item.name not in _RANDOM_BITS:
            return args
        element = an_element([self.value]).astype(jnp.float32)
        if taint is not None:
            element = element + taint.astype(jnp.float32)
        return [tie(a, undecided(element)) for a in args]


def _run_items(
    items: Sequence, env: dict, names: Optional[set] = None, taint: Any = None, anchor: Optional[_Anchor] = None,
    carriers: Optional[set] = None, taps: Optional[set] = None,
) -> None:
    """Evaluates program items on traced values; names the outputs in `names`.

    With a `taint` (the "select" gate), an equation that reads no value the
    backward pass recomputes (only the segment's inputs and the values it
    saves, `names`) gets it added to its smallest float operand; the others
    read a recomputed value already, which differs from its forward twin.
    With an `anchor`, random bits are tied to the value made last before them.
    Values in `taps` (`aux_taps`) are fenced where they are made (`_fenced`)."""
    recomputed: set = set()
    for item in items:
        if isinstance(item, Equation):
            args = [env[v] for v in item.args]
            if carriers is not None and not any(isinstance(v, Value) and v in carriers for v in item.args):
                args = [lax.stop_gradient(a) if is_float(v) else a for v, a in zip(item.args, args)]  # `tangent_carriers`
            if taint is not None:
                if not any(v in recomputed for v in item.args):
                    _add_taint(args, taint)
                recomputed.update(v for v in item.outputs if names is None or v not in names)
            if anchor is not None:
                args = anchor.tie(item, args, taint)
            outs = item.trace(*args)
            if anchor is not None:
                anchor.see(item.outputs, outs, item.args)
            for v, out in zip(item.outputs, outs):
                if names is not None and v in names:
                    out = named(out, NAME_PREFIX + str(v.id))
                if taps is not None and v in taps:
                    out = _fenced(out)
                env[v] = out
        else:
            env_index = env[item.index]
            operands = [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in item.operands]
            branches = [functools.partial(_run_branch, b) for b in item.branches]
            outs = lax.switch(jnp.clip(env_index, 0, len(branches) - 1), branches, *operands)
            for v, out in zip(item.outputs, outs):
                env[v] = out
            if anchor is not None:
                anchor.see(item.outputs, outs)


def _add_taint(args: list, taint: Any) -> None:
    """Adds the taint to the smallest float operand, as data alone: through
    `stop_gradient`, so that it gives no operand a derivative it had not (a
    `while_loop` on `stop_gradient` of the weights, a spectral norm's power
    iteration, cannot be differentiated: tainted, it failed to trace)."""
    floats = [i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.inexact)]
    if floats:
        i = min(floats, key=lambda i: args[i].size)
        args[i] = args[i] + lax.stop_gradient(taint).astype(args[i].dtype)


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



# "auto": the taint ("select") for segments that recompute a convolution,
# else "cond"; "inputs": as "auto", every residual selected too ("select_all");
# "anchored": as "inputs", the pullback's constants tied to the predicate too
# ("select_anchored", `anchoring.py`); "cond": conds for every segment;
# "taint": the taint for every segment; "cond_recompute": conds for every
# segment, those that recompute a convolution running the recomputation
# alone in theirs (the pullback after it).
GATES = ("auto", "inputs", "anchored", "cond", "taint", "cond_recompute")
# The gates that run segments' recomputation in conds: a convolution's
# gradients after the cond, or in it (~20x slower on the CPU; on tiny nets
# smaller). The planner's path measures its plans under the first, its last
# resort under the second (`plan_search.PlanSearch`).
CONDS = ("cond_recompute", "cond")
_SELECTS = {"inputs": "select_all", "anchored": "select_anchored"}


def protects(implementation: str) -> bool:
    """Whether `implementation` runs protected segments on this backend."""
    return implementation == "protected" or (implementation == "auto" and jax.default_backend() == "cpu")


def gates_differ(program: Program, segments: Sequence[Segment], implementation: str) -> bool:
    """Whether the gates make different steps of these segments (they recompute a convolution)."""
    return protects(implementation) and any(_recomputes_a_convolution(program, seg) for seg in segments)


def makes_random_bits(program: Program) -> bool:
    """Whether the program's forward pass makes random bits (which a plan may tie)."""
    return any(isinstance(item, Equation) and item.name in _RANDOM_BITS for item in program.body)


def run_segments(
    program: Program, segments: Sequence[Segment], leaves: Sequence[Any], implementation: str, gate: str = "auto",
    tied: bool = False, differentiated: Optional[Sequence[bool]] = None,
):
    """Evaluates the forward program segment by segment, each in its own
    checkpoint (protected ones gated by `gate`, one of `GATES`); with
    `tied`, random bits tied to the value made before them (`_Anchor`).
    `differentiated` says, per input, whether it is differentiated (None:
    all may be; given, the first output alone is, the loss, as `jax.grad`
    with `has_aux` differentiates it)."""
    implementation = "protected" if protects(implementation) else "checkpoint"
    env = dict(zip(program.inputs, leaves))
    consts = dict(program.consts)
    env.update(consts)
    done = 0  # equations outside every segment run as they are (all of them in a plan without remat)
    anchor = _Anchor(consts) if tied else None
    carriers = tangent_carriers(program, differentiated)
    receivers = cotangent_receivers(program, differentiated)
    taps = aux_taps(program, differentiated, receivers) if implementation == "protected" else None
    for seg in segments:
        _run_items(program.body[done : seg.start], env, anchor=anchor)
        _run_segment(program, seg, env, consts, implementation, gate, tied=tied, carriers=carriers, receivers=receivers, taps=taps)
        if anchor is not None:
            anchor.see(seg.outputs, [env[v] for v in seg.outputs])
        done = seg.stop
    _run_items(program.body[done:], env, anchor=anchor)
    return [env[a] if isinstance(a, Value) else jnp.asarray(a.value) for a in program.outputs]


def tangent_carriers(program: Program, differentiated: Optional[Sequence[bool]]) -> set:
    """The values of `program` that may carry a derivative: those computed
    from a differentiated input other than through `stop_gradient`.

    A segment's inputs enter its checkpoint as arguments JAX differentiates
    (a protected segment's `custom_vjp` gives every float input a tangent),
    so a value whose derivative the program makes zero would lose that
    there: the `while_loop` of a spectral norm's power iteration, run on
    `stop_gradient` of the weights in one segment and read in the next,
    failed ("Reverse-mode differentiation does not work for
    lax.while_loop"), and a non-differentiated input read by one failed the
    same way. The others enter through `stop_gradient` (`_run_segment`)."""
    flags = [True] * len(program.inputs) if differentiated is None else differentiated
    carriers = {v for v, d in zip(program.inputs, flags) if d}
    for item in program.body:
        reads = item.operands if isinstance(item, Cond) else item.args
        if not (isinstance(item, Equation) and item.name == "stop_gradient"):
            if any(isinstance(a, Value) and a in carriers for a in reads):
                carriers.update(item.outputs)
    return carriers


def cotangent_receivers(program: Program, differentiated: Optional[Sequence[bool]]) -> set:
    """The values of `program` a cotangent may reach: the outputs
    differentiated (the loss alone where `differentiated` is given, as in
    `run_segments`; every output where it is None), and what the items
    making a receiver read, other than through `stop_gradient`.

    The dual of `tangent_carriers`. A segment's outputs leave its checkpoint
    as values JAX differentiates, so a value whose cotangent the program
    makes zero got one there: a spectral norm's power iteration in a
    `while_loop` on the weights themselves, `stop_gradient` taken of its
    result in the next segment, failed ("Reverse-mode differentiation does
    not work for lax.while_loop"), where `jax.grad` never transposes the
    loop. The others leave through `stop_gradient` (`_run_segment`)."""
    outputs = program.outputs[:1] if differentiated is not None else program.outputs
    receivers = {a for a in outputs if isinstance(a, Value)}
    for item in reversed(program.body):
        if isinstance(item, Equation) and item.name == "stop_gradient":
            continue
        if any(v in receivers for v in item.outputs):
            reads = item.operands if isinstance(item, Cond) else item.args
            receivers.update(a for a in reads if isinstance(a, Value))
    return receivers


def aux_taps(program: Program, differentiated: Optional[Sequence[bool]], receivers: Optional[set] = None) -> set:
    """The floats of `program` made for aux outputs alone, each from a
    value a cotangent reaches at least twice its size: a statistic of an
    activation (`x[0]`, a running mean) that nothing making the loss reads,
    not even through `stop_gradient` or a predicate (as a softmax's `max`
    is read). Protected segments fence them (`_fenced`). Empty where every
    output is differentiated (`differentiated` None: no aux). `receivers`:
    `cotangent_receivers`' answer, where the caller has it.

    The activation may reach the statistic through aux-only values as large
    as itself (`mean(stop_gradient(x))`: the `stop_gradient`, or a cast):
    those pass the activation's size on, and are not fenced themselves. A
    statistic's later updates (`0.9 * s + 0.1 * tap`) read only small
    values, and are not fenced either: one fence a tap."""
    if differentiated is None:
        return set()
    if receivers is None:
        receivers = cotangent_receivers(program, differentiated)
    feeding = {a for a in program.outputs[:1] if isinstance(a, Value)}  # what the loss is made from
    for item in reversed(program.body):
        if any(v in feeding for v in item.outputs):
            feeding.update(a for a in item.args if isinstance(a, Value))
    taps = set()
    passing: dict = {}  # aux-only floats as large as the activation they come from: its bytes
    for item in program.body:
        if isinstance(item, Equation):
            tapped = max(
                (a.nbytes if a in receivers else passing.get(a, 0) for a in item.args if isinstance(a, Value) and is_float(a)),
                default=0,
            )
            for v in item.outputs:
                if not is_float(v) or v in feeding or not tapped:
                    continue
                if 2 * v.nbytes <= tapped:
                    taps.add(v)
                else:
                    passing[v] = tapped
    return taps


def _run_segment(
    program: Program, seg: Segment, env: dict, consts: dict, implementation: str, gate: str, taint: Any = None,
    tied: bool = False, carriers: Optional[set] = None, receivers: Optional[set] = None, taps: Optional[set] = None,
) -> None:
    """Runs `seg` in its own checkpoint (its children nested inside); adds its outputs to `env`.

    Every input is an explicit argument: a nested segment's backward pass is
    traced after its parent's trace has ended, so it must not close over the
    parent's values (only over the program's constants). So is the taint of
    a segment gated by "select", which its children take from it. An input
    that carries no derivative (`tangent_carriers`) enters through
    `stop_gradient`, as JAX sees it outside the checkpoint, and an output
    no cotangent reaches (`cotangent_receivers`) leaves through it."""
    inputs = [v for v in seg.inputs if v not in consts]
    selected = implementation == "protected" and (
        taint is not None
        or gate == "taint"
        or (gate in ("auto", "inputs", "anchored") and _recomputes_a_convolution(program, seg))
    )
    select = _SELECTS.get(gate, "select")
    # The outputs no cotangent reaches: they leave through `stop_gradient`, so their cotangents are zero.
    unreached = [receivers is not None and is_float(v) and v not in receivers for v in seg.outputs]

    def body(*xs):
        own, xs = (xs[0], xs[1:]) if selected else (None, xs)
        local = {**consts, **dict(zip(inputs, xs))}
        if seg.children:
            for child in seg.children:
                _run_segment(program, child, local, consts, implementation, gate, own, tied, carriers, receivers, taps)
        else:
            anchor = None
            if tied:
                ordered = sorted(inputs, key=lambda v: v.id)  # values are numbered in program order
                anchor = _Anchor(consts)
                anchor.see(ordered, [local[v] for v in ordered])
            _run_items(program.body[seg.start : seg.stop], local, set(seg.saved), own, anchor, carriers, taps)
        return [lax.stop_gradient(local[v]) if zero else local[v] for v, zero in zip(seg.outputs, unreached)]

    args = [env[v] if carriers is None or v in carriers or not is_float(v) else lax.stop_gradient(env[v]) for v in inputs]
    floats = [is_float(v) for v in inputs]
    if selected:
        args, floats = [jnp.zeros((), jnp.float32) if taint is None else taint, *args], [True, *floats]
    if implementation == "protected":
        recomputing = gate == "cond_recompute" and _recomputes_a_convolution(program, seg)
        wrapped = _protected_checkpoint(body, seg.policy, floats, select if selected else gate if recomputing else "cond", unreached)
    else:
        wrapped = jax.checkpoint(body, policy=seg.policy, prevent_cse=True)
    outs = wrapped(*args)
    env.update(zip(seg.outputs, outs))


def _fenced(x: Any) -> Any:
    """`x` made where it is, as an array of its own: through a `lax.cond` on
    a predicate XLA cannot decide (`undecided`), which no fusion crosses.

    An aux value updated in every layer from its activation (a running
    mean, `x[0]`, a norm to log) is a chain XLA fuses into one loop at its
    end, which reads every layer's activation: each is then held through
    the forward pass whatever the segments (an 8-layer MLP with such a
    chain: no plan under `jax.grad`'s own bytes; fenced, 0.73 of them).
    Where the protected checkpoints run (the CPU), whose barriers XLA strips."""
    if x.size == 0:
        return x
    return lax.cond(undecided(an_element([x])), lambda v: v, jnp.zeros_like, x)


def _recomputes_a_convolution(program: Program, seg: Segment) -> bool:
    """Whether `seg` (its nested segments included) holds a convolution."""
    items = program.body[seg.start : seg.stop]
    return any(isinstance(item, Equation) and item.name == "conv_general_dilated" for item in items)


def _protected_checkpoint(
    fn: Callable, policy: SavePolicy, differentiable: Sequence[bool], gate: str = "cond", unreached: Sequence[bool] = ()
) -> Callable:
    """`jax.checkpoint(fn, policy)` whose backward recomputation XLA cannot merge away.

    The backward pass depends on a predicate XLA cannot decide at compile
    time (the bits of a cotangent element, or-ed with 1, are never zero),
    by `gate` (the module's docstring): "cond" runs the recomputation in a
    `lax.cond` on it, and the whole pullback with it; "cond_recompute" the
    recomputation alone, the pullback after the cond, reading the residuals
    it returns; "select" replaces the taint, `fn`'s first input, by a
    select on it; "select_all" every float residual too; "select_anchored"
    also the constants of the pullback (`anchoring.anchored`). `differentiable`
    marks the float inputs; the others (integers, keys) are carried as
    residuals and get no cotangent. `unreached` marks the outputs (of `fn`,
    a list) whose cotangent is zero, as `fn` returns them through
    `stop_gradient`: the predicate is never read from one of those. XLA
    folds a predicate read from zeros, the cond is gone, and CSE merges the
    recomputation back into the forward pass: a statistic of each layer's
    activation kept as aux, `mean(stop_gradient(x))`, had the smallest
    cotangent of every segment, and no plan came under `jax.grad`'s bytes.
    """
    checkpointed = jax.checkpoint(fn, policy=policy, prevent_cse=True)

    def merge(floats, others):
        floats, others = iter(floats), iter(others)
        return [next(floats) if d else next(others) for d in differentiable]

    @jax.custom_vjp
    def segment(*xs):
        return checkpointed(*xs)

    taint_at: list[Optional[int]] = [None]  # "select": where the taint is among the residuals

    def forward(*xs):
        floats = [x for x, d in zip(xs, differentiable) if d]
        others = [x for x, d in zip(xs, differentiable) if not d]
        if gate == "cond_recompute":  # the inputs alone are kept
            return fn(*xs), (floats, others)
        out, vjp_fn = jax.vjp(lambda *f: checkpointed(*merge(f, others)), *floats)
        if gate != "cond":  # the taint is the first input
            found = [i for i, r in enumerate(jax.tree_util.tree_leaves(vjp_fn)) if r is xs[0]]
            taint_at[0] = found[0] if len(found) == 1 else None
        return out, (vjp_fn, others)

    def backward(residuals, cotangents):
        vjp_fn, others = residuals  # (under "cond_recompute", the float inputs in place of the pullback)
        # (Empty ones hold no element to read; all empty, the cotangent is zero and so is the pullback.)
        # (The loss's own cotangent, 1.0, is a constant too: where it is the
        # smallest, the last segment's cond folds and XLA keeps that segment's
        # values, used at once by the backward pass. Reading every cotangent
        # instead raised a tied-embedding LM's floor from 0.805 to 0.913.)
        reached = [c for c, zero in zip(cotangents, unreached) if not zero] if unreached else cotangents
        leaves = [x for x in jax.tree_util.tree_leaves(reached) if jnp.issubdtype(x.dtype, jnp.inexact) and x.size]
        # (`f` through a lambda: `eval_shape` names the function it traces,
        # and the name of a pullback, which has no code of its own, is its
        # whole jaxpr printed: 3% of planning a 6-block transformer.)
        zeros = lambda f, g: jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(lambda c: f(c), g))  # noqa: E731
        if gate == "cond_recompute":
            floats = vjp_fn
            if not leaves:
                grads = [jnp.zeros_like(x) for x in floats]
            else:
                of_floats = lambda *f: fn(*merge(f, others))  # noqa: E731
                grads = _recomputed_in_cond(of_floats, floats, undecided(an_element(leaves)))(cotangents)
        elif not leaves:  # no float output with an element: nothing flows back
            grads = zeros(vjp_fn, cotangents)
        else:
            true = undecided(an_element(leaves))
            if gate != "cond":
                # `vjp_fn` is a pytree whose leaves are the residuals: the
                # taint among them becomes a zero XLA cannot see. (Were it not
                # found, every float residual is selected: copies, but safe.)
                residuals, tree = jax.tree_util.tree_flatten(vjp_fn)
                at = taint_at[0]
                everything = gate != "select" or at is None
                for i, r in enumerate(residuals):
                    if i == at or (everything and jnp.issubdtype(r.dtype, jnp.inexact)):
                        residuals[i] = jnp.where(true, r, jnp.ones_like(r) if i == at else jnp.zeros_like(r))
                pullback = lambda res, cts: jax.tree_util.tree_unflatten(tree, res)(cts)  # noqa: E731
                if gate == "select_anchored":
                    pullback = anchored(pullback, true)
                grads = pullback(residuals, cotangents)
            else:
                run = lambda f, g: f(g)  # noqa: E731
                grads = lax.cond(true, run, zeros, vjp_fn, cotangents)
        return tuple(merge(grads, [None] * (len(differentiable) - len(grads))))

    segment.defvjp(forward, backward)
    return segment


def _recomputed_in_cond(fn: Callable, primals: Sequence[Any], predicate: Any) -> Callable:
    """`fn`'s pullback at `primals`, its linearization (the recomputation)
    run inside a `lax.cond` on `predicate` (always true; XLA cannot tell),
    which returns the pullback's residuals: the pullback itself, and the
    convolutions' gradients in it, run outside the cond."""
    structure: list = []

    def linearized(*xs):
        _, pullback = jax.vjp(fn, *xs)
        residuals, tree = jax.tree_util.tree_flatten(pullback)
        structure[:] = [tree]
        return residuals

    shapes = jax.eval_shape(linearized, *primals)
    nothing = lambda *xs: [jnp.zeros(r.shape, r.dtype) for r in shapes]  # noqa: E731 - never taken
    residuals = lax.cond(predicate, linearized, nothing, *primals)
    return jax.tree_util.tree_unflatten(structure[0], residuals)
