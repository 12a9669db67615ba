"""Low-footprint in-place rewrite of ``ooc partition``: the old feature chunks are consumed as the
new ones are spooled, so the disk never holds two copies of the features.

The copy path (:func:`ooc.partition.reorder_dataset`) writes a whole new dataset beside the old
one and renames it over it: at the peak the disk holds the old dataset, the new one and the
feature spool (about 2x the dataset, more with edge buckets).  This path works inside the dataset,
in ``DS/.rewrite/`` (:data:`~ooc.storage.dataset.REWRITE_DIR`):

1. **prepare** (the source untouched): the assignment is saved (``assign.npy``), the topology,
   labels, splits, offsets, ``nodes/perm`` and the other node arrays are rewritten into
   ``.rewrite/new/`` (as the copy path writes them), and every source feature chunk is checked
   against its catalog checksum.  A run killed here leaves the old dataset whole; the next
   ``ooc partition`` discards the folder.
2. **consume**: the journal (``.rewrite/journal.json``, replaced atomically and fsynced) now says the
   source is being consumed; from here the dataset refuses to open (:class:`Dataset` raises
   :class:`DatasetError` naming ``ooc partition DS --resume``).  The old non-feature arrays are
   deleted (their new copies are durable), then the feature chunks are read in order, in batches
   of about 1/16 of the features: each row is appended to the spool file of its group of new ids,
   the spool files are fsynced, the journal records their lengths and the batch, and only then are
   the batch's source chunk files deleted.  A restart truncates the spool files to the journal's
   lengths and continues with the next batch.
3. **place**: each group (at most 1/16 of the features and within the memory budget) is read back,
   put in new-id order and written with ``pwrite`` into the destination chunk files at its rows'
   offsets (so a group need not align with chunks and placing it twice writes the same bytes),
   fsynced; the journal records the group and the checksums of the chunks it completed; then its
   spool file is deleted.
4. **buckets and commit**: the edge buckets are written from the new topology (the spool is gone by
   then), the features' ``zarr.json`` and the catalog are written in ``.rewrite/new/`` and
   fsynced, the journal says ``commit``, ``arrays.zarr`` and ``catalog.lmdb`` are swapped with the
   new ones (each swap redone by a restart if it was cut), then the journal is deleted and the
   folder removed.

Disk at the peak, for a source of ``S`` bytes with ``F`` bytes of features, ``R`` bytes of new
copies of the other arrays (topology, labels, splits, offsets, ``nodes/perm``; the source's old
edge buckets, if any, are not rewritten but replaced) and ``B`` bytes of new edge buckets (two int
arrays of the edge count): ``max(S + R, F + R + max(slack, B))`` + 4 bytes per node (the saved
assignment), ``slack`` being one spool batch or one placement group (each at most
``max(F / 16, one chunk)``) and two partly placed chunks.  With the features most of the dataset
that is about ``1.1 x S``; a dataset whose topology is most of it peaks near ``S + R`` or ``F + R +
B`` (the topology is not consumed: its rewrite reads the old lists at random).  The edge buckets are
not excused: the peak is compared with the source's bytes, buckets included in the peak.

The result is the same dataset as the copy path's (arrays and chunk checksums), whether the run
went through at once or was killed and resumed any number of times.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from ooc.partition import (PartitionResult, _fault_point, _plan_rewrite, _rewrite_manifest,
                           _write_buckets, _write_reordered, _GROUP_ID_BYTES, _BUCKET_NAMES)
from ooc.storage.dataset import (ARRAY_NAMES, REWRITE_DIR, REWRITE_JOURNAL, Dataset, DatasetError,
                                 DatasetStage, pending_rewrite, pending_rewrite_error, read_manifest)
from ooc.storage.rawarray import RawArray, _array_metadata, choose_chunk_rows
from ooc.util.files import fsync_dir, fsync_tree, write_json_atomic
from ooc.util.progress import progress as progress_bar

__all__ = ["rewrite_in_place", "finish_rewrite", "disk_estimate", "discard_prepared",
           "JOURNAL_VERSION", "SLACK_FRACTION"]

JOURNAL_VERSION = 1
#: A spool batch (source chunks consumed per journal entry) and a placement group each hold at
#: most this share of the feature bytes (or one chunk / one row when that is more).
SLACK_FRACTION = 1 / 16
#: The arguments of ``ooc partition`` a pending rewrite was started with (a re-run with the same
#: ones finishes it; other ones are refused while it is pending).
ARG_KEYS = ("num_parts", "method", "seed", "balance_train", "passes", "objective", "edge_buckets",
            "tol", "memory_budget")
_FEATURES = ARRAY_NAMES["features"]


def _hash_file(path: Path, buf: np.ndarray) -> str:
    """blake2b-128 hex of a file, read through ``buf`` (uint8)."""
    h = hashlib.blake2b(digest_size=16)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(mv)
            if not got:
                break
            h.update(mv[:got])
    return h.hexdigest()


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def disk_estimate(ds: Dataset, edge_buckets: bool, num_parts: int = 0) -> dict[str, int]:
    """Disk bytes the two rewrite paths need beside the dataset, from the sizes on disk.

    Args:
        ds: the source dataset.
        edge_buckets: whether the rewrite writes ``partitions/buckets/*``.
        num_parts: P (the bucket offsets hold P^2 + 1 int64; 0: not counted).

    Returns:
        ``{"source": S, "features": F, "copy_extra": bytes beyond S at the copy path's peak (a new
        dataset and the feature spool), "low_extra": the same for this path (see the module
        docstring), "low_peak": S + low_extra}``, all in bytes.
    """
    usage = ds.disk_usage()
    s = _dir_bytes(ds.path)  # every file (Zarr group metadata too)
    f = usage.get(_FEATURES, 0)
    b_old = sum(usage.get(rel, 0) for rel in _BUCKET_NAMES)
    b_new = 0
    if edge_buckets:  # two arrays of E ids in full chunks, and the offsets
        item = ds.raw("indices").dtype.itemsize
        rows = choose_chunk_rows(ds.num_edges, item)
        b_new = 2 * -(-ds.num_edges // rows) * rows * item + 8 * (num_parts ** 2 + 1 if num_parts else 0)
    # the new copies of the other arrays: the old ones, less old buckets, plus a new nodes/perm
    perm_rows = choose_chunk_rows(ds.num_nodes, 8)
    new_perm = -(-ds.num_nodes // perm_rows) * perm_rows * 8  # int64 in full chunks
    rest = s - f - b_old + (0 if ds.has("nodes/perm") else new_perm)
    slack = 0
    if f:  # one spool batch or one placement group, and two partly placed destination chunks
        feat = ds.raw("features")
        slack = max(int(f * SLACK_FRACTION), feat.chunk_bytes) + 2 * feat.chunk_bytes
    # assign.npy (int32 per node); the journal (twice while replaced: ~60 B per feature chunk
    # checksum) and the new arrays' Zarr metadata
    chunks = ds.raw("features").num_chunks if f else 0
    saved = 4 * ds.num_nodes + (64 << 10) + 128 * chunks + 2048 * (len(ds.manifest["arrays"]) + 4)
    low_peak = max(s + rest, f + rest + max(slack, b_new)) + saved
    return {"source": s, "features": f, "copy_extra": f + rest + b_new + f,
            "low_extra": low_peak - s, "low_peak": low_peak}


# ------------------------------------------------------------------------------------ journal
class _Journal:
    """The rewrite's journal: a JSON object replaced atomically and fsynced at every step."""

    def __init__(self, root: Path, data: dict) -> None:
        self.root = root
        self.data = data

    @property
    def path(self) -> Path:
        return self.root / REWRITE_JOURNAL

    def save(self, **changes) -> None:
        self.data.update(changes)
        write_json_atomic(self.path, self.data, durable=True)

    def __getitem__(self, key: str):
        return self.data[key]


def discard_prepared(path: str | os.PathLike) -> bool:
    """Remove ``DS/.rewrite`` left by a run killed while preparing (the source untouched).

    Returns:
        Whether a folder was removed.

    Raises:
        DatasetError: the journal says the source is being consumed (the folder is the only copy
            of part of the dataset: it is never removed here).
    """
    root = Path(path) / REWRITE_DIR
    if not root.exists():
        return False
    j = pending_rewrite(path)
    if j is not None and j.get("phase") != "prepare":
        raise DatasetError(pending_rewrite_error(path, j))
    shutil.rmtree(root)
    return True


# ------------------------------------------------------------------------------------ prepare
def rewrite_in_place(ds: Dataset, result: PartitionResult, args: dict, memory_budget: int | str,
                     edge_buckets: bool, progress: bool = False) -> Path:
    """Rewrite ``ds`` in partition order in place with the low disk footprint (module docstring).

    Args:
        ds: the source (opened with checksum verification; closed here).
        result: the assignment of ``ds``'s node ids.
        args: the ``ooc partition`` arguments (:data:`ARG_KEYS`), kept in the journal.
        memory_budget: as for :func:`~ooc.partition.reorder_dataset`.
        edge_buckets: also write ``partitions/buckets/*``.
        progress: progress bars of each step (topology, node arrays, spool, placement, buckets).

    Returns:
        The dataset's path (rewritten).

    Raises:
        ValueError: as :func:`~ooc.partition.reorder_dataset`, before anything is written.
        DatasetError: a source feature chunk fails its checksum (found while preparing: the source
            is then untouched and the folder removed).
        BaseException: anything raised after the source began to be consumed (a signal, a full
            disk) leaves ``DS/.rewrite`` with its journal; ``ooc partition DS --resume`` finishes.
    """
    path = ds.path
    root = path / REWRITE_DIR
    discard_prepared(path)
    plan = _plan_rewrite(ds, result, memory_budget, edge_buckets)
    t0 = time.time()
    root.mkdir()
    try:
        np.save(root / "assign.npy", result.assign.astype(np.int32, copy=False))
        with open(root / "assign.npy", "rb") as f:
            os.fsync(f.fileno())
        journal = _Journal(root, {"version": JOURNAL_VERSION, "phase": "prepare", "args": args,
                                  "started": t0})
        journal.save()
        stage = DatasetStage(root / "new")
        topo_passes, feat_passes = _write_reordered(ds, plan, stage, with_features=False,
                                                    progress=progress)
        feature = None
        if ds.has("features"):
            src = ds.raw("features")
            sums = ds.checksums(_FEATURES)
            buf = np.empty(min(src.chunk_bytes, 4 << 20), dtype=np.uint8)
            for i in range(src.num_chunks):  # a corrupt source is never consumed
                key = src.chunk_key(i)
                if key in sums and _hash_file(src.chunk_path(i), buf) != sums[key]:
                    raise DatasetError(f"{path}: nodes/features chunk {key} fails its blake2b checksum; "
                                       "nothing was changed: restore or re-convert the dataset")
            del buf
            f_bytes = src.num_chunks * src.chunk_bytes
            group_mem = max(1, plan.group_budget // (2 * src.row_bytes + _GROUP_ID_BYTES))
            group_disk = max(1, int(f_bytes * SLACK_FRACTION) // max(src.row_bytes, 1))
            group = min(group_mem, group_disk)
            feature = {"dtype": src.dtype.name, "row_shape": list(src.shape[1:]), "rows": src.shape[0],
                       "chunk_rows": src.chunk_rows, "num_chunks": src.num_chunks,
                       "batch_chunks": max(1, int(f_bytes * SLACK_FRACTION) // src.chunk_bytes),
                       "source_checksums": sums}
            num_groups = -(-src.shape[0] // group)
        else:
            group, num_groups = 1, 0
        stage.sources = list(ds.manifest.get("sources", []))
        man = _rewrite_manifest(ds, result, 0.0, topo_passes, 1 if feature else 0, edge_buckets)
        fsync_tree(root)
        data = dict(journal.data, records=stage.records, manifest=man, sources=stage.sources,
                    feature=feature, group_rows=group, num_groups=num_groups,
                    spool_bytes=[0] * num_groups, consumed_chunks=0, placed_groups=0,
                    checksums={}, buckets_done=not edge_buckets, num_parts=plan.num_parts,
                    index_dtype=plan.index_dtype.name, group_budget=plan.group_budget,
                    chunk_bytes=plan.chunk_bytes, held_bytes=plan.held)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)  # the source is untouched
        raise
    ds.close()
    del plan
    # from this save on the dataset is being consumed: it refuses to open until finished
    journal.data = data
    journal.save(phase="consume")
    return finish_rewrite(path, progress)[0]


# ------------------------------------------------------------------------------------ finish
def finish_rewrite(path: str | os.PathLike, progress: bool = False) -> tuple[Path, PartitionResult]:
    """Complete the in-place rewrite recorded in ``DS/.rewrite/journal.json`` (``--resume``).

    Every step is redone from the journal's last entry (see the module docstring), so this may be
    interrupted and called again any number of times; the result equals an uninterrupted run's.
    ``progress`` shows a bar per remaining step (spool, placement, edge buckets).

    Returns:
        ``(path, PartitionResult)`` with the assignment the rewrite was started with, and in its
        ``extra`` the split of the memory budget that run made (``held_bytes``: None in a journal
        written before it was recorded; ``group_bytes``).

    Raises:
        DatasetError: no rewrite is pending, its journal is from another version, or a file the
            journal counts on is missing or has the wrong size (named).
    """
    path = Path(path)
    root = path / REWRITE_DIR
    j = pending_rewrite(path)
    if j is None:
        raise DatasetError(f"{path}: no interrupted in-place `ooc partition` to resume "
                           f"({root / REWRITE_JOURNAL} does not exist)")
    if j.get("version") != JOURNAL_VERSION:
        raise DatasetError(f"{root / REWRITE_JOURNAL}: journal version {j.get('version')}, this ooc "
                           f"finishes version {JOURNAL_VERSION}")
    if j["phase"] == "prepare":
        raise DatasetError(f"{path}: the in-place rewrite was interrupted while preparing (the dataset "
                           "is untouched): run `ooc partition` again")
    try:
        return _finish(path, root, j, progress)
    except Exception as e:
        raise DatasetError(f"{e} -- the in-place rewrite of {path} stopped after it began consuming the "
                           f"old files; once the cause is fixed, `ooc partition {path} --resume` "
                           "finishes it (the dataset cannot be opened until then)") from e
    except BaseException as e:  # a signal: the message of the CLI names the way on
        try:
            e.left = (f"the in-place rewrite is journaled: `ooc partition {path} --resume` finishes "  # type: ignore[attr-defined]
                      "it (the dataset cannot be opened until then)")
        except AttributeError:
            pass
        raise


def _finish(path: Path, root: Path, j: dict, progress: bool = False) -> tuple[Path, PartitionResult]:
    journal = _Journal(root, j)
    assign = np.load(root / "assign.npy")
    if j["phase"] == "consume":
        _consume(path, journal, assign, progress)
    if j["phase"] == "place":
        _place(path, journal, assign, progress)
    if j["phase"] == "place-done":
        stage = DatasetStage(root / "new", records=j["records"])
        stage.sources = j["sources"]
        _buckets(journal, stage, progress)
        _finalize(path, journal, stage)
    if j["phase"] == "commit":
        _swap(path, root)
    s = j["manifest"]["partitioning"]
    res = PartitionResult(assign=assign, num_parts=s["num_parts"], method=s["method"],
                          num_edges=s["num_edges"], edge_cut=s["edge_cut"],
                          sizes=np.asarray(s["sizes"], dtype=np.int64),
                          train_per_part=np.asarray(s["train_per_part"], dtype=np.int64),
                          seconds=s["seconds"], moved=s["moved_by_constraints"],
                          extra={k: s[k] for k in ("passes", "objective") if k in s})
    res.extra.update(held_bytes=j.get("held_bytes"), group_bytes=j["group_budget"])  # the run's split
    return path, res


def _spool_paths(root: Path, k: int) -> list[Path]:
    return [root / "spool" / f"group-{g:05d}.bin" for g in range(k)]


def _consume(path: Path, journal: _Journal, assign: np.ndarray, progress: bool = False) -> None:
    """Phase consume: old non-feature arrays deleted, features spooled with each batch of source
    chunks deleted once durably spooled."""
    j = journal.data
    root = journal.root
    old_arrays = path / "arrays.zarr"
    # the old non-feature arrays go: their new copies are durable (fsynced before the journal said
    # consume); the old catalog still lists them and is replaced at the commit
    for rel in read_manifest(path)["arrays"]:
        if rel != _FEATURES:
            shutil.rmtree(old_arrays / rel, ignore_errors=True)
    _fault_point("low-disk-consume")
    feat = j["feature"]
    if feat is None:
        journal.save(phase="place")
        return
    src_dir = old_arrays / _FEATURES
    dtype = np.dtype(feat["dtype"])
    row_shape = tuple(feat["row_shape"])
    row_items = int(np.prod(row_shape, dtype=np.int64)) if row_shape else 1
    row_bytes = row_items * dtype.itemsize
    n, cr, nc = feat["rows"], feat["chunk_rows"], feat["num_chunks"]
    chunk_bytes = cr * row_bytes
    group, k = j["group_rows"], j["num_groups"]
    key = _chunk_key_fn(len(row_shape) + 1)
    perm = np.argsort(assign, kind="stable").astype(np.int64, copy=False)
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n, dtype=np.int64)
    del perm
    # spool files: cut to the journal's lengths (bytes past them belong to an unrecorded batch)
    paths = _spool_paths(root, k)
    paths[0].parent.mkdir(exist_ok=True)
    for p, length in zip(paths, j["spool_bytes"]):
        with open(p, "ab") as f:
            f.truncate(length)
    if paths:
        fsync_dir(paths[0].parent)  # the spool files' names durable before a batch is journaled
    start = j["consumed_chunks"]
    for c in range(start):  # recorded as consumed; a kill may have come before their deletion
        (src_dir / key(c)).unlink(missing_ok=True)
    scan = max(1, min(group, cr, (64 << 20) // max(row_bytes, 1)))
    blk_buf = np.empty((scan, *row_shape), dtype=dtype)
    rows_buf = np.empty_like(blk_buf)
    pad = np.zeros(0, dtype=np.uint8)
    files = [open(p, "ab") for p in paths]
    bar = progress_bar(total=nc, initial=start, unit="chunk", enabled=progress, desc="features spool")
    try:
        c = start
        while c < nc:
            batch = range(c, min(nc, c + feat["batch_chunks"]))
            touched: set[int] = set()
            for ci in batch:
                f = src_dir / key(ci)
                h = hashlib.blake2b(digest_size=16)
                r0, r1 = ci * cr, min(n, (ci + 1) * cr)
                try:
                    fd = os.open(f, os.O_RDONLY)
                except FileNotFoundError:
                    raise DatasetError(f"{f}: source chunk {ci} of nodes/features is missing, but the "
                                       f"journal {journal.path} says it was not consumed yet; the "
                                       "dataset is damaged") from None
                try:
                    for b0 in range(r0, r1, scan):
                        b1 = min(r1, b0 + scan)
                        blk = blk_buf[:b1 - b0]
                        mv = memoryview(blk.reshape(-1).view(np.uint8))
                        got = os.preadv(fd, [mv], (b0 - r0) * row_bytes)
                        if got != len(mv):
                            raise DatasetError(f"{f}: short read ({got} of {len(mv)} bytes)")
                        h.update(mv)
                        gid = inv[b0:b1] // group
                        order = np.argsort(gid, kind="stable")
                        counts = np.bincount(gid, minlength=k)
                        rows = np.take(blk, order, axis=0, out=rows_buf[:b1 - b0], mode="clip")
                        a = 0
                        for g in np.flatnonzero(counts):
                            cnt = int(counts[g])
                            files[g].write(memoryview(rows[a:a + cnt].reshape(-1).view(np.uint8)))
                            touched.add(int(g))
                            a += cnt
                    tail = chunk_bytes - (r1 - r0) * row_bytes
                    if tail:
                        if pad.shape[0] < tail:
                            pad = np.empty(tail, dtype=np.uint8)
                        got = os.preadv(fd, [memoryview(pad[:tail])], (r1 - r0) * row_bytes)
                        h.update(memoryview(pad[:got]))
                finally:
                    os.close(fd)
                want = feat["source_checksums"].get(key(ci))
                if want is not None and h.hexdigest() != want:
                    raise DatasetError(f"{f}: nodes/features chunk {key(ci)} fails its blake2b checksum "
                                       "(it passed before the rewrite began)")
            for g in touched:
                files[g].flush()
                os.fsync(files[g].fileno())
            c = batch.stop
            journal.save(consumed_chunks=c, spool_bytes=[fh.tell() for fh in files])
            _fault_point("low-disk-spool")
            for ci in batch:
                (src_dir / key(ci)).unlink(missing_ok=True)
            bar.update(len(batch))
    finally:
        for fh in files:
            fh.close()
        bar.close()
    del blk_buf, rows_buf, inv
    shutil.rmtree(src_dir, ignore_errors=True)
    journal.save(phase="place")


def _buckets(journal: _Journal, stage: DatasetStage, progress: bool = False) -> None:
    """The edge buckets, from the new topology (after the features are placed: the spool and the
    buckets are never on disk together); a cut pass starts over."""
    j = journal.data
    if not j["buckets_done"]:
        for rel in _BUCKET_NAMES:  # a cut bucket pass starts over
            shutil.rmtree(stage.arrays_root / rel, ignore_errors=True)
            stage.records.pop(rel, None)
        new_indptr = RawArray(stage.arrays_root / ARRAY_NAMES["indptr"]).read_all()
        offsets = RawArray(stage.arrays_root / ARRAY_NAMES["partition_offsets"]).read_all()
        _write_buckets(stage, new_indptr, offsets, j["num_parts"], np.dtype(j["index_dtype"]),
                       j["group_budget"], j["chunk_bytes"], progress)
        del new_indptr
        fsync_tree(stage.arrays_root / "partitions")
        journal.save(records=stage.records, buckets_done=True)
        _fault_point("low-disk-buckets")


def _is_group(meta: Path) -> bool:
    try:
        return json.loads(meta.read_text()).get("node_type") == "group"
    except (OSError, ValueError):
        return False


def _chunk_key_fn(ndim: int):
    tail = "/0" * (ndim - 1)
    return lambda i: f"c/{i}{tail}"


def _place(path: Path, journal: _Journal, assign: np.ndarray, progress: bool = False) -> None:
    """Phase place: each spool group written into the destination chunks at its rows' offsets."""
    j = journal.data
    root = journal.root
    feat = j["feature"]
    if feat is None:
        journal.save(phase="place-done")
        return
    dtype = np.dtype(feat["dtype"])
    row_shape = tuple(feat["row_shape"])
    row_items = int(np.prod(row_shape, dtype=np.int64)) if row_shape else 1
    row_bytes = row_items * dtype.itemsize
    n, cr = feat["rows"], feat["chunk_rows"]
    chunk_bytes = cr * row_bytes
    group, k = j["group_rows"], j["num_groups"]
    key = _chunk_key_fn(len(row_shape) + 1)
    dest = root / "new" / "arrays.zarr" / _FEATURES
    dest.mkdir(parents=True, exist_ok=True)
    perm = np.argsort(assign, kind="stable").astype(np.int64, copy=False)
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n, dtype=np.int64)
    paths = _spool_paths(root, k)
    checksums = dict(j["checksums"])
    for g in range(j["placed_groups"]):
        paths[g].unlink(missing_ok=True)
    bar = progress_bar(total=k, initial=j["placed_groups"], unit="group", enabled=progress,
                       desc="features place")
    for g in range(j["placed_groups"], k):
        g0, g1 = g * group, min(n, (g + 1) * group)
        size = paths[g].stat().st_size if paths[g].exists() else -1
        if size != (g1 - g0) * row_bytes:
            raise DatasetError(f"{paths[g]}: spool of group {g} holds {size} bytes, expected "
                               f"{(g1 - g0) * row_bytes}; the rewrite cannot finish")
        got = np.fromfile(paths[g], dtype=dtype).reshape((-1, *row_shape))
        out = np.empty_like(got)
        out[inv[np.sort(perm[g0:g1])] - g0] = got
        del got
        ob = out.reshape(-1).view(np.uint8)
        for c in range(g0 // cr, (g1 - 1) // cr + 1):
            lo, hi = max(g0, c * cr), min(g1, (c + 1) * cr)
            f = dest / key(c)
            f.parent.mkdir(parents=True, exist_ok=True)
            created = not f.exists()
            fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size != chunk_bytes:
                    os.ftruncate(fd, chunk_bytes)  # full size, zero padded like RawArrayWriter's
                mv = memoryview(ob[(lo - g0) * row_bytes:(hi - g0) * row_bytes])
                pos, off = 0, (lo - c * cr) * row_bytes
                while pos < len(mv):
                    pos += os.pwrite(fd, mv[pos:], off + pos)
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:  # the file's name durable before the journal counts on it
                for d in (f.parent, *f.parent.parents):
                    fsync_dir(d)
                    if d == dest:
                        break
            end = min((c + 1) * cr, n)
            if end <= g1:  # the chunk is complete: its checksum
                h = hashlib.blake2b(digest_size=16)
                if c * cr >= g0:
                    h.update(memoryview(ob[(c * cr - g0) * row_bytes:(end - g0) * row_bytes]))
                    h.update(bytes(chunk_bytes - (end - c * cr) * row_bytes))
                else:
                    h.update(f.read_bytes())
                checksums[key(c)] = h.hexdigest()
        del out, ob
        journal.save(placed_groups=g + 1, checksums=checksums)
        _fault_point("low-disk-place")
        paths[g].unlink()
        bar.update(1)
    bar.close()
    shutil.rmtree(root / "spool", ignore_errors=True)
    fsync_dir(dest)
    journal.save(phase="place-done")


def _finalize(path: Path, journal: _Journal, stage: DatasetStage) -> None:
    """The features' metadata and the new catalog, fsynced; then the journal says commit."""
    j = journal.data
    feat = j["feature"]
    if feat is not None:
        dest = stage.arrays_root / _FEATURES
        shape = [feat["rows"], *feat["row_shape"]]
        meta = _array_metadata(tuple(shape), np.dtype(feat["dtype"]), feat["chunk_rows"])
        (dest / "zarr.json").write_text(json.dumps(meta, indent=2))
        stage._array_path(_FEATURES)  # the parent Zarr group
        stage.records[_FEATURES] = {"shape": shape, "dtype": np.dtype(feat["dtype"]).name,
                                    "chunk_rows": feat["chunk_rows"], "checksums": j["checksums"]}
    shutil.rmtree(stage.tmp / "catalog.lmdb", ignore_errors=True)  # a cut earlier try
    man = json.loads(json.dumps(j["manifest"]))
    man["partitioning"]["rewrite_seconds"] = time.time() - j["started"]
    _fault_point("low-disk-finalize")
    stage.write_catalog(path, **man)
    journal.save(phase="commit")


def _swap(path: Path, root: Path) -> None:
    """Phase commit: the new ``arrays.zarr`` and ``catalog.lmdb`` replace the old (each swap
    redone if cut), then the journal and the folder go."""
    new = root / "new"
    for name in ("arrays.zarr", "catalog.lmdb"):
        if (new / name).exists():
            old = root / f"old-{name}"
            if (path / name).exists():
                if old.exists():
                    shutil.rmtree(old)
                os.rename(path / name, old)
            _fault_point("low-disk-commit")
            os.rename(new / name, path / name)
    fsync_dir(path)
    (root / REWRITE_JOURNAL).unlink()
    fsync_dir(root)
    shutil.rmtree(root)
    fsync_dir(path)
