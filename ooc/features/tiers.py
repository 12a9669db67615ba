"""The feature tiers behind the partition slots, as one fallback wrapper.

A row is looked up, in order, in the device cache (on the loader thread,
:mod:`ooc.features.device`), the resident partition slots (:class:`ooc.data.buffer.BufferManager`),
then here: the CPU row cache (:class:`~ooc.features.cache.CachedFeature`, optional), then the PQ
codes (:class:`~ooc.features.pq.CompressedRows`, optional: only rows a caller allows to be
approximate -- the outermost hop of a hybrid training batch) or the disk
(:class:`~ooc.storage.io.DiskRows`, batched coalesced reads).  Exact rows read from disk are
admitted to the cache; decoded rows never are.
"""

from __future__ import annotations

import numpy as np

from ooc.features.cache import CachedFeature
from ooc.features.pq import CompressedRows
from ooc.storage.io import DiskRows

__all__ = ["MissRows", "NoFeatures"]


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


class MissRows:
    """Rows that missed the partition slots: CPU cache -> PQ codes (approximable rows) or disk.

    Args:
        disk: the reader of the feature array.
        cache: a CPU row cache in front of ``disk`` (None: none).
        pq: the PQ codes (None: approximable rows are read exactly).

    Attributes:
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
        self.approx_rows = 0

    def reset_stats(self) -> int:
        """Rows decoded since the last call (then 0)."""
        n, self.approx_rows = self.approx_rows, 0
        return n

    def _exact(self, ids: np.ndarray, next_use: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        if self.cache is not None:
            return self.cache.gather(ids, next_use)
        return self.disk.gather(ids)

    def gather(self, ids: np.ndarray, approx_from: int | None = None,
               next_use: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Rows of ``ids`` (int64 [n]): ``(rows [n, *row_shape] storage dtype, bytes read)``.

        Rows at positions ``>= approx_from`` are decoded from the PQ codes unless the CPU cache
        holds them; without codes (or ``approx_from`` None) every row is exact.  ``next_use``
        (int64 [n]) goes to a look-ahead cache (exact rows only: exact mode).
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if approx_from is None or self.pq is None or approx_from >= ids.shape[0]:
            return self._exact(ids, next_use)
        cut = max(int(approx_from), 0)
        out = np.empty((ids.shape[0], *self.shape[1:]), dtype=self.dtype)
        nbytes = 0
        if cut:
            out[:cut], nbytes = self._exact(ids[:cut])
        far = ids[cut:]
        if self.cache is not None:
            rows, found = self.cache.peek(far)
            out[cut:][found] = rows[found]
            need = np.flatnonzero(~found)
        else:
            need = np.arange(far.shape[0])
        if need.shape[0]:
            out[cut + need] = self.pq.gather(far[need])[0]
            self.approx_rows += int(need.shape[0])
        return out, int(nbytes)

    def close(self) -> None:
        self.disk.close()
