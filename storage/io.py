"""Disk reads for the out-of-core engine: ``pread`` (optionally ``O_DIRECT``) into caller memory.

The gather path of :class:`~ooc.storage.rawarray.RawArray` uses a stitched memory map: convenient,
but every touched page stays mapped, counts as the process's RSS and hides the I/O from any counter.
The out-of-core modes read through :class:`DiskRows` instead:

- ``read_range`` -- one contiguous row range (a partition), cut into near-equal requests of at
  most ``piece`` bytes that never cross a chunk file, ``range_threads`` of them in flight, read in
  place into the caller's aligned buffer (``read_range_async`` returns at once; ``wait()``);
- ``gather`` -- arbitrary rows: sorted, deduplicated, coalesced by :func:`plan_runs` (rows on the
  same or touching pages, or within ``gap`` bytes of each other, share one request), read by Numba
  kernels without the GIL: with ``O_DIRECT`` on Linux through native AIO (``aio_depth`` requests in
  flight, submitted in batches), otherwise by ``pread`` on ``threads`` threads;
- ``O_DIRECT`` (``direct=True``) bypasses the page cache, so the dataset is never silently held in
  memory and measured bandwidth is the disk's; buffers are aligned to 4 KiB (``ALIGN``), range
  requests too, gather requests to the smallest block the file accepts (the device's logical
  block, 512 bytes on most disks: :attr:`DiskRows.gather_align`); where the file system refuses
  ``O_DIRECT`` the reader falls back to buffered reads.

:class:`NeighborReader` reads CSC neighbour lists (``--topology disk``): each call's lists become one
:meth:`DiskRows.gather` of their ids (coalesced requests, many in flight, ``O_DIRECT`` honoured),
and the lists of the nodes in :class:`HotLists` (the hottest nodes' lists, held in memory within a
byte size) are copied from memory instead.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit, types

from ooc.storage.rawarray import RawArray

__all__ = ["ALIGN", "MISS_RUN_BYTES", "AIO_STAGING_BYTES", "AIO_DEPTH", "aligned_empty", "plan_runs",
           "DiskRows", "RangeRead", "NeighborReader", "HotLists", "IOCounters"]

ALIGN = 4096
#: largest miss-read request (bytes): the size of each AIO slot's / pread thread's staging buffer
MISS_RUN_BYTES = 128 << 10
#: the most bytes of AIO staging one reader keeps (``aio_depth`` slots): with more requests in
#: flight than ``AIO_STAGING_BYTES / MISS_RUN_BYTES`` (64) each slot, and so each request, is
#: smaller (at least 4 pages).  On this project's development VM (virtio disk) 12,000 scattered
#: 4 KiB reads took 150 ms with 32 in flight and 85 ms with 128 (no faster with 256).
AIO_STAGING_BYTES = 8 << 20
#: default requests in flight of a reader's native AIO
AIO_DEPTH = 128
#: Smallest request a range read is split into for concurrency (bytes).
MIN_PIECE = 64 << 10
_pread = types.ExternalFunction("pread", types.intp(types.int32, types.voidptr, types.uintp,
                                                    types.int64))


#: O_DIRECT block sizes a gather may be aligned to below ``ALIGN`` (tried smallest first)
_BLOCK_SIZES = (512, 1024, 2048)


def _direct_block(fd: int, path) -> int:
    """The smallest block (512, 1024, 2048, else ``ALIGN``) at which ``fd`` (opened with
    ``O_DIRECT``) accepts a read: one ``preadv`` of that many bytes at that offset into a
    page-aligned buffer.  Linux checks a direct read's offset and length against the device's
    logical block size (``/sys/block/*/queue/logical_block_size``), 512 bytes on most disks
    even where the physical block is 4 KiB; the file system may demand more (it refuses with
    ``EINVAL``).  A file shorter than two blocks proves nothing and gets ``ALIGN``."""
    try:
        size = os.fstat(fd).st_size
    except OSError:
        return ALIGN
    buf = aligned_empty(ALIGN)
    for b in _BLOCK_SIZES:
        if size < 2 * b:
            break
        try:
            if os.preadv(fd, [memoryview(buf[:b])], b) == b:
                return b
        except OSError:
            continue
    return ALIGN


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """uint8 [nbytes] whose data pointer is a multiple of ``align`` (for ``O_DIRECT``)."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    shift = (-raw.ctypes.data) % align
    return raw[shift:shift + nbytes]


class IOCounters:
    """Thread-safe byte / request counters of one reader."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.requests = 0

    def add(self, nbytes: int, requests: int) -> None:
        with self._lock:
            self.bytes_read += int(nbytes)
            self.requests += int(requests)


@njit(cache=True, nogil=True)
def _read_span(fds: np.ndarray, chunk_bytes: int, off: int, nbytes: int, dst: np.ndarray,
               dst_pos: int, piece: int, align: int) -> int:
    """pread bytes ``[off, off + nbytes)`` of the stitched chunk files into ``dst[dst_pos:]``.

    A request never crosses a chunk file; its end inside a file is rounded up to ``align`` (so a last
    chunk whose size is not a page multiple still gets aligned requests; the read stops at EOF).
    Returns the bytes read (short only at the end of the last file), or ``-1 - chunk`` on an error.
    """
    done = 0
    span = ((chunk_bytes + align - 1) // align) * align
    while done < nbytes:
        o = off + done
        c = o // chunk_bytes
        if c >= fds.shape[0]:
            return done
        within = o - c * chunk_bytes
        n = min(piece, span - within, nbytes - done)
        got = _pread(fds[c], dst[dst_pos + done:].ctypes.data, n, within)
        if got < 0:
            return -1 - c
        done += got
        if got < n:
            if c == fds.shape[0] - 1 or within + got >= chunk_bytes:
                if c == fds.shape[0] - 1:
                    return done
                continue
            return -1 - c
    return done


@njit(cache=True, nogil=True)
def _plan_runs(ids: np.ndarray, row_bytes: int, chunk_bytes: int, align: int, gap: int,
               max_run: int, chunk: np.ndarray, start: np.ndarray, size: np.ndarray,
               first: np.ndarray) -> int:
    """Coalesce sorted unique row ids into read requests; returns the number of requests ``m``.

    Request ``r`` reads ``size[r]`` bytes at byte ``start[r]`` of chunk file ``chunk[r]`` and holds
    rows ``ids[first[r]:first[r + 1]]``.  Both ends are widened to ``align``; the next row joins the
    request when it lies in the same chunk file, at most ``gap`` bytes after the request's (aligned)
    end, and the request stays within ``max_run`` bytes.  A request never runs past its chunk
    file's end rounded up to ``align``.  Output arrays need room for ``len(ids)`` requests
    (``first``: one more).
    """
    m = 0
    i = 0
    n = ids.shape[0]
    span = ((chunk_bytes + align - 1) // align) * align
    while i < n:
        s0 = ids[i] * row_bytes
        c = s0 // chunk_bytes
        a = (s0 // align) * align
        b = ((s0 + row_bytes + align - 1) // align) * align
        j = i + 1
        while j < n:
            s = ids[j] * row_bytes
            if s // chunk_bytes != c:
                break
            e = ((s + row_bytes + align - 1) // align) * align
            if (s // align) * align - b > gap or e - a > max_run:
                break
            if e > b:
                b = e
            j += 1
        chunk[m] = c
        start[m] = a - c * chunk_bytes
        size[m] = min(b, c * chunk_bytes + span) - a
        first[m] = i
        m += 1
        i = j
    first[m] = n
    return m


@njit(cache=True, nogil=True)
def _read_runs(fds: np.ndarray, chunk: np.ndarray, start: np.ndarray, size: np.ndarray,
               first: np.ndarray, r0: int, r1: int, ids: np.ndarray, row_bytes: int,
               chunk_bytes: int, staging: np.ndarray, out: np.ndarray, out_pos: np.ndarray) -> tuple:
    """Issue requests ``r0..r1-1`` of :func:`_plan_runs` (one ``pread`` each, into ``staging``) and
    copy every row ``ids[k]`` of a request to ``out[out_pos[k]]``.

    Returns:
        ``(bytes requested, requests, chunk of a failed/short read or -1)``.
    """
    total = 0
    for r in range(r0, r1):
        c = chunk[r]
        got = _pread(fds[c], staging.ctypes.data, size[r], start[r])
        total += size[r]
        if got < 0:
            return total, r - r0 + 1, c
        base = c * chunk_bytes + start[r]
        for k in range(first[r], first[r + 1]):
            s = ids[k] * row_bytes - base
            if s + row_bytes > got:
                return total, r - r0 + 1, c
            out[out_pos[k], :] = staging[s:s + row_bytes]
    return total, r1 - r0, -1


# Linux native AIO (io_submit / io_getevents) for O_DIRECT gathers: one thread keeps ``depth``
# requests in flight and submits them in batches, so the block layer plugs them and the virtio
# queue is kicked once per batch instead of once per pread (measured on the shared VM: 5.8 us of
# system CPU per 4 KiB request instead of 14 us with pread threads).
_syscall = types.ExternalFunction("syscall", types.intp(types.intp, types.intp, types.intp,
                                                        types.intp, types.intp, types.intp))
_AIO_NR = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}  # setup, destroy, getevents, submit


@njit(cache=True, nogil=True)
def _aio_read_runs(nr_getevents: int, nr_submit: int, ctx: int, fds: np.ndarray,
                   chunk: np.ndarray, start: np.ndarray, size: np.ndarray, first: np.ndarray,
                   ids: np.ndarray, row_bytes: int, chunk_bytes: int, staging: np.ndarray,
                   iocbs: np.ndarray, subptr: np.ndarray, events: np.ndarray, slot_req: np.ndarray,
                   out: np.ndarray, out_pos: np.ndarray) -> tuple:
    """All requests of :func:`_plan_runs` through one AIO context, ``depth = len(iocbs)`` in flight.

    ``staging`` is uint8 ``[depth, max_run]`` (rows 4 KiB aligned); ``iocbs`` uint64 ``[depth, 8]``
    (``struct iocb``), ``subptr`` uint64 ``[depth]``, ``events`` int64 ``[depth, 4]``
    (``struct io_event``), ``slot_req`` int64 ``[depth]`` scratch.  A completed request's rows are
    copied to ``out[out_pos[k]]`` as it completes.  On any error no more requests are submitted and
    the ones in flight are reaped before returning.

    Returns:
        ``(bytes requested, requests, status)``: status -1 = ok, ``c >= 0`` = short or failed read
        of chunk file ``c``, -2 = ``io_submit`` refused (nothing of that batch in flight), -3 =
        ``io_getevents`` failed (requests may still be in flight: destroy the context).
    """
    depth = iocbs.shape[0]
    m = chunk.shape[0]
    free = np.empty(depth, dtype=np.int64)
    subk = np.empty(depth, dtype=np.int64)
    for k in range(depth):
        free[k] = k
    nfree = depth
    inflight = 0
    i = 0
    total = 0
    reqs = 0
    status = -1
    ev_addr = events.ctypes.data
    while (i < m and status == -1) or inflight > 0:
        nsub = 0
        while status == -1 and i < m and nfree > 0:
            nfree -= 1
            k = free[nfree]
            slot_req[k] = i
            iocbs[k, 0] = k
            iocbs[k, 1] = 0
            iocbs[k, 2] = np.uint64(fds[chunk[i]]) << np.uint64(32)  # opcode 0 = PREAD
            iocbs[k, 3] = np.uint64(staging[k].ctypes.data)
            iocbs[k, 4] = size[i]
            iocbs[k, 5] = start[i]
            iocbs[k, 6] = 0
            iocbs[k, 7] = 0
            subptr[nsub] = np.uint64(iocbs[k].ctypes.data)
            subk[nsub] = k
            nsub += 1
            i += 1
        if nsub > 0:
            r = _syscall(nr_submit, ctx, nsub, subptr.ctypes.data, 0, 0)
            if r < 0:
                r = 0
            inflight += r
            if r < nsub:  # the rest of the batch was not queued: give its slots back, stop
                for q in range(r, nsub):
                    free[nfree] = subk[q]
                    nfree += 1
                status = -2
        if inflight == 0:
            break
        got = _syscall(nr_getevents, ctx, 1, depth, ev_addr, 0)
        if got <= 0:
            return total, reqs, -3
        for e in range(got):
            k = events[e, 0]
            res = events[e, 2]
            r = slot_req[k]
            c = chunk[r]
            total += size[r]
            reqs += 1
            if res < 0:
                if status == -1:
                    status = c
            else:
                base = c * chunk_bytes + start[r]
                for t in range(first[r], first[r + 1]):
                    s = ids[t] * row_bytes - base
                    if s + row_bytes > res:
                        if status == -1:
                            status = c
                        break
                    out[out_pos[t], :] = staging[k, s:s + row_bytes]
            free[nfree] = k
            nfree += 1
        inflight -= got
    return total, reqs, status


class _AioContext:
    """One Linux AIO context with ``depth`` request slots and their 4 KiB-aligned staging.

    Raises:
        OSError: no AIO on this machine (architecture, kernel or ``fs.aio-max-nr``).
    """

    def __init__(self, depth: int, max_run: int) -> None:
        import ctypes
        import platform
        nr = _AIO_NR.get(platform.machine())
        if nr is None:
            raise OSError(f"no AIO syscall numbers for {platform.machine()}")
        self.nr_setup, self.nr_destroy, self.nr_getevents, self.nr_submit = nr
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        ctx = ctypes.c_ulong(0)
        if self._libc.syscall(ctypes.c_long(self.nr_setup), ctypes.c_long(depth),
                              ctypes.byref(ctx)) != 0:
            raise OSError(ctypes.get_errno(), "io_setup failed")
        self.ctx = int(ctx.value)
        self.depth = depth
        self.staging = aligned_empty(depth * max_run).reshape(depth, max_run)
        self.iocbs = np.zeros((depth, 8), dtype=np.uint64)
        self.subptr = np.zeros(depth, dtype=np.uint64)
        self.events = np.zeros((depth, 4), dtype=np.int64)
        self.slot_req = np.zeros(depth, dtype=np.int64)
        self.lock = threading.Lock()

    def read(self, fds, chunk, start, size, first, ids, row_bytes, chunk_bytes, out, out_pos):
        """:func:`_aio_read_runs` under this context's lock."""
        with self.lock:
            return _aio_read_runs(self.nr_getevents, self.nr_submit, self.ctx, fds, chunk, start,
                                  size, first, ids, row_bytes, chunk_bytes, self.staging,
                                  self.iocbs, self.subptr, self.events, self.slot_req, out, out_pos)

    def close(self) -> None:
        """io_destroy (waits for requests still in flight)."""
        import ctypes
        if self.ctx:
            self._libc.syscall(ctypes.c_long(self.nr_destroy), ctypes.c_ulong(self.ctx))
            self.ctx = 0


def plan_runs(ids: np.ndarray, row_bytes: int, chunk_bytes: int, align: int = ALIGN, gap: int = 0,
              max_run: int = 1 << 20) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read requests covering rows ``ids`` of an axis-0-chunked array (see :meth:`DiskRows.gather`).

    Args:
        ids: int64 [n] row ids, sorted ascending, unique.
        row_bytes: bytes per row; chunk_bytes: bytes per chunk file (a multiple of ``row_bytes``).
        align: request alignment in bytes (4096 for ``O_DIRECT``, 1 for buffered reads).
        gap: largest hole, in bytes, read through to merge two rows into one request (0: only rows
            on the same or touching ``align`` blocks share a request).
        max_run: largest request in bytes (the staging buffer's size); at least one aligned row.

    Returns:
        ``(chunk int32 [m], start int64 [m], size int64 [m], first int64 [m+1])``: request ``r``
        reads ``size[r]`` bytes at byte ``start[r]`` of chunk file ``chunk[r]`` and holds rows
        ``ids[first[r]:first[r+1]]``.

    Raises:
        ValueError: ``max_run`` smaller than one aligned row.

    >>> c, s, z, f = plan_runs(np.array([0, 1, 9, 40]), 512, 1 << 20, 4096, gap=4096)
    >>> s.tolist(), z.tolist(), f.tolist()
    ([0, 20480], [8192, 4096], [0, 3, 4])
    """
    if max_run < -(-(row_bytes + align - 1) // align) * align:
        raise ValueError(f"max_run {max_run} B cannot hold one {row_bytes}-byte row")
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    n = ids.shape[0]
    chunk = np.empty(n, dtype=np.int32)
    start = np.empty(n, dtype=np.int64)
    size = np.empty(n, dtype=np.int64)
    first = np.empty(n + 1, dtype=np.int64)
    m = _plan_runs(ids, row_bytes, chunk_bytes, align, gap, max_run, chunk, start, size, first)
    return chunk[:m], start[:m], size[:m], first[:m + 1]


class RangeRead:
    """A :meth:`DiskRows.read_range_async` in flight; :meth:`wait` returns the bytes read.

    Raises (from :meth:`wait`):
        OSError: a read failed or came back short (truncated dataset).
    """

    def __init__(self, rows: "DiskRows", items: list, futures: list, stop_byte: int,
                 nbytes: int) -> None:
        self._rows = rows
        self._items = items
        self._futures = futures
        self._stop_byte = stop_byte
        self.nbytes = nbytes

    def wait(self) -> int:
        got = [f.result() if hasattr(f, "result") else f for f in self._futures]
        for (o, n, _), g in zip(self._items, got):
            if g < 0:
                raise OSError(f"{self._rows.arr.chunk_path(-1 - g)}: read failed or short; the "
                              "dataset is truncated or corrupt")
            if g < n and o + g < self._stop_byte:
                raise OSError(f"{self._rows.arr.path}: short read at byte {o + g}; the dataset is "
                              "truncated")
        return self.nbytes


class DiskRows:
    """Row reads from an uncompressed, axis-0-chunked array (a :class:`RawArray`'s chunk files).

    Two kinds of reads, each with several requests in flight on its own thread pool (a partition
    load does not queue behind a batch's misses or the other way round):

    - ranges (:meth:`read_range`, a partition): split into requests of at most ``piece`` bytes
      (never crossing a chunk file), ``range_threads`` in flight, read in place into the caller's
      aligned buffer (no bounce copy);
    - gathers (:meth:`gather`, scattered rows): sorted, deduplicated, coalesced by
      :func:`plan_runs` (rows within ``gap`` bytes share a request); with O_DIRECT on Linux
      (x86_64, aarch64) the calling thread keeps ``aio_depth`` requests in flight through native
      AIO (``io_submit`` in batches); otherwise the requests are spread over ``threads`` pread
      threads by bytes.  Each request lands in a staging buffer of ``max_run`` bytes from which
      its rows are copied to their output positions.

    Args:
        arr: the on-disk array.
        direct: open with ``O_DIRECT`` (falls back to buffered reads where unsupported; see
            :attr:`direct`).
        threads: gather threads (requests in flight for misses).
        piece: largest range request in bytes (rounded down to ``ALIGN``).
        range_threads: range requests in flight (default ``min(threads, 4)``).
        gap: largest hole in bytes that a gather reads through to merge two rows (default 16 KiB
            with ``O_DIRECT``, 0 for buffered reads).
        max_run: largest gather request in bytes (staging per thread / AIO slot); with native AIO
            at most ``AIO_STAGING_BYTES / aio_depth`` (but at least 4 pages and one row).
        aio_depth: gather requests in flight with native AIO (0 = pread threads only).
        gather_align: with O_DIRECT, the block a gather request's offset and size are rounded
            to (:attr:`gather_align`): 512, 1024, 2048 or 4096 bytes; None = the smallest the
            file accepts, found by one probing read (see :func:`_direct_block`).  Ranges are
            always rounded to ``ALIGN``.

    Attributes:
        gather_align: bytes a gather request is aligned to (1 for buffered reads): the device's
            logical block where ``O_DIRECT`` accepts it (512 bytes on most disks, whose physical
            block is often 4 KiB), else ``ALIGN``.  A 512-byte row then costs 512 bytes of
            transfer, not 4 KiB.

    Raises:
        FileNotFoundError: a chunk file is missing.
        ValueError: ``gather_align`` not one of the sizes above.
    """

    def __init__(self, arr: RawArray, direct: bool = False, threads: int = 8,
                 piece: int = 1 << 20, range_threads: int | None = None, gap: int | None = None,
                 max_run: int = MISS_RUN_BYTES, aio_depth: int = AIO_DEPTH,
                 gather_align: int | None = None) -> None:
        self.arr = arr
        self.shape = arr.shape
        self.dtype = arr.dtype
        self.row_bytes = arr.row_bytes
        self.chunk_bytes = arr.chunk_bytes
        self.nbytes = arr.nbytes
        self.piece = max(ALIGN, piece // ALIGN * ALIGN)
        self.threads = max(1, threads)
        self.range_threads = max(1, range_threads if range_threads is not None
                                 else min(self.threads, 4))
        self.direct = False
        fds = []
        for i in range(arr.num_chunks):
            path = arr.chunk_path(i)
            fd = None
            if direct and hasattr(os, "O_DIRECT"):
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                    self.direct = True
                except OSError:
                    fd = None
            if fd is None:
                fd = os.open(path, os.O_RDONLY)
            fds.append(fd)
        if direct and self.direct and arr.num_chunks > 1 and self.chunk_bytes % ALIGN:
            for fd in fds:  # chunk boundaries not page aligned: O_DIRECT cannot address them
                os.close(fd)
            fds = [os.open(arr.chunk_path(i), os.O_RDONLY) for i in range(arr.num_chunks)]
            self.direct = False
        self.fds = np.asarray(fds, dtype=np.int32)
        self.align = ALIGN if self.direct else 1
        if not self.direct:
            self.gather_align = 1
        elif gather_align is not None:
            if gather_align not in _BLOCK_SIZES + (ALIGN,):
                raise ValueError(f"gather_align {gather_align} is not one of "
                                 f"{', '.join(map(str, _BLOCK_SIZES + (ALIGN,)))}")
            self.gather_align = int(gather_align)
        else:
            self.gather_align = _direct_block(int(self.fds[0]), arr.chunk_path(0))
        self.gap = (16 << 10 if self.direct else 0) if gap is None else max(0, int(gap))
        if self.direct and aio_depth > 0:  # the AIO slots' staging stays within AIO_STAGING_BYTES
            slot = AIO_STAGING_BYTES // aio_depth // ALIGN * ALIGN
            max_run = min(int(max_run), max(4 * ALIGN, slot))
        # whole pages, so that every staging slot stays page aligned; at least one row's request
        self.max_run = max(int(max_run) if not self.direct else -(-int(max_run) // ALIGN) * ALIGN,
                           -(-(self.row_bytes + self.align - 1) // self.align) * self.align)
        self.counters = IOCounters()
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ooc-read") \
            if self.threads > 1 else None
        self._range_pool = ThreadPoolExecutor(self.range_threads, thread_name_prefix="ooc-range") \
            if self.range_threads > 1 else None
        self._staging: list = []  # per-thread pread staging, made on first use
        self._aio = None
        if self.direct and aio_depth > 0:
            try:
                self._aio = _AioContext(aio_depth, self.max_run)
            except OSError:
                self._aio = None  # no native AIO here: pread threads

    @property
    def aio(self) -> bool:
        """Whether gathers use Linux native AIO (O_DIRECT and ``io_setup`` available)."""
        return self._aio is not None

    def close(self) -> None:
        if getattr(self, "_aio", None) is not None:
            self._aio.close()
            self._aio = None
        for name in ("_pool", "_range_pool"):
            pool = getattr(self, name, None)
            if pool is not None:
                pool.shutdown(wait=True)
                setattr(self, name, None)
        for fd in self.fds.tolist():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = np.empty(0, dtype=np.int32)

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def _map(self, fn, items: list) -> list:
        if self._pool is None or len(items) == 1:
            return [fn(*it) for it in items]
        return list(self._pool.map(lambda it: fn(*it), items))

    # ------------------------------------------------------------------ ranges
    def span(self, start: int, stop: int) -> tuple[int, int, int]:
        """``(file offset read from, bytes read, shift)`` for rows ``[start, stop)``: with O_DIRECT
        the span is widened to ``ALIGN`` boundaries and the rows begin ``shift`` bytes into it."""
        s, e = start * self.row_bytes, stop * self.row_bytes
        a = s // self.align * self.align
        b = -(-e // self.align) * self.align
        return a, b - a, s - a

    def range_requests(self, start: int, stop: int) -> list[tuple[int, int]]:
        """``(byte offset, bytes)`` of the requests that :meth:`read_range` issues for rows
        ``[start, stop)``: the aligned span cut at chunk-file boundaries, then into near-equal
        requests of at most ``piece`` bytes, ``range_threads`` of them (so that many are in
        flight) unless that would make them smaller than ``MIN_PIECE`` (64 KiB)."""
        off, nbytes, _ = self.span(start, stop)
        out = []
        end = off + nbytes
        pos = off
        last = self.arr.num_chunks - 1
        while pos < end:  # one segment per chunk file; the last one's span may pass its EOF
            seg_end = end if pos // self.chunk_bytes >= last else \
                min(end, (pos // self.chunk_bytes + 1) * self.chunk_bytes)
            seg = seg_end - pos
            k = max(-(-seg // self.piece), min(self.range_threads, -(-seg // MIN_PIECE)))
            per = -(-seg // k)  # near-equal requests, rounded up to whole aligned blocks
            per = -(-per // self.align) * self.align
            p = pos
            while p < seg_end:
                n = min(per, seg_end - p)
                out.append((p, n))
                p += n
            pos = seg_end
        return out

    def read_range_async(self, start: int, stop: int, dst: np.ndarray) -> RangeRead:
        """Start reading rows ``[start, stop)`` into the uint8 buffer ``dst`` (4 KiB aligned with
        O_DIRECT) at byte ``span(start, stop)[2]``; requests as :meth:`range_requests`,
        ``range_threads`` in flight.  ``wait()`` on the result returns the bytes read.

        Raises:
            IndexError: rows outside the array; ValueError: ``dst`` too small or misaligned.
            CorruptChunkError: a chunk fails its checksum (the array has a verifier; each chunk
            is checked once per process, before its first read).
        """
        if not 0 <= start <= stop <= self.shape[0]:
            raise IndexError(f"{self.arr.path}: rows [{start}, {stop}) outside [0, {self.shape[0]})")
        off, nbytes, shift = self.span(start, stop)
        if dst.dtype != np.uint8 or dst.shape[0] < nbytes:
            raise ValueError(f"destination of {dst.shape[0]} bytes for a {nbytes}-byte read")
        if self.direct and dst.ctypes.data % ALIGN:
            raise ValueError("O_DIRECT destination is not 4 KiB aligned")
        v = getattr(self.arr, "verifier", None)  # chunks checked once per process, on first use
        if v is not None and not v.complete:
            v.ensure_rows(start, stop, self.arr.chunk_rows)
        reqs = self.range_requests(start, stop) if nbytes else []
        items = [(o, n, o - off) for o, n in reqs]
        args = [(self.fds, self.chunk_bytes, o, n, dst, d, n, self.align) for o, n, d in items]
        if self._range_pool is None or len(args) == 1:
            futures = [_read_span(*a) for a in args]
        else:
            futures = [self._range_pool.submit(_read_span, *a) for a in args]
        self.counters.add(nbytes, len(items))
        return RangeRead(self, items, futures, stop * self.row_bytes, nbytes)

    def read_range(self, start: int, stop: int, dst: np.ndarray) -> int:
        """Read rows ``[start, stop)`` into the uint8 buffer ``dst`` (aligned with O_DIRECT) at byte
        ``span(start, stop)[2]``; returns bytes read from disk (:meth:`read_range_async` + wait).

        Raises:
            ValueError: ``dst`` too small or misaligned; OSError: short read (truncated dataset).
        """
        return self.read_range_async(start, stop, dst).wait()

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a new array of the array's dtype and shape: a view into the
        aligned buffer they were read into, which it keeps alive (at most 2 x ``ALIGN`` bytes beyond
        the rows; the items stay aligned: the rows start a multiple of the item size into it)."""
        off, nbytes, shift = self.span(start, stop)
        buf = aligned_empty(nbytes)
        self.read_range(start, stop, buf)
        n = (stop - start) * self.row_bytes
        return buf[shift:shift + n].view(self.dtype).reshape((stop - start, *self.shape[1:]))

    # ------------------------------------------------------------------ gathers
    def plan(self, uniq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:func:`plan_runs` of sorted unique row ids with this reader's alignment, gap, run cap."""
        return plan_runs(uniq, self.row_bytes, self.chunk_bytes, self.gather_align, self.gap,
                         self.max_run)

    def gather(self, ids: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Rows ``arr[ids]`` (any order, duplicates allowed) with sorted, coalesced reads.

        The unique ids are coalesced into requests by :meth:`plan` and the requests are split into
        ``threads`` contiguous groups of near-equal bytes, one thread each (that many in flight).
        Without duplicates rows are copied from the staging buffers straight to ``out``.

        Args:
            ids: int64 [n] row ids in ``[0, rows)``.
            out: optional destination ``(n, *row_shape)`` of the array's dtype, C-contiguous.

        Returns:
            ``(rows, bytes read from disk)`` -- with O_DIRECT whole blocks of
            :attr:`gather_align` bytes are read, gaps
            merged into a request too, and all of it counted.

        Raises:
            IndexError: an id is out of range; OSError: a short read.
            CorruptChunkError: a chunk fails its checksum (checked once per process, first use).
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        if out is None:
            out = np.empty((n, *self.shape[1:]), dtype=self.dtype)
        if n == 0:
            return out, 0
        if ids.min() < 0 or ids.max() >= self.shape[0]:
            bad = ids[(ids < 0) | (ids >= self.shape[0])][0]
            raise IndexError(f"{self.arr.path}: row id {bad} outside [0, {self.shape[0]})")
        flat = out.reshape(n, -1).view(np.uint8).reshape(n, self.row_bytes)
        order = np.argsort(ids, kind="stable")
        sids = ids[order]
        dup = n > 1 and bool((sids[1:] == sids[:-1]).any())
        if dup:
            uniq, inverse = np.unique(ids, return_inverse=True)
            dst = np.empty((uniq.shape[0], self.row_bytes), dtype=np.uint8)
            pos = np.arange(uniq.shape[0], dtype=np.int64)
        else:
            uniq, dst, pos = sids, flat, order
        v = getattr(self.arr, "verifier", None)
        if v is not None and not v.complete:
            v.ensure(np.unique(uniq // self.arr.chunk_rows))
        chunk, start, size, first = self.plan(uniq)
        if self._aio is not None:
            total, reqs, status = self._aio.read(self.fds, chunk, start, size, first, uniq,
                                                 self.row_bytes, self.chunk_bytes, dst, pos)
            if status >= 0:
                raise OSError(f"{self.arr.chunk_path(status)}: short read; the dataset is truncated")
            if status == -1:
                self.counters.add(total, reqs)
                if dup:
                    np.take(dst, inverse.reshape(-1), axis=0, out=flat)
                return out, total
            if status == -3:  # io_getevents failed: drop the context (waits for its requests)
                self._aio.close()
                self._aio = None
            # -2 (io_submit refused) or -3: read everything again with pread threads
        m = chunk.shape[0]
        k = min(self.threads, m)
        if k > 1:  # contiguous groups of requests with near-equal bytes
            cum = np.cumsum(size)
            cuts = np.searchsorted(cum, cum[-1] * np.arange(1, k) / k, side="left") + 1
            bounds = np.unique(np.concatenate([[0], np.minimum(cuts, m), [m]]))
        else:
            bounds = np.array([0, m])
        while len(self._staging) < self.threads:
            self._staging.append(aligned_empty(self.max_run))
        items = [(self.fds, chunk, start, size, first, int(bounds[t]), int(bounds[t + 1]), uniq,
                  self.row_bytes, self.chunk_bytes, self._staging[t], dst, pos)
                 for t in range(bounds.shape[0] - 1)]
        results = self._map(_read_runs, items)
        total = reqs = 0
        for nb, rq, err in results:
            total += nb
            reqs += rq
            if err >= 0:
                raise OSError(f"{self.arr.chunk_path(err)}: short read; the dataset is truncated")
        self.counters.add(total, reqs)
        if dup:
            np.take(dst, inverse.reshape(-1), axis=0, out=flat)
        return out, total


@njit(cache=True, nogil=True)
def _list_rows(indptr: np.ndarray, nodes: np.ndarray, rows: np.ndarray) -> int:
    """Row ids (positions in ``indices``) of the lists of ``nodes``, list after list, into ``rows``;
    returns how many (``rows`` needs room for the lists' total length)."""
    m = 0
    for i in range(nodes.shape[0]):
        v = nodes[i]
        for r in range(indptr[v], indptr[v + 1]):
            rows[m] = r
            m += 1
    return m


@njit(cache=True, nogil=True)
def _place_lists(ptr: np.ndarray, which: np.ndarray, src: np.ndarray, out: np.ndarray) -> None:
    """Copy the lists packed one after another in ``src`` to ``out[ptr[i]:ptr[i + 1]]`` for
    ``i = which[0], which[1], ...`` (in that order)."""
    c = 0
    for j in range(which.shape[0]):
        i = which[j]
        a = ptr[i]
        d = ptr[i + 1] - a
        for t in range(d):
            out[a + t] = src[c + t]
        c += d


@njit(cache=True, nogil=True, inline="always")
def _popcount(x: np.uint64) -> np.int64:
    """Set bits of a 64-bit word (SWAR)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True, nogil=True)
def _hot_rank(bits: np.ndarray, rank: np.ndarray) -> int:
    """``rank[w]`` = hot nodes in the words before word ``w`` of the bitmap; returns H."""
    c = 0
    for w in range(bits.shape[0]):
        rank[w] = c
        c += _popcount(bits[w])
    return c


@njit(cache=True, nogil=True)
def _hot_nodes(bits: np.ndarray, out: np.ndarray) -> None:
    """The hot nodes of the bitmap, ascending, into ``out`` (int64 [H])."""
    k = 0
    for w in range(bits.shape[0]):
        x = bits[w]
        b = 0
        while x != 0:
            if x & np.uint64(1):
                out[k] = w * 64 + b
                k += 1
            x >>= np.uint64(1)
            b += 1


@njit(cache=True, nogil=True)
def _hot_slots(bits: np.ndarray, rank: np.ndarray, nodes: np.ndarray, slot: np.ndarray) -> int:
    """``slot[i]`` = rank of ``nodes[i]`` among the hot nodes (bit ``v % 64`` of word ``v // 64``
    set), else -1: the word's rank plus the set bits below it, two memory accesses per node;
    returns the number of hot nodes."""
    hits = 0
    for i in range(nodes.shape[0]):
        v = nodes[i]
        w = bits[v >> 6]
        b = np.uint64(v & 63)
        if (w >> b) & np.uint64(1):
            slot[i] = rank[v >> 6] + _popcount(w & ((np.uint64(1) << b) - np.uint64(1)))
            hits += 1
        else:
            slot[i] = -1
    return hits


@njit(cache=True, nogil=True)
def _copy_hot(ptr: np.ndarray, slot: np.ndarray, hot_ptr: np.ndarray, hot_ids: np.ndarray,
              out: np.ndarray) -> None:
    """``out[ptr[i]:ptr[i + 1]]`` = hot list ``slot[i]`` for every ``i`` with ``slot[i] >= 0``."""
    for i in range(slot.shape[0]):
        s = slot[i]
        if s < 0:
            continue
        a = ptr[i]
        b = hot_ptr[s]
        for t in range(ptr[i + 1] - a):
            out[a + t] = hot_ids[b + t]


@njit(cache=True, nogil=True)
def _add_draw_scores(ip: np.ndarray, idx: np.ndarray, fanout: int, score: np.ndarray) -> None:
    """For each list ``idx[ip[j]:ip[j + 1]]`` (a block of lists), add to ``score[u]`` of every id
    ``u`` in it the chance that one sampling of that list draws ``u``: ``min(1, fanout / deg)``
    (``fanout < 0``: 1, all neighbours)."""
    for j in range(ip.shape[0] - 1):
        d = ip[j + 1] - ip[j]
        if d == 0:
            continue
        w = 1.0 if fanout < 0 or fanout >= d else fanout / d
        for t in range(ip[j], ip[j + 1]):
            score[idx[t]] += w


@njit(cache=True, nogil=True)
def _select_hot(indptr: np.ndarray, score: np.ndarray, itemsize: int, per_node: int, room: int,
                bits: np.ndarray) -> tuple:
    """Set in ``bits`` (uint64 words, node ``v`` = bit ``v % 64`` of word ``v // 64``) the nodes of the highest
    ``score / (per_node + itemsize * degree)`` (expected draws per byte held) whose cost
    ``per_node + itemsize * degree`` sums to at most ``room`` bytes; nodes of degree 0 (nothing
    to read) are never chosen, nodes of score 0 last (they are read only as seeds).  When every
    list fits all are taken; else the ratio threshold is found by bisection (60 halvings) and the
    nodes inside the final interval are taken in id order while they fit.  Returns
    ``(nodes, edges)`` chosen."""
    n = score.shape[0]
    hi = 0.0
    total = 0
    for v in range(n):
        d = indptr[v + 1] - indptr[v]
        if d > 0:
            total += per_node + itemsize * d
            r = score[v] / (per_node + itemsize * d)
            if r > hi:
                hi = r
    if room <= 0:
        return 0, 0
    if total <= room:  # the whole topology fits
        count = 0
        for v in range(n):
            d = indptr[v + 1] - indptr[v]
            if d > 0:
                bits[v >> 6] |= np.uint64(1) << np.uint64(v & 63)
                count += 1
        return count, indptr[n] - indptr[0]
    lo = 0.0
    for _ in range(60):  # invariant: the nodes with ratio > hi fit
        mid = 0.5 * (lo + hi)
        cost = 0
        for v in range(n):
            d = indptr[v + 1] - indptr[v]
            if d > 0 and score[v] / (per_node + itemsize * d) > mid:
                cost += per_node + itemsize * d
                if cost > room:
                    break
        if cost > room:
            lo = mid
        else:
            hi = mid
    used = 0
    count = 0
    edges = 0
    for v in range(n):  # everything above the threshold
        d = indptr[v + 1] - indptr[v]
        if d > 0 and score[v] / (per_node + itemsize * d) > hi:
            bits[v >> 6] |= np.uint64(1) << np.uint64(v & 63)
            used += per_node + itemsize * d
            count += 1
            edges += d
    for v in range(n):  # then the band (lo, hi], in id order, while it fits
        d = indptr[v + 1] - indptr[v]
        if d > 0:
            r = score[v] / (per_node + itemsize * d)
            if (r > lo or lo == 0.0) and r <= hi and used + per_node + itemsize * d <= room:
                bits[v >> 6] |= np.uint64(1) << np.uint64(v & 63)
                used += per_node + itemsize * d
                count += 1
                edges += d
    return count, edges


def _empty(tag: str, shape: tuple, dtype, fill) -> np.ndarray:
    """A private array filled by ``fill(out)`` (``tag`` unused: the shared-memory variant names it)."""
    out = np.empty(shape, dtype=dtype)
    fill(out)
    return out


class HotLists:
    """The neighbour lists of the hottest nodes, held in memory (``--hot-topology SIZE``).

    Arrays (together :attr:`nbytes`, at most the size asked for):

    - ``bits``  uint64 [ceil(N / 64)] -- bitmap of the hot nodes (node ``v``: bit ``v % 64`` of
      word ``v // 64``);
    - ``rank``  int64 [ceil(N / 64)] -- hot nodes before each word, so that a node's slot is
      ``rank[v // 64]`` plus the set bits below it (O(1), no search);
    - ``ptr``   int64 [H + 1] -- ``ids[ptr[k]:ptr[k + 1]]`` is the list of the k-th hot node (in id
      order);
    - ``ids``   [ptr[-1]] of the indices dtype -- the lists exactly as stored.

    Which nodes (:meth:`select`): the score of node ``u`` is its expected number of draws when every
    list is sampled once, ``sum over the lists v that hold u of min(1, fanout / deg(v))`` -- the
    in-degree-weighted count of the lists it appears in, i.e. how often sampling makes ``u`` a
    frontier node whose own list is read next.  Nodes are ranked by score per byte held (list
    plus 8 bytes of offset) and taken greedily until the size is spent; nodes no list holds
    (score 0, read only as seeds) come last.  This is the degree-based hot set of PaGraph (Lin et
    al., SoCC'20: cache the nodes with the most out-edges, those most often sampled) and GNNLab
    (Yang et al., EuroSys'22, which finds degree a good proxy of sampling frequency on power-law
    graphs); weighting each occurrence by the draw probability of its list corrects for
    high-in-degree lists, of which a fanout draws only a few.  Computing it reads the topology
    once, sequentially, at start-up.
    """

    PER_NODE = 8  # bytes of index per hot node: its ``ptr`` entry

    def __init__(self, bits: np.ndarray, rank: np.ndarray, ptr: np.ndarray, ids: np.ndarray) -> None:
        self.bits, self.rank, self.ptr, self.ids = bits, rank, ptr, ids

    @property
    def nbytes(self) -> int:
        """Bytes held: the bitmap, its ranks, offsets and lists."""
        return int(self.bits.nbytes + self.rank.nbytes + self.ptr.nbytes + self.ids.nbytes)

    @property
    def num_nodes(self) -> int:
        """H, the hot nodes."""
        return int(self.ptr.shape[0] - 1)

    def node_ids(self) -> np.ndarray:
        """int64 [H] the hot nodes, ascending (list ``k`` is the ``k``-th's)."""
        out = np.empty(self.num_nodes, dtype=np.int64)
        _hot_nodes(self.bits, out)
        return out

    @staticmethod
    def fixed_bytes(num_nodes: int) -> int:
        """Bytes of a hot set over ``num_nodes`` nodes before any list: bitmap, ranks, ``ptr[0]``."""
        return 16 * ((int(num_nodes) + 63) // 64) + 8

    @staticmethod
    def scores(indices: RawArray, indptr: np.ndarray, fanout: int = -1,
               block_edges: int = 1 << 22) -> np.ndarray:
        """float32 [N] expected draws of every node (see the class docstring), from one
        sequential pass over ``indices`` in blocks of about ``block_edges`` ids."""
        n = indptr.shape[0] - 1
        score = np.zeros(n, dtype=np.float32)
        a = 0
        while a < n:
            b = int(np.searchsorted(indptr, indptr[a] + block_edges, side="right")) - 1
            b = min(max(b, a + 1), n)
            ea, eb = int(indptr[a]), int(indptr[b])
            if eb > ea:
                _add_draw_scores(np.ascontiguousarray(indptr[a:b + 1] - ea), indices.read(ea, eb),
                                 int(fanout), score)
            a = b
        return score

    @classmethod
    def select(cls, indptr: np.ndarray, score: np.ndarray, nbytes: int, itemsize: int,
               out: np.ndarray | None = None) -> np.ndarray:
        """Bitmap (uint64 [ceil(N / 64)], see the class docstring) of the hot nodes of a set of at
        most ``nbytes`` bytes (all zeros when ``nbytes`` does not cover the fixed part).

        Args:
            indptr: int64 [N+1] CSC offsets; score: float32 [N] (:meth:`scores`).
            nbytes: the size of the whole hot set in bytes; itemsize: bytes per stored id.
            out: optional destination bitmap (zeroed here).
        """
        n = indptr.shape[0] - 1
        bits = np.zeros((n + 63) // 64, dtype=np.uint64) if out is None else out
        bits[...] = 0
        room = int(nbytes) - cls.fixed_bytes(n)
        if room > 0 and n:
            _select_hot(np.ascontiguousarray(indptr, dtype=np.int64), score, int(itemsize),
                        cls.PER_NODE, room, bits)
        return bits

    @classmethod
    def build(cls, reader: "NeighborReader", nbytes: int, fanout: int = -1,
              alloc=_empty, chunk_nodes: int = 1 << 16, bits: np.ndarray | None = None) -> "HotLists":
        """The hot set of at most ``nbytes`` bytes over ``reader``'s topology.

        Args:
            reader: the :class:`NeighborReader` of the on-disk lists (it loads the hot lists).
            nbytes: size of the hot set in bytes (:attr:`nbytes` is at most this).
            fanout: the largest fanout of the sampling hops (-1: all neighbours), for the score.
            alloc: ``alloc(tag, shape, dtype, fill) -> array`` (e.g. shared memory between local
                ranks: ``fill(out)`` runs once per machine); default a private array.
            chunk_nodes: hot lists loaded per read.
            bits: the bitmap :meth:`select` gives for ``nbytes`` and ``fanout``, when already
                computed (the budget split's; the scoring pass over the lists is then skipped).

        Raises:
            OSError: a short read.
        """
        indptr = reader.indptr
        n = indptr.shape[0] - 1
        item = reader.itemsize
        chosen = bits
        bits = alloc("hot_bits", ((n + 63) // 64,), np.uint64,
                     (lambda o: o.__setitem__(..., chosen)) if chosen is not None else
                     (lambda o: cls.select(indptr, cls.scores(reader.indices, indptr, fanout),
                                           nbytes, item, o)))
        rank = alloc("hot_rank", bits.shape, np.int64, lambda o: _hot_rank(bits, o))
        h = int(rank[-1] + _popcount(bits[-1])) if n else 0
        nodes = np.empty(h, dtype=np.int64)  # transient: the hot nodes, ascending
        _hot_nodes(bits, nodes)

        def fill_ptr(o: np.ndarray) -> None:
            o[0] = 0
            np.cumsum(indptr[nodes + 1] - indptr[nodes], out=o[1:])

        ptr = alloc("hot_ptr", (h + 1,), np.int64, fill_ptr)

        def fill_ids(o: np.ndarray) -> None:
            for a in range(0, h, chunk_nodes):
                b = min(a + chunk_nodes, h)
                reader.read(nodes[a:b], out=o[ptr[a]:ptr[b]])

        ids = alloc("hot_ids", (int(ptr[-1]),), reader.indices.dtype, fill_ids)
        reader.reset_stats()  # start-up reads are not sampling reads
        return cls(bits, rank, ptr, ids)

    def lookup(self, nodes: np.ndarray) -> tuple[np.ndarray, int]:
        """``(slot int64 [n], hits)``: each node's rank among the hot nodes (its list is
        ``ids[ptr[slot]:ptr[slot + 1]]``), -1 when not hot."""
        slot = np.empty(nodes.shape[0], dtype=np.int64)
        hits = _hot_slots(self.bits, self.rank, nodes, slot)
        return slot, int(hits)


class NeighborReader:
    """Read CSC neighbour lists, the hot ones from memory and the rest from disk.

    Topology out of core: ``indptr`` stays in memory (8 bytes per node).  Each :meth:`read` turns
    the lists of the nodes that are not hot into their row ids in ``topology/indices`` and reads
    them with one :meth:`DiskRows.gather` (sorted, coalesced into requests -- with ``O_DIRECT``
    whole blocks of :attr:`DiskRows.gather_align` bytes and holes up to ``gap`` bytes are read
    through -- and ``aio_depth`` requests in flight through Linux native AIO with ``O_DIRECT``,
    else spread over ``threads`` pread threads), in pieces of at most ``chunk_edges`` ids so that the row-id scratch stays bounded
    (about 60 bytes per id read: row ids, their order, the request plan).  Lists of nodes in
    ``hot`` are copied from memory.

    Args:
        indices: the on-disk ``topology/indices`` array.
        indptr: int64 [N+1] CSC offsets (in memory).
        buffer_ids: largest read request, in ids (``>= align / itemsize``); default
            ``MISS_RUN_BYTES`` (128 KiB) worth.
        direct: open with ``O_DIRECT`` (see :attr:`DiskRows.direct` for the fall-back).
        align: the page size a request buffer must hold at least.
        threads, aio_depth, gap: as :class:`DiskRows` (requests in flight, bytes read through).
        hot: lists held in memory (:class:`HotLists`, attach later with :attr:`hot`); None = none.
        chunk_edges: ids read per gather.

    Raises:
        ValueError: the request buffer is smaller than one page.
    """

    def __init__(self, indices: RawArray, indptr: np.ndarray, buffer_ids: int | None = None,
                 direct: bool = False, align: int = ALIGN, threads: int = 8,
                 aio_depth: int = AIO_DEPTH, gap: int | None = None, hot: HotLists | None = None,
                 chunk_edges: int = 1 << 17) -> None:
        self.indices = indices
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.itemsize = indices.dtype.itemsize
        self.align = align
        nbytes = MISS_RUN_BYTES if buffer_ids is None else buffer_ids * self.itemsize
        if nbytes < align:
            raise ValueError(f"read buffer of {buffer_ids} ids ({nbytes} B) is smaller than one "
                             f"{align}-byte page")
        self._rows = DiskRows(indices, direct=direct, threads=threads, aio_depth=aio_depth,
                              gap=gap, max_run=nbytes)
        self.direct = self._rows.direct
        self.counters = self._rows.counters
        self.hot = hot
        self.chunk_edges = max(1, int(chunk_edges))
        self.lists_hot = 0  # lists served from memory / read from disk (since the last reset)
        self.lists_disk = 0

    def read(self, nodes: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Neighbour lists of ``nodes``: ``(ptr int64 [n+1], ids [ptr[-1]])`` of the indices dtype;
        the list of ``nodes[i]`` is ``ids[ptr[i]:ptr[i+1]]``, exactly as stored (duplicates and
        any order allowed).

        Args:
            nodes: int64 [n] node ids in ``[0, N)``.
            out: optional destination for ``ids`` (C-contiguous, indices dtype, ``ptr[-1]`` long).

        Raises:
            IndexError: a node id outside ``[0, N)``.  OSError: a short read (truncated dataset).
            CorruptChunkError: a chunk fails its checksum (checked once per process, first use).
        """
        nodes = np.ascontiguousarray(nodes, dtype=np.int64)
        n = nodes.shape[0]
        if n and (nodes.min() < 0 or nodes.max() >= self.indptr.shape[0] - 1):
            bad = nodes[(nodes < 0) | (nodes >= self.indptr.shape[0] - 1)][0]
            raise IndexError(f"node id {bad} outside [0, {self.indptr.shape[0] - 1})")
        deg = self.indptr[nodes + 1] - self.indptr[nodes]
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(deg, out=ptr[1:])
        if out is None:
            out = np.empty(int(ptr[-1]), dtype=self.indices.dtype)
        elif out.shape != (int(ptr[-1]),) or out.dtype != self.indices.dtype:
            raise ValueError(f"destination {out.shape} {out.dtype} for {int(ptr[-1])} ids of "
                             f"{self.indices.dtype}")
        hits = 0
        if self.hot is not None and self.hot.num_nodes and n:
            slot, hits = self.hot.lookup(nodes)
            if hits:
                _copy_hot(ptr, slot, self.hot.ptr, self.hot.ids, out)
            cold = np.flatnonzero((slot < 0) & (deg > 0))
        else:
            cold = np.flatnonzero(deg > 0)
        self.lists_hot += hits
        self.lists_disk += int(cold.shape[0])
        for piece, rows in self._pieces(nodes, deg, cold):
            got, _ = self._rows.gather(rows)
            _place_lists(ptr, piece, got, out)
        return ptr, out

    def _pieces(self, nodes: np.ndarray, deg: np.ndarray, cold: np.ndarray):
        """The gathers of :meth:`read` for the positions ``cold`` of ``nodes`` (lists read from
        disk): ``(positions int64 [k], row ids int64 [sum of their degrees])`` in file order, at
        most ``chunk_edges`` ids each (one list at least)."""
        if not cold.shape[0]:
            return
        cold = cold[np.argsort(nodes[cold], kind="stable")]  # file order: rows come sorted
        cum = np.cumsum(deg[cold])
        a = 0
        while a < cold.shape[0]:
            base = int(cum[a - 1]) if a else 0
            b = max(a + 1, int(np.searchsorted(cum, base + self.chunk_edges, side="right")))
            piece = cold[a:b]
            rows = np.empty(int(cum[b - 1]) - base, dtype=np.int64)
            _list_rows(self.indptr, nodes[piece], rows)
            yield piece, rows
            a = b

    def plan_reads(self, nodes: np.ndarray, hot_bits: np.ndarray | None = None) -> tuple[int, int]:
        """``(bytes, requests)`` that :meth:`read` of ``nodes`` would read from disk, without
        reading: the same pieces coalesced by the same :meth:`DiskRows.plan` (alignment, gap,
        request cap), so a prediction counts what the reader's counters will.

        Args:
            nodes: int64 [n] node ids in ``[0, N)`` (as :meth:`read`; not range-checked).
            hot_bits: uint64 [ceil(N / 64)] bitmap of lists served from memory (node ``v``: bit
                ``v % 64`` of word ``v // 64``, as :meth:`HotLists.select`); None: none (the
                reader's own :attr:`hot` is not consulted).
        """
        nodes = np.ascontiguousarray(nodes, dtype=np.int64)
        deg = self.indptr[nodes + 1] - self.indptr[nodes]
        keep = deg > 0
        if hot_bits is not None and nodes.shape[0]:
            keep &= ((hot_bits[nodes >> 6] >> (nodes & 63).astype(np.uint64)) & np.uint64(1)) == 0
        nbytes = requests = 0
        for _, rows in self._pieces(nodes, deg, np.flatnonzero(keep)):
            _, _, size, _ = self._rows.plan(np.unique(rows))
            nbytes += int(size.sum())
            requests += int(size.shape[0])
        return nbytes, requests

    def reset_stats(self) -> None:
        """Zero the byte, request and list counters."""
        self.counters.bytes_read = self.counters.requests = 0
        self.lists_hot = self.lists_disk = 0

    def close(self) -> None:
        self._rows.close()
