"""Mini-batch samplers behind one interface: ``sampler.sample(seeds) -> MiniBatch``.

The sampler/loader split follows PyG (``BaseSampler.sample_from_nodes``): a sampler turns seeds into a
:class:`~ooc.kernels.sampling.MiniBatch` (per-layer MFGs, input layer first, seeds first in every layer's
source nodes); the data path (:mod:`ooc.data.path`) and its loader only orchestrate.  Families:

==================  ===============================================  ===========================
``neighbor``        node-wise, uniform or edge-weighted, +-replacement  GraphSAGE (Hamilton, NeurIPS'17)
``labor``           layer-neighbour sampling (LABOR-0)                 Balin & Catalyurek, NeurIPS'23
``ladies``          layer-wise importance sampling, n nodes/layer       Zou et al., NeurIPS'19
``cluster``         induced subgraph of a few clusters                  Chiang et al., KDD'19
``saint``           induced subgraph of random walks, normalised        Zeng et al., ICLR'20
link prediction     seed edges + negatives, seed edges excluded          (any node-wise sampler)
==================  ===============================================  ===========================

Randomness: ``sample(seeds, key)`` is a pure function of ``key`` (use
:func:`ooc.kernels.rng.batch_key` of (seed, epoch, batch index)), so batches do not depend on thread or
worker counts.  Without a key, a sampler draws keys from its own stream: ``seed(s)`` restarts it, and
successive calls give different samples.
"""

from __future__ import annotations

import abc
import copy
import math
from dataclasses import dataclass

import numpy as np

from ooc.kernels.disk_sampling import sample_blocks_lists
from ooc.kernels.graph import build_csr
from ooc.kernels.layerwise import ladies_sample
from ooc.kernels.linkpred import degree_cdf, negative_destinations
from ooc.kernels.rng import batch_key, mix_key_py
from ooc.kernels.sampling import (Block, MiniBatch, edge_weight_cdf, excluded_edge_keys,
                                  neighbor_sample, unique_seeds)
from ooc.storage.io import NeighborReader
from ooc.kernels.subgraph import (accumulate_counts, bfs_clusters, cluster_members, induced_subgraph,
                                  random_walk_nodes, uniform_roots)

__all__ = ["Sampler", "NeighborSampler", "LaborSampler", "LadiesSampler", "ClusterGCNSampler",
           "SaintRWSampler", "LinkSampler", "make_sampler", "partition_clusters", "check_sampler", "SAMPLERS"]

SAMPLERS = ("neighbor", "labor", "ladies", "cluster", "saint")


class Sampler(abc.ABC):
    """The sampler contract: holds a CSC graph and a key stream; subclasses implement :meth:`_sample`.

    Every sampler of ooc -- node-wise (uniform, weighted, LABOR; in memory or over neighbour lists
    read from disk), LADIES, ClusterGCN, GraphSAINT -- is one of these, and the training data path
    (:mod:`ooc.data.path`) uses only this interface: :meth:`sample` for a batch, :meth:`plan_batches`
    for samplers that choose their own batches, :meth:`on` to sample the resident subgraph of a
    buffer state (``--mode buffer``).

    Args:
        indptr: int64 [N+1] CSC offsets; indices: int32|int64 [E] in-neighbour ids (sorted per node).
        seed: seed of the key stream used when ``sample`` gets no key.

    Attributes:
        buffer_mode: sampling inside the resident partitions is meaningful for this sampler
            (:meth:`on` works); see :func:`check_sampler`.
        excludes: :meth:`sample` accepts edges to exclude (link prediction's seed edges).
    """

    buffer_mode = True
    excludes = False

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, seed: int = 0) -> None:
        self.indptr = indptr
        self.indices = indices
        self.num_nodes = int(indptr.shape[0] - 1)
        self.seed(seed)

    def seed(self, seed: int) -> None:
        """Restart the key stream: after ``seed(s)`` the same calls give the same samples."""
        self._seed = int(seed)
        self._calls = 0

    def next_key(self) -> np.uint64:
        """The next key of the sampler's own stream (``batch_key(seed, -1, call index)``)."""
        k = batch_key(self._seed, -1, self._calls, stream=0x5A3)
        self._calls += 1
        return k

    def sample(self, seeds: np.ndarray, key: int | np.uint64 | None = None,
               exclude: np.ndarray | None = None) -> MiniBatch:
        """Sample a mini-batch around ``seeds`` (int [B] node ids).

        Args:
            seeds: output nodes (node-/layer-wise) or batch roots / members (subgraph samplers).
            key: uint64 stream key; ``None`` = the next key of the sampler's stream.
            exclude: sorted edge keys (:func:`~ooc.kernels.sampling.excluded_edge_keys`) never
                sampled (node-wise samplers over an in-memory graph only).

        Raises:
            ValueError: a seed is outside ``[0, N)``, or ``exclude`` where it is not supported.
        """
        k = self.next_key() if key is None else np.uint64(key)
        s = np.asarray(seeds, dtype=np.int64)
        if exclude is None:
            return self._sample(s, k)
        if not self.excludes:
            raise ValueError(f"{type(self).__name__} cannot exclude edges from its sample")
        return self._sample(s, k, exclude)

    @abc.abstractmethod
    def _sample(self, seeds: np.ndarray, key: np.uint64, exclude: np.ndarray | None = None
                ) -> MiniBatch:
        """The sample of ``seeds`` (validated int64) with stream ``key``."""

    def plan_batches(self, train_ids: np.ndarray, batch_size: int, seed: int,
                     epoch: int) -> list[np.ndarray] | None:
        """Seed batches of one epoch, or ``None`` for the loader's default plan (shuffled seeds)."""
        return None

    def on(self, indptr: np.ndarray, indices: np.ndarray,
           local_to_global: np.ndarray | None = None) -> "Sampler":
        """The same sampler (options, key stream) over another graph: the resident subgraph of a
        buffer state, in state-local ids (``local_to_global[i]``: global id of local node ``i``,
        -1 for an unused row).

        Raises:
            ValueError: the sampler cannot sample a subgraph (``buffer_mode`` False).
        """
        if not self.buffer_mode:
            raise ValueError(f"{type(self).__name__} cannot sample inside the resident partitions")
        out = copy.copy(self)
        out.indptr, out.indices = indptr, indices
        out.num_nodes = int(indptr.shape[0] - 1)
        return out


class NeighborSampler(Sampler):
    """Node-wise sampling (GraphSAGE): up to ``fanouts[h]`` in-neighbours per node at hop ``h``.

    Args:
        indptr, indices: CSC graph.
        fanouts: per layer, output layer first; ``-1`` = all neighbours.
        replace: draw with replacement (exactly ``fanout`` draws per node with neighbours).
        weights: optional float [E] non-negative edge weights aligned with ``indices``: an edge is
            drawn with probability proportional to its weight (zero = never).
        direction: ``"in"`` (messages flow along edges, default) or ``"out"`` (sample out-neighbours:
            the out-CSR is built once here, O(E) memory).
        seed: key stream seed.

    Raises:
        ValueError: bad fanouts, weights or direction.
    """

    labor = False
    excludes = True

    def __init__(self, indptr: np.ndarray, indices: np.ndarray | None, fanouts: list[int],
                 replace: bool = False, weights: np.ndarray | None = None, direction: str = "in",
                 seed: int = 0, reader: NeighborReader | None = None) -> None:
        if indices is None and reader is None:
            raise ValueError("a NeighborSampler needs indices or a neighbour-list reader")
        if reader is not None and (weights is not None or direction != "in" or self.labor):
            raise ValueError("sampling over neighbour lists read from disk is uniform node-wise "
                             "sampling of in-neighbours only (--topology disk); use --topology "
                             "memory or mmap for weighted, LABOR or out-neighbour sampling")
        self.reader = reader
        if direction not in ("in", "out"):
            raise ValueError(f"direction must be 'in' or 'out', got {direction!r}")
        fo = [int(f) for f in fanouts]
        if not fo or any(f == 0 or f < -1 for f in fo):
            raise ValueError(f"fanouts {fo} invalid: use positive counts or -1 for all")
        self.fanouts = fo
        self.replace = bool(replace)
        self.direction = direction
        if direction == "out":
            n = indptr.shape[0] - 1
            dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
            if weights is not None:
                # carry weights through the transpose by sorting edge ids the same way
                order = np.lexsort((dst, np.asarray(indices, dtype=np.int64)))
                weights = np.asarray(weights)[order]
            indptr, indices = build_csr(np.asarray(indices, dtype=np.int64), dst, n,
                                        index_dtype=indices.dtype)
        super().__init__(indptr, indices, seed)
        self.cumw = self.npos = None
        if weights is not None:
            self.cumw, self.npos = edge_weight_cdf(self.indptr, weights)

    @property
    def num_layers(self) -> int:
        return len(self.fanouts)

    def _sample(self, seeds: np.ndarray, key: np.uint64, exclude: np.ndarray | None = None
                ) -> MiniBatch:
        if self.reader is not None:
            if exclude is not None:
                raise ValueError("edge exclusion needs the topology in memory or mapped")
            return sample_blocks_lists(self.reader.read, self.num_nodes, seeds, self.fanouts, key,
                                       self.replace)
        return neighbor_sample(self.indptr, self.indices, seeds, self.fanouts, key,
                               replace=self.replace, cumw=self.cumw, npos=self.npos,
                               exclude=exclude, labor=self.labor)

    def on(self, indptr: np.ndarray, indices: np.ndarray,
           local_to_global: np.ndarray | None = None) -> "NeighborSampler":
        if self.cumw is not None or self.direction != "in":
            raise ValueError("weighted and out-neighbour sampling cannot run inside the resident "
                             "partitions")
        out = super().on(indptr, indices, local_to_global)
        out.reader = None
        return out  # type: ignore[return-value]


class LaborSampler(NeighborSampler):
    """LABOR-0 layer-neighbour sampling (DGL's ``LayerNeighborSampler``, ``importance_sampling=0``).

    Every node keeps ``fanouts[h]`` in-edges in expectation (all when its degree is at most that), but
    the candidate sources of a layer share their random variates, so far fewer distinct source nodes
    are sampled than with :class:`NeighborSampler` (Balin & Catalyurek, NeurIPS'23).
    """

    labor = True
    excludes = False

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, fanouts: list[int],
                 direction: str = "in", seed: int = 0) -> None:
        super().__init__(indptr, indices, fanouts, direction=direction, seed=seed)


class LadiesSampler(Sampler):
    """LADIES layer-wise importance sampling: ``layer_sizes[h]`` nodes per layer (output layer first).

    Blocks carry importance ``edge_weight`` (see :mod:`ooc.kernels.layerwise`).
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, layer_sizes: list[int],
                 normalize: bool = True, seed: int = 0) -> None:
        super().__init__(indptr, indices, seed)
        self.layer_sizes = [int(s) for s in layer_sizes]
        self.normalize = normalize

    @property
    def num_layers(self) -> int:
        return len(self.layer_sizes)

    def _sample(self, seeds: np.ndarray, key: np.uint64) -> MiniBatch:
        return ladies_sample(self.indptr, self.indices, seeds, self.layer_sizes, key, self.normalize)


def _subgraph_batch(indptr: np.ndarray, indices: np.ndarray, out_nodes: np.ndarray,
                    other: np.ndarray, num_layers: int, edge_norm: np.ndarray | None = None,
                    node_weight: np.ndarray | None = None,
                    positions: np.ndarray | None = None) -> MiniBatch:
    """MiniBatch of the subgraph induced by ``out_nodes`` (first) and ``other``."""
    nodes = np.concatenate([out_nodes, other]).astype(np.int64)
    ptr, src, eids = induced_subgraph(indptr, indices, nodes)
    n, b = nodes.shape[0], out_nodes.shape[0]
    w = None if edge_norm is None else edge_norm[eids].astype(np.float32)
    blocks = [Block(n, n, ptr, src, eids, w) for _ in range(num_layers - 1)]
    m_out = int(ptr[b])
    blocks.append(Block(n, b, ptr[:b + 1], src[:m_out], eids[:m_out],
                        None if w is None else w[:m_out]))
    if positions is None:
        positions = np.arange(b, dtype=np.int64)
    return MiniBatch(seeds=out_nodes.astype(np.int64), nodes=nodes, blocks=blocks,
                     seed_positions=positions, node_weight=node_weight)


class ClusterGCNSampler(Sampler):
    """ClusterGCN: a batch is the subgraph induced by whole clusters.

    ``sample(seeds)`` takes the clusters of ``seeds`` and returns their induced subgraph with the seeds
    as output nodes (first), the clusters' other nodes after them (ascending ids); every layer uses the
    same induced edges (no rescaling: the layers see the within-cluster neighbourhood).
    :meth:`plan_batches` groups ``clusters_per_batch`` random clusters per batch (the paper's stochastic
    multiple partitions) and yields their training nodes.

    Args:
        num_layers: MFG count; num_clusters: K; clusters_per_batch: q;
        cluster_of: optional int64 [N] precomputed clusters (e.g. METIS); default
            :func:`~ooc.kernels.subgraph.bfs_clusters`.
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, num_layers: int, num_clusters: int,
                 clusters_per_batch: int = 1, cluster_of: np.ndarray | None = None,
                 seed: int = 0) -> None:
        super().__init__(indptr, indices, seed)
        if clusters_per_batch < 1:
            raise ValueError(f"clusters_per_batch must be >= 1, got {clusters_per_batch}")
        self.num_layers = int(num_layers)
        self.cluster_of = (bfs_clusters(indptr, indices, num_clusters, seed) if cluster_of is None
                           else np.asarray(cluster_of, dtype=np.int64))
        self.num_clusters = int(self.cluster_of.max()) + 1 if self.cluster_of.size else 0
        self.clusters_per_batch = int(clusters_per_batch)
        self.members_ptr, self.members = cluster_members(self.cluster_of)

    def _sample(self, seeds: np.ndarray, key: np.uint64) -> MiniBatch:
        useeds, positions = unique_seeds(seeds, self.num_nodes)
        cl = np.unique(self.cluster_of[useeds])
        allm = np.concatenate([self.members[self.members_ptr[c]:self.members_ptr[c + 1]] for c in cl]
                              ) if cl.size else np.empty(0, dtype=np.int64)
        other = np.setdiff1d(allm, useeds)
        return _subgraph_batch(self.indptr, self.indices, useeds, other, self.num_layers,
                               positions=positions)

    def on(self, indptr: np.ndarray, indices: np.ndarray,
           local_to_global: np.ndarray | None = None) -> "ClusterGCNSampler":
        """The same clusters over a resident subgraph (clusters must lie inside partitions, see
        :func:`partition_clusters`; rows without a node form one unused cluster)."""
        out = super().on(indptr, indices, local_to_global)
        if local_to_global is not None:
            l2g = np.asarray(local_to_global, dtype=np.int64)
            out.cluster_of = np.where(l2g >= 0, self.cluster_of[np.maximum(l2g, 0)], self.num_clusters)
            out.members_ptr, out.members = cluster_members(out.cluster_of)
        return out  # type: ignore[return-value]

    def plan_batches(self, train_ids: np.ndarray, batch_size: int, seed: int,
                     epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([seed, epoch, 0xC6C])
        order = rng.permutation(self.num_clusters)
        tr = np.asarray(train_ids, dtype=np.int64)
        tcl = self.cluster_of[tr]
        out = []
        for i in range(0, order.shape[0], self.clusters_per_batch):
            sel = np.isin(tcl, order[i:i + self.clusters_per_batch])
            if sel.any():
                out.append(tr[sel])
        return out


def partition_clusters(indptr: np.ndarray, indices: np.ndarray, offsets: np.ndarray,
                       num_clusters: int, seed: int = 0) -> np.ndarray:
    """ClusterGCN clusters that lie inside partitions (buffer / hybrid mode): partition ``p`` (ids
    ``offsets[p]:offsets[p+1]``) is split by BFS region growing over its induced subgraph into
    ``max(1, round(num_clusters * |p| / N))`` clusters, about ``num_clusters`` in all.

    Returns:
        int64 [N] cluster ids, dense, numbered partition by partition.
    """
    n = indptr.shape[0] - 1
    out = np.empty(n, dtype=np.int64)
    base = 0
    for p in range(offsets.shape[0] - 1):
        a, b = int(offsets[p]), int(offsets[p + 1])
        nodes = np.arange(a, b, dtype=np.int64)
        k = int(min(b - a, max(1, round(num_clusters * (b - a) / max(n, 1)))))
        ptr, src, _ = induced_subgraph(indptr, indices, nodes)
        out[a:b] = base + bfs_clusters(ptr, src, k, seed + p)
        base = int(out[a:b].max()) + 1
    return out


class SaintRWSampler(Sampler):
    """GraphSAINT random-walk sampler with normalisation coefficients (Zeng et al., ICLR'20).

    ``sample(roots)`` walks ``walk_length`` steps from every root and returns the induced subgraph of the
    visited nodes; its output nodes are the subgraph's training nodes (first), with ``node_weight``
    (loss normalisation) and ``edge_weight`` on every block (aggregator normalisation ``C_v / C_uv``).
    :meth:`plan_batches` draws ``batch_size`` roots uniformly (with replacement) from the training
    nodes, ``ceil(n_train / batch_size)`` batches per epoch; the coefficients are estimated once from
    ``num_presample`` subgraphs drawn the same way (default: enough for every training node to be
    sampled ``coverage`` times on average).

    Args:
        num_layers: MFG count; train_ids: int64 training nodes (output candidates and roots);
        walk_length: steps per walk; batch_size: roots per pre-sampled subgraph;
        coverage / num_presample: pre-sampling budget; seed: key stream and pre-sampling seed.

    Not in ``--mode buffer``: the normalisation is estimated over walks on the whole graph, and
    walks confined to the resident partitions would not follow it.
    """

    buffer_mode = False

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, num_layers: int,
                 train_ids: np.ndarray, walk_length: int = 2, batch_size: int = 256,
                 coverage: float = 50.0, num_presample: int | None = None, seed: int = 0) -> None:
        super().__init__(indptr, indices, seed)
        if walk_length < 0:
            raise ValueError(f"walk_length must be >= 0, got {walk_length}")
        self.num_layers = int(num_layers)
        self.walk_length = int(walk_length)
        self.train_ids = np.unique(np.asarray(train_ids, dtype=np.int64))
        if self.train_ids.size == 0:
            raise ValueError("GraphSAINT needs training nodes")
        self.is_train = np.zeros(self.num_nodes, dtype=bool)
        self.is_train[self.train_ids] = True
        self.batch_size = int(batch_size)
        self._presample(coverage, num_presample, seed)

    def _nodes(self, roots: np.ndarray, key: np.uint64) -> tuple[np.ndarray, np.ndarray]:
        walk = random_walk_nodes(self.indptr, self.indices, roots, self.walk_length, key)
        nodes = np.unique(walk[walk >= 0])
        tr = self.is_train[nodes]
        return nodes[tr], nodes[~tr]

    def _presample(self, coverage: float, num_presample: int | None, seed: int) -> None:
        e = int(self.indptr[-1])
        self.node_count = np.zeros(self.num_nodes, dtype=np.float64)
        self.edge_count = np.zeros(e, dtype=np.float64)
        done = 0
        train_seen = 0.0
        while True:
            if num_presample is not None and done >= num_presample:
                break
            if num_presample is None and done >= 10 and train_seen >= coverage * self.train_ids.size:
                break
            key = batch_key(seed, -3, done, stream=0x5A1)
            roots = uniform_roots(self.train_ids, self.batch_size, key)
            out, other = self._nodes(roots, np.uint64(mix_key_py(int(key), 1)))
            nodes = np.concatenate([out, other])
            _, _, eids = induced_subgraph(self.indptr, self.indices, nodes)
            accumulate_counts(nodes, eids, self.node_count, self.edge_count)
            train_seen += out.size
            done += 1
        self.num_presampled = done
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))
        self.edge_norm = np.where(self.edge_count > 0,
                                  self.node_count[dst] / np.maximum(self.edge_count, 1), 1.0)
        self.node_norm = done / (np.maximum(self.node_count, 1) * self.train_ids.size)

    def _sample(self, seeds: np.ndarray, key: np.uint64) -> MiniBatch:
        unique_seeds(seeds, self.num_nodes)  # validation only
        out, other = self._nodes(seeds, key)
        return _subgraph_batch(self.indptr, self.indices, out, other, self.num_layers,
                               edge_norm=self.edge_norm,
                               node_weight=self.node_norm[out].astype(np.float32))

    def plan_batches(self, train_ids: np.ndarray, batch_size: int, seed: int,
                     epoch: int) -> list[np.ndarray]:
        nb = max(1, math.ceil(self.train_ids.size / batch_size))
        return [uniform_roots(self.train_ids, batch_size, batch_key(seed, epoch, i, stream=0x5A2))
                for i in range(nb)]


@dataclass
class LinkSampler:
    """Link-prediction batches: seed edges, negatives, and MFGs without the seed edges.

    ``sample_from_edges(src, dst)`` returns a :class:`MiniBatch` whose ``seeds`` are the unique end
    points of the positive and negative pairs, ``pairs`` [P, 2] their positions in ``seeds`` and
    ``pair_label`` 1 (positive) / 0 (negative).  Its MFGs come from ``node_sampler`` with the seed edges
    -- and, with ``exclude="reverse"``, their reverses -- removed from the graph for this batch, so the
    model cannot read the answer from the message-passing graph.

    Attributes:
        node_sampler: a :class:`NeighborSampler` (uniform or weighted, not LABOR).
        num_neg: negatives per positive; negative: ``"uniform"`` or ``"degree"`` (probability
            proportional to in-degree**``degree_power``); exclude: ``"reverse"``, ``"self"`` or
            ``None``; exclude_true_negatives: reject negatives that are true edges (either
            direction) or self-pairs (dropped after ``max_tries`` rejections).
    """

    node_sampler: NeighborSampler
    num_neg: int = 1
    negative: str = "uniform"
    degree_power: float = 0.75
    exclude: str | None = "reverse"
    exclude_true_negatives: bool = True
    max_tries: int = 32

    def __post_init__(self) -> None:
        if self.negative not in ("uniform", "degree"):
            raise ValueError(f"negative must be 'uniform' or 'degree', got {self.negative!r}")
        if self.exclude not in ("reverse", "self", None):
            raise ValueError(f"exclude must be 'reverse', 'self' or None, got {self.exclude!r}")
        if self.node_sampler.labor or self.node_sampler.direction != "in":
            raise ValueError("link sampling needs an in-neighbour NeighborSampler")
        self._cdf = (degree_cdf(self.node_sampler.indptr, self.degree_power)
                     if self.negative == "degree" else np.empty(0, dtype=np.float64))

    def sample_from_edges(self, src: np.ndarray, dst: np.ndarray,
                          key: int | np.uint64 | None = None) -> MiniBatch:
        """Batch for the seed edges ``src[i] -> dst[i]`` (int [P] each).

        Raises:
            ValueError: lengths differ or an id is outside ``[0, N)``.
        """
        ns = self.node_sampler
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        if src.shape != dst.shape:
            raise ValueError(f"src and dst lengths differ: {src.shape[0]} vs {dst.shape[0]}")
        unique_seeds(np.concatenate([src, dst]), ns.num_nodes)
        key = ns.next_key() if key is None else np.uint64(key)
        neg = negative_destinations(ns.indptr, ns.indices, src, self.num_neg, self._cdf,
                                    self.exclude_true_negatives, self.max_tries,
                                    np.uint64(mix_key_py(int(key), 0x11E6)))
        neg_src = np.repeat(src, self.num_neg)
        ok = neg >= 0
        neg_src, neg = neg_src[ok], neg[ok]
        all_ends = np.concatenate([src, dst, neg_src, neg])
        useeds, pos = unique_seeds(all_ends, ns.num_nodes)
        p = src.shape[0]
        q = neg.shape[0]
        pairs = np.stack([np.concatenate([pos[:p], pos[2 * p:2 * p + q]]),
                          np.concatenate([pos[p:2 * p], pos[2 * p + q:]])], axis=1)
        labels = np.concatenate([np.ones(p, np.float32), np.zeros(q, np.float32)])
        excl = None
        if self.exclude is not None:
            es, ed = (np.concatenate([src, dst]), np.concatenate([dst, src])) \
                if self.exclude == "reverse" else (src, dst)
            excl = excluded_edge_keys(es, ed)
        mb = ns._sample(useeds, key, exclude=excl)
        mb.pairs = pairs
        mb.pair_label = labels
        return mb


def check_sampler(name: str, mode: str, topology: str, task: str = "node") -> None:
    """Refuse a sampler in a combination where it cannot work, saying why.

    The rule: ``exact`` mode works with every sampler; ``buffer`` and ``hybrid`` with every sampler
    whose batches can be formed from the resident partitions -- node-wise, LABOR and LADIES (seeds
    of the resident partitions; ``buffer`` samples their resident subgraph), ClusterGCN (clusters
    split at partition boundaries, a batch's clusters all resident) -- and GraphSAINT in ``hybrid``
    only (its normalisation comes from walks over the whole graph).  With ``--topology disk`` the
    full-graph samplers read neighbour lists from disk, which only the node-wise uniform sampler
    does; ClusterGCN and GraphSAINT always need the whole topology (clustering, pre-sampling).
    Link prediction needs the node-wise sampler (it removes the batch's seed edges from the MFGs).

    Raises:
        ValueError: naming the option and the reason.
    """
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r} (choose from {', '.join(SAMPLERS)})")
    if task == "link" and name != "neighbor":
        raise ValueError(f"--task link samples each batch's MFGs with its seed edges removed, which "
                         f"only --sampler neighbor does (got --sampler {name})")
    if name == "saint" and mode == "buffer":
        raise ValueError("--sampler saint with --mode buffer: GraphSAINT's normalisation is "
                         "estimated over walks on the whole graph, and walks confined to the resident "
                         "partitions would not follow it; use --mode hybrid or exact")
    if topology == "disk":
        if name in ("cluster", "saint"):
            raise ValueError(f"--sampler {name} needs the whole topology in memory or mapped "
                             "(clustering / pre-sampling walk it): use --topology memory or mmap")
        if name in ("labor", "ladies") and mode != "buffer":
            raise ValueError(f"--sampler {name} with --topology disk: only the node-wise neighbor "
                             "sampler reads neighbour lists from disk; use --topology mmap (the "
                             "lists are paged in by the kernel) or --mode buffer (the resident "
                             "subgraph is in memory)")


def make_sampler(name: str, indptr: np.ndarray, indices: np.ndarray | None, fanouts: list[int], *,
                 train_ids: np.ndarray | None = None, replace: bool = False, batch_size: int = 256,
                 layer_size: int = 512, num_clusters: int = 32, clusters_per_batch: int = 4,
                 walk_length: int = 2, saint_coverage: float = 50.0, seed: int = 0,
                 reader: NeighborReader | None = None,
                 cluster_of: np.ndarray | None = None) -> Sampler:
    """Build a sampler by name (``ooc train --sampler``); the model has ``len(fanouts)`` layers.

    Args:
        name: one of :data:`SAMPLERS`.
        indptr, indices: the CSC graph (``indices`` None with ``reader``: lists read from disk).
        fanouts: neighbour/labor fanouts per layer (output layer first); the layer count for others.
        train_ids: training nodes (GraphSAINT's roots and output nodes).
        layer_size: LADIES nodes per layer; num_clusters / clusters_per_batch: ClusterGCN;
        walk_length / saint_coverage: GraphSAINT; batch_size: GraphSAINT roots per pre-sample.
        reader: neighbour-list reader (``--topology disk``; node-wise sampling only).
        cluster_of: ClusterGCN's clusters (default: BFS region growing on the graph).

    Raises:
        ValueError: unknown name, missing ``train_ids`` for ``saint``, or a sampler that needs
            ``indices`` given only a reader.
    """
    L = len(fanouts)
    if name == "neighbor":
        return NeighborSampler(indptr, indices, fanouts, replace=replace, seed=seed, reader=reader)
    if indices is None:
        raise ValueError(f"--sampler {name} needs the topology in memory or mapped")
    if name == "labor":
        return LaborSampler(indptr, indices, fanouts, seed=seed)
    if name == "ladies":
        return LadiesSampler(indptr, indices, [layer_size] * L, seed=seed)
    if name == "cluster":
        n = indptr.shape[0] - 1
        return ClusterGCNSampler(indptr, indices, L, min(num_clusters, n), clusters_per_batch,
                                 cluster_of=cluster_of, seed=seed)
    if name == "saint":
        if train_ids is None:
            raise ValueError("the saint sampler needs train_ids")
        return SaintRWSampler(indptr, indices, L, train_ids, walk_length, batch_size, saint_coverage,
                              seed=seed)
    raise ValueError(f"unknown sampler {name!r} (choose from {', '.join(SAMPLERS)})")
