"""What a call leaves behind: the caller's arrays as they were, and no device
array of its own but its outputs."""

from __future__ import annotations

import gc
from typing import Any, Sequence

import jax
import numpy as np


def live_ids() -> set[int]:
    """The ids of the live device arrays, after a collection."""
    gc.collect()
    return {id(a) for a in jax.live_arrays()}


def assert_intact_and_released(leaves: Sequence[Any], copies: Sequence[np.ndarray], outputs: Any, before: set[int]) -> None:
    """`leaves` (the caller's arrays) undeleted and equal to their `copies`,
    and no array live but those live `before` and the `outputs`' leaves."""
    for x, c in zip(leaves, copies):
        assert not x.is_deleted()
        np.testing.assert_array_equal(np.asarray(x), c)
    kept = {id(g) for g in jax.tree_util.tree_leaves(outputs)}
    assert live_ids() - before - kept == set()
