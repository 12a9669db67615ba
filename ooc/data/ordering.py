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
  the buffer.  Where the training nodes' classes are known (``strata``), the grouping is
  stratified instead of uniform (:func:`stratified_groups`): each logical partition takes, in
  turn, the remaining partition whose training nodes best fill its shortfall against the training
  set's class mix, so a state's seeds -- and the batches cut from them -- are near that mix even
  where partitions follow classes.  It moves nothing: the same partitions are loaded as often.

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

__all__ = ["ORDERINGS", "sequential_states", "comet_states", "stratified_groups", "beta_states",
           "count_swaps", "node_swap_lower_bound", "bucket_swap_lower_bound", "assign_buckets", "node_states"]

ORDERINGS = ("sequential", "comet")
#: Partitions scored per pick of :func:`stratified_groups` (a random sample of those left): bounds
#: its work to ``O(P * GROUP_CANDIDATES * K)`` on graphs of thousands of partitions.
GROUP_CANDIDATES = 256


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


def stratified_groups(parts: list[int], group: int, strata: np.ndarray,
                      rng: np.random.Generator) -> list[list[int]]:
    """Group ``parts`` into logical partitions of ``group`` (the last may be smaller) whose
    training nodes' class mixes are each near the mix of all of them.

    Logical partitions pick in rounds, in a random order each round: each takes, among up to
    :data:`GROUP_CANDIDATES` remaining partitions, the one whose training nodes best fill its
    shortfall ``d = max(f * n / L - have, 0)`` (``f``: the class fractions over ``parts``,
    ``n / L``: training nodes per logical partition, ``have``: its class counts so far), scored as
    ``counts @ d / |counts|`` (ties broken at random).  The greedy stratified assignment of
    stratified sampling, applied to whole partitions.

    Args:
        parts: partition ids to group; group: partitions per logical partition (``>= 1``).
        strata: [P, K] training nodes of each partition (rows indexed by partition id) per class.
        rng: randomness of the epoch (round orders, candidate samples, ties).

    Returns:
        Logical partitions (lists of partition ids), each id of ``parts`` in exactly one.
    """
    n = len(parts)
    if n == 0:
        return []
    nl = -(-n // group)
    size = np.full(nl, group, dtype=np.int64)
    size[-1] = n - group * (nl - 1)
    ids = np.asarray(parts, dtype=np.int64)
    cnt = np.asarray(strata, dtype=np.float64)[ids]
    tot = cnt.sum(0)
    want = tot / nl  # class counts of a logical partition at the overall mix
    seeds = cnt.sum(1)
    have = np.zeros((nl, cnt.shape[1]))
    left = np.ones(n, dtype=np.bool_)
    groups: list[list[int]] = [[] for _ in range(nl)]
    for r in range(group):
        for lp in rng.permutation(nl).tolist():
            if r >= size[lp]:
                continue
            cand = np.flatnonzero(left)
            if cand.shape[0] > GROUP_CANDIDATES:
                cand = cand[rng.choice(cand.shape[0], GROUP_CANDIDATES, replace=False)]
            d = np.maximum(want - have[lp], 0.0)
            fill = (cnt[cand] @ d) / np.maximum(seeds[cand], 1.0)
            j = int(cand[int(np.argmax(fill + 1e-9 * rng.random(cand.shape[0])))])
            left[j] = False
            have[lp] += cnt[j]
            groups[lp].append(int(ids[j]))
    return groups


def comet_states(num_parts: int, capacity: int, rng: np.random.Generator,
                 group: int | None = None, start: list[int] | None = None,
                 strata: np.ndarray | None = None) -> list[list[int]]:
    """COMET-like two-level randomised ordering (see the module docstring).

    Args:
        num_parts: P physical partitions; capacity: c resident physical partitions.
        rng: randomness of this epoch (grouping, order, evictions).
        group: physical partitions per logical partition; default ``max(1, c // 2)`` (two logical
            partitions resident).
        start: partitions resident now (the previous epoch's last state): they form the first
            logical partitions, so an epoch begins without swaps.
        strata: [P, K] training nodes per partition and class, or None: given, the partitions are
            grouped by :func:`stratified_groups` (those of ``start`` among themselves, the others
            in a random order of logical partitions), else uniformly at random.

    Returns:
        States (lists of physical partitions, each of size ``<= c``); every partition appears in at
        least one state and is loaded exactly once per epoch (swaps = ``P - c`` when ``group``
        divides both).

    Raises:
        ValueError: ``capacity < 1``, or ``strata`` without one row per partition.
    """
    if capacity < 1:
        raise ValueError(f"buffer capacity must be >= 1 partition, got {capacity}")
    if strata is not None and np.shape(strata)[0] != num_parts:
        raise ValueError(f"strata has {np.shape(strata)[0]} rows for {num_parts} partitions")
    c = min(capacity, num_parts)
    g = max(1, min(group if group else max(1, c // 2), c))
    perm = rng.permutation(num_parts).tolist()
    carry = [q for q in start if 0 <= q < num_parts][:c] if start else []
    if carry:
        held = set(carry)
        perm = carry + [q for q in perm if q not in held]
    if strata is None:
        logical = [perm[i:i + g] for i in range(0, num_parts, g)]
    else:
        first = stratified_groups(carry, g, strata, rng)
        rest = stratified_groups(perm[len(carry):], g, strata, rng)
        logical = first + [rest[i] for i in rng.permutation(len(rest)).tolist()]
    cl = max(1, c // g)
    resident = list(range(min(cl, len(logical))))
    states = [sorted(q for lp in resident for q in logical[lp])]
    for nxt in range(len(resident), len(logical)):
        out = int(rng.integers(len(resident)))
        resident[out] = nxt
        states.append(sorted(q for lp in resident for q in logical[lp]))
    return states


def node_states(ordering: str, num_parts: int, capacity: int, rng: np.random.Generator,
                group: int | None = None, start: list[int] | None = None,
                strata: np.ndarray | None = None) -> list[list[int]]:
    """States of one epoch for node classification under ``ordering`` (``sequential``|``comet``).

    ``start`` is the set resident when the epoch begins (the previous epoch's last state): the
    sequential window then runs backwards from it (a snake), COMET starts from it.  ``strata``
    ([P, K] training nodes per partition and class) stratifies COMET's grouping; the sequential
    window has no grouping and ignores it.
    """
    if ordering == "sequential":
        st = sequential_states(num_parts, capacity)
        if start and sorted(start) == st[-1]:
            st = st[::-1]
        return st
    if ordering == "comet":
        return comet_states(num_parts, capacity, rng, group, start, strata)
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

