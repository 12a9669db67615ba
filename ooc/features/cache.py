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

Hit ratio = hits / (hits + misses) over the rows asked of the cache.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

__all__ = ["POLICIES", "CachedFeature", "cpu_cached_feature", "CacheStats"]

POLICIES = ("sieve", "clock", "lru")
_POLICY_ID = {"lru": 0, "clock": 1, "sieve": 2}
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
        policy: ``sieve`` | ``clock`` | ``lru``.

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
        self.stats = CacheStats()

    @staticmethod
    def bytes_per_row(row_bytes: int) -> int:
        """Memory per cached row: the row, hash table (2 x 2 x 8 B), slot key, links, bit."""
        return row_bytes + 32 + 8 + 16 + 1

    @property
    def nbytes(self) -> int:
        """Host memory held by the cache (rows and metadata)."""
        return int(sum(a.nbytes for a in (self._hkeys, self._hvals, self._data, self._slot_key,
                                          self._newer, self._older, self._bit)))

    def __len__(self) -> int:
        return int(self._meta[_COUNT])

    def reset_stats(self) -> CacheStats:
        old, self.stats = self.stats, CacheStats()
        return old

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """Rows ``feature[ids]``: hits from the cache, misses from the fallback (then admitted).

        Args:
            ids: int64 [n] node ids (duplicates allowed).

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
            _admit(self._pid, miss_ids, rflat, self._hkeys, self._hvals, self._data, self._slot_key,
                   self._newer, self._older, self._bit, self._meta)
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
    cap = max(0, int(max_cache_size) // CachedFeature.bytes_per_row(row_bytes))
    return CachedFeature(fallback, cap, policy)
