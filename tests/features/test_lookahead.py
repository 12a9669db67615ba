"""Exact mode's look-ahead cache: Belady's MIN over next uses (ooc.features.cache, policy belady)
against a reference model, next uses over a window (ooc.data.lookahead) against brute force, and
training with it: the same losses as without a cache, more hits than SIEVE."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ooc.config import TrainConfig
from ooc.data.lookahead import Lookahead, next_uses
from ooc.features.cache import NEVER, CachedFeature
from ooc.training.loop import train


class Ident:
    shape, dtype = (10_000, 2), np.dtype(np.float32)

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        return np.repeat(ids[:, None], 2, 1).astype(np.float32), 8 * len(ids)


def batches(seed: int, n: int, count: int, size: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # a skewed popularity, so that what to keep matters
    p = 1.0 / np.arange(1, n + 1) ** 0.7
    return [rng.choice(n, size, replace=False, p=p / p.sum()).astype(np.int64) for _ in range(count)]


def exact_next_uses(bs: list[np.ndarray], window: int) -> list[np.ndarray]:
    """Brute force: for every row of batch t, the first later batch within ``window`` with it."""
    out = []
    for t, b in enumerate(bs):
        nu = np.full(b.shape[0], NEVER, dtype=np.int64)
        for i, v in enumerate(b.tolist()):
            for u in range(t + 1, min(len(bs), t + window)):
                if v in set(bs[u].tolist()):
                    nu[i] = u
                    break
        out.append(nu)
    return out


def reference_hits(bs: list[np.ndarray], uses: list[np.ndarray], cap: int) -> int:
    """Belady with bypass as the kernel applies it: a batch's lookups first (hits take their new
    next use), then its misses in order: admitted when used again, into a free slot or in place of
    the entry used furthest ahead if that is later than the row's own next use."""
    nxt: dict[int, int] = {}
    hits = 0
    for b, nu in zip(bs, uses):
        miss = []
        for v, t in zip(b.tolist(), nu.tolist()):
            if v in nxt:
                hits += 1
                nxt[v] = t
            else:
                miss.append((v, t))
        for v, t in miss:
            if t >= NEVER or v in nxt:
                continue
            if len(nxt) < cap:
                nxt[v] = t
                continue
            far = max(nxt.values())
            if far <= t:
                continue
            victim = next(k for k, x in nxt.items() if x == far)
            del nxt[victim]
            nxt[v] = t
    return hits


@pytest.mark.parametrize("cap", [1, 7, 40, 500])
def test_belady_cache_matches_reference(cap: int) -> None:
    """Next uses of the whole trace given: the same hits as the reference, rows exact, and at
    least as many hits as SIEVE, CLOCK and LRU with the same capacity."""
    bs = batches(0, 400, 30, 25)
    uses = exact_next_uses(bs, len(bs))
    c = CachedFeature(Ident(), cap, "belady")
    for b, nu in zip(bs, uses):
        rows, _ = c.gather(b, nu)
        assert np.array_equal(rows[:, 0], b.astype(np.float32))
    assert c.stats.hits == reference_hits(bs, uses, cap)
    assert len(c) <= cap
    for pol in ("sieve", "clock", "lru"):
        other = CachedFeature(Ident(), cap, pol)
        for b in bs:
            other.gather(b)
        assert c.stats.hits >= other.stats.hits


def test_belady_without_next_uses_admits_nothing_and_announce() -> None:
    """Gathers without next uses (evaluation) are served but admit nothing; ``announce`` gives a
    cached row without a known next use one, so it outlives rows not needed again."""
    c = CachedFeature(Ident(), 2, "belady")
    c.gather(np.array([1, 2, 3]))
    assert len(c) == 0
    c.gather(np.array([1, 2]), np.array([5, NEVER]))     # 1 cached (used at 5), 2 not admitted
    assert c.contains(np.array([1, 2])).tolist() == [True, False]
    c.gather(np.array([1, 3]), np.array([NEVER, 9]))     # 1 hit: now never again; 3 cached
    c.announce(np.array([1]), 7)                         # 1 is asked for at 7 after all
    c.gather(np.array([4]), np.array([8]))               # evicts 3 (at 9), keeps 1 (at 7)
    assert c.contains(np.array([1, 3, 4])).tolist() == [True, False, True]
    c.forget_next_uses()
    c.gather(np.array([5]), np.array([2]))               # everything unknown: 5 replaces one
    assert c.contains(np.array([5])).tolist() == [True] and len(c) == 2


@pytest.mark.parametrize("window", [2, 5, 40])
def test_next_uses_over_a_window_equal_brute_force(window: int) -> None:
    bs = batches(1, 300, 12, 30)
    ids = np.concatenate(bs)
    starts = np.zeros(len(bs) + 1, dtype=np.int64)
    np.cumsum([b.shape[0] for b in bs], out=starts[1:])
    w = min(window, len(bs))
    first = min(3, w - 1)
    out = np.empty(int(starts[first]), dtype=np.int64)
    size = 1 << int(np.ceil(np.log2(1.5 * starts[w] + 16)))
    next_uses(ids[:starts[w]].astype(np.int32), starts[:w + 1], np.arange(w, dtype=np.int64) + 10,
              first, np.full(size, -1, np.int32), np.zeros(size, np.int32), out)
    ref = exact_next_uses(bs[:w], w)
    for b in range(first):
        expect = np.where(ref[b] < NEVER, ref[b] + 10, NEVER)
        assert np.array_equal(out[starts[b]:starts[b + 1]], expect)


def test_lookahead_gives_every_batch_in_order_with_its_next_uses() -> None:
    """Through :class:`Lookahead` the samples are those of the plan in order, and the next uses
    given for a batch are never wrong (a finite one is a later batch of the window that asks for
    the row); a jump (resume) restarts the window there."""
    from types import SimpleNamespace

    from ooc.contracts import Plan
    bs = batches(2, 300, 20, 30)
    plan = Plan(batches=bs, batch_state=[-1] * len(bs))
    sampled = []

    def sample(p: Plan, j: int, epoch: int) -> SimpleNamespace:
        sampled.append(j)
        return SimpleNamespace(input_nodes=p.batches[j])
    la = Lookahead(sample, CachedFeature(Ident(), 10, "belady"), window=6, num_nodes=300, group=2)
    for j in list(range(0, 12)) + list(range(15, 20)):
        mb, nu = la.take(plan, 0, j)
        assert mb.input_nodes is bs[j]
        for v, t in zip(bs[j].tolist(), nu.tolist()):
            if t < NEVER:
                assert j < t < j + 6 and v in set(bs[t].tolist())
                assert not any(v in set(bs[u].tolist()) for u in range(j + 1, t))
    assert sampled == list(range(0, 17)) + list(range(15, 20))  # 12..14 sampled, never taken


def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=2, hidden=16, partitions=8, progress=False, mode="exact", seed=3)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_exact_training_with_belady_equals_without_cache(planted_dataset: Path, tmp_path: Path) -> None:
    """``--cache-policy belady``: the loss sequence of exact training without a budget, more cache
    hits than SIEVE in the same budget, and the same again after a resume mid-epoch."""
    free = train(_cfg(planted_dataset, tmp_path / "free"))
    tight = dict(memory_budget="8MB", cache_size="60kB")
    bel = train(_cfg(planted_dataset, tmp_path / "belady", cache_policy="belady", lookahead=8, **tight))
    sieve = train(_cfg(planted_dataset, tmp_path / "sieve", **tight))
    assert bel["losses"] == free["losses"] == sieve["losses"]
    assert bel["test_acc"] == free["test_acc"]
    assert bel["budget"]["slots"] == 0 and bel["cache_hits"] > sieve["cache_hits"]
    from ooc.training.loop import Interrupted
    cfg = _cfg(planted_dataset, tmp_path / "resumed", cache_policy="belady", lookahead=8,
               checkpoint_every=2, **tight)
    with pytest.raises(Interrupted):
        train(cfg, stop_after_steps=3)
    assert train(cfg, resume=True)["losses"] == free["losses"]
    with pytest.raises(ValueError, match="needs --mode exact"):
        _cfg(planted_dataset, tmp_path / "x", cache_policy="belady", mode="hybrid").validate()
