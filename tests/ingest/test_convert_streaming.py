"""Streaming conversion: exact small cases, id maps, options, CSC build."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import start_paused

import ooc.kernels.graph as kg
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main
from ooc.ingest.convert import GraphOptions, NodeInputs, convert_edgelist, convert_numpy
from ooc.ingest.streaming import (ArrayEdgeSource, ArraySink, UniqueIdCollector, build_csc_streaming,
                                 coo_to_csr)

SNAP = "# Directed graph\n# Nodes: 4 Edges: 3\n# FromNodeId\tToNodeId\n0\t1\n\n1 2  \n  2\t3\n\n"


def edges_of(ds: Dataset) -> list[tuple[int, int]]:
    """(src, dst) pairs of a dataset, sorted."""
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    return sorted(zip(ds.indices.tolist(), dst.tolist()))


# ---------------------------------------------------------------- exact cases from the issue
@pytest.mark.parametrize("budget", [2 << 30, 300])
def test_unsorted_coo_to_csr(budget: int) -> None:
    indptr, indices = coo_to_csr(np.array([0, 1, 2, 0]), np.array([2, 2, 1, 3]), 3,
                                 memory_budget=budget)
    assert indptr.tolist() == [0, 2, 3, 4]
    assert indices[indptr[0]:indptr[1]].tolist() == [2, 3]
    assert indices.tolist() == [2, 3, 2, 1]


@pytest.mark.parametrize("chunk", [1, 4, 10, 11])
@pytest.mark.parametrize("tight", [False, True])
def test_ring_any_chunk_size(tmp_path: Path, chunk: int, tight: bool) -> None:
    # tight: degree arrays (20 B/node) + chunk buffers (40 B/edge) + room for 5 edges (12 B each)
    budget = 20 * 10 + 40 * min(chunk, 10) + 5 * 12 if tight else "2GB"
    src = np.arange(10)
    dst = (src + 1) % 10
    np.save(tmp_path / "ring.npy", np.stack([src, dst]))
    p = convert_numpy(tmp_path / "ring.npy", tmp_path / "ds",
                      GraphOptions(chunk_edges=chunk, memory_budget=budget))
    ds = Dataset(p)
    assert ds.num_edges == 10
    assert edges_of(ds) == sorted(zip(src.tolist(), dst.tolist()))
    out_deg = np.bincount(ds.indices, minlength=10)
    assert out_deg.tolist() == [1] * 10
    assert ds.manifest["build"]["buckets"] == (2 if tight else 1)
    # the same ring as text, read in blocks of a few bytes
    (tmp_path / "ring.txt").write_text("".join(f"{s} {d}\n" for s, d in zip(src, dst)))
    p2 = convert_edgelist(tmp_path / "ring.txt", tmp_path / "ds2",
                          GraphOptions(chunk_edges=chunk, chunk_bytes=chunk * 4, memory_budget=budget))
    assert edges_of(Dataset(p2)) == edges_of(ds)


@pytest.mark.parametrize("layout", ["2xE", "Ex2"])
def test_edge_array_parts(tmp_path: Path, layout: str) -> None:
    from ooc.ingest.readers import NumpyEdges
    pairs = np.array([(0, 1), (1, 0), (0, 1), (1, 2), (2, 0)], dtype=np.int64)
    arr = np.lib.format.open_memmap(tmp_path / "e.npy", mode="w+", dtype=np.int64,
                                    shape=(2, 5) if layout == "2xE" else (5, 2))
    for a, b in ((0, 2), (2, 5)):  # written in parts of 2 and 3 edges
        if layout == "2xE":
            arr[:, a:b] = pairs[a:b].T
        else:
            arr[a:b] = pairs[a:b]
    arr.flush()
    del arr
    e = NumpyEdges(tmp_path / "e.npy")
    assert e.layout == layout
    s0, d0 = e.read(0, 2)
    s1, d1 = e.read(2, 5)
    assert list(zip(s0.tolist(), d0.tolist())) == [(0, 1), (1, 0)]
    assert list(zip(s1.tolist(), d1.tolist())) == [(0, 1), (1, 2), (2, 0)]
    parts = [list(zip(s.tolist(), d.tolist())) for _, s, d in e.chunks(2)]
    assert parts == [[(0, 1), (1, 0)], [(0, 1), (1, 2)], [(2, 0)]]
    ds = Dataset(convert_numpy(tmp_path / "e.npy", tmp_path / "ds", GraphOptions(chunk_edges=2)))
    assert edges_of(ds) == sorted(map(tuple, pairs.tolist()))  # the duplicate (0,1) is kept


def test_snap_text(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "g.txt").write_text(SNAP)
    ds = Dataset(convert_edgelist(tmp_path / "g.txt", tmp_path / "ds"))
    assert edges_of(ds) == [(0, 1), (1, 2), (2, 3)]
    assert ds.num_nodes == 4
    # 1-based: rejected (it has id 0), naming file and line
    rc = main(["convert", "edgelist", str(tmp_path / "g.txt"), "--out", str(tmp_path / "one"),
               "--one-based"])
    assert rc != 0
    assert f"{tmp_path / 'g.txt'}:4: source id 0 with --one-based" in capsys.readouterr().err
    assert not (tmp_path / "one").exists()
    # every id + 1 with the option: the identical graph
    (tmp_path / "g1.txt").write_text(SNAP.replace("0\t1", "1\t2").replace("1 2  ", "2 3  ")
                                     .replace("2\t3\n\n", "3\t4\n\n"))
    ds1 = Dataset(convert_edgelist(tmp_path / "g1.txt", tmp_path / "ds1",
                                   GraphOptions(one_based=True)))
    assert edges_of(ds1) == edges_of(ds)
    assert ds1.indptr.tolist() == ds.indptr.tolist()
    # a malformed line reports its line number
    (tmp_path / "bad.txt").write_text(SNAP.replace("1 2  ", "1 x2"))
    rc = main(["convert", "edgelist", str(tmp_path / "bad.txt"), "--out", str(tmp_path / "b")])
    assert rc != 0
    assert f"{tmp_path / 'bad.txt'}:6: field 2 is not an integer id" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_matrix_market(tmp_path: Path) -> None:
    (tmp_path / "g.mtx").write_text("%%MatrixMarket matrix coordinate pattern general\n% comment\n"
                                    "5 5 3\n1 2\n2 3\n3 4\n")
    ds = Dataset(convert_edgelist(tmp_path / "g.mtx", tmp_path / "ds"))
    assert ds.num_nodes == 5  # declared by the size line, node 5 isolated
    assert edges_of(ds) == [(0, 1), (1, 2), (2, 3)]
    assert ds.manifest["source_format"] == "matrix-market"


def test_undirected_carries_weights_labels_by_role(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1, 2], [1, 2, 0]]))
    np.save(tmp_path / "w.npy", np.array([0.5, 0.6, 0.7], dtype=np.float32))
    np.save(tmp_path / "y.npy", np.array([0, 1, 2]))
    ds = Dataset(convert_numpy(tmp_path / "e.npy", tmp_path / "ds", GraphOptions(undirected=True),
                               NodeInputs(labels=tmp_path / "y.npy"),
                               edge_weights=tmp_path / "w.npy"))
    assert ds.num_edges == 6
    w = ds.load("edge_weight")
    dst = np.repeat(np.arange(3), np.diff(ds.indptr))
    got = {(int(s), int(d)): round(float(x), 4) for s, d, x in zip(ds.indices, dst, w)}
    assert got == {(0, 1): 0.5, (1, 0): 0.5, (1, 2): 0.6, (2, 1): 0.6, (2, 0): 0.7, (0, 2): 0.7}
    assert ds.labels.tolist() == [0, 1, 2]
    assert ds.check_structure() == []


def test_int64_offsets_with_lowered_int32_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kg, "INT32_LIMIT", 7)
    src = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    dst = np.array([9, 9, 9, 0, 0, 1, 2, 3, 8, 8])
    for budget in (2 << 30, 500):
        sink = ArraySink()
        indptr, stats = build_csc_streaming(ArrayEdgeSource(src, dst, chunk_edges=3), 10, sink, None,
                                            tmp_path, memory_budget=budget)
        assert indptr.dtype == np.int64
        assert int(indptr[-1]) == 10
        assert (indptr >= 0).all() and (np.diff(indptr) >= 0).all()
        assert stats["index_dtype"] == "int64"  # N - 1 = 9 > the (lowered) int32 limit
        idx = sink.array(np.int64)
        assert idx.dtype == np.int64
        assert idx[indptr[9]:indptr[10]].tolist() == [0, 1, 2]
    monkeypatch.setattr(kg, "INT32_LIMIT", 2**31 - 1)
    assert kg.index_dtype_for(10) == np.int32


def test_budget_below_the_degree_arrays_refused_before_reading_an_edge(tmp_path: Path) -> None:
    class Unread(ArrayEdgeSource):
        def chunks(self):  # type: ignore[override]
            raise AssertionError("the edges were read before the budget was checked")

    src = Unread(np.arange(10), np.arange(10)[::-1].copy())
    with pytest.raises(ValueError, match=r"too small for 10 nodes: the degree arrays alone need 200"):
        build_csc_streaming(src, 10, ArraySink(), None, tmp_path, memory_budget=199)


def test_sort_edges_without_linear_keys() -> None:
    s, d = kg.sort_edges(np.array([3_500_000_000, 1, 0], dtype=np.int64),
                         np.array([1, 3_500_000_000, 2], dtype=np.int64))
    assert list(zip(s.tolist(), d.tolist())) == [(0, 2), (1, 3_500_000_000), (3_500_000_000, 1)]
    s, d = kg.sort_edges(np.array([49_999, 0, 1], dtype=np.int32), np.array([0, 49_999, 1], dtype=np.int32))
    assert s.dtype == np.int32
    assert list(zip(s.tolist(), d.tolist())) == [(0, 49_999), (1, 1), (49_999, 0)]


def test_huge_ids_through_the_streaming_build(tmp_path: Path) -> None:
    # ids near 3.5e9 as dense ids: N > 2^31 would need 28 GB of offsets, so use the id map
    e = np.array([[3_500_000_000, 1], [1, 3_500_000_000], [0, 2]], dtype=np.int64)
    np.save(tmp_path / "e.npy", e)
    ds = Dataset(convert_numpy(tmp_path / "e.npy", tmp_path / "ds", GraphOptions(ids="map")))
    assert ds.num_nodes == 4  # 0, 1, 2, 3.5e9 -> 0, 1, 2, 3
    assert edges_of(ds) == [(0, 2), (1, 3), (3, 1)]
    with ds.id_map() as m:
        assert m.to_external([0, 1, 2, 3]) == [0, 1, 2, 3_500_000_000]
        assert m.to_internal([3_500_000_000, 2]).tolist() == [3, 2]


# ---------------------------------------------------------------- id maps
def test_id_collector_matches_np_unique(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(-(2**62), 2**62, 50_000)
    ids[::7] = ids[3]
    c = UniqueIdCollector(tmp_path, buffer_bytes=8 * 5000)
    for part in np.array_split(ids, 13):
        c.add(part)
    got, _ = c.finish()
    assert np.array_equal(np.asarray(got), np.unique(ids))


def test_sparse_and_string_ids_consistent_across_files(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_text("src,dst\n900000000000,17\n17,5\n5,900000000000\n")
    (tmp_path / "y.csv").write_text("node,label\n5,1\n17,0\n900000000000,2\n123,1\n")
    (tmp_path / "train.txt").write_text("17\n123\n")
    ds = Dataset(convert_edgelist(tmp_path / "e.csv", tmp_path / "ds", GraphOptions(ids="map"),
                                  NodeInputs(labels=tmp_path / "y.csv",
                                             splits={"train": tmp_path / "train.txt"}),
                                  src_col="src", dst_col="dst"))
    # ids 5 < 17 < 123 < 9e11 -> 0, 1, 2, 3 (order-preserving; 123 only in the label file)
    assert ds.num_nodes == 4
    assert edges_of(ds) == [(0, 3), (1, 0), (3, 1)]
    assert ds.labels.tolist() == [1, 0, 1, 2]
    assert ds.split("train").tolist() == [1, 2]
    assert ds.check_structure() == []
    with ds.id_map() as m:
        assert m.to_external([0, 1, 2, 3]) == [5, 17, 123, 900000000000]
    # string ids
    (tmp_path / "s.tsv").write_text("alice\tbob\nbob\tcarol\n")
    (tmp_path / "ys.tsv").write_text("carol\t1\nalice\t0\n")
    ds = Dataset(convert_edgelist(tmp_path / "s.tsv", tmp_path / "dss", GraphOptions(ids="string"),
                                  NodeInputs(labels=tmp_path / "ys.tsv")))
    assert edges_of(ds) == [(0, 1), (1, 2)]
    assert ds.labels.tolist() == [0, -1, 1]
    with ds.id_map() as m:
        assert m.to_external([2, 0]) == ["carol", "alice"]
        assert m.to_internal(["bob"]).tolist() == [1]
    # a split id that is not a node
    (tmp_path / "bad.txt").write_text("17\n99\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: id 99 is not a node"):
        convert_edgelist(tmp_path / "e.csv", tmp_path / "ds3", GraphOptions(ids="map"),
                         NodeInputs(splits={"test": tmp_path / "bad.txt"}))
    assert not (tmp_path / "ds3").exists()


def test_typed_nodes(tmp_path: Path) -> None:
    (tmp_path / "ui.txt").write_text("0 0\n1 1\n")
    rc = main(["convert", "edgelist", str(tmp_path / "ui.txt"), "--out", str(tmp_path / "ds"),
               "--ids", "typed", "--node-types", "user:3,item:4", "--src-type", "user",
               "--dst-type", "item"])
    assert rc == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.num_nodes == 7
    assert [(t["name"], t["offset"], t["offset"] + t["count"]) for t in ds.manifest["node_types"]] == \
        [("user", 0, 3), ("item", 3, 7)]
    assert edges_of(ds) == [(0, 3), (1, 4)]
    assert ds.load("node_type").tolist() == [0, 0, 0, 1, 1, 1, 1]
    with ds.id_map() as m:
        assert m.to_external([0, 3, 1, 4]) == [("user", 0), ("item", 0), ("user", 1), ("item", 1)]
        assert m.to_internal([("item", 3)]).tolist() == [6]


# ---------------------------------------------------------------- options
def test_self_loops_and_dedup(tmp_path: Path) -> None:
    (tmp_path / "g.txt").write_text("0 0\n0 1\n0 1\n1 2\n2 2\n")
    keep = Dataset(convert_edgelist(tmp_path / "g.txt", tmp_path / "a"))
    assert edges_of(keep) == [(0, 0), (0, 1), (0, 1), (1, 2), (2, 2)]
    rm = Dataset(convert_edgelist(tmp_path / "g.txt", tmp_path / "b",
                                  GraphOptions(self_loops="remove", dedup=True)))
    assert edges_of(rm) == [(0, 1), (1, 2)]
    und = Dataset(convert_edgelist(tmp_path / "g.txt", tmp_path / "c",
                                   GraphOptions(undirected=True, self_loops="remove", num_nodes=5)))
    assert und.num_nodes == 5
    assert edges_of(und) == [(0, 1), (1, 0), (1, 2), (2, 1)]


def test_csv_with_header_columns_and_weights(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_text("ts,to,from,w\n7,1,0,0.25\n8,2,1,1e-1\n")
    ds = Dataset(convert_edgelist(tmp_path / "e.csv", tmp_path / "ds", src_col="from", dst_col="to",
                                  weight_col="w"))
    assert edges_of(ds) == [(0, 1), (1, 2)]
    assert ds.load("edge_weight").tolist() == pytest.approx([0.25, 0.1])


def test_features_and_partitions(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1], [1, 2], [2, 3]]))
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    np.save(tmp_path / "x.npy", x)
    rc = main(["convert", "numpy", str(tmp_path / "e.npy"), "--out", str(tmp_path / "ds"),
               "--features", str(tmp_path / "x.npy"), "--feat-dtype", "float16", "--partitions", "2"])
    assert rc == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.features.read_all().dtype == np.float16
    assert ds.features.read_all().tolist() == x.tolist()
    assert ds.partition_offsets.tolist() == [0, 2, 4]


def test_memory_budget_many_buckets_equals_in_memory(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    e = rng.integers(0, 500, (2, 20_000))
    np.save(tmp_path / "e.npy", e)
    big = Dataset(convert_numpy(tmp_path / "e.npy", tmp_path / "a", GraphOptions(dedup=True)))
    small = Dataset(convert_numpy(tmp_path / "e.npy", tmp_path / "b",
                                  GraphOptions(dedup=True, memory_budget=200_000, chunk_edges=3000)))
    assert small.manifest["build"]["buckets"] > 1
    assert big.manifest["build"]["buckets"] == 1
    assert np.array_equal(big.indptr, small.indptr)
    assert np.array_equal(big.indices, small.indices)
    ip, ix = kg.build_csc(e[0], e[1], 500, dedup=True)
    assert np.array_equal(ip, big.indptr) and np.array_equal(ix, big.indices)


def test_existing_output_needs_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "g.txt").write_text("0 1\n")
    args = ["convert", "edgelist", str(tmp_path / "g.txt"), "--out", str(tmp_path / "ds")]
    assert main(args) == 0
    assert main(args) != 0
    assert "--overwrite" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0


# ---------------------------------------------------------------- bad input
BAD_TEXT = {
    "non-integer": ("0 1\n1 2.5\n", ":2: field 2 is not an integer id"),
    "negative": ("0 1\n-1 2\n", ":2: field 1 is a negative id"),
    "columns": ("0 1\n1 2 3\n", ":2: expected 2 fields, found 3"),
    "too-few": ("0 1\n1\n", ":2: expected 2 fields, found 1"),
    "empty": ("", ": no data lines (empty file)"),
    "only-comments": ("# nothing\n\n", ": no data lines (empty file)"),
    "overflow": ("0 99999999999999999999\n", ":1: field 2 does not fit"),
}


@pytest.mark.parametrize("case", sorted(BAD_TEXT))
def test_bad_text_input(tmp_path: Path, capsys: pytest.CaptureFixture, case: str) -> None:
    text, expected = BAD_TEXT[case]
    f = tmp_path / "e.txt"
    f.write_text(text)
    rc = main(["convert", "edgelist", str(f), "--out", str(tmp_path / "out" / "ds")])
    assert rc != 0
    err = capsys.readouterr().err
    assert f"{f}{expected}" in err
    assert not (tmp_path / "out" / "ds").exists()
    # the folder made for --out is removed with the partial dataset
    assert not (tmp_path / "out").exists()


def test_id_beyond_declared_node_count(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 2\n2 5\n")
    rc = main(["convert", "edgelist", str(f), "--out", str(tmp_path / "ds"), "--num-nodes", "5"])
    assert rc != 0
    assert f"{f}:3: destination id 5 >= node count 5" in capsys.readouterr().err
    np.save(tmp_path / "e.npy", np.array([[0, 1], [7, 2], [1, 1]]))
    rc = main(["convert", "numpy", str(tmp_path / "e.npy"), "--out", str(tmp_path / "ds"),
               "--num-nodes", "5"])
    assert rc != 0
    assert f"{tmp_path / 'e.npy'}: edge 1: source id 7 >= node count 5" in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()


def test_feature_rows_and_nan(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1], [1, 2], [2, 2]]))
    np.save(tmp_path / "x.npy", np.zeros((2, 4), dtype=np.float32))
    base = ["convert", "numpy", str(tmp_path / "e.npy"), "--out", str(tmp_path / "ds")]
    assert main(base + ["--features", str(tmp_path / "x.npy")]) != 0
    assert "x.npy: 2 feature rows but the graph has 3 nodes" in capsys.readouterr().err
    x = np.ones((3, 4), dtype=np.float32)
    x[2, 1] = np.nan
    np.save(tmp_path / "xn.npy", x)
    assert main(base + ["--features", str(tmp_path / "xn.npy")]) != 0
    assert "xn.npy: row 2: non-finite feature value nan" in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()
    assert main(base + ["--features", str(tmp_path / "xn.npy"), "--nan-policy", "zero"]) == 0
    assert Dataset(tmp_path / "ds").features.read_all()[2].tolist() == [1, 0, 1, 1]


def test_bad_numpy_inputs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    np.save(tmp_path / "f.npy", np.zeros((3, 2), dtype=np.float32))
    np.save(tmp_path / "r.npy", np.zeros((3, 3), dtype=np.int64))
    np.save(tmp_path / "n.npy", np.array([[0, 1], [-4, 2], [1, 1]]))
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    for name, msg in (("f.npy", "expected integers"), ("r.npy", "expected (2, E) or (E, 2)"),
                      ("n.npy", "edge 1: negative source id -4"), ("junk.npy", "not a readable NumPy"),
                      ("missing.npy", "no such file")):
        rc = main(["convert", "numpy", str(tmp_path / name), "--out", str(tmp_path / "ds")])
        assert rc != 0
        err = capsys.readouterr().err
        assert str(tmp_path / name) in err and msg in err, err
        assert not (tmp_path / "ds").exists()


def test_sigkill_during_bucket_build_leaves_nothing(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.save(tmp_path / "e.npy", rng.integers(0, 100, (2, 5000)))
    out = tmp_path / "ds"
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE=f"csc-scatter:60:{marker}")
    cmd = ["convert", "numpy", str(tmp_path / "e.npy"), "--out", str(out), "--memory-budget", "80000"]
    proc = start_paused(cmd, env, marker)
    partial = list(tmp_path.glob(".ds.partial-*"))
    assert partial and any((partial[0] / "_work" / "buckets").iterdir())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    assert main(cmd) == 0
    assert Dataset(out).num_edges == 5000
    assert not any(tmp_path.glob(".ds.partial-*"))


def test_verify_names_array_and_chunk(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "g.txt").write_text("0 1\n1 2\n2 0\n")
    convert_edgelist(tmp_path / "g.txt", tmp_path / "ds")
    assert main(["verify", str(tmp_path / "ds")]) == 0
    chunk = tmp_path / "ds" / "arrays.zarr" / "topology" / "indices" / "c" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[1] ^= 0x01
    chunk.write_bytes(bytes(raw))
    assert main(["verify", str(tmp_path / "ds")]) == 1
    assert "topology/indices: chunk c/0 fails its checksum" in capsys.readouterr().err


_REMAP_CHILD = textwrap.dedent("""
    import sys, threading, time
    from pathlib import Path
    import numpy as np
    from ooc.ingest.readers import NumpyEdges
    from ooc.ingest.streaming import spool_with_id_map
    import ooc.kernels.graph  # compile/load kernels before the baseline
    def anon():
        # anonymous memory only: pages of memory-mapped scratch files are the files' storage (on a
        # tmpfs /tmp they would otherwise count as the process's own memory)
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    peak = [0]
    done = threading.Event()
    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], anon())
            time.sleep(0.002)
    work = Path(sys.argv[2])
    e = NumpyEdges(sys.argv[1])
    base = anon()
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    src, ids = spool_with_id_map(((s, d, None) for _, s, d in e.chunks(1 << 20)), work, 128 << 20)
    done.set()
    t.join()
    print(max(peak[0], anon()) - base, src.num_edges, ids.shape[0])
    s, d, _ = src.arrays()
    np.save(work / "mapped.npy", np.stack([s, d]))
    np.save(work / "ids.npy", np.asarray(ids))
""")


def test_remap_10m_random_64bit_ids_bounded_memory(tmp_path: Path) -> None:
    rng = np.random.default_rng(42)
    e = rng.integers(0, 2**40, (2, 10_000_000), dtype=np.int64)
    e[1, ::3] = e[0, ::3]  # repeated ids
    np.save(tmp_path / "e.npy", e)
    out = subprocess.run([sys.executable, "-c", _REMAP_CHILD, str(tmp_path / "e.npy"), str(tmp_path)],
                         capture_output=True, text=True, check=True)
    extra, num_edges, n = map(int, out.stdout.split())
    assert extra < 512 << 20, f"peak extra anonymous memory {extra / 2**20:.0f} MiB"
    assert num_edges == 10_000_000
    uniq, inverse = np.unique(e, return_inverse=True)
    assert n == uniq.shape[0]
    assert np.array_equal(np.load(tmp_path / "ids.npy"), uniq)
    assert np.array_equal(np.load(tmp_path / "mapped.npy"), inverse.reshape(2, -1))


def test_prefetched_order_and_errors() -> None:
    from ooc.ingest.streaming import prefetched
    assert list(prefetched(iter(range(10)), depth=2)) == list(range(10))

    def boom():
        yield 1
        raise ValueError("bad chunk")
    it = prefetched(boom())
    assert next(it) == 1
    with pytest.raises(ValueError, match="bad chunk"):
        next(it)
    # abandoning the consumer stops the producer
    gen = prefetched(iter(range(1000)), depth=1)
    assert next(gen) == 0
    gen.close()
