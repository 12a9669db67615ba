"""One partition buffer per machine: owner/follower hand-over per buffer state, torn-read
protection, timeouts and dead peers -- in one process, owner and follower as two objects (and two
threads) over one shared segment."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ooc.data.buffer import BufferManager, SlotMemory
from ooc.data.plan import plan_states
from ooc.data.shared import PeerError, SharedSegment, memory_of
from ooc.storage.dataset import Dataset
from ooc.storage.io import DiskRows


def _pair(ds: Dataset, capacity: int, io_threads: int = 1, timeout_s: float = 5.0):
    off = ds.partition_offsets
    rows = DiskRows(ds.features)
    slot = BufferManager.slot_bytes(int(np.diff(off).max()), rows.row_bytes)
    p = off.shape[0] - 1
    nbytes = SlotMemory.nbytes(capacity, p, slot, 0, 2)
    seg = SharedSegment(SharedSegment.new_path("test"), nbytes, create=True)
    mem = SlotMemory(capacity, p, slot, 0, 2, seg)
    mem.init()
    seg2 = SharedSegment(seg.path, nbytes, create=False)
    seg.unlink()
    owner = BufferManager(rows, off, capacity, rows, io_threads, memory=mem, role="owner",
                          timeout_s=timeout_s)
    rows2 = DiskRows(ds.features)  # each rank (process) has its own reader
    follower = BufferManager(rows2, off, capacity, rows2,
                             memory=SlotMemory(capacity, p, slot, 0, 2, seg2),
                             role="follower", local_rank=1, timeout_s=timeout_s)
    return owner, follower, rows


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
    assert follower.mem.ctypes.data != owner.mem.ctypes.data and follower.nbytes == owner.nbytes
    owner.require([0, 3], ticket=1)
    follower.require([0, 3], ticket=1)                  # ready: no wait
    ids = np.arange(0, ds.num_nodes, 7)
    got, _ = follower.gather(ids)
    assert np.array_equal(got, x[ids])
    part = follower.part_of(ids)
    assert follower.stats.row_hits == int(np.isin(part, [0, 3]).sum())
    assert follower.stats.partition_loads == 0 and owner.stats.partition_loads == 2
    assert sorted(follower.resident()) == [0, 3]
    # a slot being rewritten (odd generation): its rows are read from disk instead, still exact
    s = int(owner.slot_of[0])
    owner.gen[s] += 1
    follower.reset_stats()
    assert np.array_equal(follower.gather(ids)[0], x[ids])
    assert follower.stats.row_hits == int((part == 3).sum())
    owner.gen[s] += 1
    owner.close()
    ds.close()


def test_waits_time_out_and_detect_dead_peers(planted_dataset: Path) -> None:
    ds = Dataset(planted_dataset)
    owner, follower, _ = _pair(ds, capacity=2, io_threads=0, timeout_s=0.3)
    owner.require([0], ticket=1)
    follower.require([0], ticket=1)
    follower.require([0, 1], ticket=1)                  # the same state: nobody waits
    with pytest.raises(PeerError, match="no progress"):
        follower.require([1], ticket=2)                 # the owner never publishes state 2
    owner.handover.done[1] = 0                          # as if the follower were still on state 0
    dead = subprocess.Popen(["true"])
    dead.wait()
    owner.handover.pid[1] = dead.pid
    with pytest.raises(PeerError, match=f"local rank 1 \\(pid {dead.pid}\\) died"):
        owner.require([1], ticket=2)
    owner.close()
    ds.close()


def test_a_slow_follower_delays_the_owner_only_at_a_change_of_state(planted_dataset: Path) -> None:
    """Within a state the owner never waits for the followers; at the next state it waits until
    they have finished the previous one (the hand-over per buffer state)."""
    ds = Dataset(planted_dataset)
    owner, follower, _ = _pair(ds, capacity=3, io_threads=0, timeout_s=10.0)
    owner.require([0, 1], [2], ticket=1)
    t = time.perf_counter()
    for _ in range(50):                                  # later batches of state 1: no wait
        owner.require([0, 1], [2], ticket=1)
    assert time.perf_counter() - t < 0.5
    follower.require([0, 1], ticket=1)

    def finish_later() -> None:
        time.sleep(0.4)
        follower.require([2, 3], ticket=2)               # announces state 1 done, waits for 2

    th = threading.Thread(target=finish_later)
    th.start()
    t = time.perf_counter()
    owner.require([2, 3], ticket=2)                      # must wait for the follower's state 1
    waited = time.perf_counter() - t
    th.join(timeout=10)
    assert waited >= 0.3 and follower.ticket == owner.ticket == 2
    assert sorted(owner.resident()) == [0, 2, 3] or set([2, 3]) <= set(owner.resident())
    owner.close()
    follower.close()
    ds.close()


def test_owner_and_follower_threads_through_an_epoch(planted_dataset: Path) -> None:
    """The hand-over with real concurrency: the owner prefetches and evicts on its I/O thread
    while the follower gathers; every row the follower gets is the dataset's row."""
    ds = Dataset(planted_dataset)
    x = ds.features.read_all()
    owner, follower, _ = _pair(ds, capacity=3, io_threads=1)
    train = ds.split("train")
    plan = plan_states(train, owner.part_of(train), owner.num_parts, 2, 32, seed=0, epoch=0,
                       ordering="sequential", group=1)
    assert len(plan.states) > 3
    rng = np.random.default_rng(0)
    samples = [rng.integers(0, ds.num_nodes, 400) for _ in plan.batches]
    errors: list = []

    def run(buf: BufferManager, check: bool) -> None:
        try:
            ticket, last = 0, None
            for i, seeds in enumerate(plan.batches):
                k = plan.batch_state[i]
                if k != last:
                    ticket, last = ticket + 1, k
                buf.require(plan.states[k], plan.upcoming[k], ticket)
                ids = np.concatenate([seeds, samples[i]])
                got, _ = buf.gather(ids)
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
    assert follower.ticket == owner.ticket == len(plan.states)
    assert follower.stats.row_hits > 0 and owner.stats.partition_loads >= owner.num_parts
    ds.close()


def test_memory_of_reports_this_process() -> None:
    m = memory_of()
    assert m["rss"] > 0 and m["rss_anon"] > 0 and m["pss"] > 0
