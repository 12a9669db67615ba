"""Ordering policies: which partitions are resident together, in which order, with how many swaps.

A *buffer state* is the set of ``c`` partitions resident while a group of batches trains; an
ordering is the sequence of states of one epoch.  A *swap* loads one partition into the buffer in
place of another, so the swaps of an epoch are ``sum |S_{k+1} \\ S_k|``.

Node classification (every training node once per epoch, from a state holding its partition):

- ``sequential`` -- states slide over partitions ``0..P-1`` one swap at a time (a window);
- ``comet`` -- COMET's two-level randomised policy (Waleffe et al., "MariusGNN: resource-efficient
  out-of-core training of graph neural networks", EuroSys'23): physical partitions are grouped at
  random into logical partitions of ``group`` physical ones; the buffer holds ``c / group`` logical
  partitions; logical partitions enter in a random order and each swap evicts a random resident one.
  Different epochs see different partition combinations, which reduces the bias of training inside
  the buffer.

Both make ``P`` partition loads per epoch (``P - c`` swaps after the first fill), which is the lower
bound when every partition holds training nodes: :func:`node_swap_lower_bound`.

Link prediction (every edge bucket ``(i, j)`` once per epoch, both partitions resident):

- ``beta`` -- BETA (Mohoney et al., "Marius: learning massive graph embeddings on a single
  machine", OSDI'21): keep ``c - 1`` partitions fixed and stream every remaining partition through
  the last slot, then make ``c - 1`` of the streamed ones the next fixed set, until every pair met.
  Lower bound (each swap meets at most ``c - 1`` new partitions): :func:`bucket_swap_lower_bound`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ORDERINGS", "sequential_states", "comet_states", "beta_states", "count_swaps",
           "node_swap_lower_bound", "bucket_swap_lower_bound", "assign_buckets", "node_states"]

ORDERINGS = ("sequential", "comet")


def count_swaps(states: list[list[int]]) -> int:
    """Partitions loaded into a resident set after the first state: ``sum |S_{k+1} \\ S_k|``."""
    return sum(len(set(b) - set(a)) for a, b in zip(states, states[1:]))


def node_swap_lower_bound(num_parts: int, capacity: int) -> int:
    """Fewest swaps that make each of ``P`` partitions resident once with ``c`` slots: ``max(P-c, 0)``."""
    return max(num_parts - capacity, 0)


def bucket_swap_lower_bound(num_parts: int, capacity: int) -> int:
    """Fewest swaps so every pair of ``P`` partitions is co-resident once with ``c >= 2`` slots:
    ``ceil((P(P-1)/2 - c(c-1)/2) / (c-1))`` (the first state covers ``c(c-1)/2`` pairs, a swap at
    most ``c-1`` new ones; Marius, OSDI'21)."""
    if capacity >= num_parts:
        return 0
    if capacity < 2:
        raise ValueError("edge buckets need a buffer of at least 2 partitions")
    pairs = num_parts * (num_parts - 1) // 2 - capacity * (capacity - 1) // 2
    return -(-pairs // (capacity - 1))


def sequential_states(num_parts: int, capacity: int) -> list[list[int]]:
    """Sliding window: ``[0..c-1], [1..c], ..., [P-c..P-1]`` (one swap per step; ``P - c`` swaps).

    Raises:
        ValueError: ``capacity < 1``.
    """
    if capacity < 1:
        raise ValueError(f"buffer capacity must be >= 1 partition, got {capacity}")
    c = min(capacity, num_parts)
    return [list(range(s, s + c)) for s in range(num_parts - c + 1)]


def comet_states(num_parts: int, capacity: int, rng: np.random.Generator,
                 group: int | None = None, start: list[int] | None = None) -> list[list[int]]:
    """COMET-like two-level randomised ordering (see the module docstring).

    Args:
        num_parts: P physical partitions; capacity: c resident physical partitions.
        rng: randomness of this epoch (grouping, order, evictions).
        group: physical partitions per logical partition; default ``max(1, c // 2)`` (two logical
            partitions resident).
        start: partitions resident now (the previous epoch's last state): they form the first
            logical partitions, so an epoch begins without swaps.

    Returns:
        States (lists of physical partitions, each of size ``<= c``); every partition appears in at
        least one state and is loaded exactly once per epoch (swaps = ``P - c`` when ``group``
        divides both).

    Raises:
        ValueError: ``capacity < 1``.
    """
    if capacity < 1:
        raise ValueError(f"buffer capacity must be >= 1 partition, got {capacity}")
    c = min(capacity, num_parts)
    g = max(1, min(group if group else max(1, c // 2), c))
    perm = rng.permutation(num_parts).tolist()
    if start:
        carry = [q for q in start if 0 <= q < num_parts][:c]
        perm = carry + [q for q in perm if q not in carry]
    logical = [perm[i:i + g] for i in range(0, num_parts, g)]
    cl = max(1, c // g)
    resident = list(range(min(cl, len(logical))))
    states = [sorted(q for lp in resident for q in logical[lp])]
    for nxt in range(len(resident), len(logical)):
        out = int(rng.integers(len(resident)))
        resident[out] = nxt
        states.append(sorted(q for lp in resident for q in logical[lp]))
    return states


def node_states(ordering: str, num_parts: int, capacity: int, rng: np.random.Generator,
                group: int | None = None, start: list[int] | None = None) -> list[list[int]]:
    """States of one epoch for node classification under ``ordering`` (``sequential``|``comet``).

    ``start`` is the set resident when the epoch begins (the previous epoch's last state): the
    sequential window then runs backwards from it (a snake), COMET starts from it.
    """
    if ordering == "sequential":
        st = sequential_states(num_parts, capacity)
        if start and sorted(start) == st[-1]:
            st = st[::-1]
        return st
    if ordering == "comet":
        return comet_states(num_parts, capacity, rng, group, start)
    raise ValueError(f"unknown ordering {ordering!r}; choose from {', '.join(ORDERINGS)}")


def beta_states(num_parts: int, capacity: int, rng: np.random.Generator | None = None) -> list[list[int]]:
    """BETA ordering of buffer states for edge buckets (Marius, OSDI'21).

    Returns:
        States of ``c`` partitions such that every unordered pair of partitions (and every
        partition with itself) is co-resident in at least one state.

    Raises:
        ValueError: ``capacity < 2`` while ``P > capacity``.
    """
    if capacity >= num_parts:
        return [list(range(num_parts))]
    if capacity < 2:
        raise ValueError("BETA needs a buffer of at least 2 partitions")
    order = rng.permutation(num_parts).tolist() if rng is not None else list(range(num_parts))
    c = capacity
    states: list[list[int]] = []
    pool = order
    while len(pool) > c:
        fixed, rest = pool[:c - 1], pool[c - 1:]
        for q in rest:
            states.append(fixed + [q])
        # the next fixed set: the last c-1 streamed partitions (the last one is still resident)
        pool = rest[::-1]
    if len(pool) and (not states or not set(pool) <= set(states[-1])):
        # remaining pairs among the last pool fit in one state
        tail = states[-1] if states else []
        states.append(list(pool) + [q for q in tail if q not in pool][:c - len(pool)])
    return [sorted(s) for s in states]


def assign_buckets(states: list[list[int]], num_parts: int) -> list[list[tuple[int, int]]]:
    """Give every edge bucket ``(i, j)`` (``P * P`` of them) to the first state holding ``i`` and ``j``.

    Returns:
        Per state, its buckets.

    Raises:
        ValueError: a bucket is covered by no state.
    """
    out: list[list[tuple[int, int]]] = [[] for _ in states]
    first = np.full((num_parts, num_parts), -1, dtype=np.int64)
    for k, s in enumerate(states):
        for i in s:
            for j in s:
                if first[i, j] < 0:
                    first[i, j] = k
                    out[k].append((i, j))
    if (first < 0).any():
        i, j = np.argwhere(first < 0)[0]
        raise ValueError(f"edge bucket ({i}, {j}) is never resident")
    return out

