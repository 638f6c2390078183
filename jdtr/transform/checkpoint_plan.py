"""`jdtr.Plan`: DTR's decisions as checkpoint segments, and how to read them."""

from __future__ import annotations

import collections
import dataclasses
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import jax

from ..runtime import format_bytes
from ._jax_core import jaxpr_function
from .autotune import Timing
from .checkpoint import run_segments
from .outer_derivatives import exact_under_outer
from .program import Equation, Program, Value, signature
from .scans import KeptScan, ScanStrategy, body_decisions
from .save_policy import NAME_PREFIX, SavePolicy
from .segments import Segment


class PolicyWarning(UserWarning):
    """`plan.policy` cannot mean the plan, for either of two reasons:

    * the plan both saves and recomputes values of one shape signature (the
      same layer's output in different layers, unrolled), and a policy of
      signatures saves them all;
    * it keeps a scan as nested levels of checkpointed segments, or runs a
      scan's body in rematerialized pieces, which no policy on the scan's
      body can express (applied there, it saves each iteration's carry, as
      the one-level "carry" strategy does).

    Attributes:
      mixed: per (primitive, input shapes and dtypes), (how many such values
        the plan saves, how many the step computes).
      nested: the nested scans, as `Plan.report` describes them.
    """

    def __init__(self, mixed: dict, nested: tuple[str, ...] = ()):
        self.mixed, self.nested = mixed, nested
        said = []
        if mixed:
            shown = "; ".join(
                f"{name} of {', '.join(f'{dtype}{list(shape)}' for shape, dtype in args)}: {k} of {n}"
                for (name, args), (k, n) in sorted(mixed.items(), key=lambda kv: -kv[1][1])[:3]
            )
            said.append(
                "plan.policy saves values by primitive and input shapes, and the plan saves only some of "
                f"the values of a signature ({shown}{'; ...' if len(mixed) > 3 else ''}). Wherever it is "
                "applied (`jax.checkpoint` on a whole function, `nnx.remat` on each layer), it saves every "
                "value of such a signature, more than the plan."
            )
        if nested:
            said.append(
                f"plan.policy cannot express the plan's {len(nested)} scan(s) kept as nested levels of "
                "checkpointed segments or run in rematerialized pieces (" + "; ".join(nested) + "): applied to a "
                "scan's body, it saves every "
                "iteration's carry, more than the plan."
            )
        super().__init__(
            "jdtr: " + " ".join(said) + " Use plan.grad, jdtr.remat_grad or jdtr.nnx.remat_grad for the plan's memory."
        )


@dataclass(frozen=True, eq=False)
class Plan:
    """Where a value-and-grad saves and where it recomputes, as checkpoint segments.

    Attributes:
      budget_bytes: the budget the plan was made for (bytes of the whole step).
      segments: the `jax.checkpoint` segments, in forward order.
      saved: every forward value kept for the backward pass (segment inputs included).
      simulated: the DTR simulation the plan was read from (a `jdtr.SimResult`).
      compiled_bytes: XLA's argument + output + temporary bytes of the planned step
        (None if not compiled yet).
      unconstrained_compiled_bytes: the same for `jax.grad` without remat.
      timings: when autotuned (the default), every candidate plan within
        the budget that was compiled and timed (a `Timing` each; one is
        `chosen`); empty with `autotune=False`.
      policy: one `SavePolicy` for the whole plan (names and signatures).
      origin: "dtr" where the segments are read from `simulated`; "uniform"
        for the autotuning candidate of evenly spaced segments that save
        nothing inside (Chen et al.'s sqrt(N) checkpointing, or such segments
        of equal compute nested to the left, `segments.nested_left`;
        `simulated` is then DTR's run at the budget, for comparison); "costly"
        for the autotuning candidate that saves the values whose equations
        cost the most compute per byte (`costly.costly_plan`: sorts and
        matmuls kept, elementwise chains recomputed); "none" where
        `jax.grad`'s own step fits the budget: no segments, nothing recomputed.
      gate: where segments are protected (on the CPU), how: "auto" gates the
        recomputation of a segment holding a convolution by a taint and any
        other by a `lax.cond`; "inputs" as "auto", with the segment's saved
        inputs selected by the predicate too (so XLA cannot move their
        backward uses into the forward pass); "anchored" as "inputs", with
        the constants the pullback makes tied to the predicate too
        (`anchoring.py`); "cond_recompute" gates every one by a
        `lax.cond`, a convolution's segment running its recomputation alone
        in it and its pullback after it (the planner's fallback where no
        tainted plan fits); "cond" gates every one by a `lax.cond` holding
        the whole pullback (the last fallback: a convolution's gradient
        runs ~20x slower in it on the CPU); "taint"
        gates every one by the taint (segments nested to the left where no
        plan fits a program without convolutions: XLA holds the temporaries
        of nested conds at once).
      tied: whether random bits in the forward pass are tied to the value
        made before them (`checkpoint._Anchor`), which keeps XLA from making
        every layer's at the start of the step; measured where a plan
        without it is over the budget (it can serialize them and slow the step).
      scans: the scans kept whole (`jdtr.transform.scans`): each runs outside
        the segments, its iterations keeping what its strategy says.
      function: where `jax.grad`'s own step fits (origin "none"), the
        user's function, which the plan runs as it is: its step is the one
        measured as `unconstrained_compiled_bytes`, whereas jdtr's program
        of it, run equation by equation, compiled to 11% more on a Flax
        BatchNorm CNN.
    """

    budget_bytes: int
    segments: tuple[Segment, ...]
    saved: frozenset[Value]
    simulated: Any  # a jdtr.SimResult
    program: Program = dataclasses.field(repr=False)
    _config: Any = dataclasses.field(repr=False)
    compiled_bytes: Optional[int] = None
    unconstrained_compiled_bytes: Optional[int] = None
    predicted_bytes: int = 0  # the plan's own model of the compiled step
    timings: tuple[Timing, ...] = ()
    origin: str = "dtr"
    gate: str = "auto"  # how protected segments are gated (`checkpoint.GATES`)
    tied: bool = False  # random bits tied to the value made before them
    scans: tuple[KeptScan, ...] = ()  # scans kept whole, outside the segments, each under its strategy
    function: Optional[Callable] = dataclasses.field(default=None, repr=False)

    @functools.cached_property
    def policy(self) -> SavePolicy:
        """The plan's saved values as a `jax.checkpoint` policy: by jdtr's
        names (inside `plan.grad`) and by primitive and input shapes (in the
        user's own code). In the body of a scan the plan keeps, it says what
        the scan's strategy saves per iteration, so that `jax.checkpoint`
        or `nnx.remat` on the scanned layer saves what the plan saves for
        that layer. Warns (`PolicyWarning`) where a shape signature cannot
        tell the values the plan saves from values it recomputes, or where
        a scan's strategy nests."""
        names = frozenset(NAME_PREFIX + str(v.id) for s in self.segments for leaf in s.leaves() for v in leaf.saved)
        kept = {k.position: k for k in self.scans}
        saved, recomputed = collections.Counter(), collections.Counter()
        # Recomputed: what the backward pass reads from inside a segment, and what a segment's
        # recomputation reads to make it (JAX 0.11's tanh chain saves matmul outputs and
        # recomputes the others for their tanh). A value outside every segment that the plan
        # does not save is neither: no policy is asked about it.
        recomputing = {v for s in self.segments for seg in (s, *s.leaves()) for v in seg.recomputed}
        for leaf in (leaf for s in self.segments for leaf in s.leaves()):
            inside = self.program.body[leaf.start : leaf.stop]
            recomputing.update(v for item in inside for v in item.args if isinstance(v, Value))
        nested = []
        for position, item in enumerate(self.program.body):
            if not (isinstance(item, Equation) and item.outputs):
                continue
            if item.scan is not None:  # its body's equations, as its strategy answers for them
                scan = kept.get(position)  # (none: a plan without remat, the scan as JAX makes it)
                strategy = scan.strategy if scan is not None else ScanStrategy()
                for sig, is_saved in body_decisions(item, strategy):
                    (saved if is_saved else recomputed)[sig] += 1
                if not strategy.expressible:
                    nested.append(scan.describe())
                continue
            sig = signature(item.name, item.args)
            if any(v in self.saved for v in item.outputs):
                saved[sig] += 1
            elif any(v in recomputing for v in item.outputs):
                recomputed[sig] += 1
        mixed = {sig: (saved[sig], saved[sig] + recomputed[sig]) for sig in saved if recomputed[sig]}
        if mixed or nested:
            warnings.warn(PolicyWarning(mixed, tuple(nested)), stacklevel=3)  # the caller, past cached_property
        # (and what derivatives keep that no name reaches: `costly.hidden_residuals`)
        hidden = frozenset(sig for s in self.segments for leaf in s.leaves() for sig in leaf.signatures)
        return SavePolicy(names, frozenset(saved) | hidden)

    # ---------------------------------------------------------------- running

    def forward(self, *args, **kwargs):
        """The user's function, run through the plan's checkpoint segments."""
        return self._forward(None, *args, **kwargs)

    def _forward(self, differentiated, *args, **kwargs):
        """`forward`, its leaves differentiated as `differentiated` says (None: any may be)."""
        if self.function is not None and not self.segments:  # no remat: the very step `jax.grad` compiles
            return self.function(*args, **kwargs)
        config = self._config
        leaves = config.traced_leaves(args, kwargs)
        outs = run_segments(self.program, self.segments, leaves, config.implementation, self.gate, self.tied, differentiated)
        return config.unflatten_outputs(outs)

    def _differentiated_forward(self):
        positions = set(self._config.arguments.traced_argnums)
        return functools.partial(self._forward, [i in positions for i in range(len(self.program.inputs))])

    def _traced_forward(self, *args, **kwargs):
        """The user's function as traced for planning, without the plan."""
        config = self._config
        return config.unflatten_outputs(jaxpr_function(config.traced)(*config.traced_leaves(args, kwargs)))

    def _step(self, differentiate: Callable) -> Callable:
        """The planned step (`differentiate`: `jax.grad` or `jax.value_and_grad`),
        its derivatives exact under an outer transformation (`outer_derivatives.py`)."""
        config = self._config
        planned = differentiate(self._differentiated_forward(), config.argnums, config.has_aux)
        if (self.function is not None and not self.segments) or config.traced is None:
            return planned  # (`jax.grad` of the user's own function: exact as it is)
        reference = differentiate(self._traced_forward, config.argnums, config.has_aux)
        return exact_under_outer(planned, reference, config.arguments, config.has_aux)

    def value_and_grad(self, *args, **kwargs):
        return self._step(jax.value_and_grad)(*args, **kwargs)

    def grad(self, *args, **kwargs):
        return self._step(jax.grad)(*args, **kwargs)

    # --------------------------------------------------------------- reading

    def report(self) -> str:
        """What each segment saves and recomputes, like `print_saved_residuals`."""
        simulation = (
            f"simulated peak {format_bytes(self.simulated.peak_bytes)} "
            f"(unconstrained {format_bytes(self.simulated.unconstrained_peak_bytes)}), "
            f"simulated overhead {self.simulated.overhead:.3f}x"
        )
        if self.origin == "none":
            head = f"no remat: `jax.grad`'s own step fits the budget ({simulation})"
        elif self.origin == "uniform":
            head = f"{len(self.segments)} uniform segments saving nothing inside (DTR at this budget: {simulation})"
        elif self.origin == "costly":
            head = f"{len(self.segments)} segments saving the values dearest to recompute per byte (DTR at this budget: {simulation})"
        else:
            head = f"{len(self.segments)} segments, {simulation}"
        lines = [f"jdtr plan: budget {format_bytes(self.budget_bytes)}, {head}"]
        lines.extend(kept.describe() for kept in self.scans)
        if self.tied:
            lines.append("random bits: each made where its layer runs, tied to the value made before it")
        if self.compiled_bytes is not None:
            lines.append(
                f"compiled step: {format_bytes(self.compiled_bytes)} (arguments + outputs + temporaries; "
                f"without remat {format_bytes(self.unconstrained_compiled_bytes or 0)})"
            )
        if self.timings:
            chosen = next(t for t in self.timings if t.chosen)
            others = ", ".join(
                f"{format_bytes(t.compiled_bytes)} {t.seconds * 1e3:.1f} ms" + (f" ({t.origin})" if t.origin != "dtr" else "")
                for t in self.timings
                if not t.chosen
            )
            lines.append(
                f"autotuned: fastest of {len(self.timings)} plans within the budget, "
                f"{chosen.seconds * 1e3:.1f} ms per step (others: {others or 'none'})"
            )
        producer = {v: item for item in self.program.body if isinstance(item, Equation) for v in item.outputs}
        total_in = total_saved = total_recomputed = 0

        def describe(seg: Segment, indent: str) -> None:
            nin, nsaved, nrec = (sum(v.nbytes for v in vs) for vs in (seg.inputs, seg.saved, seg.recomputed))
            nested = f", {len(seg.children)} nested segments" if seg.children else ""
            lines.append(
                f"{indent}segment {seg.index}: equations {seg.start}..{seg.stop - 1}, inputs {format_bytes(nin)}, "
                f"saved {format_bytes(nsaved)}, recomputed {format_bytes(nrec)}{nested}"
            )
            for v in seg.saved:
                item = producer.get(v)
                where = f"{item.name} at {item.source}" if item is not None else "input"
                lines.append(f"{indent}  {v.dtype}{list(v.shape)} saved: output of {where}")
            for name, avals in sorted(seg.signatures):
                lines.append(f"{indent}  saved by signature: every {name} of {', '.join(f'{d}{list(s)}' for s, d in avals)}")
            for child in seg.children:
                describe(child, indent + "  ")

        for seg in self.segments:
            total_in += sum(v.nbytes for v in seg.inputs)
            total_saved += sum(v.nbytes for leaf in seg.leaves() for v in leaf.saved)
            total_recomputed += sum(v.nbytes for v in seg.recomputed)
            describe(seg, "")
        lines.append(
            f"total: segment inputs {format_bytes(total_in)}, saved inside segments {format_bytes(total_saved)}, "
            f"recomputed {format_bytes(total_recomputed)}"
        )
        return "\n".join(lines)



def layout(plan: Plan) -> tuple:
    """What makes two plans the same step: their cuts, nesting and what they save."""

    def of(segments: Sequence[Segment]) -> tuple:
        return tuple(
            (seg.start, seg.stop, tuple(v.id for v in seg.saved), of(seg.children), seg.signatures) for seg in segments
        )

    return (plan.gate, plan.tied, of(plan.segments))
