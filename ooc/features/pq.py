"""The PQ tier: feature rows decoded from product-quantisation codes kept in memory.

In hybrid mode most of a batch's rows come from resident partitions; the rest -- neighbours across
the partition cut -- are single rows scattered over the file, each a 4 KiB disk request.  With
``--miss-features pq`` the misses of a training batch's outermost hop are decoded from the codes
written by ``ooc compress`` (:mod:`ooc.compress`) instead: no request at all, at the cost of an
approximation of those rows only.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ooc.compress import MIN_GAIN, PQ_GROUP
from ooc.kernels.pq import pq_decode
from ooc.storage.dataset import Dataset, DatasetError

__all__ = ["CompressedRows", "calibrated", "pq_bytes", "open_compressed"]


class CompressedRows:
    """``gather(ids) -> (rows, 0)``: rows decoded from PQ codes in memory (no disk request).

    The decoding tier behind :class:`~ooc.features.tiers.MissRows` (the tiers compose like GraphBolt's
    feature wrappers).  Rows come out in ``dtype`` (the stored feature dtype).

    Args:
        codes: uint8 ``[N, M]``; centroids: float32 ``[M, K, dmax]``; bounds: int64 ``[M + 1]``;
        dtype: output dtype; dim: D.
    """

    def __init__(self, codes: np.ndarray, centroids: np.ndarray, bounds: np.ndarray,
                 dtype: np.dtype, dim: int) -> None:
        self.codes = codes
        self.centroids = np.ascontiguousarray(centroids.astype(dtype))
        # decoding copies bytes: run it on same-width unsigned words (Numba has no float16)
        self._word = np.dtype(f"u{self.centroids.dtype.itemsize}")
        self.bounds = np.ascontiguousarray(bounds, dtype=np.int64)
        self.dtype = np.dtype(dtype)
        self.dim = dim
        self.rows_decoded = 0

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.centroids.nbytes)

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """Approximate rows of ``ids`` (int64 ``[n]``): ``([n, D] dtype, 0 bytes read)``."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty((ids.shape[0], self.dim), dtype=self.dtype)
        pq_decode(self.codes, ids, self.centroids.view(self._word), self.bounds, out.view(self._word))
        self.rows_decoded += int(ids.shape[0])
        return out, 0


def pq_bytes(ds: Dataset) -> int:
    """Memory of the dataset's PQ codes and centroids (0 without codes)."""
    arrays = ds.manifest["arrays"]
    total = 0
    for name in ("codes", "centroids"):
        rec = arrays.get(f"{PQ_GROUP}/{name}")
        if rec is None:
            return 0
        total += int(np.prod(rec["shape"])) * np.dtype(rec["dtype"]).itemsize
    return total


def calibrated(centroids: np.ndarray, bounds: np.ndarray, means: np.ndarray,
               gains: np.ndarray) -> np.ndarray:
    """The decoding centroids: each centroid's deviation from the column ``means`` divided by its
    subspace's gain (:func:`ooc.compress.decode_gains`, floored at :data:`~ooc.compress.MIN_GAIN`;
    a gain above 1 is kept at 1), so decoded rows keep the exact rows' expected small changes.

    Args:
        centroids: float32 ``[M, K, dmax]``; bounds: int64 ``[M + 1]``; means: float32 ``[D]``;
        gains: float32 ``[M]``.

    Returns:
        float32 ``[M, K, dmax]`` (padding columns stay zero).

    Raises:
        DatasetError: ``means`` or ``gains`` do not match the codebooks, or are not finite.
    """
    m_count, dim = centroids.shape[0], int(bounds[-1])
    if means.shape != (dim,) or gains.shape != (m_count,) or not np.isfinite(means).all() \
            or not np.isfinite(gains).all():
        raise DatasetError(f"PQ means {means.shape} / gains {gains.shape} do not match {m_count} "
                           f"subspaces of {dim} columns (or are not finite); rerun ooc compress "
                           "--overwrite")
    out = np.array(centroids, dtype=np.float32)
    g = np.clip(gains.astype(np.float32), MIN_GAIN, 1.0)
    for m in range(m_count):
        a, b = int(bounds[m]), int(bounds[m + 1])
        out[m, :, :b - a] = means[a:b] + (out[m, :, :b - a] - means[a:b]) / g[m]
    return out


def open_compressed(ds: Dataset, alloc: Callable[..., np.ndarray] | None = None) -> CompressedRows:
    """Load the dataset's PQ codes into memory.

    Args:
        alloc: ``alloc(shape, dtype, fill) -> array`` for the codes (e.g.
            :func:`ooc.data.shared.shared_array`, one copy per machine); default a private array.

    Raises:
        DatasetError: the dataset has no codes (run ``ooc compress`` first), or they do not match
            its features or the codebook (a code >= K).
    """
    if not ds.has("features"):
        raise DatasetError(f"{ds.path}: dataset has no features (nothing to decode)")
    if not ds.has(f"{PQ_GROUP}/codes"):
        raise DatasetError(f"{ds.path}: no PQ codes (run `ooc compress {ds.path} --subspaces M` "
                           "first, or train with --miss-features disk)")
    raw = ds.raw(f"{PQ_GROUP}/codes")
    if alloc is None:
        codes = raw.read_all()
    else:
        codes = alloc(tuple(raw.shape), raw.dtype, lambda o: raw.read(0, raw.shape[0], o))
    cents = ds.raw(f"{PQ_GROUP}/centroids").read_all()
    bounds = ds.raw(f"{PQ_GROUP}/bounds").read_all()
    if codes.shape[0] != ds.num_nodes or int(bounds[-1]) != ds.feat_dim or \
            codes.shape[1] != cents.shape[0] or bounds.shape[0] != cents.shape[0] + 1 or \
            (codes.size and int(codes.max()) >= cents.shape[1]):
        raise DatasetError(f"{ds.path}: PQ codes {codes.shape} (max {int(codes.max()) if codes.size else 0}"
                           f") do not match {ds.num_nodes} nodes x {ds.feat_dim} features and "
                           f"{cents.shape[1]} centroids; rerun ooc compress --overwrite")
    if ds.has(f"{PQ_GROUP}/gains"):  # (codes of older versions decode to the plain centroids)
        try:
            cents = calibrated(cents, bounds, ds.raw(f"{PQ_GROUP}/means").read_all(),
                               ds.raw(f"{PQ_GROUP}/gains").read_all())
        except DatasetError as e:
            raise DatasetError(f"{ds.path}: {e}") from None
    dtype = ds.features.dtype
    if dtype.kind == "f":  # a boosted centroid stays finite in the feature dtype (float16)
        cents = np.clip(cents, np.finfo(dtype).min, np.finfo(dtype).max)
    return CompressedRows(codes, cents, bounds, dtype, ds.feat_dim)
