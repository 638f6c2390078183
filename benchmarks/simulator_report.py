"""Writes docs/simulator.md and its plots (docs/images/sim_*.png).

What jdtr's simulator reproduces of the DTR paper (the shared operator logs
against the reference figures in their README, parsed from it), sweeps of
budget ratio by heuristic for those logs and for `jdtr.trace` logs of the
benchmark models, and Checkmate's optimum (`jdtr.optimal`) beside the
heuristics where the MILP is small enough to solve.

    python benchmarks/simulator_report.py
    python benchmarks/simulator_report.py --logs ../shared/dtr-logs --optimal-time-limit 60 --optimal-shared 60

Everything in the document is computed by this script; rerun it after a
change to the runtime, the heuristics or the trace recorder.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import jax
import scipy

import jdtr
from jdtr import models
from jdtr.plot import sweep as plot_sweep
from jdtr.simulator import PAPER_RATIOS, OptimalResult, SimResult, cell, checkmate_graph, sweep
from jdtr.oplog import Call

ROOT = Path(__file__).resolve().parents[1]
# Figure 2's heuristics that the task compares, the paper's default first.
BASE_HEURISTICS = ("dtr_eq", "dtr_full", "lru", "size", "msps")
HEURISTICS = (*BASE_HEURISTICS, *(("lookahead",) if "lookahead" in jdtr.HEURISTICS else ()))

# The benchmark models, at sizes a sweep of all heuristics finishes in minutes.
BENCHMARK_MODELS: dict[str, Callable[[], models.Model]] = {
    "mlp_chain(64, 256, 2048)": lambda: models.mlp_chain(64, 256, 2048),
    "resnet(4, 16, 16, 8)": lambda: models.resnet(4, 16, 16, 8),
    "transformer(4, 64, 4, 64, 8, 128)": lambda: models.transformer(4, 64, 4, 64, 8, 128),
    "rnn(32, 64, 16, 64)": lambda: models.rnn(32, 64, 16, 64),
}
# Small enough for Checkmate's MILP (`MILP_MAX_BINARIES`): 24 to 204 operators.
OPTIMAL_MODELS: dict[str, Callable[[], models.Model]] = {
    "mlp_chain(2, 32, 256)": lambda: models.mlp_chain(2, 32, 256),
    "mlp_chain(4, 32, 256)": lambda: models.mlp_chain(4, 32, 256),
    "rnn(2, 32, 8, 64)": lambda: models.rnn(2, 32, 8, 64),
    "mlp_chain(8, 32, 256)": lambda: models.mlp_chain(8, 32, 256),
    "rnn(4, 32, 8, 64)": lambda: models.rnn(4, 32, 8, 64),
    "mlp_chain(16, 32, 256)": lambda: models.mlp_chain(16, 32, 256),
    "resnet(1, 8, 8, 4)": lambda: models.resnet(1, 8, 8, 4),
    "rnn(8, 32, 8, 64)": lambda: models.rnn(8, 32, 8, 64),
}
OPTIMAL_RATIOS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, JAX {jax.__version__}, "
        f"scipy {scipy.__version__} (HiGHS)"
    )


# ------------------------------------------------------------ the README's figures


@dataclass
class Reference:
    """What shared/dtr-logs/README.md lists for one log."""

    model: str
    calls: int
    peak_mb: float
    compute_ms: float
    constants_mb: float
    largest_mb: float
    ratios: list[float]
    results: list[str]


_FIGURES = re.compile(
    r"^(?P<model>.+?) \(\d+\): unconstrained peak (?P<peak>[\d.]+) MB, baseline compute (?P<compute>[\d.]+) ms, "
    r"constants (?P<constants>[\d.]+) MB, largest single op (?P<largest>[\d.]+) MB"
)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def read_references(readme: Path) -> dict[str, Reference]:
    """The reference figures of each log, read from the README's text and tables.

    A column "0.3 and below" stands for 0.3 and every ratio of the paper's
    Figure 2 below it.
    """
    lines = readme.read_text().splitlines()
    files: dict[str, tuple[str, int]] = {}  # model name -> (log file, CALL lines)
    for line in lines:
        row = _cells(line) if line.startswith("|") else []
        if len(row) == 3 and row[0].endswith(".log"):
            files[row[1].split(",")[0]] = (row[0], int(row[2]))
    references = {}
    for number, line in enumerate(lines):
        match = _FIGURES.match(line)
        if not match:
            continue
        table = [_cells(row) for row in lines[number + 1 :] if row.startswith("|") and not row.startswith("|---")]
        header, results = table[:2]  # the next table: its header and its one row
        ratios: list[float] = []
        values: list[str] = []
        for text, value in zip(header[1:], results[1:]):
            first = float(text.split()[0])
            expanded = [first, *(r for r in PAPER_RATIOS if r < first)] if "below" in text else [first]
            ratios += expanded
            values += [value] * len(expanded)
        name, calls = files[match["model"]]
        references[name] = Reference(
            match["model"], calls, float(match["peak"]), float(match["compute"]), float(match["constants"]),
            float(match["largest"]), ratios, values,
        )  # fmt: skip
    return references


# ---------------------------------------------------------------------- tables


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def optimal_cell(result: Optional[OptimalResult]) -> str:
    """The optimum's overhead; after a timeout, the best found and the lower bound."""
    if result is None:
        return "–"
    if result.status == "infeasible":
        return "infeasible"
    bound = f"≥{result.bound / result.baseline_cost:.4f}" if result.bound is not None else ""
    if result.status == "optimal":
        return f"**{result.overhead:.4f}**"
    if result.overhead is not None:
        return f"≤{result.overhead:.4f} {bound}".strip()
    return bound or "timeout"


def sweep_table(
    ratios: Sequence[float], results: Sequence[SimResult], optimal: Optional[Sequence[Optional[OptimalResult]]] = None
) -> str:
    header = ["heuristic \\ budget ratio", *(f"{r:g}" for r in ratios)]
    rows = [
        [results[start].heuristic, *(cell(r) for r in results[start : start + len(ratios)])]
        for start in range(0, len(results), len(ratios))
    ]
    if optimal is not None:
        rows.append(["optimal (Checkmate)", *(optimal_cell(r) for r in optimal)])
    return markdown_table(header, rows)


def trace_facts(trace: jdtr.Trace, first: SimResult) -> str:
    calls = sum(1 for r in trace.records if isinstance(r, Call))
    return (
        f"{calls} operator calls; unconstrained peak {first.unconstrained_peak_bytes / 1e6:.2f} MB, "
        f"baseline compute {first.baseline_cost / 1e6:.3f} ms, constants {first.constant_bytes / 1e6:.2f} MB, "
        f"largest single op {first.largest_op_bytes / 1e6:.2f} MB"
    )


def run_sweep(name: str, trace: jdtr.Trace, ratios: Sequence[float]) -> list[SimResult]:
    start = time.perf_counter()
    results = sweep(trace, ratios, HEURISTICS)
    log(f"  swept {name}: {len(results)} runs in {time.perf_counter() - start:.1f} s")
    return results


def run_optimal(name: str, trace: jdtr.Trace, ratios: Sequence[float], time_limit: float) -> list[OptimalResult]:
    results = []
    for ratio in ratios:
        result = jdtr.optimal(trace, ratio, time_limit=time_limit, rel_gap=1e-4)
        log(f"  optimal {name} at {ratio:g}: {optimal_cell(result)} ({result.solve_time_s:.1f} s)")
        results.append(result)
    return tighten(results)


def tighten(results: Sequence[OptimalResult]) -> list[OptimalResult]:
    """Narrows timeouts with the other budgets' results (budgets in descending order).

    The optimum cannot decrease as the budget shrinks: a lower bound holds
    for every smaller budget, and a schedule that fits is one for every
    larger budget.
    """
    out = list(results)
    lower: Optional[float] = None
    for i, r in enumerate(out):
        if r.status == "infeasible":
            continue
        own = r.total_cost if r.status == "optimal" else r.bound
        lower = max((x for x in (own, lower) if x is not None), default=None)
        if r.status == "timeout" and lower is not None and (r.bound is None or lower > r.bound):
            out[i] = replace(r, bound=lower)
    upper: Optional[float] = None
    for i in reversed(range(len(out))):
        r = out[i]
        if r.status == "infeasible":
            continue
        upper = min((x for x in (r.total_cost, upper) if x is not None), default=None)
        if r.status == "timeout" and upper is not None and (r.total_cost is None or upper < r.total_cost):
            out[i] = replace(r, total_cost=upper, overhead=upper / r.baseline_cost)
    return out


def gap_summary(
    results: Sequence[SimResult], optimal: Sequence[OptimalResult], ratios: Sequence[float], proven: bool = True
) -> str:
    """How far each heuristic is from the optimum: where it is proven (`proven`),
    or at most, from the lower bound, wherever one is known."""

    def reference(o: OptimalResult) -> Optional[float]:
        if proven:
            return o.total_cost if o.status == "optimal" else None
        return o.bound

    lines = []
    for start in range(0, len(results), len(ratios)):
        row = results[start : start + len(ratios)]
        # The simulator's clock starts at 1 (as simrd's): compare compute, not that offset.
        compute = [(r.baseline_cost + r.remat_cost, reference(o)) for r, o in zip(row, optimal) if r.ok]
        gaps = [total / best - 1.0 for total, best in compute if best]
        if not gaps:
            continue
        count = f" ({sum(g < 1e-4 for g in gaps)} of {len(gaps)} optimal)" if proven else ""
        lines.append(f"{row[0].heuristic} {max(gaps):.1%}{count}")
    return "; ".join(lines)


def schedules_below_heuristics(
    results: Sequence[SimResult], optimal: Sequence[OptimalResult], ratios: Sequence[float]
) -> str:
    """The ratios at which `jdtr.optimal`'s schedule costs less than every heuristic that succeeded."""
    found = []
    for i, (ratio, o) in enumerate(zip(ratios, optimal)):
        runs = [results[start + i] for start in range(0, len(results), len(ratios))]
        best = min((r.baseline_cost + r.remat_cost for r in runs if r.ok), default=None)
        if o.total_cost is not None and best is not None and o.total_cost < best * (1 - 1e-9):
            found.append(f"{ratio:g} ({o.overhead:.4f} vs {best / o.baseline_cost:.4f})")
    return ", ".join(found)


# --------------------------------------------------------------------- sections

INTRODUCTION = """\
# The simulator

`jdtr.simulate` replays an operator log (a `jdtr.Trace`) on jdtr's own DTR
runtime — the one `jdtr.grad` runs on device buffers — with a backend that
holds no buffers. This page shows what it reproduces of the paper
(Kirisame et al., ICLR 2021), what the heuristics do on the authors' logs and
on logs of jdtr's benchmark models, and how far they are from the optimum.

Generated by `python benchmarks/simulator_report.py` on {date} ({machine});
it took {minutes:.1f} minutes. Every number below is computed by that script.

## How it works

* **Logs.** A log is the DTR prototype's JSON-lines format (paper App. C.6):
  `CONSTANT`/`MEMORY` for weights and inputs, `CALL` with `MEMORY`/`ALIAS` per
  result (sizes in bytes, `TIME` in ns), `MUTATE` (made copy-on-write),
  `COPY`/`COPY_FROM` (references), `RELEASE` (a dropped reference). Every
  value still referenced at the end is an output and must be resident then.
* **Replay.** `Trace.program` lowers the records to pure operator calls on
  numbered values; the replay feeds them to `jdtr.runtime.Runtime` exactly as
  the interpreter feeds a jaxpr's equations: constants are pinned, each call
  evicts (by the heuristic's lowest score) until its outputs fit, evicted
  inputs are rematerialized recursively, a value whose last reference is
  released is evicted at once (eager eviction, App. C.5) and the outputs are
  held at the end.
* **Measures** (as the authors' simulator, simrd): the *baseline* runs the
  log with no budget, freeing every value for good at its last release
  (constants included); its peak is the *unconstrained peak* that budget
  ratios refer to, and its compute the sum of all `TIME`s. *Overhead* (the
  paper's slowdown) is the runtime's clock (starting at 1) over the baseline
  compute. A run *thrashes* once rematerialization exceeds the baseline
  compute (2x), and is *OOM* when an operator cannot fit even with everything
  evictable evicted. In tables, "OOM" and "thrash" are those outcomes.
* **jdtr's own logs.** `jdtr.trace(f, *args)` records what the runtime is
  asked to do for `jax.value_and_grad(f)(*args)`: it runs the normalised
  program once in simulation (no buffers, no budget; a `cond` takes its
  largest branch) and logs a `CONSTANT` per argument and constant, a `CALL`
  per equation (sizes of its outputs, `TIME` = the deterministic cost model's
  seconds in whole ns, the runtime's own unit; an equation for which XLA
  needs temporaries has one more result of that size named `workspace<n>`,
  released at once, which a replay reads as memory the operator needs only
  while it runs), a
  `RELEASE` at each value's last use (not of the arguments, which outlive
  the call).
  `jdtr.grad(f, log=path)` writes the same log from a real run (the branches
  taken). Replaying such a log under a budget of `b` bytes takes the
  decisions `jdtr.grad(f, budget=b)` takes, eviction by eviction
  (tests/test_trace_capture.py, and the property tests on random programs
  without a `cond`, whose predicate read the format cannot express).
* **The optimum.** `jdtr.optimal(trace, budget)` solves Checkmate's MILP
  (Jain et al., MLSys 2020) with HiGHS on the trace's linear graph: one node
  per storage a call creates; stage t computes node t for the first time and
  may recompute earlier nodes; binaries say what each stage computes and
  keeps; memory (constants pinned) must stay within the budget at every
  step; outputs are resident at the end. Unlike the simulator, the MILP may
  keep a value the program released and frees a value as soon as its stage
  no longer needs it, and it splits a multi-output call into nodes that share
  its cost — so a heuristic's run that recomputes each operator at most
  once between two first computations is one of its schedules, and its
  optimum a lower bound on that run's compute. Before the MILP, `jdtr.optimal`
  solves a small relaxation (one binary per read of a value) and runs its
  decisions as a stage schedule, beside the runs of dtr_eq, dtr_full and
  lookahead at the same budget read as stage schedules; where the best of
  them meets the relaxation's bound it is optimal. Where none does, the
  nodes the schedule recomputes more often than the relaxation charged get
  Checkmate's own variables (kept into / recomputed in each stage), round
  by round: each round's bound is a bound and its decisions a schedule.
  Graphs of at most 50,000 binaries (`MILP_MAX_BINARIES`) then get the MILP
  for the rest of the time (at least a fifth), with the memory rows of a stage added
  only once a solution overflows that stage (a solution that fits without
  them is Checkmate's optimum; at ratio 0.6 of `rnn(2, 32, 8, 64)` this
  takes 0.5 s where the MILP with every row takes 7 minutes for the same
  optimum). All is solved to a
  relative gap of 1e-4 within {time_limit:g} s per budget for the small
  models below (other limits are given with each table): **bold** values
  are optimal, "≤a ≥b" means the
  time limit came first with a schedule of overhead a and a proof that none
  beats b (narrowed with the other budgets' results: the optimum cannot
  decrease as the budget shrinks). Its overhead is total compute over
  baseline compute; the simulator's also counts the 1 its clock starts at
  (as simrd's), which adds 1/baseline. The budgets left open here are
  solved again with longer time limits in docs/optimal_open.md
  (`benchmarks/optimal_open.py`).
"""


def reproduction_section(references: dict[str, Reference], logs: Path) -> str:
    parts = ["## What it reproduces", "",
             f"The two logs in `{logs.name}/` recorded by the paper's authors, against the figures of their own "
             "simulator listed in that folder's README (h_DTR^eq, \"DTR-EqClass\", eager eviction). The README's "
             "figures are read from it by the script, not typed.", ""]  # fmt: skip
    for name, ref in references.items():
        trace = jdtr.Trace.from_log(logs / name)
        results = sweep(trace, ref.ratios, ["dtr_eq"])
        first = jdtr.simulate(trace, 1.0)
        calls = sum(1 for r in trace.records if isinstance(r, Call))
        figures = [
            ("CALL lines", str(ref.calls), str(calls)),
            ("unconstrained peak (MB)", f"{ref.peak_mb:.2f}", f"{first.unconstrained_peak_bytes / 1e6:.2f}"),
            ("baseline compute (ms)", f"{ref.compute_ms:.2f}", f"{first.baseline_cost / 1e6:.2f}"),
            ("constants (MB)", f"{ref.constants_mb:.2f}", f"{first.constant_bytes / 1e6:.2f}"),
            ("largest single op (MB)", f"{ref.largest_mb:.2f}", f"{first.largest_op_bytes / 1e6:.2f}"),
        ]
        rows = [[what, want, got, "yes" if want == got else "**no**"] for what, want, got in figures]
        got = [cell(r) for r in results]
        rows += [[f"overhead at {ratio:g}", want, have, "yes" if want == have else "**no**"]
                 for ratio, want, have in zip(ref.ratios, ref.results, got)]  # fmt: skip
        matched = sum(row[3] == "yes" for row in rows)
        parts += [f"### {ref.model}: `{name}`", "", markdown_table(["", "README", "jdtr", "same"], rows), "",
                  f"{matched} of {len(rows)} figures equal.", ""]  # fmt: skip
        log(f"  reproduced {name}: {matched}/{len(rows)}")
    return "\n".join(parts)


def image(images: Path, name: str) -> tuple[Path, str]:
    return images / name, f"images/{name}"


def shared_log_section(logs: Path, names: Sequence[str], images: Path, time_limit: float) -> str:
    parts = ["## The shared logs, by heuristic", "",
             "Overhead by budget ratio (of the unconstrained peak) for each heuristic, eager eviction, as the paper's "
             "Figure 2.", ""]  # fmt: skip
    for name in names:
        trace = jdtr.Trace.from_log(logs / name)
        results = run_sweep(name, trace, PAPER_RATIOS)
        optimal = run_optimal(name, trace, PAPER_RATIOS, time_limit)
        path, link = image(images, f"sim_{Path(name).stem}.png")
        plot_sweep(PAPER_RATIOS, results, path, title=name, optimal=optimal)
        graph = checkmate_graph(trace.program)
        nodes = len(graph)
        limit = f"{time_limit:g} s per budget"
        beaten = schedules_below_heuristics(results, optimal, PAPER_RATIOS)
        about = (
            f"Checkmate's graph of this log has {nodes} nodes; its MILP would have {graph.milp_binaries():,} "
            "binaries, beyond HiGHS on two cores (with every memory row, at ratio 0.99 of the U-Net log it found "
            "neither a schedule nor a bound in 300 s; with memory rows added as needed, at ratio 0.9 it found a "
            "schedule of overhead 1.0102 and a bound of 1.0086 in 300 s, a weaker bound than the refinement's), "
            f"so it is not built: `jdtr.optimal` was given {limit} for the relaxation and its "
            f"refinement. {optimal_story(optimal, PAPER_RATIOS)} "
            + (f"The schedule found costs less than every heuristic's run at {beaten}. " if beaten else "")
            + "Each heuristic's compute is at most this far above the optimum (measured from the bound), at the "
            f"budgets where it succeeded: {gap_summary(results, optimal, PAPER_RATIOS, proven=False)}."
        )
        parts += [f"### `{name}`", "", trace_facts(trace, results[0]) + ".", "",
                  sweep_table(PAPER_RATIOS, results, optimal), "", f"![{name}]({link})", "", about, ""]  # fmt: skip
    return "\n".join(parts)


def model_section(images: Path, time_limit: float) -> str:
    parts = ["## jdtr traces of the benchmark models", "",
             "`jdtr.trace(model.loss, model.params, model.batch)` of `jdtr.models`, replayed at each budget ratio. "
             "Costs are the default cost model's (a nominal roofline: 1 TFLOP/s, 100 GB/s, 1 µs per launch), so "
             "overheads are in compute of that model, not measured time. The optimum's row is `jdtr.optimal` as "
             f"for the shared logs ({time_limit:g} s per budget; these graphs are too large for the MILP). At tight "
             "budgets the schedules it finds from its relaxations can cost more than the heuristics' runs: there "
             "its bound, not its schedule, is the informative number.", ""]  # fmt: skip
    for label, make in BENCHMARK_MODELS.items():
        start = time.perf_counter()
        model = make()
        trace = jdtr.trace(model.loss, model.params, model.batch)
        log(f"  traced {label} in {time.perf_counter() - start:.1f} s")
        results = run_sweep(label, trace, PAPER_RATIOS)
        optimal = run_optimal(label, trace, PAPER_RATIOS, time_limit)
        graph = checkmate_graph(trace.program)
        stem = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
        path, link = image(images, f"sim_{stem}.png")
        plot_sweep(PAPER_RATIOS, results, path, title=label, optimal=optimal)
        beaten = schedules_below_heuristics(results, optimal, PAPER_RATIOS)
        about = (
            f"Checkmate graph: {len(graph)} nodes ({graph.milp_binaries():,} binaries in its MILP); all budgets "
            f"took {sum(r.solve_time_s for r in optimal):.0f} s. {optimal_story(optimal, PAPER_RATIOS)} "
            + (f"The schedule found costs less than every heuristic's run at {beaten}. " if beaten else "")
            + "Each heuristic's compute is at most this far above the optimum (measured from the bound), at the "
            f"budgets where it succeeded: {gap_summary(results, optimal, PAPER_RATIOS, proven=False)}."
        )
        parts += [f"### `{label}`", "", trace_facts(trace, results[0]) + ".", "",
                  sweep_table(PAPER_RATIOS, results, optimal), "", f"![{label}]({link})", "", about, ""]  # fmt: skip
    return "\n".join(parts)


def optimal_story(optimal: Sequence[OptimalResult], ratios: Sequence[float]) -> str:
    """How each budget's optimum was found: by the first relaxation, by refinement, or not yet."""
    first = [o for o in optimal if o.status == "optimal" and "interval relaxation" in o.message]
    refined = [(r, o) for r, o in zip(ratios, optimal) if o.status == "optimal" and "refined relaxation" in o.message]
    milp = [(r, o) for r, o in zip(ratios, optimal) if o.status == "optimal" and o.message.startswith("Checkmate's MILP")]
    open_ = [o for o in optimal if o.status == "timeout"]
    def budgets(count: int) -> str:
        return f"{count} budget{'s' if count != 1 else ''}"

    def detail(o: OptimalResult) -> str:  # the message's first parenthesis: rounds, or rows and solves
        return re.search(r"[(](.*?)[)]", o.message).group(1)

    def how(proven: list[tuple[float, OptimalResult]]) -> str:
        return "; ".join(f"{r:g}: {detail(o)}" for r, o in proven)

    text = f"Proven optimal: {budgets(len(first))} by the first relaxation's bound"
    if refined or not milp:
        text += f", {len(refined)} after refining it" + (f" ({how(refined)})" if refined else "")
    if milp:
        text += f", {len(milp)} by the MILP ({how(milp)})"
    none = [(r, o) for r, o in zip(ratios, optimal) if o.status == "infeasible" and o.message.startswith("Checkmate's MILP")]
    if none:
        at = "; ".join(f"{r:g} ({detail(o)})" for r, o in none)
        text += f"; the MILP proves that no stage schedule fits at {at}"
    text += f"; {budgets(len(open_))} left between a schedule and a bound" if open_ else ""
    runs = [o for o in optimal if o.total_cost is not None and "'s run" in o.message]
    if runs:  # `optimal` starts from the heuristics' runs: say where one is the answer
        text += f"; the schedule is a heuristic's run at {budgets(len(runs))} ({heuristic_runs(runs)})"
    return text + "."


def heuristic_runs(results: Sequence[OptimalResult]) -> str:
    """Which heuristic's run each result's schedule is, counted: "dtr_eq 2, lookahead 1"."""
    names = [re.search(r"the schedule is (\w+)'s run", o.message).group(1) for o in results]
    return ", ".join(f"{name} {names.count(name)}" for name in dict.fromkeys(names))


def optimal_section(images: Path, time_limit: float) -> str:
    parts = ["## Against the optimum", "",
             "Small models, whose graphs have at most `MILP_MAX_BINARIES` binaries, so that `jdtr.optimal` "
             "solves Checkmate's MILP: the heuristics' overhead and "
             "Checkmate's optimum at the same budget in bytes (a ratio of the simulator's unconstrained peak). "
             "The optimum is a lower bound; a heuristic on it took an optimal schedule.", ""]  # fmt: skip
    for label, make in OPTIMAL_MODELS.items():
        model = make()
        trace = jdtr.trace(model.loss, model.params, model.batch)
        graph = checkmate_graph(trace.program)
        results = run_sweep(label, trace, OPTIMAL_RATIOS)
        optimal = run_optimal(label, trace, OPTIMAL_RATIOS, time_limit)
        stem = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
        path, link = image(images, f"sim_optimal_{stem}.png")
        plot_sweep(OPTIMAL_RATIOS, results, path, title=f"{label}: heuristics and the optimum", optimal=optimal)
        largest = max(optimal, key=lambda r: r.variables)
        milp = (
            f"MILP up to {largest.variables} variables ({largest.integer_variables} binary) and "
            f"{largest.constraints} constraints" if largest.variables else "the MILP was never needed"
        )
        gaps = gap_summary(results, optimal, OPTIMAL_RATIOS)
        parts += [f"### `{label}`", "",
                  f"{trace_facts(trace, results[0])}. Checkmate graph: {len(graph)} nodes; the model's own "
                  f"unconstrained peak (constants kept) {graph.unconstrained_peak_bytes() / 1e6:.3f} MB; {milp}; "
                  f"solving took {sum(r.solve_time_s for r in optimal):.0f} s in all. {optimal_story(optimal, OPTIMAL_RATIOS)}", "",
                  sweep_table(OPTIMAL_RATIOS, results, optimal), "",
                  f"Most extra compute over the optimum, at the budgets where it is proven and the heuristic "
                  f"succeeded: {gaps}.", "", f"![{label}]({link})", ""]  # fmt: skip
    return "\n".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=Path, default=ROOT.parent / "shared" / "dtr-logs", help="the shared DTR logs")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "simulator.md")
    parser.add_argument("--optimal-time-limit", type=float, default=180.0, help="seconds per budget for jdtr.optimal on the small models (default 180)")
    parser.add_argument(
        "--optimal-shared", type=float, default=60.0, metavar="SECONDS",
        help="seconds per budget for jdtr.optimal on the shared logs (default 60)",
    )
    parser.add_argument(
        "--optimal-models", type=float, default=20.0, metavar="SECONDS",
        help="seconds per budget for jdtr.optimal on the benchmark models (default 20)",
    )
    args = parser.parse_args(argv)
    images = args.output.parent / "images"
    images.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    log("reproduction")
    references = read_references(args.logs / "README.md")
    sections = [reproduction_section(references, args.logs)]
    log("shared logs")
    sections.append(shared_log_section(args.logs, list(references), images, args.optimal_shared))
    log("benchmark models")
    sections.append(model_section(images, args.optimal_models))
    log("optimum")
    sections.append(optimal_section(images, args.optimal_time_limit))
    intro = INTRODUCTION.format(
        date=datetime.date.today().isoformat(),
        machine=machine(),
        minutes=(time.perf_counter() - start) / 60,
        time_limit=args.optimal_time_limit,
    )
    args.output.write_text("\n".join([intro, *sections]).rstrip() + "\n")
    log(f"wrote {args.output} in {(time.perf_counter() - start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
