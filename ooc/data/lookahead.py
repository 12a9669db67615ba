"""Batches sampled ahead: the epoch's batches are known in advance (the plan, and sampling is a pure
function of each batch's key), so the loader can sample them a window ahead of their use, for two
purposes:

- :class:`ReadAhead` (``--read-ahead W``): the rows that the next ``W`` batches need from outside
  the partition slots are read as one sorted, coalesced gather and held
  (:class:`~ooc.features.tiers.StagedRows`) until those batches are built.  Scattered rows cost
  one request each; the union of ``W`` batches' rows is ``W`` times denser on disk, so requests
  merge (rows within ``--io-gap`` share one) and the read approaches the disk's sequential
  bandwidth -- the "superbatch" of Ginex (Park et al., VLDB'22) and the batched loading of
  GNNDrive (Jin et al., ICPP'23) applied to the reads themselves.
- :class:`Lookahead` (``--cache-policy belady``, exact mode): the CPU row cache evicts by Belady's
  MIN over the window (Ginex's cache).
- :class:`SampleAhead` (``--sample-ahead N``, exact and hybrid modes): the next ``N`` batches are
  sampled on a thread of their own while the loader thread gathers the current batch's rows, so a
  step costs the longer of sampling and gathering instead of their sum (over an on-disk topology
  both wait on the disk; the pipeline of GNNDrive's sampling and extraction stages).

:class:`Lookahead` keeps the next ``window`` batches of the plan sampled (their
:class:`~ooc.kernels.sampling.MiniBatch`, on the loader thread).  Every ``group`` batches it computes,
for each input row of the next ``group`` batches, the batch that asks for it next within the window
(:func:`next_uses`: one backward pass over the window's rows with a hash table), and announces the
batches that entered the window to the cache (:meth:`ooc.features.cache.CachedFeature.announce`),
so cached rows that were not expected again get their next use.  A batch is then built from its
kept sample and gathered with those next uses.  The look-ahead covers ``window - group`` to
``window`` batches; it ends at the epoch's end.

Results do not depend on any of this: batches are the same samples (same keys), rows are exact
whatever the cache holds.  Memory: the window's samples and, every ``group`` batches, a hash table
of twice the window's rows (:func:`lookahead_bytes`, charged to the budget); a read-ahead holds its
window's samples and rows (:func:`read_ahead_bytes`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import njit

from ooc.contracts import Plan
from ooc.features.cache import NEVER, CachedFeature, _find, _hinsert
from ooc.features.tiers import MissRows, StagedRows
from ooc.kernels.sampling import MiniBatch
from ooc.util.threads import prefetch

__all__ = ["Lookahead", "next_uses", "lookahead_bytes", "ReadAhead", "read_ahead_bytes",
           "SampleAhead", "sample_ahead_bytes"]


@njit(cache=True, nogil=True)
def next_uses(ids: np.ndarray, starts: np.ndarray, times: np.ndarray, first: int,
              hkeys: np.ndarray, hvals: np.ndarray, out: np.ndarray) -> None:
    """For every row of batches ``0..first-1`` of a window, the time of the next batch of the window
    that asks for the same id (:data:`~ooc.features.cache.NEVER` if none).

    Args:
        ids: int64 [R] the window's input ids, batch by batch (unique within a batch);
            starts: int64 [B+1] batch ``b`` = ``ids[starts[b]:starts[b+1]]``; times: int64 [B] its
            batch number (increasing).
        first: batches whose next uses are wanted (their rows are ``out``'s positions).
        hkeys, hvals: an empty hash table (``hkeys`` all -1; int32 or int64 keys, int32 values: batch
            numbers) of a power-of-two size > the window's distinct ids (at most 2/3 full is fast).
        out: int64 [starts[first]], written.
    """
    mask = hkeys.shape[0] - 1
    for b in range(starts.shape[0] - 2, -1, -1):
        t = times[b]
        for p in range(starts[b], starts[b + 1]):
            key = ids[p]
            e = _find(hkeys, mask, key)
            if b < first:
                out[p] = hvals[e] if e >= 0 else NEVER
            if e >= 0:
                hvals[e] = t
            else:
                _hinsert(hkeys, hvals, mask, key, t)


def _table_size(rows: int) -> int:
    """Slots of the hash table for ``rows`` ids: a power of two >= 1.5 x rows."""
    h = 16
    while 2 * h < 3 * rows:
        h *= 2
    return h


def lookahead_bytes(window: int, batch_rows: int, batch_edges: int, num_nodes: int) -> int:
    """Host memory of a look-ahead of ``window`` batches of about ``batch_rows`` input rows and
    ``batch_edges`` sampled edges: the kept samples (node ids 8 B per row, block CSCs ~4 B per edge
    and 8 B per row), the window's ids concatenated for a group (8 + 4 B per row), next uses (8 B
    per row) and the hash table (>= 1.5 x rows slots, 8-12 B each)."""
    rows = window * batch_rows
    key = 4 if num_nodes < 2**31 else 8
    return int(rows * 36 + window * batch_edges * 4 + _table_size(rows) * (key + 4))


class Lookahead:
    """Samples a plan's batches ``window`` ahead and gives each with its rows' next uses.

    Args:
        sample: ``sample(plan, step, epoch) -> MiniBatch`` of a plan step (keyed as training
            keys it).
        cache: the ``belady`` cache the next uses are for.
        window: batches sampled ahead (>= 2); group: batches whose next uses are computed at once
            (default ``window // 4``).
        num_nodes: node count (the hash table's key width).

    Raises:
        ValueError: ``window`` < 2 or ``group`` outside ``[1, window)``.
    """

    def __init__(self, sample: Callable[[Plan, int, int], MiniBatch], cache: CachedFeature,
                 window: int, num_nodes: int, group: int | None = None) -> None:
        group = max(1, window // 4) if group is None else group
        if window < 2 or not 1 <= group < window:
            raise ValueError(f"look-ahead window {window} / group {group}: need window >= 2 and "
                             "1 <= group < window")
        self.sample, self.cache = sample, cache
        self.window, self.group = int(window), int(group)
        self._key_dtype = np.int32 if num_nodes < 2**31 else np.int64
        self._pos: tuple[int, int, int] | None = None  # (plan id, epoch, next step expected)
        self._win: deque[tuple[int, MiniBatch]] = deque()
        self._uses: deque[np.ndarray] = deque()
        self._pending: list[tuple[int, np.ndarray]] = []
        self._entered = 0

    def _restart(self, plan: Plan, epoch: int, start: int) -> None:
        self._win.clear()
        self._uses.clear()
        self._pending.clear()
        self._entered = start
        self.cache.forget_next_uses()  # what the cache knew was about another sequence

    def _fill(self, plan: Plan, epoch: int, upto: int) -> None:
        """Sample steps up to ``upto`` (exclusive) into the window; their announcements wait for
        the next :meth:`take`, after the batch given now has been gathered (else that gather would
        overwrite the next uses they set)."""
        while self._entered < upto:
            j = self._entered
            mb = self.sample(plan, j, epoch)
            self._win.append((j, mb))
            self._pending.append((j, mb.input_nodes))
            self._entered += 1

    def _next_group(self) -> None:
        """Next uses of the window's first ``group`` batches (not yet given any)."""
        done = len(self._uses)
        items = list(self._win)
        first = min(self.group, len(items) - done)
        ids = np.concatenate([mb.input_nodes for _, mb in items[done:]]).astype(np.int64, copy=False)
        sizes = [mb.input_nodes.shape[0] for _, mb in items[done:]]
        starts = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        times = np.array([j for j, _ in items[done:]], dtype=np.int64)
        hkeys = np.full(_table_size(ids.shape[0]), -1, dtype=self._key_dtype)
        hvals = np.zeros(hkeys.shape[0], dtype=np.int32)
        out = np.empty(int(starts[first]), dtype=np.int64)
        next_uses(ids.astype(self._key_dtype, copy=False), starts, times, first, hkeys, hvals, out)
        for b in range(first):
            self._uses.append(out[starts[b]:starts[b + 1]])

    def take(self, plan: Plan, epoch: int, step: int) -> tuple[MiniBatch, np.ndarray]:
        """The sample of ``plan`` step ``step`` of ``epoch`` and int64 next uses of its input rows.

        Steps are normally taken in order; any other step (a resume, a new epoch or plan) restarts
        the window there.
        """
        pos = (id(plan), epoch, step)
        if self._pos != pos:
            self._restart(plan, epoch, step)
        for j, ids in self._pending:
            if j >= step:  # (an announcement for a batch already gathered would be in the past)
                self.cache.announce(ids, j)
        self._pending.clear()
        self._fill(plan, epoch, min(len(plan), step + self.window))
        if not self._uses:
            self._next_group()
        j, mb = self._win.popleft()
        uses = self._uses.popleft()
        self._pos = (id(plan), epoch, step + 1)
        return mb, uses


def read_ahead_bytes(window: int, batch_rows: int, batch_edges: int, num_nodes: int,
                     row_bytes: int) -> int:
    """Host memory of a read-ahead of ``window`` batches of about ``batch_rows`` input rows and
    ``batch_edges`` sampled edges: the kept samples (node ids 8 B per row, block CSCs ~4 B per edge
    and 8 B per row) and the ids concatenated and sorted (16 B per row) of three windows (the one
    served, the next one waiting, the one after being sampled), and the served window's rows (at
    most the graph's) with their ids."""
    rows = window * batch_rows
    held = min(rows, num_nodes)
    return int(3 * (rows * (16 + 16) + window * batch_edges * 4) + held * (row_bytes + 8))


@dataclass
class _Window:
    """One read-ahead window, sampled: the plan's steps ``[step, step + len(kept))`` of ``epoch``.

    Attributes:
        kept: each step's sample; ids: int64, sorted, unique: the rows they miss.
        steps: the plan's length; seeds: int64 the seeds of the window's first step (with
            ``steps``, what tells a plan made again from another one, see :meth:`starts`).
    """

    epoch: int
    step: int
    kept: dict[int, MiniBatch]
    ids: np.ndarray
    steps: int
    seeds: np.ndarray

    def starts(self, plan: Plan, epoch: int, step: int) -> bool:
        """Whether this is the window of ``plan`` at ``epoch``'s ``step``."""
        return (self.epoch == epoch and self.step == step and self.steps == len(plan)
                and np.array_equal(self.seeds, plan.batches[step]))


class ReadAhead:
    """Reads the rows that the next ``window`` batches of a plan miss as one gather.

    Windows are sampled on a thread of their own, one ahead of the window being served: steps
    ``[s, s + window)`` are sampled and ``missing(plan, step, sample)`` gives the ids each will
    need from :class:`~ooc.features.tiers.MissRows` (outside its state's partitions, not in a
    device cache), while the batches of the window before are built and trained on.  At the first
    step of each window (after any jump -- a resume, a new epoch or plan -- sampling restarts
    there) it reads their sorted union from the disk (:meth:`MissRows.read_exact`: one coalesced
    request plan) into its own :class:`~ooc.features.tiers.StagedRows`, replacing the previous
    window's rows, and makes that table ``misses.staged``.  Each step then takes its kept sample.
    Samples are keyed by their step, so they are those sampled on the loader thread would be
    (over an on-disk topology the list reads of the next window overlap the current one's
    training).  Given the next epoch's plan (``then`` of :meth:`release`), the first window of
    that epoch is sampled while the last window of this one is served, and its samples are kept
    through the evaluation (:attr:`held_bytes`), so the next epoch does not begin by waiting for
    them.

    Args:
        sample: ``sample(plan, step, epoch) -> MiniBatch`` (keyed as training keys it).
        misses: the tiers the rows are staged in.
        window: batches per read (>= 2).
        missing: ``missing(plan, step, sample) -> int64 ids`` of the rows a batch will not find
            in the slots (duplicates allowed).

    Attributes:
        bytes_read, rows, reads, read_s: bytes read, rows staged, window reads and their time
            since the last :meth:`reset_stats`; wait_s: time waited for windows still being
            sampled.

    Raises:
        ValueError: ``window`` < 2.
    """

    def __init__(self, sample: Callable[[Plan, int, int], MiniBatch], misses: MissRows, window: int,
                 missing: Callable[[Plan, int, MiniBatch], np.ndarray]) -> None:
        if window < 2:
            raise ValueError(f"read-ahead window {window}: need >= 2 batches")
        self.sample, self.misses, self.missing = sample, misses, missing
        self.window = int(window)
        self._pos: tuple[int, int, int] | None = None  # (plan id, epoch, next step expected)
        self._kept: dict[int, MiniBatch] = {}
        self.table = StagedRows(misses.shape[1:], misses.dtype)
        self._it = None  # the windows sampled ahead (a prefetch iterator), from self._at
        self._at: tuple[int, int, int] | None = None  # (plan id, epoch, its next window's step)
        self._then: Callable[[], Plan | None] | None = None  # the plan after self._at's (release)
        self._first: _Window | None = None  # the next epoch's first window, sampled ahead
        self.bytes_read = self.rows = self.reads = 0
        self.read_s = self.wait_s = 0.0

    def _window(self, plan: Plan, epoch: int, s: int) -> "_Window":
        """The window of ``plan`` at step ``s``: its kept samples and the ids they miss."""
        kept: dict[int, MiniBatch] = {}
        need = []
        for j in range(s, min(len(plan), s + self.window)):
            mb = self.sample(plan, j, epoch)
            kept[j] = mb
            need.append(self.missing(plan, j, mb))
        ids = np.unique(np.concatenate(need)) if need else np.empty(0, dtype=np.int64)
        return _Window(epoch, s, kept, ids, len(plan), np.asarray(plan.batches[s]).copy())

    def _windows(self, plan: Plan, epoch: int, start: int,  # type: ignore[no-untyped-def]
                 made: "_Window | None" = None):
        """The windows of ``plan`` from step ``start``, made on the sampling thread (the first
        one is ``made`` where given); then, if :attr:`_then` gives the next epoch's plan by then,
        that plan's first window (epoch ``epoch + 1``, step 0)."""
        for s in range(start, len(plan), self.window):
            if made is not None:
                yield made
                made = None
                continue
            yield self._window(plan, epoch, s)
        then = self._then
        nxt = then() if then is not None else None
        if nxt is not None and len(nxt):
            yield self._window(nxt, epoch + 1, 0)

    def _read_window(self, plan: Plan, epoch: int, step: int) -> None:
        self._kept.clear()
        self.table.clear()
        at = (id(plan), epoch, step)
        first, self._first = self._first, None
        if first is not None and first.starts(plan, epoch, step):
            # sampled while the previous epoch ended: served at once, the next window sampled
            # while this one is read
            self._close_sampling()
            self._it = prefetch(self._windows(plan, epoch, step, first), 1)
        elif self._it is None or self._at != at:  # a jump (resume, new epoch or plan): restart
            self._close_sampling()
            self._it = prefetch(self._windows(plan, epoch, step), 1)
        del first
        t = time.perf_counter()
        w = next(self._it)
        self.wait_s += time.perf_counter() - t
        assert (w.epoch, w.step) == (epoch, step), (w.epoch, w.step, epoch, step)
        self._kept, ids = w.kept, w.ids
        del w
        self._at = (id(plan), epoch, min(len(plan), step + self.window))
        t0 = time.perf_counter()
        if ids.shape[0]:
            rows, nbytes = self.misses.read_exact(ids)
            self.table.put(ids, rows)
            self.misses.staged = self.table
            self.bytes_read += int(nbytes)
            self.rows += int(ids.shape[0])
            self.reads += 1
        self.read_s += time.perf_counter() - t0

    def _close_sampling(self) -> None:
        if self._it is not None:
            self._it.close()  # (joins the sampling thread)
        self._it, self._at = None, None

    def take(self, plan: Plan, epoch: int, step: int,
             then: Callable[[], Plan | None] | None = None) -> MiniBatch:
        """The sample of ``plan`` step ``step`` of ``epoch``; its missing rows are staged.

        ``then``: gives the plan of epoch ``epoch + 1`` (None: there is none), asked on the
        sampling thread after this plan's last window is sampled (see :meth:`release`)."""
        self._then = then
        if self._pos != (id(plan), epoch, step) or step not in self._kept:
            self._read_window(plan, epoch, step)
        self._pos = (id(plan), epoch, step + 1)
        return self._kept.pop(step)

    def release(self, done: Plan | None = None) -> None:
        """Stop sampling ahead; drop the kept samples and the staged rows (the window's memory).

        ``done``: the plan whose last window was just served (its epoch ended).  The first window
        of the plan given to :meth:`take` through ``then`` was sampled meanwhile; it is kept
        (waited for, if still being sampled) for the next epoch's first step."""
        at = self._at
        ended = (done is not None and self._it is not None and at is not None
                 and at[0] == id(done) and at[2] >= len(done) and self._then is not None)
        self._kept.clear()
        self.table.clear()
        self._first = None
        if ended:
            assert self._it is not None and at is not None
            t = time.perf_counter()
            nxt = next(self._it, None)  # the next epoch's first window, or none (no plan given)
            self.wait_s += time.perf_counter() - t
            if nxt is not None and nxt.epoch == at[1] + 1:
                self._first = nxt
        self._close_sampling()

    @property
    def held_bytes(self) -> int:
        """Bytes of the next epoch's first window held between epochs (its samples and ids)."""
        f = self._first
        if f is None:
            return 0
        n = int(f.seeds.nbytes + f.ids.nbytes)
        for mb in f.kept.values():
            n += int(mb.nodes.nbytes + mb.seeds.nbytes + mb.seed_positions.nbytes)
            for b in mb.blocks:
                n += int(b.indptr.nbytes + b.indices.nbytes)
                n += sum(int(a.nbytes) for a in (b.eids, b.edge_weight) if a is not None)
        return n

    @staticmethod
    def _stats(nbytes: int, rows: int, reads: int, seconds: float, hits: int, wait: float) -> dict:
        return {"read_ahead_bytes": nbytes, "read_ahead_rows": rows, "read_ahead_reads": reads,
                "read_ahead_s": seconds, "read_ahead_hits": hits, "read_ahead_sample_wait_s": wait}

    @staticmethod
    def no_stats() -> dict:
        """The counters of :meth:`reset_stats`, all 0 (a run without a read-ahead)."""
        return ReadAhead._stats(0, 0, 0, 0.0, 0, 0.0)

    def reset_stats(self) -> dict:
        """``read_ahead_bytes``, ``read_ahead_rows``, ``read_ahead_reads``, ``read_ahead_s``,
        ``read_ahead_hits`` (rows served from the staged table) and ``read_ahead_sample_wait_s``
        (waits for windows still being sampled) since the last call (then 0)."""
        d = self._stats(self.bytes_read, self.rows, self.reads, self.read_s,
                        self.table.reset_stats(), self.wait_s)
        self.bytes_read = self.rows = self.reads = 0
        self.read_s = self.wait_s = 0.0
        return d


def sample_ahead_bytes(depth: int, batch_rows: int, batch_edges: int) -> int:
    """Host memory of :class:`SampleAhead` with ``depth`` batches of about ``batch_rows`` input rows
    and ``batch_edges`` sampled edges: ``depth`` samples queued plus the one being sampled (node
    ids 8 B per row, block CSCs ~4 B per edge and 8 B per row, and the edge arrays the batch's
    blocks are built from, 16 B per edge); the sampler's own scratch is counted with the sampler."""
    return int((depth + 1) * (batch_rows * 16 + batch_edges * 20)) if depth > 0 else 0


class SampleAhead:
    """Samples the steps of a plan ``depth`` ahead, on a thread of its own.

    :meth:`take` is called for the steps in order (by the loader thread, as it builds them); the
    first call, and any call out of sequence (a new epoch or plan, a resume), starts a producer at
    that step.  The samples are those the loader would make (``sample`` is keyed by the step), so
    results do not depend on ``depth``; sampling failures are raised by :meth:`take`.

    Args:
        sample: ``sample(plan, step, epoch) -> MiniBatch`` (keyed as training keys it).
        depth: samples made ahead of the one being taken (>= 1).

    Raises:
        ValueError: ``depth`` < 1.
    """

    def __init__(self, sample: Callable[[Plan, int, int], MiniBatch], depth: int) -> None:
        if depth < 1:
            raise ValueError(f"sample-ahead depth {depth}: need >= 1 batch")
        self.sample, self.depth = sample, int(depth)
        self._plan: Plan | None = None
        self._at: tuple[int, int] | None = None  # (epoch, next step expected)
        self._it = None

    def _produce(self, plan: Plan, epoch: int, start: int):  # type: ignore[no-untyped-def]
        for j in range(start, len(plan)):
            t0 = time.perf_counter()
            mb = self.sample(plan, j, epoch)
            yield j, mb, time.perf_counter() - t0

    def take(self, plan: Plan, epoch: int, step: int) -> tuple[MiniBatch, float]:
        """The sample of ``plan`` step ``step`` of ``epoch`` and the seconds its sampling took (on
        the sampling thread, overlapped with the caller's work)."""
        if self._it is None or self._plan is not plan or self._at != (epoch, step):
            self.close()
            self._plan = plan
            self._it = prefetch(self._produce(plan, epoch, step), self.depth)
        j, mb, seconds = next(self._it)
        assert j == step, (j, step)
        self._at = (epoch, step + 1)
        return mb, seconds

    def close(self) -> None:
        """Stop the producer and drop the samples made ahead."""
        if self._it is not None:
            self._it.close()
        self._it, self._plan, self._at = None, None, None
