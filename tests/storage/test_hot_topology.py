"""Neighbour lists over an on-disk topology: batched reads, hot lists held in memory, exactness."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ooc.kernels.disk_sampling import sample_blocks_lists
from ooc.kernels.graph import build_csc
from ooc.kernels.sampling import sample_blocks
from ooc.storage.io import HotLists, NeighborReader
from ooc.storage.rawarray import RawArray, write_array

#: 7 nodes, in-edges (CSC): 0 <- {1, 2, 3}, 1 <- {0}, 2 <- {0, 1}, 3 <- {}, 4 <- {0, 1, 2, 5},
#: 5 <- {4}, 6 <- {} (3 and 6 have no in-edges; 6 is isolated: in no list either)
LISTS = [[1, 2, 3], [0], [0, 1], [], [0, 1, 2, 5], [4], []]


def _small(tmp_path: Path, dtype=np.int32, chunk_rows: int | None = None) -> tuple:
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in LISTS])]).astype(np.int64)
    indices = np.array([u for x in LISTS for u in x], dtype=dtype)
    write_array(tmp_path / "ix", indices, chunk_rows=chunk_rows)
    return indptr, indices, RawArray(tmp_path / "ix")


def test_scores_count_draws_weighted_by_in_degree(tmp_path: Path) -> None:
    """Node u scores sum over the lists v holding u of min(1, fanout / deg(v))."""
    indptr, _, arr = _small(tmp_path)
    s = HotLists.scores(arr, indptr, fanout=2)
    want = np.zeros(7)
    for v, lst in enumerate(LISTS):
        for u in lst:
            want[u] += min(1.0, 2 / len(lst))
    assert np.allclose(s, want)
    assert np.allclose(HotLists.scores(arr, indptr, fanout=-1),
                       np.bincount([u for x in LISTS for u in x], minlength=7))
    # blocks of one list at a time give the same scores
    assert np.allclose(HotLists.scores(arr, indptr, fanout=2, block_edges=1), want)


def test_select_greedy_by_draws_per_byte_within_size(tmp_path: Path) -> None:
    indptr, _, arr = _small(tmp_path)
    score = HotLists.scores(arr, indptr, fanout=-1)  # [3, 3, 2, 1, 1, 1, 0]
    fixed = HotLists.fixed_bytes(7)
    assert fixed == 8 + 8 + 8  # one bitmap word, its rank, ptr[0]

    def chosen(nbytes: int) -> list[int]:
        bits = HotLists.select(indptr, score, nbytes, 4)
        return [v for v in range(7) if (int(bits[v // 64]) >> (v % 64)) & 1]

    # draws per byte (8 B of offset + 4 B per id): node 1: 3/12, node 0: 3/20, node 2: 2/16,
    # node 5: 1/12, node 4: 1/24; nodes 3 and 6 have no list
    assert chosen(0) == [] and chosen(fixed) == [] and chosen(fixed + 11) == []
    assert chosen(fixed + 12) == [1]
    assert chosen(fixed + 12 + 20) == [0, 1]
    assert chosen(fixed + 12 + 20 + 16) == [0, 1, 2]
    assert chosen(fixed + 12 + 20 + 16 + 11) == [0, 1, 2]
    assert chosen(fixed + 12 + 20 + 16 + 12) == [0, 1, 2, 5]
    everything = fixed + 8 * 5 + 4 * 11
    assert chosen(everything - 1) == [0, 1, 2, 5]
    assert chosen(everything) == chosen(1 << 40) == [0, 1, 2, 4, 5]  # every list (not 3, 6)


def test_rank_lookup_over_many_words() -> None:
    """Slots from the bitmap's word ranks equal positions in the sorted hot nodes."""
    rng = np.random.default_rng(5)
    n = 1000
    hot = np.sort(rng.choice(n, 300, replace=False))
    bits = np.zeros((n + 63) // 64, dtype=np.uint64)
    for v in hot:
        bits[v // 64] |= np.uint64(1) << np.uint64(v % 64)
    rank = np.empty_like(bits, dtype=np.int64)
    from ooc.storage.io import _hot_rank
    assert _hot_rank(bits, rank) == 300
    h = HotLists(bits, rank, np.zeros(301, dtype=np.int64), np.empty(0, dtype=np.int32))
    assert np.array_equal(h.node_ids(), hot)
    q = rng.integers(0, n, 2000)
    slot, hits = h.lookup(q)
    pos = np.searchsorted(hot, q)
    inside = (pos < 300) & (hot[np.minimum(pos, 299)] == q)
    assert hits == int(inside.sum())
    assert np.array_equal(slot, np.where(inside, pos, -1))


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("size", [0, 60, 100, 1 << 30])
def test_reads_exact_with_any_hot_size(tmp_path: Path, direct: bool, size: int) -> None:
    indptr, _, arr = _small(tmp_path)
    r = NeighborReader(arr, indptr, direct=direct)
    if size:
        r.hot = HotLists.build(r, size)
        assert r.hot.nbytes <= size
        assert r.counters.requests == 0  # loading the hot lists is not counted as sampling reads
    nodes = np.array([6, 4, 0, 3, 4, 1, 6, 5, 2, 0])  # any order, duplicates, empty lists
    ptr, ids = r.read(nodes)
    assert ids.dtype == np.int32 and ptr.dtype == np.int64
    assert ptr.tolist() == np.concatenate([[0], np.cumsum([len(LISTS[v]) for v in nodes])]).tolist()
    assert ids.tolist() == [u for v in nodes for u in LISTS[v]]
    hot = r.hot.num_nodes if r.hot is not None else 0
    assert (hot == 5) == (size == 1 << 30)
    if size == 1 << 30:  # the whole topology in memory: nothing read
        assert r.counters.requests == 0 and r.lists_disk == 0 and r.lists_hot == 7
    ptr, ids = r.read(np.empty(0, dtype=np.int64))  # empty frontier
    assert ptr.tolist() == [0] and ids.shape == (0,) and ids.dtype == np.int32
    ptr, ids = r.read(np.array([3, 6]))  # only empty lists: no read
    assert ptr.tolist() == [0, 0, 0] and ids.shape == (0,)
    with pytest.raises(IndexError):
        r.read(np.array([7]))
    r.close()


def test_reads_across_chunk_files_in_bounded_pieces(tmp_path: Path) -> None:
    """int64 ids in one-page chunk files, hot lists, and at most 100 ids per gather: every list
    (including those straddling chunk files and those longer than a piece) reads back exactly."""
    rng = np.random.default_rng(1)
    deg = rng.integers(0, 900, 60)
    deg[[3, 17]] = 0
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    indices = rng.integers(0, 60, int(indptr[-1])).astype(np.int64)
    write_array(tmp_path / "ix", indices, chunk_rows=512)
    arr = RawArray(tmp_path / "ix")
    assert arr.num_chunks > 20
    for direct in (False, True):
        r = NeighborReader(arr, indptr, direct=direct, chunk_edges=100)
        r.hot = HotLists.build(r, 40_000, fanout=5, chunk_nodes=3)
        assert 0 < r.hot.num_nodes < 58 and r.hot.nbytes <= 40_000
        hot_nodes = r.hot.node_ids()
        for k in range(r.hot.num_nodes):  # the hot lists are the stored ones
            v = hot_nodes[k]
            assert np.array_equal(r.hot.ids[r.hot.ptr[k]:r.hot.ptr[k + 1]],
                                  indices[indptr[v]:indptr[v + 1]])
        nodes = np.concatenate([rng.permutation(60), rng.integers(0, 60, 30)])
        ptr, ids = r.read(nodes)
        assert np.array_equal(ptr[1:], np.cumsum(deg[nodes]))
        assert np.array_equal(ids, np.concatenate([indices[indptr[v]:indptr[v + 1]] for v in nodes]))
        assert r.lists_hot + r.lists_disk == int((deg[nodes] > 0).sum()) and r.lists_hot > 0
        r.close()


def test_planned_reads_of_a_small_graph(tmp_path: Path) -> None:
    """Lists of nodes 4 and 0 are ids [6, 10) and [0, 3) of int32 indices: buffered, two requests
    of 16 and 12 bytes (not adjacent); a duplicate, an empty list and a hot node 0 change what is
    read as ``read`` does; with O_DIRECT both fall in one 4 KiB page."""
    indptr, _, arr = _small(tmp_path)
    r = NeighborReader(arr, indptr)
    assert r.plan_reads(np.array([4, 0])) == (28, 2)
    assert r.plan_reads(np.array([0, 4, 3, 0])) == (28, 2)
    assert r.plan_reads(np.array([4, 5])) == (20, 1)  # [6, 10) and [10, 11) touch
    bits = np.zeros(1, dtype=np.uint64)
    bits[0] = np.uint64(1)  # node 0 hot
    assert r.plan_reads(np.array([4, 0]), bits) == (16, 1)
    assert r.plan_reads(np.array([3, 6])) == (0, 0) and r.plan_reads(np.zeros(0, np.int64)) == (0, 0)
    r.close()
    d = NeighborReader(arr, indptr, direct=True)
    if d.direct:
        assert d.plan_reads(np.array([4, 0])) == (4096, 1)
    d.close()


@pytest.mark.parametrize("direct", [False, True])
def test_planned_reads_are_what_read_counts(tmp_path: Path, direct: bool) -> None:
    """Random lists in page-sized chunk files, hot lists, pieces of 300 ids, gaps of 0 and 8 KiB:
    ``plan_reads`` (no I/O) gives the bytes and requests the reader's counters then record."""
    rng = np.random.default_rng(4)
    deg = rng.integers(0, 400, 500)
    deg[rng.integers(0, 500, 40)] = 0
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    write_array(tmp_path / "ix", rng.integers(0, 500, int(indptr[-1])).astype(np.int32),
                chunk_rows=4096)
    arr = RawArray(tmp_path / "ix")
    for gap in (0, 8192):
        r = NeighborReader(arr, indptr, direct=direct, gap=gap, chunk_edges=300)
        r.hot = HotLists.build(r, 60_000, fanout=5)
        bits = r.hot.bits
        for k in (1, 7, 60, 500):
            nodes = rng.integers(0, 500, k)
            planned = r.plan_reads(nodes, bits)
            r.reset_stats()
            r.read(nodes)
            assert planned == (r.counters.bytes_read, r.counters.requests), (gap, k)
        assert r.plan_reads(np.arange(500), bits)[0] < r.plan_reads(np.arange(500))[0]
        r.close()


def _same(a, b) -> None:
    assert np.array_equal(a.seeds, b.seeds) and np.array_equal(a.nodes, b.nodes)
    assert np.array_equal(a.seed_positions, b.seed_positions)
    assert len(a.blocks) == len(b.blocks)
    for x, y in zip(a.blocks, b.blocks):
        assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
        assert np.array_equal(x.indptr, y.indptr) and np.array_equal(x.indices, y.indices)


def test_small_graph_sample_known_answer(tmp_path: Path) -> None:
    """All-neighbour sampling of seeds [4, 6] on the small graph: known blocks, hot or not."""
    indptr, indices, arr = _small(tmp_path)
    for size in (0, 60, 1 << 20):
        r = NeighborReader(arr, indptr)
        if size:
            r.hot = HotLists.build(r, size)
        sg = sample_blocks_lists(r.read, 7, np.array([4, 6]), [-1, -1], key=3)
        # hop 0: 4 <- {0, 1, 2, 5}; 6 <- {}; hop 1: lists of 0, 1, 2, 5 bring in 3 (0 <- 3)
        assert sg.nodes.tolist() == [4, 6, 0, 1, 2, 5, 3]
        outer, inner = sg.blocks  # input layer first
        assert inner.num_dst == 2 and inner.indptr.tolist() == [0, 4, 4]
        assert sg.nodes[inner.indices].tolist() == [0, 1, 2, 5]
        assert outer.num_dst == 6 and outer.indptr.tolist() == [0, 4, 4, 7, 8, 10, 11]
        assert sg.nodes[outer.indices].tolist() == [0, 1, 2, 5, 1, 2, 3, 0, 0, 1, 4]
        _same(sg, sample_blocks(indptr, indices, np.array([4, 6]), [-1, -1], 3))
        empty = sample_blocks_lists(r.read, 7, np.empty(0, dtype=np.int64), [2, 2], key=3)
        _same(empty, sample_blocks(indptr, indices, np.empty(0, dtype=np.int64), [2, 2], 3))
        isolated = sample_blocks_lists(r.read, 7, np.array([6, 3]), [2, 2], key=3)
        assert isolated.nodes.tolist() == [6, 3] and isolated.num_sampled_edges == 0
        r.close()


@pytest.mark.parametrize("replace", [False, True])
def test_disk_sample_equals_in_memory_sample_for_every_hot_size(tmp_path: Path,
                                                                replace: bool) -> None:
    """Power-law-ish graph with isolated nodes, chunked indices: the sample over on-disk lists
    (buffered or O_DIRECT, no hot lists, some, all) equals the in-memory sample for each key."""
    rng = np.random.default_rng(7)
    n = 4000
    src = (rng.pareto(1.2, 50_000) * 50).astype(np.int64) % (n - 200)  # nodes >= 3800: isolated
    dst = rng.integers(0, n - 200, 50_000)
    ip, ix = build_csc(src, dst, n)
    write_array(tmp_path / "ix", ix, chunk_rows=1 << 13)
    arr = RawArray(tmp_path / "ix")
    topo = ix.nbytes + 16 * n
    seeds = np.concatenate([rng.choice(n - 200, 300, replace=False), [3900, 3999]])
    keys = [np.uint64(k) for k in (1, 99, 2 ** 40 + 3)]
    for direct in (False, True):
        for size in (0, 4096, topo // 10, topo // 2, 2 * topo):
            r = NeighborReader(arr, ip, direct=direct, chunk_edges=5000)
            if size:
                r.hot = HotLists.build(r, size, fanout=10)
                assert r.hot.nbytes <= size
            for key in keys:
                _same(sample_blocks_lists(r.read, n, seeds, [10, 5, 3], key, replace),
                      sample_blocks(ip, ix, seeds, [10, 5, 3], key, replace))
            if size == 2 * topo:
                assert r.lists_disk == 0 and r.counters.requests == 0
            r.close()


def test_hot_lists_shared_through_the_allocator(tmp_path: Path) -> None:
    """Every array of a hot set comes from ``alloc`` (shared memory between local ranks)."""
    indptr, _, arr = _small(tmp_path)
    r = NeighborReader(arr, indptr)
    made = {}

    def alloc(tag, shape, dtype, fill):
        out = np.empty(shape, dtype=dtype)
        fill(out)
        made[tag] = out
        return out

    h = HotLists.build(r, 1 << 20, alloc=alloc)
    assert sorted(made) == ["hot_bits", "hot_ids", "hot_ptr", "hot_rank"]
    assert h.bits is made["hot_bits"] and h.ids is made["hot_ids"] and h.rank is made["hot_rank"]
    assert h.node_ids().tolist() == [0, 1, 2, 4, 5]
    assert h.nbytes == sum(a.nbytes for a in made.values())
    r.close()


def test_build_from_a_given_bitmap_skips_the_scoring_pass(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget split's bitmap (``select`` for the same size and fanout) builds the same hot set
    without scoring the lists again."""
    indptr, indices, arr = _small(tmp_path)
    r = NeighborReader(arr, indptr)
    ref = HotLists.build(r, 120, fanout=2)
    bits = HotLists.select(indptr, HotLists.scores(arr, indptr, 2), 120, arr.dtype.itemsize)

    def no_scoring(*a: object, **k: object) -> None:
        raise AssertionError("scored again")

    monkeypatch.setattr(HotLists, "scores", staticmethod(no_scoring))
    got = HotLists.build(r, 120, fanout=2, bits=bits)
    assert got.num_nodes == ref.num_nodes > 0
    for a, b in ((got.bits, ref.bits), (got.ptr, ref.ptr), (got.ids, ref.ids), (got.rank, ref.rank)):
        assert np.array_equal(a, b)
    r.close()
