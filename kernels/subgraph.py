"""Subgraph-wise samplers: ClusterGCN and GraphSAINT random-walk sampling, as Numba kernels.

- ClusterGCN (Chiang et al., "Cluster-GCN: an efficient algorithm for training deep and large graph
  convolutional networks", KDD'19): nodes are grouped into clusters once; a batch is the subgraph
  induced by a few clusters.  The paper uses METIS; :func:`bfs_clusters` is a dependency-free
  balanced BFS region-growing partitioner (connected, contiguous clusters of equal size).
- GraphSAINT-RW (Zeng et al., "GraphSAINT: graph sampling based inductive learning method", ICLR'20):
  a batch is the subgraph induced by the nodes of random walks from its roots.  Normalisation
  coefficients come from pre-sampled subgraphs: node counts ``C_v`` and edge counts ``C_uv``; the
  aggregator weight of edge ``u -> v`` is ``C_v / C_uv`` (1 / estimated P(u in G_s | v in G_s), so the
  aggregated message of ``v`` is unbiased) and the loss weight of output node ``v`` is
  ``M / (C_v * n_train)`` (``M`` pre-sampled subgraphs), so the weighted loss sum estimates the mean
  training loss.

Both produce the same MFG layout as the node-wise sampler: the subgraph's nodes with the output
(training) nodes first; every layer but the last is the whole induced subgraph, the last keeps only
the in-edges of the output nodes (a prefix of the same CSC).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ooc.kernels.rng import mix_key, rand_below

__all__ = ["bfs_clusters", "cluster_members", "induced_subgraph", "random_walk_nodes", "uniform_roots",
           "accumulate_counts"]


@njit(cache=True, nogil=True)
def _bfs_clusters(indptr: np.ndarray, indices: np.ndarray, order: np.ndarray, target: int) -> np.ndarray:
    n = indptr.shape[0] - 1
    cl = np.full(n, -1, dtype=np.int64)
    queue = np.empty(n, dtype=np.int64)
    c = 0
    size = 0
    for s in order:
        if cl[s] >= 0:
            continue
        head = 0
        tail = 0
        queue[tail] = s
        tail += 1
        cl[s] = c
        size += 1
        if size == target:
            c += 1
            size = 0
        while head < tail:
            v = queue[head]
            head += 1
            for j in range(indptr[v], indptr[v + 1]):
                u = indices[j]
                if cl[u] < 0:
                    cl[u] = c
                    size += 1
                    queue[tail] = u
                    tail += 1
                    if size == target:
                        c += 1
                        size = 0
                        # the rest of this BFS starts a fresh cluster from its frontier
    return cl


def bfs_clusters(indptr: np.ndarray, indices: np.ndarray, num_clusters: int, seed: int = 0) -> np.ndarray:
    """Balanced clusters by breadth-first region growing over in-edges.

    Nodes are visited breadth-first from random start nodes; every ``ceil(N / num_clusters)``
    consecutive visits form one cluster, so clusters are as equal as possible and mostly connected.

    Args:
        indptr, indices: CSC graph with N nodes; num_clusters: K (1 <= K <= N); seed: start order.

    Returns:
        int64 [N] cluster id of every node, in ``[0, K)``.

    Raises:
        ValueError: K outside ``[1, N]``.
    """
    n = indptr.shape[0] - 1
    if not 1 <= num_clusters <= max(n, 1):
        raise ValueError(f"num_clusters {num_clusters} outside [1, {n}]")
    order = np.random.default_rng([seed, 0xC1]).permutation(n).astype(np.int64)
    target = -(-n // num_clusters)
    return _bfs_clusters(indptr, indices, order, target)


def cluster_members(cluster_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of clusters: members of cluster ``c`` are ``nodes[ptr[c]:ptr[c+1]]`` (ascending ids)."""
    order = np.argsort(cluster_of, kind="stable")
    counts = np.bincount(cluster_of, minlength=int(cluster_of.max()) + 1 if cluster_of.size else 0)
    ptr = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, order.astype(np.int64)


@njit(cache=True, nogil=True)
def induced_subgraph(indptr: np.ndarray, indices: np.ndarray, nodes: np.ndarray) -> tuple:
    """Subgraph induced by ``nodes`` (unique global ids, in their local order).

    Args:
        indptr, indices: CSC graph; nodes: int64 [n] unique node ids.

    Returns:
        ``(ptr int64 [n+1], src int32 [m] local source ids, eids int64 [m])``: CSC of every edge of
        the graph between two nodes of ``nodes``, in-edges of local node ``i`` at
        ``src[ptr[i]:ptr[i+1]]`` (in CSC order).
    """
    n = nodes.shape[0]
    order = np.argsort(nodes)
    srt = nodes[order]
    cnt = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        v = nodes[i]
        c = 0
        for j in range(indptr[v], indptr[v + 1]):
            p = np.searchsorted(srt, indices[j])
            if p < n and srt[p] == indices[j]:
                c += 1
        cnt[i + 1] = c
    for i in range(n):
        cnt[i + 1] += cnt[i]
    src = np.empty(cnt[n], dtype=np.int32)
    eids = np.empty(cnt[n], dtype=np.int64)
    for i in range(n):
        v = nodes[i]
        o = cnt[i]
        for j in range(indptr[v], indptr[v + 1]):
            p = np.searchsorted(srt, indices[j])
            if p < n and srt[p] == indices[j]:
                src[o] = order[p]
                eids[o] = j
                o += 1
    return cnt, src, eids


@njit(cache=True, nogil=True)
def random_walk_nodes(indptr: np.ndarray, indices: np.ndarray, roots: np.ndarray, walk_length: int,
                      key: np.uint64) -> np.ndarray:
    """Nodes visited by uniform random walks over in-edges (GraphSAINT-RW's node set, with repeats).

    Args:
        roots: int64 [R]; walk_length: steps per walk (>= 0); key: uint64 stream key.

    Returns:
        int64 [R * (walk_length + 1)]: walk ``i`` at ``[i*(L+1), (i+1)*(L+1))``, ``-1`` after a walk
        stops at a node without in-edges.
    """
    r = roots.shape[0]
    w = walk_length + 1
    out = np.full(r * w, -1, dtype=np.int64)
    for i in range(r):
        cur = roots[i]
        out[i * w] = cur
        wk = mix_key(key, i)
        for s in range(walk_length):
            d = indptr[cur + 1] - indptr[cur]
            if d == 0:
                break
            cur = np.int64(indices[indptr[cur] + rand_below(mix_key(wk, s), d)])
            out[i * w + s + 1] = cur
    return out


@njit(cache=True, nogil=True)
def uniform_roots(pool: np.ndarray, count: int, key: np.uint64) -> np.ndarray:
    """``count`` ids drawn uniformly with replacement from ``pool`` (GraphSAINT's root draw)."""
    out = np.empty(count, dtype=np.int64)
    for i in range(count):
        out[i] = pool[rand_below(mix_key(key, i), pool.shape[0])]
    return out


@njit(cache=True, nogil=True)
def accumulate_counts(nodes: np.ndarray, eids: np.ndarray, node_count: np.ndarray,
                      edge_count: np.ndarray) -> None:
    """Add one pre-sampled subgraph to GraphSAINT's node and edge counters."""
    for i in range(nodes.shape[0]):
        node_count[nodes[i]] += 1.0
    for i in range(eids.shape[0]):
        edge_count[eids[i]] += 1.0

