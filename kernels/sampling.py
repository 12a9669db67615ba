"""Node-wise (GraphSAGE) neighbour sampling with relabelling, as Numba kernels.

``sample_blocks`` draws, hop by hop, up to ``fanout[h]`` in-neighbours of every destination node
(uniformly or with per-edge probabilities, with or without replacement; ``-1`` = all neighbours) and
builds the per-layer message-flow graphs (MFGs, "blocks" in DGL's terms; Hamilton et al., "Inductive
representation learning on large graphs", NeurIPS'17).

Everything between the seeds and the finished MFGs runs inside one Numba function (no Python between
hops), with ``prange`` over the frontier for sampling and over hash-table shards for relabelling:

- **sampling**: Robert Floyd's algorithm for ``k`` distinct offsets out of ``deg`` (uniform, without
  replacement); Efraimidis & Spirakis' exponential keys (``-log U / w``, the ``k`` smallest; "Weighted
  random sampling with a reservoir", IPL 2006) for edge-weighted draws without replacement; inverse-CDF
  binary search over per-node cumulative weights with replacement.
- **uniform draws** run in two passes per block of frontier nodes: the edge positions of all draws
  (arithmetic on each node's start and degree, read once per hop), then a tight gather
  ``indices[pos]`` whose cache misses the CPU overlaps; hops expected to draw few edges stay on the
  calling thread.
- **relabelling**: new nodes are numbered in first-seen order, found by one of three equivalent
  methods -- a dense id map (``N`` up to 2**21: fits the caches), a sort of the hop's ids (radix sort
  of ``(id, edge)`` keys merged with the sorted ids of the nodes so far: sequential passes only, for
  larger graphs, where a map lookup per edge is a cache miss), or, for ids of 2**31 and above, one
  open-addressing hash table per worker thread (generation-tagged entries, so nothing is cleared
  between batches), split into shards by the top bits of a Fibonacci hash.  Map and table shards are
  filled by one thread each, scanning the hop's sampled ids in order, so the first occurrence of
  every new node is found without atomics; a sequential pass then numbers new nodes in first-seen
  order.  The result (local ids, node order) is the same for any method and thread count.

Because the source nodes of hop ``h`` start with its destination nodes, the node lists are nested --
seeds, then the new nodes of hop 0, then of hop 1, ... -- so the ``num_src`` of every block is a prefix
length of one ``nodes`` array (seeds first in every layer's source nodes).

Randomness is counter-based (:mod:`ooc.kernels.rng`): a draw depends on (batch key, hop, node id,
draw index) only, so samples are identical for any thread count or worker count.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numba
import numpy as np
from numba import njit, prange, uint64

from ooc.kernels.rng import distinct_below, mix_key, rand_below, rand_unit

__all__ = ["Block", "MiniBatch", "SampledSubgraph", "sample_blocks", "neighbor_sample",
           "edge_weight_cdf", "unique_seeds", "excluded_edge_keys", "Workspace"]

_GOLD = 0x9E3779B97F4A7C15
#: node ids are tagged with a 23-bit generation in the top bits of a hash-table key
_TAG_SHIFT = 40
_MAX_GEN = (1 << 22) - 1


# ------------------------------------------------------------------------------------------ hashing
@njit(cache=True, nogil=True, inline="always")
def _home(v: np.int64, shift: np.int64) -> np.int64:
    """Fibonacci hash of ``v`` to a slot in ``[0, 2**(64-shift))``."""
    return np.int64((uint64(v) * uint64(_GOLD)) >> uint64(shift))


@njit(cache=True, nogil=True)
def _table_insert_serial(tab: np.ndarray, cap_bits: int, sbits: int, gen: int, v: int,
                         val: int) -> None:
    """Insert ``v -> val`` (``v`` must be absent) into the generation-tagged table."""
    slot = _home(v, 64 - cap_bits)
    base = (slot >> sbits) << sbits
    smask = (np.int64(1) << sbits) - 1
    off = slot & smask
    tag = (np.int64(gen) << _TAG_SHIFT) | v
    while True:
        p = base + off
        if (tab[2 * p] >> _TAG_SHIFT) != gen:
            tab[2 * p] = tag
            tab[2 * p + 1] = val
            return
        off = (off + 1) & smask


@njit(cache=True, nogil=True, parallel=True)
def _relabel_hop(tab: np.ndarray, cap_bits: int, sbits: int, gen: int, nbrs: np.ndarray, m: int,
                 local: np.ndarray, newslot: np.ndarray, nodes: np.ndarray, count: int) -> tuple:
    """Map the ``m`` global ids ``nbrs[:m]`` to local ids (new ids in first-seen order from ``count``).

    Returns ``(new count, overflow)``; on overflow (a shard is full) nothing usable was written and
    the caller grows the table and retries.
    """
    nshards = np.int64(1) << (cap_bits - sbits)
    smask = (np.int64(1) << sbits) - 1
    shift = 64 - cap_bits
    overflow = np.zeros(nshards, dtype=np.int64)
    # phase A: each shard scans the ids in order and owns the keys hashing into it
    for s in prange(nshards):
        base = s << sbits
        for e in range(m):
            v = np.int64(nbrs[e])
            slot = _home(v, shift)
            if (slot >> sbits) != s:
                continue
            off = slot & smask
            tag = (np.int64(gen) << _TAG_SHIFT) | v
            probes = 0
            while True:
                p = base + off
                t = tab[2 * p]
                if t == tag:
                    local[e] = tab[2 * p + 1]
                    newslot[e] = -1
                    break
                if (t >> _TAG_SHIFT) != gen:
                    tab[2 * p] = tag
                    tab[2 * p + 1] = -(e + 1)
                    local[e] = -(e + 1)
                    newslot[e] = p
                    break
                off = (off + 1) & smask
                probes += 1
                if probes > smask:
                    overflow[s] = 1
                    break
            if overflow[s]:
                break
    if overflow.sum() > 0:
        return count, True
    # phase B (sequential scan): number first occurrences in order; a later occurrence of a new node
    # points at an earlier edge, already numbered in this scan
    for e in range(m):
        p = newslot[e]
        if p >= 0:
            local[e] = count
            nodes[count] = nbrs[e]
            tab[2 * p + 1] = count
            count += 1
        else:
            x = local[e]
            if x < 0:
                local[e] = local[-x - 1]
    return count, False


@njit(cache=True, nogil=True, parallel=True)
def _relabel_dense(dmap: np.ndarray, gen: int, nbrs: np.ndarray, m: int, local: np.ndarray,
                   nodes: np.ndarray, count: int, nshards: int) -> int:
    """:func:`_relabel_hop` with a dense id map: ``dmap[v] = (gen << 32) | local id`` (int64 [N]).

    One random access per id and no probing; shards are ``v % nshards`` (power of two).
    """
    smask = nshards - 1
    g = np.int64(gen)
    for s in prange(nshards):
        for e in range(m):
            v = np.int64(nbrs[e])
            if (v & smask) != s:
                continue
            x = dmap[v]
            if (x >> 32) == g:
                lo = x & 0xFFFFFFFF
                if lo >= 0x80000000:
                    lo -= np.int64(1) << 32
                local[e] = lo
            else:
                dmap[v] = (g << 32) | ((-(e + 1)) & 0xFFFFFFFF)
                local[e] = -(e + 1)
    for e in range(m):
        x = local[e]
        if x == -(e + 1):
            v = np.int64(nbrs[e])
            local[e] = count
            nodes[count] = nbrs[e]
            dmap[v] = (g << 32) | count
            count += 1
        elif x < 0:
            local[e] = local[-x - 1]
    return count


@njit(cache=True, nogil=True)
def _radix_sort_ids(keys: np.ndarray, tmp: np.ndarray, m: int, vbits: int) -> None:
    """Stable LSD radix sort of ``keys[:m]`` (int64 ``(id << 32) | edge``) by the id only.

    ``vbits`` = bits of the largest id; 2 passes of <= 12-bit digits for ids below 2**24 (a 32 KB
    histogram stays in L1/L2).  Because the input is in edge order and every pass is stable, equal
    ids end up in edge order, so each run starts with the id's first occurrence.  ``tmp`` int64
    [>= m] is scratch; the result is in ``keys``.
    """
    npass = max(1, (vbits + 11) // 12)
    dbits = (vbits + npass - 1) // npass
    nb = np.int64(1) << dbits
    mask = nb - 1
    cnt = np.empty(nb, dtype=np.int64)
    src = keys
    dst = tmp
    for q in range(npass):
        shift = 32 + q * dbits
        cnt[:] = 0
        for e in range(m):
            cnt[(src[e] >> shift) & mask] += 1
        acc = 0
        for b in range(nb):
            c = cnt[b]
            cnt[b] = acc
            acc += c
        for e in range(m):
            x = src[e]
            b = (x >> shift) & mask
            dst[cnt[b]] = x
            cnt[b] += 1
        src, dst = dst, src
    if npass % 2 == 1:
        for e in range(m):
            keys[e] = tmp[e]


@njit(cache=True, nogil=True)
def _relabel_sorted(nbrs: np.ndarray, m: int, local: np.ndarray, nodes: np.ndarray, count: int,
                    sid: np.ndarray, slocal: np.ndarray, keys: np.ndarray, tmp: np.ndarray,
                    vbits: int, keep_sorted: bool) -> tuple:
    """:func:`_relabel_hop` by sorting instead of hashing: no id-sized map, no random accesses
    outside the hop's own arrays.

    The hop's ids are radix-sorted with their edge index (:func:`_radix_sort_ids`), each run of equal
    ids is merged against ``sid`` (int64 [count], ids of the nodes so far, ascending) with their local
    ids ``slocal`` (int64 [count]); a known id gives its local id to the run's edges, a new one points
    them at its first occurrence; a sequential pass over the edges (as in :func:`_relabel_hop`)
    numbers new nodes in first-seen order.  The id set is thus found with sequential passes (the same
    approach as sort-based unique in GPU samplers), which beats a random access per edge into an
    ``N``-sized map when ``N`` is far beyond the caches.

    Args:
        nbrs: [>= m] the hop's sampled global ids (< 2**31); local: int32 [m] output local ids;
        nodes: [>= count + m] node list, new nodes appended; keys, tmp: int64 [>= m] scratch;
        vbits: bit length of the largest node id; keep_sorted: also return the merged id set.

    Returns:
        ``(new count, sid', slocal')``: the sorted ids and local ids of all ``new count`` nodes when
        ``keep_sorted``, else ``sid``/``slocal`` unchanged.
    """
    for e in range(m):
        keys[e] = (np.int64(nbrs[e]) << 32) | e
    _radix_sort_ids(keys, tmp, m, vbits)
    # merge the runs with the known ids; new ids (their first key) are collected in tmp, ascending
    j = 0
    nnew = 0
    e0 = 0
    while e0 < m:
        key0 = keys[e0]
        v = key0 >> 32
        e1 = e0 + 1
        while e1 < m and (keys[e1] >> 32) == v:
            e1 += 1
        while j < count and sid[j] < v:
            j += 1
        if j < count and sid[j] == v:
            lid = slocal[j]
        else:
            lid = -((key0 & 0xFFFFFFFF) + 1)
            tmp[nnew] = key0
            nnew += 1
        for q in range(e0, e1):
            local[keys[q] & 0xFFFFFFFF] = lid
        e0 = e1
    old = count
    for e in range(m):
        x = local[e]
        if x == -(e + 1):
            local[e] = count
            nodes[count] = nbrs[e]
            count += 1
        elif x < 0:
            local[e] = local[-x - 1]
    if not keep_sorted:
        return count, sid, slocal
    sid2 = np.empty(count, dtype=np.int64)
    slocal2 = np.empty(count, dtype=np.int64)
    a = 0
    b = 0
    for o in range(count):
        if b >= nnew or (a < old and sid[a] < (tmp[b] >> 32)):
            sid2[o] = sid[a]
            slocal2[o] = slocal[a]
            a += 1
        else:
            sid2[o] = tmp[b] >> 32
            slocal2[o] = local[tmp[b] & 0xFFFFFFFF]
            b += 1
    return count, sid2, slocal2


@njit(cache=True, nogil=True)
def _rebuild_table(tab: np.ndarray, cap_bits: int, sbits: int, gen: int, nodes: np.ndarray,
                   count: int) -> None:
    for i in range(count):
        _table_insert_serial(tab, cap_bits, sbits, gen, np.int64(nodes[i]), i)


# ------------------------------------------------------------------------------------------ per-node draws
@njit(cache=True, nogil=True, inline="always")
def _is_excluded(excl: np.ndarray, v: np.int64, u: np.int64) -> bool:
    """Binary search of the key ``(v << 32) | u`` in the sorted exclusion keys."""
    k = (np.int64(v) << 32) | np.int64(u)
    lo = 0
    hi = excl.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if excl[mid] < k:
            lo = mid + 1
        else:
            hi = mid
    return lo < excl.shape[0] and excl[lo] == k


@njit(cache=True, nogil=True, inline="always")
def _has_exclusions(excl: np.ndarray, v: np.int64) -> bool:
    """Whether any exclusion key has destination ``v``."""
    k = np.int64(v) << 32
    lo = 0
    hi = excl.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if excl[mid] < k:
            lo = mid + 1
        else:
            hi = mid
    return lo < excl.shape[0] and (excl[lo] >> 32) == v


@njit(cache=True, nogil=True)
def _edge_weight(cumw: np.ndarray, start: np.int64, j: np.int64) -> np.float64:
    return cumw[j] - (cumw[j - 1] if j > start else 0.0)


@njit(cache=True, nogil=True, inline="always")
def _labor_keep(hkey: np.uint64, u: np.int64, fanout: np.int64, deg: np.int64) -> bool:
    """LABOR-0: edge ``u -> v`` is kept iff ``r_u <= fanout / deg(v)``, ``r_u`` shared by the layer."""
    return rand_unit(mix_key(hkey, u)) * deg <= fanout


@njit(cache=True, nogil=True)
def _num_draws(indptr: np.ndarray, indices: np.ndarray, cumw: np.ndarray, npos: np.ndarray,
               excl: np.ndarray, v: np.int64, fanout: np.int64, replace: bool, labor: bool,
               hkey: np.uint64) -> np.int64:
    """Number of sampled in-edges of ``v`` (see :func:`neighbor_sample`)."""
    start = indptr[v]
    end = indptr[v + 1]
    weighted = cumw.shape[0] > 0
    if labor and fanout >= 0 and end - start > fanout:
        c = 0
        for j in range(start, end):
            if _labor_keep(hkey, np.int64(indices[j]), fanout, end - start):
                c += 1
        return c
    if excl.shape[0] > 0 and _has_exclusions(excl, v):
        avail = 0
        for j in range(start, end):
            if weighted and _edge_weight(cumw, start, j) <= 0.0:
                continue
            if not _is_excluded(excl, v, np.int64(indices[j])):
                avail += 1
    elif weighted:
        avail = npos[v]
    else:
        avail = end - start
    if fanout < 0:
        return avail
    if replace:
        return fanout if avail > 0 else 0
    return min(avail, fanout)


@njit(cache=True, nogil=True)
def _draw_slow(indptr: np.ndarray, indices: np.ndarray, cumw: np.ndarray, excl: np.ndarray,
               v: np.int64, k: np.int64, fanout: np.int64, replace: bool, vkey: np.uint64,
               nbrs: np.ndarray, eids: np.ndarray, want_eid: bool, out: np.int64) -> None:
    """Draws for a node with excluded in-edges: sample from the list of allowed edges."""
    start = indptr[v]
    end = indptr[v + 1]
    weighted = cumw.shape[0] > 0
    allowed = np.empty(end - start, dtype=np.int64)
    na = 0
    for j in range(start, end):
        if weighted and _edge_weight(cumw, start, j) <= 0.0:
            continue
        if not _is_excluded(excl, v, np.int64(indices[j])):
            allowed[na] = j
            na += 1
    if k == na and not (replace and fanout >= 0):
        for c in range(k):
            nbrs[out + c] = indices[allowed[c]]
            if want_eid:
                eids[out + c] = allowed[c]
        return
    if weighted:
        # exponential keys over the allowed edges (with replacement: inverse CDF over them)
        if replace:
            tot = 0.0
            for c in range(na):
                tot += _edge_weight(cumw, start, allowed[c])
            for d in range(k):
                u = rand_unit(mix_key(vkey, d)) * tot
                acc = 0.0
                pick = allowed[na - 1]
                for c in range(na):
                    acc += _edge_weight(cumw, start, allowed[c])
                    if acc > u:
                        pick = allowed[c]
                        break
                nbrs[out + d] = indices[pick]
                if want_eid:
                    eids[out + d] = pick
            return
        keys = np.empty(na, dtype=np.float64)
        for c in range(na):
            j = allowed[c]
            keys[c] = -np.log(1.0 - rand_unit(mix_key(vkey, j - start))) / _edge_weight(cumw, start, j)
        order = np.argsort(keys)
        for d in range(k):
            j = allowed[order[d]]
            nbrs[out + d] = indices[j]
            if want_eid:
                eids[out + d] = j
        return
    if replace:
        for d in range(k):
            j = allowed[rand_below(mix_key(vkey, d), na)]
            nbrs[out + d] = indices[j]
            if want_eid:
                eids[out + d] = j
        return
    distinct_below(vkey, na, k, nbrs, out)
    for d in range(k):
        j = allowed[nbrs[out + d]]
        nbrs[out + d] = indices[j]
        if want_eid:
            eids[out + d] = j


@njit(cache=True, nogil=True)
def _draw(indptr: np.ndarray, indices: np.ndarray, cumw: np.ndarray, excl: np.ndarray,
          v: np.int64, k: np.int64, fanout: np.int64, replace: bool, hkey: np.uint64,
          nbrs: np.ndarray, eids: np.ndarray, wkey: np.ndarray, want_eid: bool, labor: bool,
          out: np.int64) -> None:
    """Write the ``k`` sampled in-neighbours of ``v`` to ``nbrs[out:out+k]`` (edge ids to ``eids``)."""
    start = indptr[v]
    deg = indptr[v + 1] - start
    if labor and fanout >= 0 and deg > fanout:
        c = 0
        for j in range(start, start + deg):
            u = np.int64(indices[j])
            if _labor_keep(hkey, u, fanout, deg):
                nbrs[out + c] = u
                if want_eid:
                    eids[out + c] = j
                c += 1
        return
    vkey = mix_key(hkey, v)
    if excl.shape[0] > 0 and _has_exclusions(excl, v):
        _draw_slow(indptr, indices, cumw, excl, v, k, fanout, replace, vkey, nbrs, eids, want_eid,
                   out)
        return
    if cumw.shape[0] > 0:
        tot = cumw[start + deg - 1]
        if replace and fanout >= 0:
            for d in range(k):
                u = rand_unit(mix_key(vkey, d)) * tot
                lo = start
                hi = start + deg - 1
                while lo < hi:  # first j with cumw[j] > u (skips zero-weight edges)
                    mid = (lo + hi) >> 1
                    if cumw[mid] > u:
                        hi = mid
                    else:
                        lo = mid + 1
                nbrs[out + d] = indices[lo]
                if want_eid:
                    eids[out + d] = lo
            return
        # Efraimidis-Spirakis: the k smallest keys -log(U)/w; kept in a size-k max-heap
        c = 0
        for j in range(start, start + deg):
            w = _edge_weight(cumw, start, j)
            if w <= 0.0:
                continue
            key = -np.log(1.0 - rand_unit(mix_key(vkey, j - start))) / w
            if c < k:
                # sift up
                pos = c
                c += 1
                while pos > 0:
                    par = (pos - 1) >> 1
                    if wkey[out + par] >= key:
                        break
                    wkey[out + pos] = wkey[out + par]
                    nbrs[out + pos] = nbrs[out + par]
                    pos = par
                wkey[out + pos] = key
                nbrs[out + pos] = j - start
            elif key < wkey[out]:
                # replace the root, sift down
                pos = 0
                while True:
                    ch = 2 * pos + 1
                    if ch >= k:
                        break
                    if ch + 1 < k and wkey[out + ch + 1] > wkey[out + ch]:
                        ch += 1
                    if wkey[out + ch] <= key:
                        break
                    wkey[out + pos] = wkey[out + ch]
                    nbrs[out + pos] = nbrs[out + ch]
                    pos = ch
                wkey[out + pos] = key
                nbrs[out + pos] = j - start
        for d in range(k):
            j = start + nbrs[out + d]
            nbrs[out + d] = indices[j]
            if want_eid:
                eids[out + d] = j
        return
    if k == deg and not (replace and fanout >= 0):
        for d in range(deg):
            nbrs[out + d] = indices[start + d]
        if want_eid:
            for d in range(deg):
                eids[out + d] = start + d
        return
    if replace:
        for d in range(k):
            j = start + rand_below(mix_key(vkey, d), deg)
            nbrs[out + d] = indices[j]
            if want_eid:
                eids[out + d] = j
        return
    # Robert Floyd's algorithm: k distinct offsets out of deg, O(k^2) membership tests in-cache
    distinct_below(vkey, deg, k, nbrs, out)
    for d in range(k):
        j = start + nbrs[out + d]
        nbrs[out + d] = indices[j]
        if want_eid:
            eids[out + d] = j


# ------------------------------------------------------------------------------------------ multi-hop kernel
@njit(cache=True, nogil=True, parallel=True)
def _count_hop(indptr, indices, cumw, npos, excl, nodes, n_dst, fanout, replace, labor, hkey, ptr):
    """``ptr`` [n_dst+1] <- offsets of every frontier node's draws."""
    ptr[0] = 0
    for i in prange(n_dst):
        ptr[i + 1] = _num_draws(indptr, indices, cumw, npos, excl, np.int64(nodes[i]), fanout,
                                replace, labor, hkey)
    for i in range(n_dst):
        ptr[i + 1] += ptr[i]


@njit(cache=True, nogil=True, parallel=True)
def _draw_hop(indptr, indices, cumw, excl, nodes, n_dst, fanout, replace, hkey, nbrs, eids, wkey,
              want_eid, labor, ptr):
    """Every frontier node's draws into ``nbrs`` (global ids) at its ``ptr`` offsets."""
    for i in prange(n_dst):
        k = ptr[i + 1] - ptr[i]
        if k > 0:
            _draw(indptr, indices, cumw, excl, np.int64(nodes[i]), k, fanout, replace, hkey,
                  nbrs, eids, wkey, want_eid, labor, ptr[i])


@njit(cache=True, nogil=True)
def _count_range(indptr, nodes, lo, hi, fanout, replace, start, deg, ptr):
    """``ptr[i+1]`` <- draws of frontier node ``i`` (not yet summed), and its first in-edge
    ``start[i]`` and in-degree ``deg[i]``, for ``i`` in ``[lo, hi)``; counts as :func:`_num_draws`."""
    for i in range(lo, hi):
        v = np.int64(nodes[i])
        s = indptr[v]
        dg = indptr[v + 1] - s
        start[i] = s
        deg[i] = dg
        if fanout < 0:
            k = dg
        elif replace:
            k = fanout if dg > 0 else 0
        else:
            k = dg if dg < fanout else fanout
        ptr[i + 1] = k


@njit(cache=True, nogil=True, parallel=True)
def _count_hop_uniform(indptr, nodes, n_dst, fanout, replace, start, deg, ptr, serial):
    """Uniform draws without exclusions: ``ptr`` [n_dst+1] <- draw offsets, and every frontier node's
    first in-edge ``start`` int64 [n_dst] and in-degree ``deg`` int64 [n_dst].

    Same counts as :func:`_count_hop`; the loop body is two independent loads per node, so the CPU
    overlaps the cache misses of many nodes, and the draw step reads ``start``/``deg`` sequentially
    instead of ``indptr`` a second time at random.  ``serial``: run on the calling thread only
    (small hops, where waking the thread pool costs more than the work).
    """
    ptr[0] = 0
    if serial:
        _count_range(indptr, nodes, 0, n_dst, fanout, replace, start, deg, ptr)
    else:
        nblocks = (n_dst + _COUNT_BLOCK - 1) // _COUNT_BLOCK
        for b in prange(nblocks):
            _count_range(indptr, nodes, b * _COUNT_BLOCK, min(n_dst, (b + 1) * _COUNT_BLOCK),
                         fanout, replace, start, deg, ptr)
    for i in range(n_dst):
        ptr[i + 1] += ptr[i]


#: frontier nodes per block of :func:`_count_hop_uniform`
_COUNT_BLOCK = 4096
#: hops of uniform draws expected to draw fewer edges than this run on the calling thread
_SERIAL_HOP_EDGES = 20_000
#: frontier nodes per block of :func:`_draw_hop_uniform` (positions of a block stay in L1/L2)
_DRAW_BLOCK = 256


@njit(cache=True, nogil=True)
def _draw_block(indices, nodes, lo, hi, fanout, replace, hkey, start, deg, ptr, pos, nbrs, eids,
                want_eid):
    """Uniform draws of frontier nodes ``[lo, hi)``: edge positions into ``pos``, then the gather."""
    for i in range(lo, hi):
        out = ptr[i]
        k = ptr[i + 1] - out
        s = start[i]
        dg = deg[i]
        if k == 0:
            continue
        if k == dg and not (replace and fanout >= 0):
            for d in range(dg):
                pos[out + d] = s + d
            continue
        vkey = mix_key(hkey, np.int64(nodes[i]))
        if replace:
            for d in range(k):
                pos[out + d] = s + rand_below(mix_key(vkey, d), dg)
            continue
        distinct_below(vkey, dg, k, pos, out)  # Robert Floyd's algorithm, as in _draw
        for d in range(k):
            pos[out + d] += s
    for e in range(ptr[lo], ptr[hi]):
        nbrs[e] = indices[pos[e]]
    if want_eid:
        for e in range(ptr[lo], ptr[hi]):
            eids[e] = pos[e]


@njit(cache=True, nogil=True, parallel=True)
def _draw_hop_uniform(indices, nodes, n_dst, fanout, replace, hkey, start, deg, ptr, pos, nbrs,
                      eids, want_eid, serial):
    """Uniform draws of every frontier node into ``nbrs`` (global ids) at its ``ptr`` offsets.

    Bit-identical to :func:`_draw_hop` for uniform sampling without exclusions, in two passes per
    block of :data:`_DRAW_BLOCK` nodes: first the edge positions of all draws (Floyd's algorithm or
    independent draws with replacement: arithmetic on ``start``/``deg`` only, no memory misses) into
    ``pos`` int64 [m], then ``nbrs[e] = indices[pos[e]]``, a loop of independent loads whose cache
    misses the CPU overlaps (memory-level parallelism, instead of one node's misses at a time).
    ``eids`` int64 [m] receives the positions when ``want_eid``.  ``serial``: calling thread only.
    """
    nblocks = (n_dst + _DRAW_BLOCK - 1) // _DRAW_BLOCK
    if serial:
        for b in range(nblocks):
            _draw_block(indices, nodes, b * _DRAW_BLOCK, min(n_dst, (b + 1) * _DRAW_BLOCK), fanout,
                        replace, hkey, start, deg, ptr, pos, nbrs, eids, want_eid)
        return
    for b in prange(nblocks):
        _draw_block(indices, nodes, b * _DRAW_BLOCK, min(n_dst, (b + 1) * _DRAW_BLOCK), fanout,
                    replace, hkey, start, deg, ptr, pos, nbrs, eids, want_eid)


# The driver is serial Numba code (no Python between hops) that calls the parallel steps above;
# keeping the prange loops in their own functions with arrays as arguments avoids a Numba parfors
# miscompilation seen when arrays are re-allocated between prange loops of one function.
@njit(cache=True, nogil=True)
def _sample_hops(indptr, indices, cumw, npos, excl, seeds, fanouts, replace, labor, key, want_eid,
                 tab, cap_bits, tbits, gen, nodes, nbrs, newslot, wkey, dmap, dgen, sortbuf, vbits):
    """All hops of one batch; see :func:`neighbor_sample`.  Scratch arrays may be grown (returned).

    Relabelling: ``dmap`` non-empty (int64 [N]) selects the dense id map; else ``vbits > 0`` (bit
    length of the largest node id, < 32) sorting (:func:`_relabel_sorted`, scratch ``newslot`` and
    ``sortbuf``); else the hash table.
    """
    num_hops = fanouts.shape[0]
    n0 = seeds.shape[0]
    avg_deg = indptr[indptr.shape[0] - 1] / max(indptr.shape[0] - 1, 1)
    weighted = cumw.shape[0] > 0
    dense = dmap.shape[0] > 0
    uniform = not weighted and not labor and excl.shape[0] == 0
    # seeds: first local ids; the table must hold them
    cap_bits = max(cap_bits, tbits + 6)
    while (np.int64(1) << cap_bits) < 2 * n0 + 64:
        cap_bits += 1
    if tab.shape[0] < 2 * (np.int64(1) << cap_bits):
        tab = np.zeros(2 * (np.int64(1) << cap_bits), dtype=np.int64)
    if nodes.shape[0] < n0:
        nodes = np.empty(2 * n0, dtype=nodes.dtype)
    for i in range(n0):
        nodes[i] = seeds[i]
    sorted_ids = not dense and vbits > 0
    sid = np.empty(0, dtype=np.int64)
    slocal = np.empty(0, dtype=np.int64)
    if dense:
        for i in range(n0):
            dmap[np.int64(seeds[i])] = (np.int64(dgen) << 32) | i
    elif sorted_ids:
        slocal = np.argsort(seeds.astype(np.int64))
        sid = np.empty(n0, dtype=np.int64)
        for i in range(n0):
            sid[i] = seeds[slocal[i]]
    else:
        _rebuild_table(tab, cap_bits, cap_bits - tbits, gen, nodes, n0)
    count = n0
    sizes = np.zeros(num_hops + 1, dtype=np.int64)
    sizes[0] = n0
    ptr_off = np.zeros(num_hops + 1, dtype=np.int64)
    idx_off = np.zeros(num_hops + 1, dtype=np.int64)
    ptr_parts = []
    idx_parts = []
    eid_parts = []
    for h in range(num_hops):
        n_dst = count
        fanout = fanouts[h]
        hkey = mix_key(key, h)
        ptr = np.empty(n_dst + 1, dtype=np.int64)
        # a hop expected to draw few edges runs on this thread only
        # (all neighbours: the graph's average degree stands for the fanout)
        small = n_dst * (fanout if fanout >= 0 else avg_deg) < _SERIAL_HOP_EDGES
        if uniform:
            # start/deg live in sortbuf, free until the relabel step (no fresh pages per hop)
            if sortbuf.shape[0] < 2 * n_dst:
                sortbuf = np.empty(max(2 * n_dst, 2 * sortbuf.shape[0]), dtype=np.int64)
            start = sortbuf[:n_dst]
            deg = sortbuf[n_dst:2 * n_dst]
            _count_hop_uniform(indptr, nodes, n_dst, fanout, replace, start, deg, ptr, small)
        else:
            _count_hop(indptr, indices, cumw, npos, excl, nodes, n_dst, fanout, replace, labor, hkey,
                       ptr)
        m = ptr[n_dst]
        if fanout < 0:  # the draws are counted now
            small = m < _SERIAL_HOP_EDGES
        if nbrs.shape[0] < m:
            nbrs = np.empty(max(m, 2 * nbrs.shape[0]), dtype=nbrs.dtype)
            newslot = np.empty(nbrs.shape[0], dtype=np.int64)
        if weighted and not replace and wkey.shape[0] < m:
            wkey = np.empty(max(m, 2 * wkey.shape[0]), dtype=np.float64)
        eids = np.empty(m if want_eid else 0, dtype=np.int64)
        if uniform:
            # edge positions of the draws (newslot is free until the relabel step)
            _draw_hop_uniform(indices, nodes, n_dst, fanout, replace, hkey, start, deg, ptr,
                              newslot, nbrs, eids, want_eid, small)
        else:
            _draw_hop(indptr, indices, cumw, excl, nodes, n_dst, fanout, replace, hkey, nbrs, eids,
                      wkey, want_eid, labor, ptr)
        # relabel
        need = count + m
        if nodes.shape[0] < need:
            grown = np.empty(max(need, 2 * nodes.shape[0]), dtype=nodes.dtype)
            for i in range(count):
                grown[i] = nodes[i]
            nodes = grown
        local = np.empty(m, dtype=np.int32)
        while dense:
            count = _relabel_dense(dmap, dgen, nbrs, m, local, nodes, count, np.int64(1) << tbits)
            break
        while sorted_ids:
            if sortbuf.shape[0] < m:
                sortbuf = np.empty(max(m, 2 * sortbuf.shape[0]), dtype=np.int64)
            count, sid, slocal = _relabel_sorted(nbrs, m, local, nodes, count, sid, slocal, newslot,
                                                 sortbuf, vbits, h + 1 < num_hops)
            break
        while not dense and not sorted_ids:
            grew = False
            while (np.int64(1) << cap_bits) < 2 * need:
                cap_bits += 1
                grew = True
            if grew:
                if tab.shape[0] < 2 * (np.int64(1) << cap_bits):
                    tab = np.zeros(2 * (np.int64(1) << cap_bits), dtype=np.int64)
                else:
                    for i in range(2 * (np.int64(1) << cap_bits)):
                        tab[i] = 0
                _rebuild_table(tab, cap_bits, cap_bits - tbits, gen, nodes, count)
            new_count, overflow = _relabel_hop(tab, cap_bits, cap_bits - tbits, gen, nbrs, m, local,
                                               newslot, nodes, count)
            if not overflow:
                count = new_count
                break
            # a shard filled up (pathological hash skew): double the table and retry
            cap_bits += 1
            tab = np.zeros(2 * (np.int64(1) << cap_bits), dtype=np.int64)
            _rebuild_table(tab, cap_bits, cap_bits - tbits, gen, nodes, count)
        sizes[h + 1] = count
        ptr_parts.append(ptr)
        idx_parts.append(local)
        eid_parts.append(eids)
        ptr_off[h + 1] = ptr_off[h] + n_dst + 1
        idx_off[h + 1] = idx_off[h] + m
    ptr_all = np.empty(ptr_off[num_hops], dtype=np.int64)
    idx_all = np.empty(idx_off[num_hops], dtype=np.int32)
    eid_all = np.empty(idx_off[num_hops] if want_eid else 0, dtype=np.int64)
    for h in range(num_hops):
        pp = ptr_parts[h]
        for i in range(pp.shape[0]):
            ptr_all[ptr_off[h] + i] = pp[i]
        ip = idx_parts[h]
        for i in range(ip.shape[0]):
            idx_all[idx_off[h] + i] = ip[i]
        if want_eid:
            ep = eid_parts[h]
            for i in range(ep.shape[0]):
                eid_all[idx_off[h] + i] = ep[i]
    out_nodes = np.empty(count, dtype=np.int64)
    for i in range(count):
        out_nodes[i] = nodes[i]
    return (out_nodes, sizes, ptr_all, ptr_off, idx_all, idx_off, eid_all,
            tab, cap_bits, nodes, nbrs, newslot, wkey, sortbuf)


# ------------------------------------------------------------------------------------------ workspace
class Workspace:
    """Per-thread scratch of the node-wise kernel: hash table and frontier buffers, reused by batches.

    The hash table's entries carry a generation tag, so a new batch starts with an empty table without
    clearing it.  One workspace per thread (see :func:`_workspace`): concurrent batches never share one.
    """

    def __init__(self, index_dtype: np.dtype = np.dtype(np.int64)) -> None:
        self.tab = np.zeros(2 * 1024, dtype=np.int64)
        self.cap_bits = 10
        self.gen = 0
        self.nodes = np.empty(1024, dtype=index_dtype)
        self.nbrs = np.empty(1024, dtype=index_dtype)
        self.newslot = np.empty(1024, dtype=np.int64)
        self.wkey = np.empty(0, dtype=np.float64)
        self.dmap = np.empty(0, dtype=np.int64)
        self.dgen = 0
        self.sortbuf = np.empty(1024, dtype=np.int64)

    def next_dgen(self, num_nodes: int) -> int:
        """Generation of the dense id map (int64 [N], allocated on first use for N nodes)."""
        if self.dmap.shape[0] < num_nodes:
            self.dmap = np.zeros(num_nodes, dtype=np.int64)
            self.dgen = 0
        self.dgen += 1
        if self.dgen >= 2**31 - 1:
            self.dmap[:] = 0
            self.dgen = 1
        return self.dgen

    def next_gen(self) -> int:
        self.gen += 1
        if self.gen > _MAX_GEN:
            self.tab[:] = 0
            self.gen = 1
        return self.gen


def workspace_bytes(num_nodes: int) -> int:
    """Bytes a thread's :class:`Workspace` keeps between batches that do not scale with the batch:
    the dense id map (int64 [N]) for graphs of at most 2**21 nodes, else none (larger graphs
    relabel by sorting, in buffers sized by the batch)."""
    return 8 * int(num_nodes) if num_nodes <= _DENSE_MAX_NODES else 0


_local = threading.local()


def _workspace(index_dtype: np.dtype) -> Workspace:
    key = "ws32" if np.dtype(index_dtype).itemsize == 4 else "ws64"
    ws = getattr(_local, key, None)
    if ws is None:
        ws = Workspace(index_dtype)
        setattr(_local, key, ws)
    return ws


def _thread_bits() -> int:
    """log2 of the number of hash-table shards: one per Numba thread, rounded up to a power of two."""
    return (max(1, numba.get_num_threads()) - 1).bit_length()


# ------------------------------------------------------------------------------------------ public data
@dataclass
class Block:
    """One message-flow graph (MFG): edges from ``num_src`` source to ``num_dst`` destination nodes.

    The destination nodes are the first ``num_dst`` source nodes.  Edges are CSC over destinations:
    the sampled sources of destination ``i`` are local ids ``indices[indptr[i]:indptr[i+1]]``.

    Attributes:
        num_src, num_dst: node counts.
        indptr: int64 [num_dst+1].
        indices: int32 or int64 [num_edges], local source ids in ``[0, num_src)``.
        eids: optional int64 [num_edges], position of each edge in the graph's CSC ``indices``
            (the CSC of the sampled direction); ``None`` unless requested.
        edge_weight: optional float32 [num_edges], importance weight of each edge: for destination
            ``v``, ``sum_e edge_weight[e] * f(src(e))`` estimates ``sum_{u in N(v)} f(u)`` (inverse
            inclusion probability, Horvitz-Thompson).  ``None`` means uniform weights
            ``deg(v) / sampled(v)``, which the layers apply themselves.
    """

    num_src: int
    num_dst: int
    indptr: np.ndarray
    indices: np.ndarray
    eids: np.ndarray | None = None
    edge_weight: np.ndarray | None = None

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def dst_index(self) -> np.ndarray:
        """int64 [num_edges]: destination local id of every edge."""
        return np.repeat(np.arange(self.num_dst, dtype=np.int64), np.diff(self.indptr))


@dataclass
class MiniBatch:
    """A mini-batch's sample: nested node list and one :class:`Block` per layer.

    Attributes:
        seeds: int64 [B] the unique output nodes, in the order given (subgraph samplers: the
            training nodes of the subgraph).
        nodes: int64 [n] global ids of all sampled nodes; ``nodes[:blocks[0].num_src]`` are the
            input nodes whose features the first layer needs; ``nodes[:len(seeds)] == seeds``.
        blocks: MFGs ordered from the input layer to the output layer (``blocks[-1].num_dst == B``).
        seed_positions: int64 [len(requested seeds)], position in ``seeds`` of each requested seed
            (identity unless duplicates were removed), so labels always line up.
        node_weight: optional float32 [B] loss weight of each output node (GraphSAINT's loss
            normalisation: the weighted sum of per-node losses estimates the mean over the training
            set); ``None`` = plain mean.
        pairs: optional int64 [P, 2] link-prediction node pairs as positions in ``seeds``.
        pair_label: optional float32 [P]: 1 for positive (seed) edges, 0 for negatives.
    """

    seeds: np.ndarray
    nodes: np.ndarray
    blocks: list[Block]
    seed_positions: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    node_weight: np.ndarray | None = None
    pairs: np.ndarray | None = None
    pair_label: np.ndarray | None = None

    @property
    def input_nodes(self) -> np.ndarray:
        return self.nodes[: self.blocks[0].num_src] if self.blocks else self.seeds

    @property
    def num_sampled_edges(self) -> int:
        return sum(b.num_edges for b in self.blocks)


#: The name used by earlier code; the same class.
SampledSubgraph = MiniBatch


# ------------------------------------------------------------------------------------------ helpers
def unique_seeds(seeds: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate seeds and merge duplicates, keeping first-occurrence order.

    Returns:
        ``(unique int64 [B'], positions int64 [B])`` with ``unique[positions] == seeds``.

    Raises:
        ValueError: a seed id is outside ``[0, num_nodes)``.
    """
    seeds = np.asarray(seeds, dtype=np.int64).ravel()
    if seeds.size == 1:
        if not 0 <= seeds[0] < num_nodes:
            raise ValueError(f"seed id {seeds[0]} outside [0, {num_nodes})")
        return seeds, np.zeros(1, dtype=np.int64)
    if seeds.size and (seeds.min() < 0 or seeds.max() >= num_nodes):
        bad = seeds[(seeds < 0) | (seeds >= num_nodes)][0]
        raise ValueError(f"seed id {bad} outside [0, {num_nodes})")
    uniq, first, inverse = np.unique(seeds, return_index=True, return_inverse=True)
    if uniq.shape[0] == seeds.shape[0]:
        return seeds, np.arange(seeds.shape[0], dtype=np.int64)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return seeds[np.sort(first)], rank[inverse]


@njit(cache=True, nogil=True, parallel=True)
def _cdf(indptr: np.ndarray, w: np.ndarray, cumw: np.ndarray, npos: np.ndarray) -> None:
    n = indptr.shape[0] - 1
    for v in prange(n):
        acc = 0.0
        c = 0
        for j in range(indptr[v], indptr[v + 1]):
            x = w[j]
            if x > 0:
                acc += x
                c += 1
            cumw[j] = acc
        npos[v] = c


def edge_weight_cdf(indptr: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-node cumulative edge weights for weighted sampling.

    Args:
        indptr: int64 [N+1] CSC offsets; weights: float [E] non-negative, finite probability weights
            aligned with the CSC ``indices`` (they need not sum to 1; zero = never sampled).

    Returns:
        ``(cumw float64 [E], npos int64 [N])``: inclusive prefix sums restarting at every node, and
        the number of positive-weight in-edges per node.

    Raises:
        ValueError: wrong length, negative or non-finite weights.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (int(indptr[-1]),):
        raise ValueError(f"edge weights have shape {w.shape}, expected ({int(indptr[-1])},)")
    if w.size and (not np.isfinite(w).all() or w.min() < 0):
        raise ValueError("edge weights must be finite and non-negative")
    cumw = np.empty_like(w)
    npos = np.empty(indptr.shape[0] - 1, dtype=np.int64)
    _cdf(indptr, w, cumw, npos)
    return cumw, npos


def excluded_edge_keys(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Sorted unique int64 keys ``(dst << 32) | src`` of edges the sampler must not draw.

    Node ids must be below 2**31.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.size and max(int(src.max()), int(dst.max())) >= 2**31:
        raise ValueError("edge exclusion needs node ids below 2**31")
    return np.unique((dst << 32) | src)


_EMPTY_F = np.empty(0, dtype=np.float64)
#: graphs with at most this many nodes relabel through a dense id map (8 bytes per node and worker
#: thread) instead of the hash table: one memory access per id, no probing
_DENSE_MAX_NODES = 1 << 21
#: larger graphs up to this many nodes relabel by sorting (ids below 2**31); beyond, the hash table
_SORT_MAX_NODES = 1 << 31
#: batches expected to sample fewer edges than this run on one thread
_SERIAL_EDGES = 20_000


@contextmanager
def serial_if_small(num_seeds: int, fanouts: list[int]) -> Iterator[None]:
    """Run the block on one Numba thread when the batch's draws (``num_seeds`` times the running
    product of ``fanouts`` over the hops; ``-1`` = unbounded) are under ``_SERIAL_EDGES``: a parallel
    launch costs more than such a batch's whole sample.  The thread count is restored after.
    (Full-neighbour hops decide inside the kernel, by their counted draws.)"""
    est = tot = float(num_seeds)
    for f in fanouts:
        est = est * f if f >= 0 else float("inf")
        tot += est
    threads = numba.get_num_threads()
    serial = tot < _SERIAL_EDGES and threads > 1
    if serial:
        numba.set_num_threads(1)
    try:
        yield
    finally:
        if serial:
            numba.set_num_threads(threads)
_EMPTY_I = np.empty(0, dtype=np.int64)


def neighbor_sample(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, fanouts: list[int],
                    key: int | np.uint64, replace: bool = False, cumw: np.ndarray | None = None,
                    npos: np.ndarray | None = None, exclude: np.ndarray | None = None,
                    return_eids: bool = False, labor: bool = False) -> MiniBatch:
    """Multi-hop node-wise neighbour sampling (GraphSAGE) with relabelling.

    Args:
        indptr: int64 [N+1] CSC offsets; indices: int32|int64 [E] in-neighbour ids (pass the out-CSR
            to sample out-neighbours).
        seeds: integer [B] output node ids in ``[0, N)``; duplicates are merged (see
            ``MiniBatch.seed_positions``).
        fanouts: per layer, from the output layer inwards (``fanouts[0]`` is sampled around the
            seeds, as in DGL/PyG); ``-1`` = all neighbours (all positive-weight ones when weighted).
            Without replacement a node keeps ``min(fanout, available)`` in-edges; with replacement
            exactly ``fanout`` draws (0 when it has none).
        key: uint64 random stream key (see :func:`ooc.kernels.rng.batch_key`).
        replace: sample with replacement.
        cumw, npos: from :func:`edge_weight_cdf`: per-edge sampling weights (probability
            proportional to weight); ``None`` = uniform.
        exclude: sorted int64 keys from :func:`excluded_edge_keys`: edges never sampled.
        return_eids: fill ``Block.eids``.
        labor: LABOR-0 instead of independent per-node draws (Balin & Catalyurek, "Layer-neighbor
            sampling -- defusing neighborhood explosion in GNNs", NeurIPS'23; DGL's
            ``LayerNeighborSampler`` with ``importance_sampling=0``): every candidate source ``u`` of
            a layer draws one variate ``r_u`` and edge ``u -> v`` is kept iff
            ``r_u <= fanout / deg(v)``.  A node keeps ``fanout`` in-edges in expectation (all when
            ``deg <= fanout``), and destinations share sources, so layers have fewer nodes.  Uniform
            and without replacement only.

    Returns:
        :class:`MiniBatch` with ``len(fanouts)`` blocks, input layer first; ``Block.indices`` int32.

    Raises:
        ValueError: a seed id is outside ``[0, N)`` or a fanout is 0 or below -1.
    """
    n = indptr.shape[0] - 1
    useeds, positions = unique_seeds(seeds, n)
    fo = np.asarray(fanouts, dtype=np.int64).ravel()
    if fo.size and (fo.min() < -1 or (fo == 0).any()):
        raise ValueError(f"fanouts {fo.tolist()} invalid: use positive counts or -1 for all")
    if labor and (replace or cumw is not None or exclude is not None):
        raise ValueError("LABOR sampling is uniform, without replacement and without exclusions")
    ws = _workspace(indices.dtype)
    gen = ws.next_gen()
    with serial_if_small(useeds.shape[0], fo.tolist()):
        out = _run_hops(indptr, indices, cumw, npos, exclude, useeds, fo, replace, labor, key,
                        return_eids, ws, gen)
    nodes, sizes, ptr_all, ptr_off, idx_all, idx_off, eid_all = out
    blocks = []
    for h in range(fo.shape[0] - 1, -1, -1):
        blocks.append(Block(num_src=int(sizes[h + 1]), num_dst=int(sizes[h]),
                            indptr=ptr_all[ptr_off[h]:ptr_off[h + 1]],
                            indices=idx_all[idx_off[h]:idx_off[h + 1]],
                            eids=eid_all[idx_off[h]:idx_off[h + 1]] if return_eids else None))
    return MiniBatch(seeds=useeds, nodes=nodes, blocks=blocks, seed_positions=positions)


def _run_hops(indptr, indices, cumw, npos, exclude, useeds, fo, replace, labor, key, return_eids,
              ws, gen):
    if cumw is None:
        cumw, npos = _EMPTY_F, _EMPTY_I
    elif npos is None:
        raise ValueError("npos is required with cumw (see edge_weight_cdf)")
    excl = _EMPTY_I if exclude is None else exclude
    n = indptr.shape[0] - 1
    dense = n <= _DENSE_MAX_NODES
    if dense:
        ws.next_dgen(n)
    vbits = max(1, (n - 1).bit_length()) if n <= _SORT_MAX_NODES else 0
    (nodes, sizes, ptr_all, ptr_off, idx_all, idx_off, eid_all, ws.tab, cap_bits, ws.nodes, ws.nbrs,
     ws.newslot, ws.wkey, ws.sortbuf) = _sample_hops(
        indptr, indices, cumw, npos, excl, useeds.astype(ws.nodes.dtype, copy=False), fo,
        bool(replace), bool(labor), np.uint64(key), bool(return_eids), ws.tab, ws.cap_bits,
        _thread_bits(), gen, ws.nodes, ws.nbrs, ws.newslot, ws.wkey,
        ws.dmap if dense else _EMPTY_I, ws.dgen if dense else 0, ws.sortbuf, vbits)
    ws.cap_bits = cap_bits
    return nodes, sizes, ptr_all, ptr_off, idx_all, idx_off, eid_all


def sample_blocks(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, fanouts: list[int],
                  key: int | np.uint64, replace: bool = False) -> MiniBatch:
    """Multi-hop uniform neighbour sampling (GraphSAGE) with relabelling; see :func:`neighbor_sample`.

    Raises:
        ValueError: a seed id is outside ``[0, N)``.
    """
    return neighbor_sample(indptr, indices, seeds, fanouts, key, replace=replace)
