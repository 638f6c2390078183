"""Budgets: bytes, sizes with units, or a fraction of the unconstrained peak."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional, Union

BudgetLike = Union[int, float, str, None]

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*|%)\s*$")


@dataclass(frozen=True)
class Budget:
    """Either absolute bytes or a fraction of the computation's unconstrained peak."""

    nbytes: Optional[int] = None
    fraction: Optional[float] = None

    def resolve(self, unconstrained_peak: int) -> int:
        if self.nbytes is not None:
            return self.nbytes
        return max(int(math.floor(self.fraction * unconstrained_peak)), 1)

    def __str__(self) -> str:
        return f"{self.nbytes} bytes" if self.nbytes is not None else f"{self.fraction:g} of the unconstrained peak"


def parse_budget(budget: BudgetLike, name: str = "budget") -> Budget:
    """Validates a budget.

    Accepts an int (bytes), a string with a unit ("512MiB", "2GB", "1.5 GiB";
    KB/MB/GB are powers of 10, KiB/MiB/GiB powers of 2), a float in (0, 1] (a
    fraction of the unconstrained peak), a percentage string in (0%, 100%]
    (the same fraction: "50%" is 0.5) or None (no constraint: 1.0); a NumPy
    or JAX scalar as its Python value.
    """
    if budget is None:
        return Budget(fraction=1.0)
    if not isinstance(budget, (int, float, str)) and getattr(budget, "shape", None) == () and hasattr(budget, "item"):
        # A NumPy or JAX scalar (np.float32(0.5), jnp.float32(0.5), np.int64(2**30)): its Python value.
        return parse_budget(budget.item(), name)
    if isinstance(budget, bool):
        raise TypeError(f"{name} must be bytes (int), a size string like '512MiB' or a fraction in (0, 1]; got {budget!r}")
    if isinstance(budget, int) or (hasattr(budget, "__index__") and not isinstance(budget, float)):
        nbytes = int(budget.__index__())
        if nbytes <= 0:
            raise ValueError(f"{name} must be a positive number of bytes; got {nbytes}")
        return Budget(nbytes=nbytes)
    if isinstance(budget, float):
        if not math.isfinite(budget) or not 0.0 < budget <= 1.0:
            raise ValueError(
                f"a float {name} is a fraction of the unconstrained peak and must lie in (0, 1]; got {budget!r} "
                "(pass an int for bytes, or a string like '2GiB')"
            )
        return Budget(fraction=float(budget))
    if isinstance(budget, str):
        match = _PATTERN.match(budget)
        if match is not None and match.group(2) == "%":
            percent = float(match.group(1))
            if not 0.0 < percent <= 100.0:
                raise ValueError(f"a percentage {name} is of the unconstrained peak and must lie in (0%, 100%]; got {budget!r}")
            return Budget(fraction=percent / 100.0)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(
                f"cannot read {name} {budget!r}: expected a number and a unit among "
                "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. '512MiB'), or a percentage of the unconstrained "
                "peak (e.g. '50%')"
            )
        nbytes = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
        if nbytes <= 0:
            raise ValueError(f"{name} must be positive; got {budget!r}")
        return Budget(nbytes=nbytes)
    raise TypeError(f"{name} must be bytes (int), a size string like '512MiB' or a fraction in (0, 1]; got {budget!r}")
