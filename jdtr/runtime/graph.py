"""The DTR vocabulary: storages, tensors and operators (paper App. C.1).

A *storage* is a buffer of device memory; a *tensor* is a view of a storage;
an *operator* is a pure function from tensors to tensors with a compute cost.
Every storage has exactly one *root* tensor whose parent operator computes its
contents; other tensors viewing it are aliases (size 0).

These classes hold metadata only. The buffers themselves are opaque handles
owned by a backend (a `jax.Array` on a device, or nothing in simulation).
"""

from __future__ import annotations

from typing import Any, Optional


class Operator:
    """A call `outputs = op(inputs)` that the runtime can replay.

    Invariant: an operator is pure, so replaying it on the same inputs
    rebuilds the same outputs. Operators with effects are marked
    `replayable=False`; their outputs are pinned instead of evicted.
    """

    __slots__ = ("id", "name", "inputs", "outputs", "cost", "payload", "replayable", "source", "workspace")

    def __init__(
        self,
        id: int,
        name: str,
        inputs: tuple["Tensor", ...],
        cost: float,
        payload: Any = None,
        replayable: bool = True,
        source: Optional[object] = None,  # its str is the user's source line
        workspace: int = 0,
    ):
        self.id = id
        self.name = name
        self.inputs = inputs
        self.outputs: list[Tensor] = []
        self.cost = cost
        self.payload = payload  # what the backend needs to run it (an executable)
        self.replayable = replayable
        self.source = source  # where the user wrote it, for error messages
        self.workspace = workspace  # bytes it takes while it runs, beside its outputs (XLA's temporaries)

    def __repr__(self) -> str:
        return f"Operator({self.id}, {self.name!r}, cost={self.cost})"


class Storage:
    """A buffer of `size` bytes and the metadata DTR's heuristics read.

    Evictable iff resident, unlocked and not pinned (App. C.1).
    """

    __slots__ = (
        "id",
        "size",
        "root",
        "tensors",
        "resident",
        "locks",
        "pinned",
        "refs",
        "last_access",
        "cost",
        "deps",
        "dependents",
        "banished",
        "external",
        "heuristic_state",
    )

    def __init__(self, id: int, size: int):
        self.id = id
        self.size = size
        self.root: Optional[Tensor] = None
        self.tensors: list[Tensor] = []
        self.resident = False
        self.locks = 0
        self.pinned = False
        self.refs = 0  # external references: sum of refs over its tensors
        self.last_access = 0.0
        self.cost = 0.0  # App. C.2: sum of the costs of the ops of its tensors
        self.deps: list[Storage] = []  # storages its tensors' operators read
        self.dependents: list[Storage] = []  # storages whose operators read this one
        self.banished = False
        self.external = False  # owned by the caller: never freed by the runtime
        self.heuristic_state: Any = None  # e.g. the union-find node of h_DTR^eq

    @property
    def evictable(self) -> bool:
        return self.resident and self.locks == 0 and not self.pinned

    @property
    def is_constant(self) -> bool:
        return self.root is None or self.root.op is None

    def __repr__(self) -> str:
        state = "resident" if self.resident else ("banished" if self.banished else "evicted")
        return f"Storage({self.id}, {self.size}B, {state}, locks={self.locks}, refs={self.refs})"


class Tensor:
    """A view of a storage, produced by `op` as its `index`-th output.

    `defined` models App. C.1: a tensor is usable when its storage is resident
    and its parent operator has run since the storage last became resident.
    """

    __slots__ = ("id", "storage", "op", "index", "refs", "defined", "buffer", "name")

    def __init__(self, id: int, storage: Storage, op: Optional[Operator], index: int, name: Optional[str] = None):
        self.id = id
        self.storage = storage
        self.op = op
        self.index = index
        self.refs = 0
        self.defined = False
        self.buffer: Any = None
        self.name = name

    @property
    def is_alias(self) -> bool:
        return self.storage.root is not self

    @property
    def size(self) -> int:
        return 0 if self.is_alias else self.storage.size

    def __repr__(self) -> str:
        return f"Tensor({self.name or self.id}, {self.storage!r})"
