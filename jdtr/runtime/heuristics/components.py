"""h_DTR^eq's evicted components: union-find sets with a running cost (App. C.2)."""

from __future__ import annotations

from ..graph import Storage
from ..union_find import CostSet, find, union
from .base import IndexedHeuristic, RunView
from .regions import live_evicted


class ComponentHeuristic(IndexedHeuristic):
    """Evicted storages grouped in union-find sets with a running cost (App. C.2).

    Evicting S makes a set holding cost(S) and merges the sets of S's evicted
    neighbours; rematerializing S subtracts cost(S) from its set and detaches
    S (the splitting approximation: the set itself is not split, so
    "phantom" links remain). A resident storage has no set.

    For the index, each set also lists the resident storages next to its
    members (its *frontier*): when the set loses a member, their scores may
    drop, so they are touched. Sets only grow, so every resident storage whose
    evicted neighbourhood contains a storage is on the frontier of that
    storage's set. The frontier may also hold residents no longer next to the
    set (their neighbour rematerialized): touching them refiles a key that
    was already right, and they leave once evicted.

    A heuristic whose keys count each set by its `floor` (`keys_count_floors`)
    is spared most of those touches: only a member's leaving that takes the
    cost under the floor touches the frontier, and puts the floor
    `floor_slack` of the cost under it. On a deep model's plan the evicted
    storages of many layers end up in one set (sets never split), and
    touching its frontier at every rematerialization (a refile each) took
    most of a simulation's time.
    """

    # How far under its cost a set's floor is put when the cost falls under
    # it (a set starts with its floor at its cost, so the keys of sets that
    # never lose a member are exact): looser keys (an index scores more
    # candidates per choice) against fewer refiles.
    floor_slack = 0.0

    def keys_count_floors(self) -> bool:
        """Whether this heuristic's index keys count a set by its floor, not its cost."""
        return False

    def attach(self, run: RunView) -> None:
        super().attach(run)
        self._frontier: dict[CostSet, list[Storage]] = {}
        # Whether a set has cost less than nothing in this run (see `on_evict`):
        # until then a storage's own cost bounds its numerator from below.
        self.negative_sets = False

    def detach(self) -> None:
        super().detach()
        self._frontier = {}

    def on_evict(self, storage: Storage) -> None:
        node = CostSet(storage.cost)
        storage.heuristic_state = node
        neighbors = (*storage.deps, *storage.dependents)
        self.read_metadata(len(neighbors))
        if self._index is None:
            for neighbor in neighbors:
                if neighbor.heuristic_state is not None and live_evicted(neighbor):
                    node = union(neighbor.heuristic_state, node)
            return
        lists, negative = [], False
        for neighbor in neighbors:
            if neighbor.heuristic_state is not None and live_evicted(neighbor):
                root = find(neighbor.heuristic_state)
                negative = negative or root.cost < 0
                members = self._frontier.pop(root, None)
                if members:
                    lists.append(members)
                node = union(neighbor.heuristic_state, node)
        lists.sort(key=len)
        frontier = lists.pop() if lists else []
        for members in lists:
            frontier.extend(members)
        frontier.extend(n for n in neighbors if n.resident)
        if frontier:
            self._frontier[find(node)] = frontier
        if negative:
            # A set can cost less than nothing (a view charged to a storage while
            # it was evicted is subtracted when it returns): merging it lowers scores.
            for resident in dict.fromkeys(frontier):
                if resident.resident:
                    self.touch(resident)

    def on_rematerialize(self, storage: Storage) -> None:
        node = storage.heuristic_state
        if node is not None:
            root = find(node)
            root.cost -= storage.cost
            if root.cost < 0:
                self.negative_sets = True
            storage.heuristic_state = None
            if self._index is not None:
                self._lost_member(storage, root)
        if self._index is not None:  # now resident next to its evicted neighbours' sets
            for neighbor in (*storage.deps, *storage.dependents):
                if neighbor.heuristic_state is not None and live_evicted(neighbor):
                    self._frontier.setdefault(find(neighbor.heuristic_state), []).append(storage)

    def on_banish(self, storage: Storage) -> None:
        if self._index is not None and storage.heuristic_state is not None:
            self._lost_member(storage, find(storage.heuristic_state))

    def _lost_member(self, storage: Storage, root: CostSet) -> None:
        """`storage` left the evicted storages of `root`'s set: touch the
        resident storages that may have counted it (its own neighbours, and
        the set's frontier unless the keys count a floor still under the cost)."""
        for neighbor in (*storage.deps, *storage.dependents):
            if neighbor.resident:
                self.touch(neighbor)
        if self.keys_count_floors():
            if root.cost >= root.floor:
                # Every key that counted this set still bounds its score. The
                # frontier is left as it is (its evicted members too) until the
                # floor drops: it only grows by the rematerializations next to it.
                return
            root.floor = root.cost - self.floor_slack * abs(root.cost)
        members = self._frontier.pop(root, None)
        if not members:
            return
        # Every resident member is touched, without checking that it is still
        # next to the set: on a TreeLSTM's large evicted components 99% are,
        # and the check (each member's neighbours, each found in its set) cost
        # more than the few needless touches, which only refile a key.
        # Members evicted since they joined leave here.
        kept = [resident for resident in dict.fromkeys(members) if resident.resident]
        self.touch_all(kept)
        self.read_metadata(len(members))
        if kept:
            self._frontier[root] = kept
