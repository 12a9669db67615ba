"""Synthetic graphs with planted, learnable labels.

``planted_partition`` is a degree-homogeneous stochastic block model (Holland, Laskey & Leinhardt,
1983) with class-correlated Gaussian features: each class is a community (a fraction ``p_intra`` of a
node's edges stay inside its class) and each class has a random feature centroid.  With enough
feature noise a feature-only classifier is weak while neighbourhood aggregation recovers the class,
so a GNN visibly learns from the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PlantedGraph", "planted_partition", "planted_in_edges"]


@dataclass
class PlantedGraph:
    """A generated graph: ``src -> dst`` edges (symmetric, no self-loops, no duplicates),
    float32 features [N, D], int32 labels [N], and random train/valid/test splits."""

    num_nodes: int
    src: np.ndarray
    dst: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    num_classes: int


def planted_partition(num_nodes: int, num_classes: int = 8, avg_degree: int = 10,
                      p_intra: float = 0.8, feat_dim: int = 32, noise: float = 2.0,
                      train_frac: float = 0.1, valid_frac: float = 0.05, test_frac: float = 0.05,
                      seed: int = 0) -> PlantedGraph:
    """Generate a planted-partition graph.

    Args:
        num_nodes: N >= num_classes.
        num_classes: K communities / labels.
        avg_degree: expected undirected degree (each node draws ``avg_degree / 2`` edges).
        p_intra: probability that a drawn edge stays in the node's class.
        feat_dim: D; features are ``centroid[label] + noise * N(0, I)`` with unit-norm-ish centroids.
        train_frac, valid_frac, test_frac: split sizes as fractions of N (disjoint, random).
        seed: everything is a deterministic function of the seed.

    Raises:
        ValueError: inconsistent sizes.
    """
    if num_nodes < num_classes or num_classes < 2:
        raise ValueError(f"need num_nodes >= num_classes >= 2, got {num_nodes}, {num_classes}")
    if train_frac + valid_frac + test_frac > 1:
        raise ValueError("split fractions add up to more than 1")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, num_nodes).astype(np.int32)
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=num_classes)
    starts = np.concatenate(([0], np.cumsum(counts)))
    m = max(1, avg_degree // 2) * num_nodes
    src = np.repeat(np.arange(num_nodes, dtype=np.int64), max(1, avg_degree // 2))
    intra = rng.random(m) < p_intra
    dst = rng.integers(0, num_nodes, m).astype(np.int64)
    c = labels[src[intra]]
    off = (rng.random(int(intra.sum())) * counts[c]).astype(np.int64)
    dst[intra] = order[starts[c] + off]
    s = np.concatenate([src, dst])
    d = np.concatenate([dst, src])
    keep = s != d
    pairs = np.unique(np.stack([s[keep], d[keep]], axis=1), axis=0)
    centroids = rng.normal(0.0, 1.0, (num_classes, feat_dim)).astype(np.float32)
    feats = centroids[labels] + noise * rng.normal(0.0, 1.0, (num_nodes, feat_dim)).astype(np.float32)
    perm = rng.permutation(num_nodes)
    a = int(train_frac * num_nodes)
    b = a + int(valid_frac * num_nodes)
    e = b + int(test_frac * num_nodes)
    return PlantedGraph(num_nodes, pairs[:, 0].copy(), pairs[:, 1].copy(), feats, labels,
                        np.sort(perm[:a]), np.sort(perm[a:b]), np.sort(perm[b:e]), num_classes)



def planted_in_edges(groups: np.ndarray, group_order: np.ndarray, group_starts: np.ndarray,
                     first: int, stop: int, degree: int, p_intra: float,
                     rng: np.random.Generator) -> np.ndarray:
    """In-neighbours of nodes ``first .. stop-1`` of a streaming planted-partition graph.

    The streaming variant of :func:`planted_partition` for graphs too big to build in memory: every
    node draws exactly ``degree`` in-neighbours (a directed multigraph: repeated edges and self-loops
    are possible), each from the node's own group (community) with probability ``p_intra``, uniform
    among its members, and uniform over all nodes otherwise.  Memory is O(N) for the groups and the
    member list, plus one block; ``ooc bench ooc`` uses it with labels ``group % num_classes``.

    Args:
        groups: int [N] community of every node; group_order: int64 [N] node ids sorted by group;
        group_starts: int64 [G+1] offsets of each group in ``group_order``.
        first, stop: the block of destination nodes.

    Returns:
        int64 [(stop - first) * degree] sources, sorted within each destination (CSC order).
    """
    n = groups.shape[0]
    m = (stop - first) * degree
    dst = np.repeat(np.arange(first, stop, dtype=np.int64), degree)
    src = rng.integers(0, n, m, dtype=np.int64)
    intra = rng.random(m) < p_intra
    c = groups[dst[intra]]
    size = group_starts[c + 1] - group_starts[c]
    src[intra] = group_order[group_starts[c] + (rng.random(int(intra.sum())) * size).astype(np.int64)]
    return np.sort(src.reshape(stop - first, degree), axis=1).reshape(-1)
