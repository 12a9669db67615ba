"""The automatic budget split (ooc.data.autoplan): probed batch extents, the cache estimate, and the
planner's choices on small graphs whose best split is known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import small_dataset

from ooc.config import TrainConfig
from ooc.data.autoplan import EXTENT_MARGIN, ReadCost, _cache_hit, probe_extents
from ooc.data.path import partition_offsets, plan_machine
from ooc.storage.dataset import Dataset
from ooc.training.loop import train


def _cfg(ds: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir="/nonexistent", model="sage", fanouts=[5, 5],
                batch_size=64, epochs=1, seed=3, partitions=8, progress=False, hidden=16,
                eval_batch_size=256)
    base.update(kw)
    cfg = TrainConfig(**base)
    cfg.validate()
    return cfg


def _plan(ds_path: Path, **kw: object):
    cfg = _cfg(ds_path, **kw)
    ds = Dataset(ds_path)
    try:
        return plan_machine(cfg, ds, partition_offsets(cfg, ds))
    finally:
        ds.close()


def _dense(tmp_path: Path) -> Path:
    """2,000 nodes, ~300,000 edges, 4 features: the topology outweighs the rows."""
    from ooc.kernels.generators import planted_partition
    from ooc.kernels.partition import contiguous_partitions

    from ooc.ingest.convert import write_graph_dataset
    g = planted_partition(2000, num_classes=4, avg_degree=150, feat_dim=4, noise=2.0, seed=1,
                          train_frac=0.3)
    return write_graph_dataset(tmp_path / "dense", g.num_nodes, g.src, g.dst, g.features, g.labels,
                               {"train": g.train, "valid": g.valid, "test": g.test}, g.num_classes,
                               "dense", partition_offsets=contiguous_partitions(2000, 8))


def _smallest_budget(path: Path, accept, **kw: object):
    """``(budget, plan)`` of the smallest budget in 200 kB .. 8 MB (100 kB steps) that plans and whose
    plan ``accept`` takes, or ``(None, None)``."""
    for b in range(200_000, 8_000_000, 100_000):
        try:
            mp = _plan(path, memory_budget=str(b), **kw)
        except ValueError:
            continue
        if accept(mp):
            return b, mp
    return None, None


# ------------------------------------------------------------------------------------------ probe
def test_probe_extents_of_a_two_hub_graph(tmp_path: Path) -> None:
    """Every node's in-neighbours are the hubs 0 and 1 (0 <- 1, 1 <- 0): a batch of 4 seeds reaches
    at most its seeds and the two hubs (6 rows) over at most 8 + 10 sampled edges, whatever the
    fanouts; the no-deduplication bound would be the whole graph."""
    n = 20
    src = [h for v in range(n) for h in (0, 1) if h != v]
    dst = [v for v in range(n) for h in (0, 1) if h != v]
    ds_path = small_dataset(tmp_path / "hubs", n, src, dst, partition_offsets=np.array([0, 10, 20]))
    cfg = _cfg(ds_path, batch_size=4, fanouts=[5, 5], eval_batch_size=4, partitions=2)
    ds = Dataset(ds_path)
    try:
        ext = probe_extents(cfg, ds)
    finally:
        ds.close()
    assert ext.probed_train and not ext.probed_eval  # no validation or test split to probe
    assert ext.train_rows == int(6 * EXTENT_MARGIN) + 1
    assert ext.train_edges == int(18 * EXTENT_MARGIN) + 1
    assert ext.eval_rows == n  # the bound: at most every node
    # lists held while sampling: the first hop's (4 seeds, <= 2 ids each, 5 offsets), kept, and
    # the last hop's (the 2 hubs, 1 id each, 3 offsets)
    isz = Dataset(ds_path).raw("indices").dtype.itemsize
    assert int((4 * isz + 40 + 2 * isz + 24) * EXTENT_MARGIN) <= ext.list_bytes
    assert ext.list_bytes <= int((8 * isz + 40 + 2 * isz + 24) * EXTENT_MARGIN)


def test_disk_topology_budget_counts_the_lists_a_batch_holds(planted_dataset: Path) -> None:
    """With the topology on disk the sampler scratch holds the probed lists of a batch; with the
    topology in memory it does not."""
    from ooc.data.budget import plan_budget
    cfg = _cfg(planted_dataset)
    ds = Dataset(planted_dataset)
    try:
        ext = probe_extents(cfg, ds)
        off = partition_offsets(cfg, ds)
        def plan(topology: str):
            return plan_budget("hybrid", None, ds, off, topology, 64, [5, 5], 1, 16, 2, None,
                               "sieve", "sequential", extents=ext)
        disk, mem = plan("disk"), plan("memory")
    finally:
        ds.close()
    assert ext.list_bytes > 0
    assert disk.scratch - mem.scratch == ext.list_bytes


def test_cache_estimate_follows_ches_approximation() -> None:
    """Uniform degrees: an LRU cache of C of N rows hits C / N of the requests; skewed degrees hit
    more; an empty cache none, a cache of every row all."""
    uniform = np.full(1000, 7)
    assert _cache_hit(uniform, 50.0, 100) == pytest.approx(0.1, rel=1e-6)
    skewed = np.concatenate([np.full(10, 500), np.full(990, 2)])
    assert _cache_hit(skewed, 50.0, 100) > 0.5
    # two degree classes by hand: hit = sum lam (1 - e^(-lam T)) / sum lam with T solving the
    # occupancy sum (1 - e^(-lam T)) = C
    lam = 50.0 * np.array([500.0, 2.0]) / (10 * 500 + 990 * 2)
    cnt = np.array([10.0, 990.0])
    t = 40.0
    c = float((cnt * -np.expm1(-lam * t)).sum())
    want = float((cnt * lam * -np.expm1(-lam * t)).sum() / (cnt * lam).sum())
    assert _cache_hit(skewed, 50.0, int(round(c))) == pytest.approx(want, rel=0.02)
    assert _cache_hit(uniform, 50.0, 0) == 0.0 and _cache_hit(uniform, 50.0, 1000) == 1.0


def test_read_cost_seconds() -> None:
    from ooc.data.autoplan import DISK_BYTES_PER_S, REQUEST_S
    c = ReadCost(2e9, 1000) + ReadCost(0, 500)
    assert c.seconds == pytest.approx(2e9 / DISK_BYTES_PER_S + 1500 * REQUEST_S)
    # requests issued beside the trainer (a read-ahead's list reads): counted, latency not charged
    h = c + ReadCost(1e9, 400, 400)
    assert (h.bytes, h.requests, h.hidden) == (3e9, 1900, 400)
    assert h.seconds == pytest.approx(3e9 / DISK_BYTES_PER_S + 1500 * REQUEST_S)


# ------------------------------------------------------------------------------------------ split
def test_near_ties_are_measured_against_the_fewest_seconds() -> None:
    """Predictions of 10.0, 10.4 and 10.8 s with 5, 10 and 20 slots: 10.4 is within TIE (5%) of
    the fewest and has more slots, so it is kept; 10.8 is within 5% of 10.4 only, not of 10.0."""
    from types import SimpleNamespace

    from ooc.data.autoplan import TIE, SplitChoice, _keep
    assert TIE == 0.05
    def split(seconds: float, slots: int, topology: str = "memory") -> SplitChoice:
        return SplitChoice(topology, False, None, SimpleNamespace(slots=slots),  # type: ignore[arg-type]
                           ReadCost(0.0, seconds / 2e-5))
    a, b, c = split(10.0, 5), split(10.4, 10), split(10.8, 20)
    assert _keep([a, b, c]) is b and _keep([c, b, a]) is b
    assert _keep([a, c]) is a
    d = split(10.4, 10, "disk")  # equal slots: the first tried
    assert _keep([a, b, d]) is b and _keep([a, d, b]) is d


def test_splits_far_from_the_label_mix_give_way() -> None:
    """Splits a (fewest seconds, batches +0.50 over i.i.d.'s label mix), b (10% slower, +0.30), c
    (20% slower, +0.05): c is the only one within MIX_EXCESS and is kept; without c none is, and b,
    the nearest, is kept over a (further than MIX_EXCESS / 2 past it); splits without a label mix
    (no classes) compete on seconds alone."""
    from types import SimpleNamespace

    from ooc.data.autoplan import MIX_EXCESS, SplitChoice, _keep
    assert MIX_EXCESS == 0.10
    def split(seconds: float, slots: int, excess: float | None) -> SplitChoice:
        mix = None if excess is None else (0.1 + excess, 0.1)
        return SplitChoice("memory", False, None, SimpleNamespace(slots=slots),  # type: ignore[arg-type]
                           ReadCost(0.0, seconds / 2e-5), class_mix=mix)
    a, b, c = split(10.0, 1, 0.5), split(11.0, 2, 0.3), split(12.0, 4, 0.05)
    assert a.class_excess == pytest.approx(0.5) and split(1.0, 1, None).class_excess == 0.0
    assert _keep([a, b, c]) is c and _keep([c, a, b]) is c
    assert _keep([a, b]) is b
    near = split(10.2, 1, 0.34)  # within MIX_EXCESS / 2 of b, and faster: kept
    assert _keep([a, b, near]) is near
    assert _keep([split(10.0, 1, None), split(11.0, 8, None)]).predicted.seconds == pytest.approx(10.0)


def _class_aligned(tmp_path: Path) -> Path:
    """The planted graph of ``planted_dataset`` (3,000 nodes, 4 classes) with its nodes renumbered
    by class, so each of its 8 contiguous partitions holds one class (as METIS partitions follow
    communities)."""
    from ooc.ingest.convert import write_graph_dataset
    from ooc.kernels.generators import planted_partition
    from ooc.kernels.partition import contiguous_partitions
    g = planted_partition(3000, num_classes=4, avg_degree=8, feat_dim=16, noise=2.0, seed=1,
                          train_frac=0.3)
    order = np.argsort(g.labels, kind="stable")
    new = np.empty_like(order)
    new[order] = np.arange(order.shape[0])
    splits = {k: np.sort(new[v]) for k, v in (("train", g.train), ("valid", g.valid), ("test", g.test))}
    return write_graph_dataset(tmp_path / "aligned", g.num_nodes, new[g.src], new[g.dst],
                               g.features[order], g.labels[order], splits, g.num_classes, "aligned",
                               partition_offsets=contiguous_partitions(3000, 8))


def test_the_split_keeps_batches_near_the_label_mix(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Hybrid on 8 one-class partitions under 700 kB: on predicted reads alone the split keeps the
    topology in memory with 3 partitions per state (batches 0.19 further from the label mix than
    uniform batches); weighing the mix it keeps the lists on disk and 4 per state (+0.11, the
    nearest any split plans), for more predicted seconds."""
    import ooc.data.autoplan as autoplan
    path = _class_aligned(tmp_path)
    kw = dict(mode="hybrid", memory_budget="700kB", prefetch=0)
    mixed = _plan(path, **kw)
    monkeypatch.setattr(autoplan, "MIX_EXCESS", 1.0)
    io_only = _plan(path, **kw)
    assert io_only.split is not None and mixed.split is not None
    assert io_only.split.class_mix is not None and mixed.split.class_mix is not None
    assert io_only.split.class_mix[1] == mixed.split.class_mix[1] > 0  # the same uniform batches
    assert (io_only.topology, io_only.plan.state_slots) == ("memory", 3)
    assert (mixed.topology, mixed.plan.state_slots) == ("disk", 4)
    assert mixed.split.class_excess < io_only.split.class_excess - 0.05
    assert mixed.split.predicted.seconds > io_only.split.predicted.seconds


def test_everything_resident_when_it_fits(planted_dataset: Path) -> None:
    """A budget that holds the topology beside every feature row: topology in memory, all 8
    partitions resident, no cache, and the only predicted read is loading the features once."""
    mp = _plan(planted_dataset, mode="hybrid", memory_budget="50MB")
    assert mp.split is not None and mp.topology == "memory"
    assert mp.plan.slots == mp.plan.num_parts == 8 and mp.plan.cache == 0
    ds = Dataset(planted_dataset)
    feat_bytes = ds.num_nodes * ds.features.row_bytes
    ds.close()
    assert mp.split.predicted.bytes == pytest.approx(feat_bytes)
    labels = [lab for lab, _, _ in mp.split.candidates]
    fracs = ("0%", "25%", "50%")
    assert labels[:3] == [f"topology memory, cache {f}" for f in fracs]
    # --hot-topology auto (the default): the disk candidates without and with 3 hot sizes
    assert labels[3:6] == [f"topology disk, cache {f}" for f in fracs]
    assert len(labels) == 15 and all(lab.startswith("topology disk, hot ") for lab in labels[6:])


def test_no_budget_keeps_the_topology_in_memory(planted_dataset: Path) -> None:
    mp = _plan(planted_dataset, mode="hybrid")
    assert mp.topology == "memory" and mp.split is None and mp.extents is None


def test_disk_topology_when_memory_cannot_hold_it(tmp_path: Path) -> None:
    """A dense graph with narrow rows: at the smallest budget that runs with the lists on disk, the
    topology in memory does not fit, and ``auto`` chooses disk."""
    path = _dense(tmp_path)
    kw = dict(mode="exact", fanouts=[3, 3], batch_size=16, eval_batch_size=16, eval_fanouts=[3, 3])
    budget, _ = _smallest_budget(path, lambda mp: True, topology="disk", **kw)
    assert budget is not None
    with pytest.raises(ValueError, match="too small"):
        _plan(path, topology="memory", memory_budget=str(budget), **kw)
    mp = _plan(path, memory_budget=str(budget), **kw)
    assert mp.topology == "disk"
    refused = [lab for lab, c, why in mp.split.candidates if c is None]
    assert refused[0] == "topology memory"  # and hot sets too large for what is left
    assert all(lab.startswith("topology disk, hot ") for lab in refused[1:])


def test_pq_codes_when_the_budget_is_below_the_features(planted_dataset: Path, tmp_path: Path) -> None:
    """Hybrid with --miss-features auto under a budget below the features: partition slots plus the
    PQ codes (the outer hop's misses are then decoded, not read) beat slots alone."""
    import shutil

    from ooc.compress import compress_dataset
    ds_path = tmp_path / "planted"
    shutil.copytree(planted_dataset, ds_path)
    compress_dataset(ds_path, 4, centroids=16, sample_rows=1000, iters=3, progress=False)
    # (evaluation layer-wise, as --eval-mode auto out of core: no evaluation batches planned)
    mp = _plan(ds_path, mode="hybrid", miss_features="auto", memory_budget="0.7MB", prefetch=0)
    assert mp.split is not None and mp.split.pq and mp.pq_bytes > 0 and not mp.plan.eval_batches
    assert mp.plan.compressed == mp.pq_bytes and mp.plan.slots < mp.plan.num_parts
    costs = {lab: c for lab, c, _ in mp.split.candidates if c is not None}
    assert all(mp.split.predicted.seconds < c.seconds for lab, c in costs.items() if ", pq" not in lab)
    assert any(", pq" in lab for lab in costs) and any(", pq" not in lab for lab in costs)


def test_auto_topology_trains_the_same_batches(tmp_path: Path) -> None:
    """Exact mode: the split auto chooses (lists on disk under this budget) trains exactly the losses
    of the topology in memory without a budget."""
    path = _dense(tmp_path)
    kw = dict(mode="exact", fanouts=[3, 3], batch_size=64, eval_batch_size=64, eval_fanouts=[3, 3])
    budget, _ = _smallest_budget(path, lambda mp: mp.topology == "disk", **kw)
    assert budget is not None
    a = train(_cfg(path, output_dir=str(tmp_path / "auto"), memory_budget=str(budget), **kw))
    b = train(_cfg(path, output_dir=str(tmp_path / "mem"), topology="memory", **kw))
    assert a["topology"] == "disk" and b["topology"] == "memory"
    assert a["losses"] == b["losses"] and a["test_acc"] == b["test_acc"]
    assert a["split"]["predicted_bytes"] > 0


def test_miss_features_auto_reads_rows_without_a_budget_or_outside_hybrid(
        planted_dataset: Path, tmp_path: Path) -> None:
    """``auto``, the default, weighs the PQ codes only in hybrid mode under a budget: without a
    budget, in exact or buffer mode, it plans no codes (exact rows from disk); ``pq`` outside
    hybrid is refused, naming the mode."""
    import shutil

    from ooc.compress import compress_dataset
    assert TrainConfig.miss_features == "auto"
    ds_path = tmp_path / "planted"
    shutil.copytree(planted_dataset, ds_path)
    compress_dataset(ds_path, 4, centroids=16, sample_rows=1000, iters=3, progress=False)
    assert _plan(ds_path, mode="hybrid", memory_budget="0.7MB", prefetch=0).pq_bytes > 0
    for kw in (dict(mode="hybrid"), dict(mode="exact", memory_budget="0.7MB", cache_size="40kB"),
               dict(mode="buffer", memory_budget="0.7MB")):
        mp = _plan(ds_path, prefetch=0, **kw)
        assert mp.pq_bytes == 0 and mp.plan.compressed == 0, kw
    with pytest.raises(ValueError, match="--miss-features pq applies to --mode hybrid only"):
        _cfg(planted_dataset, mode="exact", miss_features="pq", memory_budget="10MB")


def test_hybrid_mix_is_refused_outside_hybrid_mode(planted_dataset: Path) -> None:
    """A ``--hybrid-mix`` other than the default with exact or buffer mode is refused, naming the
    mode (it was ignored without a word); the default passes with every mode."""
    for mode in ("exact", "buffer"):
        with pytest.raises(ValueError, match=f"--hybrid-mix 0.9 applies to --mode hybrid only "
                                             f"\\(got --mode {mode}"):
            _cfg(planted_dataset, mode=mode, hybrid_mix=0.9)
        _cfg(planted_dataset, mode=mode)
    _cfg(planted_dataset, mode="hybrid", hybrid_mix=0.9)


def test_buffer_partitions_under_a_budget_are_named_as_not_used(
        planted_dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Under ``--memory-budget`` the split sizes the partition slots: an explicit
    ``--buffer-partitions`` (a shipped config sets 1) is not used, and the run says so, naming
    the slots the split chose (it was ignored without a word); the default says nothing."""
    caplog.set_level("WARNING", logger="ooc")
    mp = _plan(planted_dataset, mode="hybrid", memory_budget="10MB", buffer_partitions=1)
    want = (f"--buffer-partitions 1 not used: under --memory-budget the budget split sizes the "
            f"partition slots ({mp.plan.slots} slots, {mp.plan.state_slots} partitions per")
    assert want in caplog.text and mp.plan.slots > 1
    caplog.clear()
    _plan(planted_dataset, mode="hybrid", memory_budget="10MB")
    assert "--buffer-partitions" not in caplog.text
    # more than --partitions: refused without a budget (it would be used), not with one
    with pytest.raises(ValueError, match="--buffer-partitions 9 exceeds --partitions 8"):
        _cfg(planted_dataset, mode="hybrid", buffer_partitions=9)
    _cfg(planted_dataset, mode="hybrid", buffer_partitions=9, memory_budget="10MB")


def test_an_ordering_is_refused_in_exact_mode(planted_dataset: Path) -> None:
    """Exact mode has no partition states to order: ``--ordering sequential`` is refused there
    (it was ignored without a word) and accepted by buffer and hybrid."""
    with pytest.raises(ValueError, match="--ordering sequential orders the partition states of "
                                         "--mode buffer or hybrid \\(got --mode exact"):
        _cfg(planted_dataset, mode="exact", ordering="sequential")
    for mode in ("buffer", "hybrid"):
        _cfg(planted_dataset, mode=mode, ordering="sequential")


@pytest.mark.parametrize("direct", [False, True])
def test_buffer_mode_predicts_partition_loads_only(planted_dataset: Path, tmp_path: Path,
                                                   direct: bool) -> None:
    """Buffer mode samples inside the resident partitions: no misses and no list reads, only loads
    (every partition once per epoch when fewer than all are resident), in the range requests the
    buffer makes (several per partition, in flight together): the run reads what was predicted."""
    kw = dict(mode="buffer", memory_budget="1.25MB", direct_io=direct)
    mp = _plan(planted_dataset, **kw)
    assert mp.split is not None and 1 <= mp.plan.slots < mp.plan.num_parts
    ds = Dataset(planted_dataset)
    part = ds.num_nodes / 8 * ds.features.row_bytes
    if mp.topology == "disk":
        part += ds.num_edges / 8 * ds.raw("indices").dtype.itemsize
    ds.close()
    loads = mp.split.predicted.bytes / part  # whole partition loads, each partition at least once
    assert loads >= 8  # with O_DIRECT each span is widened to whole pages
    if not direct:
        assert loads == pytest.approx(round(loads))
    m = train(_cfg(planted_dataset, output_dir=str(tmp_path / "run"), **kw))
    nbytes, requests = _measured(m)
    assert nbytes == pytest.approx(mp.split.predicted.bytes, rel=0.02)
    assert requests == pytest.approx(mp.split.predicted.requests, rel=0.02)
    assert requests >= 8  # a request per load at least


def test_hot_topology_counts_only_where_the_lists_are_on_disk(planted_dataset: Path) -> None:
    """``--hot-topology`` with ``--topology auto``: its bytes are part of the disk candidates' plans
    (and the split may still keep everything in memory, where it does not apply)."""
    base = _plan(planted_dataset, mode="hybrid", memory_budget="50MB", topology="disk",
                 hot_topology="0")
    hot = _plan(planted_dataset, mode="hybrid", memory_budget="50MB", topology="disk",
                hot_topology="64KB")
    assert hot.plan.topology == base.plan.topology + 64_000
    auto = _plan(planted_dataset, mode="hybrid", memory_budget="50MB", hot_topology="64KB")
    mem = _plan(planted_dataset, mode="hybrid", memory_budget="50MB", topology="memory")
    assert auto.topology == "memory" and auto.plan.topology == mem.plan.topology
    with pytest.raises(ValueError, match="needs --topology disk or auto"):
        _cfg(planted_dataset, topology="memory", hot_topology="64KB")


def _wide(tmp_path: Path) -> Path:
    """3,000 nodes, ~24,000 edges, 256 float32 features (1 kB rows): the rows outweigh the lists."""
    from ooc.ingest.convert import write_graph_dataset
    from ooc.kernels.generators import planted_partition
    from ooc.kernels.partition import contiguous_partitions
    g = planted_partition(3000, num_classes=4, avg_degree=8, feat_dim=256, noise=2.0, seed=1,
                          train_frac=0.3)
    return write_graph_dataset(tmp_path / "wide", g.num_nodes, g.src, g.dst, g.features, g.labels,
                               {"train": g.train, "valid": g.valid, "test": g.test}, g.num_classes,
                               "wide", partition_offsets=contiguous_partitions(3000, 8))


def _measured(m: dict) -> tuple[int, int]:
    """Training bytes and requests of a run's first epoch."""
    h = m["history"][0]
    return h["train_bytes_read"], h["train_read_requests"]


def test_exact_read_ahead_predicts_one_read_per_window(tmp_path: Path) -> None:
    """Exact mode under a budget: with the default read-ahead the misses of a window of batches are
    predicted as one gather of their union each (at most the feature file), with ``--read-ahead 0``
    as a gather per batch less the cache's hits; both within 15% of what the run reads."""
    p = _wide(tmp_path)
    kw = dict(mode="exact", memory_budget="4MB", batch_size=16, fanouts=[3, 3], eval_batch_size=16)
    win = _plan(p, **kw)
    per_row = _plan(p, read_ahead="0", **kw)
    assert win.split is not None and per_row.split is not None
    w = win.plan.read_ahead
    assert w >= 2 and per_row.plan.read_ahead == 0 and per_row.plan.cache > win.plan.cache
    steps = -(-Dataset(p).split("train").shape[0] // 16)
    assert win.split.predicted.bytes <= -(-steps // w) * 3000 * 256 * 4
    for name, mp, extra in (("win", win, {}), ("row", per_row, {"read_ahead": "0"})):
        m = train(_cfg(p, output_dir=str(tmp_path / name), **kw, **extra))
        nbytes, requests = _measured(m)
        assert m["split"]["predicted_bytes"] == int(mp.split.predicted.bytes)
        assert nbytes == pytest.approx(mp.split.predicted.bytes, rel=0.15), name
        assert requests == pytest.approx(mp.split.predicted.requests, rel=0.15), name


def test_exact_read_ahead_window_never_narrows_as_the_budget_grows(tmp_path: Path) -> None:
    """Exact mode, ``--read-ahead auto``: from 4 MB to 7 MB the planned window widens with the
    budget (batches built ahead give way where they would leave a window under 2/3 of the widest);
    every plan has a window (the graph's features, 3 MB, do not fit beside the batches)."""
    p = _wide(tmp_path)
    kw = dict(mode="exact", batch_size=16, fanouts=[3, 3], eval_batch_size=16, topology="memory",
              eval_mode="sampled")
    widths, depths = [], []
    for b in range(4_000_000, 7_000_001, 200_000):
        plan = _plan(p, memory_budget=str(b), **kw).plan
        assert plan.slots == 0 and plan.cache == 0, b
        widths.append(plan.read_ahead)
        depths.append(plan.prefetch)
    assert min(widths) >= 2 and widths == sorted(widths), widths
    assert max(depths) <= 2 and min(depths) == 0, depths


@pytest.mark.parametrize("direct", [False, True])
def test_disk_topology_prediction_is_the_reads_of_the_run(tmp_path: Path, direct: bool) -> None:
    """Hybrid mode with the lists on disk: the predicted training reads (feature misses, partition
    loads, list reads as the readers coalesce them: the bytes asked for with buffered reads, whole
    pages and gaps read through with O_DIRECT) are within 10% of the run's counters."""
    p = _wide(tmp_path)
    kw = dict(mode="hybrid", memory_budget="4MB", topology="disk", batch_size=32, fanouts=[5, 5],
              eval_batch_size=64, direct_io=direct)
    mp = _plan(p, **kw)
    assert mp.split is not None and mp.topology == "disk" and 0 < mp.plan.slots < mp.plan.num_parts
    m = train(_cfg(p, output_dir=str(tmp_path / "run"), **kw))
    nbytes, requests = _measured(m)
    assert m["history"][0]["topology_read_requests"] > 0
    assert nbytes == pytest.approx(mp.split.predicted.bytes, rel=0.10)
    assert requests == pytest.approx(mp.split.predicted.requests, rel=0.10)


def test_auto_hot_topology_where_list_reads_dominate(tmp_path: Path) -> None:
    """A dense graph with 4-wide rows under a budget that cannot hold its topology: the split keeps
    the lists on disk with the largest hot set that fits (list reads are nearly all the reads), the
    run builds that hot set, serves lists from it and trains the batches of the topology in memory."""
    path = _dense(tmp_path)
    kw = dict(mode="exact", fanouts=[3, 3], batch_size=64, eval_batch_size=64, eval_fanouts=[3, 3])
    chosen = _smallest_budget(path, lambda mp: mp.topology == "disk" and mp.hot_topology, **kw)
    assert chosen[0] is not None
    budget, mp = chosen
    costs = {lab: c for lab, c, _ in mp.split.candidates if c is not None}
    cold = costs["topology disk"]
    assert mp.split.predicted.requests < cold.requests
    assert mp.plan.budget >= mp.plan.planned and mp.split.as_dict()["hot_topology_bytes"] == mp.hot_topology
    with pytest.raises(ValueError, match="too small"):
        _plan(path, topology="memory", memory_budget=str(budget), **kw)
    a = train(_cfg(path, output_dir=str(tmp_path / "auto"), memory_budget=str(budget), **kw))
    b = train(_cfg(path, output_dir=str(tmp_path / "mem"), topology="memory", **kw))
    assert a["losses"] == b["losses"] and a["test_acc"] == b["test_acc"]
    assert a["history"][0]["topology_hot_lists"] > 0
    assert a["split"]["hot_topology_bytes"] == mp.hot_topology
    # the summary names the hot lists on its data path and budget split lines
    import contextlib
    import io

    from ooc.tools.cli import _print_summary
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_summary(a)
    lines = {ln[:13].strip(): ln for ln in out.getvalue().splitlines()}
    assert "topology disk (hot lists " in lines["data path"]
    assert "chose topology disk (hot lists " in lines["budget split"]


def test_hot_topology_messages_name_what_was_asked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A budget too small for any split is refused with the smallest footprint's reason (no hot
    lists the user did not ask for, no advice to use the --topology already given); a hot size
    without a budget is reported as unused for the reason that applies."""
    import logging
    path = _dense(tmp_path)
    kw = dict(mode="exact", fanouts=[3, 3], batch_size=16, eval_batch_size=16, eval_fanouts=[3, 3])
    with pytest.raises(ValueError, match="too small") as err:
        _plan(path, topology="disk", memory_budget="100000", **kw)
    assert "hot-topology" not in str(err.value) and "--topology disk," not in str(err.value)
    with caplog.at_level(logging.WARNING):
        mp = _plan(path, hot_topology="1MB", **kw)
    assert mp.topology == "memory" and mp.hot_topology == 0
    assert "without --memory-budget, --topology auto keeps the whole topology in memory" in caplog.text


def test_state_probe_batches_shrink_with_the_list_reads_of_a_batch(planted_dataset: Path) -> None:
    """16 probed batches per state size unless a batch's list reads (no-deduplication bound, every
    hop but the last) would pass 400 K together; never fewer than 4."""
    from ooc.data.autoplan import _state_probe_batches
    small = _cfg(planted_dataset, fanouts=[10, 10], batch_size=256)
    assert _state_probe_batches(small, 2_000_000) == 16  # 256 + 2,560 lists per batch
    big = _cfg(planted_dataset, fanouts=[15, 10, 5], batch_size=1024)
    assert _state_probe_batches(big, 111_000_000) == 4  # 170 K lists per batch
    mid = _cfg(planted_dataset, fanouts=[10, 5], batch_size=4096)
    assert _state_probe_batches(mid, 10**8) == 400_000 // (4096 * 11)
    full = _cfg(planted_dataset, fanouts=[-1, -1], batch_size=64)
    assert _state_probe_batches(full, 1000) == 16  # at most every node: 1,000 lists


def test_no_node_sized_planner_array_outlives_the_data_path_build(tmp_path: Path) -> None:
    """The split refuses some candidates (ValueError) and reads ``indptr``; once the data path is
    built nothing holds the planner's ``indptr`` (the dataset's cache released it, no traceback
    cycle keeps the planner's frame), even with the cyclic collector off."""
    import gc
    import weakref
    from ooc.data.path import build_data_path
    path = _dense(tmp_path)
    kw = dict(mode="exact", fanouts=[3, 3], batch_size=16, eval_batch_size=16, eval_fanouts=[3, 3])
    budget, mp = _smallest_budget(path, lambda mp: mp.topology == "disk", **kw)
    assert budget is not None and any(c is None for _, c, _ in mp.split.candidates)
    ds = Dataset(path)
    planner_indptr = weakref.ref(ds.indptr)  # the array the planner reads (the dataset's cache)
    gc.collect()
    gc.disable()
    try:
        data = build_data_path(_cfg(path, memory_budget=str(budget), **kw), ds)
        assert data.budget.budget == budget
        assert planner_indptr() is None
        data.close()
    finally:
        gc.enable()
        ds.close()


def test_auto_evaluation_goes_layerwise_where_its_batches_do_not_fit(planted_dataset: Path,
                                                                     tmp_path: Path) -> None:
    """Hybrid, batch 16 with fanouts 3,3, evaluation batch 1,024 with full neighbourhoods: at the
    smallest budget that plans with ``--eval-mode layerwise``, sampled evaluation batches do not
    fit (refused, naming them); ``--eval-mode auto`` plans without them and the run evaluates
    layer-wise, scoring what an explicit ``--eval-mode layerwise`` run scores.  Where they fit,
    auto keeps them (the plans with and without budget room for them are unchanged)."""
    kw = dict(mode="hybrid", batch_size=16, fanouts=[3, 3], eval_batch_size=1024)
    budget, lw = _smallest_budget(planted_dataset, lambda mp: True, eval_mode="layerwise", **kw)
    assert budget is not None and not lw.plan.eval_batches
    with pytest.raises(ValueError, match="evaluation batches") as e:
        _plan(planted_dataset, memory_budget=str(budget), eval_mode="sampled", **kw)
    assert "--eval-mode layerwise" in str(e.value)
    auto = _plan(planted_dataset, memory_budget=str(budget), **kw)
    assert not auto.plan.eval_batches and auto.plan.slots == lw.plan.slots
    roomy = _plan(planted_dataset, memory_budget="64MB", **kw)
    assert roomy.plan.eval_batches  # fits: sampled batches planned, as before
    runs = {m: train(_cfg(planted_dataset, output_dir=str(tmp_path / m), memory_budget=str(budget),
                          eval_mode=m, epochs=1, **kw)) for m in ("auto", "layerwise")}
    assert runs["auto"]["eval_mode"] == "layerwise"
    assert runs["auto"]["test_acc"] == runs["layerwise"]["test_acc"]
    assert runs["auto"]["losses"] == runs["layerwise"]["losses"]


def test_a_state_plan_without_a_budget_warns_of_its_label_mix(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Without a budget the states hold ``--buffer-partitions - 1`` partitions: on one-class
    partitions one per state gives batches 0.49 from the label mix (uniform 0.09) and a warning
    naming it; 6 slots (4 partitions per state, 0.06) stay within the margin and are silent."""
    import logging

    from ooc.data.path import build_data_path
    path = _class_aligned(tmp_path)
    for slots, warned in ((2, True), (6, False)):
        cfg = _cfg(path, mode="hybrid", buffer_partitions=slots, prefetch=0)
        ds = Dataset(path)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ooc.data"):
            data = build_data_path(cfg, ds)
            try:
                first = data.plan_nodes(ds.split("train"), cfg.batch_size, 0)
                for epoch in range(1, 7):  # once: epoch 0's plan is made once, not again later
                    data.plan_nodes(ds.split("train"), cfg.batch_size, epoch)
                again = build_data_path(cfg, ds)  # a fresh chain (a resume) plans the same epochs
                try:
                    assert again.plan_nodes(ds.split("train"), cfg.batch_size, 6).batches[0].tolist() \
                        == data.plan_nodes(ds.split("train"), cfg.batch_size, 6).batches[0].tolist()
                finally:
                    again.close()
                assert first.batches[0].size > 0
            finally:
                data.close()
                ds.close()
        hits = [r.getMessage() for r in caplog.records if "label mix" in r.getMessage()]
        assert len(hits) == 2 * int(warned), hits  # one per data path
        if warned:
            assert hits[0].startswith("1 partition per buffer state (--buffer-partitions 2 of 8)")
            assert "a --memory-budget lets the split size the states" in hits[0]


def test_auto_evaluation_plans_no_evaluation_batches_out_of_core(planted_dataset: Path) -> None:
    """--eval-mode auto evaluates layer-wise out of core, so the plan gives its evaluation batches'
    bytes to slots: a larger budget never plans fewer slots for them (0.9 MB: 6 slots; 1.2 MB was
    1 slot and sampled evaluation batches, now all 8), and where everything is resident and the
    batches fit beside it (3 MB), sampled evaluation batches are planned as before."""
    kw = dict(mode="hybrid", prefetch=0)
    plans = {kb: _plan(planted_dataset, memory_budget=f"{kb}kB", **kw).plan for kb in (900, 1200, 3000)}
    assert plans[900].slots == 6 and not plans[900].eval_batches
    assert plans[1200].slots == plans[1200].num_parts == 8 and not plans[1200].eval_batches
    assert plans[3000].slots == 8 and plans[3000].eval_batches
    sampled = _plan(planted_dataset, memory_budget="1200kB", eval_mode="sampled", **kw).plan
    assert sampled.eval_batches and sampled.slots < 8  # asked for: planned, at the slots' expense
