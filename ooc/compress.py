"""``ooc compress``: product-quantisation codes of every node's feature row, written into the dataset.

The codes are read back by :mod:`ooc.features.pq` (the decoding tier of hybrid training).

In hybrid mode most of a batch's rows come from resident partitions; the rest -- neighbours across
the partition cut, ~15% of sampled edges with METIS -- are single rows scattered over the file, each
a 4 KiB disk request.  With ``--miss-features pq`` they are decoded from product-quantisation codes
instead (``M`` bytes per node, e.g. 32 B for a 256-d float16 row of 512 B), kept in memory within
the budget: no request at all, at the cost of an approximation of those rows only.  Resident rows,
evaluation and inference stay exact.

This is the compressed-feature idea of feature-quantised GNN training (e.g. BiFeat, Ma et al.,
"BiFeat: supercharge GNN training via graph feature quantization", 2022) applied to the misses of
a partition buffer only; the quantiser is Jegou et al.'s PQ (:mod:`ooc.kernels.pq`).

``ooc compress DATASET --subspaces M`` learns the codebooks on a sample of rows and writes
``nodes/pq/codes`` (uint8 ``[N, M]``), ``nodes/pq/centroids`` (float32 ``[M, K, dmax]``) and
``nodes/pq/bounds`` (int64 ``[M + 1]``) into the dataset (atomically, :class:`ArrayGroupWriter`),
with ``nodes/pq/means`` (float32 ``[D]``) and ``nodes/pq/gains`` (float32 ``[M]``,
:func:`decode_gains`): decoding scales a centroid's deviation from the means by ``1 / gain`` so that
decoded rows keep the exact rows' expected class signal (codes written before the gains existed
decode to the plain centroids).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from ooc.util.progress import progress as progress_bar

from ooc.kernels.pq import kmeans_subspace, pq_encode, subspace_bounds
from ooc.storage.dataset import ArrayGroupWriter, Dataset, DatasetError
from ooc.storage.locks import PathLock

__all__ = ["PQ_GROUP", "MIN_GAIN", "train_codebooks", "decode_gains", "encode_rows", "compress_dataset"]

log = logging.getLogger(__name__)

PQ_GROUP = "nodes/pq"


def _padded(cent: list[np.ndarray], dmax: int) -> np.ndarray:
    out = np.zeros((len(cent), cent[0].shape[0], dmax), dtype=np.float32)
    for m, c in enumerate(cent):
        out[m, :, :c.shape[1]] = c
    return out


def train_codebooks(sample: np.ndarray, subspaces: int, centroids: int = 256, iters: int = 15,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """k-means codebooks of every subspace on ``sample`` rows.

    Args:
        sample: ``[S, D]`` rows (any float dtype), ``S >= centroids``.
        subspaces: M; centroids: K in ``[1, 256]`` (codes are uint8); iters: Lloyd iterations.

    Returns:
        ``(centroids float32 [M, K, dmax], bounds int64 [M + 1], relative error)``, the error
        being the mean squared reconstruction error of the sample over its mean squared norm.

    Raises:
        ValueError: K outside ``[1, 256]``, M outside ``[1, D]``, or fewer than K rows.
    """
    if not 1 <= centroids <= 256:
        raise ValueError(f"PQ centroids must be in [1, 256] (uint8 codes), got {centroids}")
    x = np.asarray(sample, dtype=np.float32)
    bounds = subspace_bounds(x.shape[1], subspaces)
    rng = np.random.default_rng(seed)
    cents, err = [], 0.0
    for m in range(subspaces):
        c, e = kmeans_subspace(x[:, bounds[m]:bounds[m + 1]], centroids, iters, rng)
        cents.append(c)
        err += e
    dmax = int(np.diff(bounds).max())
    norm = float((x.astype(np.float64) ** 2).sum(1).mean())
    return _padded(cents, dmax), bounds, err / max(norm, 1e-30)


def decode_gains(sample: np.ndarray, centroids: np.ndarray, bounds: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """How much of a small change of a row its PQ decoding keeps, per subspace, measured on
    ``sample`` (``[S, D]``, the rows the codebooks were learnt on).

    A centroid is the mean of its cell, so a decoded row is shrunk towards the column means: the
    least-squares slope of the decoded sub-vectors on the exact ones,
    ``g = sum((c - mean c) . (x - mean x)) / sum(|x - mean x|^2)``, is below 1 (``1 -`` the
    subspace's relative error about its mean when the cells are exact means).  For Gaussian rows,
    Stein's lemma makes ``g`` (its matrix form) the derivative of the expected decoding with
    respect to a shift of the rows' mean -- the part of a row that carries a class signal much
    smaller than the row's spread.  :func:`ooc.features.pq.open_compressed` divides decoded
    deviations from the means by ``g``, so a decoded row's expected signal is the exact row's.

    Returns:
        ``(means float32 [D], gains float32 [M])``; a subspace constant over the sample has gain 1.
    """
    x = np.asarray(sample, dtype=np.float32)
    codes = encode_rows(x, centroids, bounds)
    means = x.astype(np.float64).mean(0)
    gains = np.ones(centroids.shape[0], dtype=np.float32)
    for m in range(centroids.shape[0]):
        a, b = int(bounds[m]), int(bounds[m + 1])
        dx = x[:, a:b] - means[a:b]
        dc = centroids[m, codes[:, m], :b - a] - means[a:b]
        var = float((dx * dx).sum())
        if var > 0:
            gains[m] = float((dc * dx).sum()) / var
    return means.astype(np.float32), gains


#: decoded deviations are divided by a gain of at least this (a subspace whose decoding keeps less
#: of the rows' changes is left at this boost rather than amplifying its noise without bound)
MIN_GAIN = 0.25


def encode_rows(rows: np.ndarray, centroids: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """PQ codes of ``rows`` ``[n, D]``: uint8 ``[n, M]`` (nearest centroid per subspace)."""
    cb = np.ascontiguousarray(centroids.transpose(0, 2, 1))  # [M, dmax, K]
    norms = (centroids.astype(np.float32) ** 2).sum(2).astype(np.float32)  # padding is zero
    out = np.empty((rows.shape[0], centroids.shape[0]), dtype=np.uint8)
    x = rows if rows.dtype in (np.float32, np.float64) else rows.astype(np.float32)
    pq_encode(np.ascontiguousarray(x), cb, norms, bounds, out)
    return out


#: largest feature magnitude PQ accepts: squared distances must stay finite in float32
MAX_ABS = 1e15


def _check_finite(rows: np.ndarray, what: str, ids: np.ndarray | None = None, first: int = 0) -> None:
    """Raises ValueError naming the node (``ids[r]``, else ``first + r``) and column of the first
    NaN / inf or value beyond :data:`MAX_ABS` in ``rows``."""
    bad = ~np.isfinite(rows)
    if rows.dtype.kind == "f" and float(np.finfo(rows.dtype).max) > MAX_ABS:
        # (float16 cannot hold the bound -- 1e15 would cast to inf -- and every finite float16 is
        # below it: only non-finite values are refused there)
        bad |= np.abs(rows) > rows.dtype.type(MAX_ABS)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        node = int(ids[r]) if ids is not None else first + int(r)
        raise ValueError(f"{what}: value {float(rows[r, c]):g} at node {node}, column {c}; PQ needs "
                         f"finite features below {MAX_ABS:g} in magnitude (rescale them first)")


def compress_dataset(path: str | Path, subspaces: int, centroids: int = 256,
                     sample_rows: int = 32768, iters: int = 15, seed: int = 0,
                     overwrite: bool = False, progress: bool = True) -> dict:
    """Learn PQ codebooks of ``path``'s features and write the codes of every node into it.

    Reads a random sample of ``sample_rows`` rows (page cache allowed: an offline step), then
    streams the whole feature array once in row blocks.  Memory: the sample plus one block of
    rows and codes.

    Returns:
        A summary: subspaces, centroids, bytes per node, relative error of the sample, seconds.

    Raises:
        DatasetError: the dataset has no features.
        FileExistsError: it has codes and ``overwrite`` is false (checked before any work).
        LockError: another process reads (trains on) or writes the dataset.
        ValueError: bad ``subspaces`` / ``centroids`` / ``iters``, ``sample_rows`` below the
            centroids, or features that are not finite or beyond :data:`MAX_ABS`.
    """
    t0 = time.perf_counter()
    # the codes are added in place: no reader (ooc train) or other writer while this runs
    lock = PathLock(path, exclusive=True, what="dataset", purpose="compress").acquire()
    try:
        return _compress(path, subspaces, centroids, sample_rows, iters, seed, overwrite, progress, t0)
    finally:
        lock.release()


def _compress(path: str | Path, subspaces: int, centroids: int, sample_rows: int, iters: int,
              seed: int, overwrite: bool, progress: bool, t0: float) -> dict:
    ds = Dataset(path, verify="checksums")  # codes are never learnt from corrupt rows
    try:
        if not ds.has("features"):
            raise DatasetError(f"{path}: dataset has no features to compress")
        if ds.has(f"{PQ_GROUP}/codes") and not overwrite:
            raise FileExistsError(f"{path}: dataset already has {PQ_GROUP} (pass --overwrite to "
                                  "replace it)")
        feats = ds.features
        n, dim = feats.shape[0], ds.feat_dim
        if not 1 <= subspaces <= dim:
            raise ValueError(f"--subspaces must be in [1, {dim}] (the feature dimension), got "
                             f"{subspaces}")
        if not 2 <= centroids <= 256:
            raise ValueError(f"--centroids must be in [2, 256] (uint8 codes; one centroid per "
                             f"subspace would decode every row to the column means), got {centroids}")
        if iters < 1:
            raise ValueError(f"--iters must be >= 1, got {iters}")
        k = min(centroids, n)  # a graph with fewer nodes than centroids: one centroid per node
        if sample_rows < k:
            raise ValueError(f"--sample-rows {sample_rows} is smaller than the {k} centroids to learn")
        s = min(sample_rows, n)
        ids = np.sort(np.random.default_rng(seed).choice(n, size=s, replace=False))
        sample = feats.mmap()[ids].reshape(s, dim)
        _check_finite(sample, f"{path}: features", ids=ids)
        cents, bounds, err = train_codebooks(sample, subspaces, k, iters, seed)
        means, gains = decode_gains(sample, cents, bounds)
        del sample
        t1 = time.perf_counter()
        with ArrayGroupWriter(path, PQ_GROUP, overwrite=overwrite) as w:
            cw = w.array_writer("codes", np.uint8, (subspaces,), expected_rows=n)
            step = max(1, (64 << 20) // max(feats.row_bytes, 1))
            with progress_bar(total=n, unit="rows", desc="pq encode", enabled=progress) as bar:
                for a in range(0, n, step):
                    b = min(n, a + step)
                    rows = feats.read(a, b).reshape(b - a, dim)
                    _check_finite(rows, f"{path}: features", first=a)
                    cw.append(encode_rows(rows, cents, bounds))
                    bar.update(b - a)
            w.finish_array(cw)
            w.write_array("centroids", cents)
            w.write_array("bounds", bounds)
            w.write_array("means", means)
            w.write_array("gains", gains)
            info = {"subspaces": int(subspaces), "centroids": int(k), "sample_rows": int(s),
                    "iters": int(iters), "seed": int(seed), "relative_error": float(err),
                    "bytes_per_node": int(subspaces), "mean_gain": float(gains.mean())}
            w.commit(pq=info)
        info.update(train_s=t1 - t0, encode_s=time.perf_counter() - t1)
        return info
    finally:
        ds.close()
