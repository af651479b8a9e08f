"""The memory plan: every value a step computes gets a slice of one preallocated arena.

Liveness is [step that writes it, last step that reads it] (a view keeps its parent alive);
buffers are placed greedy best-fit by size, largest first, at the lowest offset that no
live-overlapping buffer uses, 64-byte aligned. An elementwise kernel may write its output
into a dying input's buffer (in place). `lower_bound` is the largest total size of buffers
live at one step: no plan can be smaller, and `peak / lower_bound` says how close this is."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Buffer", "MemoryPlan", "plan_memory", "ALIGN", "SharedArena", "aligned_arena",
           "aligned_empty"]

ALIGN = 64


@dataclass
class Buffer:
    """One planned allocation: value key, size in bytes, live steps [first, last], offset."""

    key: object
    nbytes: int
    first: int
    last: int
    offset: int = -1
    shares: list = field(default_factory=list)  # keys written in place into this buffer


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class MemoryPlan:
    buffers: list[Buffer]
    peak: int
    lower_bound: int

    @property
    def ratio(self) -> float:
        return self.peak / self.lower_bound if self.lower_bound else 1.0

    def offset_of(self, key) -> tuple[int, int]:
        for b in self.buffers:
            if b.key == key or key in b.shares:
                return b.offset, b.nbytes
        raise KeyError(key)

    def summary(self) -> str:
        naive = sum(_align(b.nbytes) for b in self.buffers)
        shared = sum(len(b.shares) for b in self.buffers)
        return (f"arena {self.peak / 2**20:.2f} MiB for {len(self.buffers)} buffers "
                f"({naive / 2**20:.2f} MiB unshared; liveness lower bound "
                f"{self.lower_bound / 2**20:.2f} MiB, ratio {self.ratio:.3f}; "
                f"{shared} in-place)")

    def __str__(self) -> str:
        lines = [self.summary(), f"  {'offset':>12} {'bytes':>12}  steps      value"]
        for b in sorted(self.buffers, key=lambda b: b.offset):
            also = f" (+ in place: {', '.join(map(str, b.shares))})" if b.shares else ""
            lines.append(f"  {b.offset:12d} {b.nbytes:12d}  {b.first:4d}-{b.last:<4d}  "
                         f"{b.key}{also}")
        return "\n".join(lines)


def plan_memory(buffers: list[Buffer]) -> MemoryPlan:
    """Place `buffers` (key, nbytes, first, last) in one arena; fills in offsets."""
    placed: list[Buffer] = []
    for b in sorted(buffers, key=lambda b: (-b.nbytes, b.first)):
        size = _align(max(b.nbytes, 1))
        conflicts = sorted((p.offset, p.offset + _align(max(p.nbytes, 1))) for p in placed
                           if p.first <= b.last and b.first <= p.last)
        offset = 0
        best = None
        for lo, hi in conflicts:  # best fit: the smallest gap that holds it
            if lo - offset >= size and (best is None or lo - offset < best[1]):
                best = (offset, lo - offset)
            offset = max(offset, hi)
        b.offset = best[0] if best is not None else offset
        placed.append(b)
    peak = max((b.offset + _align(max(b.nbytes, 1)) for b in placed), default=0)
    return MemoryPlan(placed, peak, _lower_bound(placed))


def _lower_bound(buffers: list[Buffer]) -> int:
    events: dict[int, int] = {}
    for b in buffers:
        size = _align(max(b.nbytes, 1))
        events[b.first] = events.get(b.first, 0) + size
        events[b.last + 1] = events.get(b.last + 1, 0) - size
    live = best = 0
    for t in sorted(events):
        live += events[t]
        best = max(best, live)
    return best


def aligned_arena(nbytes: int) -> np.ndarray:
    """A fresh uint8 buffer of `nbytes` whose start is ALIGN-byte aligned."""
    return aligned_empty(nbytes, np.uint8)


def aligned_empty(count: int, dtype) -> np.ndarray:
    """A fresh 1-D array of `count` elements of `dtype` whose start is ALIGN-byte aligned
    (NumPy aligns to 16 bytes: a packed weight at 16 mod 64 splits every 64-byte tile row
    over two cache lines, and AMX tile loads ran ~1.3-1.7x slower on such weights)."""
    dtype = np.dtype(dtype)
    raw = np.empty(count * dtype.itemsize + ALIGN, dtype=np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + count * dtype.itemsize].view(dtype)


class SharedArena:
    """One arena for programs that never run at the same time (a training step's forward and
    backward): each program plans on its own and takes the first `peak` bytes of this buffer.
    A larger plan grows the buffer; programs built before it keep the old one (still correct,
    no longer shared), so build the largest program first."""

    def __init__(self) -> None:
        self.buffer: np.ndarray = aligned_arena(0)
        self.takers = 0

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes > self.buffer.nbytes:
            self.buffer = aligned_arena(nbytes)
        self.takers += 1
        return self.buffer[:nbytes]
