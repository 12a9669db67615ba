"""Partitioning (random / METIS / streaming) and the partition-order rewrite: the issue's cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import small_dataset
from ooc.kernels.graph import build_csc
from ooc.partition import METHODS, partition_dataset, partition_nodes
from ooc.storage.dataset import Dataset
from ooc.storage.rawarray import write_array, RawArray
from ooc.tools.cli import main


def undirected(pairs: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    src = [a for a, b in pairs] + [b for a, b in pairs]
    dst = [b for a, b in pairs] + [a for a, b in pairs]
    return src, dst


SEVEN = undirected([(0, 1), (1, 2), (0, 2), (0, 3)])  # nodes 4-6 isolated


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_seven_nodes_every_method(tmp_path: Path, method: str, parts: int) -> None:
    ds_path = small_dataset(tmp_path / "d", 7, *SEVEN)
    out, res = partition_dataset(ds_path, parts, method, out=tmp_path / "p")
    # every node in exactly one partition, none empty
    assert res.assign.shape == (7,) and set(res.assign.tolist()) == set(range(parts))
    ds = Dataset(out)
    off = ds.partition_offsets
    assert off[0] == 0 and off[-1] == 7 and np.all(np.diff(off) > 0) and off.shape == (parts + 1,)
    perm = ds.load("nodes/perm")
    assert sorted(perm.tolist()) == list(range(7))
    # features follow the nodes (x[v] = original id v)
    assert ds.features.read_all()[:, 0].tolist() == perm.astype(float).tolist()
    # each directed edge owned by exactly one partition (its destination's CSC slice): 8 in total
    ip, ix = ds.indptr, ds.indices
    owned = []
    for p in range(parts):
        for v in range(off[p], off[p + 1]):
            owned += [(int(perm[u]), int(perm[v])) for u in ix[ip[v]:ip[v + 1]]]
    assert len(owned) == 8
    assert sorted(owned) == sorted(zip(*SEVEN))
    # edge buckets hold the same 8 edges, each in the bucket of (src partition, dst partition)
    boff = ds.load("partitions/buckets/offsets")
    bs, bd = ds.load("partitions/buckets/src"), ds.load("partitions/buckets/dst")
    assert boff.shape == (parts * parts + 1,) and boff[-1] == 8
    part = np.searchsorted(off, np.arange(7), side="right") - 1
    seen = []
    for j in range(parts):
        for i in range(parts):
            a, b = boff[j * parts + i], boff[j * parts + i + 1]
            assert np.all(part[bs[a:b]] == i) and np.all(part[bd[a:b]] == j)
            seen += [(int(perm[s]), int(perm[d])) for s, d in zip(bs[a:b], bd[a:b])]
    assert sorted(seen) == sorted(zip(*SEVEN))
    assert ds.check_structure() == []
    assert res.num_edges == 8 and 0 <= res.edge_cut <= 8


@pytest.mark.parametrize("method", METHODS)
def test_no_empty_partition_path_and_ring(tmp_path: Path, method: str) -> None:
    path = small_dataset(tmp_path / "path", 3, *undirected([(0, 1), (1, 2)]))
    _, res = partition_dataset(path, 2, method, out=tmp_path / "path2")
    assert sorted(np.bincount(res.assign).tolist()) == [1, 2]
    ring = small_dataset(tmp_path / "ring", 10, *undirected([(i, (i + 1) % 10) for i in range(10)]))
    out, res = partition_dataset(ring, 10, method, out=tmp_path / "ring10")
    assert np.bincount(res.assign, minlength=10).tolist() == [1] * 10
    assert Dataset(out).partition_offsets.tolist() == list(range(11))
    assert res.edge_cut == 20


@pytest.mark.parametrize("method", METHODS)
def test_too_many_parts_fails_before_writing(tmp_path: Path, method: str) -> None:
    path = small_dataset(tmp_path / "path", 3, *undirected([(0, 1), (1, 2)]))
    with pytest.raises(ValueError, match="empty"):
        partition_dataset(path, 4, method, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["path"]


def two_cliques() -> tuple[np.ndarray, np.ndarray]:
    pairs = [(a, b) for a in range(50) for b in range(a + 1, 50)]
    pairs += [(a, b) for a in range(50, 100) for b in range(a + 1, 100)]
    pairs += [(49, 50)]
    s, d = undirected(pairs)
    return np.array(s), np.array(d)


@pytest.mark.parametrize("method", METHODS)
def test_training_node_balance_two_cliques(method: str) -> None:
    s, d = two_cliques()
    ip, ix = build_csc(s, d, 100)
    res = partition_nodes(ip, ix, 100, 2, method, train_ids=np.arange(20), seed=0)
    t = res.train_per_part.tolist()
    assert all(8 <= x <= 12 for x in t), t
    assert sum(t) == 20
    assert res.sizes.sum() == 100 and res.sizes.min() > 0
    if method == "metis":  # balanced training nodes AND a locality-preserving cut
        assert res.edge_cut < 0.5 * res.num_edges


def test_without_train_balance_metis_cuts_the_bridge() -> None:
    s, d = two_cliques()
    ip, ix = build_csc(s, d, 100)
    res = partition_nodes(ip, ix, 100, 2, "metis", train_ids=np.arange(20), balance_train=False)
    assert res.edge_cut == 2  # the bridge 49-50, both directions
    assert sorted(res.train_per_part.tolist()) == [0, 20]


def test_stream_partitioner_reads_topology_from_disk(tmp_path: Path) -> None:
    """Fennel over indices read block by block gives the same result as over the in-memory array."""
    from ooc.kernels.generators import planted_partition
    g = planted_partition(2000, num_classes=4, avg_degree=8, p_intra=0.9, seed=2)
    ip, ix = build_csc(g.src, g.dst, 2000)
    write_array(tmp_path / "ix", ix, chunk_rows=1024)
    mem = partition_nodes(ip, ix, 2000, 4, "stream", g.train, block_edges=500)
    disk = partition_nodes(ip, RawArray(tmp_path / "ix"), 2000, 4, "stream", g.train, block_edges=500)
    assert np.array_equal(mem.assign, disk.assign)
    rnd = partition_nodes(ip, ix, 2000, 4, "random", g.train)
    assert mem.edge_cut < 0.8 * rnd.edge_cut  # locality: far fewer cut edges than random
    assert mem.sizes.max() <= 1.05 * 500 + 1


def test_partition_twice_keeps_original_ids(tmp_path: Path) -> None:
    from ooc.kernels.generators import planted_partition
    from ooc.ingest.convert import write_graph_dataset
    g = planted_partition(600, num_classes=3, avg_degree=6, feat_dim=4, seed=5)
    p = write_graph_dataset(tmp_path / "g", 600, g.src, g.dst, g.features, g.labels,
                            {"train": g.train, "valid": g.valid, "test": g.test}, 3, "g")
    out1, _ = partition_dataset(p, 4, "metis", out=tmp_path / "g1")
    out2, _ = partition_dataset(out1, 3, "stream", out=tmp_path / "g2", memory_budget="1MiB")
    ds = Dataset(out2)
    perm = ds.load("nodes/perm")
    assert np.array_equal(ds.features.read_all(), g.features[perm])
    assert np.array_equal(ds.labels, g.labels[perm])
    assert np.array_equal(np.sort(perm[ds.split("train")]), g.train)
    # the relabelled CSC is the same graph
    inv = np.argsort(perm)
    ip, ix = build_csc(inv[g.src], inv[g.dst], 600)
    assert np.array_equal(ds.indptr, ip) and np.array_equal(ds.indices, ix)
    assert ds.manifest["partitioning"]["method"] == "stream"
    assert ds.verify_checksums() == [] and ds.check_structure() == []


def test_cli_partition_in_place(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    p = small_dataset(tmp_path / "d", 7, *SEVEN)
    assert main(["partition", str(p), "--parts", "2", "--method", "stream"]) == 0
    out = capsys.readouterr().out
    assert "edge cut" in out and "train/part" in out
    assert Dataset(p).partition_offsets.shape == (3,)
    assert main(["partition", str(p), "--parts", "9", "--method", "random"]) == 2
    assert "empty" in capsys.readouterr().err


def test_out_naming_the_dataset_itself_is_in_place_and_out_inside_it_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--out`` spelled as the dataset itself (a trailing slash, ``..``, a symbolic link) is the
    in-place rewrite, as ``--out DS`` is; an ``--out`` inside the dataset (lost when the source is
    next rewritten) is refused before any work, naming both, and nothing is written."""
    p = small_dataset(tmp_path / "d", 7, *SEVEN)
    (tmp_path / "link").symlink_to(p)
    for out in (f"{p}/", str(tmp_path / "x" / ".." / "d"), str(tmp_path / "link")):
        (tmp_path / "x").mkdir(exist_ok=True)
        assert main(["partition", str(p), "--parts", "2", "--method", "stream", "--out", out]) == 0, \
            capsys.readouterr().err
        assert Dataset(p).partition_offsets.shape == (3,)
    capsys.readouterr()
    before = sorted(q.name for q in p.iterdir())
    assert main(["partition", str(p), "--parts", "2", "--method", "stream", "--out",
                 str(p / "sub")]) == 2
    err = capsys.readouterr().err
    assert f"--out {p / 'sub'} is inside the dataset {p}" in err
    assert sorted(q.name for q in p.iterdir()) == before


@pytest.mark.parametrize("dtype,shape", [(np.float16, (5,)), (np.int32, ())])
def test_permute_rows_spooled_equals_group_scans(tmp_path: Path, dtype: type, shape: tuple) -> None:
    """Rows permuted through per-group spool files (one scan) equal the group-by-group scans, for
    any group size; the spool files are gone afterwards."""
    from ooc.partition import _permute_rows

    class Collect:
        def __init__(self) -> None:
            self.parts: list[np.ndarray] = []

        def append(self, rows: np.ndarray) -> None:
            self.parts.append(rows.copy())

    rng = np.random.default_rng(0)
    n = 1003
    data = rng.normal(size=(n, *shape)).astype(dtype) if shape else rng.integers(0, 99, n, dtype=dtype)
    write_array(tmp_path / "a", data, chunk_rows=100)
    src = RawArray(tmp_path / "a")
    assign = rng.integers(0, 7, n)
    perm = np.argsort(assign, kind="stable").astype(np.int64)
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    row_bytes = src.row_bytes
    for group_rows in (1, 10, 333, 1003):
        spooled, scanned = Collect(), Collect()
        budget = 2 * row_bytes * group_rows
        assert _permute_rows(src, perm, inv, spooled, budget, spool_dir=tmp_path / "sp") == \
            (1 if -(-n // group_rows) > 2 else -(-n // group_rows))
        _permute_rows(src, perm, inv, scanned, budget)
        assert np.array_equal(np.concatenate(spooled.parts), data[perm])
        assert np.array_equal(np.concatenate(scanned.parts), data[perm])
        assert [p.shape[0] for p in spooled.parts] == [p.shape[0] for p in scanned.parts]
        assert not list((tmp_path / "sp").glob("*")) if (tmp_path / "sp").exists() else True


def test_budget_charges_node_arrays_and_refuses_before_writing(tmp_path: Path) -> None:
    """The rewrite's node-sized arrays (~36 B/node: 60,000 nodes -> ~2.2 MB) count against
    ``--memory-budget``: 1 MB is refused with the sizes named and nothing written; 16 MB works."""
    from ooc.ingest.convert import write_graph_dataset
    n = 60_000
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, n, 200_000), rng.integers(0, n, 200_000)
    p = write_graph_dataset(tmp_path / "g", n, src, dst, rng.standard_normal((n, 2)).astype(np.float32),
                            rng.integers(0, 3, n), {"train": np.arange(0, n, 10)}, 3, "g")
    with pytest.raises(ValueError, match=r"too small to rewrite 60,000 nodes.*use at least"):
        partition_dataset(p, 4, "stream", out=tmp_path / "small", memory_budget="1MB")
    assert not (tmp_path / "small").exists()
    out, _ = partition_dataset(p, 4, "stream", out=tmp_path / "ok", memory_budget="16MB")
    assert Dataset(out).check_structure() == []
    # edge buckets: the largest partition's need is known before writing; the advice is enough
    import re
    with pytest.raises(ValueError, match=r"edge buckets of the largest partition.*use at least") as e:
        partition_dataset(p, 2, "stream", out=tmp_path / "eb", memory_budget="3MiB")
    assert not (tmp_path / "eb").exists()
    advice = re.search(r"use at least ([0-9.]+) MiB", str(e.value)).group(1)
    out, _ = partition_dataset(p, 2, "stream", out=tmp_path / "eb", memory_budget=f"{advice}MiB")
    assert Dataset(out).check_structure() == []


@pytest.mark.parametrize("budget_mib,edge_buckets", [(24, False), (32, True)])
def test_rewrite_allocations_stay_within_budget(tmp_path: Path, budget_mib: int, edge_buckets: bool) -> None:
    """Every array ``ooc partition`` allocates (numpy reports them to tracemalloc) fits its
    ``--memory-budget`` at every moment: 300,000 nodes, 3 M edges, 16-d float32 features (the index
    arrays alone are ~11 MB, one output chunk 8 MiB), budget 24 MiB (32 MiB with edge buckets), peak
    at most the budget + 1 MiB of small objects.  Before the fix the topology group's buffers
    outlived their loop and the commit's checks ran beside the rewrite's index arrays: 53 MiB."""
    import tracemalloc
    from ooc.ingest.convert import write_graph_dataset
    n, m = 300_000, 3_000_000
    rng = np.random.default_rng(0)
    p = write_graph_dataset(tmp_path / "g", n, rng.integers(0, n, m), rng.integers(0, n, m),
                            rng.standard_normal((n, 16)).astype(np.float32), rng.integers(0, 3, n),
                            {"train": np.arange(0, n, 10)}, 3, "g")
    budget = budget_mib << 20
    tracemalloc.start()
    try:
        out, res = partition_dataset(p, 8, "stream", out=tmp_path / "p", memory_budget=budget,
                                     edge_buckets=edge_buckets)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= budget + (1 << 20), f"peak {peak / 2**20:.1f} MiB for a {budget_mib} MiB budget"
    ds = Dataset(out)
    assert ds.check_structure() == []
    assert np.array_equal(ds.load("nodes/perm"), np.argsort(res.assign, kind="stable"))
