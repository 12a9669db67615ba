"""Neighbour sampling when the topology is out of core: the frontier's lists are fetched first.

``sample_blocks_lists`` gives exactly the sample of :func:`ooc.kernels.sampling.sample_blocks` on
the same graph, key and fanouts, but reads each hop's neighbour lists through a ``fetch(nodes) ->
(ptr, ids)`` callback (e.g. :class:`ooc.storage.io.NeighborReader` page-aligned reads, or a partition
buffer's resident topology) instead of indexing an in-memory CSC.  The draws replicate
``sample_hop``: the random stream of node ``v`` is ``mix_key(hop key, v)``, Floyd's algorithm
without replacement, ``rand_below`` with replacement -- so exact mode with the topology on disk
trains on the same batches as with the topology in memory (tested).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from ooc.kernels.rng import distinct_below, mix_key, rand_below
from ooc.kernels.sampling import Block, SampledSubgraph

__all__ = ["sample_hop_lists", "sample_blocks_lists"]


@njit(cache=True, nogil=True, parallel=True)
def sample_hop_lists(lptr: np.ndarray, lids: np.ndarray, frontier: np.ndarray, fanout: int,
                     replace: bool, key: np.uint64) -> tuple:
    """``sample_hop`` over fetched lists: ``lids[lptr[i]:lptr[i+1]]`` are frontier[i]'s in-neighbours.

    Returns:
        ``(ptr int64 [n+1], nbrs int64)`` exactly as :func:`ooc.kernels.sampling.sample_hop`.
    """
    n = frontier.shape[0]
    ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        deg = lptr[i + 1] - lptr[i]
        if fanout < 0:
            k = deg
        elif replace:
            k = fanout if deg > 0 else 0
        else:
            k = min(deg, fanout)
        ptr[i + 1] = ptr[i] + k
    nbrs = np.empty(ptr[n], dtype=np.int64)
    for i in prange(n):
        v = frontier[i]
        start = lptr[i]
        deg = lptr[i + 1] - start
        out = ptr[i]
        k = ptr[i + 1] - out
        if k == 0:
            continue
        if k == deg and not (replace and fanout >= 0):
            for j in range(deg):
                nbrs[out + j] = lids[start + j]
            continue
        vkey = mix_key(key, v)
        if replace:
            for j in range(k):
                nbrs[out + j] = lids[start + rand_below(mix_key(vkey, j), deg)]
        else:
            distinct_below(vkey, deg, k, nbrs, out)
            for j in range(k):
                nbrs[out + j] = lids[start + nbrs[out + j]]
    return ptr, nbrs


def _first_seen_new(nbrs: np.ndarray, known_sorted: np.ndarray) -> np.ndarray:
    """Distinct ids of ``nbrs`` not in ``known_sorted``, in order of first occurrence."""
    if nbrs.shape[0] == 0:
        return nbrs
    u, first = np.unique(nbrs, return_index=True)
    if known_sorted.shape[0]:
        pos = np.searchsorted(known_sorted, u)
        pos[pos == known_sorted.shape[0]] = 0
        new = known_sorted[pos] != u
        u, first = u[new], first[new]
    return u[np.argsort(first, kind="stable")]


def sample_blocks_lists(fetch: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
                        num_nodes: int, seeds: np.ndarray, fanouts: list[int], key: int | np.uint64,
                        replace: bool = False) -> SampledSubgraph:
    """Multi-hop sampling with lists from ``fetch``; same result as ``sample_blocks``.

    Args:
        fetch: ``nodes int64 [n] -> (ptr int64 [n+1], ids [ptr[-1]])``, the in-neighbour lists.
        num_nodes: N (seed range check).
        seeds, fanouts, key, replace: as :func:`ooc.kernels.sampling.sample_blocks`.

    Raises:
        ValueError: a seed id is outside ``[0, N)``.
    """
    seeds = np.asarray(seeds, dtype=np.int64)
    if seeds.size and (seeds.min() < 0 or seeds.max() >= num_nodes):
        bad = seeds[(seeds < 0) | (seeds >= num_nodes)][0]
        raise ValueError(f"seed id {bad} outside [0, {num_nodes})")
    uniq, first, inverse = np.unique(seeds, return_index=True, return_inverse=True)
    if uniq.shape[0] != seeds.shape[0]:
        order = np.argsort(first)
        useeds = seeds[np.sort(first)]
        rank = np.empty_like(order)
        rank[order] = np.arange(order.shape[0])
        positions = rank[inverse]
    else:
        useeds = seeds
        positions = np.arange(seeds.shape[0], dtype=np.int64)
    nodes = useeds.copy()
    sizes = [nodes.shape[0]]
    lptr = np.zeros(1, dtype=np.int64)
    lids = np.empty(0, dtype=np.int64)
    fetched = 0
    parts = []
    for h, f in enumerate(fanouts):
        n_dst = nodes.shape[0]
        if n_dst > fetched:  # lists of the nodes discovered since the last fetch
            p, ids = fetch(nodes[fetched:n_dst])
            lptr = np.concatenate([lptr, lptr[-1] + p[1:]])
            lids = np.concatenate([lids, ids.astype(np.int64, copy=False)])
            fetched = n_dst
        hop_key = np.uint64(mix_key(np.uint64(key), h))
        ptr, nbrs = sample_hop_lists(lptr, lids, nodes, int(f), bool(replace), hop_key)
        new = _first_seen_new(nbrs, np.sort(nodes))
        nodes = np.concatenate([nodes, new])
        order = np.argsort(nodes, kind="stable")
        local = order[np.searchsorted(nodes[order], nbrs)]
        parts.append((ptr, local))
        sizes.append(nodes.shape[0])
    blocks = []
    for h in range(len(fanouts) - 1, -1, -1):
        ptr, local = parts[h]
        blocks.append(Block(num_src=int(sizes[h + 1]), num_dst=int(sizes[h]), indptr=ptr,
                            indices=local.astype(np.int64)))
    return SampledSubgraph(seeds=useeds, nodes=nodes, blocks=blocks, seed_positions=positions)
