"""One partition buffer per machine: the slot array in shared memory, shared by the local ranks.

With ``ooc train --devices N`` every local rank needs the same feature partitions (all ranks follow
the same global epoch plan, see :mod:`ooc.distributed`).  Instead of N private buffers -- N copies of
every resident partition and N readers of the same bytes -- local rank 0 owns one buffer whose slot
array and slot table live in a shared-memory segment; the other local ranks map the segment and read
the slots directly.  Host memory is budgeted per machine: one copy of each resident partition, one
I/O owner.

Pieces (each small, so they can be re-attached to another buffer implementation):

- :class:`SharedSegment` -- a named file in ``/dev/shm`` (POSIX shared memory on Linux), created
  by the owner, mapped by every local rank, unlinked by the owner as soon as all ranks have mapped it
  (so a killed job leaves nothing behind; the pages live until the last mapping goes).
- :class:`SlotTable` -- the layout inside the segment: header, a ticket word per local rank, a
  generation counter per slot (a seqlock), ``slot_of`` [P] and the slot array itself.
- :class:`SharedOwnerBuffer` -- a :class:`~ooc.buffer.PartitionBuffer` whose ``buf`` and
  ``slot_of`` are views of the segment.  Its hook into the buffer is two overridden methods
  (``_start`` / ``_settle`` bump the slot's generation around every load) and ``require``
  (waits for the other ranks to finish the previous batch before it may evict).
- :class:`SharedFollowerBuffer` -- the same interface for the other local ranks: ``require`` waits
  until the owner has made the batch's partitions resident, ``gather`` copies rows out of the shared
  slots and reads the rest from disk like any miss.

Protocol (tickets).  Every local rank calls ``require`` once per training batch, in the same order
(the global plan is identical on all ranks).  The owner's ``require`` number ``t`` first waits until
every follower has announced ``done >= t - 1`` (it has gathered batch ``t - 1`` and will not touch
those slots again), then loads/evicts, then publishes ``ready = t``.  A follower's ``require`` number
``t`` announces ``done = t - 1`` and waits for ``ready >= t``.  No cycle is possible: followers wait
only for the owner, the owner only for followers' *previous* batch.

Torn reads.  The owner's I/O thread may prefetch into a slot (evicting a partition no rank needs for
the current batch) while a follower is copying rows.  Every slot has a generation counter, odd while
a load is in progress (set before ``slot_of`` of the evicted partition is cleared, made even after
``slot_of`` of the new one is set): a follower snapshots the generations, copies, re-reads them, and
treats rows from any slot whose generation changed (or was odd) as misses.  This relies on stores
becoming visible in program order (x86-64 TSO); the hand-over points of the owner (thread joins,
futures) are full barriers.

Liveness.  Waits poll the shared words with a short back-off, check that the peer process is alive
and give up after ``timeout_s`` with an error naming the peer: a dead or stuck rank never hangs the
others.

Memory accounting: a mapped page of the segment is counted in the RSS (``RssShmem``) of every process
that touched it, but exists once; the proportional set size (``Pss``) splits it between them.
:func:`memory_of` reads both from ``/proc``.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from numba import njit, prange

from ooc.buffer import BufferStats, PartitionBuffer, _as_uint_rows
from ooc.storage.rawarray import RawArray
from ooc.util.procs import pid_alive

__all__ = ["SharedSegment", "SlotTable", "SharedOwnerBuffer", "SharedFollowerBuffer", "memory_of",
           "PeerError", "shm_dir"]

_MAGIC = 0x006F6F632D73686D  # "ooc-shm"
_ALIGN = 4096


class PeerError(RuntimeError):
    """Another local rank died, failed, or did not answer within the timeout."""


def shm_dir() -> Path:
    """``/dev/shm`` where it exists (POSIX shared memory on Linux), else the temporary folder."""
    d = Path("/dev/shm")
    return d if d.is_dir() and os.access(d, os.W_OK) else Path(tempfile.gettempdir())




class SharedSegment:
    """A file in ``/dev/shm`` mapped shared (``MAP_SHARED``) into every local rank.

    Args:
        path: the segment's file.
        nbytes: its size.
        create: create it (the owner; fails if it exists) or map an existing one.

    Raises:
        FileExistsError: ``create`` and the name is taken.  FileNotFoundError: attaching to a
        segment that is gone.  ValueError: the file's size is not ``nbytes``.
    """

    def __init__(self, path: str | os.PathLike, nbytes: int, create: bool) -> None:
        self.path = Path(path)
        self.nbytes = int(nbytes)
        self.owner = create
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, self.nbytes)
            elif os.fstat(fd).st_size != self.nbytes:
                raise ValueError(f"{self.path}: {os.fstat(fd).st_size} bytes, expected {self.nbytes}")
            self.map = mmap.mmap(fd, self.nbytes, flags=mmap.MAP_SHARED,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.map, dtype=np.uint8)

    @staticmethod
    def new_path(tag: str) -> Path:
        """A fresh segment name ``ooc-<tag>-<pid>-<random>`` in :func:`shm_dir`."""
        return shm_dir() / f"ooc-{tag}-{os.getpid()}-{os.urandom(4).hex()}"

    @staticmethod
    def remove_stale() -> list[Path]:
        """Unlink segments ``ooc-*-<pid>-*`` whose creating process is dead (a job killed between
        creating a segment and unlinking it, a window of one barrier); returns what was removed."""
        gone = []
        for p in shm_dir().glob("ooc-*-*-*"):
            try:
                pid = int(p.name.split("-")[-2])
            except ValueError:
                continue
            if not pid_alive(pid):
                try:
                    p.unlink()
                    gone.append(p)
                except OSError:
                    pass
        return gone

    def view(self, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An ndarray of ``shape``/``dtype`` over bytes ``[offset, offset + size)`` of the segment."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return self.array[offset:offset + n].view(dtype).reshape(shape)

    def unlink(self) -> None:
        """Remove the name (mappings stay valid until closed); idempotent."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class SlotTable:
    """Layout of a shared buffer segment (all words int64, the slot array 4 KiB aligned).

    ::

        header   [8]            magic, capacity, num_parts, slot_rows, row_bytes, local_world, failed, 0
        ready    [1]            owner: tickets published (partitions of batch `ready` are resident)
        done     [local_world]  per local rank: last ticket whose batch it has finished gathering
        pid      [local_world]  per local rank: its process id (liveness checks)
        gen      [capacity]     per slot: generation, odd while a load is in progress
        slot_of  [num_parts]    slot of each resident partition, -1 if not resident
        slots    [capacity * slot_rows, *row_shape]   the feature rows (feature dtype)

    Args:
        segment: the mapped segment (:meth:`nbytes` bytes).
        capacity, num_parts, slot_rows: buffer geometry.
        row_shape, dtype: shape and dtype of one feature row.
        local_world: ranks sharing the segment.
    """

    def __init__(self, segment: SharedSegment, capacity: int, num_parts: int, slot_rows: int,
                 row_shape: tuple[int, ...], dtype: np.dtype, local_world: int) -> None:
        self.segment = segment
        self.capacity, self.num_parts, self.slot_rows = capacity, num_parts, slot_rows
        self.local_world = local_world
        lay = self.layout(capacity, num_parts, local_world)
        self.header = segment.view(0, (8,), np.int64)
        self.ready = segment.view(lay["ready"], (1,), np.int64)
        self.done = segment.view(lay["done"], (local_world,), np.int64)
        self.pid = segment.view(lay["pid"], (local_world,), np.int64)
        self.gen = segment.view(lay["gen"], (capacity,), np.int64)
        self.slot_of = segment.view(lay["slot_of"], (num_parts,), np.int64)
        self.slots = segment.view(lay["slots"], (capacity * slot_rows, *row_shape), dtype)
        self.row_bytes = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize

    @staticmethod
    def layout(capacity: int, num_parts: int, local_world: int) -> dict[str, int]:
        off = 64
        lay = {"ready": off}
        off += 8
        lay["done"] = off
        off += 8 * local_world
        lay["pid"] = off
        off += 8 * local_world
        lay["gen"] = off
        off += 8 * capacity
        lay["slot_of"] = off
        off += 8 * num_parts
        lay["slots"] = -(-off // _ALIGN) * _ALIGN
        return lay

    @classmethod
    def nbytes(cls, capacity: int, num_parts: int, slot_rows: int, row_bytes: int,
               local_world: int) -> int:
        """Segment size for this geometry (slot bytes + a page of table for small tables)."""
        return cls.layout(capacity, num_parts, local_world)["slots"] + capacity * slot_rows * row_bytes

    def init_owner(self) -> None:
        """Fill the header and reset the table (owner, before anyone attaches)."""
        self.header[:] = [_MAGIC, self.capacity, self.num_parts, self.slot_rows, self.row_bytes,
                          self.local_world, 0, 0]
        self.ready[0] = 0
        self.done[:] = 0
        self.pid[:] = 0
        self.gen[:] = 0
        self.slot_of[:] = -1

    def check(self) -> None:
        """Raise ValueError if the header does not describe this geometry (a follower's check)."""
        want = [_MAGIC, self.capacity, self.num_parts, self.slot_rows, self.row_bytes, self.local_world]
        if self.header[:6].tolist() != want:
            raise ValueError(f"{self.segment.path}: shared buffer header {self.header[:6].tolist()} "
                             f"does not match this rank's buffer {want}")

    @property
    def failed(self) -> bool:
        return bool(self.header[6])

    def mark_failed(self) -> None:
        self.header[6] = 1

    # --------------------------------------------------------------- waiting
    def wait(self, cond, what: str, peers: list[int], timeout_s: float) -> None:
        """Poll ``cond()`` until true (back-off 50 us .. 2 ms).

        Raises:
            PeerError: a rank in ``peers`` (local ranks) died, one marked the segment failed, or
                ``timeout_s`` passed.
        """
        if cond():
            return
        t0 = time.monotonic()
        pause = 5e-5
        checks = 0
        while not cond():
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)
            checks += 1
            if checks % 64 == 0:
                if self.failed:
                    raise PeerError(f"shared buffer: another local rank failed while {what}")
                for r in peers:
                    pid = int(self.pid[r])
                    if not pid_alive(pid):
                        raise PeerError(f"shared buffer: local rank {r} (pid {pid}) died while {what}")
                if time.monotonic() - t0 > timeout_s:
                    raise PeerError(f"shared buffer: no progress from local ranks {peers} for "
                                    f"{timeout_s:.0f} s while {what}")


class SharedOwnerBuffer(PartitionBuffer):
    """The I/O owner's buffer (local rank 0): a :class:`PartitionBuffer` living in shared memory.

    Eviction, prefetch and gathers are the base class's; this class only moves ``buf`` and
    ``slot_of`` into the segment, brackets every slot load with generation bumps and waits for the
    followers before each ``require`` (see the module docstring).

    Args:
        features, offsets, capacity, io_threads: as :class:`PartitionBuffer`.
        table: the segment's :class:`SlotTable` (geometry matching this buffer).
        timeout_s: how long to wait for a follower before raising :class:`PeerError`.
    """

    shared = True

    def __init__(self, features: RawArray, offsets: np.ndarray, capacity: int, io_threads: int,
                 table: SlotTable, timeout_s: float = 60.0) -> None:
        super().__init__(features, offsets, capacity, io_threads)
        if table.slots.shape != self.buf.shape or table.slots.dtype != self.buf.dtype:
            raise ValueError(f"shared slots {table.slots.shape} {table.slots.dtype} do not match the "
                             f"buffer {self.buf.shape} {self.buf.dtype}")
        self.buf = table.slots          # the hook: slot array and slot table live in the segment
        self.slot_of = table.slot_of
        self.table = table
        self.timeout_s = timeout_s
        self.ticket = 0
        table.pid[0] = os.getpid()

    def _start(self, p: int, slot: int, sync: bool) -> None:
        self.table.gen[slot] += 1       # odd: readers must not trust this slot
        super()._start(p, slot, sync)
        if sync or self._pool is None:
            self.table.gen[slot] += 1   # loaded and slot_of set: even again

    def _settle(self, p: int, wait: bool) -> bool:
        done = super()._settle(p, wait)
        if done:
            self.table.gen[int(self.slot_of[p])] += 1
        return done

    def require(self, parts: list[int], upcoming: list[int] | None = None) -> None:
        t = self.ticket + 1
        peers = list(range(1, self.table.local_world))
        done = self.table.done
        self.table.wait(lambda: int(done[1:].min(initial=t)) >= t - 1,
                        f"waiting for them to finish batch {t - 1}", peers, self.timeout_s)
        try:
            super().require(parts, upcoming)
        except BaseException:
            self.table.mark_failed()
            raise
        self.ticket = t
        self.table.ready[0] = t

    def close(self) -> None:
        super().close()


@njit(cache=True, nogil=True, parallel=True)
def _gather_shared(ids: np.ndarray, offsets: np.ndarray, slot_of: np.ndarray, gen0: np.ndarray,
                   slot_rows: int, buf: np.ndarray, out: np.ndarray, used: np.ndarray) -> None:
    """Copy rows of partitions resident in stable slots (even generation in ``gen0``); ``used[i]``
    is the slot row ``i`` came from, or -1 (a miss)."""
    for i in prange(ids.shape[0]):
        v = ids[i]
        p = np.searchsorted(offsets, v, side="right") - 1
        s = slot_of[p]
        if s >= 0 and gen0[s] % 2 == 0:
            out[i] = buf[s * slot_rows + (v - offsets[p])]
            used[i] = s
        else:
            used[i] = -1


class SharedFollowerBuffer:
    """A non-owner local rank's view of the shared buffer: the :class:`PartitionBuffer` interface
    (``require``, ``gather``, ``stats``, ``part_of``, ...) without slots of its own.

    ``gather`` copies rows of resident partitions from the segment and reads the others from disk
    (counted as misses, like the owner's).  It never loads partitions: ``bytes_read`` counts only
    its miss reads.

    Args:
        features: the on-disk feature array (this machine's dataset copy).
        offsets: int64 [P+1]; capacity: the owner's slot count.
        table: the segment's :class:`SlotTable`; local_rank: this rank's index in it (>= 1).
        timeout_s: how long to wait for the owner before raising :class:`PeerError`.
    """

    shared = True

    def __init__(self, features: RawArray, offsets: np.ndarray, capacity: int, table: SlotTable,
                 local_rank: int, timeout_s: float = 60.0) -> None:
        self.features = features
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.num_parts = self.offsets.shape[0] - 1
        self.capacity = capacity
        self.slot_rows = table.slot_rows
        self.table = table
        self.local_rank = local_rank
        self.timeout_s = timeout_s
        self.ticket = 0
        self.stats = BufferStats()
        table.check()
        table.pid[local_rank] = os.getpid()

    @property
    def nbytes(self) -> int:
        """Bytes of the shared slot array (the same memory as the owner's)."""
        return int(self.table.slots.nbytes)

    @property
    def slot_of(self) -> np.ndarray:
        return self.table.slot_of

    def part_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, ids, side="right") - 1

    def resident(self) -> list[int]:
        return [int(p) for p in np.flatnonzero(self.table.slot_of >= 0)]

    def reset_stats(self) -> BufferStats:
        old, self.stats = self.stats, BufferStats()
        return old

    def require(self, parts: list[int], upcoming: list[int] | None = None) -> None:
        """Announce that the previous batch is done, then wait until the owner has made this
        batch's partitions resident (the owner decides which; ``parts`` are the same on all ranks)."""
        t = self.ticket + 1
        self.table.done[self.local_rank] = t - 1
        ready = self.table.ready
        t0 = time.perf_counter()
        self.table.wait(lambda: int(ready[0]) >= t, f"waiting for local rank 0 to load batch {t}",
                        [0], self.timeout_s)
        self.stats.io_wait_s += time.perf_counter() - t0
        self.ticket = t

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``features[ids]`` ([n, *row] in the feature dtype): from the shared slots where
        the slot was stable during the copy, otherwise read from disk."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty((ids.shape[0], *self.features.shape[1:]), dtype=self.features.dtype)
        used = np.empty(ids.shape[0], dtype=np.int64)
        gen0 = self.table.gen.copy()
        _gather_shared(ids, self.offsets, self.table.slot_of, gen0, self.slot_rows,
                       _as_uint_rows(self.table.slots), _as_uint_rows(out), used)
        gen1 = self.table.gen.copy()
        miss = used < 0
        changed = np.flatnonzero(gen1 != gen0)
        if changed.shape[0]:
            miss |= np.isin(used, changed)
        hits = int(ids.shape[0] - miss.sum())
        self.stats.row_hits += hits
        if hits < ids.shape[0]:
            pos = np.flatnonzero(miss)
            rows, nbytes = self.features.gather(ids[pos])
            out[pos] = rows
            self.stats.row_misses += int(pos.shape[0])
            self.stats.bytes_read += nbytes
        return out

    def drain(self) -> None:
        """Nothing in flight here (the owner loads)."""

    def close(self) -> None:
        """Announce the last batch done (the owner may evict freely afterwards)."""
        self.table.done[self.local_rank] = self.ticket


def memory_of(pid: int | None = None) -> dict[str, int]:
    """Memory of a process from ``/proc`` (bytes): ``rss``, ``rss_anon`` (private),
    ``rss_shmem`` (shared-memory pages it touched, counted in every sharer's RSS) and ``pss``
    (proportional set size: shared pages split between the processes that map them, so the sum of
    ``pss`` over processes counts each page once).  Zeros where the kernel does not report a field.
    """
    base = Path("/proc") / (str(pid) if pid else "self")
    out = {"rss": 0, "rss_anon": 0, "rss_shmem": 0, "rss_file": 0, "pss": 0}
    keys = {"VmRSS:": "rss", "RssAnon:": "rss_anon", "RssShmem:": "rss_shmem", "RssFile:": "rss_file"}
    try:
        for line in (base / "status").read_text().splitlines():
            k = line.split(None, 1)[0] if line else ""
            if k in keys:
                out[keys[k]] = int(line.split()[1]) * 1024
        for line in (base / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                out["pss"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out
