"""The automatic budget split: which parts of the data stay in memory under one ``--memory-budget``.

Under a budget, the topology (``--topology auto``), the PQ codes of the rows a batch misses
(``--miss-features auto``) and, in hybrid mode, the share of the budget given to a CPU row cache
instead of partition slots all compete for the same bytes.  :func:`choose_split` plans every
combination the configuration leaves open with :func:`ooc.data.budget.plan_budget` (a combination the
budget cannot hold drops out, with its reason), predicts each one's reads per training epoch from a
short **probe** — a few batches of the epoch's own plan, sampled with the run's sampler keys over the
lists read from disk (:func:`ooc.kernels.disk_sampling.sample_blocks_lists`) — and keeps the one
with the fewest predicted seconds of I/O.  In exact mode its choices change speed only (a topology
in memory or on disk samples the same batches; the cache changes where a row comes from, not its
value).  In buffer and hybrid mode the batches follow the buffer states, so a split with another
number of partition slots trains other batches — as any other budget does; the choice is a
function of the configuration and the seed, so a run is reproducible and every rank agrees.
``--miss-features auto`` may choose PQ-decoded (approximate) rows and is therefore never the
default.

The same probe sizes the batches in flight (:func:`probe_extents`): the largest probed batch's input
rows and sampled edges, times :data:`EXTENT_MARGIN`, and never more than the graph, instead of the
no-deduplication bound ``batch * prod(1 + fanout)`` (which for Cora is the whole graph per batch).

Cost model (per training epoch of the whole job, an estimate, printed with the plan; the run's
metrics record the real bytes read): rows a batch needs that are neither in its state's partitions
nor in the row cache are read, at the bytes and requests per row that the run's reader plans for
the probed batches' misses (:meth:`~ooc.storage.io.DiskRows.plan`: sorted, coalesced, whole 4 KiB
pages and holes up to ``--io-gap`` with O_DIRECT, the bytes asked for with buffered reads); with PQ
only the inner hops' misses are read; the row cache's hit ratio follows Che's approximation of an
LRU cache with each node asked for in proportion to its degree (a node is drawn as an in-neighbour
about in proportion to its out-degree, equal to its in-degree in graphs stored in both directions),
plus the misses that fill it once per job;
partition loads read each loaded partition once, in the requests the run's range reads make
(:meth:`~ooc.storage.io.DiskRows.range_requests`); with the topology on disk the list reads are the
probed batches' own, planned by the run's list reader
(:meth:`~ooc.storage.io.NeighborReader.plan_reads`: lists sharing a page or within the gap share a
request), without the lists of the hot set (``--hot-topology``; ``auto`` tries a few sizes, each the
set :class:`~ooc.storage.io.HotLists` would build).  With a read-ahead window of W batches
(:class:`ooc.data.lookahead.ReadAhead`) the misses are read once per window instead: the union of
W probed batches' misses as the reader plans it, at most the whole feature file.  Seconds =
bytes / :data:`DISK_BYTES_PER_S` + requests x :data:`REQUEST_S` (O_DIRECT with 32 requests in flight on this project's development VM; with
the default 128 a request costs about half that there, which the constant does not follow).  Buffer
mode samples inside the resident partitions: it reads only its partition loads (their in-edges too
with the topology on disk).  The cost model counts I/O, but fewer slots also mean smaller buffer
states, whose batches hold the classes of a few partitions (partitions follow communities, hence
labels): in ``buffer`` / ``hybrid`` node tasks with one class per node, a split whose epoch plan's
batches are further than :data:`MIX_EXCESS` from the training set's label mix beyond i.i.d.
batches' is kept only where no split is within it (then the nearest ones compete).  Of the splits
left, those within :data:`TIE` (5%) of the fewest predicted seconds compete, and the one with the
most partition slots is kept, then the first tried (memory before disk, no PQ before PQ, no cache
first).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from ooc.data.budget import DISK_BYTES_PER_S, BudgetPlan, _batch_extent
from ooc.data.plan import (class_mix_distance, plan_classes, plan_exact, plan_states,
                            uniform_class_mix)
from ooc.kernels.disk_sampling import sample_blocks_lists
from ooc.kernels.rng import batch_key
from ooc.kernels.sampling import SampledSubgraph
from ooc.storage.dataset import Dataset
from ooc.storage.io import DiskRows, HotLists, NeighborReader
from ooc.util.sizes import format_bytes

if TYPE_CHECKING:
    from ooc.config import TrainConfig

log = logging.getLogger(__name__)

__all__ = ["ReadCost", "Extents", "SplitChoice", "ListProbe", "probe_extents", "choose_split",
           "EXTENT_MARGIN", "AUTO_HOT_SHARES",
           "DISK_BYTES_PER_S", "REQUEST_S"]

#: Cost of one read request beyond its bytes (s): latency over the requests in flight.
REQUEST_S = 2.0e-5
#: Factor on the largest probed batch (input rows, sampled edges) for the batches in flight.
EXTENT_MARGIN = 1.25
#: Batches probed for the batch extents.
PROBE_BATCHES = 4
#: Batches probed per candidate state size for the reads (with 4, 8, 16 and 32 the predictions of
#: two splits whose measured reads were equal on the 2 M-node bench differed by 22, 14, 7 and 3%).
PROBE_STATE_BATCHES = 16
#: ... but no more batches than hold about this many list reads by their no-deduplication bound
#: (at least :data:`PROBE_BATCHES`): at 111 M nodes a 15,10,5 batch of 1,024 reads ~170 K lists
#: from disk, ~1.5 GB with O_DIRECT, and 16 batches per candidate state size made the probe
#: take longer than a tenth of the epoch.  A function of the configuration, so every rank probes
#: the same batches.
PROBE_STATE_LISTS = 400_000
#: ``--hot-topology auto``: shares of the whole on-disk topology (lists, offsets, bitmap) tried as
#: hot sets beside none.  A power-law graph's hottest eighth holds most draws; a regular one needs
#: about the share of draws it should serve.
AUTO_HOT_SHARES = (0.125, 0.25, 0.5)
#: Predicted seconds within this fraction of the fewest count as equal: of those the split with the
#: most partition slots (and then the one found first: memory, no PQ, no cache) is kept.  The
#: predictions fell within 1-5% of the measured reads on the 2 M-node bench and the demo graph
#: once planned by the run's readers (10% before, when they ran 5-20% off); at 10% lists on disk
#: with 34 slots won there over the topology in memory with 20 and trained 16% slower.
TIE = 0.05
#: Largest excess of a plan's batch label mix over i.i.d. batches (mean total-variation distance
#: from the training set's class fractions, :func:`~ooc.data.plan.class_mix_distance`, minus that
#: of :func:`~ooc.data.plan.plan_exact`'s batches) a split may have where another split stays
#: within it.  Measured on the 2 M-node bench (16 planted classes, METIS 256, hybrid, mix 0.25,
#: i.i.d. 0.10): 12 partitions per state +0.04, test accuracy after 10 epochs 0.4 points below
#: everything in memory; free seeds from lanes +0.17, 1.5 points below; 5 per state (the PQ
#: split of 8 slots) +0.33, 11.6 points below after one epoch.  The demo graph (8 partitions, one
#: class each): 1 per state +0.59 (test accuracy 0.67 after one epoch), 3 per state +0.37 (0.93).
MIX_EXCESS = 0.10
#: Evaluation batches whose no-deduplication bound exceeds this many rows are not probed (their
#: full neighbourhoods would take long to read); the bound is used.
PROBE_EVAL_MAX_ROWS = 4_000_000


@dataclass(frozen=True)
class ReadCost:
    """Predicted reads of one training epoch: ``bytes`` and ``requests`` (floats, estimates), of
    which ``hidden`` requests are issued on a thread of their own while the trainer works (their
    latency is not on the epoch's path; their bytes still share the disk)."""

    bytes: float = 0.0
    requests: float = 0.0
    hidden: float = 0.0

    @property
    def seconds(self) -> float:
        """``bytes / DISK_BYTES_PER_S + (requests - hidden) * REQUEST_S``."""
        return self.bytes / DISK_BYTES_PER_S + (self.requests - self.hidden) * REQUEST_S

    def __add__(self, other: "ReadCost") -> "ReadCost":
        return ReadCost(self.bytes + other.bytes, self.requests + other.requests,
                        self.hidden + other.hidden)


@dataclass(frozen=True)
class Extents:
    """Largest batch sizes to plan for: ``(input rows, sampled edges)`` of a training batch and of
    an evaluation batch (ints), and whether each was probed (else the no-deduplication bound)."""

    train_rows: int
    train_edges: int
    eval_rows: int
    eval_edges: int
    probed_train: bool = False
    probed_eval: bool = False
    #: mean probed ``(input rows, sampled edges)`` times :data:`EXTENT_MARGIN` (a window of
    #: batches holds about this much per batch); 0: not probed, use the largest
    train_mean: tuple[int, int] = (0, 0)
    eval_mean: tuple[int, int] = (0, 0)
    #: bytes of neighbour lists one batch holds while it is sampled over lists read from disk
    #: (its inner hops' lists, kept, and the largest piece of the last hop's; largest probed
    #: training or evaluation batch times :data:`EXTENT_MARGIN`); 0: not probed
    list_bytes: int = 0

    def record(self) -> dict:
        """Plain values for a checkpoint (:meth:`from_record` restores them)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_record(cls, rec: dict) -> "Extents":
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in rec.items()})

    def per_window_batch(self, train: bool) -> tuple[int, int]:
        """``(rows, edges)`` to plan per batch of a read-ahead window: the mean where probed,
        else the largest."""
        mean = self.train_mean if train else self.eval_mean
        if mean[0]:
            return mean
        return (self.train_rows, self.train_edges) if train else (self.eval_rows, self.eval_edges)


@dataclass
class SplitChoice:
    """The split :func:`choose_split` kept.

    Attributes:
        topology: ``memory`` or ``disk`` (or the configured one); pq: PQ-decoded misses.
        cache_size: bytes of the hybrid row cache asked of :func:`plan_budget` (None: the default).
        hot_topology: bytes of hottest lists kept in memory with the topology on disk (0: none).
        hot_bits: their bitmap (:meth:`~ooc.storage.io.HotLists.select`; N / 8 bytes), handed to
            :meth:`~ooc.storage.io.HotLists.build` so the lists are not scored twice.
        plan: its :class:`BudgetPlan`.
        predicted: its predicted reads per epoch.
        candidates: every combination tried: ``(label, ReadCost or None, reason it was refused)``.
        probe_s: seconds the probe took.
    """

    topology: str
    pq: bool
    cache_size: int | None
    plan: BudgetPlan
    predicted: ReadCost
    candidates: list[tuple[str, ReadCost | None, str]] = field(default_factory=list)
    probe_s: float = 0.0
    hot_topology: int = 0
    hot_bits: np.ndarray | None = None
    #: an interrupted run's choice, taken from its checkpoint (:meth:`record`), not probed again
    reused: bool = False
    #: ``(distance, i.i.d. distance)``: the label mix of its epoch plan's batches
    #: (:func:`~ooc.data.plan.class_mix_distance`) and of uniform batches; None where the task
    #: has no single class per node or the mode plans no buffer states
    class_mix: tuple[float, float] | None = None

    @property
    def class_excess(self) -> float:
        """How much further from the training set's label mix its batches are than i.i.d.
        batches (0.0 where :attr:`class_mix` is None)."""
        return 0.0 if self.class_mix is None else max(0.0, self.class_mix[0] - self.class_mix[1])

    def describe(self) -> str:
        """One line: what stays in memory and the predicted reads."""
        p = self.plan
        parts = [f"topology {self.topology}"]
        if self.hot_topology:
            parts[0] += f" (hot lists {format_bytes(self.hot_topology)})"
        if p.num_parts:
            parts.append(f"{p.slots} of {p.num_parts} partition slots")
        if p.cache:
            parts.append(f"row cache {format_bytes(p.cache)}")
        if self.pq:
            parts.append(f"PQ codes {format_bytes(p.compressed)}")
        if p.read_ahead:
            parts.append(f"read-ahead {p.read_ahead} batches {format_bytes(p.read_ahead_bytes)}")
        how = "the interrupted run's choice, not probed again" if self.reused else \
            f"{len(self.candidates)} splits compared, probe {self.probe_s:.1f} s"
        n = int(self.predicted.requests)
        return (", ".join(parts) + f"; predicted read per epoch {format_bytes(int(self.predicted.bytes))}"
                f" in {n:,} request{'' if n == 1 else 's'} ({how})")

    def record(self) -> dict:
        """The choice as plain values and a tensor (a checkpoint's ``weights_only`` content): what
        :func:`ooc.data.path.plan_machine` needs to plan it again without probing."""
        import torch
        bits = None if self.hot_bits is None else torch.from_numpy(self.hot_bits.view(np.int64).copy())
        return {"topology": self.topology, "pq": bool(self.pq), "cache_size": self.cache_size,
                "hot_topology": int(self.hot_topology), "hot_bits": bits,
                "predicted": [float(self.predicted.bytes), float(self.predicted.requests),
                              float(self.predicted.hidden)]}

    @staticmethod
    def bits_of(record: dict) -> np.ndarray | None:
        """The uint64 hot-list bitmap of a :meth:`record` (None: no hot lists)."""
        b = record.get("hot_bits")
        return None if b is None else b.numpy().view(np.uint64).copy()

    def as_dict(self) -> dict:
        return {"topology": self.topology, "hot_topology_bytes": self.hot_topology,
                "pq": self.pq, "cache_bytes": self.plan.cache,
                "slots": self.plan.slots, "read_ahead": self.plan.read_ahead,
                "predicted_bytes": int(self.predicted.bytes),
                "predicted_requests": int(self.predicted.requests),
                "class_mix": None if self.class_mix is None else list(self.class_mix),
                "candidates": [{"split": lab, "predicted_bytes": None if c is None else int(c.bytes),
                                "predicted_requests": None if c is None else int(c.requests),
                                "refused": why} for lab, c, why in self.candidates]}


# ------------------------------------------------------------------------------------------ probe
def list_reader(ds: Dataset, indptr: np.ndarray, cfg: "TrainConfig") -> NeighborReader:
    """The run's reader of on-disk neighbour lists (``--direct-io``, ``--io-depth``,
    ``--io-gap``); the probe opens the same, so its planned reads are the run's."""
    return NeighborReader(ds.raw("indices"), indptr, direct=cfg.direct_io,
                          # buffered list reads are mostly page-cache hits (CPU-bound): at most
                          # a thread per core
                          threads=max(1, min(8, cfg.io_depth, os.cpu_count() or 1)),
                          aio_depth=max(1, cfg.io_depth),
                          gap=cfg.io_gap if cfg.direct_io else None)


def feature_rows(ds: Dataset, cfg: "TrainConfig", threads: int | None = None) -> DiskRows:
    """The run's reader of feature rows from disk (``--direct-io``, ``--io-depth``,
    ``--io-gap``); ``threads`` default ``min(8, io_depth)``."""
    return DiskRows(ds.features, direct=cfg.direct_io,
                    threads=max(1, min(8, cfg.io_depth)) if threads is None else threads,
                    gap=cfg.io_gap if cfg.direct_io else 0, aio_depth=max(1, cfg.io_depth))


def partition_list_rows(ds: Dataset, cfg: "TrainConfig") -> DiskRows:
    """The run's reader of a partition's in-edges (``topology/indices`` ranges) where buffer mode
    loads them with each partition (the topology on disk)."""
    return DiskRows(ds.raw("indices"), direct=cfg.direct_io, threads=max(1, min(4, cfg.io_depth)),
                    aio_depth=0)


class ListProbe:
    """Samples batches over the dataset's on-disk lists (whatever the run's ``--topology``) with
    the run's list reader, and plans (without reading) the run's feature reads.

    Attributes:
        fetched: the node arrays (int64) of each list read of the last :meth:`sample`, in order.
        held_bytes: the most list bytes the last sample held at once (see :meth:`sample`).
    """

    def __init__(self, ds: Dataset, indptr: np.ndarray, cfg: "TrainConfig") -> None:
        self.ds = ds
        self.cfg = cfg
        self.n = ds.num_nodes
        self.reader = list_reader(ds, indptr, cfg)
        self.indptr = indptr
        self.held_bytes = 0
        self.fetched: list[np.ndarray] = []
        self._feats: DiskRows | None = None
        self._edges: DiskRows | None = None

    def sample(self, seeds: np.ndarray, fanouts: list[int], key: int,
               replace: bool) -> SampledSubgraph:
        """:func:`sample_blocks_lists` of ``seeds`` over the lists read from disk;
        :attr:`held_bytes` is then the most list bytes the sample held at once (an upper bound:
        one fetch per inner hop, kept, then the last hop's pieces one at a time)."""
        sizes: list[int] = []
        self.fetched = []

        def fetch(nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            ptr, ids = self.reader.read(nodes)
            sizes.append(ids.nbytes + ptr.nbytes)
            self.fetched.append(np.array(nodes, dtype=np.int64))
            return ptr, ids

        sg = sample_blocks_lists(fetch, self.n, seeds, fanouts, np.uint64(key), replace)
        inner = max(len(fanouts) - 1, 0)
        self.held_bytes = sum(sizes[:inner]) + max(sizes[inner:], default=0)
        return sg

    def plan_feature_reads(self, rows: np.ndarray) -> tuple[int, int]:
        """``(bytes, requests)`` the run's feature reader would read for the rows ``rows``
        (int64, any order, duplicates allowed) in one gather: :meth:`DiskRows.plan`, no I/O."""
        if rows.shape[0] == 0 or not self.ds.has("features"):
            return 0, 0
        if self._feats is None:
            self._feats = feature_rows(self.ds, self.cfg)
        _, _, size, _ = self._feats.plan(np.unique(rows))
        return int(size.sum()), int(size.shape[0])

    def load_reads(self, offsets: np.ndarray, edges: bool) -> tuple[float, float]:
        """``(bytes, requests)`` of one partition load, the mean over the partitions of
        ``offsets`` (int64 [P+1]): the ranges the run's readers request
        (:meth:`DiskRows.range_requests`: aligned spans cut at chunk files and into pieces, several
        in flight), of the feature rows and, with ``edges`` (buffer mode, topology on disk), of
        the partition's in-edges too."""
        num_parts = offsets.shape[0] - 1
        if num_parts <= 0:
            return 0.0, 0.0
        readers: list[tuple[DiskRows, np.ndarray]] = []
        if self.ds.has("features"):
            if self._feats is None:
                self._feats = feature_rows(self.ds, self.cfg)
            readers.append((self._feats, offsets))
        if edges:
            if self._edges is None:
                self._edges = partition_list_rows(self.ds, self.cfg)
            readers.append((self._edges, self.indptr[offsets]))
        nbytes = requests = 0
        for rows, bounds in readers:
            for p in range(num_parts):
                a, b = int(bounds[p]), int(bounds[p + 1])
                if b > a:
                    nbytes += rows.span(a, b)[1]
                    requests += len(rows.range_requests(a, b))
        return nbytes / num_parts, requests / num_parts

    def close(self) -> None:
        self.reader.close()
        for r in (self._feats, self._edges):
            if r is not None:
                r.close()


def _evenly(k: int, m: int) -> list[int]:
    """``min(k, m)`` indices spread evenly over ``range(m)``."""
    if m <= 0:
        return []
    return sorted({int(i) for i in np.linspace(0, m - 1, num=min(k, m))})


def probe_extents(cfg: "TrainConfig", ds: Dataset, probe: "ListProbe | None" = None) -> Extents:
    """Batch extents for the batches in flight: probed for the node-wise sampler on node
    classification (training batches of the first epoch's uniform plan, evaluation batches of the
    validation split), else the no-deduplication bound of :func:`ooc.data.budget._batch_extent`.

    A probed extent is the largest of :data:`PROBE_BATCHES` batches times :data:`EXTENT_MARGIN`,
    at most the bound (a batch holds at most every node once).  The training probe uses uniform
    seeds (the widest batches: seeds of a few partitions share neighbours).
    """
    n, e = ds.num_nodes, ds.num_edges
    avg = e / max(n, 1)
    fo = list(cfg.fanouts)
    efo = list(cfg.eval_fanouts) if cfg.eval_fanouts else [-1] * len(fo)
    tb = _batch_extent(n, avg, cfg.batch_size, fo)
    eb = _batch_extent(n, avg, cfg.eval_batch_size, efo) if cfg.eval_batch_size else (0, 0)
    if cfg.sampler != "neighbor" or cfg.task != "node" or n == 0:
        return Extents(*tb, *eb)
    own = probe is None
    probe = probe or ListProbe(ds, ds.indptr, cfg)
    try:
        def measure(ids: np.ndarray, bs: int, fanouts: list[int], bound: tuple[int, int],
                    salt: int) -> tuple[int, int, bool, tuple[int, int]]:
            nonlocal held
            if ids.shape[0] == 0 or bs <= 0:
                return (*bound, False, (0, 0))
            plan = plan_exact(ids, bs, cfg.seed, 0)
            rows, edges = [], []
            for i in _evenly(PROBE_BATCHES, len(plan.batches)):
                sg = probe.sample(plan.batches[i], fanouts, batch_key(cfg.seed, salt, i), cfg.replace)
                rows.append(int(sg.nodes.shape[0]))
                edges.append(sum(int(b.indices.shape[0]) for b in sg.blocks))
                held = max(held, int(probe.held_bytes * EXTENT_MARGIN))
            mean = (min(bound[0], int(np.mean(rows) * EXTENT_MARGIN) + 1),
                    min(bound[1], int(np.mean(edges) * EXTENT_MARGIN) + 1))
            return (min(bound[0], int(max(rows) * EXTENT_MARGIN) + 1),
                    min(bound[1], int(max(edges) * EXTENT_MARGIN) + 1), True, mean)

        held = 0  # the most list bytes a probed batch held (times the margin)
        tr, te, pt, tm = measure(ds.split("train"), cfg.batch_size, fo, tb, 0)
        if eb[0] <= PROBE_EVAL_MAX_ROWS:
            ev_ids = ds.split("valid")
            if ev_ids.shape[0] == 0:
                ev_ids = ds.split("test")
            er, ee, pe, em = measure(ev_ids, cfg.eval_batch_size, efo, eb, 1)
        else:
            er, ee, pe, em = (*eb, False, (0, 0))
        return Extents(tr, te, er, ee, pt, pe, tm, em, held)
    finally:
        if own:
            probe.close()


@dataclass
class _StateStats:
    """Probed batches of a plan with a given state size: per batch its input rows, the rows in the
    state's partitions, the not-resident rows reached only by the last hop, and the feature reads
    its not-resident rows plan to (all of them, and those of the inner hops only: with PQ the
    last hop's are decoded), in bytes and requests; each batch's list reads (the node arrays of
    its fetches); the partitions loaded in the epoch."""

    rows: np.ndarray
    resident: np.ndarray
    outer_miss: np.ndarray
    loads_per_epoch: float
    #: batches of the probed epoch plan (0: not known)
    num_batches: int = 0
    #: per probed batch its not-resident rows (sorted int64), all of them and the inner hops' only
    misses: list[np.ndarray] = field(default_factory=list)
    inner_misses: list[np.ndarray] = field(default_factory=list)
    fetches: list[list[np.ndarray]] = field(default_factory=list)
    #: mean distance of the plan's batches from the training set's label mix (None: no classes,
    #: or exact / one-state plans)
    class_distance: float | None = None
    _list_reads: dict = field(default_factory=dict)
    _miss_reads: dict = field(default_factory=dict)

    def miss_reads(self, probe: ListProbe, window: int, inner: bool) -> tuple[float, float, float]:
        """``(rows, bytes, requests)`` per gather of the misses of ``window`` consecutive probed
        batches together (1: each batch's own gather; a read-ahead window's otherwise), as the
        run's feature reader plans them (:meth:`ListProbe.plan_feature_reads`), mean over the
        groups; ``inner``: the inner hops' misses only (PQ decodes the last hop's)."""
        key = (window, inner)
        if key not in self._miss_reads:
            arrays = self.inner_misses if inner else self.misses
            w = max(1, min(window, len(arrays)))
            got = []
            for a in range(0, len(arrays) - w + 1, w):
                rows = np.unique(np.concatenate(arrays[a:a + w])) if w > 1 else arrays[a]
                got.append((rows.shape[0], *probe.plan_feature_reads(rows)))
            mean = np.asarray(got, dtype=np.float64).mean(axis=0) if got else np.zeros(3)
            self._miss_reads[key] = (float(mean[0]) * window / w, float(mean[1]) * window / w,
                                     float(mean[2]) * window / w)
        return self._miss_reads[key]

    def list_reads(self, probe: ListProbe, hot_bits: np.ndarray | None, key: int = 0
                   ) -> tuple[int, int]:
        """``(bytes, requests)`` of the probed batches' list reads without the lists in
        ``hot_bits`` (:meth:`NeighborReader.plan_reads`), remembered under ``key`` (the hot
        set's size)."""
        if key not in self._list_reads:
            nb = rq = 0
            for fetched in self.fetches:
                for nodes in fetched:
                    b, r = probe.reader.plan_reads(nodes, hot_bits)
                    nb, rq = nb + b, rq + r
            self._list_reads[key] = (nb, rq)
        return self._list_reads[key]


def _state_probe_batches(cfg: "TrainConfig", num_nodes: int) -> int:
    """Batches probed per state size: :data:`PROBE_STATE_BATCHES`, fewer (not below
    :data:`PROBE_BATCHES`) where a batch's list reads (every hop but the last, no deduplication,
    at most every node) would exceed :data:`PROBE_STATE_LISTS` together."""
    lists, frontier = 0, max(int(cfg.batch_size), 1)
    for f in list(cfg.fanouts)[:-1] if cfg.fanouts else []:
        lists += frontier
        frontier = frontier * (f if f > 0 else 1_000_000)
    lists = min(lists + frontier if cfg.fanouts else frontier, max(int(num_nodes), 1))
    return int(max(PROBE_BATCHES, min(PROBE_STATE_BATCHES, PROBE_STATE_LISTS // max(lists, 1))))


def _probe_states(cfg: "TrainConfig", ds: Dataset, probe: ListProbe, offsets: np.ndarray,
                  state_slots: int, group: int, slots: int, classes: np.ndarray | None = None
                  ) -> _StateStats:
    """Probe the epoch-0 plan of ``state_slots`` partitions per buffer state (COMET ``group``)
    in ``slots`` partition slots: a batch's rows are resident in its state's partitions and in
    the upcoming partitions the spare slots prefetch (:meth:`BufferManager.require`); in exact
    mode the first ``slots`` partitions are resident throughout (static residency), loaded once
    per job.  ``classes``: :func:`~ooc.data.plan.plan_classes` of the training ids (the hybrid
    plan's free seeds are dealt by them; the plan's label mix is measured against them)."""
    ids = ds.split("train")
    num_parts = offsets.shape[0] - 1
    part_of = np.searchsorted(offsets, ids, side="right") - 1
    slots = min(slots, num_parts)
    distance: float | None = None
    if cfg.mode == "exact" or state_slots >= num_parts:
        plan = plan_exact(ids, cfg.batch_size, cfg.seed, 0)
        held = list(range(num_parts if state_slots >= num_parts else slots))
        states: list[list[int]] = [held]
        batch_state = [0] * len(plan.batches)
        upcoming: list[list[int]] = [[]]
    else:
        plan = plan_states(ids, part_of, num_parts, state_slots, cfg.batch_size, cfg.seed, 0,
                           cfg.ordering, group, None,
                           mix=cfg.hybrid_mix if cfg.mode == "hybrid" else 0.0, classes=classes)
        states, batch_state, upcoming = plan.states, plan.batch_state, plan.upcoming
        if classes is not None:
            distance = class_mix_distance(plan.batches, ids, classes)
    loads = float(sum(len(set(s) - set(states[i - 1] if i else [])) for i, s in enumerate(states)))
    if cfg.mode == "exact":
        loads /= max(cfg.epochs, 1)
    if cfg.mode == "buffer":  # no misses and no list reads: only the loads matter
        empty = np.zeros(0, dtype=np.int64)
        return _StateStats(empty, empty, empty, loads, len(plan.batches), class_distance=distance)
    out: dict[str, list] = {k: [] for k in ("rows", "resident", "outer")}
    misses: list[np.ndarray] = []
    inner_misses: list[np.ndarray] = []
    fetches: list[list[np.ndarray]] = []
    for i in _evenly(_state_probe_batches(cfg, ds.num_nodes), len(plan.batches)):
        sg = probe.sample(plan.batches[i], list(cfg.fanouts), batch_key(cfg.seed, 0, i), cfg.replace)
        nodes = sg.nodes
        inner = sg.blocks[0].num_dst if sg.blocks else nodes.shape[0]  # nodes of every hop but the last
        resident = np.zeros(num_parts, dtype=bool)
        k = batch_state[i]
        if k >= 0:
            state = list(dict.fromkeys(int(p) for p in states[k]))
            spare = [int(q) for q in upcoming[k] if int(q) not in state] if k < len(upcoming) else []
            resident[state + spare[:max(slots - len(state), 0)]] = True
        res = resident[np.searchsorted(offsets, nodes, side="right") - 1]
        out["rows"].append(nodes.shape[0])
        out["resident"].append(int(res.sum()))
        out["outer"].append(int((~res[inner:]).sum()))
        misses.append(np.sort(nodes[~res]).astype(np.int64, copy=False))
        inner_misses.append(np.sort(nodes[:inner][~res[:inner]]).astype(np.int64, copy=False))
        fetches.append(probe.fetched)
    arr = {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}
    return _StateStats(arr["rows"], arr["resident"], arr["outer"], loads, len(plan.batches), misses,
                       inner_misses, fetches, distance)


def _cache_hit(degrees: np.ndarray, misses_per_batch: float, cache_rows: int) -> float:
    """Hit ratio of an LRU-like row cache of ``cache_rows`` rows under Che's approximation (Che,
    Tung and Wang, IEEE JSAC 2002): node ``v`` is asked for ``lam_v = m * deg_v / sum(deg)`` times
    per batch (``m`` = ``misses_per_batch``, in proportion to its degree, the in-neighbour draw);
    the cache's characteristic time ``T`` (batches) solves ``sum_v (1 - exp(-lam_v T)) = C`` and
    ``hit = sum_v lam_v (1 - exp(-lam_v T)) / sum_v lam_v``.  Uniform degrees give ``C / N``.

    SIEVE and CLOCK behave close to LRU here; the estimate is the same for all three.
    """
    n = degrees.shape[0]
    if cache_rows <= 0 or misses_per_batch <= 0 or n == 0:
        return 0.0
    if cache_rows >= n:
        return 1.0
    vals, counts = np.unique(np.maximum(degrees, 0), return_counts=True)
    total = float((vals * counts).sum())
    if total <= 0:
        return min(1.0, cache_rows / n)
    lam = misses_per_batch * vals / total
    cnt = counts.astype(np.float64)

    def occupied(t: float) -> float:
        return float((cnt * -np.expm1(-lam * t)).sum())

    lo, hi = 0.0, 1.0
    while occupied(hi) < cache_rows and hi < 1e18:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if occupied(mid) < cache_rows:
            lo = mid
        else:
            hi = mid
    t = 0.5 * (lo + hi)
    return float((cnt * lam * -np.expm1(-lam * t)).sum() / (cnt * lam).sum())


def _epoch_cost(cfg: "TrainConfig", ds: Dataset, st: _StateStats, plan: BudgetPlan, topology: str,
                pq: bool, degrees: np.ndarray, probe: ListProbe, offsets: np.ndarray,
                hot_bits: np.ndarray | None = None, hot: int = 0) -> ReadCost:
    """Predicted reads of one training epoch (see the module docstring); with the topology on
    disk the probed batches' list reads are planned by ``probe``'s reader without the lists in
    ``hot_bits`` (the hot set of ``hot`` bytes)."""
    # the plan's own batches: a state with fewer seeds than a batch trains a smaller one
    num_batches = st.num_batches or -(-ds.split("train").shape[0] // max(cfg.batch_size, 1))
    probed = max(st.rows.shape[0], 1)
    row_bytes = ds.features.row_bytes if ds.has("features") else 0
    parts: dict[str, ReadCost] = {}
    if cfg.mode == "buffer":  # samples inside the resident partitions: loads only, lists included
        if plan.slots < plan.num_parts:
            loads = float(st.loads_per_epoch)
        else:
            loads = plan.num_parts / max(cfg.epochs, 1)
        part_bytes, part_requests = probe.load_reads(offsets, topology == "disk")
        return ReadCost(loads * part_bytes, loads * part_requests)
    if row_bytes:
        misses = (st.rows - st.resident).sum() / probed * num_batches
        read_misses = misses - (st.outer_miss.sum() / probed * num_batches if pq else 0.0)
        if plan.read_ahead >= 2 and plan.slots < plan.num_parts:  # one gather per window
            windows = -(-num_batches // plan.read_ahead)
            _, wbytes, wreqs = st.miss_reads(probe, plan.read_ahead, pq)
            scale = min(1.0, float(ds.features.nbytes) / wbytes) if wbytes else 1.0
            parts["misses"] = ReadCost(windows * wbytes * scale, windows * wreqs * scale)
        else:
            # bytes and requests per missed row as the reader plans the probed batches' gathers
            rows, nbytes, reqs = st.miss_reads(probe, 1, pq)
            per = nbytes / rows if rows else float(row_bytes)
            per_request = reqs / rows if rows else 1.0
            hit = _cache_hit(degrees, (st.rows - st.resident).sum() / probed, plan.cache_rows)
            # steady-state misses, plus the cache's filling: each row it holds was first a miss
            # (once per job: the cache stays warm across epochs)
            reads = read_misses * (1.0 - hit) + min(float(plan.cache_rows), read_misses * hit) \
                / max(cfg.epochs, 1)
            parts["misses"] = ReadCost(reads * per, reads * per_request)
        if plan.slots:
            part_bytes, part_requests = probe.load_reads(offsets, False)
            loads = st.loads_per_epoch if plan.slots < plan.num_parts else \
                plan.num_parts / max(cfg.epochs, 1)
            parts["loads"] = ReadCost(loads * part_bytes, loads * part_requests)
    if topology == "disk":
        nbytes, requests = st.list_reads(probe, hot_bits, hot)
        # a read-ahead samples its windows on a thread of its own while the trainer works: the
        # lists' bytes share the disk with the window reads, their requests' latency is hidden
        # (exact mode at dataset / 3: every list on disk in 6 windows trained 0.6 s faster than
        # the topology in memory in 9, where counting the requests preferred the latter)
        lists = requests / probed * num_batches
        hidden = plan.read_ahead >= 2 and plan.slots < plan.num_parts
        parts["lists"] = ReadCost(nbytes / probed * num_batches, lists, lists if hidden else 0.0)
    log.debug("predicted reads, %s: %s", topology if not hot else f"{topology}, hot {hot} B",
              ", ".join(f"{k} {format_bytes(int(c.bytes))} in {int(c.requests):,} requests"
                        for k, c in parts.items()))
    return sum(parts.values(), ReadCost())


def _keep(splits: list[SplitChoice]) -> SplitChoice:
    """The split to keep.  First the label mix: the splits whose batches are within
    :data:`MIX_EXCESS` of i.i.d. batches' (:attr:`SplitChoice.class_excess`), or, where none is,
    those within half of it of the nearest (a budget that holds only small states still trains on
    the best mixed batches it can plan).  Of those, the ones within :data:`TIE` of the fewest
    predicted seconds, and of these the one with the most partition slots (larger states: fewer
    cut edges in buffer mode, more hits elsewhere), then the first tried.  Measured against the
    minimum, not split by split, so that a chain of near-ties cannot drift away from it."""
    mixed = [c for c in splits if c.class_excess <= MIX_EXCESS]
    if not mixed:
        nearest = min(c.class_excess for c in splits)
        mixed = [c for c in splits if c.class_excess <= nearest + MIX_EXCESS / 2]
    least = min(c.predicted.seconds for c in mixed)
    near = [c for c in mixed if c.predicted.seconds <= least * (1 + TIE)]
    return max(near, key=lambda c: c.plan.slots)  # max keeps the first of equals


def choose_split(cfg: "TrainConfig", ds: Dataset, offsets: np.ndarray,
                 plan_with: Callable[[str, bool, int | None, int], BudgetPlan],
                 topologies: list[str], pqs: list[bool], cache_fractions: list[float | None],
                 probe: "ListProbe | None" = None, hot_sizes: list[int] | None = None
                 ) -> SplitChoice:
    """Plan every ``topology x hot size x pq x cache fraction`` with ``plan_with(topology, pq,
    cache_size, hot_bytes)`` and keep the one with the fewest predicted I/O seconds per epoch.

    Hot sizes apply to ``disk`` only: the hot set of each size is the one
    :class:`~ooc.storage.io.HotLists` would build (its draw scores, one sequential pass over the
    lists, computed once here), and the probed list reads of its nodes are not charged.

    Args:
        cfg: the run's configuration (mode, batch size, fanouts, seed, sampler keys).
        offsets: int64 [P+1] the run's partitions.
        plan_with: builds the :class:`BudgetPlan` of one combination (raises ValueError when the
            budget cannot hold it).
        hot_sizes: bytes of hot lists tried with the topology on disk (default ``[0]``).
        topologies: ``memory`` / ``disk`` / ``mmap`` candidates, in order of preference on ties.
        pqs: PQ candidates; cache_fractions: hybrid row-cache shares of what the slots would take
            (``None``: plan_budget's default).
        probe: the list sampler to probe with (default: one opened and closed here).

    Returns:
        The kept :class:`SplitChoice`.

    Raises:
        ValueError: no combination fits the budget (the reason of the last one tried without hot
            lists: the smallest footprint).
    """
    t0 = time.perf_counter()
    indptr = ds.indptr
    degrees = np.diff(indptr)
    own = probe is None
    probe = probe or ListProbe(ds, indptr, cfg)
    stats: dict[tuple[int, int], _StateStats] = {}
    # the label mix of uniform batches (epoch 0 of plan_exact): what state plans are measured from
    ids = ds.split("train")
    classes = plan_classes(ds.labels if ds.has("labels") else None, ids) \
        if cfg.mode in ("buffer", "hybrid") else None
    iid = None if classes is None else \
        uniform_class_mix(ids, cfg.batch_size, cfg.seed, classes)
    fitted: list[SplitChoice] = []
    tried: list[tuple[str, ReadCost | None, str]] = []
    last_err: ValueError | None = None
    scores: np.ndarray | None = None
    try:
        disk_hots = hot_sizes or [0]
        for topo, hot in [(t, h) for t in topologies for h in (disk_hots if t == "disk" else [0])]:
            bits = None
            if hot:
                if scores is None:
                    fo = -1 if min(cfg.fanouts) < 0 else max(cfg.fanouts)
                    scores = HotLists.scores(ds.raw("indices"), indptr, fo)
                bits = HotLists.select(indptr, scores, hot, ds.raw("indices").dtype.itemsize)
            for pq in pqs:
                base: BudgetPlan | None = None
                for frac in cache_fractions:
                    label = f"topology {topo}" + (f", hot {format_bytes(hot)}" if hot else "") + \
                        (", pq" if pq else "") + (f", cache {frac:.0%}" if frac is not None else "")
                    try:
                        size = None
                        if frac is not None and frac > 0:
                            if base is None:
                                base = plan_with(topo, pq, None, hot)
                            size = int(frac * base.slots * base.slot)
                            if size <= 0:
                                continue
                        plan = plan_with(topo, pq, size, hot)
                        if frac is not None and frac == 0:
                            base = plan
                    except ValueError as err:
                        tried.append((label, None, str(err)))
                        if hot == 0 or last_err is None:  # raised: the smallest footprint's reason
                            # without its traceback, whose frames (this one) would hold the
                            # degrees and hot-list scores in a cycle past the return
                            last_err = err.with_traceback(None)
                        continue
                    whole = plan.slots >= plan.num_parts
                    key = (plan.num_parts if whole else plan.state_slots, plan.group,
                           plan.num_parts if whole else plan.slots)
                    if cfg.mode == "exact":
                        key = (plan.num_parts if whole else 0, 1, min(plan.slots, plan.num_parts))
                    if key not in stats:
                        stats[key] = _probe_states(cfg, ds, probe, offsets, *key, classes)
                    cost = _epoch_cost(cfg, ds, stats[key], plan, topo, pq, degrees, probe, offsets,
                                       bits, hot)
                    tried.append((label, cost, ""))
                    d = stats[key].class_distance
                    mix = None if d is None or iid is None else (d, iid)
                    fitted.append(SplitChoice(topo, pq, size, plan, cost, hot_topology=hot,
                                              hot_bits=bits, class_mix=mix))
    finally:
        if own:
            probe.close()
        del degrees, scores  # N-sized: not held by anything the caller keeps
    if not fitted:
        assert last_err is not None
        raise last_err
    best = _keep(fitted)
    del fitted  # the other splits' hot-list bitmaps
    best.candidates = tried
    best.probe_s = time.perf_counter() - t0
    for lab, c, why in tried:
        log.debug("split %s: %s", lab, why or f"{format_bytes(int(c.bytes))}, {int(c.requests):,} "
                  f"requests, {c.seconds:.2f} s")
    if best.class_mix is not None:
        log.debug("batches' label mix of the kept split: %.3f from the training set's (i.i.d. %.3f)",
                  *best.class_mix)
    return best
