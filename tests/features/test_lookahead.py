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


# ---------------------------------------------------------------- read-ahead (--read-ahead)

def test_staged_rows_serve_held_ids_and_report_the_rest() -> None:
    """A staged table answers exactly the held ids (any order, duplicates), nothing else."""
    from ooc.features.tiers import StagedRows
    st = StagedRows((2,), np.dtype(np.float32))
    held = np.array([3, 7, 8, 20], dtype=np.int64)
    st.put(held, np.repeat(held[:, None], 2, 1).astype(np.float32))
    ids = np.array([8, 0, 20, 8, 21, 3, 2], dtype=np.int64)
    rows, found = st.peek(ids)
    assert found.tolist() == [True, False, True, True, False, True, False]
    assert rows[found, 0].tolist() == [8, 20, 8, 3] and st.reset_stats() == 4
    st.clear()
    assert st.size == 0 and not st.peek(ids)[1].any()
    with pytest.raises(ValueError, match="3 ids for 2 rows"):
        st.put(np.arange(3, dtype=np.int64), np.zeros((2, 2), np.float32))


class CountingRows(Ident):
    """Rows ``[v, v]`` that record every gather's ids."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        self.calls.append(np.asarray(ids).copy())
        return super().gather(ids)


def test_read_ahead_reads_each_window_once_and_batches_get_exact_rows() -> None:
    """Every ``window`` steps one gather reads the sorted union of the window's missing rows; the
    batches then find all of them staged (no other read), and rows are the disk's values.  A jump
    (resume) starts a window there; ``release`` drops the rows."""
    from types import SimpleNamespace

    from ooc.contracts import Plan
    from ooc.data.lookahead import ReadAhead
    from ooc.features.tiers import MissRows
    bs = batches(5, 400, 10, 40)
    plan = Plan(batches=bs, batch_state=[-1] * len(bs))
    disk = CountingRows()
    misses = MissRows(disk)  # type: ignore[arg-type]

    def sample(p: Plan, j: int, epoch: int) -> SimpleNamespace:
        return SimpleNamespace(input_nodes=p.batches[j])

    def missing(p: Plan, j: int, mb: SimpleNamespace) -> np.ndarray:
        return mb.input_nodes[mb.input_nodes >= 100]  # rows below 100 are "resident"
    ra = ReadAhead(sample, misses, 4, missing)  # type: ignore[arg-type]
    for j in range(10):
        mb = ra.take(plan, 0, j)
        assert mb.input_nodes is bs[j]
        need = bs[j][bs[j] >= 100]
        rows, nbytes = misses.gather(need)
        assert nbytes == 0 and rows[:, 0].tolist() == need.tolist()
    assert len(disk.calls) == 3  # windows 0-3, 4-7, 8-9
    for w, c in zip((range(0, 4), range(4, 8), range(8, 10)), disk.calls):
        u = np.unique(np.concatenate([bs[j] for j in w]))
        assert c.tolist() == u[u >= 100].tolist()
    st = ra.reset_stats()
    assert st["read_ahead_reads"] == 3 and st["read_ahead_rows"] == sum(len(c) for c in disk.calls)
    assert st["read_ahead_hits"] == sum(int((b >= 100).sum()) for b in bs)
    ra.take(plan, 0, 6)  # a jump: the window restarts at 6
    assert disk.calls[-1].tolist() == np.unique(np.concatenate(bs[6:10]))[
        np.unique(np.concatenate(bs[6:10])) >= 100].tolist()
    ra.release()
    assert misses.staged.size == 0
    with pytest.raises(ValueError, match=">= 2"):
        ReadAhead(sample, misses, 1, missing)  # type: ignore[arg-type]


def test_read_ahead_samples_the_next_epochs_first_window_while_this_one_ends() -> None:
    """Given the next epoch's plan, the read-ahead samples its first window before the epoch
    ends and keeps it (only) through ``release(done=plan)``; the next epoch's first step is
    served from it without sampling again, matched by the plan's content (a plan made again
    is the same plan); an interrupted epoch or another plan keeps nothing / samples afresh."""
    from types import SimpleNamespace

    from ooc.contracts import Plan
    from ooc.data.lookahead import ReadAhead
    from ooc.features.tiers import MissRows
    b0, b1 = batches(5, 400, 10, 40), batches(6, 400, 10, 40)
    p0, p1 = (Plan(batches=b, batch_state=[-1] * len(b)) for b in (b0, b1))
    disk = CountingRows()
    misses = MissRows(disk)  # type: ignore[arg-type]
    sampled: list[tuple[int, int]] = []

    def sample(p: Plan, j: int, epoch: int) -> SimpleNamespace:
        sampled.append((epoch, j))
        nodes = p.batches[j]
        return SimpleNamespace(input_nodes=nodes, nodes=nodes, seeds=nodes[:1],
                               seed_positions=np.zeros(1, np.int64), blocks=[])

    def missing(p: Plan, j: int, mb: SimpleNamespace) -> np.ndarray:
        return mb.input_nodes
    ra = ReadAhead(sample, misses, 4, missing)  # type: ignore[arg-type]
    for j in range(10):
        ra.take(p0, 0, j, then=lambda: p1)
    ra.release(done=p0)
    assert misses.staged.size == 0
    assert sampled.count((1, 0)) == 1 and (1, 4) not in sampled  # the first window only
    # 4 samples (nodes, one seed, one position), the window's unique ids, the first batch's seeds
    assert ra.held_bytes == sum(int(b.nbytes) for b in b1[:4]) + 4 * 8 + 4 * 8 + \
        8 * np.unique(np.concatenate(b1[:4])).shape[0] + int(b1[0].nbytes)
    again = Plan(batches=[b.copy() for b in b1], batch_state=[-1] * len(b1))
    n = len(sampled)
    for j in range(10):
        mb = ra.take(again, 1, j)
        assert mb.input_nodes.tolist() == b1[j].tolist()
        assert misses.gather(b1[j])[0][:, 0].tolist() == b1[j].tolist()
        if j == 0:
            assert sampled[n:] in ([], [(1, 4)], [(1, 4), (1, 5)], [(1, 4), (1, 5), (1, 6)],
                                   [(1, 4), (1, 5), (1, 6), (1, 7)])  # only the next window
    assert sampled.count((1, 0)) == 1 and ra.held_bytes == 0
    ra.release(done=again)  # no plan after epoch 1 was given: nothing kept
    assert ra.held_bytes == 0
    for j in range(3):  # interrupted: nothing kept
        ra.take(p0, 0, j, then=lambda: p1)
    ra.release()
    assert ra.held_bytes == 0
    for j in range(10):
        ra.take(p0, 0, j, then=lambda: p1)
    ra.release(done=p0)
    assert ra.held_bytes > 0
    n = sampled.count((1, 0))
    ra.take(p0, 1, 0)  # another plan at epoch 1: sampled afresh, the kept window dropped
    assert sampled.count((1, 0)) == n + 1 and ra.held_bytes == 0


@pytest.mark.parametrize("mode", ["exact", "hybrid"])
def test_read_ahead_trains_the_losses_of_reading_per_batch(planted_dataset: Path, wide_planted: Path,
                                                           tmp_path: Path, mode: str) -> None:
    """``--read-ahead``: the same losses and accuracy as the same run without it (exact mode: as
    without a budget), rows asked for by several batches read once, and the same again after a
    resume (exact: a budget below the features; hybrid: 3 of 8 partitions resident)."""
    if mode == "exact":
        planted_dataset = wide_planted
        kw: dict = dict(mode=mode, memory_budget="4MB", topology="memory", batch_size=16,
                        fanouts=[3, 3], eval_batch_size=16)
    else:
        kw = dict(mode=mode, buffer_partitions=3)
    off = train(_cfg(planted_dataset, tmp_path / "off", read_ahead="0", **kw))
    on = train(_cfg(planted_dataset, tmp_path / "on", read_ahead="4", **kw))
    assert on["losses"] == off["losses"] and on["test_acc"] == off["test_acc"]
    if mode == "exact":
        free = {k: v for k, v in kw.items() if k != "memory_budget"}
        assert on["losses"] == train(_cfg(planted_dataset, tmp_path / "free", **free))["losses"]
    h = on["history"][-1]
    assert on["budget"]["read_ahead"] == 4 and on["budget"]["cache"] == 0
    assert h["read_ahead_reads"] == -(-(on["steps"] // 2) // 4) and h["read_ahead_hits"] > 0  # 2 epochs
    assert h["read_ahead_rows"] < h["row_misses"]  # rows asked by several batches read once
    from ooc.training.loop import Interrupted
    cfg = _cfg(planted_dataset, tmp_path / "resumed", read_ahead="4", checkpoint_every=2, **kw)
    with pytest.raises(Interrupted):
        train(cfg, stop_after_steps=3)
    assert train(cfg, resume=True)["losses"] == off["losses"]


@pytest.mark.parametrize("kw,match", [
    (dict(read_ahead="1"), "auto, 0 \\(off\\) or >= 2 batches, got '1'"),
    (dict(read_ahead="many"), "got 'many'"),
    (dict(read_ahead="4", mode="buffer"), "buffer mode"),
    (dict(read_ahead="4", task="link"), "node tasks"),
    (dict(read_ahead="4", cache_policy="belady"), "use one"),
    (dict(read_ahead="4", cache_size="1MB"), "the cache would never be asked"),
])
def test_read_ahead_refuses_what_it_cannot_serve(planted_dataset: Path, tmp_path: Path, kw: dict,
                                                 match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _cfg(planted_dataset, tmp_path / "x", **kw).validate()


@pytest.fixture(scope="module")
def wide_planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 nodes with 256 float32 features (3 MB: a 16-seed batch touches a few % of them)."""
    from ooc.ingest.convert import write_graph_dataset
    from ooc.kernels.generators import planted_partition
    from ooc.kernels.partition import contiguous_partitions
    g = planted_partition(3000, num_classes=4, avg_degree=8, feat_dim=256, noise=2.0, seed=1,
                          train_frac=0.3)
    return write_graph_dataset(tmp_path_factory.mktemp("wide") / "wide", g.num_nodes, g.src, g.dst,
                               g.features, g.labels, {"train": g.train, "valid": g.valid,
                                                      "test": g.test}, g.num_classes, "planted",
                               partition_offsets=contiguous_partitions(3000, 8))


def test_exact_evaluation_reads_ahead_in_the_training_window(wide_planted: Path,
                                                             tmp_path: Path) -> None:
    """``--read-ahead auto`` in exact mode under a budget: the window takes the cache's memory,
    evaluation reads its batches' rows together in the same memory, and losses and scores are
    those of reading per batch (sampled evaluation: out of core the default evaluates layer-wise)."""
    kw = dict(memory_budget="4MB", topology="memory", batch_size=16, fanouts=[3, 3],
              eval_batch_size=16, epochs=1, eval_mode="sampled")
    off = train(_cfg(wide_planted, tmp_path / "off", read_ahead="0", **kw))
    on = train(_cfg(wide_planted, tmp_path / "on", **kw))
    assert on["losses"] == off["losses"]
    assert (on["val_acc"], on["test_acc"]) == (off["val_acc"], off["test_acc"])
    b = on["budget"]
    assert b["read_ahead"] >= 2 and b["eval_read_ahead"] >= 2 and b["slots"] == 0
    assert b["cache"] < off["budget"]["cache"] and b["read_ahead_bytes"] > 0
    assert b["planned"] <= b["budget"]
    h = on["history"][-1]
    assert h["read_ahead_reads"] == -(-on["steps"] // b["read_ahead"])
    assert h["eval_read_ahead_reads"] >= 2 and h["eval_read_ahead_hits"] > 0
    # rows asked for by several batches of a window are read once (bytes can be higher than a
    # cache's on a graph this small: a batch touches a sixth of it and a cache hits 70%)
    assert h["read_ahead_rows"] < off["history"][-1]["row_misses"]


def test_sample_ahead_gives_every_step_in_order_and_restarts_after_a_jump() -> None:
    """Samples come from the producer thread in step order, each once; a jump (a resume, another
    epoch or plan) restarts it there; an error while sampling is raised by ``take``."""
    import threading

    from ooc.contracts import Plan
    from ooc.data.lookahead import SampleAhead
    bs = batches(3, 200, 6, 10)
    plan = Plan(batches=bs, batch_state=[-1] * len(bs))
    calls: list[tuple[int, int, str]] = []

    def sample(p: Plan, j: int, epoch: int) -> np.ndarray:
        calls.append((epoch, j, threading.current_thread().name))
        if epoch == 9:
            raise OSError(f"damaged list of step {j}")
        return p.batches[j] + 1000 * epoch
    sa = SampleAhead(sample, 1)  # type: ignore[arg-type]
    got = [sa.take(plan, 0, j) for j in range(6)]
    assert [g[0].tolist() for g in got] == [b.tolist() for b in bs]
    assert all(s >= 0 for _, s in got)
    assert [(e, j) for e, j, _ in calls] == [(0, j) for j in range(6)]
    assert {t for _, _, t in calls} == {"ooc-prefetch"}  # not the caller's thread
    calls.clear()
    assert sa.take(plan, 1, 3)[0].tolist() == (bs[3] + 1000).tolist()  # resumed at step 3
    assert sa.take(plan, 1, 4)[0].tolist() == (bs[4] + 1000).tolist()
    sa.close()
    assert [(e, j) for e, j, _ in calls][:2] == [(1, 3), (1, 4)]
    with pytest.raises(OSError, match="damaged list of step 2"):
        sa.take(plan, 9, 2)
    sa.close()
    with pytest.raises(ValueError, match=">= 1"):
        SampleAhead(sample, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["exact", "hybrid"])
def test_sample_ahead_trains_the_losses_of_sampling_in_the_loader(planted_dataset: Path,
                                                                  tmp_path: Path, mode: str) -> None:
    """``--sample-ahead`` (auto: 1 batch in exact and hybrid modes) changes where batches are
    sampled, never what is trained: the same losses and scores as ``--sample-ahead 0``, with and
    without a budget (which charges the samples), and again after a resume."""
    kw: dict = dict(mode=mode, buffer_partitions=3, read_ahead="0")
    off = train(_cfg(planted_dataset, tmp_path / "off", sample_ahead="0", **kw))
    on = train(_cfg(planted_dataset, tmp_path / "on", **kw))
    deep = train(_cfg(planted_dataset, tmp_path / "deep", sample_ahead="3", **kw))
    assert on["losses"] == off["losses"] == deep["losses"]
    assert (on["test_acc"], on["val_acc"]) == (off["test_acc"], off["val_acc"])
    assert (on["sample_ahead"], off["sample_ahead"], deep["sample_ahead"]) == (1, 0, 3)
    assert on["history"][-1]["sample_s"] > 0
    b = dict(mode=mode, read_ahead="0", memory_budget="8MB", topology="memory")  # the split's slots
    boff = train(_cfg(planted_dataset, tmp_path / "boff", sample_ahead="0", **b))
    bon = train(_cfg(planted_dataset, tmp_path / "bon", sample_ahead="2", **b))
    assert bon["budget"]["sample_ahead"] == 2 and boff["budget"]["sample_ahead"] == 0
    assert bon["budget"]["sample_ahead_bytes"] > 0 == boff["budget"]["sample_ahead_bytes"]
    assert bon["budget"]["scratch"] == boff["budget"]["scratch"] + bon["budget"]["sample_ahead_bytes"]
    from ooc.training.loop import Interrupted
    cfg = _cfg(planted_dataset, tmp_path / "resumed", checkpoint_every=2, **kw)
    with pytest.raises(Interrupted):
        train(cfg, stop_after_steps=3)
    assert train(cfg, resume=True)["losses"] == off["losses"]


@pytest.mark.parametrize("kw,match", [
    (dict(sample_ahead="-1"), "auto, 0 \\(off\\) or >= 1 batches, got '-1'"),
    (dict(sample_ahead="some"), "got 'some'"),
    (dict(sample_ahead="1", mode="buffer"), "buffer mode samples the partitions of the state"),
    (dict(sample_ahead="1", task="link"), "link prediction"),
    (dict(sample_ahead="2", read_ahead="4"), "--read-ahead 4 samples its window itself"),
    (dict(sample_ahead="2", mode="exact", cache_policy="belady"), "belady samples its look-ahead"),
])
def test_sample_ahead_refuses_what_it_cannot_serve(planted_dataset: Path, tmp_path: Path, kw: dict,
                                                   match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _cfg(planted_dataset, tmp_path / "x", **kw).validate()


def test_train_summary_says_where_batches_are_sampled(planted_dataset: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    from ooc.tools.cli import main
    base = ["train", str(planted_dataset), "--mode", "hybrid", "--partitions", "8",
            "--buffer-partitions", "3", "--epochs", "1", "--fanout", "5,5", "--no-progress"]
    assert main(base + ["--output-dir", str(tmp_path / "a")]) == 0
    assert "1 batch sampled ahead on its own thread" in capsys.readouterr().out
    assert main(base + ["--output-dir", str(tmp_path / "b"), "--sample-ahead", "0"]) == 0
    assert "batches sampled on the loader thread" in capsys.readouterr().out
    exact = ["train", str(planted_dataset), "--mode", "exact", "--partitions", "8", "--epochs", "1",
             "--fanout", "5,5", "--no-progress", "--read-ahead", "4"]
    assert main(exact + ["--output-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "read-ahead 4 batches" in out and "windows sampled on the read-ahead's own thread" in out


def test_sample_ahead_auto_is_off_where_it_cannot_apply(planted_dataset: Path, tmp_path: Path) -> None:
    """auto: buffer mode and a read-ahead window sample on the loader thread (nothing charged)."""
    buf = train(_cfg(planted_dataset, tmp_path / "buf", mode="buffer", epochs=1))
    assert buf["sample_ahead"] == 0 and buf["budget"]["sample_ahead_bytes"] == 0
    ra = train(_cfg(planted_dataset, tmp_path / "ra", mode="hybrid", buffer_partitions=3,
                    read_ahead="4", epochs=1))
    assert ra["sample_ahead"] == 0 and ra["budget"]["read_ahead"] == 4
