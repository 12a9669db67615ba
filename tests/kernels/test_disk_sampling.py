"""Sampling over fetched neighbour lists: the last hop's lists fetched in pieces."""

from __future__ import annotations

import numpy as np
import pytest

import ooc.kernels.disk_sampling as ds
from ooc.kernels.disk_sampling import sample_blocks_lists
from ooc.kernels.graph import build_csc
from ooc.kernels.sampling import sample_blocks


def _same(a, b) -> None:
    assert np.array_equal(a.seeds, b.seeds) and np.array_equal(a.nodes, b.nodes)
    assert len(a.blocks) == len(b.blocks)
    for x, y in zip(a.blocks, b.blocks):
        assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
        assert np.array_equal(x.indptr, y.indptr) and np.array_equal(x.indices, y.indices)


@pytest.mark.parametrize("piece", [1, 7, 300, 1 << 22])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("wide", [np.int32, np.int64])
def test_last_hop_in_pieces_equals_in_memory_sample(monkeypatch: pytest.MonkeyPatch, piece: int,
                                                    replace: bool, wide: type) -> None:
    """Power-law in-degrees and isolated nodes: however small the last hop's pieces (one list at a
    time with ``piece=1``), the sample equals the in-memory one; each fetch of the last hop holds
    fetches the lists of nodes no earlier fetch read, and the lists keep their stored dtype."""
    rng = np.random.default_rng(3)
    n = 3000
    src = rng.integers(0, n - 100, 40_000)
    dst = (rng.pareto(1.1, 40_000) * 40).astype(np.int64) % (n - 100)  # nodes >= 2900: isolated
    ip, ix = build_csc(src, dst, n)
    ix = ix.astype(wide)
    sizes, dtypes, asked = [], set(), []

    def fetch(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        deg = ip[v + 1] - ip[v]
        ptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
        ids = np.concatenate([ix[ip[u]:ip[u + 1]] for u in v]) if v.shape[0] else ix[:0]
        sizes.append(int(ptr[-1]))
        asked.append(v.copy())
        dtypes.add(ids.dtype)
        return ptr, ids

    monkeypatch.setattr(ds, "LAST_HOP_PIECE_IDS", piece)
    seeds = np.concatenate([rng.choice(n - 100, 200, replace=False), [2950, 2999]])
    for key in (np.uint64(5), np.uint64(2 ** 41 + 9)):
        sizes.clear()
        asked.clear()
        got = sample_blocks_lists(fetch, n, seeds, [6, 4, 3], key, replace)
        _same(got, sample_blocks(ip, ix, seeds, [6, 4, 3], key, replace))
        if piece < 1 << 22:
            assert len(sizes) > 3  # two kept hops, then several pieces
        else:
            assert len(sizes) == 3  # seeds, first hop's new nodes, the last hop's in one piece
        every = np.concatenate(asked)
        assert np.unique(every).shape[0] == every.shape[0]  # each list fetched once
    assert dtypes == {np.dtype(wide)}
