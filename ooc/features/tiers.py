"""The feature tiers behind the partition slots, as one fallback wrapper.

A row is looked up, in order, in the device cache (on the loader thread,
:mod:`ooc.features.device`), the resident partition slots (:class:`ooc.data.buffer.BufferManager`),
then here: the rows read ahead for the upcoming batches (:class:`StagedRows`, filled by
:class:`ooc.data.lookahead.ReadAhead`, optional), the CPU row cache
(:class:`~ooc.features.cache.CachedFeature`, optional), then the PQ codes (:class:`~ooc.features.pq.CompressedRows`, optional: only rows a caller allows to be
approximate -- the outermost hop of a hybrid training batch) or the disk
(:class:`~ooc.storage.io.DiskRows`, batched coalesced reads).  Exact rows read from disk are
admitted to the cache; decoded rows never are.
"""

from __future__ import annotations

import numpy as np

from ooc.kernels.rows import gather_sorted
from ooc.features.cache import CachedFeature
from ooc.features.pq import CompressedRows
from ooc.storage.io import DiskRows, IOCounters

__all__ = ["MissRows", "NoFeatures", "StagedRows"]


class _NoRead:
    """A finished range read of zero bytes (:meth:`NoFeatures.read_range_async`)."""

    nbytes = 0

    def wait(self) -> int:
        return 0


class NoFeatures:
    """The feature reader of a dataset without ``nodes/features``: every row has width 0.

    It stands where :class:`~ooc.storage.io.DiskRows` stands (partition slots, miss tiers), so
    plans, buffer states and batches work unchanged; the model's input comes from a learnable node
    embedding (``--embedding D``, :mod:`ooc.embedding`).  Nothing is read: every answer is an empty
    float32 array ``[n, 0]`` and 0 bytes.

    Args:
        num_nodes: N.
    """

    dtype = np.dtype(np.float32)
    row_bytes = 0
    nbytes = 0
    direct = False

    def __init__(self, num_nodes: int) -> None:
        self.shape = (int(num_nodes), 0)
        self.counters = IOCounters()  # stays at 0

    def span(self, start: int, stop: int) -> tuple[int, int, int]:
        """``(offset, bytes, shift)`` of a range: all 0."""
        return 0, 0, 0

    def read_range_async(self, start: int, stop: int, dst: np.ndarray) -> _NoRead:
        return _NoRead()

    def read_range(self, start: int, stop: int, dst: np.ndarray) -> int:
        return 0

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """float32 [stop - start, 0]."""
        return np.empty((stop - start, 0), dtype=np.float32)

    def gather(self, ids: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """``(float32 [len(ids), 0], 0)``."""
        return np.empty((len(ids), 0), dtype=np.float32), 0

    def close(self) -> None:
        return None


class StagedRows:
    """Rows read ahead: sorted unique node ids and their rows, replaced as a whole by :meth:`put`.

    A lookup is a binary search of the ids (``O(n log m)``); the rows are exact copies of the
    feature array, so a batch gathers the same values from here as from the disk.  The table is
    one ``(ids, rows)`` pair swapped at once, so a lookup on another thread sees either the old or
    the new table, never a mix.

    Args:
        row_shape: shape of one row; dtype: the storage dtype.

    Attributes:
        hits: rows served since the last :meth:`reset_stats`.
    """

    def __init__(self, row_shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.row_shape = tuple(row_shape)
        self.dtype = np.dtype(dtype)
        self._table = (np.empty(0, dtype=np.int64), np.empty((0, *self.row_shape), dtype=self.dtype))
        self.hits = 0

    @property
    def size(self) -> int:
        """Rows held."""
        return int(self._table[0].shape[0])

    @property
    def nbytes(self) -> int:
        ids, rows = self._table
        return int(ids.nbytes + rows.nbytes)

    def put(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Hold ``rows`` (``[m, *row_shape]``) of the sorted unique int64 ``ids`` (replacing what
        was held)."""
        if ids.shape[0] != rows.shape[0]:
            raise ValueError(f"{ids.shape[0]} ids for {rows.shape[0]} rows")
        self._table = (ids, rows)

    def clear(self) -> None:
        self._table = (np.empty(0, dtype=np.int64), np.empty((0, *self.row_shape), dtype=self.dtype))

    def peek(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows [n, *row_shape] (undefined where not found), found bool [n])`` of int64 ``ids``."""
        held, rows = self._table
        out = np.empty((ids.shape[0], *self.row_shape), dtype=self.dtype)
        found, hits = gather_sorted(held, rows, ids, out)
        self.hits += hits
        return out, found

    def reset_stats(self) -> int:
        """Rows served since the last call (then 0)."""
        n, self.hits = self.hits, 0
        return n


class MissRows:
    """Rows that missed the partition slots: CPU cache -> PQ codes (approximable rows) or disk.

    Args:
        disk: the reader of the feature array.
        cache: a CPU row cache in front of ``disk`` (None: none).
        pq: the PQ codes (None: approximable rows are read exactly).

    Attributes:
        staged: the rows read ahead for the upcoming batches, looked up before the cache.
        approx_rows: rows decoded from PQ codes since the last :meth:`reset_stats`.
    """

    def __init__(self, disk: "DiskRows | NoFeatures", cache: CachedFeature | None = None,
                 pq: CompressedRows | None = None) -> None:
        if cache is not None and cache.fallback is not disk:
            raise ValueError("the CPU cache must read through the disk tier")
        self.disk = disk
        self.cache = cache
        self.pq = pq
        self.shape = tuple(disk.shape)
        self.dtype = np.dtype(disk.dtype)
        self.staged = StagedRows(self.shape[1:], self.dtype)
        self.approx_rows = 0

    def reset_stats(self) -> int:
        """Rows decoded since the last call (then 0)."""
        n, self.approx_rows = self.approx_rows, 0
        return n

    def _exact(self, ids: np.ndarray, next_use: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        if self.cache is not None:
            return self.cache.gather(ids, next_use)
        return self.disk.gather(ids)

    def read_exact(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """Exact rows of int64 ``ids`` read from the disk as one coalesced gather: ``(rows, bytes
        read)`` (a read-ahead window; the CPU cache is neither consulted nor filled, so the rows
        are held once).

        Raises:
            IndexError, OSError, CorruptChunkError: as :meth:`ooc.storage.io.DiskRows.gather`.
        """
        return self.disk.gather(np.ascontiguousarray(ids, dtype=np.int64))

    def gather(self, ids: np.ndarray, approx_from: int | None = None,
               next_use: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Rows of ``ids`` (int64 [n]): ``(rows [n, *row_shape] storage dtype, bytes read)``.

        With PQ codes, rows at positions ``>= approx_from`` are decoded from them, always: never
        from the rows read ahead or the CPU cache, whose contents depend on the run's history (a
        resumed run starts them empty), so that a row exact in one run and decoded in another
        cannot make the losses differ.  The other rows (all of them without codes or with
        ``approx_from`` None) are exact: rows read ahead (:attr:`staged`) first, then the CPU
        cache, then the disk.  ``next_use`` (int64 [n]) goes to a look-ahead cache (exact rows
        only: exact mode).
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        cut = n if approx_from is None or self.pq is None else min(max(int(approx_from), 0), n)
        if cut == n:
            return self._staged_or_exact(ids, next_use)
        out = np.empty((n, *self.shape[1:]), dtype=self.dtype)
        nbytes = 0
        if cut:
            out[:cut], nbytes = self._staged_or_exact(ids[:cut], None)
        out[cut:] = self.pq.gather(ids[cut:])[0]
        self.approx_rows += n - cut
        return out, int(nbytes)

    def _staged_or_exact(self, ids: np.ndarray, next_use: np.ndarray | None
                         ) -> tuple[np.ndarray, int]:
        """Exact rows of ``ids``: the rows read ahead, then the CPU cache or the disk."""
        if self.staged.size and ids.shape[0]:
            out, found = self.staged.peek(ids)
            rest = np.flatnonzero(~found)
            if rest.shape[0] == 0:
                return out, 0
            rows, nbytes = self._exact(ids[rest], None if next_use is None else next_use[rest])
            out[rest] = rows
            return out, nbytes
        return self._exact(ids, next_use)

    def close(self) -> None:
        self.disk.close()
