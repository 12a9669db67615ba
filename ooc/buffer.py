"""The partition buffer: at most ``capacity`` partitions of node features resident in host memory.

Nodes are grouped into contiguous id ranges (partitions, ``offsets[p]:offsets[p+1]``).  The buffer
owns one preallocated array of ``capacity`` slots, each big enough for the largest partition, and:

- loads a partition with large sequential reads (``preadv`` into the slot, one call per chunk file);
- prefetches the next partitions of the epoch's schedule on a background I/O thread while the
  current ones are used (double buffering; needs ``capacity >= 2``);
- evicts the resident partition whose next use is furthest away (Belady's rule on the known
  schedule, the same idea as MariusGNN's buffer);
- serves row gathers: rows of resident partitions are copied from the slots (hits), all other rows
  are read from the store with coalesced reads (misses) and counted.

Slot bookkeeping is only touched by the thread that calls :meth:`require` / :meth:`gather`; the I/O
thread writes nothing but the bytes of the slot reserved for it, so no locks are needed.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from numba import njit, prange

from ooc.storage.rawarray import RawArray

__all__ = ["PartitionBuffer", "BufferStats", "contiguous_partitions"]


def contiguous_partitions(num_nodes: int, num_parts: int) -> np.ndarray:
    """int64 [P+1] offsets splitting ``[0, N)`` into ``P`` near-equal contiguous ranges.

    Raises:
        ValueError: ``P < 1`` or ``P > N`` (an empty partition is never created).
    """
    if num_parts < 1:
        raise ValueError(f"need at least 1 partition, got {num_parts}")
    if num_parts > num_nodes:
        raise ValueError(f"{num_parts} partitions for {num_nodes} nodes would leave one empty")
    return np.linspace(0, num_nodes, num_parts + 1).round().astype(np.int64)


@dataclass
class BufferStats:
    """Counters of one epoch (reset by :meth:`PartitionBuffer.reset_stats`).

    ``row_hits`` / ``row_misses`` count gathered rows served from resident partitions / from disk;
    ``bytes_read`` counts partition loads plus miss reads; ``io_wait_s`` is the time callers blocked
    waiting for a partition load.
    """

    bytes_read: int = 0
    partition_loads: int = 0
    row_hits: int = 0
    row_misses: int = 0
    io_wait_s: float = 0.0
    load_s: float = 0.0

    @property
    def hit_ratio(self) -> float:
        total = self.row_hits + self.row_misses
        return self.row_hits / total if total else 1.0

    def as_dict(self) -> dict:
        return {"bytes_read": self.bytes_read, "partition_loads": self.partition_loads,
                "row_hits": self.row_hits, "row_misses": self.row_misses,
                "buffer_hit_ratio": self.hit_ratio, "io_wait_s": self.io_wait_s,
                "load_s": self.load_s}


@njit(cache=True, nogil=True, parallel=True)
def _gather_resident(ids: np.ndarray, offsets: np.ndarray, slot_of: np.ndarray, slot_rows: int,
                     buf: np.ndarray, out: np.ndarray, miss: np.ndarray) -> int:
    """Copy rows of resident partitions into ``out``; flag the others in ``miss``; returns #hits."""
    n = ids.shape[0]
    hits = 0
    for i in prange(n):
        v = ids[i]
        p = np.searchsorted(offsets, v, side="right") - 1
        s = slot_of[p]
        if s >= 0:
            r = s * slot_rows + (v - offsets[p])
            out[i] = buf[r]
            miss[i] = False
            hits += 1
        else:
            miss[i] = True
    return hits


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _as_uint_rows(a: np.ndarray) -> np.ndarray:
    """2-D unsigned-integer view of a C-contiguous array (Numba has no float16; copies are bitwise)."""
    return a.view(_UINT[a.dtype.itemsize]).reshape(a.shape[0], -1)


class PartitionBuffer:
    """Keep at most ``capacity`` feature partitions in memory; load the next ones asynchronously.

    Args:
        features: the on-disk feature array [N, D].
        offsets: int64 [P+1] partition boundaries (contiguous id ranges).
        capacity: number of partition slots, ``1 <= capacity <= P``.
        io_threads: background loader threads (0 = synchronous loads only).

    Raises:
        ValueError: bad capacity or offsets.
    """

    def __init__(self, features: RawArray, offsets: np.ndarray, capacity: int,
                 io_threads: int = 1) -> None:
        self.features = features
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.num_parts = self.offsets.shape[0] - 1
        if self.num_parts < 1 or self.offsets[0] != 0 or self.offsets[-1] != features.shape[0]:
            raise ValueError("partition offsets must run from 0 to the number of nodes")
        if not 1 <= capacity <= self.num_parts:
            raise ValueError(f"buffer capacity {capacity} outside [1, {self.num_parts}]")
        self.capacity = capacity
        sizes = np.diff(self.offsets)
        self.slot_rows = int(sizes.max())
        self.buf = np.empty((capacity * self.slot_rows, *features.shape[1:]), dtype=features.dtype)
        self.slot_of = np.full(self.num_parts, -1, dtype=np.int64)  # resident & loaded
        self.part_in_slot = [-1] * capacity  # reserved (loading or loaded)
        self._loading: dict[int, Future] = {}
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="ooc-io") if io_threads else None
        self.stats = BufferStats()

    @property
    def nbytes(self) -> int:
        """Bytes of the slot memory (the buffer's host-memory footprint)."""
        return int(self.buf.nbytes)

    def part_of(self, ids: np.ndarray) -> np.ndarray:
        """int64 partition of each node id."""
        return np.searchsorted(self.offsets, ids, side="right") - 1

    def resident(self) -> list[int]:
        """Partitions fully loaded now."""
        return [int(p) for p in np.flatnonzero(self.slot_of >= 0)]

    def reset_stats(self) -> BufferStats:
        """Return the current counters and start new ones."""
        old, self.stats = self.stats, BufferStats()
        return old

    # ------------------------------------------------------------- loading
    def _load_into(self, p: int, slot: int) -> tuple[int, float]:
        a, b = int(self.offsets[p]), int(self.offsets[p + 1])
        r = slot * self.slot_rows
        t = time.perf_counter()
        self.features.read(a, b, self.buf[r:r + (b - a)])
        return (b - a) * self.features.row_bytes, time.perf_counter() - t

    def _settle(self, p: int, wait: bool) -> bool:
        fut = self._loading.get(p)
        if fut is None:
            return False
        if not wait and not fut.done():
            return False
        t = time.perf_counter()
        nbytes, dt = fut.result()
        self.stats.io_wait_s += time.perf_counter() - t
        del self._loading[p]
        self.slot_of[p] = self.part_in_slot.index(p)
        self.stats.bytes_read += nbytes
        self.stats.partition_loads += 1
        self.stats.load_s += dt
        return True

    def _choose_victim(self, keep: set[int], upcoming: list[int]) -> int | None:
        best, best_dist = None, -1
        for s, q in enumerate(self.part_in_slot):
            if q in keep or q in self._loading:
                continue
            if q < 0:
                return s
            dist = upcoming.index(q) if q in upcoming else len(upcoming) + 1
            if dist > best_dist:
                best, best_dist = s, dist
        return best

    def _start(self, p: int, slot: int, sync: bool) -> None:
        old = self.part_in_slot[slot]
        if old >= 0:
            self.slot_of[old] = -1
        self.part_in_slot[slot] = p
        if sync or self._pool is None:
            t = time.perf_counter()
            nbytes, dt = self._load_into(p, slot)
            self.stats.io_wait_s += time.perf_counter() - t
            self.slot_of[p] = slot
            self.stats.bytes_read += nbytes
            self.stats.partition_loads += 1
            self.stats.load_s += dt
        else:
            self._loading[p] = self._pool.submit(self._load_into, p, slot)

    def require(self, parts: list[int], upcoming: list[int] | None = None) -> None:
        """Make ``parts`` resident (as many as fit), then prefetch ``upcoming`` into spare slots.

        Args:
            parts: partitions the next batch needs, most important first; beyond ``capacity`` the
                rest are served as misses.
            upcoming: partitions the schedule needs next, in order (for prefetch and eviction).
        """
        upcoming = [int(q) for q in (upcoming or [])]
        want = []
        for p in parts:
            p = int(p)
            if p not in want:
                want.append(p)
        want = want[: self.capacity]
        keep = set(want)
        for p in want:
            if self.slot_of[p] >= 0:
                continue
            if p in self._loading:
                self._settle(p, wait=True)
                continue
            slot = self._choose_victim(keep, upcoming)
            if slot is None:  # every slot is busy loading: wait for one
                for q in list(self._loading):
                    self._settle(q, wait=True)
                slot = self._choose_victim(keep, upcoming)
            if slot is None:
                continue
            self._start(p, slot, sync=True)
        for q in list(self._loading):
            self._settle(q, wait=False)
        # prefetch: fill slots not needed now with the next partitions of the schedule
        for q in upcoming:
            if q in keep or self.slot_of[q] >= 0 or q in self._loading:
                keep.add(q)
                if len(keep) >= self.capacity:
                    break
                continue
            slot = self._choose_victim(keep, upcoming)
            if slot is None:
                break
            old = self.part_in_slot[slot]
            if old >= 0 and old in upcoming and upcoming.index(old) < upcoming.index(q):
                break  # the resident one is needed sooner than q
            self._start(q, slot, sync=False)
            keep.add(q)
            if len(keep) >= self.capacity:
                break

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``features[ids]``: hits from resident partitions, misses read from disk.

        Args:
            ids: int64 [n] node ids.

        Returns:
            [n, D] array of the feature dtype.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty((ids.shape[0], *self.features.shape[1:]), dtype=self.features.dtype)
        miss = np.empty(ids.shape[0], dtype=np.bool_)
        hits = _gather_resident(ids, self.offsets, self.slot_of, self.slot_rows, _as_uint_rows(self.buf),
                                _as_uint_rows(out), miss)
        self.stats.row_hits += int(hits)
        if hits < ids.shape[0]:
            pos = np.flatnonzero(miss)
            rows, nbytes = self.features.gather(ids[pos])
            out[pos] = rows
            self.stats.row_misses += int(pos.shape[0])
            self.stats.bytes_read += nbytes
        return out

    def drain(self) -> None:
        """Wait for in-flight loads (end of epoch)."""
        for q in list(self._loading):
            self._settle(q, wait=True)

    def close(self) -> None:
        self.drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
