"""The partition buffer: ``capacity`` partition slots in host memory, one buffer per machine.

Nodes are grouped into contiguous id ranges (partitions, ``offsets[p]:offsets[p+1]``).  The buffer
owns ``capacity`` slots, each big enough for the largest partition's feature rows (and, with the
topology on disk in buffer mode, its in-edges), and

- loads a partition with large sequential reads (several requests in flight, O_DIRECT optional,
  :class:`~ooc.storage.io.DiskRows`) into a 4 KiB aligned slot;
- prefetches the next partitions of the epoch's states on I/O threads while the current ones are
  used (double buffering; needs a spare slot);
- evicts the resident partition whose next use is furthest away (Belady's rule on the known
  schedule, the idea of MariusGNN's buffer);
- serves row gathers: rows of resident partitions are copied from the slots (hits); the others go
  to the ``fallback`` tier (CPU cache, PQ codes or disk; :mod:`ooc.features.tiers`).

**One buffer per machine.**  With several local ranks the slots, the slot table (``slot_of``,
per-slot shifts and generations) and the hand-over words live in one shared-memory segment
(:mod:`ooc.data.shared`): local rank 0 is the *owner* (it loads, evicts and prefetches); the other
ranks are *followers* (they gather from the same slots and never load).  The budget counts the
slots once.

Hand-over protocol (per buffer state, not per batch).  Every local rank walks the same sequence of
buffer states (the machine's share of the plan), and calls :meth:`BufferManager.require` with a
*ticket* that grows by one whenever its state changes.  The owner's first ``require`` of ticket
``t`` waits until every follower has announced ``done >= t - 1`` (it has built every batch of the
states before ``t``), then makes state ``t`` resident and publishes ``ready = t``.  A follower's
first ``require`` of ticket ``t`` announces ``done = t - 1`` and waits for ``ready >= t``.  Later
batches of the same state wait for nobody.  So a slow follower delays the owner only at a state
change, and only by the batches of the previous state it has still to build; prefetching the next
states' partitions into spare slots continues meanwhile (it never evicts a partition of the
current state).  No cycle: followers wait only for the owner, the owner only for the followers'
*previous* state.

Torn reads.  Outside the current state, the owner's I/O threads may overwrite a slot (prefetch)
while a follower copies rows from it.  Every slot has a generation counter, odd while a load is in
progress (made odd before the evicted partition's ``slot_of`` entry is cleared, even after the new
one's is set): a follower snapshots the generations, copies, reads them again and re-reads from
the fallback every row whose slot changed or was odd (a seqlock).

Slot bookkeeping is touched only by the thread that calls :meth:`require` / :meth:`gather` (the
loader thread); I/O threads write nothing but the bytes of the slot reserved for them.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit, uint64

from ooc.data.shared import ALIGN, Handover, SharedSegment
from ooc.kernels.rows import word_dtype
from ooc.storage.io import DiskRows, aligned_empty

if TYPE_CHECKING:  # pragma: no cover
    from ooc.contracts import Job

__all__ = ["BufferManager", "BufferStats", "SlotMemory", "make_buffer", "ROLES"]

ROLES = ("private", "owner", "follower")


def _align_up(n: int, a: int = ALIGN) -> int:
    return -(-int(n) // a) * a


@dataclass
class BufferStats:
    """Counters of one epoch (reset by :meth:`BufferManager.reset_stats`).

    Attributes:
        bytes_read: partition loads plus the misses' reads (by the fallback tiers).
        partition_loads, swaps: loads, and loads that replaced a resident partition.
        row_hits / row_misses: gathered rows served from the slots / by the fallback.
        approx_rows: missing rows decoded from PQ codes instead of read.
        io_wait_s: time callers blocked on a partition load; load_s: time loads took.
        bytes_read_loads: the partition loads' share of ``bytes_read``.
    """

    bytes_read: int = 0
    partition_loads: int = 0
    row_hits: int = 0
    row_misses: int = 0
    io_wait_s: float = 0.0
    load_s: float = 0.0
    swaps: int = 0
    approx_rows: int = 0
    bytes_read_loads: int = 0

    @property
    def hit_ratio(self) -> float:
        total = self.row_hits + self.row_misses
        return self.row_hits / total if total else 1.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["buffer_hit_ratio"] = self.hit_ratio
        d["load_bandwidth_Bps"] = self.bytes_read_loads / self.load_s if self.load_s else 0.0
        return d


@njit(cache=True, nogil=True)
def _gather_slots(ids: np.ndarray, offsets: np.ndarray, slot_of: np.ndarray, shift: np.ndarray,
                  slot_alloc: int, row_bytes: int, mem: np.ndarray, out: np.ndarray,
                  used: np.ndarray, gen0: np.ndarray) -> int:
    """Copy rows of resident partitions (word-addressed slots with per-slot shifts, all in words of
    ``mem``'s dtype); ``used[i]`` = slot row ``i`` came from, or -1 (a miss).  With ``gen0``
    (a follower's generation snapshot, else empty) slots with an odd generation are skipped."""
    hits = 0
    check = gen0.shape[0] > 0
    for j in range(ids.shape[0]):
        i = uint64(j)  # unsigned indices and a word loop: 2x the slice copy's speed
        v = ids[i]
        p = np.searchsorted(offsets, v, side="right") - 1
        s = slot_of[p]
        if s >= 0 and not (check and gen0[s] % 2 == 1):
            a = uint64(s * slot_alloc + shift[s] + (v - offsets[p]) * row_bytes)
            for k in range(row_bytes):
                out[i, uint64(k)] = mem[a + uint64(k)]
            used[i] = s
            hits += 1
        else:
            used[i] = -1
    return hits


@njit(cache=True, nogil=True)
def _gather_local(local: np.ndarray, slot_rows: int, shift: np.ndarray, slot_alloc: int,
                  row_bytes: int, mem: np.ndarray, out: np.ndarray) -> None:
    for j in range(local.shape[0]):
        i = uint64(j)
        s = local[i] // slot_rows
        r = local[i] - s * slot_rows
        a = uint64(s * slot_alloc + shift[s] + r * row_bytes)
        for k in range(row_bytes):
            out[i, uint64(k)] = mem[a + uint64(k)]


class SlotMemory:
    """Where a buffer's slots and slot table live: private arrays, or views of one shared segment.

    Layout of the segment (int64 words first, then the 4 KiB aligned slot bytes)::

        handover [2 + 2L]   failed, ready, done[L], pid[L]     (see :class:`ooc.data.shared.Handover`)
        gen      [C]        per slot: generation, odd while a load is in progress
        shift    [C]        per slot: byte offset of its first row (O_DIRECT alignment)
        tshift   [C]        per slot: byte offset of its first in-edge
        slot_of  [P]        slot of each resident partition, -1 if not resident
        mem      [C * slot_alloc]        feature rows
        tmem     [C * edge_slot_alloc]   in-edges (buffer mode with the topology on disk)

    Args:
        capacity, num_parts: C and P; slot_alloc, edge_slot_alloc: bytes per slot (4 KiB multiples).
        local_world: ranks sharing it (the hand-over words).
        segment: the shared segment (None: private memory).
    """

    def __init__(self, capacity: int, num_parts: int, slot_alloc: int, edge_slot_alloc: int,
                 local_world: int = 1, segment: SharedSegment | None = None) -> None:
        self.capacity, self.num_parts = capacity, num_parts
        self.segment = segment
        lay = self.layout(capacity, num_parts, slot_alloc, edge_slot_alloc, local_world)
        if segment is None:
            words = np.zeros(lay["words"], dtype=np.int64)
            self.mem = aligned_empty(capacity * slot_alloc)
            self.tmem = aligned_empty(capacity * edge_slot_alloc)
        else:
            words = segment.view(0, (lay["words"],), np.int64)
            self.mem = segment.array[lay["mem"]:lay["mem"] + capacity * slot_alloc]
            self.tmem = segment.array[lay["tmem"]:lay["tmem"] + capacity * edge_slot_alloc]
        h = Handover.num_words(local_world)
        c = max(capacity, 1)
        self.handover = Handover(words[:h], local_world)
        self.gen = words[h:h + c]
        self.shift = words[h + c:h + 2 * c]
        self.tshift = words[h + 2 * c:h + 3 * c]
        self.slot_of = words[h + 3 * c:h + 3 * c + num_parts]

    @staticmethod
    def layout(capacity: int, num_parts: int, slot_alloc: int, edge_slot_alloc: int,
               local_world: int) -> dict[str, int]:
        words = Handover.num_words(local_world) + 3 * max(capacity, 1) + num_parts
        mem = _align_up(8 * words)
        tmem = mem + capacity * slot_alloc
        return {"words": words, "mem": mem, "tmem": tmem, "total": tmem + capacity * edge_slot_alloc}

    @classmethod
    def nbytes(cls, capacity: int, num_parts: int, slot_alloc: int, edge_slot_alloc: int,
               local_world: int) -> int:
        """Bytes of the shared segment for this geometry."""
        return cls.layout(capacity, num_parts, slot_alloc, edge_slot_alloc, local_world)["total"]

    def init(self) -> None:
        """Reset the table (the owner, before anyone attaches)."""
        self.handover.reset()
        self.gen[:] = 0
        self.shift[:] = 0
        self.tshift[:] = 0
        self.slot_of[:] = -1


class BufferManager:
    """Partition slots in aligned host memory, loaded with large (optionally O_DIRECT) reads.

    Args:
        rows: reader of the feature array [N, D] (:class:`~ooc.storage.io.DiskRows`).
        offsets: int64 [P+1] partition boundaries.
        capacity: slots (0 = nothing resident; every row goes to ``fallback``).
        fallback: the next feature tier, ``gather(ids, approx_from=None) -> (rows, bytes_read)``
            (:class:`ooc.features.tiers.MissRows`, or anything with ``gather(ids)`` when
            ``approx_from`` is never passed).
        io_threads: background loaders (0 = synchronous loads).
        topo_rows, indptr: reader of ``topology/indices`` and int64 [N+1]: load every partition's
            in-edges with it (buffer mode with the topology on disk).
        memory: the slot memory (default: private); role: ``private``, ``owner`` or ``follower``;
        local_rank: this rank's index among the sharers; timeout_s: how long to wait for a peer.

    Raises:
        ValueError: bad offsets, capacity or role.
    """

    def __init__(self, rows: DiskRows, offsets: np.ndarray, capacity: int, fallback: Any,
                 io_threads: int = 1, topo_rows: DiskRows | None = None,
                 indptr: np.ndarray | None = None, memory: SlotMemory | None = None,
                 role: str = "private", local_rank: int = 0, timeout_s: float = 60.0) -> None:
        self.features = rows
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.num_parts = self.offsets.shape[0] - 1
        if self.num_parts < 1 or self.offsets[0] != 0 or self.offsets[-1] != rows.shape[0]:
            raise ValueError("partition offsets must run from 0 to the number of nodes")
        if not 0 <= capacity <= self.num_parts:
            raise ValueError(f"buffer capacity {capacity} outside [0, {self.num_parts}]")
        if role not in ROLES:
            raise ValueError(f"buffer role must be one of {ROLES}, got {role!r}")
        self.capacity = capacity
        self.fallback = fallback
        sizes = np.diff(self.offsets)
        self.slot_rows = int(sizes.max())
        self.row_bytes = rows.row_bytes
        self.slot_alloc = self.slot_bytes(self.slot_rows, self.row_bytes)
        self.topo_rows = topo_rows
        self.indptr = indptr
        self.edge_slot_alloc = 0
        if topo_rows is not None:
            if indptr is None:
                raise ValueError("loading in-edges with partitions needs indptr")
            pe = indptr[self.offsets[1:]] - indptr[self.offsets[:-1]]
            self.edge_slot_alloc = self.slot_bytes(int(pe.max()), topo_rows.row_bytes)
        self.memory = memory or SlotMemory(capacity, self.num_parts, self.slot_alloc,
                                           self.edge_slot_alloc)
        if role == "private" or (role == "owner" and memory is None):
            self.memory.init()
        self.mem, self.tmem = self.memory.mem, self.memory.tmem
        self.shift, self.tshift = self.memory.shift, self.memory.tshift
        self.slot_of, self.gen = self.memory.slot_of, self.memory.gen
        self.handover = self.memory.handover
        # copy rows as 8/4/2-byte words when the row size allows (shifts and slots are multiples)
        self._word_dtype = word_dtype(self.row_bytes)
        self._word = self._word_dtype.itemsize
        self.role = role
        self.local_rank = local_rank
        self.timeout_s = timeout_s
        self.ticket = 0
        self.part_in_slot = [-1] * capacity   # reserved (loading or loaded): the owner's view
        # the partitions of the last require (the plan's state): the only ones whose rows are
        # hits where a miss may be approximated (see gather)
        self._in_state = np.zeros(self.num_parts, dtype=bool)
        self._loading: dict[int, Future] = {}
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="ooc-io") \
            if io_threads and role != "follower" else None
        self.stats = BufferStats()
        if role != "private":
            self.handover.pid[local_rank] = os.getpid()

    @staticmethod
    def slot_bytes(rows: int, row_bytes: int) -> int:
        """Bytes of one slot holding ``rows`` rows of ``row_bytes`` (4 KiB aligned, with room for
        the O_DIRECT shift at both ends)."""
        return _align_up(int(rows) * int(row_bytes)) + 2 * ALIGN

    @property
    def shared(self) -> bool:
        return self.role != "private"

    @property
    def nbytes(self) -> int:
        """Bytes the slots hold: ``capacity`` x the largest partition's feature rows (and in-edges);
        :attr:`alloc_bytes` adds the 4 KiB alignment margins of every slot."""
        n = self.capacity * self.slot_rows * self.row_bytes
        if self.topo_rows is not None:
            pe = self.indptr[self.offsets[1:]] - self.indptr[self.offsets[:-1]]  # type: ignore[index]
            n += self.capacity * int(pe.max()) * self.topo_rows.row_bytes
        return int(n)

    @property
    def alloc_bytes(self) -> int:
        """Slot memory allocated (features and in-edges, with alignment margins)."""
        return int(self.mem.nbytes + self.tmem.nbytes)

    def part_of(self, ids: np.ndarray) -> np.ndarray:
        """int64 partition of each node id."""
        return np.searchsorted(self.offsets, ids, side="right") - 1

    def resident(self) -> list[int]:
        """Partitions fully loaded now."""
        return [int(p) for p in np.flatnonzero(self.slot_of >= 0)]

    def reset_stats(self) -> BufferStats:
        old, self.stats = self.stats, BufferStats()
        return old

    # ------------------------------------------------------------- loading (owner / private)
    def _load_into(self, p: int, slot: int) -> tuple[int, float]:
        a, b = int(self.offsets[p]), int(self.offsets[p + 1])
        t = time.perf_counter()
        base = slot * self.slot_alloc
        # features and in-edges are requested together (several requests of each in flight)
        reads = [self.features.read_range_async(a, b, self.mem[base:base + self.slot_alloc])]
        self.shift[slot] = self.features.span(a, b)[2]
        if self.topo_rows is not None:
            ea, eb = int(self.indptr[a]), int(self.indptr[b])  # type: ignore[index]
            tb = slot * self.edge_slot_alloc
            reads.append(self.topo_rows.read_range_async(ea, eb,
                                                         self.tmem[tb:tb + self.edge_slot_alloc]))
            self.tshift[slot] = self.topo_rows.span(ea, eb)[2]
        nbytes = sum(r.wait() for r in reads)
        return nbytes, time.perf_counter() - t

    def _loaded(self, p: int, slot: int, nbytes: int, dt: float) -> None:
        self.slot_of[p] = slot
        self.gen[slot] += 1  # even: stable again
        st = self.stats
        st.bytes_read += nbytes
        st.bytes_read_loads += nbytes
        st.partition_loads += 1
        st.load_s += dt

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
        self._loaded(p, self.part_in_slot.index(p), nbytes, dt)
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
        self.gen[slot] += 1  # odd: readers must not trust this slot
        if old >= 0:
            self.slot_of[old] = -1
            self.stats.swaps += 1
        self.part_in_slot[slot] = p
        if sync or self._pool is None:
            t = time.perf_counter()
            nbytes, dt = self._load_into(p, slot)
            self.stats.io_wait_s += time.perf_counter() - t
            self._loaded(p, slot, nbytes, dt)
        else:
            self._loading[p] = self._pool.submit(self._load_into, p, slot)

    def _require(self, parts: list[int], upcoming: list[int]) -> None:
        want: list[int] = []
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

    def require(self, parts: list[int], upcoming: list[int] | None = None,
                ticket: int | None = None) -> None:
        """Make ``parts`` resident (as many as fit), then prefetch ``upcoming`` into spare slots.

        Args:
            parts: partitions the next batch needs, most important first; beyond ``capacity`` the
                rest are served as misses.
            upcoming: partitions the schedule needs next, in order (prefetch and eviction).
            ticket: the buffer state's number in this rank's sequence (shared buffers: see the
                module docstring; ignored by a private buffer).

        Raises:
            PeerError: a shared buffer's peer died, failed or did not answer in time.
        """
        up = [int(q) for q in (upcoming or [])]
        self._in_state[:] = False
        self._in_state[np.asarray(parts, dtype=np.int64)] = True
        if self.role == "private":
            self._require(parts, up)
            return
        t = self.ticket if ticket is None else int(ticket)
        ho = self.handover
        if self.role == "follower":
            if t > self.ticket:
                ho.done[self.local_rank] = t - 1
                t0 = time.perf_counter()
                ho.wait(lambda: int(ho.ready[0]) >= t, f"waiting for local rank 0 to load buffer "
                        f"state {t}", [0], self.timeout_s)
                self.stats.io_wait_s += time.perf_counter() - t0
                self.ticket = t
            return
        if t > self.ticket:
            peers = list(range(1, ho.local_world))
            done = ho.done
            ho.wait(lambda: int(done[1:].min(initial=t)) >= t - 1,
                    f"waiting for them to finish buffer state {t - 1}", peers, self.timeout_s)
        try:
            self._require(parts, up)
        except BaseException:
            ho.mark_failed()
            raise
        if t > self.ticket:
            self.ticket = t
            ho.ready[0] = t

    # ------------------------------------------------------------- gathers
    def in_edges_of(self, p: int) -> np.ndarray:
        """The in-edge sources (indices dtype) of resident partition ``p`` (buffer mode, topology
        on disk)."""
        slot = int(self.slot_of[p])
        if slot < 0 or self.topo_rows is None:
            raise ValueError(f"partition {p} has no resident in-edges")
        a, b = int(self.offsets[p]), int(self.offsets[p + 1])
        m = int(self.indptr[b] - self.indptr[a])  # type: ignore[index]
        base = slot * self.edge_slot_alloc + int(self.tshift[slot])
        return self.tmem[base:base + m * self.topo_rows.row_bytes].view(self.topo_rows.dtype)

    @staticmethod
    def _fallback_kw(approx_from: int | None, next_use: np.ndarray | None) -> dict:
        """The fallback's keyword arguments for the rows it is asked (those given only)."""
        kw: dict = {}
        if approx_from is not None:
            kw["approx_from"] = approx_from
        if next_use is not None:
            kw["next_use"] = next_use
        return kw

    def gather(self, ids: np.ndarray, approx_from: int | None = None,
               next_use: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Rows ``features[ids]``: resident partitions first, the rest from ``fallback``.

        Args:
            ids: int64 [n] node ids.
            approx_from: missing rows at positions ``>= approx_from`` may be approximated by the
                fallback (PQ codes); None: every row exact.  There, rows of partitions outside
                the last :meth:`require`'s state are misses even where a prefetch has already
                loaded them: whether it has is a matter of timing, and an exact row in one run
                and a decoded one in the next would make the losses differ run to run.
            next_use: int64 [n] when each row is asked for next, for a look-ahead cache in the
                fallback (``--cache-policy belady``); None: not known.

        Returns:
            ``([n, *row_shape] in the storage dtype, bytes read by the fallback)``.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        if n and not self.capacity:  # no slots (exact mode): every row is the fallback's
            rows, nbytes = self.fallback.gather(ids, **self._fallback_kw(approx_from, next_use))
            self.stats.row_misses += n
            self.stats.bytes_read += int(nbytes)
            return rows, int(nbytes)
        out = np.empty((n, *self.features.shape[1:]), dtype=self.features.dtype)
        if n == 0:
            return out, 0
        flat = out.reshape(n, -1).view(np.uint8).reshape(n, self.row_bytes)
        used = np.full(n, -1, dtype=np.int64)
        hits = 0
        if self.capacity and n:
            w = self._word
            gen0 = self.gen.copy() if self.role == "follower" else np.empty(0, dtype=np.int64)
            hits = _gather_slots(ids, self.offsets, self.slot_of, self.shift // w,
                                 self.slot_alloc // w, self.row_bytes // w, self.mem.view(self._word_dtype),
                                 flat.view(self._word_dtype), used, gen0)
            if gen0.shape[0]:
                changed = np.flatnonzero(self.gen != gen0)
                if changed.shape[0]:  # a slot was rewritten during the copy: re-read its rows
                    torn = np.isin(used, changed)
                    used[torn] = -1
                    hits -= int(torn.sum())
        if approx_from is not None and hits and approx_from < n:
            outer = used[approx_from:]  # a view
            spare = (outer >= 0) & ~self._in_state[self.part_of(ids[approx_from:])]
            if spare.any():
                outer[spare] = -1
                hits -= int(spare.sum())
        self.stats.row_hits += int(hits)
        nbytes = 0
        if hits < n:
            pos = np.flatnonzero(used < 0)
            kw = self._fallback_kw(None if approx_from is None else
                                   int(np.searchsorted(pos, approx_from)),
                                   None if next_use is None else next_use[pos])
            rows, nbytes = self.fallback.gather(ids[pos], **kw)
            out[pos] = rows
            self.stats.row_misses += int(pos.shape[0])
            self.stats.bytes_read += int(nbytes)
        return out, int(nbytes)

    def gather_local(self, local: np.ndarray) -> np.ndarray:
        """Rows by slot-local id ``slot * slot_rows + row`` (buffer mode; all resident, and stable
        for every rank while its state lasts)."""
        local = np.ascontiguousarray(local, dtype=np.int64)
        n = local.shape[0]
        out = np.empty((n, *self.features.shape[1:]), dtype=self.features.dtype)
        flat = out.reshape(n, -1).view(np.uint8).reshape(n, self.row_bytes)
        w = self._word
        _gather_local(local, self.slot_rows, self.shift // w, self.slot_alloc // w, self.row_bytes // w,
                      self.mem.view(self._word_dtype), flat.view(self._word_dtype))
        self.stats.row_hits += n
        return out

    def drain(self) -> None:
        """Wait for in-flight loads (end of epoch)."""
        for q in list(self._loading):
            self._settle(q, wait=True)

    def close(self) -> None:
        """Finish loads and stop the I/O threads; a follower announces its last state done (the
        owner may then evict freely)."""
        if self.role == "follower":
            self.handover.done[self.local_rank] = max(self.ticket, int(self.handover.done[self.local_rank]))
            return
        self.drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def make_buffer(job: "Job", rows: DiskRows, offsets: np.ndarray, capacity: int, fallback: Any,
                io_threads: int = 1, topo_rows: DiskRows | None = None,
                indptr: np.ndarray | None = None, share: bool = True) -> BufferManager:
    """The buffer of this rank: with ``share`` and several local ranks, one buffer per machine in
    shared memory (local rank 0 owns it), otherwise a private one.  Every local rank calls this at
    the same point (one all-gather and one barrier when shared).

    Raises:
        RuntimeError: the shared segment could not be created or mapped.
    """
    if not share or job.local_world_size <= 1:
        return BufferManager(rows, offsets, capacity, fallback, io_threads, topo_rows, indptr)
    from ooc.data.shared import shared_segment
    offsets = np.asarray(offsets, dtype=np.int64)
    num_parts = offsets.shape[0] - 1
    slot_alloc = BufferManager.slot_bytes(int(np.diff(offsets).max()), rows.row_bytes)
    edge_alloc = 0
    if topo_rows is not None and indptr is not None:
        pe = indptr[offsets[1:]] - indptr[offsets[:-1]]
        edge_alloc = BufferManager.slot_bytes(int(pe.max()), topo_rows.row_bytes)
    lw = job.local_world_size
    nbytes = SlotMemory.nbytes(capacity, num_parts, slot_alloc, edge_alloc, lw)
    seg = shared_segment(job, "buf", nbytes, lambda s: SlotMemory(capacity, num_parts, slot_alloc,
                                                                   edge_alloc, lw, s).init())
    memory = SlotMemory(capacity, num_parts, slot_alloc, edge_alloc, lw, seg)
    role = "owner" if job.local_rank == 0 else "follower"
    return BufferManager(rows, offsets, capacity, fallback, io_threads, topo_rows, indptr, memory,
                         role, job.local_rank, timeout_s=float(job.timeout_s))
