"""Shared memory of one machine: segments every local rank maps, and the buffer's hand-over words.

With ``ooc train --devices N`` the local ranks of a machine share one copy of what they all read:
the partition buffer's slots (:class:`ooc.data.buffer.BufferManager` places its slot memory and
tables in a segment, local rank 0 owns it and does the I/O), the topology held in memory and the
PQ codes (:func:`shared_array`).  Host memory is budgeted per machine, and shared pages count once.

- :class:`SharedSegment` -- a named file in ``/dev/shm`` (POSIX shared memory on Linux) mapped
  ``MAP_SHARED`` by every local rank; the creator unlinks the name as soon as every rank has mapped
  it (one barrier), so a killed job leaves nothing behind.
- :class:`Handover` -- the words through which the buffer's owner and the other local ranks
  ("followers") agree on residency: ``ready`` (the owner has made buffer state ``t`` resident),
  ``done[r]`` (local rank ``r`` has finished every batch of the states before ``t``), ``pid[r]``
  (liveness) and a ``failed`` flag.  See :class:`ooc.data.buffer.BufferManager` for the protocol.
- :func:`shared_array` -- an array filled once by local rank 0 and mapped by the others.
- :func:`memory_of` -- RSS, anonymous, shared and proportional (PSS) memory of a process.

Liveness: every wait polls with a short back-off, checks that the peer process is alive and gives
up after ``timeout_s`` with an error naming the peer -- a dead or stuck rank never hangs the others.
Stores become visible to other processes in program order on x86-64 (TSO); the owner's hand-over
points (thread joins, futures) are full barriers.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ooc.util.procs import pid_alive

if TYPE_CHECKING:  # pragma: no cover
    from ooc.contracts import Job

__all__ = ["SharedSegment", "Handover", "PeerError", "shm_dir", "shared_array", "memory_of",
           "ALIGN"]

ALIGN = 4096


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


class Handover:
    """The owner/follower words of a shared buffer: ``[failed, ready, done[L], pid[L]]`` (int64).

    Args:
        words: int64 view of ``2 + 2 * local_world`` words inside a segment.
        local_world: ranks sharing the buffer.
    """

    def __init__(self, words: np.ndarray, local_world: int) -> None:
        self.words = words
        self.local_world = local_world
        self.ready = words[1:2]
        self.done = words[2:2 + local_world]
        self.pid = words[2 + local_world:2 + 2 * local_world]

    @staticmethod
    def num_words(local_world: int) -> int:
        return 2 + 2 * local_world

    def reset(self) -> None:
        self.words[:] = 0

    @property
    def failed(self) -> bool:
        return bool(self.words[0])

    def mark_failed(self) -> None:
        self.words[0] = 1

    def wait(self, cond: Callable[[], bool], what: str, peers: list[int], timeout_s: float) -> None:
        """Poll ``cond()`` until true (back-off 50 us .. 2 ms).

        Raises:
            PeerError: a local rank in ``peers`` died, one marked the buffer failed, or
                ``timeout_s`` passed without progress.
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


def shared_segment(job: "Job", tag: str, nbytes: int,
                   init: Callable[[SharedSegment], None]) -> SharedSegment:
    """One segment of ``nbytes`` per machine: local rank 0 creates it and runs ``init(segment)``;
    the other local ranks map it after one all-gather of the names; after a barrier the creator
    unlinks the name (the pages live until the last mapping goes).  Every rank calls this at the
    same point.

    Raises:
        RuntimeError: local rank 0 of this machine failed to create the segment.
    """
    seg = None
    err = ""
    if job.local_rank == 0:
        SharedSegment.remove_stale()
        try:
            seg = SharedSegment(SharedSegment.new_path(f"{tag}-n{job.node_rank}"), nbytes, create=True)
            init(seg)
        except BaseException as e:  # reported to every rank, then re-raised here
            err = f"{type(e).__name__}: {e}"
            if seg is not None:
                seg.unlink()
            seg = None
    names = job.all_gather_object((job.node_rank, job.local_rank, str(seg.path) if seg else "", err))
    try:
        if job.local_rank == 0 and seg is None:
            raise RuntimeError(f"node {job.node_rank}: could not create the shared {tag}: {err}")
        if seg is None:
            path, e0 = next((p, e) for (n, lr, p, e) in names if n == job.node_rank and lr == 0)
            if not path:
                raise RuntimeError(f"node {job.node_rank}: local rank 0 created no shared {tag}: {e0}")
            seg = SharedSegment(path, nbytes, create=False)
    finally:
        job.barrier()  # everyone has mapped it (or failed) ...
        if seg is not None and seg.owner:
            seg.unlink()  # ... so the name can go: nothing is left behind if the job dies
    return seg


def shared_array(job: "Job", tag: str, shape: tuple[int, ...], dtype: np.dtype | type,
                 fill: Callable[[np.ndarray], None]) -> np.ndarray:
    """An array of ``shape``/``dtype`` filled by ``fill(out)``: with several local ranks one copy per
    machine in shared memory (filled by local rank 0, read-only by convention for all), otherwise a
    private array.  Every rank calls this at the same point.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if job.local_world_size <= 1:
        out = np.empty(shape, dtype=dtype)
        fill(out)
        return out
    seg = shared_segment(job, tag, max(nbytes, 1), lambda s: fill(s.view(0, shape, dtype)))
    arr = seg.view(0, shape, dtype)
    arr.flags.writeable = False
    return arr


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
