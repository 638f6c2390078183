"""Theorem 3.1, measured: operations / N on the linear network at budget 2⌈√N⌉.

The network of the paper's App. A (and tests/test_theorem31.py): N unit-cost,
unit-size forward layers and their N backward operations, each value released
after its last use, replayed by `jdtr.simulate` at a budget of 2⌈√N⌉ units
plus one for the pinned input. The theorem says h_e* needs O(N) operations;
this script measures the constant for h_e*, h_DTR^eq and the lookahead
heuristic, and plots operations / N against N.

    python benchmarks/theorem31.py --output docs/heuristics_theorem31.md --plot docs/images/theorem31.png
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time
from typing import Optional

import jdtr
from eviction_cost import chain_trace

SIZES = (100, 178, 316, 562, 1000, 1778, 3162, 5623, 10_000)
HEURISTICS = ("estar", "dtr_eq", "lookahead")


def operations(n: int, heuristic: str) -> float:
    """Total operations (forward, backward and rematerializations) over N."""
    budget = 2 * math.ceil(math.sqrt(n)) + 1
    result = jdtr.simulate(chain_trace(n), budget, heuristic=heuristic, overhead_limit=None)
    if result.status != "ok":
        return math.nan
    return (2 * n + result.rematerializations) / n


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--output", help="write the table (markdown) to this file")
    parser.add_argument("--plot", help="write the plot (PNG) to this file")
    args = parser.parse_args(argv)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))
    started = time.time()
    rows = {h: [operations(n, h) for n in args.sizes] for h in HEURISTICS}
    header = "| heuristic \\ N | " + " | ".join(f"{n:,}" for n in args.sizes) + " | max |"
    lines = [header, "|---" * (len(args.sizes) + 2) + "|"]
    for h, values in rows.items():
        lines.append(f"| {h} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {max(values):.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.6))
        for h, values in rows.items():
            ax.plot(args.sizes, values, marker="o", label=h)
        ax.set_xscale("log")
        ax.set_xlabel("N (layers)")
        ax.set_ylabel("operations / N")
        ax.set_title("Linear network at budget 2⌈√N⌉ (Theorem 3.1)")
        ax.axhline(2, color="grey", lw=0.8, ls=":")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    if args.output:
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(
                f"Measured {datetime.date.today().isoformat()} on {machine} by "
                f"`python benchmarks/theorem31.py` ({time.time() - started:.0f} s).\n\n{table}\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
