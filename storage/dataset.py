"""The on-disk dataset (format v1): writer (atomic) and reader.

A dataset is a directory::

    DATASET/
      catalog.lmdb/            LMDB: manifest, per-chunk checksums
      arrays.zarr/             Zarr v3 group, uncompressed, chunked along axis 0
        topology/indptr        int64 [N+1]   CSC: in-edges of node v are indices[indptr[v]:indptr[v+1]]
        topology/indices       int32|int64 [E] source node of each in-edge (int64 iff N >= 2**31)
        nodes/features         float32|float16 [N, D]
        nodes/labels           int32 [N], -1 = unlabelled
        nodes/splits/{train,valid,test}   int64 sorted node ids
        partitions/offsets     int64 [P+1] (optional): partition p = nodes [offsets[p], offsets[p+1])

The writer builds everything under a hidden temporary sibling (``.NAME.partial-PID-XXXX``) and renames
it into place only once complete and verified, so a failed or killed conversion never leaves a
dataset directory at the target path.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from ooc.util.files import fsync_dir, fsync_tree, remove_made_dirs
from ooc.util.procs import remove_dead_leftovers
from ooc.util.signals import forget_partial, register_partial
from ooc.storage.locks import PathLock
from ooc.storage.catalog import FORMAT_VERSION, Catalog, open_env
from ooc.storage.rawarray import RawArray, RawArrayWriter, write_array, write_group_metadata
from ooc.storage.verify import read_verification, verifier_for

__all__ = ["Dataset", "DatasetWriter", "DatasetStage", "ArrayGroupWriter", "DatasetError", "sha256_file",
           "ARRAY_NAMES", "read_manifest", "dataset_identity", "is_dataset", "pending_rewrite",
           "pending_rewrite_error", "REWRITE_DIR", "REWRITE_JOURNAL"]

ARRAY_NAMES = {
    "indptr": "topology/indptr",
    "indices": "topology/indices",
    "features": "nodes/features",
    "labels": "nodes/labels",
    "train": "nodes/splits/train",
    "valid": "nodes/splits/valid",
    "test": "nodes/splits/test",
    "partition_offsets": "partitions/offsets",
    "edge_weight": "edges/weight",
    "node_type": "nodes/type",
}
SPLITS = ("train", "valid", "test")
_NOT_MONOTONE = "topology/indptr is not a monotone offset array from 0 to E"


class DatasetError(Exception):
    """A dataset is missing, malformed or fails verification."""


def sha256_file(path: str | os.PathLike, block: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(block)
            if not b:
                break
            h.update(b)
    return h.hexdigest()




def _remove_stale_partials(out: Path) -> None:
    """Remove ``.NAME.partial-*`` / ``.NAME.old-*`` / ``.NAME.tmp-*`` siblings of ``out`` left by
    dead processes (a kill during a write or right after the rename)."""
    remove_dead_leftovers(out.parent, out.name)


def check_not_input(out: Path, inputs: Iterable[str | os.PathLike]) -> None:
    """Refuse an output path that is one of the inputs, or a folder holding one.

    Raises:
        ValueError: naming the input and the output.
    """
    o = Path(os.path.realpath(out))
    for x in inputs:
        if x is None:
            continue
        i = Path(os.path.realpath(x))
        if i == o or o in i.parents:
            raise ValueError(f"--out {out} would replace the input {x}: write the dataset elsewhere")


def check_replaceable(out: Path, overwrite: bool) -> None:
    """What may stand at a writer's target: nothing, or (with ``overwrite``) an ooc dataset.

    Raises:
        FileExistsError: ``out`` exists without ``overwrite``; or ``out`` is a file, or a directory
            that is not an ooc dataset (no readable catalog and manifest), which ``--overwrite``
            never replaces (its files are kept).
    """
    if not os.path.lexists(out):
        return
    if not overwrite:
        raise FileExistsError(f"{out}: already exists (pass --overwrite to replace it)")
    if out.is_symlink() or not out.is_dir():
        raise FileExistsError(f"{out}: is a file, not an ooc dataset; --overwrite replaces only an "
                              "existing dataset: choose another --out or remove the file yourself")
    if not is_dataset(out):
        n = sum(1 for _ in out.iterdir())
        raise FileExistsError(f"{out}: is a directory holding {n} entries that is not an ooc dataset "
                              "(no readable catalog.lmdb); --overwrite replaces only an existing "
                              "dataset, never other files: choose another --out or remove it yourself")


def _slices(n: int, step: int) -> Iterator[tuple[int, int]]:
    """``(a, b)`` covering ``[0, n)`` in slices of ``step``."""
    return ((a, min(a + step, n)) for a in range(0, n, step))


#: Folder inside a dataset that a low-footprint in-place ``ooc partition`` works in (new arrays,
#: spool files, its journal); see :func:`pending_rewrite`.
REWRITE_DIR = ".rewrite"
#: The journal of that rewrite, inside :data:`REWRITE_DIR`.
REWRITE_JOURNAL = "journal.json"


def pending_rewrite(path: str | os.PathLike) -> dict | None:
    """The journal of an in-place ``ooc partition`` rewrite of the dataset at ``path``, or None.

    The journal's ``phase`` is ``prepare`` while the source is untouched (the dataset opens as
    usual), then ``consume`` / ``place`` / ``commit`` once source files were deleted: the dataset
    is then incomplete until the rewrite finishes (``ooc partition PATH --resume``).

    Raises:
        DatasetError: the journal exists but is not valid JSON (never written torn: it is
            replaced atomically; a damaged one is named).
    """
    f = Path(path) / REWRITE_DIR / REWRITE_JOURNAL
    try:
        text = f.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        j = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{f}: journal of an interrupted `ooc partition` is not valid JSON ({e})") \
            from None
    return j if isinstance(j, dict) else None


def pending_rewrite_error(path: str | os.PathLike, journal: dict) -> str:
    """The message naming an unfinished in-place rewrite and the command that finishes it."""
    done = journal.get("consumed_chunks", 0)
    total = journal.get("feature", {}).get("num_chunks", 0) if journal.get("feature") else 0
    where = {"consume": f"{done} of {total} feature chunks moved to its spool",
             "place": f"features spooled, {journal.get('placed_groups', 0)} of "
                      f"{journal.get('num_groups', 0)} groups placed",
             "place-done": "features placed, catalog being written",
             "commit": "complete, being swapped in"}.get(journal.get("phase"), journal.get("phase"))
    return (f"{path}: an in-place `ooc partition` of this dataset was interrupted after it began "
            f"consuming the old files ({where}); the dataset cannot be read until the rewrite "
            f"finishes: run `ooc partition {path} --resume` (or the same `ooc partition` command "
            "again)")


class DatasetStage:
    """Arrays of a dataset being built in the folder ``root`` (``root/arrays.zarr``) and, at the
    end, its catalog: the part of :class:`DatasetWriter` that neither locks nor renames.

    Args:
        root: the folder (created with its Zarr group if missing).
        records: catalog records of arrays already written there (a resumed build).
    """

    def __init__(self, root: str | os.PathLike, records: dict[str, dict] | None = None) -> None:
        self.tmp = Path(root)
        self.arrays_root = self.tmp / "arrays.zarr"
        if not (self.arrays_root / "zarr.json").exists():
            write_group_metadata(self.arrays_root)
        self.records: dict[str, dict] = dict(records or {})
        self.sources: list[dict] = []

    # ---------------------------------------------------------------- arrays
    def _array_path(self, name: str) -> tuple[str, Path]:
        rel = ARRAY_NAMES.get(name, name)
        path = self.arrays_root / rel
        # make intermediate Zarr groups
        parent = path.parent
        chain = []
        while parent != self.arrays_root:
            chain.append(parent)
            parent = parent.parent
        for g in reversed(chain):
            if not (g / "zarr.json").exists():
                write_group_metadata(g)
        return rel, path

    def array_writer(self, name: str, dtype: np.dtype | str, row_shape: tuple[int, ...] = (),
                     expected_rows: int = 0, chunk_rows: int | None = None) -> RawArrayWriter:
        """A streaming writer for array ``name`` (a key of :data:`ARRAY_NAMES` or a Zarr path).
        Call :meth:`finish_array` with it when done."""
        rel, path = self._array_path(name)
        w = RawArrayWriter(path, dtype, row_shape, chunk_rows=chunk_rows, expected_rows=expected_rows)
        w.name = rel  # type: ignore[attr-defined]
        return w

    def finish_array(self, writer: RawArrayWriter) -> None:
        self.records[writer.name] = writer.close()  # type: ignore[attr-defined]

    def write_array(self, name: str, data: np.ndarray, chunk_rows: int | None = None) -> None:
        """Write a whole in-memory array."""
        rel, path = self._array_path(name)
        self.records[rel] = write_array(path, data, chunk_rows=chunk_rows)

    def add_source(self, path: str | os.PathLike) -> None:
        """Record an input file with its size and sha256 in the manifest."""
        p = Path(path)
        self.sources.append({"path": str(p.absolute()), "size": p.stat().st_size,
                             "sha256": sha256_file(p)})

    def write_catalog(self, target: Path, **manifest: Any) -> dict:
        """Check the structure, write ``catalog.lmdb`` (manifest and checksums) and fsync the folder.

        Args:
            target: the dataset's final path (for messages).
            **manifest: manifest fields (``name``, ``num_nodes``...).

        Returns:
            The manifest written.

        Raises:
            DatasetError: the structural checks fail.
        """
        man = {
            "format_version": FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tool": "ooc",
            "tool_version": _tool_version(),
            "sources": self.sources,
        }
        man.update(manifest)
        man["arrays"] = {k: {kk: v[kk] for kk in ("shape", "dtype", "chunk_rows")}
                         for k, v in self.records.items()}
        ds = Dataset(self.tmp, _manifest=man)
        problems = ds.check_structure()
        ds.close()
        if problems:
            raise DatasetError(f"{target}: refusing to write an invalid dataset: " + "; ".join(problems))
        cat = Catalog(self.tmp / "catalog.lmdb", readonly=False)
        try:
            items = {"manifest": man}
            for k, rec in self.records.items():
                items[f"checksums/{k}"] = rec["checksums"]
            cat.put_many_json(items)
            cat.sync()
        finally:
            cat.close()
        fsync_tree(self.tmp)
        return man


class DatasetWriter(DatasetStage):
    """Build a dataset atomically.

    Use as a context manager; on an exception the partial directory is removed::

        with DatasetWriter(out) as w:
            w.write_array("features", x)
            ...
            w.commit(num_nodes=..., ...)

    The writer holds ``out``'s exclusive lock (:class:`~ooc.storage.locks.PathLock`) from
    construction to commit or abort: a second writer of the same target, or a reader of the
    dataset being replaced, fails at once with the holder named (or waits, with ``wait``).

    Args:
        out: target dataset directory.
        overwrite: replace an existing dataset at ``out`` (only after the new one is complete).
            Only an ooc dataset (a readable catalog with a manifest) is ever replaced: a file, or a
            directory that is not a dataset, is refused whatever ``overwrite`` says.
        inputs: the conversion's input files and folders; ``out`` may be none of them and may not
            contain any of them.
        wait: wait for the lock instead of failing (default: the process default, ``--wait``).

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false, or ``out`` is not a dataset.
        ValueError: ``out`` is (or contains) one of ``inputs``.
        LockError: another process reads or writes ``out``.
    """

    def __init__(self, out: str | os.PathLike, overwrite: bool = False,
                 inputs: Iterable[str | os.PathLike] = (), wait: bool | None = None) -> None:
        self.out = Path(out).absolute()
        check_not_input(self.out, inputs)
        self.overwrite = overwrite
        # folders made for the output: removed again (as far as empty) when nothing is committed
        self._made = [p for p in self.out.parents if not p.exists()]
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self._lock = PathLock(self.out, exclusive=True, wait=wait, what="dataset",
                              purpose="write").acquire()
        try:
            check_replaceable(self.out, overwrite)
            _remove_stale_partials(self.out)
        except BaseException:
            self._lock.release()
            remove_made_dirs(self._made)
            raise
        self.tmp = self.out.parent / f".{self.out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
        self.tmp.mkdir()
        register_partial(self.tmp)  # removed if a signal forces the process out
        DatasetStage.__init__(self, self.tmp)
        self._done = False

    # ---------------------------------------------------------------- commit
    def commit(self, **manifest: Any) -> Path:
        """Verify, write the catalog, fsync and rename into place.

        Args:
            **manifest: fields stored in the manifest (``name``, ``num_nodes``, ``num_classes``...).

        Returns:
            The final dataset path.

        Raises:
            DatasetError: the structural checks fail (nothing is left at the target path).
        """
        check_not_input(self.out, [src["path"] for src in self.sources])
        self.write_catalog(self.out, **manifest)
        _fault_point("before-rename")
        if self.out.exists():
            trash = self.out.parent / f".{self.out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(self.out, trash)
            os.rename(self.tmp, self.out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(self.tmp, self.out)
        fsync_dir(self.out.parent)
        self._done = True
        forget_partial(self.tmp)
        self._lock.release()
        return self.out

    def abort(self) -> None:
        """Remove the partial directory (and release the lock)."""
        if not self._done:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self._done = True
            self._lock.release()
            remove_made_dirs(self._made)
        forget_partial(self.tmp)
        self._lock.release()

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None or not self._done:
            self.abort()


class ArrayGroupWriter:
    """Add (or replace) one group of arrays in an existing dataset, atomically.

    The arrays are written under a hidden sibling of the group's directory
    (``arrays.zarr/<parent>/.<name>.partial-PID-XXXX``); :meth:`commit` fsyncs them, first drops a
    previous version of the group from the manifest (one LMDB transaction), renames the new
    directory into place, then records its arrays, checksums and ``manifest`` fields (a second
    transaction).  A writer killed at any point leaves a dataset that verifies: with the old group,
    with none, or with the new one; the leftovers are removed by the next writer of the group.

    Args:
        path: dataset directory.
        group: Zarr path of the group, e.g. ``"nodes/pq"`` (its parent group must exist).
        overwrite: replace the group when the dataset already has it.

    Raises:
        DatasetError: not a dataset, or the parent group is missing.
        FileExistsError: the group exists and ``overwrite`` is false.
        LockError: another process reads or writes the dataset (held exclusively until commit).
    """

    def __init__(self, path: str | os.PathLike, group: str, overwrite: bool = False,
                 wait: bool | None = None) -> None:
        self.path = Path(path)
        # held until commit / abort: readers of the dataset (ooc train) and other writers excluded
        self._lock = PathLock(self.path, exclusive=True, wait=wait, what="dataset",
                              purpose=f"add {group} to").acquire()
        try:
            self._init(group, overwrite)
        except BaseException:
            self._lock.release()
            raise

    def _init(self, group: str, overwrite: bool) -> None:
        self.ds = Dataset(self.path)  # validates the dataset
        self.group = group.strip("/")
        prefix = self.group + "/"
        self.old = [k for k in self.ds.manifest["arrays"] if k.startswith(prefix)]
        if self.old and not overwrite:
            raise FileExistsError(f"{self.path}: dataset already has {self.group} "
                                  "(pass --overwrite to replace it)")
        self.final = self.path / "arrays.zarr" / self.group
        if not (self.final.parent / "zarr.json").exists():
            raise DatasetError(f"{self.path}: no group {self.final.parent.name} to add {self.group} to")
        _remove_stale_partials(self.final)
        self.tmp = self.final.parent / f".{self.final.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
        self.tmp.mkdir()
        register_partial(self.tmp)
        write_group_metadata(self.tmp)
        self.records: dict[str, dict] = {}
        self._done = False

    def array_writer(self, name: str, dtype: np.dtype | str, row_shape: tuple[int, ...] = (),
                     expected_rows: int = 0, chunk_rows: int | None = None) -> RawArrayWriter:
        """A streaming writer for array ``<group>/<name>``; finish with :meth:`finish_array`."""
        w = RawArrayWriter(self.tmp / name, dtype, row_shape, chunk_rows=chunk_rows,
                           expected_rows=expected_rows)
        w.name = f"{self.group}/{name}"  # type: ignore[attr-defined]
        return w

    def finish_array(self, writer: RawArrayWriter) -> None:
        self.records[writer.name] = writer.close()  # type: ignore[attr-defined]

    def write_array(self, name: str, data: np.ndarray) -> None:
        """Write a whole in-memory array ``<group>/<name>``."""
        self.records[f"{self.group}/{name}"] = write_array(self.tmp / name, data)

    def commit(self, **manifest: Any) -> None:
        """Put the group in place and record it with the ``manifest`` fields (see the class
        docstring for the order; fields of the same names are dropped with the old group)."""
        fsync_tree(self.tmp)
        cat = Catalog(self.path / "catalog.lmdb", readonly=False)
        try:
            man = {k: v for k, v in self.ds.manifest.items() if k not in manifest}
            arrays = {k: v for k, v in man["arrays"].items() if k not in self.old}
            if self.old or len(man) < len(self.ds.manifest):
                # the old group and the manifest fields describing it go first
                cat.put_many_json({"manifest": dict(man, arrays=arrays)})
                cat.sync()
            if self.final.exists():  # the old group, or a leftover of a killed writer
                trash = self.final.parent / f".{self.final.name}.old-{os.getpid()}"
                os.rename(self.final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            _fault_point("group-before-rename")
            os.rename(self.tmp, self.final)
            fsync_dir(self.final.parent)
            for k, rec in self.records.items():
                arrays[k] = {kk: rec[kk] for kk in ("shape", "dtype", "chunk_rows")}
            man.update(manifest)
            man["arrays"] = arrays
            items: dict[str, Any] = {"manifest": man}
            items.update({f"checksums/{k}": rec["checksums"] for k, rec in self.records.items()})
            cat.put_many_json(items)
            cat.sync()
        finally:
            cat.close()
        self._done = True
        self.ds.close()
        forget_partial(self.tmp)
        self._lock.release()

    def abort(self) -> None:
        """Remove the partial directory (and release the lock)."""
        if not self._done:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self._done = True
            self.ds.close()
        forget_partial(self.tmp)
        self._lock.release()

    def __enter__(self) -> "ArrayGroupWriter":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None or not self._done:
            self.abort()


def _fault_point(name: str) -> None:
    """Test hook: with ``OOC_FAULT_PAUSE=<name>:<seconds>[:<marker file>]`` in the environment, touch
    the marker and sleep at this point, so a test can SIGKILL the process mid-write."""
    spec = os.environ.get("OOC_FAULT_PAUSE")
    if not spec:
        return
    parts = spec.split(":")
    if parts[0] != name:
        return
    if len(parts) > 2:
        Path(parts[2]).touch()
    time.sleep(float(parts[1]))






def _first_outside_blocks(arr: RawArray, lo: int, hi: int, step: int) -> tuple[int, int] | None:
    """``(position, value)`` of the first entry of a 1-D array outside ``[lo, hi)``, scanned in
    blocks of ``step`` entries; None when every entry is inside."""
    from ooc.kernels.verify import first_outside
    for s in range(0, arr.shape[0], step):
        block = arr.read(s, min(s + step, arr.shape[0]))
        i = first_outside(block, lo, hi)
        if i >= 0:
            return s + int(i), int(block[i])
    return None


def _tool_version() -> str:
    try:
        from importlib.metadata import version
        return version("ooc-gnn")
    except Exception:  # pragma: no cover
        return "unknown"


def _open_catalog(path: Path) -> Catalog:
    """The dataset's catalog opened read-only; a missing or unreadable one is a DatasetError."""
    import lmdb
    try:
        return Catalog(path / "catalog.lmdb")
    except FileNotFoundError as e:
        raise DatasetError(str(e)) from None
    except (lmdb.Error, OSError) as e:
        raise DatasetError(f"{path / 'catalog.lmdb'}: LMDB catalog unreadable ({type(e).__name__}: "
                           f"{e}); the dataset is damaged: re-create it from its sources") from None


def _catalog_json(cat: Catalog, key: str, path: Path) -> Any:

    import lmdb
    try:
        return cat.get_json(key)
    except (lmdb.Error, OSError) as e:
        raise DatasetError(f"{path / 'catalog.lmdb'}: cannot read key {key!r} ({type(e).__name__}: "
                           f"{e}); the catalog is damaged") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path / 'catalog.lmdb'}: key {key!r} is not valid JSON ({e}); the "
                           "catalog is damaged") from None


def dataset_identity(manifest: dict) -> dict:
    """What fixes a dataset's node numbering and graph, from its manifest: when it was written
    (``created``: a new conversion or generation into the same folder), its sizes, and its
    partitioning (``ooc partition`` renumbers the nodes in place; durations left out, so the same
    partitioning run twice is the same identity).  Two datasets with equal identities number the
    same nodes alike; a checkpoint keeps its dataset's identity so that ``--resume`` can refuse a
    dataset that changed underneath the run.

    Returns:
        ``{"created", "num_nodes", "directed_edges", "partitioning"}`` (JSON values; the last is
        ``{"method", "num_parts", "digest"}`` or None when never partitioned).
    """
    part = manifest.get("partitioning") or None
    if part is not None:
        kept = {k: v for k, v in sorted(part.items()) if not k.endswith("seconds")}
        digest = hashlib.blake2b(json.dumps(kept, sort_keys=True).encode(), digest_size=8).hexdigest()
        part = {"method": part.get("method"), "num_parts": part.get("num_parts"), "digest": digest}
    return {"created": manifest.get("created"), "num_nodes": manifest.get("num_nodes"),
            "directed_edges": manifest.get("directed_edges"), "partitioning": part}


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of the dataset at ``path``.

    Raises:
        DatasetError: no catalog, an unreadable (corrupt) catalog, a manifest that is missing or
            not a JSON object; the message names the catalog file and key.
    """
    p = Path(path)
    cat = _open_catalog(p)
    try:
        man = _catalog_json(cat, "manifest", p)
    finally:
        cat.close()
    if man is None:
        raise DatasetError(f"{p}: catalog has no manifest")
    if not isinstance(man, dict):
        raise DatasetError(f"{p / 'catalog.lmdb'}: key 'manifest' holds {type(man).__name__}, "
                           "expected a JSON object")
    return man


def is_dataset(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an ooc dataset directory with a readable catalog and manifest."""
    try:
        read_manifest(path)
        return True
    except DatasetError:
        return False


class Dataset:
    """Reader of an ooc dataset directory.

    Small arrays (indptr, labels, splits) are loaded on first access; large ones (features,
    indices) are exposed as :class:`~ooc.storage.rawarray.RawArray` for partial reads or mapping.

    Args:
        path: dataset directory.
        verify: ``checksums`` (chunks of every array from :meth:`raw` checked against the
            catalog on first use), ``structure`` or ``none``; default: the process's
            :func:`~ooc.storage.verify.read_verification` (``none`` unless a command set it).

    Raises:
        DatasetError: not an ooc dataset (a file, no catalog, a damaged catalog or manifest), a
            format version this code cannot read, or an in-place ``ooc partition`` was interrupted
            after it began deleting the old files (:func:`pending_rewrite`; the message names
            ``ooc partition PATH --resume``, which finishes it).
    """

    def __init__(self, path: str | os.PathLike, _manifest: dict | None = None,
                 verify: str | None = None) -> None:
        self.path = Path(path)
        #: ``checksums``: arrays from :meth:`raw` check each chunk on first use (see
        #: :mod:`ooc.storage.verify`); ``structure`` / ``none``: they do not
        self.verify = read_verification() if verify is None else verify
        self._from_catalog = _manifest is None
        if _manifest is None:
            if not self.path.exists():
                raise DatasetError(f"{self.path}: no such dataset directory")
            if not self.path.is_dir():
                raise DatasetError(f"{self.path}: is a file, not a dataset directory")
            journal = pending_rewrite(self.path)
            if journal is not None and journal.get("phase") != "prepare":
                raise DatasetError(pending_rewrite_error(self.path, journal))
            _manifest = read_manifest(self.path)
        self.manifest: dict = _manifest
        v = self.manifest.get("format_version")
        if v != FORMAT_VERSION:
            raise DatasetError(f"{self.path}: format version {v}, this ooc reads {FORMAT_VERSION}")
        if not isinstance(self.manifest.get("arrays"), dict) or "num_nodes" not in self.manifest:
            raise DatasetError(f"{self.path}: catalog manifest lacks 'arrays' or 'num_nodes' "
                               "(not written by ooc, or damaged)")
        self._cache: dict[str, Any] = {}
        self._checksums: dict[str, dict] | None = None

    # ------------------------------------------------------------ metadata
    @property
    def name(self) -> str:
        return str(self.manifest.get("name", self.path.name))

    @property
    def num_nodes(self) -> int:
        return int(self.manifest["num_nodes"])

    @property
    def num_edges(self) -> int:
        return int(self.manifest["arrays"][ARRAY_NAMES["indices"]]["shape"][0])

    @property
    def feat_dim(self) -> int:
        """Feature width D; 0 when the dataset has no ``nodes/features``."""
        if not self.has("features"):
            return 0
        shape = self.manifest["arrays"][ARRAY_NAMES["features"]]["shape"]
        return int(shape[1]) if len(shape) > 1 else 1

    @property
    def num_classes(self) -> int:
        return int(self.manifest.get("num_classes", 0))

    def has(self, name: str) -> bool:
        return ARRAY_NAMES.get(name, name) in self.manifest["arrays"]

    def raw(self, name: str) -> RawArray:
        """:class:`RawArray` of array ``name`` (a key of :data:`ARRAY_NAMES` or a Zarr path)."""
        rel = ARRAY_NAMES.get(name, name)
        key = "raw:" + rel
        if key not in self._cache:
            if rel not in self.manifest["arrays"]:
                raise DatasetError(f"{self.path}: dataset has no array {rel}")
            arr = self._open_array(rel)
            if self.verify == "checksums" and self._from_catalog:
                arr.verifier = verifier_for(self.path, rel, arr.path, arr.num_chunks, arr.chunk_key,
                                            self.checksums(rel))
            self._cache[key] = arr
        return self._cache[key]

    def _open_array(self, rel: str) -> RawArray:
        """A new :class:`RawArray` of ``rel`` (not cached, no checksum verifier).

        Raises:
            DatasetError: its ``zarr.json`` is not Zarr v3 metadata ooc reads (the file named).
            FileNotFoundError: its ``zarr.json`` is missing (named).
        """
        try:
            return RawArray(self.path / "arrays.zarr" / rel)
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetError(f"{self.path}: array {rel}: {e}") from None

    def checksums(self, rel: str) -> dict[str, str]:
        """``{chunk_key: blake2b hex}`` of array ``rel`` from the catalog (read once)."""
        if self._checksums is None:
            cat = _open_catalog(self.path)
            try:
                self._checksums = {k[len("checksums/"):]: _catalog_json(cat, k, self.path)
                                   for k in cat.keys("checksums/")}
            finally:
                cat.close()
        return self._checksums.get(rel, {})

    def load(self, name: str) -> np.ndarray:
        """Array ``name`` read fully into memory (cached)."""
        key = "load:" + ARRAY_NAMES.get(name, name)
        if key not in self._cache:
            self._cache[key] = self.raw(name).read_all()
        return self._cache[key]

    def release(self, name: str) -> None:
        """Drop array ``name`` from the :meth:`load` cache (read again if asked for): for a caller
        that holds its own copy, e.g. a training run's topology after its planner read ``indptr``."""
        self._cache.pop("load:" + ARRAY_NAMES.get(name, name), None)

    # ------------------------------------------------------------ arrays
    @property
    def indptr(self) -> np.ndarray:
        """int64 [N+1] CSC offsets (in memory)."""
        return self.load("indptr")

    @property
    def indices(self) -> np.ndarray:
        """int32|int64 [E] CSC source ids (in memory)."""
        return self.load("indices")

    @property
    def features(self) -> RawArray:
        """Node features on disk: [N, D] float32|float16."""
        return self.raw("features")

    @property
    def labels(self) -> np.ndarray:
        """int32 [N] labels, -1 = unlabelled."""
        return self.load("labels")

    def split(self, name: str) -> np.ndarray:
        """int64 sorted node ids of split ``train``, ``valid`` or ``test`` (empty if absent)."""
        if not self.has(name):
            return np.empty(0, dtype=np.int64)
        return self.load(name).astype(np.int64, copy=False)

    @property
    def partition_offsets(self) -> np.ndarray | None:
        """int64 [P+1] stored partition boundaries, or None."""
        return self.load("partition_offsets") if self.has("partition_offsets") else None

    def id_map(self) -> "IdMap":
        """The external-id map (:class:`~ooc.storage.idmap.IdMap`; close it after use).

        Raises:
            KeyError: the dataset was converted with dense ids (no map).
        """
        from ooc.storage.idmap import IdMap
        return IdMap(self.path, self.manifest)

    def degrees(self) -> np.ndarray:
        """int64 [N] in-degrees."""
        ip = self.indptr
        return np.diff(ip)

    # ------------------------------------------------------------ verification
    def check_structure(self) -> list[str]:
        """Structural invariants; returns a list of problems (empty when the dataset is sound).

        Checks: every array's ``zarr.json`` agrees with the manifest (shape, dtype, chunk rows) and
        its chunk files have their full size; indptr starts at 0, is non-decreasing and ends at E;
        indices in ``[0, N)``; features and labels have N rows; labels in ``[-1, C)`` (C =
        ``num_classes``); splits in range, sorted, unique and pairwise disjoint; partition offsets
        cover ``[0, N]`` with no empty partition; ``nodes/perm`` is a permutation.  The scans are
        Numba loops over blocks of at most 16 M entries (no node-sized temporaries except the
        permutation check's byte per node); each problem names the array and the first offending
        position or id.
        """
        from ooc.kernels.verify import first_common, first_decrease, first_not_increasing, first_outside
        problems: list[str] = []
        arrays = self.manifest["arrays"]
        n = self.num_nodes
        for req in ("indptr", "indices"):
            if ARRAY_NAMES[req] not in arrays:
                problems.append(f"missing array {ARRAY_NAMES[req]}")
        if problems:
            return problems
        problems += self.check_metadata()
        if problems:  # reads below would trust broken metadata
            return problems
        step = 1 << 24
        ipa = self.raw("indptr")
        e_total = self.num_edges
        if ipa.shape != (n + 1,):
            problems.append(f"topology/indptr has shape {ipa.shape}, expected ({n + 1},)")
        else:
            prev = None
            for s in range(0, n + 1, step):
                blk = ipa.read(s, min(s + step, n + 1))
                if s == 0 and blk[0] != 0:
                    problems.append(f"{_NOT_MONOTONE}: indptr[0] is {blk[0]}, expected 0")
                    break
                if prev is not None and blk[0] < prev:
                    problems.append(f"{_NOT_MONOTONE}: decreases at node {s - 1} ({prev} -> {blk[0]})")
                    break
                i = first_decrease(blk)
                if i >= 0:
                    problems.append(f"{_NOT_MONOTONE}: decreases at node {s + i} "
                                    f"({blk[i]} -> {blk[i + 1]})")
                    break
                prev = blk[-1]
            else:
                if prev != e_total:
                    problems.append(f"{_NOT_MONOTONE}: ends at {prev}, expected E = {e_total}")
        hit = _first_outside_blocks(self.raw("indices"), 0, n, step)
        if hit is not None:
            problems.append(f"topology/indices[{hit[0]}] holds node id {hit[1]} outside [0, {n})")
        for name in ("features", "labels", "node_type"):
            rel = ARRAY_NAMES[name]
            if rel in arrays and arrays[rel]["shape"][0] != n:
                problems.append(f"{rel} has {arrays[rel]['shape'][0]} rows, expected {n}")
        rel = ARRAY_NAMES["labels"]
        c = self.num_classes
        if rel in arrays and len(arrays[rel]["shape"]) == 1 and c > 0 and not problems:
            hit = _first_outside_blocks(self.raw("labels"), -1, c, step)
            if hit is not None:
                problems.append(f"nodes/labels[{hit[0]}] is {hit[1]}, outside [-1, {c}) "
                                f"(num_classes {c}; -1 = unlabelled)")
        rel = ARRAY_NAMES["edge_weight"]
        if rel in arrays and arrays[rel]["shape"][0] != self.num_edges:
            problems.append(f"{rel} has {arrays[rel]['shape'][0]} rows, expected E = {self.num_edges}")
        seen: dict[str, np.ndarray] = {}
        for s in SPLITS:
            if ARRAY_NAMES[s] in arrays:
                ids = self.raw(s).read_all().astype(np.int64)
                i = first_outside(ids, 0, n)
                if i >= 0:
                    problems.append(f"split {s} holds id {ids[i]} (position {i}) outside [0, {n})")
                    continue
                i = first_not_increasing(ids)
                if i >= 0:
                    problems.append(f"split {s} is not sorted and unique (position {i}: {ids[i]}, "
                                    f"then {ids[i + 1]})")
                    continue
                seen[s] = ids
        names = list(seen)
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                count, first = first_common(seen[names[i]], seen[names[j]])
                if count:
                    problems.append(f"splits {names[i]} and {names[j]} share {count} nodes "
                                    f"(first: {first})")
        problems += self._check_id_map()
        if ARRAY_NAMES["partition_offsets"] in arrays:
            off = self.raw("partition_offsets").read_all()
            if off.size < 2 or off[0] != 0 or off[-1] != n or np.any(np.diff(off) <= 0):
                problems.append("partitions/offsets must rise strictly from 0 to N (no empty partition)")
        if "nodes/perm" in arrays:  # written by `ooc partition`: perm[new id] = original id
            perm = self.raw("nodes/perm").read_all()
            ok = perm.shape == (n,) and (n == 0 or first_outside(perm, 0, n) < 0)
            if ok:  # n ids in [0, N) that hit every id once: a permutation (1 byte per node to check)
                hit = np.zeros(n, dtype=np.bool_)
                hit[perm] = True
                ok = bool(hit.all())
            if not ok:
                problems.append("nodes/perm is not a permutation of [0, N)")
        return problems

    def check_metadata(self, chunk_files: bool = True) -> list[str]:
        """Each manifest array's ``zarr.json`` is readable Zarr v3 metadata that agrees with the
        manifest (shape, dtype, chunk rows) and, with ``chunk_files``, its chunk files are full size.

        Returns:
            The problems found (empty when sound), each naming the array and the file.
        """
        problems: list[str] = []
        for rel, rec in sorted(self.manifest["arrays"].items()):
            try:
                arr = self.raw(rel)
            except (DatasetError, FileNotFoundError) as e:
                problems.append(str(e))
                continue
            meta = self.path / "arrays.zarr" / rel / "zarr.json"
            try:
                want_shape = tuple(int(x) for x in rec["shape"])
                want = (want_shape, np.dtype(rec["dtype"]), int(rec["chunk_rows"]))
            except (KeyError, TypeError, ValueError) as e:
                problems.append(f"manifest record of {rel} is malformed ({e})")
                continue
            got = (arr.shape, arr.dtype, arr.chunk_rows)
            for what, w, g in zip(("shape", "dtype", "chunk rows"), want, got):
                if w != g:
                    problems.append(f"{meta}: {what} {g} disagrees with the manifest ({w})")
            if got != want or not chunk_files:
                continue
            for i in range(arr.num_chunks):
                f = arr.chunk_path(i)
                try:
                    size = f.stat().st_size
                except FileNotFoundError:
                    problems.append(f"{rel}: chunk {arr.chunk_key(i)} ({f}) is missing")
                    break
                if size != arr.chunk_bytes:
                    problems.append(f"{rel}: chunk {arr.chunk_key(i)} ({f}) holds {size} bytes, "
                                    f"expected {arr.chunk_bytes}")
                    break
        return problems

    def _check_id_map(self) -> list[str]:
        """The id map (if any) holds N entries in each direction; typed offsets tile [0, N)."""
        rec = self.manifest.get("id_map")
        if not rec:
            return []
        n = self.num_nodes
        if rec.get("kind") == "typed":
            types = self.manifest.get("node_types", [])
            off = 0
            for t in types:
                if t["offset"] != off:
                    return [f"node type {t['name']} starts at {t['offset']}, expected {off}"]
                off += t["count"]
            return [] if off == n else [f"node types cover {off} ids, expected N = {n}"]
        import lmdb
        from ooc.storage.idmap import FWD_DB, REV_DB
        try:
            env = open_env(self.path / "catalog.lmdb", True, lock=False, max_dbs=4)
        except (lmdb.Error, OSError) as e:
            return [f"id map unreadable: {e}"]
        try:
            counts = {}
            for name in (FWD_DB, REV_DB):
                try:
                    db = env.open_db(name, create=False)
                except lmdb.Error:
                    return [f"id map table {name.decode()} missing"]
                with env.begin(db=db) as txn:
                    counts[name.decode()] = txn.stat(db)["entries"]
        finally:
            env.close()
        return [f"id map {k} holds {v} entries, expected N = {n}" for k, v in counts.items() if v != n]

    def verify_checksums(self) -> list[str]:
        """Re-hash every chunk file against the catalog; returns problems naming array and chunk
        (an array whose ``zarr.json`` is unreadable is one problem, worded as
        :meth:`check_metadata` words it, and its chunks are not hashed)."""
        problems: list[str] = []
        cat = Catalog(self.path / "catalog.lmdb")
        try:
            for rel in self.manifest["arrays"]:
                expected = cat.get_json(f"checksums/{rel}", {})
                try:
                    arr = self._open_array(rel)
                except (DatasetError, FileNotFoundError) as e:
                    problems.append(str(e))
                    continue
                for key, digest in sorted(expected.items()):
                    f = arr.path / key
                    try:
                        data = f.read_bytes()
                    except FileNotFoundError:
                        problems.append(f"{rel}: chunk {key} is missing")
                        continue
                    if hashlib.blake2b(data, digest_size=16).hexdigest() != digest:
                        problems.append(f"{rel}: chunk {key} fails its checksum")
                arr.close()
        finally:
            cat.close()
        return problems

    def disk_usage(self) -> dict[str, int]:
        """Bytes on disk per array and for the catalog."""
        out: dict[str, int] = {}
        for rel in self.manifest["arrays"]:
            root = self.path / "arrays.zarr" / rel
            out[rel] = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        out["catalog.lmdb"] = sum(f.stat().st_size for f in (self.path / "catalog.lmdb").glob("*"))
        return out

    def close(self) -> None:
        for v in self._cache.values():
            if isinstance(v, RawArray):
                v.close()
        self._cache.clear()
