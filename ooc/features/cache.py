"""CPU feature caches with replacement policies, as composable wrappers (GraphBolt's
``cpu_cached_feature(fallback, max_cache_size, policy)`` idea).

A :class:`CachedFeature` holds up to ``capacity`` feature rows in one preallocated array, an
open-addressing hash table (node id -> slot, linear probing with backward-shift deletion) and the
policy's metadata.  ``gather(ids)`` serves hits from the cache and reads the misses from its
``fallback`` (anything with ``gather(ids) -> (rows, bytes_read)``: a :class:`~ooc.storage.io.DiskRows`,
another cache...) in one batched call, then admits them.  All per-row work is in Numba kernels.

Policies (``policy=``):

- ``sieve`` -- SIEVE (Zhang et al., "SIEVE is simpler than LRU", NSDI'24): a FIFO queue with a
  visited bit and a hand that moves from the oldest entry towards the newest, keeping visited
  entries in place (lazy promotion, quick demotion).
- ``clock`` -- CLOCK (Corbató 1968): a ring of reference bits and a
  hand giving second chances.
- ``lru`` -- least recently used: a doubly linked list, a hit moves the entry to the front.
- ``belady`` -- Belady's MIN (Belady, IBM Systems Journal 1966) over a look-ahead window, for a
  caller that knows which rows it will ask for next (exact mode's epoch plan, sampled ahead by
  :class:`ooc.data.lookahead.Lookahead`, as Ginex, VLDB'22): every gather passes each row's next use
  (a batch number; :data:`NEVER` = not within the window), a miss is admitted only when it is used
  again and sooner than the entry that would be evicted, and the victim is the entry used furthest
  in the future (a max-heap on the next use).  :meth:`CachedFeature.announce` lowers the next use of
  cached rows that a batch entering the window asks for.  Rows asked without next uses (evaluation)
  are served from the cache but not admitted.

Hit ratio = hits / (hits + misses) over the rows asked of the cache.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

__all__ = ["POLICIES", "LOOKAHEAD_POLICIES", "NEVER", "CachedFeature", "cpu_cached_feature",
           "CacheStats"]

POLICIES = ("sieve", "clock", "lru")
#: policies that need every row's next use (``gather(ids, next_use)``)
LOOKAHEAD_POLICIES = ("belady",)
_POLICY_ID = {"lru": 0, "clock": 1, "sieve": 2, "belady": 3}
#: next use of a row not asked for within the look-ahead window
NEVER = np.int64(2**62)
# meta slots
_COUNT, _HEAD, _TAIL, _HAND, _EVICT = 0, 1, 2, 3, 4


@njit(cache=True, nogil=True, inline="always")
def _h(x: np.int64, mask: np.int64) -> np.int64:
    return np.int64(((uint64(x) * uint64(0x9E3779B97F4A7C15)) >> uint64(20)) & uint64(mask))


@njit(cache=True, nogil=True)
def _find(hkeys: np.ndarray, mask: int, key: int) -> int:
    i = _h(key, mask)
    while hkeys[i] != -1:
        if hkeys[i] == key:
            return i
        i = (i + 1) & mask
    return -1


@njit(cache=True, nogil=True)
def _hinsert(hkeys: np.ndarray, hvals: np.ndarray, mask: int, key: int, val: int) -> None:
    i = _h(key, mask)
    while hkeys[i] != -1:
        i = (i + 1) & mask
    hkeys[i] = key
    hvals[i] = val


@njit(cache=True, nogil=True)
def _hdelete(hkeys: np.ndarray, hvals: np.ndarray, mask: int, i: int) -> None:
    """Delete entry ``i`` and shift later entries of its probe run back (no tombstones)."""
    j = i
    while True:
        j = (j + 1) & mask
        if hkeys[j] == -1:
            break
        k = _h(hkeys[j], mask)
        if i <= j:
            if i < k <= j:
                continue
        else:
            if k > i or k <= j:
                continue
        hkeys[i] = hkeys[j]
        hvals[i] = hvals[j]
        i = j
    hkeys[i] = -1


@njit(cache=True, nogil=True, inline="always")
def _unlink(s: int, newer: np.ndarray, older: np.ndarray, meta: np.ndarray) -> None:
    n, o = newer[s], older[s]
    if n >= 0:
        older[n] = o
    else:
        meta[_HEAD] = o
    if o >= 0:
        newer[o] = n
    else:
        meta[_TAIL] = n
    newer[s] = -1
    older[s] = -1


@njit(cache=True, nogil=True, inline="always")
def _push_head(s: int, newer: np.ndarray, older: np.ndarray, meta: np.ndarray) -> None:
    h = meta[_HEAD]
    older[s] = h
    newer[s] = -1
    if h >= 0:
        newer[h] = s
    else:
        meta[_TAIL] = s
    meta[_HEAD] = s


@njit(cache=True, nogil=True)
def _lookup(policy: int, ids: np.ndarray, hkeys: np.ndarray, hvals: np.ndarray, data: np.ndarray,
            newer: np.ndarray, older: np.ndarray, bit: np.ndarray, meta: np.ndarray,
            out: np.ndarray, found: np.ndarray) -> int:
    """Copy cached rows of ``ids`` into ``out``, flag them in ``found``, update the policy; #hits."""
    mask = hkeys.shape[0] - 1
    hits = 0
    for i in range(ids.shape[0]):
        e = _find(hkeys, mask, ids[i])
        if e < 0:
            found[i] = False
            continue
        s = hvals[e]
        out[i, :] = data[s, :]
        found[i] = True
        hits += 1
        if policy == 0:  # LRU: move to the front
            _unlink(s, newer, older, meta)
            _push_head(s, newer, older, meta)
        else:  # CLOCK reference bit / SIEVE visited bit
            bit[s] = 1
    return hits


@njit(cache=True, nogil=True)
def _evict(policy: int, hkeys: np.ndarray, hvals: np.ndarray, slot_key: np.ndarray,
           newer: np.ndarray, older: np.ndarray, bit: np.ndarray, meta: np.ndarray) -> int:
    """Choose a victim slot, drop its key; returns the freed slot."""
    k = slot_key.shape[0]
    if policy == 0:  # LRU: the tail
        s = meta[_TAIL]
        _unlink(s, newer, older, meta)
    elif policy == 1:  # CLOCK
        while True:
            s = meta[_HAND]
            meta[_HAND] = (s + 1) % k
            if bit[s]:
                bit[s] = 0
            else:
                break
    else:  # SIEVE: from the hand (or the oldest) towards the newest, skip visited entries
        s = meta[_HAND] if meta[_HAND] >= 0 else meta[_TAIL]
        while bit[s]:
            bit[s] = 0
            s = newer[s] if newer[s] >= 0 else meta[_TAIL]
        meta[_HAND] = newer[s]
        _unlink(s, newer, older, meta)
    e = _find(hkeys, hkeys.shape[0] - 1, slot_key[s])
    _hdelete(hkeys, hvals, hkeys.shape[0] - 1, e)
    slot_key[s] = -1
    meta[_EVICT] += 1
    return s


@njit(cache=True, nogil=True)
def _admit(policy: int, ids: np.ndarray, rows: np.ndarray, hkeys: np.ndarray, hvals: np.ndarray,
           data: np.ndarray, slot_key: np.ndarray, newer: np.ndarray, older: np.ndarray,
           bit: np.ndarray, meta: np.ndarray) -> int:
    """Insert rows not yet cached, evicting by the policy; returns #inserted."""
    mask = hkeys.shape[0] - 1
    k = slot_key.shape[0]
    ins = 0
    for i in range(ids.shape[0]):
        key = ids[i]
        if _find(hkeys, mask, key) >= 0:
            continue
        if meta[_COUNT] < k:
            s = meta[_COUNT]
            meta[_COUNT] += 1
        else:
            s = _evict(policy, hkeys, hvals, slot_key, newer, older, bit, meta)
        data[s, :] = rows[i, :]
        slot_key[s] = key
        bit[s] = 0
        if policy != 1:
            _push_head(s, newer, older, meta)
        _hinsert(hkeys, hvals, mask, key, s)
        ins += 1
    return ins


@njit(cache=True, nogil=True)
def _heap_fix(heap: np.ndarray, hpos: np.ndarray, key: np.ndarray, i: int, n: int) -> None:
    """Restore the max-heap ``heap[:n]`` (slots ordered by ``key[slot]``) after entry ``i``'s key
    changed: sift it up, then down; ``hpos[slot]`` is the slot's heap index."""
    s = heap[i]
    k = key[s]
    while i > 0:
        p = (i - 1) >> 1
        if key[heap[p]] >= k:
            break
        heap[i] = heap[p]
        hpos[heap[i]] = i
        i = p
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and key[heap[c + 1]] > key[heap[c]]:
            c += 1
        if key[heap[c]] <= k:
            break
        heap[i] = heap[c]
        hpos[heap[i]] = i
        i = c
    heap[i] = s
    hpos[s] = i


@njit(cache=True, nogil=True)
def _lookup_next(ids: np.ndarray, nxt_use: np.ndarray, hkeys: np.ndarray, hvals: np.ndarray,
                 data: np.ndarray, nxt: np.ndarray, heap: np.ndarray, hpos: np.ndarray,
                 meta: np.ndarray, out: np.ndarray, found: np.ndarray) -> int:
    """Belady lookup: copy cached rows, set their next use to ``nxt_use[i]`` (empty: keep it)."""
    mask = hkeys.shape[0] - 1
    hits = 0
    have = nxt_use.shape[0] > 0
    for i in range(ids.shape[0]):
        e = _find(hkeys, mask, ids[i])
        if e < 0:
            found[i] = False
            continue
        s = hvals[e]
        out[i, :] = data[s, :]
        found[i] = True
        hits += 1
        if have:
            nxt[s] = nxt_use[i]
            _heap_fix(heap, hpos, nxt, hpos[s], meta[_COUNT])
    return hits


@njit(cache=True, nogil=True)
def _admit_next(ids: np.ndarray, nxt_use: np.ndarray, rows: np.ndarray, hkeys: np.ndarray,
                hvals: np.ndarray, data: np.ndarray, slot_key: np.ndarray, nxt: np.ndarray,
                heap: np.ndarray, hpos: np.ndarray, meta: np.ndarray) -> int:
    """Belady admission: a row used again within the window enters a free slot, or replaces the
    entry used furthest ahead when that is later than its own next use; returns #inserted."""
    mask = hkeys.shape[0] - 1
    k = slot_key.shape[0]
    ins = 0
    for i in range(ids.shape[0]):
        t = nxt_use[i]
        if t >= NEVER:
            continue
        key = ids[i]
        if _find(hkeys, mask, key) >= 0:
            continue
        n = meta[_COUNT]
        if n < k:
            s = n
            meta[_COUNT] += 1
            heap[n] = s
            hpos[s] = n
        else:
            s = heap[0]
            if nxt[s] <= t:
                continue  # everything cached is needed sooner
            _hdelete(hkeys, hvals, mask, _find(hkeys, mask, slot_key[s]))
            meta[_EVICT] += 1
        data[s, :] = rows[i, :]
        slot_key[s] = key
        nxt[s] = t
        _heap_fix(heap, hpos, nxt, hpos[s], meta[_COUNT])
        _hinsert(hkeys, hvals, mask, key, s)
        ins += 1
    return ins


@njit(cache=True, nogil=True)
def _announce(ids: np.ndarray, t: int, hkeys: np.ndarray, hvals: np.ndarray, nxt: np.ndarray,
              heap: np.ndarray, hpos: np.ndarray, meta: np.ndarray) -> None:
    """Cached rows among ``ids`` are next used at ``t`` unless known to be used sooner."""
    mask = hkeys.shape[0] - 1
    for i in range(ids.shape[0]):
        e = _find(hkeys, mask, ids[i])
        if e >= 0:
            s = hvals[e]
            if nxt[s] > t:
                nxt[s] = t
                _heap_fix(heap, hpos, nxt, hpos[s], meta[_COUNT])


class CacheStats:
    """Counters of one epoch: ``hits``, ``misses`` (rows), ``bytes_read`` by the fallback."""

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.bytes_read = 0

    @property
    def hit_ratio(self) -> float:
        t = self.hits + self.misses
        return self.hits / t if t else 0.0

    def as_dict(self) -> dict:
        return {"cache_hits": self.hits, "cache_misses": self.misses,
                "cache_hit_ratio": self.hit_ratio, "cache_bytes_read": self.bytes_read}


class CachedFeature:
    """Rows of ``fallback`` with a CPU cache of ``capacity`` rows in front of it.

    Args:
        fallback: object with ``shape``, ``dtype`` and ``gather(ids) -> (rows, bytes_read)``.
        capacity: rows held (0 disables the cache: every row goes to the fallback).
        policy: ``sieve`` | ``clock`` | ``lru`` | ``belady`` (callers pass next uses).

    Raises:
        ValueError: unknown policy or negative capacity.

    >>> import numpy as np
    >>> class Rows:  # a fallback that serves x[v] = v
    ...     shape, dtype = (100, 2), np.dtype(np.float32)
    ...     def gather(self, ids): return np.repeat(ids[:, None], 2, 1).astype(np.float32), 8 * len(ids)
    >>> c = CachedFeature(Rows(), capacity=4, policy="sieve")
    >>> c.gather(np.array([1, 2]))[0][:, 0].tolist(), c.gather(np.array([2, 3]))[0][:, 0].tolist()
    ([1.0, 2.0], [2.0, 3.0])
    >>> c.stats.hits, c.stats.misses
    (1, 3)
    """

    def __init__(self, fallback, capacity: int, policy: str = "sieve") -> None:
        if policy not in _POLICY_ID:
            raise ValueError(f"unknown cache policy {policy!r}; choose from {', '.join(POLICIES)}")
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0 rows, got {capacity}")
        self.fallback = fallback
        self.policy = policy
        self._pid = _POLICY_ID[policy]
        self.shape = tuple(fallback.shape)
        self.dtype = np.dtype(fallback.dtype)
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self.capacity = int(capacity)
        k = max(self.capacity, 1)
        h = 16
        while h < 2 * k:
            h *= 2
        self._hkeys = np.full(h, -1, dtype=np.int64)
        self._hvals = np.zeros(h, dtype=np.int64)
        self._data = np.zeros((k, self.row_bytes), dtype=np.uint8)
        self._slot_key = np.full(k, -1, dtype=np.int64)
        self._newer = np.full(k, -1, dtype=np.int64)
        self._older = np.full(k, -1, dtype=np.int64)
        self._bit = np.zeros(k, dtype=np.uint8)
        self._meta = np.array([0, -1, -1, -1, 0, 0, 0, 0], dtype=np.int64)
        if policy == "clock":
            self._meta[_HAND] = 0
        # belady: next use of every slot and a max-heap of the slots on it
        nb = k if policy == "belady" else 0
        self._next = np.full(nb, NEVER, dtype=np.int64)
        self._heap = np.zeros(nb, dtype=np.int64)
        self._hpos = np.zeros(nb, dtype=np.int64)
        self.stats = CacheStats()

    @staticmethod
    def bytes_per_row(row_bytes: int) -> int:
        """Memory per cached row: the row, hash table (2 x 2 x 8 B), slot key, links (or, for
        ``belady``, next use and heap position), bit."""
        return row_bytes + 32 + 8 + 16 + 1

    @staticmethod
    def table_bytes(capacity: int, row_bytes: int, policy: str = "sieve") -> int:
        """Exact :attr:`nbytes` of a cache of ``capacity`` rows: rows, slot keys, links and bits,
        next uses and heap positions (``belady``), and the hash table of the smallest power of two
        (at least 16) holding ``2 x capacity`` entries of two int64."""
        k = max(int(capacity), 1)
        h = 16
        while h < 2 * k:
            h *= 2
        per = row_bytes + 8 * 3 + 1 + (24 if policy in LOOKAHEAD_POLICIES else 0)
        return k * per + 16 * h

    @staticmethod
    def rows_for(nbytes: int, row_bytes: int, policy: str = "sieve") -> int:
        """The largest capacity whose :meth:`table_bytes` fits ``nbytes`` (0 if none does)."""
        lo, hi = 0, max(int(nbytes) // max(row_bytes + 25, 1), 0) + 1
        while lo < hi:  # largest k with table_bytes(k) <= nbytes
            mid = (lo + hi + 1) // 2
            if CachedFeature.table_bytes(mid, row_bytes, policy) <= nbytes:
                lo = mid
            else:
                hi = mid - 1
        return lo

    @property
    def nbytes(self) -> int:
        """Host memory held by the cache (rows and metadata)."""
        return int(sum(a.nbytes for a in (self._hkeys, self._hvals, self._data, self._slot_key,
                                          self._newer, self._older, self._bit, self._next,
                                          self._heap, self._hpos)))

    @property
    def lookahead(self) -> bool:
        """Whether gathers should pass next uses (``belady``)."""
        return self.policy in LOOKAHEAD_POLICIES

    def announce(self, ids: np.ndarray, t: int) -> None:
        """``belady``: the rows ``ids`` are asked for at time ``t`` (a batch entering the look-ahead
        window); cached ones get next use ``t`` unless already known to be used sooner."""
        if self.lookahead and self.capacity and ids.shape[0]:
            _announce(np.ascontiguousarray(ids, dtype=np.int64), int(t), self._hkeys, self._hvals,
                      self._next, self._heap, self._hpos, self._meta)

    def forget_next_uses(self) -> None:
        """``belady``: every cached row's next use becomes unknown (a new window begins)."""
        self._next[:] = NEVER

    def __len__(self) -> int:
        return int(self._meta[_COUNT])

    def reset_stats(self) -> CacheStats:
        old, self.stats = self.stats, CacheStats()
        return old

    def gather(self, ids: np.ndarray, next_use: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Rows ``feature[ids]``: hits from the cache, misses from the fallback (then admitted).

        Args:
            ids: int64 [n] node ids (duplicates allowed).
            next_use: ``belady`` only: int64 [n], when each row is asked for next (:data:`NEVER`:
                not within the window); None: rows are served but none is admitted.

        Returns:
            ``(rows [n, *row_shape] of the feature dtype, bytes read by the fallback)``.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        out = np.empty((n, *self.shape[1:]), dtype=self.dtype)
        if n == 0:
            return out, 0
        flat = out.reshape(n, -1).view(np.uint8).reshape(n, self.row_bytes)
        if self.capacity == 0:
            rows, nb = self.fallback.gather(ids)
            out[...] = rows
            self.stats.misses += n
            self.stats.bytes_read += nb
            return out, nb
        found = np.empty(n, dtype=np.bool_)
        look = self.lookahead
        nu = np.zeros(0, dtype=np.int64) if next_use is None else \
            np.ascontiguousarray(next_use, dtype=np.int64)
        if look:
            hits = _lookup_next(ids, nu, self._hkeys, self._hvals, self._data, self._next,
                                self._heap, self._hpos, self._meta, flat, found)
        else:
            hits = _lookup(self._pid, ids, self._hkeys, self._hvals, self._data, self._newer,
                           self._older, self._bit, self._meta, flat, found)
        self.stats.hits += int(hits)
        nb = 0
        if hits < n:
            pos = np.flatnonzero(~found)
            miss_ids = ids[pos]
            rows, nb = self.fallback.gather(miss_ids)
            rows = np.ascontiguousarray(rows, dtype=self.dtype)
            out[pos] = rows
            self.stats.misses += int(pos.shape[0])
            self.stats.bytes_read += int(nb)
            rflat = rows.reshape(pos.shape[0], -1).view(np.uint8).reshape(pos.shape[0], self.row_bytes)
            if look:
                if nu.shape[0]:
                    _admit_next(miss_ids, nu[pos], rflat, self._hkeys, self._hvals, self._data,
                                self._slot_key, self._next, self._heap, self._hpos, self._meta)
            else:
                _admit(self._pid, miss_ids, rflat, self._hkeys, self._hvals, self._data,
                       self._slot_key, self._newer, self._older, self._bit, self._meta)
        return out, int(nb)

    def peek(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cached rows of ``ids`` without reading or admitting the others.

        Returns:
            ``(rows [n, *row_shape] (rows not cached are undefined), found bool [n])``; the hits
            count in :attr:`stats` (and update the policy), the misses do not.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        out = np.empty((n, *self.shape[1:]), dtype=self.dtype)
        found = np.zeros(n, dtype=np.bool_)
        if n == 0 or self.capacity == 0:
            return out, found
        flat = out.reshape(n, -1).view(np.uint8).reshape(n, self.row_bytes)
        if self.lookahead:
            hits = _lookup_next(ids, np.zeros(0, dtype=np.int64), self._hkeys, self._hvals,
                                self._data, self._next, self._heap, self._hpos, self._meta, flat,
                                found)
        else:
            hits = _lookup(self._pid, ids, self._hkeys, self._hvals, self._data, self._newer,
                           self._older, self._bit, self._meta, flat, found)
        self.stats.hits += int(hits)
        return out, found

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """bool [n]: which ids are cached now (no policy update)."""
        mask = self._hkeys.shape[0] - 1
        return np.array([_find(self._hkeys, mask, int(v)) >= 0 for v in np.asarray(ids).tolist()],
                        dtype=np.bool_)


def cpu_cached_feature(fallback, max_cache_size: int, policy: str = "sieve") -> CachedFeature:
    """A :class:`CachedFeature` over ``fallback`` using at most ``max_cache_size`` bytes.

    Raises:
        ValueError: unknown policy.
    """
    row_bytes = int(np.prod(tuple(fallback.shape)[1:], dtype=np.int64)) * np.dtype(fallback.dtype).itemsize
    cap = CachedFeature.rows_for(int(max_cache_size), row_bytes, policy)
    return CachedFeature(fallback, cap, policy)
