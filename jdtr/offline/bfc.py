"""The bytes a GPU's allocator holds for a straight line, by a model of it.

jdtr counts the bytes of the buffers a run holds. XLA's allocator on a GPU
(the BFC allocator: best fit with coalescing) counts the blocks it handed
out, and a block can be larger than the request: it serves a request from
the smallest free block that fits, split in two only where the block is at
least twice the request (or the rest is 128 MiB or more); otherwise the
whole block is in use. So the bytes in use depend on the order of
allocations and frees, which a plan made by counting does not see: on an
H200 and an H100, runs that kept budgets of 0.5-0.3 by count held 1.5-14%
more by the allocator's count (docs/benchmarks.md).

A plan's run is known before it starts (a `StraightLine`), so that order
is too. `allocator_peak` replays the line on a model of the allocator: the
arguments and constants first (they are on the device before the run), then
for each computation its outputs, one block each, the largest first, then
its workspace (XLA's temporaries, one block, given back when it has run),
and each free. The
model follows XLA's rules (`tsl/framework/bfc_allocator.cc`): requests
rounded up to 256 bytes; free blocks in 21 bins by powers of two from 256
bytes, each ordered by size then address; a request takes the first block
that fits from its own bin up; a freed block merges with free neighbours.
It assumes one region large enough for the run (XLA preallocates most of
the device) that starts empty but for the arguments: what the process
allocated and freed before the call is not known here.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Optional

from .straightline import Compute, Free, StraightLine

MIN_BLOCK = 256  # bytes; every request is rounded up to a multiple of it
BINS = 21  # bin i holds free blocks of [256 << i, 256 << (i + 1)) bytes, the last any larger
MAX_WASTE = 128 << 20  # a block this much larger than the request is split whatever the ratio
REGION = 1 << 50  # one region, larger than any run


def _bin(size: int) -> int:
    return min((size // MIN_BLOCK).bit_length() - 1, BINS - 1)


class BestFitAllocator:
    """XLA's BFC allocator's placement of blocks in one region, and its
    bytes in use (the blocks handed out, whole)."""

    def __init__(self) -> None:
        self._size = {0: REGION}  # block address -> its size
        self._next: dict[int, Optional[int]] = {0: None}
        self._prev: dict[int, Optional[int]] = {0: None}
        self._used: set[int] = set()
        self._bins: list[list[tuple[int, int]]] = [[] for _ in range(BINS)]  # (size, address), sorted
        insort(self._bins[_bin(REGION)], (REGION, 0))
        self.bytes_in_use = 0
        self.peak_bytes = 0

    def allocate(self, nbytes: int) -> Optional[int]:
        """The address of the block that serves `nbytes` (None for no bytes: XLA allocates nothing)."""
        if nbytes <= 0:
            return None
        rounded = -(-nbytes // MIN_BLOCK) * MIN_BLOCK
        for blocks in self._bins[_bin(rounded):]:
            at = bisect_left(blocks, (rounded, -1))
            if at < len(blocks):
                size, address = blocks.pop(at)
                break
        else:  # (the region is larger than any run)
            raise MemoryError(f"no free block of {rounded} bytes")
        if size >= 2 * rounded or size - rounded >= MAX_WASTE:
            rest = address + rounded
            self._size[address], self._size[rest] = rounded, size - rounded
            self._next[rest], self._prev[rest] = self._next[address], address
            if self._next[address] is not None:
                self._prev[self._next[address]] = rest
            self._next[address] = rest
            insort(self._bins[_bin(size - rounded)], (size - rounded, rest))
        self._used.add(address)
        self.bytes_in_use += self._size[address]
        self.peak_bytes = max(self.peak_bytes, self.bytes_in_use)
        return address

    def free(self, address: Optional[int]) -> None:
        """Gives back the block at `address`, merged with free neighbours."""
        if address is None:
            return
        self._used.remove(address)
        self.bytes_in_use -= self._size[address]
        following = self._next[address]
        if following is not None and following not in self._used:
            self._merge(address, following)
        preceding = self._prev[address]
        if preceding is not None and preceding not in self._used:
            self._merge(preceding, address)
            address = preceding
        insort(self._bins[_bin(self._size[address])], (self._size[address], address))

    def _merge(self, first: int, second: int) -> None:
        """Merges free block `second` into `first`, just before it; `second`
        leaves its bin (`first` is taken out of its own, if it is in one)."""
        for block in (first, second):
            blocks = self._bins[_bin(self._size[block])]
            at = bisect_left(blocks, (self._size[block], block))
            if at < len(blocks) and blocks[at] == (self._size[block], block):
                blocks.pop(at)
        self._size[first] += self._size.pop(second)
        after = self._next.pop(second)
        del self._prev[second]
        self._next[first] = after
        if after is not None:
            self._prev[after] = first


def allocator_peak(line: StraightLine, in_use: Optional[list] = None) -> int:
    """The most bytes XLA's allocator would hold for `line`'s run, step by
    step (one dispatch per computation), arguments and constants included;
    the bytes in use after each computation appended to `in_use`, if given."""
    allocator = BestFitAllocator()
    blocks = {slot: allocator.allocate(line.sizes[slot]) for slot in (*line.arguments, *line.externals)}
    for step in line.steps:
        if type(step) is Compute:
            for slot in sorted(step.outputs, key=lambda slot: -line.sizes[slot]):  # XLA's order: the largest first
                blocks[slot] = allocator.allocate(line.sizes[slot])
            allocator.free(allocator.allocate(step.workspace))  # XLA's temporaries, while it runs
            if in_use is not None:
                in_use.append(allocator.bytes_in_use)
        elif type(step) is Free:
            allocator.free(blocks.pop(step.slot))
    return allocator.peak_bytes
