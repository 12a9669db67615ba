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
