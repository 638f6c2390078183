"""Union-find with a running cost per set, for h_DTR^eq (paper App. C.2).

Each evicted component of the undirected dependency graph is one set; the set
carries the sum of the compute costs of its members. `find` compresses paths
iteratively (no recursion limit on long chains of evictions).
"""

from __future__ import annotations

from typing import Optional


class CostSet:
    """A union-find node; only a root's `cost` and `floor` are meaningful. A
    root has no parent (not itself: a node pointing at itself is a reference
    cycle, left to Python's cycle collector; a simulation makes thousands).

    `floor` is a bound at most `cost` that a heuristic may file index keys
    with (`DTREqClass`): while the cost stays above it, a key that counted
    the floor still bounds the score, so a member leaving the set need not
    refile its neighbours' keys. Unions add floors as they add costs; the
    heuristic lowers a floor the cost has fallen under."""

    __slots__ = ("parent", "rank", "cost", "floor")

    def __init__(self, cost: float = 0.0):
        self.parent: Optional[CostSet] = None
        self.rank = 0
        self.cost = cost
        self.floor = cost  # (a new set's keys are exact)


def find(node: CostSet) -> CostSet:
    root = node
    while root.parent is not None:
        root = root.parent
    while node is not root and node.parent is not root:  # path compression
        node.parent, node = root, node.parent
    return root


def union(a: CostSet, b: CostSet) -> CostSet:
    """Merges the sets of `a` and `b`; returns the new root, whose cost (and floor) is the sum."""
    ra, rb = find(a), find(b)
    if ra is rb:
        return ra
    if ra.rank < rb.rank:
        ra, rb = rb, ra
    rb.parent = ra
    if ra.rank == rb.rank:
        ra.rank += 1
    ra.cost += rb.cost
    ra.floor += rb.floor
    return ra
