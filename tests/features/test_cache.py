"""Feature caches: each policy against a reference model on exact traces; composition with disk."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from ooc.features.cache import POLICIES, CachedFeature, cpu_cached_feature
from ooc.storage.io import DiskRows
from ooc.storage.rawarray import RawArray, write_array


class Ident:
    """Fallback serving x[v] = (v, v) and counting rows asked."""

    shape, dtype = (10_000, 2), np.dtype(np.float32)

    def __init__(self) -> None:
        self.asked = 0

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        self.asked += len(ids)
        return np.repeat(ids[:, None], 2, 1).astype(np.float32), 8 * len(ids)


def ref_hits(policy: str, cap: int, trace: list[int]) -> tuple[list[bool], set[int]]:
    """Reference models: LRU (OrderedDict), CLOCK (ring + bits), SIEVE (list + hand)."""
    hits = []
    if policy == "lru":
        od: OrderedDict = OrderedDict()
        for k in trace:
            if k in od:
                od.move_to_end(k)
                hits.append(True)
                continue
            hits.append(False)
            if len(od) == cap:
                od.popitem(last=False)
            od[k] = 1
        return hits, set(od)
    if policy == "clock":
        slots: list = []
        bits: list = []
        hand = 0
        for k in trace:
            if k in slots:
                bits[slots.index(k)] = 1
                hits.append(True)
                continue
            hits.append(False)
            if len(slots) < cap:
                slots.append(k)
                bits.append(0)
                continue
            while bits[hand]:
                bits[hand] = 0
                hand = (hand + 1) % cap
            slots[hand], bits[hand] = k, 0
            hand = (hand + 1) % cap
        return hits, set(slots)
    # SIEVE: queue[0] = newest; the hand walks from the oldest towards the newest
    q: list = []
    visited: dict = {}
    hand = None
    for k in trace:
        if k in visited:
            visited[k] = 1
            hits.append(True)
            continue
        hits.append(False)
        if len(q) == cap:
            o = hand if hand is not None else q[-1]
            while visited[o]:
                visited[o] = 0
                i = q.index(o)
                o = q[i - 1] if i > 0 else q[-1]
            i = q.index(o)
            hand = q[i - 1] if i > 0 else None
            q.remove(o)
            del visited[o]
        q.insert(0, k)
        visited[k] = 0
    return hits, set(q)


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_matches_reference_on_a_trace(policy: str) -> None:
    rng = np.random.default_rng(7)
    trace = (rng.zipf(1.3, 3000) % 200).tolist()
    c = CachedFeature(Ident(), capacity=23, policy=policy)
    got = []
    for k in trace:
        rows, _ = c.gather(np.array([k]))
        assert rows[0, 0] == k
        got.append(c.stats.hits)
    hits = np.diff([0] + got).astype(bool).tolist()
    exp, content = ref_hits(policy, 23, trace)
    assert hits == exp
    assert set(np.flatnonzero(c.contains(np.arange(200))).tolist()) == content
    assert len(c) == 23


def test_sieve_keeps_visited_entries_exact_case() -> None:
    # capacity 3: A B C inserted; A hit; D evicts B (oldest unvisited), A survives; E evicts C
    c = CachedFeature(Ident(), capacity=3, policy="sieve")
    for k in [1, 2, 3, 1, 4, 5]:
        c.gather(np.array([k]))
    assert c.contains(np.array([1, 2, 3, 4, 5])).tolist() == [True, False, False, True, True]
    lru = CachedFeature(Ident(), capacity=3, policy="lru")
    for k in [1, 2, 3, 1, 4, 5]:
        lru.gather(np.array([k]))
    assert lru.contains(np.array([1, 2, 3, 4, 5])).tolist() == [True, False, False, True, True]
    assert c.stats.hits == 1 and c.stats.misses == 5 and c.stats.hit_ratio == pytest.approx(1 / 6)


@pytest.mark.parametrize("policy", POLICIES)
def test_batched_gather_over_disk_rows(tmp_path: Path, policy: str) -> None:
    x = np.random.default_rng(0).normal(size=(5000, 8)).astype(np.float16)
    write_array(tmp_path / "x", x, chunk_rows=1024)
    disk = DiskRows(RawArray(tmp_path / "x"), threads=2)
    size = 1000 * CachedFeature.bytes_per_row(16)
    c = cpu_cached_feature(disk, max_cache_size=size, policy=policy)
    # the largest cache whose arrays (rows, links, the power-of-two hash table) fit the size
    assert c.nbytes == CachedFeature.table_bytes(c.capacity, 16, policy) <= size
    assert CachedFeature.table_bytes(c.capacity + 1, 16, policy) > size and c.capacity > 900
    rng = np.random.default_rng(1)
    for _ in range(20):
        ids = rng.integers(0, 5000, 700)
        rows, _ = c.gather(ids)
        assert np.array_equal(rows, x[ids])
    assert 0 < c.stats.hit_ratio < 1
    assert c.stats.bytes_read == disk.counters.bytes_read
    assert c.nbytes <= size


def test_zero_capacity_and_bad_policy() -> None:
    f = Ident()
    c = CachedFeature(f, capacity=0)
    c.gather(np.array([1, 2, 1]))
    assert f.asked == 3 and c.stats.hits == 0
    with pytest.raises(ValueError, match="unknown cache policy"):
        CachedFeature(f, 4, policy="fifo")
