"""The model of XLA's GPU allocator (`offline/bfc.py`): its rules, each
against the bytes XLA's BFC allocator would count, and its peak over a
straight line against the line's own count."""

from __future__ import annotations

import random

import pytest

from jdtr.offline import Compute, Free, StraightLine
from jdtr.offline.bfc import MAX_WASTE, BestFitAllocator, allocator_peak

MiB = 1 << 20


def _with_hole(size: int):
    """An allocator holding a free block of `size` bytes between two blocks in use."""
    allocator = BestFitAllocator()
    hole = allocator.allocate(size)
    allocator.allocate(MiB)  # keeps the hole from merging into the rest of the region
    allocator.free(hole)
    return allocator, hole


def test_requests_are_rounded_to_256_bytes_and_blocks_are_counted_whole():
    allocator = BestFitAllocator()
    a = allocator.allocate(1000)
    assert allocator.bytes_in_use == 1024 and allocator.allocate(0) is None
    allocator.free(a)
    assert allocator.bytes_in_use == 0 and allocator.peak_bytes == 1024


def test_a_block_less_than_twice_the_request_is_handed_out_whole():
    allocator, hole = _with_hole(MiB)
    assert allocator.allocate(600 * 1024) == hole and allocator.bytes_in_use == 2 * MiB  # not split: 1 MiB < 1.2 MiB
    allocator, hole = _with_hole(MiB)
    assert allocator.allocate(512 * 1024) == hole and allocator.bytes_in_use == MiB + 512 * 1024  # split: exactly twice


def test_a_request_takes_the_smallest_block_of_its_bin_and_up():
    allocator = BestFitAllocator()
    big = allocator.allocate(4 * MiB)
    allocator.allocate(256)
    mid = allocator.allocate(3 * MiB // 2)
    allocator.allocate(256)
    allocator.free(big)
    allocator.free(mid)
    in_use = allocator.bytes_in_use
    assert allocator.allocate(MiB) == mid and allocator.bytes_in_use == in_use + 3 * MiB // 2  # not the 4 MiB, nor the rest


def test_far_more_than_the_request_is_split_whatever_the_ratio():
    allocator, hole = _with_hole(MAX_WASTE + 400 * MiB)
    allocator.allocate(400 * MiB)  # the rest is MAX_WASTE or more: split, though under twice the request
    assert allocator.bytes_in_use == MiB + 400 * MiB
    allocator, hole = _with_hole(300 * MiB)
    allocator.allocate(200 * MiB)  # 100 MiB more, under twice: whole
    assert allocator.bytes_in_use == MiB + 300 * MiB


def test_freed_neighbours_merge_back_into_one_block():
    allocator = BestFitAllocator()
    blocks = [allocator.allocate(size) for size in (MiB, 3 * MiB, 2 * MiB, 5 * MiB)]
    for block in (blocks[1], blocks[3], blocks[0], blocks[2]):
        allocator.free(block)
    assert allocator.bytes_in_use == 0
    assert allocator.allocate(11 * MiB) == blocks[0]  # the first address again: the region is one block
    assert sum(len(b) for b in allocator._bins) == 1


def test_a_lines_peak_counts_the_blocks_it_was_handed():
    """Two 1 MiB activations, the first freed; a 600 KiB value then fills its
    hole whole: the model holds 1 MiB where the line counts 600 KiB. A
    workspace is held while its computation runs, then given back."""
    sizes = [MiB, MiB, 600 * 1024, 8 * 1024]
    steps = [Compute("a", (), (0,), False), Compute("b", (0,), (1,), False), Free(0),
             Compute("c", (1,), (2,), False), Compute("d", (2,), (3,), False, workspace=3 * MiB)]
    line = StraightLine(arguments=(), externals={}, steps=steps, outputs=(3,), sizes=sizes)
    counted = max(r + (s.workspace if isinstance(s, Compute) else 0) + sum(sizes[o] for o in getattr(s, "outputs", ()))
                  for r, s in zip(line.resident_before(), steps))
    assert counted == MiB + 600 * 1024 + 8 * 1024 + 3 * MiB
    assert allocator_peak(line) == 2 * MiB + 8 * 1024 + 3 * MiB


@pytest.mark.parametrize("seed", range(5))
def test_the_model_holds_at_least_what_a_line_counts(seed):
    """Random lines of computations and frees: the model's peak is at least
    the line's count at its peak (rounded up to 256 bytes a buffer), and
    every block is given back when every buffer is."""
    rng = random.Random(seed)
    sizes, alive, steps = [], [], []
    for _ in range(300):
        if alive and rng.random() < 0.45:
            steps.append(Free(alive.pop(rng.randrange(len(alive)))))
        else:
            sizes.append(rng.choice([rng.randrange(1, 4096), rng.randrange(1, 4 * MiB)]))
            steps.append(Compute("op", (), (len(sizes) - 1,), False, workspace=rng.choice([0, 0, rng.randrange(1, MiB)])))
            alive.append(len(sizes) - 1)
    steps += [Free(slot) for slot in alive]
    line = StraightLine(arguments=(), externals={}, steps=steps, outputs=(), sizes=sizes)
    rounded = [-(-size // 256) * 256 for size in sizes]
    held = peak = 0
    for step in steps:
        if isinstance(step, Compute):
            held += rounded[step.outputs[0]]
            peak = max(peak, held + -(-step.workspace // 256) * 256)
        else:
            held -= rounded[step.slot]
    assert allocator_peak(line) >= peak
    allocator = BestFitAllocator()
    blocks = {}
    for step in steps:
        if isinstance(step, Compute):
            blocks[step.outputs[0]] = allocator.allocate(sizes[step.outputs[0]])
        else:
            allocator.free(blocks.pop(step.slot))
    assert allocator.bytes_in_use == 0 and sum(len(b) for b in allocator._bins) == 1
