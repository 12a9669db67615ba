"""The shared-memory partition buffer (one per machine): owner/follower protocol, torn-read
protection, timeouts and dead peers -- in one process, owner and follower as two objects (and two
threads) over one segment."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from ooc.loader import plan_epoch
from ooc.data.shared import (PeerError, SharedFollowerBuffer, SharedOwnerBuffer, SharedSegment, SlotTable,
                     memory_of)
from ooc.storage.dataset import Dataset


def _pair(ds: Dataset, capacity: int, io_threads: int = 1, timeout_s: float = 5.0):
    off = ds.partition_offsets
    feats = ds.features
    slot_rows = int(np.diff(off).max())
    nbytes = SlotTable.nbytes(capacity, off.shape[0] - 1, slot_rows, feats.row_bytes, 2)
    seg = SharedSegment(SharedSegment.new_path("test"), nbytes, create=True)
    table = SlotTable(seg, capacity, off.shape[0] - 1, slot_rows, feats.shape[1:], feats.dtype, 2)
    table.init_owner()
    seg2 = SharedSegment(seg.path, nbytes, create=False)
    seg.unlink()
    table2 = SlotTable(seg2, capacity, off.shape[0] - 1, slot_rows, feats.shape[1:], feats.dtype, 2)
    owner = SharedOwnerBuffer(feats, off, capacity, io_threads, table, timeout_s=timeout_s)
    follower = SharedFollowerBuffer(feats, off, capacity, table2, 1, timeout_s=timeout_s)
    return owner, follower, seg


def test_segment_is_unlinked_but_mapped(tmp_path: Path) -> None:
    seg = SharedSegment(SharedSegment.new_path("t"), 8192, create=True)
    other = SharedSegment(seg.path, 8192, create=False)
    seg.unlink()
    assert not seg.path.exists()
    a = seg.view(4096, (4,), np.int64)
    a[:] = [1, 2, 3, 4]
    assert other.view(4096, (4,), np.int64).tolist() == [1, 2, 3, 4]  # one memory, two mappings
    with pytest.raises(FileNotFoundError):
        SharedSegment(seg.path, 8192, create=False)


def test_stale_segments_of_dead_processes_are_removed() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = SharedSegment.new_path("t").with_name(f"ooc-t-{dead.pid}-abcd")
    stale.write_bytes(b"x")
    live = SharedSegment(SharedSegment.new_path("t"), 4096, create=True)
    try:
        assert stale in SharedSegment.remove_stale()
        assert not stale.exists() and live.path.exists()   # ours (alive) is kept
    finally:
        live.unlink()


def test_follower_reads_the_owners_slots(planted_dataset: Path) -> None:
    ds = Dataset(planted_dataset)
    x = ds.features.read_all()
    owner, follower, _ = _pair(ds, capacity=2, io_threads=0)
    assert owner.buf.base is not None and follower.nbytes == owner.nbytes
    owner.require([0, 3])
    follower.require([0, 3])                  # ready: no wait
    ids = np.arange(0, ds.num_nodes, 7)
    got = follower.gather(ids)
    assert np.array_equal(got, x[ids])
    part = follower.part_of(ids)
    assert follower.stats.row_hits == int(np.isin(part, [0, 3]).sum())
    assert follower.stats.partition_loads == 0 and owner.stats.partition_loads == 2
    assert sorted(follower.resident()) == [0, 3]
    # a slot being rewritten (odd generation): its rows are read from disk instead, still exact
    s = int(owner.slot_of[0])
    owner.table.gen[s] += 1
    follower.reset_stats()
    assert np.array_equal(follower.gather(ids), x[ids])
    assert follower.stats.row_hits == int((part == 3).sum())
    owner.table.gen[s] += 1
    owner.close()
    ds.close()


def test_waits_time_out_and_detect_dead_peers(planted_dataset: Path) -> None:
    ds = Dataset(planted_dataset)
    owner, follower, _ = _pair(ds, capacity=2, io_threads=0, timeout_s=0.3)
    owner.require([0])
    follower.require([0])
    with pytest.raises(PeerError, match="no progress"):
        follower.require([1])                 # the owner never publishes batch 2
    owner.table.done[1] = 0                   # as if the follower were still on batch 0
    dead = subprocess.Popen(["true"])
    dead.wait()
    owner.table.pid[1] = dead.pid
    with pytest.raises(PeerError, match=f"local rank 1 \\(pid {dead.pid}\\) died"):
        owner.require([1])
    owner.close()
    ds.close()


def test_owner_and_follower_threads_through_an_epoch(planted_dataset: Path) -> None:
    """The ticket protocol with real concurrency: the owner prefetches and evicts on its I/O thread
    while the follower gathers; every row the follower gets is the dataset's row."""
    ds = Dataset(planted_dataset)
    x = ds.features.read_all()
    owner, follower, _ = _pair(ds, capacity=2, io_threads=1)
    train = ds.split("train")
    plan = plan_epoch(train, owner.part_of(train), owner.num_parts, 32, seed=0, epoch=0)
    rng = np.random.default_rng(0)
    samples = [rng.integers(0, ds.num_nodes, 400) for _ in plan.batches]
    errors: list = []

    def run(buf, check: bool) -> None:
        try:
            for i, seeds in enumerate(plan.batches):
                pos = plan.batch_pos[i]
                buf.require(plan.batch_parts[i], plan.schedule[pos:pos + 4])
                ids = np.concatenate([seeds, samples[i]])
                got = buf.gather(ids)
                if check and not np.array_equal(got, x[ids]):
                    errors.append(i)
            buf.close()
        except BaseException as e:  # reported to the test thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(owner, False)),
               threading.Thread(target=run, args=(follower, True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "protocol deadlock"
    assert errors == []
    assert follower.ticket == owner.ticket == len(plan.batches)
    assert follower.stats.row_hits > 0 and owner.stats.partition_loads >= owner.num_parts
    ds.close()


def test_memory_of_reports_this_process() -> None:
    m = memory_of()
    assert m["rss"] > 0 and m["rss_anon"] > 0 and m["pss"] > 0
