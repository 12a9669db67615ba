"""Numba kernels for graph partitioning and for rewriting a dataset in partition order.

Streaming partitioning follows Fennel (Tsourakakis, Gkantsidis, Radunovic & Vojnovic, "FENNEL:
streaming graph partitioning for massive scale graphs", WSDM'14) with restreaming (Nishimura & Ugander,
"Restreaming graph partitioning", KDD'13): node ``v`` goes to the partition maximising
``|N(v) ∩ P_p| - alpha * gamma * |P_p| ** (gamma - 1)`` among partitions below their hard node
capacity and, for training nodes, below their training-node capacity (the balance constraint).  The
LDG objective (Stanton & Kliot, "Streaming graph partitioning for large distributed graphs", KDD'12),
``|N(v) ∩ P_p| * (1 - |P_p| / C)``, is available as ``objective=1``.

All kernels work on one block of CSC rows at a time, so a caller can stream the topology from disk.
"""

from __future__ import annotations

import numpy as np
from numba import njit


__all__ = ["contiguous_partitions", "stream_assign_block", "count_cut_block", "count_buckets_block",
           "relabel_lists", "bucket_sort_block", "scatter_rows"]


def contiguous_partitions(num_nodes: int, num_parts: int) -> np.ndarray:
    """int64 [P+1] offsets splitting ``[0, N)`` into ``P`` near-equal contiguous ranges.

    Raises:
        ValueError: ``P < 1`` or ``P > N`` (an empty partition is never created).
    """
    if num_parts < 1:
        raise ValueError(f"need at least 1 partition, got {num_parts}")
    if num_parts > num_nodes:
        raise ValueError(f"{num_parts} partitions for {num_nodes} nodes would leave one empty")
    return np.linspace(0, num_nodes, num_parts + 1).round().astype(np.int64)


@njit(cache=True, nogil=True)
def stream_assign_block(indptr: np.ndarray, indices: np.ndarray, start: int, assign: np.ndarray,
                        sizes: np.ndarray, train_sizes: np.ndarray, is_train: np.ndarray,
                        cap: int, train_cap: int, alpha: float, gamma: float, objective: int,
                        scratch: np.ndarray, order_key: np.uint64) -> None:
    """Assign nodes ``start .. start + len(indptr) - 2`` (one CSC block) with Fennel or LDG.

    Args:
        indptr: int64 [n+1] offsets of the block, relative: the in-neighbours of node ``start + i``
            are ``indices[indptr[i] - indptr[0]: indptr[i+1] - indptr[0]]``.
        indices: int32|int64 in-neighbour ids of the block.
        start: global id of the block's first node.
        assign: int32 [N] current assignment (-1 = unassigned); updated in place.  A node already
            assigned (restreaming pass) is first removed from its partition.
        sizes, train_sizes: int64 [P] nodes / training nodes per partition; updated in place.
        is_train: bool [N].
        cap, train_cap: hard capacities (nodes, training nodes) per partition.
        alpha, gamma: Fennel parameters; objective: 0 = Fennel, 1 = LDG.
        scratch: int64 [P] zeroed work array (left zeroed).
        order_key: tie-break salt (ties go to the smallest partition, then the lowest index).
    """
    n = indptr.shape[0] - 1
    base = indptr[0]
    num_parts = sizes.shape[0]
    for i in range(n):
        v = start + i
        old = assign[v]
        if old >= 0:
            sizes[old] -= 1
            if is_train[v]:
                train_sizes[old] -= 1
        a = indptr[i] - base
        b = indptr[i + 1] - base
        for j in range(a, b):
            u = indices[j]
            if u != v:
                p = assign[u]
                if p >= 0:
                    scratch[p] += 1
        best = -1
        best_score = -1e300
        for p in range(num_parts):
            if sizes[p] >= cap:
                continue
            if is_train[v] and train_sizes[p] >= train_cap:
                continue
            if objective == 0:
                score = scratch[p] - alpha * gamma * sizes[p] ** (gamma - 1.0)
            else:
                score = scratch[p] * (1.0 - sizes[p] / cap) - 1e-9 * sizes[p]
            if score > best_score or (score == best_score and sizes[p] < sizes[best]):
                best = p
                best_score = score
        if best < 0:  # every partition at capacity (cannot happen with cap*P >= N): least loaded
            best = 0
            for p in range(1, num_parts):
                if sizes[p] < sizes[best]:
                    best = p
        for j in range(a, b):
            u = indices[j]
            if u != v:
                p = assign[u]
                if p >= 0:
                    scratch[p] = 0
        assign[v] = best
        sizes[best] += 1
        if is_train[v]:
            train_sizes[best] += 1


@njit(cache=True, nogil=True)
def count_cut_block(indptr: np.ndarray, indices: np.ndarray, start: int, assign: np.ndarray) -> int:
    """Number of in-edges ``u -> v`` of the block's nodes with ``assign[u] != assign[v]``."""
    n = indptr.shape[0] - 1
    base = indptr[0]
    cut = 0
    for i in range(n):
        pv = assign[start + i]
        for j in range(indptr[i] - base, indptr[i + 1] - base):
            if assign[indices[j]] != pv:
                cut += 1
    return cut


@njit(cache=True, nogil=True)
def count_buckets_block(indptr: np.ndarray, indices: np.ndarray, start: int, part_of: np.ndarray,
                        counts: np.ndarray) -> None:
    """Add the block's edges to ``counts[src_part, dst_part]`` (int64 [P, P])."""
    n = indptr.shape[0] - 1
    base = indptr[0]
    for i in range(n):
        pv = part_of[start + i]
        for j in range(indptr[i] - base, indptr[i + 1] - base):
            counts[part_of[indices[j]], pv] += 1


@njit(cache=True, nogil=True)
def relabel_lists(old_indptr: np.ndarray, old_indices: np.ndarray, old_start: int, inv: np.ndarray,
                  group_start: int, group_stop: int, new_indptr: np.ndarray, out: np.ndarray) -> int:
    """Copy the in-neighbour lists of old nodes in one block whose new id falls in
    ``[group_start, group_stop)`` into ``out``, relabelled with ``inv`` and sorted.

    Args:
        old_indptr: int64 [n+1] block offsets (absolute); old_indices: the block's indices.
        old_start: old id of the block's first node.
        inv: int64 [N] new id of every old id.
        new_indptr: int64 [N+1] offsets of the new CSC; ``out`` holds edges
            ``new_indptr[group_start] .. new_indptr[group_stop]``.

    Returns:
        Number of edges written.
    """
    n = old_indptr.shape[0] - 1
    base = old_indptr[0]
    gbase = new_indptr[group_start]
    written = 0
    for i in range(n):
        u = inv[old_start + i]
        if u < group_start or u >= group_stop:
            continue
        a = old_indptr[i] - base
        b = old_indptr[i + 1] - base
        w = new_indptr[u] - gbase
        for j in range(a, b):
            out[w + j - a] = inv[old_indices[j]]
        if b - a > 1:
            out[w:w + b - a] = np.sort(out[w:w + b - a])
        written += b - a
    return written


@njit(cache=True, nogil=True)
def bucket_sort_block(indptr: np.ndarray, indices: np.ndarray, start: int, offsets: np.ndarray,
                      num_parts: int, src_out: np.ndarray, dst_out: np.ndarray) -> np.ndarray:
    """Group the in-edges of one destination partition's nodes by source partition (stable).

    Args:
        indptr: int64 [n+1] absolute offsets of the block (nodes ``start .. start+n-1``);
        indices: the block's sources.
        offsets: int64 [P+1] partition boundaries (new ids).

    Returns:
        int64 [P] edges per source partition; ``src_out``/``dst_out`` hold the edges grouped by
        source partition in ascending order, within a group in CSC order.
    """
    n = indptr.shape[0] - 1
    base = indptr[0]
    m = indptr[n] - base
    counts = np.zeros(num_parts, dtype=np.int64)
    for j in range(m):
        counts[np.searchsorted(offsets, indices[j], side="right") - 1] += 1
    pos = np.zeros(num_parts, dtype=np.int64)
    for p in range(1, num_parts):
        pos[p] = pos[p - 1] + counts[p - 1]
    for i in range(n):
        for j in range(indptr[i] - base, indptr[i + 1] - base):
            s = indices[j]
            p = np.searchsorted(offsets, s, side="right") - 1
            src_out[pos[p]] = s
            dst_out[pos[p]] = start + i
            pos[p] += 1
    return counts


@njit(cache=True, nogil=True)
def scatter_rows(block: np.ndarray, block_start: int, inv: np.ndarray, group_start: int,
                 group_stop: int, out: np.ndarray) -> int:
    """Copy rows of a block of old rows whose new id is in ``[group_start, group_stop)`` to
    ``out[new - group_start]``; rows are unsigned-integer views (bitwise copies).  Returns #rows."""
    c = 0
    for i in range(block.shape[0]):
        u = inv[block_start + i]
        if u >= group_start and u < group_stop:
            out[u - group_start] = block[i]
            c += 1
    return c
