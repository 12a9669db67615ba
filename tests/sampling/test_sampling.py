"""Uniform neighbour sampler: exact small cases and statistical checks."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from ooc.kernels.graph import build_csc
from ooc.kernels.rng import batch_key
from ooc.kernels.sampling import sample_blocks


def star(n_nbrs: int) -> tuple[np.ndarray, np.ndarray]:
    """Node 0 with in-neighbours 1..n_nbrs."""
    return build_csc(np.arange(1, n_nbrs + 1), np.zeros(n_nbrs, dtype=np.int64), n_nbrs + 1)


@pytest.mark.parametrize("replace", [False, True])
def test_no_edges(replace: bool) -> None:
    ip, ix = build_csc(np.array([], dtype=np.int64), np.array([], dtype=np.int64), 5)
    sg = sample_blocks(ip, ix, np.array([1, 2]), [2], key=3, replace=replace)
    assert sg.num_sampled_edges == 0
    assert sg.seeds.tolist() == [1, 2]
    assert sg.nodes.tolist() == [1, 2]
    assert sg.nodes.min() >= 0 and sg.nodes.max() < 5


def test_fanout_one_is_uniform() -> None:
    ip, ix = star(4)
    draws = Counter()
    for i in range(20_000):
        sg = sample_blocks(ip, ix, np.array([0]), [1], key=batch_key(0, 0, i))
        b = sg.blocks[0]
        assert b.num_edges == 1
        draws[int(sg.nodes[b.indices[0]])] += 1
    obs = [draws[v] for v in (1, 2, 3, 4)]
    assert stats.chisquare(obs).pvalue > 1e-3


def test_fanout_two_without_replacement_pairs() -> None:
    ip, ix = star(4)
    pairs = Counter()
    n = 30_000
    for i in range(n):
        sg = sample_blocks(ip, ix, np.array([0]), [2], key=batch_key(1, 0, i))
        got = sg.nodes[sg.blocks[0].indices]
        assert len(set(got.tolist())) == 2
        pairs[tuple(sorted(got.tolist()))] += 1
    assert set(pairs) == set(itertools.combinations([1, 2, 3, 4], 2))
    for c in pairs.values():
        assert 0.15 <= c / n <= 0.18


def test_all_neighbours_and_fanout_above_degree() -> None:
    ip, ix = star(6)
    for fo in (-1, 6, 100):
        sg = sample_blocks(ip, ix, np.array([0]), [fo], key=1)
        assert sorted(sg.nodes[sg.blocks[0].indices].tolist()) == [1, 2, 3, 4, 5, 6]


def test_with_replacement_draws_exactly_fanout() -> None:
    ip, ix = star(2)
    sg = sample_blocks(ip, ix, np.array([0]), [5], key=1, replace=True)
    assert sg.blocks[0].num_edges == 5
    assert set(sg.nodes[sg.blocks[0].indices].tolist()) <= {1, 2}


def test_blocks_are_nested_with_seeds_first() -> None:
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 200, 2000), rng.integers(0, 200, 2000)
    ip, ix = build_csc(src, dst, 200)
    seeds = np.array([5, 17, 3])
    sg = sample_blocks(ip, ix, seeds, [4, 3], key=9)
    assert sg.nodes[:3].tolist() == [5, 17, 3]
    outer, inner = sg.blocks
    assert inner.num_dst == 3 and inner.num_src == outer.num_dst
    edges = set(zip(src.tolist(), dst.tolist()))
    for b in sg.blocks:
        counts = np.diff(b.indptr)
        for i in range(b.num_dst):
            nb = sg.nodes[b.indices[b.indptr[i]:b.indptr[i + 1]]]
            v = int(sg.nodes[i])
            assert counts[i] <= (4 if b is inner else 3)
            assert len(set(nb.tolist())) == len(nb)  # no duplicate edge without replacement
            for u in nb.tolist():
                assert (u, v) in edges
        assert b.indices.max(initial=0) < b.num_src


def test_same_key_same_sample_and_duplicate_seeds() -> None:
    ip, ix = star(100)
    a = sample_blocks(ip, ix, np.array([0]), [5], key=42)
    b = sample_blocks(ip, ix, np.array([0]), [5], key=42)
    assert np.array_equal(a.nodes, b.nodes)
    seen = set()
    for i in range(20):
        seen |= set(sample_blocks(ip, ix, np.array([0]), [5], key=batch_key(0, 0, i)).nodes.tolist())
    assert len(seen) >= 50
    d = sample_blocks(ip, ix, np.array([0, 3, 0]), [2], key=1)
    assert d.seeds.tolist() == [0, 3]
    assert d.seed_positions.tolist() == [0, 1, 0]


def test_bad_seed_is_rejected() -> None:
    ip, ix = star(3)
    with pytest.raises(ValueError, match="seed id 9 outside"):
        sample_blocks(ip, ix, np.array([9]), [2], key=0)


# ------------------------------------------------------------------ the sampler family
def weighted_star() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Node 0 <- 1,2,3,4 with probabilities [1,0,1,0]; node 5 <- 6,7 with [0,0]."""
    src = np.array([1, 2, 3, 4, 6, 7])
    dst = np.array([0, 0, 0, 0, 5, 5])
    ip, ix = build_csc(src, dst, 8)
    w = np.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0])  # CSC order = sorted sources per node
    return ip, ix, w


@pytest.mark.parametrize("fanout", [-1, 10])
def test_weighted_exact_sets(fanout: int) -> None:
    from ooc.sampling.samplers import NeighborSampler
    ip, ix, w = weighted_star()
    s = NeighborSampler(ip, ix, [fanout], weights=w)
    for i in range(50):
        mb = s.sample(np.array([0]), key=batch_key(0, 0, i))
        got = mb.nodes[mb.blocks[0].indices]
        assert sorted(got.tolist()) == [1, 3]
    mb = s.sample(np.array([5]), key=7)
    assert mb.num_sampled_edges == 0
    assert mb.nodes.tolist() == [5]


def test_weighted_frequencies_follow_probabilities() -> None:
    from ooc.sampling.samplers import NeighborSampler
    ip, ix = star(3)
    w = np.array([1.0, 2.0, 7.0])
    for replace in (True, False):
        s = NeighborSampler(ip, ix, [1], replace=replace, weights=w)
        c = Counter()
        for i in range(10_000):
            mb = s.sample(np.array([0]), key=batch_key(3, int(replace), i))
            c[int(mb.nodes[mb.blocks[0].indices[0]])] += 1
        assert stats.chisquare([c[1], c[2], c[3]], f_exp=[1000, 2000, 7000]).pvalue > 1e-3


def test_fanout_minus_one_means_all_in_every_sampler() -> None:
    from ooc.sampling.samplers import LadiesSampler, LaborSampler, NeighborSampler
    ip, ix = star(6)
    for s in (NeighborSampler(ip, ix, [-1]), LaborSampler(ip, ix, [-1]), LadiesSampler(ip, ix, [-1])):
        mb = s.sample(np.array([0]), key=3)
        assert sorted(mb.nodes[mb.blocks[0].indices].tolist()) == [1, 2, 3, 4, 5, 6], type(s)


def test_out_neighbours_on_request() -> None:
    from ooc.sampling.samplers import NeighborSampler
    # 0 -> 1, 0 -> 2, 3 -> 0: out-neighbours of 0 are {1, 2}, in-neighbours {3}
    ip, ix = build_csc(np.array([0, 0, 3]), np.array([1, 2, 0]), 4)
    w = np.zeros(3)
    w[ip[0]:ip[1]] = 1.0  # the in-edge 3 -> 0
    assert NeighborSampler(ip, ix, [-1]).sample(np.array([0]), 1).nodes.tolist() == [0, 3]
    out = NeighborSampler(ip, ix, [-1], direction="out").sample(np.array([0]), 1)
    assert sorted(out.nodes[1:].tolist()) == [1, 2]
    # weights follow the transpose: weight 1 on 0 -> 2 only (CSC position of edge (0, 2))
    w = np.zeros(3)
    w[ip[2]] = 1.0
    ow = NeighborSampler(ip, ix, [-1], direction="out", weights=w).sample(np.array([0]), 1)
    assert ow.nodes.tolist() == [0, 2]


def test_star_reproducibility_threads_and_workers() -> None:
    """Seed 42 twice -> identical; 20 calls without re-seeding -> different, >= 50 neighbours."""
    import numba
    from concurrent.futures import ThreadPoolExecutor
    from ooc.sampling.samplers import NeighborSampler
    ip, ix = star(100)
    s = NeighborSampler(ip, ix, [5])
    s.seed(42)
    a = s.sample(np.array([0]))
    s.seed(42)
    b = s.sample(np.array([0]))
    assert np.array_equal(a.nodes, b.nodes) and np.array_equal(a.blocks[0].indices, b.blocks[0].indices)
    draws = [s.sample(np.array([0])).nodes for _ in range(20)]
    assert len({tuple(d.tolist()) for d in draws}) > 1
    assert len(set(np.concatenate(draws).tolist()) - {0}) >= 50
    # an epoch of keyed batches: serial, 4 worker threads in any order, 1 vs 2 Numba threads
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 3000, 60_000), rng.integers(0, 3000, 60_000)
    gip, gix = build_csc(src, dst, 3000)
    g = NeighborSampler(gip, gix, [15, 10, 5])
    batches = [rng.permutation(3000)[:256] for _ in range(6)]
    ref = [g.sample(bt, key=batch_key(42, 0, i)) for i, bt in enumerate(batches)]
    with ThreadPoolExecutor(4) as ex:
        par = list(ex.map(lambda i: g.sample(batches[i], key=batch_key(42, 0, i)), reversed(range(6))))
    par.reverse()
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one = [g.sample(bt, key=batch_key(42, 0, i)) for i, bt in enumerate(batches)]
    finally:
        numba.set_num_threads(old)
    for x, y, z in zip(ref, par, one):
        assert np.array_equal(x.nodes, y.nodes) and np.array_equal(x.nodes, z.nodes)
        for bx, by, bz in zip(x.blocks, y.blocks, z.blocks):
            assert np.array_equal(bx.indices, by.indices) and np.array_equal(bx.indices, bz.indices)
            assert np.array_equal(bx.indptr, by.indptr) and np.array_equal(bx.indptr, bz.indptr)


def _check_invariants(mb, src, dst, fanouts, replace) -> None:
    edges = set(zip(src.tolist(), dst.tolist()))
    for h, b in enumerate(reversed(mb.blocks)):  # hop h = fanouts[h]
        counts = np.diff(b.indptr)
        if fanouts[h] >= 0:
            assert counts.max(initial=0) <= fanouts[h]
        assert b.indices.max(initial=0) < b.num_src
        for i in range(b.num_dst):
            nb = mb.nodes[b.indices[b.indptr[i]:b.indptr[i + 1]]].tolist()
            v = int(mb.nodes[i])
            for u in nb:
                assert (u, v) in edges
            if not replace:
                assert len(set(nb)) == len(nb)  # no duplicate edges (graph has no multi-edges)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), m=st.integers(0, 200), seed=st.integers(0, 2**31),
       fanouts=st.lists(st.sampled_from([-1, 1, 2, 3, 5]), min_size=1, max_size=3),
       replace=st.booleans(), labor=st.booleans(), nseeds=st.integers(1, 8))
def test_property_invariants(n, m, seed, fanouts, replace, labor, nseeds) -> None:
    from ooc.kernels.sampling import neighbor_sample
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    ip, ix = build_csc(src, dst, n, dedup=True)
    seeds = rng.integers(0, n, nseeds)
    mb = neighbor_sample(ip, ix, seeds, fanouts, key=seed, replace=replace and not labor,
                         labor=labor)
    assert np.array_equal(mb.seeds[mb.seed_positions], seeds)
    assert len(np.unique(mb.nodes)) == len(mb.nodes)
    _check_invariants(mb, src, dst, [f if not labor or f < 0 else 10**9 for f in fanouts]
                      if labor else fanouts, replace and not labor)


def test_labor_expected_fanout_and_fewer_nodes() -> None:
    from ooc.sampling.samplers import LaborSampler, NeighborSampler
    rng = np.random.default_rng(5)
    n = 4000
    src, dst = rng.integers(0, n, 80_000), rng.integers(0, n, 80_000)
    ip, ix = build_csc(src, dst, n, dedup=True)
    seeds = rng.permutation(n)[:500]
    lab = LaborSampler(ip, ix, [5])
    nbr = NeighborSampler(ip, ix, [5])
    deg = np.diff(ip)[seeds]
    tot_l, tot_n, nodes_l, nodes_n = 0.0, 0.0, 0, 0
    for i in range(40):
        ml = lab.sample(seeds, key=batch_key(0, 0, i))
        mn = nbr.sample(seeds, key=batch_key(0, 0, i))
        tot_l += ml.num_sampled_edges
        tot_n += mn.num_sampled_edges
        nodes_l += ml.nodes.shape[0]
        nodes_n += mn.nodes.shape[0]
    expect = 40 * np.minimum(deg, 5).sum()
    assert abs(tot_l / expect - 1) < 0.03  # E[sampled] = min(deg, fanout)
    assert tot_n == expect
    assert nodes_l < 0.95 * nodes_n  # shared variates: fewer distinct sources


def test_ladies_layer_size_and_unbiased_weights() -> None:
    from ooc.sampling.samplers import LadiesSampler
    rng = np.random.default_rng(2)
    n = 300
    src, dst = rng.integers(0, n, 3000), rng.integers(0, n, 3000)
    ip, ix = build_csc(src, dst, n, dedup=True)
    x = rng.normal(size=n)
    seeds = np.arange(20)
    full = np.array([x[ix[ip[v]:ip[v + 1]]].sum() for v in seeds])
    s = LadiesSampler(ip, ix, [40], normalize=False)
    acc = np.zeros(20)
    T = 3000
    for i in range(T):
        mb = s.sample(seeds, key=batch_key(1, 0, i))
        b = mb.blocks[0]
        new = mb.nodes[b.num_dst:]
        assert new.shape[0] <= 40 and len(np.unique(mb.nodes)) == mb.nodes.shape[0]
        est = np.bincount(b.dst_index(), weights=b.edge_weight * x[mb.nodes[b.indices]], minlength=20)
        acc += est
    err = np.abs(acc / T - full)
    assert err.max() < 0.35 * np.abs(full).mean() + 0.3
    # normalised weights sum to the in-degree of every destination with sampled edges
    mb = LadiesSampler(ip, ix, [40]).sample(seeds, key=3)
    b = mb.blocks[0]
    sums = np.bincount(b.dst_index(), weights=b.edge_weight, minlength=20)
    has = np.diff(b.indptr) > 0
    assert np.allclose(sums[has], np.diff(ip)[seeds][has], rtol=1e-5)


@pytest.mark.parametrize("opt", ["plain", "replace", "eids", "weighted", "exclude", "labor", "all"])
def test_relabel_paths_and_threads_agree(opt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense id map, sort-based relabelling and the hash table give the same batches, 1 or 2 threads."""
    import numba
    from ooc.kernels import sampling as S
    rng = np.random.default_rng(7)
    n = 3000
    src, dst = rng.integers(0, n, 60_000), rng.integers(0, n, 60_000)
    ip, ix = build_csc(src, dst, n)
    ix = ix.astype(np.int32)
    kw: dict = {}
    fo = [15, 10, 5]
    if opt == "replace":
        kw["replace"] = True
    elif opt == "eids":
        kw["return_eids"] = True
    elif opt == "weighted":
        kw["cumw"], kw["npos"] = S.edge_weight_cdf(ip, rng.random(ix.shape[0]))
    elif opt == "exclude":
        kw["exclude"] = S.excluded_edge_keys(src[:500], dst[:500])
    elif opt == "labor":
        kw["labor"] = True
    elif opt == "all":
        fo = [4, -1]
    seeds = rng.permutation(n)[:1000]
    runs = []
    old = numba.get_num_threads()
    for dense_max, sort_max in ((1 << 26, 1 << 31), (0, 1 << 31), (0, 0)):
        monkeypatch.setattr(S, "_DENSE_MAX_NODES", dense_max)
        monkeypatch.setattr(S, "_SORT_MAX_NODES", sort_max)
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            try:
                runs.append(S.neighbor_sample(ip, ix, seeds, fo, batch_key(3, 1, 4), **kw))
            finally:
                numba.set_num_threads(old)
    ref = runs[0]
    assert ref.num_sampled_edges > S._SERIAL_EDGES  # the parallel steps ran
    for mb in runs[1:]:
        assert np.array_equal(mb.nodes, ref.nodes)
        for a, b in zip(mb.blocks, ref.blocks):
            assert (a.num_src, a.num_dst) == (b.num_src, b.num_dst)
            assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            assert (a.eids is None) == (b.eids is None)
            if a.eids is not None:
                assert np.array_equal(a.eids, b.eids)
