"""From a jaxpr to the flat `Program` DTR runs.

- Calls (`jit`, `custom_jvp_call`, `custom_vjp_call`, `remat`, ...) are
  inlined: DTR must see the tensors inside them, and a user's `remat` is
  subsumed by DTR's own decisions. A forward program that JAX will
  differentiate again (the compiled path's, `keep_custom`) keeps each call
  with a custom derivative as one equation instead: inlined, its rule
  would be lost (a straight-through estimator's gradient, `jax.nn.relu`'s
  at 0), and bound as it is, JAX applies the rule.
- `scan` with a static trip count is unrolled into per-iteration equations.
  The stacked outputs (`ys`) stay a lazy list of per-iteration values, and a
  later scan that iterates over them reads the items directly, so a model
  whose layers sit in a scan gives DTR per-layer residuals instead of one
  stacked tensor. A stack is only built if something else reads it. For
  scan-aware plans (`keep_scans`), a scan stays one equation instead.
- `cond` stays structured: the runtime reads the predicate and runs only the
  branch taken.
- Dead equations without effects are dropped.
- Every other primitive (including `while`) is one opaque operator.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import _jax_core, manual, repeats
from .costs import MEASURED, XLA, CostModel, RooflineCostModel, count, nanoseconds, xla_count
from .devices import device_bytes, spread
from .executable import Executable, analysis, executable, placed_executable, primitive_executable
from .program import Atom, Cond, Const, Equation, Item, Program, Value, liveness

# Scans longer than this many unrolled equations run as one operator.
MAX_UNROLLED_EQUATIONS = 200_000
# The value of an equation made of constants alone is computed while
# normalising where an equation's rewrite needs it (`repeats.py`: a nearest
# resize's indices, made from an `iota`) and its outputs are at most this
# many bytes.
CONSTANT_BYTES = 64 * 1024
# With `keep_scans`, a scan of fewer iterations is still unrolled: DTR decides
# per iteration, and the program stays small.
MIN_KEPT_LENGTH = 4


@dataclass(eq=False)
class _Stack:
    """The stacked output of an unrolled scan, kept as its items."""

    items: list[Atom]
    value: Value  # the stacked value, if it has to be materialized
    materialized: bool = False


class _Normalizer:
    def __init__(
        self,
        cost_model: CostModel,
        keep_scans: bool = False,
        sharded: bool = False,
        hints: Optional[dict[int, Any]] = None,
        inline_manual: bool = False,
        keep_custom: bool = False,
        fixed: Optional[dict[int, Any]] = None,
    ):
        self.next_id = 0
        self.keep_custom = keep_custom  # calls with custom derivatives stay one equation
        self.inline_manual = inline_manual  # a `shard_map`'s body inlined (`manual.py`)
        self.cost_model = cost_model
        self.keep_scans = keep_scans
        # Values placed over a mesh: each equation's outputs as XLA shards them.
        self.sharded = sharded
        # A value made from unsharded values alone (a broadcast cotangent, an
        # iota) is made on one device, whole, where `jax.jit` of the step
        # would shard it like the values it meets. `floating` are those seen;
        # `found` the sharding each first met (by value id); `hints` what a
        # first pass found, which this one makes them with.
        self.hints = hints or {}
        # The program's outputs XLA's per-equation choice places otherwise
        # than `jax.jit` of the whole step does (by value id): made as it does.
        self.fixed = fixed or {}
        self.floating: set[Value] = set()
        self.found: dict[int, Any] = {}
        self.consts: dict[int, tuple[Value, Any]] = {}
        self.names: dict[str, Any] = {}
        self.unrolled = 0
        # For `constant_of`: the equation that made each value, the arrays of
        # the jaxpr's constants, and the values computed so far.
        self.made_by: dict[Value, Equation] = {}
        self.known: dict[Value, Any] = {}

    # ------------------------------------------------------------- values

    def new_value(self, aval: Any, sharding: Any = None) -> Value:
        """A value of `aval`; with a `sharding` over several devices, of its
        bytes on one device."""
        shape, dtype = tuple(aval.shape), aval.dtype
        if sharding is None:
            nbytes = _jax_core.aval_nbytes(aval)
        else:
            nbytes = device_bytes(jax.ShapeDtypeStruct(shape, dtype, sharding=sharding))
        self.next_id += 1
        return Value(self.next_id - 1, shape, dtype, bool(getattr(aval, "weak_type", False)), nbytes, sharding)

    def const_value(self, array: Any) -> Value:
        """A jaxpr constant: pinned for the whole run, shared by all its uses."""
        found = self.consts.get(id(array))
        if found is None:
            aval = _jax_core.aval_of(array)
            sharding = spread(getattr(array, "sharding", None)) if self.sharded else None
            found = (self.new_value(aval, sharding), array)
            self.consts[id(array)] = found
            self.known[found[0]] = array
        return found[0]

    # ------------------------------------------------------------- equations

    def emit(
        self,
        body: list[Item],
        name: str,
        inputs: Sequence[Atom],
        out_avals: Sequence[Any],
        exe: Executable,
        params: Optional[dict] = None,
        effects: bool = False,
        source: Optional[str] = None,
        scan: Optional[_jax_core.ScanLayout] = None,
        counted: Optional[tuple[Sequence[Any], Sequence[Any], int]] = None,
        placed: Optional[Sequence[Any]] = None,
    ) -> list[Value]:
        """Appends one equation; `counted` (its inputs' and outputs' types
        and a factor) says what the cost model counts in place of its values'
        (an equation of a `shard_map`'s body: one device's blocks, times the
        devices), and `placed` its outputs' shardings, where the equation
        fixes them (a `shard_map`'s out_specs)."""
        args = [a for a in inputs if isinstance(a, Value)]
        if placed is not None:
            shardings = [spread(p) for p in placed]
        else:
            if self.sharded:
                exe = self.place(exe, args, len(out_avals))
            shardings = self.out_shardings(exe, args, len(out_avals))
        outputs = tuple(self.new_value(a, s) for a, s in zip(out_avals, shardings))
        if self.sharded and placed is None and not any(a.sharding is not None for a in args):
            self.floating.update(outputs)
        if scan is not None:
            cost = self.scan_cost(scan)
        elif counted is not None and self.cost_model not in (MEASURED, XLA):
            cost = self.cost(exe, name, params or {}, counted[0], counted[1], [v.nbytes for v in (*args, *outputs)], counted[2])
        else:
            cost = self.cost(exe, name, params or {}, args, outputs)
        equation = Equation(name, tuple(inputs), outputs, exe.fn, cost, effects, source, exe.trace, exe, scan=scan)
        body.append(equation)
        if not effects and scan is None:
            self.made_by.update((v, equation) for v in outputs)
        return list(outputs)

    def place(self, exe: Executable, args: Sequence[Value], n: int) -> Executable:
        """Notes the sharding each floating argument meets (a sharded
        argument of its shape); an equation whose outputs a first pass found
        floating makes them sharded as they are met."""
        for a in args:
            if a in self.floating and a.id not in self.found:
                met = next((b.sharding for b in args if b.sharding is not None and b.shape == a.shape), None)
                if met is not None:
                    self.found[a.id] = met
        floating = not any(a.sharding is not None for a in args)
        ids = range(self.next_id, self.next_id + n)
        wanted = tuple(self.fixed.get(i, self.hints.get(i) if floating else None) for i in ids)
        if any(w is not None for w in wanted):
            return placed_executable(exe, wanted)
        return exe

    def out_shardings(self, exe: Executable, args: Sequence[Value], n: int) -> Sequence[Any]:
        """Where an equation's outputs are sharded: XLA's choice for its
        inputs' shardings, read from the compilation its first run makes
        (`executable.analysis`; JAX's sharding propagation decides it, so
        jdtr reads it rather than predicts it). Where XLA cannot say, the
        outputs count whole on every device: an upper bound."""
        if not self.sharded or not (exe.placed or any(a.sharding is not None for a in args)):
            return [None] * n
        placed = analysis(exe, args).out_shardings
        if placed is None or len(placed) != n:
            return [None] * n
        return [spread(s) for s in placed]

    def scan_cost(self, layout: _jax_core.ScanLayout) -> Optional[float]:
        """A kept scan's cost: its body's, once per iteration."""
        if self.cost_model == MEASURED:
            return None
        body = normalize(layout.body, self.cost_model, keep_scans=True, keep_custom=self.keep_custom)
        return float(layout.length) * max(body.simulated_cost(), 1.0)

    def cost(self, exe: Executable, name: str, params: dict, args: Sequence[Any], outputs: Sequence[Any], nbytes=None, times: int = 1):
        if self.cost_model == MEASURED:
            return None  # timed by the backend on first run
        nbytes = [v.nbytes for v in (*args, *outputs)] if nbytes is None else nbytes
        if self.cost_model == XLA:
            if exe.info is None:
                exe.info = xla_count(exe.jitted, name, args, outputs, nbytes)
            return nanoseconds(RooflineCostModel()(exe.info))
        if self.cost_model is None and exe.cost is not None:
            return exe.cost  # a fresh structure of known equations (a new tree of known cells) counts nothing
        info = count(name, params, args, outputs, nbytes)
        if times != 1:
            info = dataclasses.replace(info, flops=info.flops * times, transcendentals=info.transcendentals * times)
        model = self.cost_model if self.cost_model is not None else RooflineCostModel()
        cost = nanoseconds(float(model(info)))
        if self.cost_model is None:
            exe.cost = cost
        return cost

    def emit_fn(self, body: list[Item], name: str, key: tuple, fn: Callable, inputs: Sequence[Value], out_aval: Any) -> Value:
        """A synthetic single-output equation (stacking, indexing)."""
        exe = executable(key, lambda: fn, multiple_results=False)
        return self.emit(body, name, inputs, [out_aval], exe)[0]

    # --------------------------------------------------------------- reading

    def read(self, body: list[Item], env: dict, atom: Any) -> Atom:
        """The value of a jaxpr atom, building a lazy stack if it is one."""
        if _jax_core.is_literal(atom):
            return _literal(atom)
        found = env[atom]
        if isinstance(found, _Stack):
            return self.materialize(body, found)
        return found

    def materialize(self, body: list[Item], stack: _Stack) -> Value:
        if not stack.materialized:
            # (an item may be a stack itself: the rows of a nested scan's gradient, unrolled)
            items = [self.materialize(body, a) if isinstance(a, _Stack) else self.materialize_atom(body, a) for a in stack.items]
            n, aval = len(items), stack.value
            key = ("jdtr.stack", n, aval.shape, str(aval.dtype))
            made = self.emit_fn(body, "stack", key, lambda *xs: jnp.stack(xs), items, jax.ShapeDtypeStruct(aval.shape, aval.dtype))
            stack.value, stack.materialized = made, True
        return stack.value

    def held_value(self, body: list[Item], atom: Any) -> Any:
        """An atom the runtime holds as a value of its own (an output of the
        program or of a branch, an operand of a run-time cond): a lazy stack
        is stacked, and a literal becomes a `constant` equation, so that its
        bytes are allocated, counted in the peak and freed like any other
        value's (the interpreter would otherwise make it a pinned constant
        that the unconstrained peak omits and eager deallocation never frees)."""
        if isinstance(atom, _Stack):
            return self.materialize(body, atom)
        if isinstance(atom, Const):
            return self.materialize_atom(body, atom)
        return atom

    def materialize_atom(self, body: list[Item], atom: Atom) -> Value:
        if isinstance(atom, Value):
            return atom
        array = np.asarray(atom.value)
        key = ("jdtr.const", array.dtype.str, array.shape, array.tobytes())
        return self.emit_fn(body, "constant", key, lambda: jnp.asarray(array), [], jax.ShapeDtypeStruct(array.shape, array.dtype))

    # ---------------------------------------------------------------- inline

    def inline(self, body: list[Item], jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """Appends the equations of `jaxpr` applied to `args`; returns its outputs
        (values, constants or lazy stacks)."""
        env: dict = {}
        for var, c in zip(jaxpr.constvars, consts):
            env[var] = self.const_value(c) if isinstance(c, jax.Array) else Const(c)
        for var, a in zip(jaxpr.invars, args):
            env[var] = a
        for eqn in jaxpr.eqns:
            self.equation(body, env, eqn)
        return [Const(v.val) if _jax_core.is_literal(v) else env[v] for v in jaxpr.outvars]

    def equation(self, body: list[Item], env: dict, eqn: Any) -> None:
        name = eqn.primitive.name
        call = None if self.keep_custom and name in _jax_core.CUSTOM_DERIVATIVES else _jax_core.call_body(eqn)
        if call is not None:
            inner, consts = call
            outs = self.inline(body, inner, consts, [self.lazy(env, a) for a in eqn.invars])
        elif name == "scan" and self.keeps(eqn):
            inputs = [self.read(body, env, a) for a in eqn.invars]
            exe = primitive_executable(eqn, inputs)
            outs = self.emit(
                body, name, inputs, [v.aval for v in eqn.outvars], exe, params=eqn.params,
                effects=_jax_core.has_effects(eqn), source=_jax_core.source_line(eqn), scan=_jax_core.scan_layout(eqn.params),
            )
        elif name == "scan" and self.can_unroll(eqn):
            outs = self.unroll_scan(body, env, eqn)
        elif name == "cond":
            outs = self.cond(body, env, eqn)
        elif self.sharded and self.inline_manual and manual.inlinable(eqn):
            outs = self.inline_shard_map(body, env, eqn)
        elif name == "name":  # `checkpoint_name`: an identity DTR sees through
            outs = [self.lazy(env, eqn.invars[0])]
            self.names[eqn.params["name"]] = outs[0]
        else:
            inputs = self.with_constant_operand(eqn, [self.read(body, env, a) for a in eqn.invars])
            exe = primitive_executable(eqn, inputs)
            outs = self.emit(
                body,
                name,
                inputs,
                [v.aval for v in eqn.outvars],
                exe,
                params=eqn.params,
                effects=_jax_core.has_effects(eqn),
                source=_jax_core.source_line(eqn),
            )
        for var, out in zip(eqn.outvars, outs):
            env[var] = out

    def with_constant_operand(self, eqn: Any, inputs: list[Atom]) -> list[Atom]:
        """`inputs`, with the operand a rewrite of `eqn` needs as a constant
        (`repeats.CONSTANT_OPERAND`) made one, where it is made of constants
        alone and the rewrite takes it: the equations that computed it are
        then dead, and go."""
        k = repeats.CONSTANT_OPERAND.get(eqn.primitive.name)
        if k is None or k >= len(inputs) or not isinstance(inputs[k], Value):
            return inputs
        value = self.constant_of(inputs[k])
        if value is None:
            return inputs
        consts = [a.value if isinstance(a, Const) else None for a in inputs]
        consts[k] = value
        if repeats.substitute(eqn.primitive, eqn.params, [tuple(v.aval.shape) for v in eqn.invars], consts) is None:
            return inputs
        return [*inputs[:k], Const(value), *inputs[k + 1 :]]

    def constant_of(self, value: Value, depth: int = 0) -> Optional[np.ndarray]:
        """`value` as a host array, where it is made of literals and the
        jaxpr's constants alone, by equations without effects whose outputs
        take at most `CONSTANT_BYTES`; else None. Computed (each equation
        run once, on the device) only when asked."""
        if value in self.known:
            array = self.known[value]
            return np.asarray(array) if value.nbytes <= CONSTANT_BYTES else None
        made = self.made_by.get(value)
        if made is None or depth > 64 or sum(v.nbytes for v in made.outputs) > CONSTANT_BYTES:
            return None
        args = []
        for a in made.args:
            found = self.constant_of(a, depth + 1)
            if found is None:
                return None
            args.append(found)
        try:
            outs = [np.asarray(out) for out in made.fn(*args)]
        except Exception:  # noqa: BLE001 - a value with no host form (a PRNG key): not a constant to rewrite with
            return None
        self.known.update(zip(made.outputs, outs))
        return self.known[value]

    def lazy(self, env: dict, atom: Any) -> Any:
        """Like `read`, but a lazy stack stays lazy (for inlined calls)."""
        if _jax_core.is_literal(atom):
            return _literal(atom)
        return env[atom]

    # ------------------------------------------------------------------ scan

    def keeps(self, eqn: Any) -> bool:
        """Whether a scan stays one equation (`keep_scans`, for scan-aware plans)."""
        return self.keep_scans and keepable_scan(eqn)

    def can_unroll(self, eqn: Any) -> bool:
        layout = _jax_core.scan_layout(eqn.params)
        if layout is None:
            return False  # a scan of another JAX version's making: run it as one operator
        size = layout.length * max(len(layout.body.jaxpr.eqns), 1)
        if self.unrolled + size > MAX_UNROLLED_EQUATIONS:
            return False
        self.unrolled += size
        return True

    def unroll_scan(self, body: list[Item], env: dict, eqn: Any) -> list[Any]:
        layout = _jax_core.scan_layout(eqn.params)
        inner, consts = _jax_core.open_jaxpr(layout.body)
        length, num_consts, num_carry = layout.length, layout.num_consts, layout.num_carry
        args = [self.lazy(env, a) for a in eqn.invars]
        scan_consts = args[:num_consts]
        carry = args[num_consts : num_consts + num_carry]
        xs = args[num_consts + num_carry :]
        x_vars = eqn.invars[num_consts + num_carry :]
        ys_avals = [v.aval for v in eqn.outvars[num_carry:]]
        ys_items: list[list[Any]] = [[None] * length for _ in ys_avals]
        order = range(length - 1, -1, -1) if layout.reverse else range(length)
        for i in order:
            x_i = [self.item(body, x, var, i) for x, var in zip(xs, x_vars)]
            outs = self.inline(body, inner, consts, [*scan_consts, *carry, *x_i])
            carry = outs[:num_carry]
            for k, y in enumerate(outs[num_carry:]):
                ys_items[k][i] = y
        ys = []
        for items, aval in zip(ys_items, ys_avals):
            if length == 0:
                ys.append(self.materialize_atom(body, Const(np.zeros(aval.shape, aval.dtype))))
            else:
                ys.append(_Stack(items, self.new_value(aval)))
        return [*carry, *ys]

    def item(self, body: list[Item], x: Any, var: Any, i: int) -> Atom:
        """Row i of a scanned-over input: the item itself when it is a lazy stack."""
        if isinstance(x, _Stack):
            return x.items[i]
        if isinstance(x, Const):
            return Const(np.asarray(x.value)[i])
        aval = var.aval
        key = ("jdtr.index", i, tuple(aval.shape), str(aval.dtype))
        item_aval = jax.ShapeDtypeStruct(tuple(aval.shape[1:]), aval.dtype, weak_type=getattr(aval, "weak_type", False))
        return self.emit_fn(body, "index", key, lambda a: a[i], [x], item_aval)

    def inline_shard_map(self, body: list[Item], env: dict, eqn: Any) -> list[Value]:
        """A `shard_map`'s body, each equation over the mesh on its own (`manual.py`)."""
        params = eqn.params
        layout = manual.Layout(params["mesh"])
        inner = params["jaxpr"]
        devices = math.prod(layout.mesh.shape.values())
        local: dict = {}
        for var, atom, spec in zip(inner.invars, eqn.invars, params["in_specs"]):
            outer = self.materialize_atom(body, self.read(body, env, atom))
            (local[var],) = self.emit(
                body, "shard_map_enter", [outer], [layout.global_aval(var.aval)], layout.enter(spec, var.aval),
                placed=[layout.sharding(var.aval)],
            )
        for e in inner.eqns:
            inputs = [_literal(a) if _jax_core.is_literal(a) else local[a] for a in e.invars]
            counted = ([v.aval for v in e.invars], [v.aval for v in e.outvars], devices)
            outs = self.emit(
                body, e.primitive.name, inputs, [layout.global_aval(v.aval) for v in e.outvars], layout.equation(e, inputs),
                params=e.params, effects=_jax_core.has_side_effects(e), source=_jax_core.source_line(e), counted=counted,
                placed=[layout.sharding(v.aval) for v in e.outvars],
            )
            local.update(zip(e.outvars, outs))
        results = []
        for var, spec, out in zip(inner.outvars, params["out_specs"], eqn.outvars):
            placed = [jax.sharding.NamedSharding(layout.mesh, spec)]
            (made,) = self.emit(body, "shard_map_leave", [local[var]], [out.aval], layout.leave(var.aval, spec), placed=placed)
            results.append(made)
        return results

    # ------------------------------------------------------------------ cond

    def cond(self, body: list[Item], env: dict, eqn: Any) -> list[Value]:
        index = self.read(body, env, eqn.invars[0])
        operands = [self.read(body, env, a) for a in eqn.invars[1:]]
        if isinstance(index, Value):
            # An index made of constants alone is known now: above all `platform_index`
            # (`lax.platform_dependent`, in `jnp.linalg`'s gradients), which would
            # otherwise be read on the host in the middle of every run, a chunk's end.
            known = self.constant_of(index)
            index = index if known is None else Const(known)
        if isinstance(index, Const):  # a literal predicate: inline the branch taken
            branch = eqn.params["branches"][int(np.clip(int(index.value), 0, len(eqn.params["branches"]) - 1))]
            inner, consts = _jax_core.open_jaxpr(branch)
            return self.inline(body, inner, consts, operands)
        operands = [self.held_value(body, a) for a in operands]
        branches = []
        for branch in eqn.params["branches"]:
            inner, consts = _jax_core.open_jaxpr(branch)
            inputs = tuple(self.new_value(v.aval, getattr(a, "sharding", None)) for v, a in zip(inner.invars, operands))
            branch_body: list[Item] = []
            outs = self.inline(branch_body, inner, consts, inputs)
            outs = [self.held_value(branch_body, o) for o in outs]
            branches.append(Program(inputs, (), dead_code_elimination(branch_body, outs), tuple(outs)))
        outputs = tuple(self.new_value(v.aval, _widest(b.outputs[k] for b in branches)) for k, v in enumerate(eqn.outvars))
        body.append(Cond(index, tuple(branches), tuple(operands), outputs, _jax_core.source_line(eqn)))
        return list(outputs)


def dead_code_elimination(body: list[Item], outputs: Sequence[Atom]) -> list[Item]:
    """Drops items without effects whose outputs nothing reads."""
    needed = {a for a in outputs if isinstance(a, Value)}
    kept: list[Item] = []
    for item in reversed(body):
        effectful = item.effects
        if effectful or any(v in needed for v in item.outputs):
            kept.append(item)
            needed.update(item.args)
    kept.reverse()
    return kept


def keepable_scan(eqn: Any) -> bool:
    """Whether a `scan` equation can stay one equation of a program: one of
    `MIN_KEPT_LENGTH` iterations or more, without effects (whose iterations
    are never replayed), of a JAX whose parameters `scans.run_scan` reads."""
    layout = _jax_core.scan_layout(eqn.params)
    return layout is not None and layout.length >= MIN_KEPT_LENGTH and not _jax_core.has_effects(eqn)


def normalize(
    closed_jaxpr: Any,
    cost_model: CostModel = None,
    keep_scans: bool = False,
    shardings: Optional[Sequence[Any]] = None,
    inline_manual: bool = False,
    keep_custom: bool = False,
    out_shardings: Optional[Sequence[Any]] = None,
) -> Program:
    """The `Program` of a closed jaxpr: inputs are its invars, in order.

    With `keep_scans`, a scan of at least `MIN_KEPT_LENGTH` iterations stays
    one equation (its `scan` field holds its parameters; `scans.py`). With
    `shardings` (per input; None for one on a single device), the program
    runs over their mesh: every value has the sharding XLA gives it and its
    bytes on one device (`Value.nbytes`), so budgets and peaks are per device;
    `inline_manual` inlines there the bodies of `shard_map`s (`manual.py`).
    With `keep_custom`, a call with a custom derivative stays one equation.
    `out_shardings` (per output, of a sharded program) are where `jax.jit`
    of the whole step places its outputs: an output made otherwise is made
    there (the gradients come back as `jax.jit(jax.grad)` gives them)."""
    placed = [spread(s) for s in shardings] if shardings is not None else []
    sharded = any(s is not None for s in placed)
    options = (keep_scans, placed, sharded)
    program, n = _normalized(closed_jaxpr, cost_model, *options, None, inline_manual, keep_custom)
    fixed = _misplaced_outputs(program, out_shardings) if sharded and out_shardings is not None else {}
    if n.found or fixed:  # made again, its floating values and misplaced outputs placed (ids are the same)
        program, _ = _normalized(closed_jaxpr, cost_model, *options, n.found, inline_manual, keep_custom, fixed)
    return program


def _misplaced_outputs(program: Program, out_shardings: Sequence[Any]) -> dict[int, Any]:
    """The program's outputs (by value id) that its equations place
    otherwise than `out_shardings`, each with its sharding there. XLA
    shards each equation for its own inputs, and `jax.jit` of the whole
    step may choose otherwise for a gradient (a GPT's LayerNorm bias:
    replicated alone, split over the model axis in the step). Arguments and
    constants stay as they are: only what an equation makes is placed."""
    made = {v for item in program.body for v in item.outputs}
    fixed: dict[int, Any] = {}
    for value, target in zip(program.outputs, out_shardings):
        if not isinstance(value, Value) or value not in made or value.id in fixed or target is None:
            continue
        want, have = spread(target), value.sharding
        if want is None and have is None:
            continue
        if want is not None and have is not None and have.is_equivalent_to(want, len(value.shape)):
            continue
        fixed[value.id] = target
    return fixed


def _normalized(
    closed_jaxpr: Any, cost_model: CostModel, keep_scans: bool, placed: list, sharded: bool, hints, inline_manual: bool,
    keep_custom: bool, fixed: Optional[dict[int, Any]] = None,
) -> Any:
    n = _Normalizer(cost_model, keep_scans, sharded, hints, inline_manual, keep_custom, fixed)
    if isinstance(closed_jaxpr, _jax_core.ClosedJaxpr):
        closed_jaxpr = _jax_core.without_dead_code(closed_jaxpr)
    jaxpr, consts = _jax_core.open_jaxpr(closed_jaxpr)
    inputs = tuple(n.new_value(v.aval, placed[i] if placed else None) for i, v in enumerate(jaxpr.invars))
    body: list[Item] = []
    outs = n.inline(body, jaxpr, consts, inputs)
    outs = [n.held_value(body, o) for o in outs]
    program = Program(inputs, (), dead_code_elimination(body, outs), tuple(outs))
    used = program.used_values()
    program.consts = tuple((v, a) for v, a in n.consts.values() if v in used)
    program.release_after = liveness(program)
    program.names = {k: v for k, v in n.names.items() if isinstance(v, Value)}
    return program, n


def _widest(atoms: Any) -> Any:
    """The sharding of a `cond`'s output: its branches' output with the most
    bytes on one device (a literal's: whole, unsharded)."""
    atoms = list(atoms)
    if not all(isinstance(a, Value) for a in atoms):
        return None
    return max(atoms, key=lambda a: a.nbytes).sharding


def _literal(atom: Any) -> Const:
    """A jaxpr literal with its value in the literal's own dtype: a Python
    `2.0` in a float32 program is a float32 scalar, not numpy's float64 (the
    bytes of a literal made into a value must be the bytes its readers see)."""
    dtype = getattr(getattr(atom, "aval", None), "dtype", None)
    try:
        if dtype is not None and isinstance(dtype, np.dtype):
            return Const(np.asarray(atom.val, dtype=dtype))
    except (TypeError, ValueError, OverflowError):
        pass
    return Const(atom.val)
