"""Disk reads for the out-of-core engine: ``pread`` (optionally ``O_DIRECT``) into caller memory.

The gather path of :class:`~ooc.storage.rawarray.RawArray` uses a stitched memory map: convenient,
but every touched page stays mapped, counts as the process's RSS and hides the I/O from any counter.
The out-of-core modes read through :class:`DiskRows` instead:

- ``read_range`` -- one contiguous row range (a partition) with large sequential reads, split into
  ``piece``-byte requests spread over ``threads`` threads (queue depth > 1);
- ``gather`` -- arbitrary rows, sorted, coalesced into runs of pages (``O_DIRECT``) or rows (buffered)
  and read by a Numba kernel that calls ``pread`` without the GIL, on ``threads`` threads;
- ``O_DIRECT`` (``direct=True``) bypasses the page cache, so the dataset is never silently held in
  memory and measured bandwidth is the disk's; offsets, sizes and buffers are aligned to 4 KiB
  (``ALIGN``); where the file system refuses ``O_DIRECT`` the reader falls back to buffered reads.

:class:`NeighborReader` reads CSC neighbour lists with page-aligned reads into a fixed-size buffer.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit, types

from ooc.storage.rawarray import RawArray

__all__ = ["ALIGN", "aligned_empty", "DiskRows", "NeighborReader", "IOCounters"]

ALIGN = 4096
_pread = types.ExternalFunction("pread", types.intp(types.int32, types.voidptr, types.uintp,
                                                    types.int64))


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
def _gather_runs(fds: np.ndarray, chunk_bytes: int, row_bytes: int, ids: np.ndarray, lo: int, hi: int,
                 align: int, max_run: int, staging: np.ndarray, out: np.ndarray,
                 out_pos: np.ndarray) -> tuple:
    """Read rows ``ids[lo:hi]`` (sorted, unique) in coalesced runs; copy each to ``out[out_pos[i]]``.

    With ``align == 1`` (buffered reads) ``out_pos`` must be the identity and runs are read straight
    into ``out``; with O_DIRECT they go through the aligned ``staging`` buffer.  A run is a byte range ``[a, b)`` (aligned to ``align``) covering consecutive rows whose ranges
    touch or overlap and that stay inside one chunk file, at most ``max_run`` bytes (the staging size).

    Returns:
        ``(bytes requested, requests, error chunk or -1)``.
    """
    total = 0
    reqs = 0
    i = lo
    while i < hi:
        r0 = ids[i]
        s0 = r0 * row_bytes
        c = s0 // chunk_bytes
        a = (s0 // align) * align
        b = s0 + row_bytes
        b = ((b + align - 1) // align) * align
        j = i + 1
        while j < hi:
            s = ids[j] * row_bytes
            if s // chunk_bytes != c:
                break
            e = ((s + row_bytes + align - 1) // align) * align
            if (s // align) * align > b or e - a > max_run:
                break
            b = max(b, e)
            j += 1
        cend = c * chunk_bytes + ((chunk_bytes + align - 1) // align) * align
        n = min(b, cend) - a
        if align == 1:  # buffered: rows i..j-1 are consecutive in the file and in ``out``
            got = _pread(fds[c], out[out_pos[i]:].ctypes.data, n, a - c * chunk_bytes)
            reqs += 1
            total += n
            if got != n:
                return total, reqs, c
            i = j
            continue
        got = _pread(fds[c], staging.ctypes.data, n, a - c * chunk_bytes)
        reqs += 1
        if got < 0:
            return total, reqs, c
        total += n
        for k in range(i, j):
            s = ids[k] * row_bytes - a
            if s + row_bytes > got:
                return total, reqs, c
            out[out_pos[k], :] = staging[s:s + row_bytes]
        i = j
    return total, reqs, -1


class DiskRows:
    """Row reads from an uncompressed, axis-0-chunked array (a :class:`RawArray`'s chunk files).

    Args:
        arr: the on-disk array.
        direct: open with ``O_DIRECT`` (falls back to buffered reads where unsupported; see
            :attr:`direct`).
        threads: reader threads for ``gather`` and ``read_range`` (queue depth).
        piece: bytes per request of ``read_range`` (multiple of ``ALIGN``).

    Raises:
        FileNotFoundError: a chunk file is missing.
    """

    def __init__(self, arr: RawArray, direct: bool = False, threads: int = 4,
                 piece: int = 4 << 20) -> None:
        self.arr = arr
        self.shape = arr.shape
        self.dtype = arr.dtype
        self.row_bytes = arr.row_bytes
        self.chunk_bytes = arr.chunk_bytes
        self.nbytes = arr.nbytes
        self.piece = max(ALIGN, piece // ALIGN * ALIGN)
        self.threads = max(1, threads)
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
        self.counters = IOCounters()
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ooc-read") \
            if self.threads > 1 else None
        self._staging = [aligned_empty(max(self.piece, 2 * ALIGN + self.row_bytes))
                         for _ in range(self.threads)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
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

    def read_range(self, start: int, stop: int, dst: np.ndarray) -> int:
        """Read rows ``[start, stop)`` into the uint8 buffer ``dst`` (aligned with O_DIRECT) at byte
        ``span(start, stop)[2]``; returns bytes read from disk.

        Raises:
            ValueError: ``dst`` too small or misaligned; OSError: short read (truncated dataset).
        """
        if not 0 <= start <= stop <= self.shape[0]:
            raise IndexError(f"{self.arr.path}: rows [{start}, {stop}) outside [0, {self.shape[0]})")
        off, nbytes, shift = self.span(start, stop)
        if dst.dtype != np.uint8 or dst.shape[0] < nbytes:
            raise ValueError(f"destination of {dst.shape[0]} bytes for a {nbytes}-byte read")
        if self.direct and dst.ctypes.data % ALIGN:
            raise ValueError("O_DIRECT destination is not 4 KiB aligned")
        if nbytes == 0:
            return 0
        per = -(-nbytes // self.threads)
        per = max(self.piece, -(-per // self.piece) * self.piece)
        items = [(self.fds, self.chunk_bytes, off + p, min(per, nbytes - p), dst, p, self.piece,
                  self.align) for p in range(0, nbytes, per)]
        got = self._map(_read_span, items)
        for (_, _, o, n, _, _, _, _), g in zip(items, got):
            if g < 0:
                raise OSError(f"{self.arr.chunk_path(-1 - g)}: read failed or short; the dataset is "
                              "truncated or corrupt")
            if g < n and o + g < stop * self.row_bytes:
                raise OSError(f"{self.arr.path}: short read at byte {o + g}; the dataset is truncated")
        self.counters.add(nbytes, len(items) * max(1, -(-per // self.piece)))
        return nbytes

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a new array of the array's dtype and shape."""
        off, nbytes, shift = self.span(start, stop)
        buf = aligned_empty(nbytes)
        self.read_range(start, stop, buf)
        n = (stop - start) * self.row_bytes
        return buf[shift:shift + n].view(self.dtype).reshape((stop - start, *self.shape[1:])).copy()

    # ------------------------------------------------------------------ gathers
    def gather(self, ids: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Rows ``arr[ids]`` (any order, duplicates allowed) with batched, coalesced preads.

        Args:
            ids: int64 [n] row ids in ``[0, rows)``.
            out: optional destination ``(n, *row_shape)`` of the array's dtype, C-contiguous.

        Returns:
            ``(rows, bytes read from disk)`` -- with O_DIRECT whole 4 KiB pages are read, and counted.

        Raises:
            IndexError: an id is out of range; OSError: a short read.
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
        uniq, inverse = np.unique(ids, return_inverse=True)
        rows = np.empty((uniq.shape[0], self.row_bytes), dtype=np.uint8)
        pos = np.arange(uniq.shape[0], dtype=np.int64)
        k = min(self.threads, max(1, uniq.shape[0] // 64))
        bounds = np.linspace(0, uniq.shape[0], k + 1).astype(np.int64)
        items = [(self.fds, self.chunk_bytes, self.row_bytes, uniq, int(bounds[t]), int(bounds[t + 1]),
                  self.align, self._staging[t].shape[0], self._staging[t], rows, pos)
                 for t in range(k) if bounds[t + 1] > bounds[t]]
        results = self._map(_gather_runs, items)
        total = reqs = 0
        for nb, rq, err in results:
            total += nb
            reqs += rq
            if err >= 0:
                raise OSError(f"{self.arr.chunk_path(err)}: short read; the dataset is truncated")
        self.counters.add(total, reqs)
        flat = out.reshape(n, -1).view(np.uint8).reshape(n, self.row_bytes)
        np.take(rows, inverse.reshape(-1), axis=0, out=flat)
        return out, total


@njit(cache=True, nogil=True)
def _read_lists(fds: np.ndarray, chunk_bytes: int, itemsize: int, indptr: np.ndarray,
                nodes: np.ndarray, buf: np.ndarray, out: np.ndarray, out_ptr: np.ndarray,
                align: int) -> tuple:
    """Neighbour lists of ``nodes`` via page-aligned preads of at most ``len(buf)`` bytes each.

    The ids live in chunk files ``fds[c]`` of ``chunk_bytes`` bytes each (a multiple of ``align``;
    one file: pass a ``chunk_bytes`` past its end); a read never crosses a chunk file, so a list
    that straddles two chunks costs two reads.  Bytes already in the buffer from the previous read
    are reused (with ``nodes`` sorted, lists that share a page cost one read).  Returns
    ``(bytes read, requests, max bytes requested in one read, error flag)``.
    """
    total = 0
    reqs = 0
    biggest = 0
    cap = (buf.shape[0] // align) * align
    have_a = -1  # global byte offset of buf[0]
    have_n = 0  # valid bytes in buf
    for i in range(nodes.shape[0]):
        v = nodes[i]
        s = indptr[v] * itemsize
        e = indptr[v + 1] * itemsize
        w = out_ptr[i] * itemsize
        pos = s
        while pos < e:
            if not (have_a >= 0 and have_a <= pos and pos < have_a + have_n):
                c = pos // chunk_bytes
                base = c * chunk_bytes
                a = (pos // align) * align
                stop = min(e, base + chunk_bytes)
                n = min(cap, ((stop + align - 1) // align) * align - a)
                got = _pread(fds[c], buf.ctypes.data, n, a - base)
                reqs += 1
                total += n
                biggest = max(biggest, n)
                if got <= pos - a:
                    return total, reqs, biggest, 1
                have_a = a
                have_n = got
            take = min(e, have_a + have_n) - pos
            out[w:w + take] = buf[pos - have_a:pos - have_a + take]
            w += take
            pos += take
    return total, reqs, biggest, 0


class NeighborReader:
    """Read CSC neighbour lists from disk with page-aligned reads into a bounded buffer.

    Topology out of core: ``indptr`` stays in memory (8 bytes per node), ``indices`` is read per list.
    Each read covers whole ``align``-byte pages (4 KiB) and is at most ``buffer_ids`` ids long, so a
    list that spans two pages costs two page reads with a one-page buffer and one with a larger one.

    Args:
        indices: the on-disk ``topology/indices`` array (one chunk file, or page-multiple chunks).
        indptr: int64 [N+1] CSC offsets (in memory).
        buffer_ids: read buffer size in ids (``>= align / itemsize``).
        direct: open with ``O_DIRECT``.

    Raises:
        ValueError: the buffer is smaller than one page.
    """

    def __init__(self, indices: RawArray, indptr: np.ndarray, buffer_ids: int = 1 << 16,
                 direct: bool = False, align: int = ALIGN) -> None:
        self.indices = indices
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.itemsize = indices.dtype.itemsize
        self.align = align
        nbytes = buffer_ids * self.itemsize
        if nbytes < align:
            raise ValueError(f"read buffer of {buffer_ids} ids ({nbytes} B) is smaller than one "
                             f"{align}-byte page")
        self.buf = aligned_empty(nbytes, align)
        if indices.num_chunks > 1 and indices.chunk_bytes % align:
            raise ValueError(f"{indices.path}: chunks are not page aligned")
        self._rows = DiskRows(indices, direct=direct, threads=1)
        self.counters = self._rows.counters
        self.max_request = 0

    def read(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Neighbour lists of ``nodes``: ``(ptr int64 [n+1], ids [ptr[-1]])`` (the indices dtype);
        the list of ``nodes[i]`` is ``ids[ptr[i]:ptr[i+1]]``, exactly as stored."""
        nodes = np.ascontiguousarray(nodes, dtype=np.int64)
        order = np.argsort(nodes, kind="stable")  # read in file order: neighbouring lists share pages
        snodes = nodes[order]
        deg = self.indptr[nodes + 1] - self.indptr[nodes]
        ptr = np.zeros(nodes.shape[0] + 1, dtype=np.int64)
        np.cumsum(deg, out=ptr[1:])
        sptr = ptr[order]  # where each sorted node's list goes in the output
        out = np.empty(int(ptr[-1]) * self.itemsize, dtype=np.uint8)
        # one chunk file: any chunk size past the end of the file
        chunk_bytes = self.indices.chunk_bytes if self.indices.num_chunks > 1 else 1 << 62
        total, reqs, big, err = _read_lists(self._rows.fds, chunk_bytes, self.itemsize, self.indptr,
                                            snodes, self.buf, out, sptr, self.align)
        if err:
            raise OSError(f"{self.indices.path}: short read; the dataset is truncated")
        self.max_request = max(self.max_request, int(big))
        self.counters.add(total, reqs)
        return ptr, out.view(self.indices.dtype)

    def close(self) -> None:
        self._rows.close()
