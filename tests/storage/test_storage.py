"""On-disk format: exact CSC contents, raw chunk access, atomic writes, checksums."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from conftest import small_dataset
from ooc.kernels.graph import build_csc, build_csr
from ooc.kernels.sampling import sample_blocks
from ooc.storage.dataset import Dataset, DatasetError, DatasetWriter
from ooc.storage.io import DiskRows
from ooc.storage.rawarray import RawArray, RawArrayWriter, choose_chunk_rows, write_array


def test_undirected_pair_with_declared_nodes(tmp_path: Path) -> None:
    # edges 0-1, 1-2 undirected, 5 nodes declared, 5 feature rows
    ds_path = small_dataset(tmp_path / "d", 5, [0, 1, 1, 2], [1, 0, 2, 1])
    ds = Dataset(ds_path)
    assert ds.num_nodes == 5
    assert ds.indptr.tolist() == [0, 1, 3, 4, 4, 4]
    assert ds.indices.tolist() == [1, 0, 2, 1]
    sg = sample_blocks(ds.indptr, ds.indices, np.array([3, 4]), [2, 2], key=7)
    assert sg.seeds.tolist() == [3, 4]
    assert sg.num_sampled_edges == 0
    assert sg.input_nodes.tolist() == [3, 4]
    rows, _ = DiskRows(ds.features).gather(sg.input_nodes)
    assert rows[:, 0].tolist() == [3.0, 4.0]


def test_directed_csr_and_csc() -> None:
    src, dst = np.array([0, 0, 0]), np.array([0, 1, 2])
    assert build_csr(src, dst, 3)[0].tolist() == [0, 3, 3, 3]
    assert build_csc(src, dst, 3)[0].tolist() == [0, 1, 2, 3]


def test_csc_rejects_out_of_range_ids() -> None:
    with pytest.raises(ValueError, match="node id 5 outside"):
        build_csc(np.array([0, 5]), np.array([1, 1]), 5)


def test_rawarray_matches_zarr(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(1000, 7)).astype(np.float16)
    write_array(tmp_path / "a", data, chunk_rows=128)
    z = zarr.open_array(tmp_path / "a", mode="r")
    assert np.array_equal(z[:], data)
    ra = RawArray(tmp_path / "a")
    assert np.array_equal(ra.read(5, 900), data[5:900])
    ids = rng.integers(0, 1000, 300)
    rows, nbytes = ra.gather(ids)
    assert np.array_equal(rows, data[ids])
    assert nbytes == np.unique(ids).shape[0] * 14
    # the stitched map over several chunk files needs page-aligned chunks
    data2 = np.arange(3 * 4096 + 17, dtype=np.int32)
    write_array(tmp_path / "b", data2, chunk_rows=4096)
    assert np.array_equal(RawArray(tmp_path / "b").mmap(), data2)


def test_chunk_rows_are_page_aligned() -> None:
    for row_bytes in (2, 6, 5732, 2866, 256):
        r = choose_chunk_rows(10**9, row_bytes)
        assert (r * row_bytes) % 4096 == 0


def test_streaming_writer_pads_last_chunk(tmp_path: Path) -> None:
    w = RawArrayWriter(tmp_path / "s", np.int64, chunk_rows=4)
    for part in (np.arange(3), np.arange(3, 10)):
        w.append(part)
    rec = w.close()
    assert rec["shape"] == [10]
    assert sorted(rec["checksums"]) == ["c/0", "c/1", "c/2"]
    assert os.path.getsize(tmp_path / "s" / "c" / "2") == 32
    assert zarr.open_array(tmp_path / "s", mode="r")[:].tolist() == list(range(10))


def test_writer_is_atomic_on_error(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError):
        with DatasetWriter(out) as w:
            w.write_array("indptr", np.array([0, 0], dtype=np.int64))
            raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_invalid_dataset(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    with pytest.raises(DatasetError, match="outside"):
        with DatasetWriter(out) as w:
            w.write_array("indptr", np.array([0, 1, 2], dtype=np.int64))
            w.write_array("indices", np.array([0, 7], dtype=np.int32))
            w.commit(num_nodes=2)
    assert not out.exists()


@pytest.mark.parametrize("bad,match", [
    ("indptr", "not a monotone offset array"), ("perm_dup", "nodes/perm is not a permutation"),
    ("perm_range", "nodes/perm is not a permutation")])
def test_writer_refuses_bad_indptr_or_perm(tmp_path: Path, bad: str, match: str) -> None:
    """The checks run in slices of 2^20 nodes: a decrease of indptr right after a slice boundary,
    a repeated id and an out-of-range id in ``nodes/perm`` are all caught, at 2^20 + 5 nodes."""
    n = (1 << 20) + 5
    indptr = np.arange(n + 1, dtype=np.int64)
    indices = np.zeros(n, dtype=np.int32)
    perm = np.arange(n, dtype=np.int64)[::-1].copy()
    if bad == "indptr":
        indptr[(1 << 20) + 1] = indptr[1 << 20] - 1  # drops across the first slice boundary
    elif bad == "perm_dup":
        perm[-1] = perm[0]
    else:
        perm[3] = n
    with pytest.raises(DatasetError, match=match):
        with DatasetWriter(tmp_path / "ds") as w:
            w.write_array("indptr", indptr)
            w.write_array("indices", indices)
            w.write_array("nodes/perm", perm)
            w.commit(num_nodes=n)
    assert not (tmp_path / "ds").exists()


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    small_dataset(tmp_path / "d", 3, [0], [1])
    with pytest.raises(FileExistsError, match="--overwrite"):
        small_dataset(tmp_path / "d", 3, [0], [1])
    small_dataset(tmp_path / "d", 4, [0], [1], overwrite=True)
    assert Dataset(tmp_path / "d").num_nodes == 4


def test_verify_reports_flipped_byte(tmp_path: Path) -> None:
    ds_path = small_dataset(tmp_path / "d", 6, [0, 1, 2], [1, 2, 3])
    assert Dataset(ds_path).verify_checksums() == []
    chunk = ds_path / "arrays.zarr" / "nodes" / "features" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[5] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    problems = Dataset(ds_path).verify_checksums()
    assert problems == ["nodes/features: chunk c/0/0 fails its checksum"]


def test_open_non_dataset_is_clear(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such dataset"):
        Dataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="catalog"):
        Dataset(tmp_path / "empty")


def test_manifest_records_counts_and_format(tmp_path: Path) -> None:
    ds = Dataset(small_dataset(tmp_path / "d", 4, [0, 1], [1, 2]))
    m = ds.manifest
    assert m["format_version"] == 1
    assert m["num_nodes"] == 4
    assert m["arrays"]["topology/indices"] == {"shape": [2], "dtype": "int32", "chunk_rows": 2}
    meta = json.loads((ds.path / "arrays.zarr" / "topology" / "indptr" / "zarr.json").read_text())
    assert meta["zarr_format"] == 3


def test_check_metadata_names_the_file(tmp_path: Path) -> None:
    """Array metadata checks: unreadable or disagreeing ``zarr.json`` always, short chunk files
    only with ``chunk_files`` (``ooc info`` reads metadata only)."""
    ds_path = small_dataset(tmp_path / "d", 8, [0, 1, 2], [1, 2, 3])
    assert Dataset(ds_path).check_metadata() == []
    chunk = ds_path / "arrays.zarr/nodes/features/c/0/0"
    chunk.write_bytes(chunk.read_bytes()[:-4])
    assert Dataset(ds_path).check_metadata(chunk_files=False) == []
    assert "holds" in Dataset(ds_path).check_metadata()[0]
    meta = ds_path / "arrays.zarr/nodes/labels/zarr.json"
    meta.write_text(meta.read_text()[:40])
    problems = Dataset(ds_path).check_metadata(chunk_files=False)
    assert len(problems) == 1 and f"{meta}: not valid JSON" in problems[0]
    meta.write_text("[1, 2]")  # valid JSON, not an object
    problems = Dataset(ds_path).check_metadata(chunk_files=False)
    assert len(problems) == 1 and f"{meta}: not Zarr v3 array metadata (a JSON list" in problems[0]
