"""ClusterGCN / GraphSAINT subgraphs and link-prediction batches."""

from __future__ import annotations

import numpy as np

from ooc.kernels.graph import build_csc
from ooc.kernels.rng import batch_key


def _graph(n: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray, set]:
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, n, m), rng.integers(0, n, m)
    src, dst = np.concatenate([s, d]), np.concatenate([d, s])  # undirected
    ip, ix = build_csc(src, dst, n, dedup=True)
    dsts = np.repeat(np.arange(n), np.diff(ip))
    return ip, ix, set(zip(ix.tolist(), dsts.tolist()))


def _block_edges(mb, b) -> set:
    dst = mb.nodes[b.dst_index()]
    src = mb.nodes[b.indices]
    return set(zip(src.tolist(), dst.tolist()))


def _induced(edges: set, nodes: np.ndarray, dst_nodes: np.ndarray) -> set:
    ns, ds = set(nodes.tolist()), set(dst_nodes.tolist())
    return {(u, v) for (u, v) in edges if u in ns and v in ds}


def test_cluster_gcn_induced_edges_exact() -> None:
    from ooc.sampling.samplers import ClusterGCNSampler
    ip, ix, edges = _graph(200, 600, 0)
    s = ClusterGCNSampler(ip, ix, num_layers=2, num_clusters=10, clusters_per_batch=2)
    sizes = np.bincount(s.cluster_of)
    assert sizes.shape[0] == 10 and sizes.max() - sizes.min() <= 20
    train = np.arange(0, 200, 3)
    batches = s.plan_batches(train, 64, seed=0, epoch=0)
    assert sorted(np.concatenate(batches).tolist()) == train.tolist()  # each train node once
    for i, seeds in enumerate(batches):
        mb = s.sample(seeds, key=i)
        cl = np.unique(s.cluster_of[seeds])
        assert sorted(mb.nodes.tolist()) == sorted(np.flatnonzero(np.isin(s.cluster_of, cl)).tolist())
        assert mb.nodes[:seeds.shape[0]].tolist() == seeds.tolist()
        inner, out = mb.blocks
        assert inner.num_src == inner.num_dst == mb.nodes.shape[0]
        assert out.num_dst == seeds.shape[0]
        assert _block_edges(mb, inner) == _induced(edges, mb.nodes, mb.nodes)
        assert _block_edges(mb, out) == _induced(edges, mb.nodes, seeds)


def test_saint_induced_edges_and_unbiased_aggregation() -> None:
    from ooc.sampling.samplers import SaintRWSampler
    ip, ix, edges = _graph(40, 70, 1)
    train = np.arange(40)
    s = SaintRWSampler(ip, ix, num_layers=1, train_ids=train, walk_length=2, batch_size=4,
                       num_presample=3000, seed=0)
    rng = np.random.default_rng(3)
    x = rng.normal(size=40) + 1.0
    full = np.array([x[ix[ip[v]:ip[v + 1]]].sum() for v in range(40)])
    acc, seen = np.zeros(40), np.zeros(40)
    acc_raw = np.zeros(40)
    for i in range(4000):
        roots = s.plan_batches(train, 4, seed=7, epoch=i)[0]
        mb = s.sample(roots, key=batch_key(7, i, 0))
        b = mb.blocks[0]
        if i < 30:
            assert _block_edges(mb, b) == _induced(edges, mb.nodes, mb.seeds)
            assert np.all(mb.node_weight > 0)
        agg = np.bincount(b.dst_index(), weights=b.edge_weight * x[mb.nodes[b.indices]],
                          minlength=b.num_dst)
        raw = np.bincount(b.dst_index(), weights=x[mb.nodes[b.indices]], minlength=b.num_dst)
        acc[mb.seeds] += agg
        acc_raw[mb.seeds] += raw
        seen[mb.seeds] += 1
    ok = seen > 300
    assert ok.sum() >= 35
    est = acc[ok] / seen[ok]
    rel = np.abs(est - full[ok]).sum() / np.abs(full[ok]).sum()
    rel_raw = np.abs(acc_raw[ok] / seen[ok] - full[ok]).sum() / np.abs(full[ok]).sum()
    assert rel < 0.05, rel          # normalised: unbiased up to sampling noise (~0.02 measured)
    assert rel_raw > 0.3, rel_raw   # without normalisation the message is clearly biased (~0.5)


def test_link_prediction_excludes_seed_edges_on_path() -> None:
    from ooc.sampling.samplers import LinkSampler, NeighborSampler
    n = 6
    s = np.arange(5)
    src, dst = np.concatenate([s, s + 1]), np.concatenate([s + 1, s])  # path 0-1-2-3-4-5
    ip, ix = build_csc(src, dst, n)
    true = set(zip(src.tolist(), dst.tolist()))
    for negative in ("uniform", "degree"):
        ls = LinkSampler(NeighborSampler(ip, ix, [-1, -1]), num_neg=3, negative=negative)
        for i in range(30):
            pick = np.random.default_rng(i).choice(5, size=2, replace=False)
            ps, pd = pick, pick + 1
            mb = ls.sample_from_edges(ps, pd, key=batch_key(0, 0, i))
            mp = set()
            for b in mb.blocks:
                mp |= _block_edges(mb, b)
            for u, v in zip(ps.tolist(), pd.tolist()):
                assert (u, v) not in mp and (v, u) not in mp
            # everything else of the path that is reachable stays
            assert mp <= true
            pairs = mb.seeds[mb.pairs]
            pos = pairs[mb.pair_label == 1]
            neg = pairs[mb.pair_label == 0]
            assert sorted(map(tuple, pos.tolist())) == sorted(zip(ps.tolist(), pd.tolist()))
            assert neg.shape[0] > 0
            for u, v in neg.tolist():
                assert (u, v) not in true and (v, u) not in true and u != v
    # without exclusion the seed edge is in the message-passing graph
    ls = LinkSampler(NeighborSampler(ip, ix, [-1]), exclude=None)
    mb = ls.sample_from_edges(np.array([2]), np.array([3]), key=1)
    assert (2, 3) in _block_edges(mb, mb.blocks[0])


def test_degree_negatives_prefer_hubs() -> None:
    from ooc.sampling.samplers import LinkSampler, NeighborSampler
    # star: hub 0 <-> 1..50, plus a chain among 51..99
    leaves = np.arange(1, 51)
    chain = np.arange(51, 99)
    src = np.concatenate([leaves, np.zeros(50, int), chain, chain + 1])
    dst = np.concatenate([np.zeros(50, int), leaves, chain + 1, chain])
    ip, ix = build_csc(src, dst, 100)
    u = LinkSampler(NeighborSampler(ip, ix, [1]), num_neg=50, negative="uniform",
                    exclude_true_negatives=False)
    d = LinkSampler(NeighborSampler(ip, ix, [1]), num_neg=50, negative="degree", degree_power=1.0,
                    exclude_true_negatives=False)
    hu = hd = 0
    for i in range(20):
        for ls, acc in ((u, "u"), (d, "d")):
            mb = ls.sample_from_edges(np.array([60]), np.array([61]), key=i)
            neg = mb.seeds[mb.pairs[mb.pair_label == 0][:, 1]]
            if acc == "u":
                hu += int((neg == 0).sum())
            else:
                hd += int((neg == 0).sum())
    # hub has degree 50 of total 196: ~25% of degree-based draws vs ~1% uniform
    assert hd > 150 and hu < 60
