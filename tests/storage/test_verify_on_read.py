"""Data verified on read: a flipped bit anywhere is a clean error naming the array, chunk and file
(never a segfault, a traceback or silent training on corrupt data)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ooc.storage.dataset import Dataset, DatasetError, DatasetWriter
from ooc.storage.io import DiskRows, NeighborReader
from ooc.storage.verify import CorruptChunkError


def _copy(src: Path, tmp_path: Path) -> Path:
    ds = tmp_path / "ds"
    shutil.copytree(src, ds)
    return ds


def _flip(file: Path, offset: int, mask: int = 0x01) -> None:
    b = bytearray(file.read_bytes())
    b[offset] ^= mask
    file.write_bytes(bytes(b))


def _ooc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ooc.tools.cli", *args], capture_output=True,
                          text=True, timeout=600)


def _train(ds: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return _ooc("train", str(ds), "--model", "sage", "--fanout", "5,5", "--batch-size", "256",
                "--hidden", "8", "--epochs", "1", "--buffer-partitions", "2",
                "--output-dir", str(out), "--no-progress", *extra)


def _clean_error(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # not 139 (SIGSEGV), not 1
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr
    assert r.stderr.count("\n") == 1, r.stderr  # one line


@pytest.mark.parametrize("array, offset, mask, says", [
    ("topology/indices/c/0", 4 * 1000 + 3, 0x40, "topology/indices chunk c/0"),  # out of range
    ("topology/indices/c/0", 4 * 1000, 0x01, "topology/indices chunk c/0"),  # in range: checksum
    ("topology/indptr/c/0", 8 * 500 + 2, 0x10, "topology/indptr"),
    ("nodes/splits/train/c/0", 8 * 10 + 5, 0x04, "nodes/splits/train chunk c/0"),
    ("nodes/labels/c/0", 4 * 7, 0x01, "nodes/labels chunk c/0"),
    ("nodes/features/c/0/0", 4 * 16 * 100 + 1, 0x01, "nodes/features chunk c/0/0"),
])
def test_flipped_bit_is_a_clean_error(tmp_path: Path, planted_dataset: Path, array: str, offset: int,
                                      mask: int, says: str) -> None:
    ds = _copy(planted_dataset, tmp_path)
    _flip(ds / "arrays.zarr" / array, offset, mask)
    r = _train(ds, tmp_path / "run")
    _clean_error(r)
    assert says in r.stderr
    if "chunk" in says:
        assert str(ds / "arrays.zarr" / array) in r.stderr and "checksum" in r.stderr
    if "features" not in array:  # scanned when the run starts: refused before it began
        assert not (tmp_path / "run").exists()
    r = _ooc("verify", str(ds))
    assert r.returncode == 1 and "fails its checksum" in r.stderr


def test_structure_only_still_refuses_broken_structure(tmp_path: Path, planted_dataset: Path) -> None:
    ds = _copy(planted_dataset, tmp_path)
    _flip(ds / "arrays.zarr/topology/indices/c/0", 4 * 1000 + 3, 0x40)
    r = _train(ds, tmp_path / "run", "--verify", "structure")
    _clean_error(r)
    assert "outside [0, 3000)" in r.stderr


def test_corrupt_feature_chunk_met_during_reads(tmp_path: Path, planted_dataset: Path) -> None:
    """Features are not scanned at open: the chunk check on first read catches them."""
    ds = _copy(planted_dataset, tmp_path)
    _flip(ds / "arrays.zarr/nodes/features/c/0/0", 4 * 16 * 2000, 0x01)
    r = _train(ds, tmp_path / "run", "--mode", "buffer")
    _clean_error(r)
    assert "nodes/features chunk c/0/0" in r.stderr and "fails its blake2b checksum" in r.stderr


def test_eval_refuses_a_corrupt_dataset(tmp_path: Path, planted_dataset: Path) -> None:
    ds = _copy(planted_dataset, tmp_path)
    r = _train(ds, tmp_path / "run")
    assert r.returncode == 0, r.stderr
    _flip(ds / "arrays.zarr/topology/indices/c/0", 40, 0x01)
    r = _ooc("eval", str(tmp_path / "run"), "--no-progress")
    _clean_error(r)
    assert "topology/indices chunk c/0" in r.stderr


def test_metadata_disagreeing_with_the_manifest(tmp_path: Path, planted_dataset: Path) -> None:
    ds = _copy(planted_dataset, tmp_path)
    meta = ds / "arrays.zarr/nodes/labels/zarr.json"
    m = json.loads(meta.read_text())
    m["shape"] = [2999]
    meta.write_text(json.dumps(m))
    problems = Dataset(ds).check_structure()
    assert problems == [f"{meta}: shape (2999,) disagrees with the manifest ((3000,))"]
    meta.write_text("{not json")
    with pytest.raises(DatasetError, match=r"nodes/labels/zarr.json: not valid JSON"):
        Dataset(ds).raw("labels")
    r = _ooc("verify", str(ds))  # a problem found, listed once though both passes meet it
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("ooc verify: error: ") and f"{meta}: not valid JSON" in r.stderr
    assert Dataset(ds).verify_checksums() == Dataset(ds).check_metadata()  # worded alike


def test_damaged_catalog_is_a_clean_error(tmp_path: Path, planted_dataset: Path) -> None:
    ds = _copy(planted_dataset, tmp_path)
    data = ds / "catalog.lmdb/data.mdb"
    data.write_bytes(b"\0" * 4096 + data.read_bytes()[4096:])
    r = _ooc("info", str(ds))
    _clean_error(r)
    assert "catalog.lmdb" in r.stderr and "damaged" in r.stderr


@pytest.mark.parametrize("keep", ["100", "5000", "all but the last page"])
def test_truncated_catalog_is_a_clean_error_not_a_bus_error(tmp_path: Path, planted_dataset: Path,
                                                           keep: str) -> None:
    """A ``data.mdb`` cut short (inside a meta page, or at a page boundary before its last page)
    used to kill info / verify / train with SIGBUS (exit 135, no message): LMDB maps the file and
    reads the missing pages.  Each command now names the file and the sizes, exit 2."""
    ds = _copy(planted_dataset, tmp_path)
    data = ds / "catalog.lmdb/data.mdb"
    raw = data.read_bytes()
    data.write_bytes(raw[:int(keep)] if keep.isdigit() else raw[:len(raw) - 4096])
    for cmd in ("info", "verify"):
        r = _ooc(cmd, str(ds))
        assert r.returncode == 2, (cmd, r.returncode, r.stderr)
        assert f"{data}: truncated" in r.stderr and "Traceback" not in r.stderr, r.stderr
    with pytest.raises(DatasetError, match="truncated"):
        Dataset(ds)


def _chunked(tmp_path: Path) -> Path:
    """A dataset whose indices and features span several chunks of 4 KiB."""
    n = 4096
    rng = np.random.default_rng(0)
    src = rng.integers(0, n, 5 * n)
    dst = np.sort(rng.integers(0, n, 5 * n))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(indptr, dst + 1, 1)
    indptr = np.cumsum(indptr)
    with DatasetWriter(tmp_path / "chunked") as w:
        w.write_array("indptr", indptr)
        w.write_array("indices", src.astype(np.int32), chunk_rows=1024)
        w.write_array("features", np.arange(n * 4, dtype=np.float32).reshape(n, 4), chunk_rows=256)
        return w.commit(num_nodes=n)


def test_readers_check_each_chunk_once_on_first_use(tmp_path: Path) -> None:
    path = _chunked(tmp_path)
    ds = Dataset(path, verify="checksums")
    feats = ds.features
    rows = DiskRows(feats, threads=1)
    out, _ = rows.gather(np.array([5, 300, 301]))
    assert out[:, 0].tolist() == [20.0, 1200.0, 1204.0]
    v = feats.verifier
    assert v.done.nonzero()[0].tolist() == [0, 1] and v.bytes_hashed == 2 * 4096
    rows.gather(np.array([6, 302]))  # already verified: nothing hashed again
    assert v.bytes_hashed == 2 * 4096
    buf = np.empty(8192 + 4096, dtype=np.uint8)
    rows.read_range_async(512, 700, buf).wait()
    assert v.done.nonzero()[0].tolist() == [0, 1, 2] and v.bytes_hashed == 3 * 4096
    rows.close()
    ip = ds.indptr
    nodes = np.array([0, int(np.flatnonzero(np.diff(ip))[-1])])  # the first and last lists
    nb = NeighborReader(ds.raw("indices"), ip, buffer_ids=1024)
    nb.read(nodes)
    want = sorted({int(ip[v]) // 1024 for v in nodes} | {(int(ip[v + 1]) - 1) // 1024 for v in nodes})
    assert nb.indices.verifier.done.nonzero()[0].tolist() == want and want[-1] == 19
    nb.close()
    ds.close()


def test_readers_raise_on_a_corrupt_chunk(tmp_path: Path) -> None:
    path = _chunked(tmp_path)
    _flip(path / "arrays.zarr/nodes/features/c/3/0", 100)
    ds = Dataset(path, verify="checksums")
    rows = DiskRows(ds.features, threads=1)
    rows.gather(np.array([0, 10]))  # chunk 0: fine
    with pytest.raises(CorruptChunkError) as e:
        rows.gather(np.array([3 * 256 + 1]))
    assert e.value.array == "nodes/features" and e.value.chunk == "c/3/0"
    assert str(path / "arrays.zarr/nodes/features/c/3/0") in str(e.value)
    with pytest.raises(CorruptChunkError):
        ds.features.read(3 * 256, 3 * 256 + 2)
    with pytest.raises(CorruptChunkError):
        ds.features.mmap()
    rows.close()
    ds.close()
    unchecked = Dataset(path, verify="structure")  # the reader without checksums reads it
    assert unchecked.features.read(3 * 256, 3 * 256 + 1).shape == (1, 4)
    unchecked.close()


def test_broken_json_in_the_catalog_names_file_and_key(tmp_path: Path, planted_dataset: Path) -> None:
    from ooc.storage.catalog import Catalog
    ds = _copy(planted_dataset, tmp_path)
    cat = Catalog(ds / "catalog.lmdb", readonly=False)
    with cat.env.begin(write=True) as txn:
        txn.put(b"checksums/nodes/labels", b"{broken")
    cat.close()
    with pytest.raises(DatasetError, match=r"catalog.lmdb: key 'checksums/nodes/labels' is not valid "
                                           r"JSON"):
        Dataset(ds, verify="checksums").raw("labels")
    cat = Catalog(ds / "catalog.lmdb", readonly=False)
    with cat.env.begin(write=True) as txn:
        txn.put(b"manifest", b"[1, 2]")
    cat.close()
    r = _ooc("info", str(ds))
    _clean_error(r)
    assert "key 'manifest' holds list, expected a JSON object" in r.stderr
