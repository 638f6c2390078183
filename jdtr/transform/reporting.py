"""What a run reports: the `jdtr.Stats` fields its counters give, planned or online alike."""

from __future__ import annotations

from typing import Any, Optional

from ..runtime import Counters
from .costs import NANOSECOND


def report_of(
    counters: Counters, heuristic: str, wall_time_s: float, timeline, baseline_cost: Optional[float] = None
) -> dict[str, Any]:
    """The `Stats` fields a run's counters give (planned or online alike).
    Under a scan strategy, the baseline is the program as JAX differentiates
    it, and what the strategy recomputes counts as rematerialization."""
    base = counters.base_cost if baseline_cost is None else baseline_cost
    total = counters.base_cost + counters.remat_cost
    return dict(
        **counters.totals(),
        pinned_bytes=counters.pinned_bytes,
        base_cost=base * NANOSECOND,
        remat_cost=(total - base) * NANOSECOND,
        overhead=total / base if base > 0 else counters.overhead,
        wall_time_s=wall_time_s,
        heuristic=heuristic,
        timeline=timeline or None,
    )
