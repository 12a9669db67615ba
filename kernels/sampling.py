"""Node-wise (GraphSAGE) neighbour sampling with relabelling, as Numba kernels.

``sample_blocks`` draws, hop by hop, up to ``fanout[h]`` in-neighbours of every destination node
(uniformly, with or without replacement; ``-1`` = all neighbours) and builds the per-layer
message-flow graphs (MFGs, "blocks" in DGL's terms; Hamilton et al., "Inductive representation
learning on large graphs", NeurIPS'17).

Relabelling: one open-addressing hash table per batch maps global ids to local ids in first-seen
order.  Because the source nodes of hop ``h`` start with its destination nodes, the node lists are
nested -- seeds, then the new nodes of hop 0, then of hop 1, ... -- so the ``num_src`` of every block
is a prefix length of one ``nodes`` array (seeds first in every layer's source nodes).

Randomness is counter-based (:mod:`ooc.kernels.rng`): a draw depends on (batch key, hop, node id,
draw index) only, so samples are identical for any thread count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit, prange, uint64

from ooc.kernels.rng import mix_key, rand_below

__all__ = ["Block", "SampledSubgraph", "sample_blocks", "sample_hop"]


@njit(cache=True, nogil=True, parallel=True)
def sample_hop(indptr: np.ndarray, indices: np.ndarray, frontier: np.ndarray, fanout: int,
               replace: bool, key: np.uint64) -> tuple:
    """Sample in-neighbours of each frontier node.

    Args:
        indptr: int64 [N+1] CSC offsets.
        indices: int32|int64 [E] CSC sources.
        frontier: int64 [n] destination node ids.
        fanout: neighbours per node; ``-1`` = all.  Without replacement a node with ``deg <= fanout``
            keeps all its neighbours; with replacement exactly ``fanout`` draws (0 if ``deg == 0``).
        replace: sample with replacement.
        key: uint64 stream key of this (batch, hop).

    Returns:
        ``(ptr int64 [n+1], nbrs int64 [ptr[-1]])``: the sampled sources of frontier[i] are
        ``nbrs[ptr[i]:ptr[i+1]]``.
    """
    n = frontier.shape[0]
    ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        v = frontier[i]
        deg = indptr[v + 1] - indptr[v]
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
        start = indptr[v]
        deg = indptr[v + 1] - start
        out = ptr[i]
        k = ptr[i + 1] - out
        if k == 0:
            continue
        if k == deg and not (replace and fanout >= 0):
            for j in range(deg):
                nbrs[out + j] = indices[start + j]
            continue
        vkey = mix_key(key, v)
        if replace:
            for j in range(k):
                nbrs[out + j] = indices[start + rand_below(mix_key(vkey, j), deg)]
        else:
            # Robert Floyd's algorithm: k distinct offsets out of deg, O(k^2) membership tests
            c = 0
            for j in range(deg - k, deg):
                t = rand_below(mix_key(vkey, j), j + 1)
                dup = False
                for q in range(c):
                    if nbrs[out + q] == t:
                        dup = True
                        break
                nbrs[out + c] = j if dup else t
                c += 1
            for j in range(k):
                nbrs[out + j] = indices[start + nbrs[out + j]]
    return ptr, nbrs


@njit(cache=True, nogil=True, inline="always")
def _hash(x: np.int64, mask: np.int64) -> np.int64:
    h = uint64(x) * uint64(0x9E3779B97F4A7C15)
    return np.int64((h >> uint64(17)) & uint64(mask))


@njit(cache=True, nogil=True)
def _rehash(keys: np.ndarray, vals: np.ndarray, cap: int) -> tuple:
    nk = np.full(cap, -1, dtype=np.int64)
    nv = np.empty(cap, dtype=np.int64)
    mask = cap - 1
    for i in range(keys.shape[0]):
        k = keys[i]
        if k >= 0:
            s = _hash(k, mask)
            while nk[s] >= 0:
                s = (s + 1) & mask
            nk[s] = k
            nv[s] = vals[i]
    return nk, nv


@njit(cache=True, nogil=True)
def _sample_blocks(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, fanouts: np.ndarray,
                   replace: bool, key: np.uint64) -> tuple:
    num_hops = fanouts.shape[0]
    n0 = seeds.shape[0]
    cap = 16
    while cap < 4 * n0:
        cap *= 2
    keys = np.full(cap, -1, dtype=np.int64)
    vals = np.empty(cap, dtype=np.int64)
    mask = cap - 1
    nodes = np.empty(max(n0, 16), dtype=np.int64)
    count = 0
    for i in range(n0):
        v = seeds[i]
        s = _hash(v, mask)
        while keys[s] >= 0:
            s = (s + 1) & mask
        keys[s] = v
        vals[s] = count
        nodes[count] = v
        count += 1
    sizes = np.zeros(num_hops + 1, dtype=np.int64)
    sizes[0] = n0
    ptr_off = np.zeros(num_hops + 1, dtype=np.int64)
    idx_off = np.zeros(num_hops + 1, dtype=np.int64)
    ptr_parts = []
    idx_parts = []
    for h in range(num_hops):
        n_dst = count
        ptr, nbrs = sample_hop(indptr, indices, nodes[:n_dst], fanouts[h], replace,
                               mix_key(key, h))
        m = nbrs.shape[0]
        need = count + m
        if 2 * need > cap:
            while 2 * need > cap:
                cap *= 2
            keys, vals = _rehash(keys, vals, cap)
            mask = cap - 1
        if need > nodes.shape[0]:
            grown = np.empty(max(need, 2 * nodes.shape[0]), dtype=np.int64)
            grown[:count] = nodes[:count]
            nodes = grown
        local = np.empty(m, dtype=np.int64)
        for e in range(m):
            v = nbrs[e]
            s = _hash(v, mask)
            while True:
                kk = keys[s]
                if kk == v:
                    local[e] = vals[s]
                    break
                if kk < 0:
                    keys[s] = v
                    vals[s] = count
                    nodes[count] = v
                    local[e] = count
                    count += 1
                    break
                s = (s + 1) & mask
        sizes[h + 1] = count
        ptr_parts.append(ptr)
        idx_parts.append(local)
        ptr_off[h + 1] = ptr_off[h] + ptr.shape[0]
        idx_off[h + 1] = idx_off[h] + m
    ptr_all = np.empty(ptr_off[num_hops], dtype=np.int64)
    idx_all = np.empty(idx_off[num_hops], dtype=np.int64)
    for h in range(num_hops):
        ptr_all[ptr_off[h]:ptr_off[h + 1]] = ptr_parts[h]
        idx_all[idx_off[h]:idx_off[h + 1]] = idx_parts[h]
    return nodes[:count].copy(), sizes, ptr_all, ptr_off, idx_all, idx_off


@dataclass
class Block:
    """One message-flow graph (MFG): edges from ``num_src`` source to ``num_dst`` destination nodes.

    The destination nodes are the first ``num_dst`` source nodes.  Edges are CSC over destinations:
    the sampled sources of destination ``i`` are local ids ``indices[indptr[i]:indptr[i+1]]``.

    Attributes:
        num_src, num_dst: node counts.
        indptr: int64 [num_dst+1].
        indices: int64 [num_edges], local source ids in ``[0, num_src)``.
    """

    num_src: int
    num_dst: int
    indptr: np.ndarray
    indices: np.ndarray

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def dst_index(self) -> np.ndarray:
        """int64 [num_edges]: destination local id of every edge."""
        return np.repeat(np.arange(self.num_dst, dtype=np.int64), np.diff(self.indptr))


@dataclass
class SampledSubgraph:
    """A mini-batch's sample: nested node list and one :class:`Block` per layer.

    Attributes:
        seeds: int64 [B] the unique seed ids (the output nodes), in the order given.
        nodes: int64 [n] global ids of all sampled nodes; ``nodes[:blocks[0].num_src]`` are the
            input nodes whose features the first layer needs; ``nodes[:len(seeds)] == seeds``.
        blocks: MFGs ordered from the input layer to the output layer (``blocks[-1].num_dst == B``).
        seed_positions: int64 [len(requested seeds)], position in ``seeds`` of each requested seed
            (identity unless duplicates were removed), so labels always line up.
    """

    seeds: np.ndarray
    nodes: np.ndarray
    blocks: list[Block]
    seed_positions: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @property
    def input_nodes(self) -> np.ndarray:
        return self.nodes[: self.blocks[0].num_src] if self.blocks else self.seeds

    @property
    def num_sampled_edges(self) -> int:
        return sum(b.num_edges for b in self.blocks)


def sample_blocks(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, fanouts: list[int],
                  key: int | np.uint64, replace: bool = False) -> SampledSubgraph:
    """Multi-hop uniform neighbour sampling (GraphSAGE) with relabelling.

    Args:
        indptr: int64 [N+1] CSC offsets; indices: int32|int64 [E] in-neighbour ids.
        seeds: integer [B] output node ids in ``[0, N)``; duplicates are merged (see
            ``SampledSubgraph.seed_positions``).
        fanouts: per layer, from the output layer inwards (``fanouts[0]`` is sampled around the seeds,
            as in DGL/PyG); ``-1`` = all neighbours.
        key: uint64 random stream key (see :func:`ooc.kernels.rng.batch_key`).
        replace: sample with replacement.

    Returns:
        :class:`SampledSubgraph` with ``len(fanouts)`` blocks, input layer first.

    Raises:
        ValueError: a seed id is outside ``[0, N)``.
    """
    n = indptr.shape[0] - 1
    seeds = np.asarray(seeds, dtype=np.int64)
    if seeds.size and (seeds.min() < 0 or seeds.max() >= n):
        bad = seeds[(seeds < 0) | (seeds >= n)][0]
        raise ValueError(f"seed id {bad} outside [0, {n})")
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
    fo = np.asarray(fanouts, dtype=np.int64)
    nodes, sizes, ptr_all, ptr_off, idx_all, idx_off = _sample_blocks(
        indptr, indices, useeds, fo, bool(replace), np.uint64(key))
    blocks = []
    for h in range(fo.shape[0] - 1, -1, -1):
        blocks.append(Block(num_src=int(sizes[h + 1]), num_dst=int(sizes[h]),
                            indptr=ptr_all[ptr_off[h]:ptr_off[h + 1]],
                            indices=idx_all[idx_off[h]:idx_off[h + 1]]))
    return SampledSubgraph(seeds=useeds, nodes=nodes, blocks=blocks, seed_positions=positions)
