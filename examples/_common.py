"""What the examples share: the budget argument, a progress bar, the final report.

Each example is a script (`python examples/NAME.py --help`) and a module whose
`main(argv) -> float` the tests call; both find this module next to them.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Union

import numpy as np

from jdtr import Stats
from jdtr.runtime import format_bytes


def parse_budget(text: str) -> Union[float, int, str]:
    """A fraction ("0.4", "1"), bytes ("65536") or a size string ("64MiB")."""
    try:
        value = float(text)
    except ValueError:
        return text  # a size string: jdtr validates it
    if value <= 1.0:
        return value
    return int(value) if value.is_integer() else text


def add_budget_argument(parser: argparse.ArgumentParser, default: Union[float, str] = 0.4) -> None:
    parser.add_argument(
        "--budget",
        type=parse_budget,
        default=default,
        help="a fraction of the step's unconstrained peak (0.4), or bytes (65536, '64MiB')",
    )


class Progress:
    """A one-line progress bar over training steps, on stderr."""

    def __init__(self, total: int, width: int = 30):
        self.total, self.width = total, width
        self.start = time.perf_counter()

    def __call__(self, step: int, **values: float) -> None:
        done = int(self.width * step / max(self.total, 1))
        rate = step / max(time.perf_counter() - self.start, 1e-9)
        shown = " ".join(f"{name} {value}" if isinstance(value, int) else f"{name} {value:.4f}" for name, value in values.items())
        sys.stderr.write(f"\r[{'#' * done}{'.' * (self.width - done)}] {step}/{self.total} {shown} {rate:.1f} steps/s")
        if step == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


class BudgetMeter:
    """Collects the `jdtr.Stats` of every step for the final report."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self.unconstrained_peak_bytes = 0
        self.overheads: list[float] = []
        self.evictions: list[int] = []
        self.rematerializations: list[int] = []
        self.last: Optional[Stats] = None

    def add(self, stats: Stats) -> None:
        self.peak_bytes = max(self.peak_bytes, stats.peak_bytes)
        self.unconstrained_peak_bytes = max(self.unconstrained_peak_bytes, stats.unconstrained_peak_bytes)
        self.overheads.append(stats.overhead)
        self.evictions.append(stats.evictions)
        self.rematerializations.append(stats.rematerializations)
        self.last = stats

    def report(self) -> str:
        """'peak A <= budget B (unconstrained C), overhead D (...)', means over the steps; checks the budget held."""
        stats = self.last
        if stats is None:
            raise ValueError("no step was measured")
        if self.peak_bytes > stats.budget_bytes:
            raise AssertionError(f"peak {self.peak_bytes} exceeds the budget {stats.budget_bytes}")
        return (
            f"peak {format_bytes(self.peak_bytes)} <= budget {format_bytes(stats.budget_bytes)} "
            f"(unconstrained {format_bytes(self.unconstrained_peak_bytes)}), "
            f"overhead {np.mean(self.overheads):.3f}x ({np.mean(self.evictions):.0f} evictions, "
            f"{np.mean(self.rematerializations):.0f} rematerializations per step)"
        )
