"""The command line: `python -m jdtr replay|sweep|optimal LOG ...`.

replay simulates one operator log under one budget; sweep runs a grid of
budget ratios and heuristics and prints the paper's Figure 2 as a table
(and, with --plot, as a PNG); optimal solves Checkmate's problem (relaxation,
refinement, MILP) for the least compute any schedule needs under one budget.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional, Sequence, TextIO

from .runtime import DEALLOC_POLICIES, HEURISTICS
from . import plot
from .oplog import ComputeStep, LogFormatError, Trace
from .simulator import METHODS, PAPER_RATIOS, OptimalResult, SimResult, cell, format_table, optimal, simulate, sweep

# The heuristics of the paper's Figure 2, in its order.
FIGURE2_HEURISTICS = ("dtr_full", "dtr_eq", "dtr_local", "lru", "size", "msps", "random")


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"  # the paper's unit (10^6 bytes)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jdtr", description=__doc__.split("\n\n")[1].replace("\n", " "))
    commands = parser.add_subparsers(dest="command", required=True)

    replay = commands.add_parser("replay", help="simulate one log under one budget")
    replay.add_argument("log", help="an operator log (JSON lines, the DTR prototype's format)")
    budget = replay.add_mutually_exclusive_group(required=True)
    budget.add_argument("--ratio", type=float, help="budget as a fraction of the unconstrained peak, in (0, 1]")
    budget.add_argument("--budget", type=_budget, help="budget in bytes, or with a unit: 4GB, 512MiB")
    _add_common(replay)
    replay.add_argument("--heuristic", default="dtr_eq", choices=sorted(HEURISTICS), help="default: dtr_eq")

    best = commands.add_parser("optimal", help="the least compute any schedule needs under one budget (needs scipy)")
    best.add_argument("log", help="an operator log (JSON lines, the DTR prototype's format)")
    budget = best.add_mutually_exclusive_group(required=True)
    budget.add_argument("--ratio", type=float, help="budget as a fraction of the unconstrained peak, in (0, 1]")
    budget.add_argument("--budget", type=_budget, help="budget in bytes, or with a unit: 4GB, 512MiB")
    best.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds for refinement and the MILP solver (default: 60)"
    )
    best.add_argument(
        "--method", default="auto", choices=METHODS,
        help="auto: relaxation, refinement, then the MILP if small enough; milp: relaxation, then the MILP; "
        "relaxation: no MILP (default: auto)",
    )
    best.add_argument("--json", action="store_true", help="print JSON instead of text")

    grid = commands.add_parser("sweep", help="simulate one log over budget ratios and heuristics (Figure 2)")
    grid.add_argument("log", help="an operator log (JSON lines, the DTR prototype's format)")
    grid.add_argument(
        "--ratios", type=float, nargs="+", default=list(PAPER_RATIOS), metavar="R", help="default: 1.0 0.9 ... 0.1"
    )
    grid.add_argument(
        "--heuristics",
        nargs="+",
        default=list(FIGURE2_HEURISTICS),
        choices=sorted(HEURISTICS),
        metavar="H",
        help=f"among {', '.join(sorted(HEURISTICS))}; default: {' '.join(FIGURE2_HEURISTICS)}",
    )
    _add_common(grid)
    grid.add_argument("--plot", metavar="PNG", help="also write slowdown against budget ratio as a PNG")
    grid.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


def _budget(text: str) -> "int | str":
    """Plain digits are bytes (as the Python API reads an int); anything
    else is a size with a unit, read by `jdtr.parse_budget`."""
    return int(text) if text.strip().isdigit() else text


def _overhead_limit(text: str) -> float:
    """A slowdown: at least 1 (a run costs its baseline), `inf` for none."""
    try:
        limit = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if math.isnan(limit) or limit < 1.0:
        raise argparse.ArgumentTypeError(f"must be at least 1 (a slowdown; inf for no limit); got {text!r}")
    return limit


def _read(log: str) -> Trace:
    """The log, refused when it asks nothing of the runtime: a simulation of
    it would report a budget and an overhead of nothing."""
    trace = Trace.from_log(log)
    if not any(isinstance(step, ComputeStep) and not step.constant for step in trace.program.steps):
        raise ValueError(f"{log} has no operator calls (CALL or MUTATE records after ANNOTATE START): nothing to simulate")
    return trace


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dealloc", default="eager", choices=DEALLOC_POLICIES, help="default: eager")
    parser.add_argument(
        "--overhead-limit",
        type=_overhead_limit,
        default=2.0,
        help="stop a run as thrashing beyond this slowdown (default: 2.0, as the paper)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _describe(log: str, result: SimResult) -> str:
    outcome = (
        f"overhead {result.overhead:.4f}" if result.ok else ("out of memory" if result.status == "oom" else "thrashed")
    )
    lines = [
        f"{log}: {result.status}, {outcome} ({result.heuristic}, {result.dealloc} deallocation)",
        (
            f"  budget                {result.budget_bytes} B ({_megabytes(result.budget_bytes)}, "
            f"{result.budget_ratio:.4g} of the unconstrained peak)"
        ),
        f"  unconstrained peak    {result.unconstrained_peak_bytes} B ({_megabytes(result.unconstrained_peak_bytes)})",
        f"  peak                  {result.peak_bytes} B ({_megabytes(result.peak_bytes)})",
        f"  baseline compute      {result.baseline_cost:.0f} ({result.baseline_cost / 1e6:.2f} ms for ns logs)",
        f"  rematerialization     {result.remat_cost:.0f} in {result.rematerializations} operator replays",
        f"  evictions             {result.evictions} by the heuristic, {result.dealloc_evictions} of dead values",
        (
            f"  heuristic work        {result.heuristic_evaluations} evaluations, "
            f"{result.metadata_accesses} metadata accesses"
        ),
        f"  constants             {result.constant_bytes} B ({_megabytes(result.constant_bytes)})",
        f"  largest single op     {result.largest_op_bytes} B ({_megabytes(result.largest_op_bytes)})",
    ]
    if result.message:
        lines.append(f"  why                   {result.message}")
    return "\n".join(lines)


class _Progress:
    """A one-line counter on stderr (one line per run when stderr is not a terminal)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.live = stream.isatty()

    def __call__(self, done: int, total: int, result: SimResult) -> None:
        text = f"[{done}/{total}] {result.heuristic} at {result.budget_ratio:.3g}: {cell(result)}"
        if self.live:
            self.stream.write("\r\033[K" + text + ("\n" if done == total else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _replay(args: argparse.Namespace) -> int:
    budget = args.ratio if args.ratio is not None else args.budget
    result = simulate(_read(args.log), budget, args.heuristic, args.dealloc, overhead_limit=args.overhead_limit)
    if args.json:
        print(json.dumps({"log": args.log, **result.to_dict()}))
    else:
        print(_describe(args.log, result))
    return 0


def _describe_optimal(log: str, result: OptimalResult) -> str:
    if result.overhead is not None:
        outcome = f"overhead {result.overhead:.4f}"
    else:
        outcome = "no schedule fits" if result.status == "infeasible" else "no schedule found in time"
    lines = [
        f"{log}: {result.status}, {outcome} (Checkmate's problem, {result.solver})",
        f"  budget                {result.budget_bytes} B ({_megabytes(result.budget_bytes)})",
        f"  baseline compute      {result.baseline_cost:.0f}",
    ]
    if result.total_cost is not None:
        lines.append(f"  total compute         {result.total_cost:.0f} ({result.recomputations} recomputations)")
    if result.bound is not None:
        lines.append(f"  lower bound           {result.bound:.0f} (overhead {result.bound / result.baseline_cost:.4f})")
    lines += [
        f"  least feasible budget {result.required_bytes} B ({_megabytes(result.required_bytes)}) or more",
        f"  no recomputation from {result.unconstrained_peak_bytes} B ({_megabytes(result.unconstrained_peak_bytes)})",
        f"  MILP                  {result.nodes} nodes, {result.variables} variables, {result.constraints} constraints,"
        f" {result.solve_time_s:.1f} s",
        f"  solver                {result.message}",
    ]
    return "\n".join(lines)


def _optimal(args: argparse.Namespace) -> int:
    budget = args.ratio if args.ratio is not None else args.budget
    result = optimal(_read(args.log), budget, time_limit=args.time_limit, method=args.method)
    if args.json:
        print(json.dumps({"log": args.log, **result.to_dict()}))
    else:
        print(_describe_optimal(args.log, result))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    trace = _read(args.log)
    progress = None if args.quiet else _Progress(sys.stderr)
    results = sweep(
        trace, args.ratios, args.heuristics, args.dealloc, overhead_limit=args.overhead_limit, progress=progress
    )
    if args.json:
        print(json.dumps({"log": args.log, "ratios": args.ratios, "results": [r.to_dict() for r in results]}))
    else:
        first = results[0]
        print(
            f"{args.log}: unconstrained peak {_megabytes(first.unconstrained_peak_bytes)}, baseline compute "
            f"{first.baseline_cost / 1e6:.2f} ms, constants {_megabytes(first.constant_bytes)}, "
            f"largest single op {_megabytes(first.largest_op_bytes)}; slowdown by budget ratio "
            f"({args.dealloc} deallocation, thrash = over {args.overhead_limit:g}x):"
        )
        print(format_table(args.ratios, results))
    if args.plot:
        plot.sweep(args.ratios, results, args.plot, title=Path(args.log).name)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line; returns the exit status (2 for unusable input)."""
    parser = _parser()
    args = parser.parse_args(argv)
    commands = {"replay": _replay, "sweep": _sweep, "optimal": _optimal}
    try:
        return commands[args.command](args)
    except (LogFormatError, OSError, ValueError, TypeError, ImportError) as err:
        print(f"{parser.prog} {args.command}: error: {err}", file=sys.stderr)
        return 2
