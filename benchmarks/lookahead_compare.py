"""`lookahead` against h_DTR^eq (`dtr_eq`) on every log we have.

The logs: the DTR prototype's ResNet-32 and U-Net logs (shared/dtr-logs) and
logs of jdtr's reference models (`jdtr.models`), recorded by running each
model's value-and-grad in simulation (`jdtr.trace`: the default cost model's
nanoseconds, sizes in bytes). Each log is simulated at budget ratios 1.0 down
to 0.1 in steps of 0.05 with both heuristics (eager eviction, overhead limit
2x, as the paper's simulator), and summarised: the lowest ratio that passes,
and the overhead where both pass.

    python benchmarks/lookahead_compare.py --output docs/lookahead_table.md
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from jdtr import models
from jdtr.simulator import SimResult, sweep
from jdtr.oplog import Trace

RATIOS = tuple(round(1.0 - 0.05 * i, 2) for i in range(19))
HEURISTICS = ("dtr_eq", "lookahead")
LOGS = Path(__file__).resolve().parents[2] / "shared" / "dtr-logs"


def model_logs() -> dict[str, Trace]:
    """Logs of `jdtr.models`, small enough to record in seconds on a CPU."""
    try:
        from jdtr import trace as record
    except ImportError:  # before `jdtr.trace` existed
        record = None
    chosen = [
        models.mlp_chain(layers=32, width=256, batch=512),
        models.resnet(blocks=4, channels=16, image=16, batch=8),
        models.transformer(blocks=4, dim=64, heads=4, seq=32, batch=4),
        models.rnn(steps=32, hidden=64, features=16, batch=8),
    ]
    logs = {}
    for model in chosen:
        if record is None:
            raise SystemExit("jdtr.trace is needed to record the models' logs")
        logs[model.name] = record(model.loss, model.params, model.batch)
    return logs


def cell(result: SimResult) -> str:
    if result.ok:
        return f"{result.overhead:.4f}"
    return "OOM" if result.status == "oom" else "thrash"


def lowest_passing(results: Sequence[SimResult]) -> Optional[float]:
    """The lowest ratio at which the run passes (the sweep goes down from 1.0)."""
    passing = [r.budget_ratio for r in results if r.ok]
    return min(passing) if passing else None


def compare(name: str, trace: Trace) -> tuple[str, dict]:
    results = sweep(trace, RATIOS, HEURISTICS)
    rows = {h: results[i * len(RATIOS) : (i + 1) * len(RATIOS)] for i, h in enumerate(HEURISTICS)}
    eq, la = rows["dtr_eq"], rows["lookahead"]
    both = [(e.overhead, l.overhead) for e, l in zip(eq, la) if e.ok and l.ok]
    lost = [f"{ratio:g}" for ratio, e, l in zip(RATIOS, eq, la) if e.ok and not l.ok]
    worst = max((l / e - 1 for e, l in both), default=0.0)
    wins = sum(l < e for e, l in both) + sum(l.ok and not e.ok for e, l in zip(eq, la))
    ties = sum(l == e for e, l in both)
    geo = {h: math.exp(sum(math.log(p[i]) for p in both) / len(both)) if both else math.nan for i, h in enumerate(HEURISTICS)}
    low = {h: lowest_passing(rows[h]) for h in HEURISTICS}
    calls = sum(1 for record in trace.records if type(record).__name__ in ("Call", "Mutate"))
    header = "| heuristic | " + " | ".join(f"{r:g}" for r in RATIOS) + " |"
    table = [header, "|---" * (len(RATIOS) + 1) + "|"]
    for h in HEURISTICS:
        table.append(f"| {h} | " + " | ".join(cell(r) for r in rows[h]) + " |")
    summary = {
        "log": name,
        "ops": calls,
        "low": low,
        "geo": geo,
        "wins": wins,
        "ties": ties,
        "losses": sum(l > e for e, l in both) + len(lost),
        "worst": worst,
        "lost": lost,
    }
    text = f"### {name} ({calls} operators)\n\n" + "\n".join(table) + "\n"
    return text, summary


def verdict(s: dict) -> str:
    eq_low, la_low = s["low"]["dtr_eq"], s["low"]["lookahead"]
    lower = la_low is not None and (eq_low is None or la_low < eq_low)
    cheaper = s["geo"]["lookahead"] < s["geo"]["dtr_eq"]
    bad = s["worst"] > 0.02 or s["lost"]
    if bad:
        return "worse"
    return "better" if lower or cheaper else "not better"


def fmt_ratio(r: Optional[float]) -> str:
    return f"{r:.2f}" if r is not None else "none"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", help="write the tables (markdown) to this file")
    parser.add_argument("--no-models", action="store_true", help="only the shared logs")
    args = parser.parse_args(argv)
    started = time.time()
    logs: dict[str, Trace] = {}
    for name in ("resnet32-56.log", "unet-6.log"):
        if (LOGS / name).is_file():
            logs[name] = Trace.from_log(LOGS / name)
    if not args.no_models:
        logs.update(model_logs())
    sections, summaries = [], []
    for name, trace in logs.items():
        text, summary = compare(name, trace)
        print(text, flush=True)
        sections.append(text)
        summaries.append(summary)
    lines = [
        "| log | operators | lowest passing ratio: dtr_eq / lookahead | geometric mean overhead where both pass: "
        "dtr_eq / lookahead | lookahead lower / equal / higher or failing | worst excess of lookahead | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        worst = f"{100 * s['worst']:+.2f}%" + (f", fails at {', '.join(s['lost'])}" if s["lost"] else "")
        lines.append(
            f"| {s['log']} | {s['ops']} | {fmt_ratio(s['low']['dtr_eq'])} / {fmt_ratio(s['low']['lookahead'])} | "
            f"{s['geo']['dtr_eq']:.4f} / {s['geo']['lookahead']:.4f} | {s['wins']} / {s['ties']} / {s['losses']} | "
            f"{worst} | {verdict(s)} |"
        )
    summary = "\n".join(lines)
    print(summary)
    if args.output:
        Path(args.output).write_text(
            f"Measured {datetime.date.today().isoformat()} on {machine()} by "
            f"`python benchmarks/lookahead_compare.py` ({time.time() - started:.0f} s).\n\n"
            f"{summary}\n\n" + "\n".join(sections),
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
