"""Cost of verifying a dataset on read (docs/benchmarks.md, "Verification cost").

    python -m ooc.tools.bench_verify DATASET [--rounds 1] [--no-drop-caches] [--json OUT]

Measures, each from a cold page cache (``sync; echo 3 > /proc/sys/vm/drop_caches``):

- ``structure``: the structural scans of :meth:`Dataset.check_structure` alone (no checksums),
  what ``--verify structure`` costs when a run opens the dataset;
- ``structure+checksums``: the same scans with every chunk they read checked against its blake2b
  digest (``--verify checksums``, the default, at open: indptr, indices, labels, splits);
- ``features read``/``features read+verify``: every feature row read once, partition by
  partition, through :class:`~ooc.storage.io.DiskRows` (what the partition buffer does in its first
  epoch), without and with the once-per-process chunk check;
- ``hash only``: blake2b of the feature chunks from the page cache (the CPU part of the check).

Reports seconds and bytes/s, so the cost extrapolates to other sizes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from ooc.storage.dataset import Dataset
from ooc.storage.io import DiskRows, aligned_empty
from ooc.storage.verify import ChunkVerifier
from ooc.tools.bench import drop_caches

__all__ = ["bench_verify", "main"]


def _cold(drop: bool) -> None:
    if drop and not drop_caches():
        raise SystemExit("cannot drop the page cache (run as root, or pass --no-drop-caches)")


def _scan_bytes(ds: Dataset) -> int:
    """Bytes the structural scans read: indptr, indices, labels and splits."""
    total = 0
    for name in ("indptr", "indices", "labels", "train", "valid", "test"):
        if ds.has(name):
            total += ds.raw(name).num_chunks * ds.raw(name).chunk_bytes
    return total


def _read_features(ds: Dataset, verify: bool, parts: int = 8) -> tuple[float, int]:
    feats = ds.features
    feats.verifier = None
    if verify:  # a fresh verifier: nothing checked yet in this process
        feats.verifier = ChunkVerifier(ds.path, "nodes/features", feats.path, feats.num_chunks,
                                       feats.chunk_key, ds.checksums("nodes/features"))
    rows = DiskRows(feats, threads=4)
    n = feats.shape[0]
    bounds = np.linspace(0, n, parts + 1).astype(np.int64)
    t = time.perf_counter()
    total = 0
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        _, nbytes, _ = rows.span(a, b)
        buf = aligned_empty(nbytes)
        total += rows.read_range(a, b, buf)
        del buf
    sec = time.perf_counter() - t
    rows.close()
    feats.verifier = None
    return sec, total


def _warm_up() -> None:
    """Compile (or load) the Numba kernels first: their compile time is not verification."""
    from ooc.kernels.verify import first_common, first_decrease, first_not_increasing, first_outside
    for dt in (np.int32, np.int64):
        a = np.arange(4, dtype=dt)
        first_decrease(a), first_outside(a, 0, 4), first_not_increasing(a), first_common(a, a)


def bench_verify(path: str | Path, drop: bool = True) -> dict:
    """Run the measurements of the module docstring on the dataset at ``path``."""
    res: dict = {"dataset": str(path)}
    _warm_up()
    ds = Dataset(path, verify="none")
    res.update(nodes=ds.num_nodes, edges=ds.num_edges, feature_bytes=ds.features.nbytes,
               scanned_bytes=_scan_bytes(ds))
    ds.close()
    for mode in ("structure", "checksums"):
        _cold(drop)
        d = Dataset(path, verify="none" if mode == "structure" else "checksums")
        t = time.perf_counter()
        problems = d.check_structure()
        sec = time.perf_counter() - t
        d.close()
        assert not problems, problems
        key = "structure" if mode == "structure" else "structure+checksums"
        res[key] = {"seconds": sec, "bytes_per_s": res["scanned_bytes"] / sec}
    for verify in (False, True):
        _cold(drop)
        d = Dataset(path, verify="none")
        sec, nbytes = _read_features(d, verify)
        d.close()
        res["features read+verify" if verify else "features read"] = {
            "seconds": sec, "bytes": nbytes, "bytes_per_s": nbytes / sec}
    d = Dataset(path, verify="none")  # from the page cache now
    feats = d.features
    v = ChunkVerifier(d.path, "nodes/features", feats.path, feats.num_chunks, feats.chunk_key,
                      d.checksums("nodes/features"))
    t = time.perf_counter()
    v.ensure_all()
    sec = time.perf_counter() - t
    res["hash only"] = {"seconds": sec, "bytes_per_s": v.bytes_hashed / sec}
    d.close()
    a, b = res["features read"]["seconds"], res["features read+verify"]["seconds"]
    res["feature_read_overhead"] = b / a - 1
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ooc.tools.bench_verify", description=__doc__.split("\n")[0])
    p.add_argument("dataset")
    p.add_argument("--no-drop-caches", action="store_true")
    p.add_argument("--json", help="write the record here too")
    args = p.parse_args(argv)
    res = bench_verify(args.dataset, drop=not args.no_drop_caches)
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
