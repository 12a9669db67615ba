"""Neighbour sampling when the topology is out of core: the frontier's lists are fetched first.

``sample_blocks_lists`` gives exactly the sample of :func:`ooc.kernels.sampling.sample_blocks` on
the same graph, key and fanouts, but reads each hop's neighbour lists through a ``fetch(nodes) ->
(ptr, ids)`` callback (e.g. :class:`ooc.storage.io.NeighborReader` page-aligned reads, or a partition
buffer's resident topology) instead of indexing an in-memory CSC.  The draws replicate
``sample_hop``: the random stream of node ``v`` is ``mix_key(hop key, v)``, Floyd's algorithm
without replacement, ``rand_below`` with replacement -- so exact mode with the topology on disk
trains on the same batches as with the topology in memory (tested).  New nodes are numbered by
the in-memory sampler's own relabelling kernels (dense id map for up to 2**21 nodes, radix sort
below 2**31, see :mod:`ooc.kernels.sampling`), with its per-thread workspace, so only the list
fetch differs between the two samplers.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from ooc.kernels.rng import distinct_below, mix_key, rand_below
from ooc.kernels.sampling import (_DENSE_MAX_NODES, _SORT_MAX_NODES, Block, SampledSubgraph,
                                  _relabel_dense, _relabel_sorted, _thread_bits, _workspace,
                                  serial_if_small, unique_seeds)

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


@njit(cache=True, nogil=True)
def _seed_dense(dmap: np.ndarray, gen: int, seeds: np.ndarray) -> None:
    """Local ids ``0..B-1`` of the seeds in the dense id map (as the in-memory sampler does)."""
    g = np.int64(gen) << 32
    for i in range(seeds.shape[0]):
        dmap[seeds[i]] = g | i


def sample_blocks_lists(fetch: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
                        num_nodes: int, seeds: np.ndarray, fanouts: list[int], key: int | np.uint64,
                        replace: bool = False) -> SampledSubgraph:
    """Multi-hop sampling with lists from ``fetch``; same result as ``sample_blocks``.

    Args:
        fetch: ``nodes int64 [n] -> (ptr int64 [n+1], ids [ptr[-1]])``, the in-neighbour lists
            (called once per hop with the nodes found since the last call; not for the last hop's).
        num_nodes: N (seed range check, relabelling method).
        seeds, fanouts, key, replace: as :func:`ooc.kernels.sampling.sample_blocks`.

    Returns:
        The :class:`~ooc.kernels.sampling.SampledSubgraph` of ``sample_blocks`` (``Block.indices``
        int32 local ids, nodes int64).

    Raises:
        ValueError: a seed id is outside ``[0, N)``.
    """
    useeds, positions = unique_seeds(seeds, num_nodes)
    fo = [int(f) for f in fanouts]
    with serial_if_small(useeds.shape[0], fo):  # small batches on one thread, as in memory
        return _sample_lists(fetch, num_nodes, useeds, positions, fo, key, replace)


#: ids of neighbour lists fetched together for the last hop (its lists are not kept): the lists a
#: batch holds at once are its inner hops' plus about this many (16 MiB of int32 ids).
LAST_HOP_PIECE_IDS = 1 << 22


def _last_hop(fetch, lptr: np.ndarray, lids: np.ndarray | None, nodes: np.ndarray, fetched: int,
              n_dst: int, fanout: int, replace: bool, hop_key: np.uint64
              ) -> tuple[np.ndarray, np.ndarray]:
    """``sample_hop_lists`` of ``nodes[:n_dst]`` where the lists of ``nodes[:fetched]`` are kept
    (``lptr``, ``lids``) and those of ``nodes[fetched:n_dst]`` are fetched in pieces of about
    :data:`LAST_HOP_PIECE_IDS` ids and dropped once drawn from.  The pieces are runs of the new
    nodes in id order (file order: together they read the pages one fetch of all would read);
    the next piece's node count is scaled by the ids per node seen so far.  Every node's draws
    depend only on its list and ``(hop_key, node)``, so the result equals one call over all
    lists; the pieces' draws are put back in ``nodes`` order."""
    ptrs, nbrs = [], []
    new = nodes[fetched:n_dst]
    order = np.argsort(new, kind="stable")
    sorted_new = new[order]
    seen_nodes, seen_ids = fetched, int(lptr[-1])  # ids per node so far: the first piece's size
    take = max(1, int(LAST_HOP_PIECE_IDS * seen_nodes / seen_ids)) if seen_ids else 4096
    a, m = 0, sorted_new.shape[0]
    while a < m:
        b = min(m, a + take)
        p, ids = fetch(sorted_new[a:b])
        q, nb = sample_hop_lists(p, ids, sorted_new[a:b], fanout, replace, hop_key)
        del ids
        ptrs.append(q)
        nbrs.append(nb)
        seen_nodes += b - a
        seen_ids += int(p[-1])
        take = max(1, int(LAST_HOP_PIECE_IDS * seen_nodes / max(seen_ids, 1)))
        a = b
    # the new nodes' draws, made in id order, placed in discovery order
    counts = np.concatenate([np.diff(q) for q in ptrs]) if ptrs else np.zeros(0, dtype=np.int64)
    flat = np.concatenate(nbrs) if nbrs else np.empty(0, dtype=np.int64)
    if fetched:
        p_old, nb_old = sample_hop_lists(lptr, lids, nodes[:fetched], fanout, replace, hop_key)
    else:
        p_old, nb_old = np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int64)
    k_new = np.empty(m, dtype=np.int64)
    k_new[order] = counts
    ptr = np.empty(n_dst + 1, dtype=np.int64)
    ptr[:fetched + 1] = p_old
    np.cumsum(k_new, out=ptr[fetched + 1:])
    ptr[fetched + 1:] += p_old[-1]
    out = np.empty(int(ptr[-1]), dtype=np.int64)
    out[:p_old[-1]] = nb_old
    src_start = np.cumsum(counts) - counts  # where each sorted node's draws start in flat
    dst_start = ptr[fetched + order]  # and where they go
    out[np.repeat(dst_start - src_start, counts) + np.arange(flat.shape[0])] = flat
    return ptr, out


def _sample_lists(fetch, num_nodes, useeds, positions, fanouts, key, replace) -> SampledSubgraph:
    n0 = useeds.shape[0]
    dense = num_nodes <= _DENSE_MAX_NODES
    vbits = max(1, (num_nodes - 1).bit_length()) if num_nodes <= _SORT_MAX_NODES else 0
    ws = _workspace(np.dtype(np.int64))
    if dense:
        dgen = ws.next_dgen(num_nodes)
        _seed_dense(ws.dmap, dgen, useeds)
    elif vbits:
        slocal = np.argsort(useeds, kind="stable").astype(np.int64)
        sid = useeds[slocal]
    nodes = np.empty(max(16, 2 * n0), dtype=np.int64)
    nodes[:n0] = useeds
    count = n0
    sizes = [n0]
    lptr = np.zeros(1, dtype=np.int64)
    lids: np.ndarray | None = None  # the kept lists, in the fetched dtype
    fetched = 0
    parts = []
    for h, f in enumerate(fanouts):
        n_dst = count
        hop_key = np.uint64(mix_key(np.uint64(key), h))
        if h + 1 < len(fanouts) or n_dst == fetched:
            if n_dst > fetched:  # lists of the nodes discovered since the last fetch, kept
                p, ids = fetch(nodes[fetched:n_dst])
                lptr = np.concatenate([lptr, lptr[-1] + p[1:]])
                lids = ids if lids is None else np.concatenate([lids, ids.astype(lids.dtype)])
                fetched = n_dst
            if lids is None:
                lids = np.empty(0, dtype=np.int64)
            ptr, nbrs = sample_hop_lists(lptr, lids, nodes[:n_dst], int(f), bool(replace), hop_key)
        else:  # the last hop: its new lists are used once, fetched and sampled piece by piece
            ptr, nbrs = _last_hop(fetch, lptr, lids, nodes, fetched, n_dst, int(f), bool(replace),
                                  hop_key)
        m = nbrs.shape[0]
        if nodes.shape[0] < count + m:
            grown = np.empty(max(count + m, 2 * nodes.shape[0]), dtype=np.int64)
            grown[:count] = nodes[:count]
            nodes = grown
        local = np.empty(m, dtype=np.int32)
        if dense:
            count = _relabel_dense(ws.dmap, dgen, nbrs, m, local, nodes, count,
                                   np.int64(1) << _thread_bits())
        elif vbits:
            count, sid, slocal = _relabel_sorted(nbrs, m, local, nodes, count, sid, slocal,
                                                 np.empty(m, dtype=np.int64),
                                                 np.empty(m, dtype=np.int64), vbits,
                                                 h + 1 < len(fanouts))
        else:  # ids of 2**31 and above: first-seen order by sorting in numpy
            known = nodes[:count]
            new = _first_seen_new(nbrs, np.sort(known))
            nodes[count:count + new.shape[0]] = new
            count += new.shape[0]
            allnodes = nodes[:count]
            order = np.argsort(allnodes, kind="stable")
            local = order[np.searchsorted(allnodes[order], nbrs)].astype(np.int32)
        parts.append((ptr, local))
        sizes.append(count)
    blocks = []
    for h in range(len(fanouts) - 1, -1, -1):
        ptr, local = parts[h]
        blocks.append(Block(num_src=int(sizes[h + 1]), num_dst=int(sizes[h]), indptr=ptr,
                            indices=local))
    return SampledSubgraph(seeds=useeds, nodes=nodes[:count].copy(), blocks=blocks,
                           seed_positions=positions)
