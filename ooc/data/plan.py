"""Epoch plans: which seeds each step trains, in which buffer state -- and their share per rank.

One plan type (:class:`ooc.contracts.Plan`) and its planners:

- :func:`plan_exact` -- a uniform shuffle of the training ids (nodes or edges) cut into batches
  (``exact`` mode; what an in-memory trainer does);
- :func:`plan_states` -- buffer states of an ordering policy (:mod:`ooc.data.ordering`) for node
  tasks in ``buffer`` / ``hybrid`` mode: every training node is trained once per epoch, in a state
  that holds its partition;
- :func:`plan_cluster_states` -- ClusterGCN in ``buffer`` / ``hybrid`` mode: groups of clusters
  (each inside one partition) trained in a state holding their partitions;
- :func:`plan_bucket_states` -- link prediction in ``buffer`` / ``hybrid`` mode: BETA states
  (Marius, OSDI'21) so that every edge bucket ``(i, j)`` is trained once per epoch with both
  partitions resident;
- :func:`plan_own` -- batches a sampler chooses itself (ClusterGCN, GraphSAINT in ``exact`` mode).

Sharding over ranks is a function of a plan (:func:`shard_plan`), not another plan type.

Every planner is a pure function of (ids, partitions, batch size, seed, epoch, state size,
ordering), so a run resumed at step ``i`` rebuilds the same plan and loads only what step ``i``
needs.
"""

from __future__ import annotations

import numpy as np

from ooc.contracts import Plan
from ooc.data.ordering import assign_buckets, beta_states, node_states

__all__ = ["plan_exact", "plan_own", "plan_states", "plan_cluster_states", "plan_bucket_states",
           "upcoming_of", "shard_plan", "deal_stratified", "plan_classes", "class_strata",
           "class_mix_distance", "uniform_class_mix", "FREE_LANES", "FREE_PICKS", "STRATIFY_CANDIDATES", "PACE_WEIGHT"]

#: Lanes of a hybrid plan's free seeds (``mix``): every batch takes its free seeds from each, so
#: they come from up to this many partitions (one or two per lane, for coalesced reads).
FREE_LANES = 8
#: Picks of a hybrid plan's free seeds per batch where they are dealt by class
#: (:func:`deal_stratified`): each pick takes ``ceil(quota / FREE_PICKS)`` seeds of one partition.
#: The class deal keeps the batches' label mix without spreading them over more partitions, and
#: fewer, larger picks make fewer, longer miss reads: on the 2 M-node bench (budget dataset / 3,
#: 10 epochs, 3 seeds) 3 picks read 13-22% fewer training bytes per epoch than 8, at the same test
#: accuracy (0.950 against 0.952 at the last epoch).
FREE_PICKS = 3


def upcoming_of(states: list[list[int]]) -> list[list[int]]:
    """Per state ``k``: the partitions that states after ``k`` load (not in state ``k``), in the
    order they are first needed (prefetch targets)."""
    upcoming = []
    for k in range(len(states)):
        seen: list[int] = []
        cur = set(states[k])
        for st in states[k + 1:]:
            for p in st:
                if p not in cur and p not in seen:
                    seen.append(p)
        upcoming.append(seen)
    return upcoming


def plan_exact(ids: np.ndarray, batch_size: int, seed: int, epoch: int) -> Plan:
    """Uniformly shuffled batches over all training ids (the in-memory reference).

    Args:
        ids: int64 [T] training node ids (or training-edge ids).
        batch_size: ids per batch (the last batch may be smaller).
        seed, epoch: the shuffle is a pure function of them.

    Raises:
        ValueError: ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    s = ids[rng.permutation(ids.shape[0])]
    batches = [s[i:i + batch_size] for i in range(0, s.shape[0], batch_size)]
    return Plan(batches, [-1] * len(batches))


def plan_own(batches: list[np.ndarray]) -> Plan:
    """A plan of batches a sampler chose itself (``Sampler.plan_batches``), no buffer states."""
    return Plan(list(batches), [-1] * len(batches))


def plan_states(train_ids: np.ndarray, part_of: np.ndarray, num_parts: int, state_slots: int,
                batch_size: int, seed: int, epoch: int, ordering: str, group: int,
                start: list[int] | None = None, mix: float = 0.0,
                classes: np.ndarray | None = None) -> Plan:
    """Buffer-state plan for ``buffer`` and ``hybrid`` mode.

    States come from the ordering policy (beginning from ``start``, the partitions resident when
    the epoch begins); every training node is assigned to one state holding its partition
    (uniformly among those); the seeds of a state are shuffled together, so every batch mixes
    seeds of all the state's partitions.  Seeds wait in a pool while their partition stays
    resident in the next state, so batches are full (``batch_size``) except where the seeds of a
    leaving partition do not fill one; such a partial batch is packed into the state's other
    batches (near-equal sizes, none over ``batch_size``) while the room left in all batches still
    holds the ``mix`` seeds, so an epoch has about as many batches as :func:`plan_exact`'s.

    Args:
        train_ids: int64 [T] training node ids; part_of: int64 [T] their partitions.
        num_parts: P; state_slots: partitions resident per state (``>= P``: one state holding
            every partition -- the plan is then :func:`plan_exact`'s, batch for batch).
        batch_size, seed, epoch: as in :func:`plan_exact`.
        ordering, group: the ordering policy and COMET's logical partition size.
        start: partitions resident when the epoch begins.
        mix: fraction in ``[0, 1)`` of the training nodes that are not bound to a state but
            spread over all batches (``hybrid`` only: full-graph sampling can train any seed; their
            rows are mostly misses).  Mixing makes batch label distributions closer to i.i.d. at
            the price of reads.  The free seeds are ordered partition by partition (a random
            partition order), cut into :data:`FREE_LANES` lanes and dealt round-robin, so each
            batch's come from every lane -- up to that many partitions, one or two per lane -- and
            their misses coalesce within each.
        classes: int64 [T] the class of each training node (single-label node classification;
            negative: unlabelled) or None.  Given, COMET groups partitions into logical ones
            stratified by class (:func:`ooc.data.ordering.stratified_groups`), so each state's
            seeds are near the training set's class mix.  Given with ``mix``, the free seeds
            are dealt by :func:`deal_stratified` instead of the lanes: each batch takes them,
            from about :data:`FREE_PICKS` partitions, those whose free seeds
            best fill its classes' shortfall against the training set's class mix (stratified batches: where
            partitions follow classes, a state's seeds are a few classes, and a model trained on
            such runs of batches ends each epoch fitted to the last ones).

    Returns:
        The plan; ``batch_state[i]`` is the state batch ``i`` trains in.

    Raises:
        ValueError: ``mix`` outside ``[0, 1)`` or ``batch_size < 1``.
    """
    if not 0.0 <= mix < 1.0:
        raise ValueError(f"mix must be in [0, 1), got {mix}")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    if state_slots >= num_parts:  # everything resident: exactly the in-memory (exact) batches
        p = plan_exact(train_ids, batch_size, seed, epoch)
        return Plan(p.batches, [0] * len(p.batches), [list(range(num_parts))], [[]])
    rng = np.random.default_rng([seed, epoch, 0xB0FF])
    strata = None if classes is None else class_strata(part_of, classes, num_parts)
    states = node_states(ordering, num_parts, state_slots, rng, group, start, strata)
    holders: list[list[int]] = [[] for _ in range(num_parts)]
    for k, st in enumerate(states):
        for p in st:
            holders[p].append(k)
    t = train_ids.shape[0]
    free = np.zeros(t, dtype=np.bool_)
    if mix > 0:
        free[rng.permutation(t)[:int(round(mix * t))]] = True
    choice = np.full(t, -1, dtype=np.int64)
    for p in range(num_parts):
        sel = np.flatnonzero((part_of == p) & ~free)
        if sel.size:
            h = np.asarray(holders[p], dtype=np.int64)
            choice[sel] = h[rng.integers(0, h.shape[0], sel.shape[0])]
    # batches drawn from a pool of pending seeds, all of resident partitions: at state k the pool
    # gets the seeds assigned to k; seeds whose partition leaves with the next state train now (a
    # batch they do not fill is topped up with seeds assigned to later states whose partitions are
    # resident now), the others wait while the pool holds less than a batch
    bound = max(1, batch_size - int(round(mix * batch_size)))  # state seeds per batch
    cuts: list[np.ndarray] = []
    batch_state: list[int] = []
    cut_state: list[int] = []  # states that cut batches, and their batches two ways:
    state_cuts: list[list[np.ndarray]] = []   # chunks of `bound` seeds, the last one partial
    packed_cuts: list[list[np.ndarray]] = []  # near-equal, partial chunk folded in
    used = free.copy()
    pool = np.empty(0, dtype=np.int64)
    member = np.zeros(num_parts, dtype=np.bool_)
    for k in range(len(states)):
        new = np.flatnonzero((choice == k) & ~used)
        used[new] = True
        pool = np.concatenate([pool, new])
        if k + 1 < len(states):
            member[:] = False
            member[states[k + 1]] = True
            expiring = ~member[part_of[pool]]
        else:
            expiring = np.ones(pool.shape[0], dtype=np.bool_)
        n_exp = int(expiring.sum())
        m = max(-(-n_exp // bound), pool.shape[0] // bound)
        if m == 0:
            continue
        cut_state.append(k)
        others = np.flatnonzero(~expiring)
        extra = others[rng.permutation(others.shape[0])[:max(m * bound - n_exp, 0)]]
        go = pool[np.concatenate([np.flatnonzero(expiring), extra])]
        left = np.ones(pool.shape[0], dtype=np.bool_)
        left[np.concatenate([np.flatnonzero(expiring), extra])] = False
        pool = pool[left]
        short = m * bound - go.shape[0]
        if short > 0:  # top up from seeds assigned to later states, partitions resident now
            member[:] = False
            member[states[k]] = True
            cand = np.flatnonzero(~used & member[part_of])
            top = cand[rng.permutation(cand.shape[0])[:short]]
            used[top] = True
            go = np.concatenate([go, top])
        go = go[rng.permutation(go.shape[0])]
        state_cuts.append([go[i:i + bound] for i in range(0, go.shape[0], bound)])
        # the same seeds in near-equal batches, a partial one folded into the others while that
        # keeps every batch <= batch_size: fewer, fuller batches
        n_packed = max(-(-go.shape[0] // batch_size), int(round(go.shape[0] / bound)), 1)
        packed_cuts.append(np.array_split(go, n_packed))
    fr = np.flatnonzero(free)
    # a state's batches are packed while the room left in all batches still holds every free seed
    # (so no batch ends up over batch_size); states are taken in order
    room = sum(batch_size - c.shape[0] for cs in state_cuts for c in cs)
    for k, plain, packed in zip(cut_state, state_cuts, packed_cuts):
        cs = plain
        if len(packed) < len(plain) and room - (len(plain) - len(packed)) * batch_size >= fr.size:
            room -= (len(plain) - len(packed)) * batch_size
            cs = packed
        cuts.extend(cs)
        batch_state.extend([k] * len(cs))
    if not cuts:  # every seed free (tiny training sets)
        cuts, batch_state = [np.empty(0, dtype=np.int64)], [0]
    if fr.size and classes is not None:
        cuts = deal_stratified(cuts, fr, part_of, np.asarray(classes), batch_size, rng)
    elif fr.size:  # free seeds fill every batch up to batch_size (quotas by room, largest remainder)
        # partition by partition in a random order (random within a partition), cut into
        # FREE_LANES lanes dealt round-robin: a batch's free seeds come from every lane (up to
        # FREE_LANES partitions far apart in that order, so its label mix approaches the graph's
        # where partitions follow classes) but from one or two partitions per lane, so their
        # neighbourhoods' misses cluster in a few partition ranges and coalesce into long reads
        fr = fr[rng.permutation(fr.shape[0])]
        fr = fr[np.argsort(rng.permutation(num_parts)[part_of[fr]], kind="stable")]
        lanes = min(FREE_LANES, num_parts)
        key = np.empty(fr.shape[0], dtype=np.int64)
        for lane, idx in enumerate(np.array_split(np.arange(fr.shape[0]), lanes)):
            key[idx] = np.arange(idx.shape[0], dtype=np.int64) * lanes + lane
        fr = fr[np.argsort(key, kind="stable")]
        quota = _free_quotas(cuts, fr.shape[0], batch_size)
        pos = np.concatenate([[0], np.cumsum(quota)])
        for i in range(len(cuts)):
            c = np.concatenate([cuts[i], fr[pos[i]:pos[i + 1]]])
            cuts[i] = c[rng.permutation(c.shape[0])]
    batches = [train_ids[c] for c in cuts]
    return Plan(batches, batch_state, states, upcoming_of(states))


def class_strata(part_of: np.ndarray, classes: np.ndarray, num_parts: int) -> np.ndarray:
    """int64 [P, K+1]: training nodes per partition (``part_of``: int64 [T]) and class
    (``classes``: int64 [T]; column 0 counts the unlabelled, negative ones, column ``c + 1`` class
    ``c``) -- the strata :func:`ooc.data.ordering.comet_states` groups partitions by."""
    cls = np.where(np.asarray(classes) < 0, -1, np.asarray(classes)).astype(np.int64) + 1
    k = int(cls.max()) + 1 if cls.size else 1
    flat = np.asarray(part_of, dtype=np.int64) * k + cls
    return np.bincount(flat, minlength=num_parts * k).reshape(num_parts, k)


def plan_classes(labels: np.ndarray | None, ids: np.ndarray) -> np.ndarray | None:
    """The classes :func:`plan_states` stratifies a hybrid plan's free seeds by: int64 [len(ids)]
    labels of ``ids`` where ``labels`` is one integer class per node ([N]); None for multi-label
    ([N, C]) or float targets, or no labels."""
    if labels is None or np.ndim(labels) != 1 \
            or not np.issubdtype(np.asarray(labels[:0]).dtype, np.integer):
        return None
    return np.asarray(labels[ids]).astype(np.int64)


def class_mix_distance(batches: list[np.ndarray], ids: np.ndarray, classes: np.ndarray) -> float:
    """How far a plan's batches are from the training set's label mix: the mean over batches of
    the total-variation distance ``0.5 * sum_c |f_b(c) - f(c)|`` between a batch's class fractions
    ``f_b`` and those of all ``ids`` (``f``), in [0, 1].  i.i.d. batches of ``B`` seeds are at
    ``O(sqrt(C / B))`` already (:func:`plan_exact`'s batches measure it); a buffer state of a few
    class-aligned partitions puts most of a batch in a few classes.

    Args:
        batches: int64 node ids per batch, each id one of ``ids``.
        ids: int64 [T] the training ids; classes: int64 [T] their classes (:func:`plan_classes`;
            negative: unlabelled, counted as one class of its own).

    Returns:
        The mean distance (0.0 without non-empty batches).

    Raises:
        ValueError: a batch holds an id that is not in ``ids``.
    """
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    sids = ids[order]
    scls = np.where(np.asarray(classes, dtype=np.int64) < 0, -1, classes)[order] + 1
    k = int(scls.max()) + 1 if scls.size else 1
    g = np.bincount(scls, minlength=k) / max(scls.shape[0], 1)
    dists = []
    for b in batches:
        if b.shape[0] == 0:
            continue
        at = np.searchsorted(sids, b)
        if (at >= sids.shape[0]).any() or (sids[np.minimum(at, sids.shape[0] - 1)] != b).any():
            raise ValueError("a batch holds an id that is not a training id")
        f = np.bincount(scls[at], minlength=k) / b.shape[0]
        dists.append(0.5 * float(np.abs(f - g).sum()))
    return float(np.mean(dists)) if dists else 0.0



def uniform_class_mix(ids: np.ndarray, batch_size: int, seed: int, classes: np.ndarray) -> float:
    """:func:`class_mix_distance` of uniform batches (epoch 0 of :func:`plan_exact`): the figure a
    state plan's label mix is measured from (batches of ``batch_size`` of training ``ids``, int64
    [T], their ``classes``, int64 [T])."""
    return class_mix_distance(plan_exact(ids, batch_size, seed, 0).batches, ids, classes)


def _free_quotas(cuts: list[np.ndarray], num_free: int, batch_size: int) -> np.ndarray:
    """int64 [len(cuts)]: free seeds per batch, in proportion to the room each has up to
    ``batch_size`` (largest remainder; all batches alike where none has room)."""
    room = np.array([max(batch_size - c.shape[0], 0) for c in cuts], dtype=np.float64)
    if room.sum() <= 0:  # every batch full (a tiny mix): spread over all, a seed or so over
        room[:] = 1.0
    want = room * (num_free / room.sum())
    quota = np.floor(want).astype(np.int64)
    rest = num_free - int(quota.sum())
    if rest:
        quota[np.argsort(quota - want, kind="stable")[:rest]] += 1
    return quota


#: Partitions scored for each pick of :func:`deal_stratified` (a random sample of those with free
#: seeds left): bounds the work per batch on graphs of thousands of partitions.
STRATIFY_CANDIDATES = 64
#: Weight of a partition's pacing (how far behind its free seeds are) against the class shortfall
#: its seeds fill, in :func:`deal_stratified`.
PACE_WEIGHT = 0.5


def deal_stratified(cuts: list[np.ndarray], free: np.ndarray, part_of: np.ndarray,
                    classes: np.ndarray, batch_size: int, rng: np.random.Generator
                    ) -> list[np.ndarray]:
    """Deal the free seeds of a hybrid plan over its batches, stratified by class.

    Each batch (in a random order) gets its quota of free seeds (:func:`_free_quotas`) in picks of
    ``ceil(quota / FREE_PICKS)`` seeds from one partition, so they come from about
    :data:`FREE_PICKS` partitions and their misses coalesce.  A pick scores up to
    :data:`STRATIFY_CANDIDATES` partitions with free seeds left by how well their seeds' classes
    fill the batch's shortfall ``d = target - have`` (``target``: the training set's class
    fractions times the batch size, ``have``: the classes the batch holds so far), plus a pacing
    term (free seeds left over batches left) so that no partition's seeds pile up at the end of
    the epoch; it takes the chosen partition's seeds of the classes most short first.  The same
    idea as stratified mini-batches (class proportions kept per batch), applied to the seeds the
    buffer does not bind.

    Args:
        cuts: per batch, int64 indices into the training ids of its state seeds.
        free: int64 indices into the training ids of the free seeds.
        part_of: int64 [T] partition of each training node; classes: int64 [T] its class
            (negative: unlabelled, one class of its own).
        batch_size: seeds per full batch; rng: the plan's random stream.

    Returns:
        ``cuts`` with each batch's free seeds appended, every batch shuffled (each free seed in
        exactly one batch).
    """
    cls = np.asarray(classes, dtype=np.int64)
    cls = np.where(cls < 0, -1, cls) + 1  # unlabelled -> 0
    k = int(cls.max()) + 1 if cls.size else 1
    g = np.bincount(cls, minlength=k).astype(np.float64)
    g /= max(g.sum(), 1.0)
    quota = _free_quotas(cuts, free.shape[0], batch_size)
    # pools: the free seeds sorted by (partition, class), random within; block (q, c) of the pool
    # runs from start[q, c]; left[q, c] seeds of it are not dealt yet (taken from its end)
    num_parts = int(part_of[free].max()) + 1
    free = free[rng.permutation(free.shape[0])]
    free = free[np.lexsort((cls[free], part_of[free]))]
    key = part_of[free] * k + cls[free]
    left = np.bincount(key, minlength=num_parts * k).reshape(num_parts, k)
    start = np.concatenate([[0], np.cumsum(left.reshape(-1))[:-1]]).reshape(num_parts, k)
    rem = left.sum(1)
    live = np.flatnonzero(rem)
    out: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(cuts)
    nb = len(cuts)
    # batches dealt in a random order: what the greedy deal leaves unmatched at its end (the
    # last pools' classes) falls on batches anywhere in the epoch, not on the epoch's last ones
    for i, bi in enumerate(rng.permutation(nb).tolist()):
        c = cuts[bi]
        n = int(quota[bi])
        have = np.bincount(cls[c], minlength=k).astype(np.float64)
        target = g * (c.shape[0] + n)
        per = max(1, -(-n // FREE_PICKS))
        taken = []
        while n > 0 and live.size:
            d = np.maximum(target - have, 0.0)
            cand = live if live.shape[0] <= STRATIFY_CANDIDATES else \
                live[rng.choice(live.shape[0], STRATIFY_CANDIDATES, replace=False)]
            r = rem[cand].astype(np.float64)
            # shortfall a seed of the partition fills (0..1), and how far behind its pool is:
            # 1 = on pace to be dealt by the last batch
            fill = (left[cand] @ d) / r / max(float(d.max()), 1e-9)
            behind = r * live.shape[0] / (per * FREE_PICKS * (nb - i))
            q = int(cand[int(np.argmax(fill + PACE_WEIGHT * behind))])
            m = min(per, n, int(rem[q]))
            cs = np.flatnonzero(left[q])
            for cc in cs[np.argsort(-d[cs], kind="stable")]:  # the classes most short first
                if m == 0:
                    break
                j = min(m, int(left[q, cc]))
                if j:
                    b = start[q, cc] + left[q, cc]
                    taken.append(free[b - j:b])
                    left[q, cc] -= j
                    have[cc] += j
                    m -= j
                    n -= j
                    rem[q] -= j
            if rem[q] == 0:
                live = live[live != q]
        if taken:
            c = np.concatenate([c, *taken])
        out[bi] = c[rng.permutation(c.shape[0])]
    return out


def plan_cluster_states(cluster_of_train: np.ndarray, train_ids: np.ndarray, part_of_cluster: np.ndarray,
                        num_parts: int, state_slots: int, clusters_per_batch: int, seed: int,
                        epoch: int, ordering: str, group: int, start: list[int] | None = None) -> Plan:
    """ClusterGCN batches over buffer states: every cluster (inside one partition) is given to one
    state holding its partition (uniformly among those); a state's clusters are shuffled and
    grouped ``clusters_per_batch`` at a time; a batch's seeds are the training nodes of its group.

    Args:
        cluster_of_train: int64 [T] cluster of every training node; train_ids: int64 [T].
        part_of_cluster: int64 [K] partition of every cluster.
        num_parts, state_slots, ordering, group, start: as :func:`plan_states`.
        clusters_per_batch: clusters per batch (ClusterGCN's q).

    Returns:
        The plan (clusters without training nodes make no batch).
    """
    rng = np.random.default_rng([seed, epoch, 0xC6C5])
    if state_slots >= num_parts:
        states = [list(range(num_parts))]
    else:
        states = node_states(ordering, num_parts, state_slots, rng, group, start)
    holders: list[list[int]] = [[] for _ in range(num_parts)]
    for k, st in enumerate(states):
        for p in st:
            holders[p].append(k)
    k_of = np.array([holders[int(p)][int(rng.integers(len(holders[int(p)])))] for p in part_of_cluster],
                    dtype=np.int64)
    order = np.argsort(cluster_of_train, kind="stable")
    cl_sorted = cluster_of_train[order]
    nk = part_of_cluster.shape[0]
    bounds = np.searchsorted(cl_sorted, np.arange(nk + 1))
    batches: list[np.ndarray] = []
    batch_state: list[int] = []
    for k in range(len(states)):
        mine = np.flatnonzero(k_of == k)
        mine = mine[rng.permutation(mine.shape[0])]
        for i in range(0, mine.shape[0], clusters_per_batch):
            grp = mine[i:i + clusters_per_batch]
            seeds = np.concatenate([train_ids[order[bounds[c]:bounds[c + 1]]] for c in grp]) \
                if grp.size else np.empty(0, dtype=np.int64)
            if seeds.size:
                batches.append(seeds)
                batch_state.append(k)
    return Plan(batches, batch_state, states, upcoming_of(states))


def plan_bucket_states(part_src: np.ndarray, part_dst: np.ndarray, num_parts: int, state_slots: int,
                       batch_size: int, seed: int, epoch: int) -> Plan:
    """Link prediction over buffer states: BETA states of ``state_slots`` partitions (every pair of
    partitions co-resident at least once), every training edge given to the first state holding
    both its endpoints' partitions (its edge bucket ``(i, j)``), a state's edges shuffled and cut
    into batches of ``batch_size`` (the last of a state may be smaller).

    Args:
        part_src, part_dst: int64 [M] partitions of the endpoints of every training edge; the
            batches hold edge ids ``0..M-1``.
        num_parts: P; state_slots: partitions resident per state (>= 2 unless everything fits).

    Raises:
        ValueError: ``state_slots < 2`` while ``P > state_slots`` (a bucket needs both partitions),
            or ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    m = part_src.shape[0]
    if state_slots >= num_parts:
        p = plan_exact(np.arange(m, dtype=np.int64), batch_size, seed, epoch)
        return Plan(p.batches, [0] * len(p.batches), [list(range(num_parts))], [[]])
    if state_slots < 2:
        raise ValueError("link prediction in buffer/hybrid mode needs 2 partitions resident at once "
                         "(both endpoints of an edge bucket): raise --memory-budget or use more "
                         "partitions")
    rng = np.random.default_rng([seed, epoch, 0xBE7A])
    states = beta_states(num_parts, state_slots, rng)
    per_state = assign_buckets(states, num_parts)
    first = np.full((num_parts, num_parts), -1, dtype=np.int64)
    for k, buckets in enumerate(per_state):
        for i, j in buckets:
            first[i, j] = k
    k_of = first[part_src, part_dst]
    batches: list[np.ndarray] = []
    batch_state: list[int] = []
    order = np.argsort(k_of, kind="stable")
    bounds = np.searchsorted(k_of[order], np.arange(len(states) + 1))
    for k in range(len(states)):
        mine = order[bounds[k]:bounds[k + 1]]
        mine = mine[rng.permutation(mine.shape[0])]
        for i in range(0, mine.shape[0], batch_size):
            batches.append(mine[i:i + batch_size].astype(np.int64))
            batch_state.append(k)
    return Plan(batches, batch_state, states, upcoming_of(states))


def _split(seeds: np.ndarray, parts: int, r: int) -> tuple[np.ndarray, int]:
    """Slice ``r`` of ``parts`` near-equal contiguous slices (the first ``g % parts`` one longer),
    and its length; an empty slice becomes one real wrap-around id (a padding share)."""
    g = int(seeds.shape[0])
    q, rem = divmod(g, parts)
    start = r * q + min(r, rem)
    n = q + (1 if r < rem else 0)
    if n > 0:
        return seeds[start:start + n], n
    if g == 0:
        return seeds[:0], 0
    return seeds[r % g:r % g + 1], 0


def shard_plan(plan: Plan, rank: int, world: int, local_world: int | None = None) -> Plan:
    """Rank ``rank``'s share of a global plan (every rank calls it on the same plan).

    - One machine, or a plan without buffer states (``exact``): the global batch of step ``i``
      (``g`` seeds) is cut into ``world`` near-equal contiguous slices, one per rank, keyed by the
      global batch index, so the union of the ranks' samples is exactly the single-process sample.
    - Several machines with buffer states (``buffer`` / ``hybrid``): the batches (built with
      ``local_world`` x the per-rank batch size) are divided into ``num_machines`` contiguous
      ranges of ``ceil(n / num_machines)`` steps -- each machine visits its own run of states --
      and each machine's batch is cut over its local ranks.  A machine with fewer batches pads
      with weight-0 steps.

    Every rank performs the same number of steps; an empty share trains one real wrap-around id
    with loss weight 0 (it joins every all-reduce and contributes nothing).  The weight of a share
    of ``n_r`` seeds is ``n_r * world / G`` (``G``: seeds of the step over all ranks), so with
    DDP's gradient averaging the update is the gradient of the step's mean loss over all ranks.

    Args:
        plan: the global plan; rank, world: this rank and the world size.
        local_world: ranks per machine (default ``world``: one machine).

    Raises:
        ValueError: ``world`` is not a multiple of ``local_world``.
    """
    local_world = world if local_world is None else local_world
    if world % local_world:
        raise ValueError(f"world size {world} is not a multiple of {local_world} ranks per machine")
    machines = world // local_world
    n = len(plan.batches)
    with_states = any(s >= 0 for s in plan.batch_state) and len(plan.states) > 1
    batches, weights, real, keys, bstate = [], [], [], [], []
    if machines == 1 or not with_states:
        for i, seeds in enumerate(plan.batches):
            mine, cnt = _split(seeds, world, rank)
            g = int(seeds.shape[0])
            batches.append(mine)
            real.append(cnt)
            weights.append(cnt * world / g if g else 0.0)
            keys.append(plan.key(i))
            bstate.append(plan.batch_state[i])
        return Plan(batches, bstate, plan.states, plan.upcoming, weights, real, keys)
    steps = -(-n // machines)
    m, lr = divmod(rank, local_world)
    lo = m * steps
    for t in range(steps):
        sizes = [int(plan.batches[k * steps + t].shape[0]) if k * steps + t < n else 0
                 for k in range(machines)]
        total = sum(sizes)
        j = lo + t
        pad = j >= n
        src = min(j, n - 1) if not pad else (min(lo, n - 1) if lo < n else n - 1)
        seeds = plan.batches[src]
        mine, cnt = _split(seeds, local_world, lr)
        if pad:
            cnt = 0
        batches.append(mine)
        real.append(cnt)
        weights.append(cnt * world / total if total else 0.0)
        keys.append(plan.key(src))
        bstate.append(plan.batch_state[src])
    return Plan(batches, bstate, plan.states, plan.upcoming, weights, real, keys)
