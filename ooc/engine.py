"""The out-of-core engine: a byte budget, the buffer manager and the three training modes.

``build_data_path(cfg, ds)`` turns a :class:`~ooc.config.TrainConfig` into a :class:`DataPath` the
training loop drives (``plan``, ``iterate``, ``epoch_stats``); evaluation always samples the full
graph through ``DataPath.loader.make_batch``.

Modes (``--mode``):

- ``exact`` -- full-graph neighbour sampling, batches a uniform shuffle of the training nodes (what
  an in-memory trainer does).  Feature rows come from resident partitions when everything fits,
  otherwise from a CPU feature cache (SIEVE/CLOCK/LRU, :mod:`ooc.features.cache`) in front of batched disk
  reads (:class:`~ooc.storage.io.DiskRows`).  Memory never changes results: the same seed gives the
  identical loss sequence for any budget (Ginex / GraphBolt style).
- ``buffer`` -- MariusGNN style: an ordering policy (:mod:`ooc.data.ordering`) makes ``c`` partitions
  resident at a time; every training node is trained once per epoch in a state that holds its
  partition, and neighbours are sampled from the resident partitions only (the in-buffer subgraph,
  whose degrees GCN uses).  Only sequential partition loads, no random reads.
- ``hybrid`` -- batches from the seeds of the resident partitions (as ``buffer``) but full-graph
  sampling (as ``exact``): with a locality-preserving partition (``ooc partition --method metis``)
  most sampled neighbours are resident; the rest come through the cache or a batched read.

Budget (``--memory-budget``): resident topology + node arrays (labels, degrees, split ids) +
batches in flight (estimated from batch size and fanouts) + partition slots + cache must fit; the
plan is in ``metrics.json`` under ``budget``.  The runtime itself (interpreter, torch, Numba, model
and autograd workspace) is the stated fixed overhead on top (``rss_baseline_bytes``).
"""

from __future__ import annotations

import logging
import time
from contextlib import closing
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch
from numba import njit

from ooc.data.budget import RssMonitor, release_free_memory
from ooc.util.sizes import format_bytes, parse_bytes
from ooc.buffer import BufferStats, PartitionBuffer, contiguous_partitions
from ooc.features.cache import POLICIES, CachedFeature, cpu_cached_feature
from ooc.storage.io import ALIGN, DiskRows, NeighborReader, aligned_empty
from ooc.kernels.disk_sampling import sample_blocks_lists
from ooc.kernels.rng import batch_key
from ooc.kernels.sampling import sample_blocks, workspace_bytes
from ooc.loader import Batch, prefetched
from ooc.models import to_torch_blocks
from ooc.data.ordering import ORDERINGS, count_swaps, node_states, node_swap_lower_bound
from ooc.storage.dataset import Dataset

if TYPE_CHECKING:  # pragma: no cover
    from ooc.features.pq import CompressedRows

__all__ = ["MODES", "warm_up_runtime", "BudgetPlan", "plan_budget", "BufferManager", "EngineStats", "EnginePlan",
           "EngineLoader", "DataPath", "build_data_path", "validate_engine_options"]

log = logging.getLogger("ooc.engine")

MODES = ("exact", "buffer", "hybrid")


def _align_up(n: int, a: int = ALIGN) -> int:
    return -(-int(n) // a) * a


def validate_engine_options(cfg) -> None:
    """Check the engine fields of a TrainConfig (mode, budget, ordering, cache, topology).

    Raises:
        ValueError: naming the option.
    """
    if cfg.mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {cfg.mode!r}")
    if cfg.ordering not in ORDERINGS:
        raise ValueError(f"ordering must be one of {', '.join(ORDERINGS)}, got {cfg.ordering!r}")
    if cfg.cache_policy not in (*POLICIES, "none"):
        raise ValueError(f"cache policy must be one of {', '.join(POLICIES)} or none, got "
                         f"{cfg.cache_policy!r}")
    if cfg.memory_budget:
        parse_bytes(cfg.memory_budget)
    if cfg.cache_size:
        parse_bytes(cfg.cache_size)
    if cfg.topology not in ("memory", "mmap", "disk"):
        raise ValueError(f"topology must be memory, mmap or disk, got {cfg.topology!r}")
    miss = getattr(cfg, "miss_features", "disk")
    if miss not in ("disk", "pq"):
        raise ValueError(f"miss_features must be disk or pq, got {miss!r}")
    if miss == "pq" and cfg.mode != "hybrid":
        raise ValueError(f"--miss-features pq applies to --mode hybrid only (got --mode {cfg.mode}: "
                         "exact reads exact rows, buffer has no misses)")


# ------------------------------------------------------------------------------------------ budget
@dataclass
class BudgetPlan:
    """How a byte budget is spent (all in bytes).

    Attributes:
        budget: the budget (None: no budget, sizes from ``--buffer-partitions`` / ``--cache-size``).
        topology: resident topology (indptr, indices when in memory, degrees).
        node_arrays: labels and split ids.
        staging: batches in flight (estimate: prefetch + 2 batches of input rows in the storage
            dtype and sampled edges, plus the float32 copy and activations of the one in training).
        slot: bytes of one partition slot (features, plus in-edges in buffer mode).
        slots: partition slots; state_slots: partitions resident per buffer state (the rest hold
            prefetched partitions, double buffering).
        cache: feature cache bytes; cache_rows: its capacity in rows.
        group: COMET logical partition size.
        scratch: buffers kept between batches: the sampler's per-thread workspace (training and
            evaluation threads).
        compressed: PQ codes and centroids of every node (``--miss-features pq``).
    """

    budget: int | None
    topology: int
    node_arrays: int
    staging: int
    slot: int
    slots: int
    state_slots: int
    cache: int
    cache_rows: int
    group: int
    num_parts: int
    scratch: int = 0
    compressed: int = 0

    @property
    def planned(self) -> int:
        return (self.topology + self.node_arrays + self.staging + self.scratch + self.compressed
                + self.slot * self.slots + self.cache)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["planned"] = self.planned
        return d


def _staging_bytes(n: int, avg_deg: float, row_bytes: int, feat_dim: int, batch_size: int,
                   fanouts: list[int], prefetch: int, hidden: int, eval_batch_size: int = 0,
                   eval_fanouts: list[int] | None = None) -> int:
    """Bytes of batches in flight: ``prefetch + 2`` training batches (queued, being built, being
    trained) holding their rows in the storage dtype, plus the float32 copy and activations of the
    one being trained; or the same for two evaluation batches (``eval_fanouts``; ``None``: full
    neighbourhoods), whichever is larger."""
    def need(bs: int, fo: list[int], alive: int) -> int:
        rows, edges = _batch_extent(n, avg_deg, bs, fo)
        queued = rows * (row_bytes + 24) + edges * 40  # rows, ids / labels, MFG arrays
        return alive * queued + rows * (4 * feat_dim + 4 * hidden)

    train = need(batch_size, fanouts, max(prefetch, 0) + 2)
    ev = need(eval_batch_size, list(eval_fanouts) if eval_fanouts else [-1] * len(fanouts), 2)
    return int(max(train, ev))


def _batch_extent(n: int, avg_deg: float, batch_size: int, fanouts: list[int]) -> tuple[int, int]:
    """Upper estimate of one batch's ``(input rows, sampled edges)`` (no deduplication)."""
    rows = batch_size
    edges = 0
    for f in fanouts:
        eff = f if f > 0 else max(avg_deg, 1.0)
        edges += min(rows * eff, n * max(avg_deg, 1.0))
        rows = min(n, rows * (1 + eff))
    return int(rows), int(edges)


def plan_budget(mode: str, budget: int | None, ds: Dataset, offsets: np.ndarray, topology: str,
                batch_size: int, fanouts: list[int], prefetch: int, hidden: int,
                buffer_partitions: int, cache_size: int | None, cache_policy: str,
                ordering: str, eval_batch_size: int = 0,
                eval_fanouts: list[int] | None = None, compressed: int = 0) -> BudgetPlan:
    """Split ``budget`` between topology, node arrays, staging, sampler scratch, compressed rows
    (``compressed`` bytes of PQ codes, see :mod:`ooc.features.pq`), partition slots and the cache.

    Raises:
        ValueError: the budget cannot hold the fixed parts plus the minimum the mode needs (one
            partition slot for ``buffer``/``hybrid``), naming the sizes.
    """
    n, e = ds.num_nodes, ds.num_edges
    feats = ds.features
    row_bytes = feats.row_bytes
    idx_item = ds.raw("indices").dtype.itemsize
    num_parts = offsets.shape[0] - 1
    sizes = np.diff(offsets)
    indptr = ds.indptr
    part_edges = indptr[offsets[1:]] - indptr[offsets[:-1]]
    topo = 8 * (n + 1) + 8 * n  # indptr + degrees
    if topology in ("memory", "mmap"):
        topo += e * idx_item
    nodes = 4 * n + 8 * sum(ds.split(s).shape[0] for s in ("train", "valid", "test"))
    stage = _staging_bytes(n, e / max(n, 1), row_bytes, ds.feat_dim, batch_size, fanouts, prefetch,
                           hidden, eval_batch_size, eval_fanouts)
    # sampler workspaces of the loader and evaluation threads (N-sized for small graphs); the
    # miss reads' request staging (at most (io_depth + 8) x MISS_RUN_BYTES, 5 MiB by default) is
    # a fixed cost, part of the stated runtime overhead
    scratch = 2 * workspace_bytes(n)
    slot = _align_up(int(sizes.max()) * row_bytes) + 2 * ALIGN
    if mode == "buffer":  # in-edges of the partition (raw + local CSC) travel with it
        slot += _align_up(int(part_edges.max()) * idx_item) + 2 * ALIGN
        slot += 8 * int(part_edges.max()) + 24 * (int(sizes.max()) + 1)
    per_row = CachedFeature.bytes_per_row(row_bytes)
    if budget is None:
        slots = min(buffer_partitions, num_parts)
        cache = cache_size or 0
    else:
        avail = budget - topo - nodes - stage - scratch - compressed
        need = slot if mode != "exact" else 0
        if avail < need:
            raise ValueError(
                f"memory budget {format_bytes(budget)} too small: topology {format_bytes(topo)}, "
                f"node arrays {format_bytes(nodes)}, batches in flight {format_bytes(stage)}, "
                f"sampler scratch {format_bytes(scratch)}"
                + (f", PQ codes {format_bytes(compressed)}" if compressed else "")
                + (f", one partition slot {format_bytes(slot)}" if need else "")
                + " (use more partitions, --topology disk, a smaller batch or a larger budget"
                + ("; or --miss-features disk / fewer `ooc compress --subspaces`" if compressed
                   else "") + ")")
        if mode == "exact":
            if num_parts * slot <= avail and not cache_size:
                slots, cache = num_parts, 0
            else:
                slots, cache = 0, min(avail, cache_size) if cache_size else avail
        else:
            cache = 0
            if mode == "hybrid" and cache_policy != "none":
                cache = min(cache_size, avail - slot) if cache_size else 0
            slots = min(num_parts + max(1, num_parts // 3), (avail - cache) // slot)
            if slots >= num_parts:
                slots = num_parts
                if mode == "hybrid" and not cache_size:
                    cache = 0
    if cache_policy == "none":
        cache = 0
    cache_rows = cache // per_row
    group = 1
    if slots >= num_parts:
        state = num_parts
    elif mode == "exact":
        state = slots
    elif slots <= 1:
        state = max(slots, 1)
    elif ordering == "comet":
        group = max(1, slots // 3)
        # whole logical partitions per state (comet_states rounds down); the rest prefetch
        state = max(group, (slots - group) // group * group)
    else:
        state = slots - 1
    return BudgetPlan(budget, int(topo), int(nodes), int(stage), int(slot), int(slots), int(state),
                      int(cache), int(cache_rows), int(group), num_parts, int(scratch),
                      int(compressed))


# ------------------------------------------------------------------------------------------ buffer
@dataclass
class EngineStats(BufferStats):
    """Per-epoch counters of the buffer manager (see :class:`~ooc.buffer.BufferStats`) plus
    ``swaps`` (loads that replaced a resident partition) and ``topology_bytes`` read for neighbour
    lists."""

    swaps: int = 0
    topology_bytes: int = 0
    #: rows of training batches decoded from PQ codes instead of read (``--miss-features pq``)
    approx_rows: int = 0

    def as_dict(self) -> dict:
        d = super().as_dict()
        d.update(swaps=self.swaps, topology_bytes_read=self.topology_bytes,
                 approx_rows=self.approx_rows,
                 load_bandwidth_Bps=(self.bytes_read_loads / self.load_s) if self.load_s else 0.0)
        return d

    bytes_read_loads: int = 0


_WORD = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}


@njit(cache=True, nogil=True)
def _gather_slots(ids: np.ndarray, offsets: np.ndarray, slot_of: np.ndarray, shift: np.ndarray,
                  slot_alloc: int, row_bytes: int, mem: np.ndarray, out: np.ndarray,
                  miss: np.ndarray) -> int:
    """Copy rows of resident partitions (word-addressed slots with per-slot shifts, all in words of
    ``mem``'s dtype); flag misses."""
    hits = 0
    for i in range(ids.shape[0]):
        v = ids[i]
        p = np.searchsorted(offsets, v, side="right") - 1
        s = slot_of[p]
        if s >= 0:
            a = s * slot_alloc + shift[s] + (v - offsets[p]) * row_bytes
            out[i, :] = mem[a:a + row_bytes]
            miss[i] = False
            hits += 1
        else:
            miss[i] = True
    return hits


@njit(cache=True, nogil=True)
def _gather_local(local: np.ndarray, slot_rows: int, shift: np.ndarray, slot_alloc: int,
                  row_bytes: int, mem: np.ndarray, out: np.ndarray) -> None:
    for i in range(local.shape[0]):
        s = local[i] // slot_rows
        r = local[i] - s * slot_rows
        a = s * slot_alloc + shift[s] + r * row_bytes
        out[i, :] = mem[a:a + row_bytes]


class BufferManager(PartitionBuffer):
    """Partition slots in aligned host memory, loaded with large (optionally O_DIRECT) reads.

    The eviction / prefetch logic is :class:`~ooc.buffer.PartitionBuffer`'s (Belady on the known
    schedule, loads on I/O threads while the current partitions train); this class owns the memory
    (``capacity`` slots of ``slot_alloc`` bytes, 4 KiB aligned, rows starting ``shift[slot]`` bytes
    in so that O_DIRECT reads land in place), reads through :class:`~ooc.storage.io.DiskRows`, optionally
    loads each partition's in-edges with it, and sends rows of non-resident partitions to
    ``fallback`` (a cache or the disk reader).

    Args:
        rows: reader of the feature array [N, D].
        offsets: int64 [P+1] partition boundaries.
        capacity: slots (0 = nothing resident; every row goes to ``fallback``).
        fallback: ``gather(ids) -> (rows, bytes_read)`` for misses.
        io_threads: background loaders (0 = synchronous).
        topo_rows: reader of ``topology/indices`` to load in-edges with each partition, and
            indptr: int64 [N+1] (required with ``topo_rows``).

    Raises:
        ValueError: bad offsets or capacity.
    """

    def __init__(self, rows: DiskRows, offsets: np.ndarray, capacity: int, fallback,
                 io_threads: int = 1, topo_rows: DiskRows | None = None,
                 indptr: np.ndarray | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor
        self.features = rows
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.num_parts = self.offsets.shape[0] - 1
        if self.num_parts < 1 or self.offsets[0] != 0 or self.offsets[-1] != rows.shape[0]:
            raise ValueError("partition offsets must run from 0 to the number of nodes")
        if not 0 <= capacity <= self.num_parts:
            raise ValueError(f"buffer capacity {capacity} outside [0, {self.num_parts}]")
        self.capacity = capacity
        self.fallback = fallback
        sizes = np.diff(self.offsets)
        self.slot_rows = int(sizes.max())
        self.row_bytes = rows.row_bytes
        self.slot_alloc = _align_up(self.slot_rows * self.row_bytes) + 2 * ALIGN
        self.mem = aligned_empty(capacity * self.slot_alloc)
        # copy rows as 8/4/2-byte words when the row size allows (shifts and slots are multiples)
        self._word = next(w for w in (8, 4, 2, 1) if self.row_bytes % w == 0)
        self.shift = np.zeros(max(capacity, 1), dtype=np.int64)
        self.topo_rows = topo_rows
        self.indptr = indptr
        if topo_rows is not None:
            if indptr is None:
                raise ValueError("loading in-edges with partitions needs indptr")
            pe = indptr[self.offsets[1:]] - indptr[self.offsets[:-1]]
            self.edge_slot_alloc = _align_up(int(pe.max()) * topo_rows.row_bytes) + 2 * ALIGN
            self.tmem = aligned_empty(capacity * self.edge_slot_alloc)
            self.tshift = np.zeros(max(capacity, 1), dtype=np.int64)
        self.slot_of = np.full(self.num_parts, -1, dtype=np.int64)
        self.part_in_slot = [-1] * capacity
        self._loading: dict = {}
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="ooc-io") if io_threads else None
        self.stats = EngineStats()

    @property
    def nbytes(self) -> int:
        """Slot memory (features and in-edges)."""
        return int(self.mem.nbytes + (self.tmem.nbytes if self.topo_rows is not None else 0))

    def reset_stats(self) -> EngineStats:
        old, self.stats = self.stats, EngineStats()
        return old

    def _load_into(self, p: int, slot: int) -> tuple[int, float]:
        a, b = int(self.offsets[p]), int(self.offsets[p + 1])
        t = time.perf_counter()
        base = slot * self.slot_alloc
        # features and in-edges are requested together (several requests of each in flight)
        reads = [self.features.read_range_async(a, b, self.mem[base:base + self.slot_alloc])]
        self.shift[slot] = self.features.span(a, b)[2]
        if self.topo_rows is not None:
            ea, eb = int(self.indptr[a]), int(self.indptr[b])
            tb = slot * self.edge_slot_alloc
            reads.append(self.topo_rows.read_range_async(ea, eb,
                                                         self.tmem[tb:tb + self.edge_slot_alloc]))
            self.tshift[slot] = self.topo_rows.span(ea, eb)[2]
        nbytes = sum(r.wait() for r in reads)
        return nbytes, time.perf_counter() - t

    def _settle(self, p: int, wait: bool) -> bool:
        before = self.stats.bytes_read
        done = super()._settle(p, wait)
        self.stats.bytes_read_loads += self.stats.bytes_read - before
        return done

    def _start(self, p: int, slot: int, sync: bool) -> None:
        if self.part_in_slot[slot] >= 0:
            self.stats.swaps += 1
        before = self.stats.bytes_read
        super()._start(p, slot, sync)
        self.stats.bytes_read_loads += self.stats.bytes_read - before

    def in_edges(self, slot: int) -> np.ndarray:
        """The in-edge sources (indices dtype) of the partition resident in ``slot``."""
        p = self.part_in_slot[slot]
        a, b = int(self.offsets[p]), int(self.offsets[p + 1])
        m = int(self.indptr[b] - self.indptr[a])
        base = slot * self.edge_slot_alloc + int(self.tshift[slot])
        return self.tmem[base:base + m * self.topo_rows.row_bytes].view(self.topo_rows.dtype)

    def gather(self, ids: np.ndarray, approx: CompressedRows | None = None,
               approx_from: int = 0) -> np.ndarray:
        """Rows ``features[ids]``: resident partitions first, the rest from ``fallback``; with
        ``approx`` (a :class:`~ooc.features.pq.CompressedRows`), missing rows at positions ``>=
        approx_from`` are decoded from it instead (counted in ``approx_rows``, no read)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        out = np.empty((n, *self.features.shape[1:]), dtype=self.features.dtype)
        flat = out.reshape(n, -1).view(np.uint8).reshape(n, self.row_bytes)
        miss = np.ones(n, dtype=np.bool_)
        hits = 0
        if self.capacity:
            w = self._word
            hits = _gather_slots(ids, self.offsets, self.slot_of, self.shift // w, self.slot_alloc // w,
                                 self.row_bytes // w, self.mem.view(_WORD[w]),
                                 flat.view(_WORD[w]), miss)
        self.stats.row_hits += int(hits)
        if hits < n:
            pos = np.flatnonzero(miss)
            if approx is not None:
                cut = int(np.searchsorted(pos, approx_from))
                far = pos[cut:]
                if far.shape[0]:
                    out[far] = approx.gather(ids[far])[0]
                    self.stats.approx_rows += int(far.shape[0])
                pos = pos[:cut]
                if not pos.shape[0]:
                    return out
            rows, nbytes = self.fallback.gather(ids[pos])
            out[pos] = rows
            self.stats.row_misses += int(pos.shape[0])
            self.stats.bytes_read += int(nbytes)
        return out

    def gather_local(self, local: np.ndarray) -> np.ndarray:
        """Rows by slot-local id ``slot * slot_rows + row`` (buffer mode; all resident)."""
        local = np.ascontiguousarray(local, dtype=np.int64)
        n = local.shape[0]
        out = np.empty((n, *self.features.shape[1:]), dtype=self.features.dtype)
        flat = out.reshape(n, -1).view(np.uint8).reshape(n, self.row_bytes)
        w = self._word
        _gather_local(local, self.slot_rows, self.shift // w, self.slot_alloc // w, self.row_bytes // w,
                      self.mem.view(_WORD[w]), flat.view(_WORD[w]))
        self.stats.row_hits += n
        return out


# ----------------------------------------------------------------------------- resident subgraph
@njit(cache=True, nogil=True)
def _filter_lists(rel_ptr: np.ndarray, idx: np.ndarray, offsets: np.ndarray, part_slot: np.ndarray,
                  slot_rows: int, deg: np.ndarray, row0: int, out: np.ndarray, pos: int) -> int:
    """Keep in-neighbours whose partition is in the state (``part_slot[q] >= 0``: its block), as
    local ids ``block * slot_rows + row``; returns the new ``pos``."""
    for r in range(rel_ptr.shape[0] - 1):
        c = 0
        for j in range(rel_ptr[r], rel_ptr[r + 1]):
            u = idx[j]
            q = np.searchsorted(offsets, u, side="right") - 1
            s = part_slot[q]
            if s >= 0:
                out[pos] = s * slot_rows + (u - offsets[q])
                pos += 1
                c += 1
        deg[row0 + r] = c
    return pos


class ResidentGraph:
    """The subgraph induced by the resident partitions of a state, in state-local ids (buffer mode).

    Local id ``b * slot_rows + r`` is row ``r`` of the ``b``-th partition of the state (partitions in
    ascending order), so local ids -- and the counter-based samples keyed by them -- do not depend on
    which slot a partition landed in (a resumed run samples the same batches).  The CSC keeps only
    in-edges whose source is resident (MariusGNN's in-buffer sampling).
    """

    def __init__(self, buffer: BufferManager, indptr: np.ndarray, indices: np.ndarray | None) -> None:
        self.buffer = buffer
        self.indptr_global = indptr
        self.indices_global = indices
        self.key: tuple | None = None
        self.indptr = np.zeros(1, dtype=np.int64)
        self.indices = np.empty(0, dtype=np.int64)
        self.degrees = np.zeros(0, dtype=np.int64)
        self.local_to_global = np.empty(0, dtype=np.int64)
        self.block_slot = np.empty(0, dtype=np.int64)

    def build(self, parts: list[int], key: tuple) -> None:
        """Rebuild for the state holding ``parts`` (all resident)."""
        if key == self.key:
            return
        b = self.buffer
        order = sorted(int(p) for p in parts)
        part_block = np.full(b.num_parts, -1, dtype=np.int64)
        for i, p in enumerate(order):
            part_block[p] = i
        total_rows = len(order) * b.slot_rows
        deg = np.zeros(total_rows, dtype=np.int64)
        l2g = np.full(total_rows, -1, dtype=np.int64)
        m = 0
        for p in order:
            a, z = int(b.offsets[p]), int(b.offsets[p + 1])
            m += int(self.indptr_global[z] - self.indptr_global[a])
        out = np.empty(m, dtype=np.int64)
        pos = 0
        for i, p in enumerate(order):
            a, z = int(b.offsets[p]), int(b.offsets[p + 1])
            ip = self.indptr_global[a:z + 1]
            rel = ip - ip[0]
            if self.indices_global is not None:
                idx = self.indices_global[int(ip[0]):int(ip[-1])]
            else:
                idx = b.in_edges(int(b.slot_of[p]))
            pos = _filter_lists(rel, idx, b.offsets, part_block, b.slot_rows, deg, i * b.slot_rows,
                                out, pos)
            l2g[i * b.slot_rows:i * b.slot_rows + (z - a)] = np.arange(a, z, dtype=np.int64)
        self.indptr = np.zeros(total_rows + 1, dtype=np.int64)
        np.cumsum(deg, out=self.indptr[1:])
        self.indices = out[:pos]
        self.degrees = deg
        self.local_to_global = l2g
        self.part_block = part_block
        self.block_slot = np.array([b.slot_of[p] for p in order], dtype=np.int64)
        self.key = key

    def to_local(self, ids: np.ndarray) -> np.ndarray:
        """State-local ids of global ``ids`` (all in the state's partitions)."""
        b = self.buffer
        p = np.searchsorted(b.offsets, ids, side="right") - 1
        blk = self.part_block[p]
        if (blk < 0).any():
            raise ValueError("seed outside the resident partitions")
        return blk * b.slot_rows + (ids - b.offsets[p])

    def to_slot_local(self, local: np.ndarray) -> np.ndarray:
        """Slot-local ids (``slot * slot_rows + row``, for :meth:`BufferManager.gather_local`)."""
        sr = self.buffer.slot_rows
        return self.block_slot[local // sr] * sr + local % sr


# ------------------------------------------------------------------------------------------ plans
@dataclass
class EnginePlan:
    """One epoch: batches (global seed ids) and, in buffer/hybrid mode, the buffer states.

    ``batch_state[i]`` indexes ``states`` (``-1``: no state, exact mode); ``upcoming[k]`` lists the
    partitions that states after ``k`` load, in order (prefetch targets).  The plan is a pure
    function of (seed, epoch, mode, partitions, state size, ordering), so a run resumed at batch ``i``
    rebuilds it and loads only what batch ``i`` needs.
    """

    batches: list[np.ndarray]
    batch_state: list[int]
    states: list[list[int]] = field(default_factory=list)
    upcoming: list[list[int]] = field(default_factory=list)

    @property
    def swaps(self) -> int:
        return count_swaps(self.states)


def plan_exact(train_ids: np.ndarray, batch_size: int, seed: int, epoch: int) -> EnginePlan:
    """Uniformly shuffled batches over all training nodes (the in-memory reference)."""
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    s = train_ids[rng.permutation(train_ids.shape[0])]
    batches = [s[i:i + batch_size] for i in range(0, s.shape[0], batch_size)]
    return EnginePlan(batches, [-1] * len(batches))


def plan_states(train_ids: np.ndarray, part_of: np.ndarray, num_parts: int, state_slots: int,
                batch_size: int, seed: int, epoch: int, ordering: str, group: int,
                start: list[int] | None = None, mix: float = 0.0) -> EnginePlan:
    """Buffer-state plan for ``buffer`` and ``hybrid`` mode.

    States come from the ordering policy (beginning from ``start``, the partitions resident when
    the epoch begins); every training node is assigned to one state holding its partition
    (uniformly among those); the seeds of a state are shuffled together, so every batch mixes
    seeds of all the state's partitions.  Seeds wait in a pool while their partition stays
    resident in the next state, so batches are full (``batch_size``) except where the seeds of a
    leaving partition do not fill one; such a partial batch is packed into the state's other
    batches (near-equal sizes, none over ``batch_size``) while the room left in all batches still
    holds the ``mix`` seeds, so an epoch has about as many batches as :func:`plan_exact`'s.

    Args:
        train_ids: int64 [T] training node ids; part_of: int64 [T] their partitions.
        num_parts: P; state_slots: partitions resident per state (``>= P``: one state holding
            every partition -- the plan is then :func:`plan_exact`'s, batch for batch).
        batch_size, seed, epoch: as in :func:`plan_exact`.
        ordering, group: the ordering policy and COMET's logical partition size.
        start: partitions resident when the epoch begins.
        mix: fraction in ``[0, 1)`` of the training nodes that are not bound to a state but
            spread over all batches (``hybrid`` only: full-graph sampling can train any seed; their
            rows are mostly misses).  Mixing makes batch label distributions closer to i.i.d. at
            the price of reads.  The free seeds are dealt out partition by partition, in a random
            partition order, so each batch's come from a few partitions and their misses coalesce.

    Returns:
        The plan; ``batch_state[i]`` is the state batch ``i`` trains in.

    Raises:
        ValueError: ``mix`` outside ``[0, 1)`` or ``batch_size < 1``.
    """
    if not 0.0 <= mix < 1.0:
        raise ValueError(f"mix must be in [0, 1), got {mix}")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    if state_slots >= num_parts:  # everything resident: exactly the in-memory (exact) batches
        p = plan_exact(train_ids, batch_size, seed, epoch)
        return EnginePlan(p.batches, [0] * len(p.batches), [list(range(num_parts))], [[]])
    rng = np.random.default_rng([seed, epoch, 0xB0FF])
    states = node_states(ordering, num_parts, state_slots, rng, group, start)
    holders: list[list[int]] = [[] for _ in range(num_parts)]
    for k, st in enumerate(states):
        for p in st:
            holders[p].append(k)
    t = train_ids.shape[0]
    free = np.zeros(t, dtype=np.bool_)
    if mix > 0:
        free[rng.permutation(t)[:int(round(mix * t))]] = True
    choice = np.full(t, -1, dtype=np.int64)
    for p in range(num_parts):
        sel = np.flatnonzero((part_of == p) & ~free)
        if sel.size:
            h = np.asarray(holders[p], dtype=np.int64)
            choice[sel] = h[rng.integers(0, h.shape[0], sel.shape[0])]
    # batches drawn from a pool of pending seeds, all of resident partitions: at state k the pool
    # gets the seeds assigned to k; seeds whose partition leaves with the next state train now (a
    # batch they do not fill is topped up with seeds assigned to later states whose partitions are
    # resident now), the others wait while the pool holds less than a batch
    bound = max(1, batch_size - int(round(mix * batch_size)))  # state seeds per batch
    cuts: list[np.ndarray] = []
    batch_state: list[int] = []
    cut_state: list[int] = []  # states that cut batches, and their batches two ways:
    state_cuts: list[list[np.ndarray]] = []   # chunks of `bound` seeds, the last one partial
    packed_cuts: list[list[np.ndarray]] = []  # near-equal, partial chunk folded in
    used = free.copy()
    pool = np.empty(0, dtype=np.int64)
    member = np.zeros(num_parts, dtype=np.bool_)
    for k in range(len(states)):
        new = np.flatnonzero((choice == k) & ~used)
        used[new] = True
        pool = np.concatenate([pool, new])
        if k + 1 < len(states):
            member[:] = False
            member[states[k + 1]] = True
            expiring = ~member[part_of[pool]]
        else:
            expiring = np.ones(pool.shape[0], dtype=np.bool_)
        n_exp = int(expiring.sum())
        m = max(-(-n_exp // bound), pool.shape[0] // bound)
        if m == 0:
            continue
        cut_state.append(k)
        others = np.flatnonzero(~expiring)
        extra = others[rng.permutation(others.shape[0])[:max(m * bound - n_exp, 0)]]
        go = pool[np.concatenate([np.flatnonzero(expiring), extra])]
        left = np.ones(pool.shape[0], dtype=np.bool_)
        left[np.concatenate([np.flatnonzero(expiring), extra])] = False
        pool = pool[left]
        short = m * bound - go.shape[0]
        if short > 0:  # top up from seeds assigned to later states, partitions resident now
            member[:] = False
            member[states[k]] = True
            cand = np.flatnonzero(~used & member[part_of])
            top = cand[rng.permutation(cand.shape[0])[:short]]
            used[top] = True
            go = np.concatenate([go, top])
        go = go[rng.permutation(go.shape[0])]
        state_cuts.append([go[i:i + bound] for i in range(0, go.shape[0], bound)])
        # the same seeds in near-equal batches, a partial one folded into the others while that
        # keeps every batch <= batch_size: fewer, fuller batches
        n_packed = max(-(-go.shape[0] // batch_size), int(round(go.shape[0] / bound)), 1)
        packed_cuts.append(np.array_split(go, n_packed))
    fr = np.flatnonzero(free)
    # a state's batches are packed while the room left in all batches still holds every free seed
    # (so no batch ends up over batch_size); states are taken in order
    room = sum(batch_size - c.shape[0] for cs in state_cuts for c in cs)
    for k, plain, packed in zip(cut_state, state_cuts, packed_cuts):
        cs = plain
        if len(packed) < len(plain) and room - (len(plain) - len(packed)) * batch_size >= fr.size:
            room -= (len(plain) - len(packed)) * batch_size
            cs = packed
        cuts.extend(cs)
        batch_state.extend([k] * len(cs))
    if not cuts:  # every seed free (tiny training sets)
        cuts, batch_state = [np.empty(0, dtype=np.int64)], [0]
    if fr.size:  # free seeds fill every batch up to batch_size (quotas by room, largest remainder)
        # partition by partition in a random order (random within a partition): one batch's free
        # seeds come from a few partitions, so their neighbourhoods' misses cluster in a few
        # partition ranges and coalesce into long reads, instead of one short read per row
        fr = fr[rng.permutation(fr.shape[0])]
        fr = fr[np.argsort(rng.permutation(num_parts)[part_of[fr]], kind="stable")]
        room = np.array([max(batch_size - c.shape[0], 0) for c in cuts], dtype=np.float64)
        if room.sum() <= 0:  # every batch full (a tiny mix): spread over all, a seed or so over
            room[:] = 1.0
        want = room * (fr.shape[0] / room.sum())
        quota = np.floor(want).astype(np.int64)
        rest = fr.shape[0] - int(quota.sum())
        if rest:
            quota[np.argsort(quota - want, kind="stable")[:rest]] += 1
        pos = np.concatenate([[0], np.cumsum(quota)])
        for i in range(len(cuts)):
            c = np.concatenate([cuts[i], fr[pos[i]:pos[i + 1]]])
            cuts[i] = c[rng.permutation(c.shape[0])]
    batches = [train_ids[c] for c in cuts]
    upcoming = []
    for k in range(len(states)):
        seen: list[int] = []
        for st in states[k + 1:]:
            for p in st:
                if p not in states[k] and p not in seen:
                    seen.append(p)
        upcoming.append(seen)
    return EnginePlan(batches, batch_state, states, upcoming)


# ------------------------------------------------------------------------------------------ loader
class GlobalSampler:
    """Full-graph sampling over an in-memory/mapped CSC or, with ``reader``, lists read from disk."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray | None,
                 reader: NeighborReader | None = None) -> None:
        self.indptr = indptr
        self.indices = indices
        self.reader = reader

    def sample(self, seeds: np.ndarray, fanouts: list[int], key: np.uint64, replace: bool):
        if self.reader is None:
            return sample_blocks(self.indptr, self.indices, seeds, fanouts, key, replace)
        return sample_blocks_lists(self.reader.read, self.indptr.shape[0] - 1, seeds, fanouts, key,
                                   replace)


class EngineLoader:
    """Builds batches for every mode on a background thread (``prefetch`` ahead).

    ``make_batch`` without a state samples the full graph (exact; used for evaluation too).
    """

    def __init__(self, mode: str, sampler: GlobalSampler, buffer: BufferManager, degrees: np.ndarray,
                 labels: np.ndarray, fanouts: list[int], seed: int, replace: bool = False,
                 prefetch: int = 2, feat_norm: str = "none",
                 resident: ResidentGraph | None = None,
                 approx: CompressedRows | None = None) -> None:
        self.mode = mode
        self.approx = approx  # CompressedRows for training batches' misses (None: exact rows)
        self.sampler = sampler
        self.buffer = buffer
        self.degrees = degrees
        self.labels = labels
        self.fanouts = list(fanouts)
        self.seed = seed
        self.replace = replace
        self.prefetch = prefetch
        self.feat_norm = feat_norm
        self.resident = resident
        self.stall_s = 0.0
        self.position = (0, 0)  # (epoch, next batch index): what a checkpoint needs

    def _tensor(self, rows: np.ndarray, native: bool = False) -> torch.Tensor:
        """``rows`` as a tensor: float32, row-normalised with ``feat_norm='row'``; with ``native``
        and no normalisation, the storage dtype (a float16 store gives half the bytes; the
        consumer converts with ``.float()`` at use, see :func:`ooc.train._to_device`)."""
        x = torch.from_numpy(rows)
        if native and self.feat_norm != "row" and x.is_floating_point():
            return x
        x = x.float()
        if self.feat_norm == "row":
            s = x.sum(1, keepdim=True)
            x = x / torch.where(s == 0, torch.ones_like(s), s)
        return x

    def features(self, ids: np.ndarray) -> torch.Tensor:
        """Feature rows of global ``ids`` (resident partitions, then cache/disk) as float32
        ``[len(ids), F]``, normalised as in training."""
        return self._tensor(self.buffer.gather(ids))

    def make_batch(self, index: int, seeds: np.ndarray, epoch: int, fanouts: list[int] | None = None,
                   state: int = -1, **_: object) -> Batch:
        """Sample and gather one batch in the calling thread (``state >= 0``: buffer-mode state)."""
        t0 = time.perf_counter()
        key = batch_key(self.seed, epoch, index)
        fo = fanouts or self.fanouts
        if state >= 0 and self.resident is not None:
            rg = self.resident
            sg = sample_blocks(rg.indptr, rg.indices, rg.to_local(seeds), fo, key, self.replace)
            blocks = to_torch_blocks(sg, rg.degrees)
            t1 = time.perf_counter()
            x = self._tensor(self.buffer.gather_local(rg.to_slot_local(sg.input_nodes)), native=True)
            gseeds = rg.local_to_global[sg.seeds]
            nedges = sg.num_sampled_edges
        else:
            sg = self.sampler.sample(seeds, fo, key, self.replace)
            blocks = to_torch_blocks(sg, self.degrees)
            t1 = time.perf_counter()
            # training batches (a buffer state) may decode the misses of the outermost hop -- rows
            # that only enter the first layer as neighbours -- from PQ codes; seeds and inner hops
            # (and evaluation) stay exact
            if self.approx is not None and state >= 0:
                x = self._tensor(self.buffer.gather(sg.input_nodes, self.approx,
                                                    sg.blocks[0].num_dst), native=True)
            else:
                x = self._tensor(self.buffer.gather(sg.input_nodes), native=True)
            gseeds = sg.seeds
            nedges = sg.num_sampled_edges
        y = torch.from_numpy(self.labels[gseeds].astype(np.int64))
        t2 = time.perf_counter()
        return Batch(index, gseeds, blocks, x, y, nedges, t1 - t0, t2 - t1)

    def _build(self, plan: EnginePlan, i: int, epoch: int) -> Batch:
        k = plan.batch_state[i]
        if k >= 0:
            parts = plan.states[k]
            self.buffer.require(parts, plan.upcoming[k][: max(self.buffer.capacity, 1)])
            if self.resident is not None:
                self.resident.build(parts, (epoch, k, tuple(parts)))
        return self.make_batch(i, plan.batches[i], epoch, state=k)

    def iterate(self, plan: EnginePlan, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Yield batches ``start..`` of ``plan`` in order (``start > 0`` resumes mid-epoch)."""
        with closing(prefetched(lambda i: self._build(plan, i, epoch), start, len(plan.batches),
                                self.prefetch, self._add_stall)) as it:
            for b in it:
                self.position = (epoch, b.index + 1)
                yield b

    def _add_stall(self, seconds: float) -> None:
        self.stall_s += seconds


# ------------------------------------------------------------------------------------------ warm-up
def warm_up_runtime(model: str = "sage", num_layers: int = 2) -> RssMonitor:
    """Load every kernel and run one tiny training step, then measure the RSS baseline.

    The baseline is the runtime's fixed overhead -- interpreter, torch (autograd engine, optimiser
    modules, thread pools), Numba's compiled code -- which exists before any data does; the memory
    budget covers everything allocated after it.
    """
    from ooc.data.budget import tune_allocator
    from ooc.models import build_model
    tune_allocator()
    ip, ix = np.array([0, 1, 2, 2], dtype=np.int64), np.array([1, 0], dtype=np.int32)
    sg = sample_blocks(ip, ix, np.array([0]), [2] * num_layers, np.uint64(1))
    sample_blocks_lists(lambda v: (np.concatenate([[0], np.cumsum(ip[v + 1] - ip[v])]),
                                   np.concatenate([ix[ip[u]:ip[u + 1]] for u in v])),
                        3, np.array([0]), [2] * num_layers, np.uint64(1))
    blocks = to_torch_blocks(sg, np.diff(ip))
    net = build_model(model, 4, 4, 2, num_layers, 0.0)
    opt = torch.optim.Adam(net.parameters(), lr=0.0)
    loss = torch.nn.functional.cross_entropy(net(blocks, torch.zeros(sg.input_nodes.shape[0], 4)),
                                             torch.zeros(1, dtype=torch.int64))
    loss.backward()
    opt.step()
    c = CachedFeature(_TinyRows(), 2, "sieve")
    c.gather(np.array([0, 1, 2]))
    for pol in ("clock", "lru"):
        CachedFeature(_TinyRows(), 2, pol).gather(np.array([0, 1, 2]))
    mem = aligned_empty(2 * ALIGN)
    for w, t in _WORD.items():
        _gather_slots(np.array([0]), np.array([0, 1], dtype=np.int64), np.array([0], dtype=np.int64),
                      np.zeros(1, dtype=np.int64), ALIGN // w, 1, mem.view(t),
                      np.empty((1, 1), t), np.empty(1, np.bool_))
        _gather_local(np.array([0]), 1, np.zeros(1, dtype=np.int64), ALIGN // w, 1, mem.view(t),
                      np.empty((1, 1), t))
    return RssMonitor()


class _TinyRows:
    shape, dtype = (4, 2), np.dtype(np.float32)

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        return np.zeros((ids.shape[0], 2), np.float32), 0


# ------------------------------------------------------------------------------------------ facade
class DataPath:
    """What the training loop needs from the engine, for any mode.

    Attributes:
        loader: the :class:`EngineLoader` (``make_batch`` for evaluation).
        buffer: the :class:`BufferManager`; cache: the :class:`~ooc.features.cache.CachedFeature` or None.
        budget: the :class:`BudgetPlan`.
    """

    def __init__(self, cfg, ds: Dataset, offsets: np.ndarray, budget: BudgetPlan,
                 buffer: BufferManager, cache: CachedFeature | None, loader: EngineLoader,
                 readers: list, train_ids: np.ndarray, rss: RssMonitor) -> None:
        self.cfg = cfg
        self.ds = ds
        self.offsets = offsets
        # the fields of the issue-6 loop's DataPath (ooc.train), so either loop can drive this one
        self.indptr = loader.sampler.indptr
        self.indices = loader.sampler.indices  # None with --topology disk
        self.degrees = loader.degrees
        self.budget = budget
        self.buffer = buffer
        self.cache = cache
        self.loader = loader
        self.readers = readers
        self.train_ids = train_ids
        self.part_of_train = np.searchsorted(offsets, train_ids, side="right") - 1
        self.rss = rss
        self.totals = {"bytes_read": 0, "row_hits": 0, "row_misses": 0, "cache_hits": 0,
                       "cache_misses": 0, "swaps": 0}
        self._last_swaps_lb = 0
        if cfg.mode == "exact" and buffer.capacity:
            buffer.require(list(range(buffer.capacity)), [])  # static residency

    def plan(self, epoch: int) -> EnginePlan:
        """The batches of ``epoch`` (deterministic in seed and epoch: each epoch's states begin
        with the previous epoch's last state, so plans are computed in order and memoised)."""
        c = self.cfg
        if c.mode == "exact":
            return plan_exact(self.train_ids, c.batch_size, c.seed, epoch)
        if not hasattr(self, "_plans"):
            self._plans: dict[int, EnginePlan] = {}
        for e in range(epoch + 1):
            if e in self._plans:
                continue
            start = self._plans[e - 1].states[-1] if e > 0 else None
            self._plans[e] = plan_states(self.train_ids, self.part_of_train, self.budget.num_parts,
                                         self.budget.state_slots, c.batch_size, c.seed, e,
                                         c.ordering, self.budget.group, start,
                                         mix=c.hybrid_mix if c.mode == "hybrid" else 0.0)
            self._plans.pop(e - 2, None)
        return self._plans[epoch]

    def iterate(self, plan: EnginePlan, epoch: int, start: int = 0) -> Iterator[Batch]:
        self.loader.stall_s = 0.0
        self._plan = plan
        return self.loader.iterate(plan, epoch, start)

    def postfix(self) -> dict:
        """Short live figures for the progress bar."""
        st = self.buffer.stats
        d = {"hit": f"{st.hit_ratio:.3f}", "read": format_bytes(st.bytes_read).replace(" ", "")}
        if self.cache is not None and self.cache.capacity:
            d["cache"] = f"{self.cache.stats.hit_ratio:.3f}"
        if self.cfg.mode != "exact":
            d["swaps"] = st.swaps
        return d

    def epoch_stats(self) -> dict:
        """Counters since the last call (then reset): bytes read, swaps (and lower bound), hit
        ratios of buffer and cache, I/O wait, loader stall, peak RSS."""
        self.buffer.drain()
        d = self.buffer.reset_stats().as_dict()
        d.update(self.extra_stats(d["bytes_read"]))
        for k in ("bytes_read", "row_hits", "row_misses", "cache_hits", "cache_misses", "swaps"):
            self.totals[k] += int(d.get(k, 0))
        return d

    def extra_stats(self, buffer_bytes_read: int = 0) -> dict:
        """The engine's counters beyond the buffer's own (:meth:`BufferManager.reset_stats`), then
        reset: topology bytes, cache hit ratio, swaps lower bound, loader stall, peak RSS.
        ``bytes_read`` = ``buffer_bytes_read`` + topology bytes (a training loop that resets the
        buffer itself calls this with the buffer's ``bytes_read``)."""
        d: dict = {}
        topo = sum(r.counters.bytes_read for r in self.readers)
        for r in self.readers:
            r.counters.bytes_read = 0
        d["topology_bytes_read"] = topo
        d["bytes_read"] = buffer_bytes_read + topo
        if self.cache is not None:
            d.update(self.cache.reset_stats().as_dict())
        else:
            d.update(cache_hits=0, cache_misses=0, cache_hit_ratio=0.0, cache_bytes_read=0)
        plan = getattr(self, "_plan", None)
        if self.cfg.mode != "exact":
            d["swaps_lower_bound"] = node_swap_lower_bound(self.budget.num_parts, self.budget.slots)
            d["planned_swaps"] = plan.swaps if plan is not None else 0
            d["buffer_states"] = len(plan.states) if plan is not None else 0
        d["stall_s"] = self.loader.stall_s
        self.loader.stall_s = 0.0
        d["peak_rss_bytes"] = self.rss.peak()
        release_free_memory()
        self.rss.reset_peak()
        return d

    def summary(self) -> dict:
        """Run totals for metrics.json."""
        t = self.totals
        hits, misses = t["row_hits"], t["row_misses"]
        ch, cm = t["cache_hits"], t["cache_misses"]
        return {"mode": self.cfg.mode, "bytes_read": t["bytes_read"],
                "buffer_hit_ratio": hits / max(hits + misses, 1), "row_hits": hits,
                "row_misses": misses, "cache_hit_ratio": ch / max(ch + cm, 1), "swaps": t["swaps"],
                "buffer_bytes": self.buffer.nbytes,
                "cache_bytes": self.cache.nbytes if self.cache is not None else 0,
                "dataset_feature_bytes": self.ds.features.nbytes,
                "budget": self.budget.as_dict(), "rss_baseline_bytes": self.rss.baseline,
                "direct_io": bool(getattr(self.buffer.features, "direct", False)),
                "num_parts": self.budget.num_parts, "resident_partitions": self.budget.state_slots,
                "miss_features": "pq" if self.loader.approx is not None else "disk",
                "hybrid_mix": self.cfg.hybrid_mix if self.cfg.mode == "hybrid" else 0.0}

    def close(self) -> None:
        self.buffer.close()
        for r in [self.buffer.features, *self.readers]:
            r.close()
        if self.buffer.topo_rows is not None:
            self.buffer.topo_rows.close()


def build_data_path(cfg, ds: Dataset, rss: RssMonitor | None = None) -> DataPath:
    """Build the data path of ``cfg.mode`` under ``cfg.memory_budget`` (the one factory the
    training loop calls).

    Partitions: the dataset's stored ``partitions/offsets`` when their count equals
    ``cfg.partitions`` (or ``cfg.partitions`` is 0), else ``cfg.partitions`` contiguous ranges.

    Raises:
        ValueError: bad options, or a budget that cannot hold the mode's minimum.
    """
    validate_engine_options(cfg)
    rss = rss or RssMonitor()
    n = ds.num_nodes
    stored = ds.partition_offsets
    if stored is not None and (cfg.partitions == stored.shape[0] - 1 or cfg.partitions == 0):
        offsets = stored
    else:
        offsets = contiguous_partitions(n, cfg.partitions or 1)
    budget_bytes = parse_bytes(cfg.memory_budget) if cfg.memory_budget else None
    cache_size = parse_bytes(cfg.cache_size) if cfg.cache_size else None
    approx = None
    if getattr(cfg, "miss_features", "disk") == "pq":
        from ooc.features.pq import open_compressed, pq_bytes
        pq_need = pq_bytes(ds)
        if not pq_need:
            open_compressed(ds)  # raises the "run ooc compress" error
    else:
        pq_need = 0
    plan = plan_budget(cfg.mode, budget_bytes, ds, offsets, cfg.topology, cfg.batch_size,
                       cfg.fanouts, cfg.prefetch, cfg.hidden, cfg.buffer_partitions, cache_size,
                       cfg.cache_policy, cfg.ordering, cfg.eval_batch_size, cfg.eval_fanouts,
                       compressed=pq_need)
    if pq_need and plan.slots >= plan.num_parts:  # everything resident: nothing to decode
        plan = plan_budget(cfg.mode, budget_bytes, ds, offsets, cfg.topology, cfg.batch_size,
                           cfg.fanouts, cfg.prefetch, cfg.hidden, cfg.buffer_partitions, cache_size,
                           cfg.cache_policy, cfg.ordering, cfg.eval_batch_size, cfg.eval_fanouts)
        log.info("every partition is resident: PQ codes not loaded")
    elif pq_need:
        approx = open_compressed(ds)
    indptr = ds.indptr
    readers: list = []
    indices = None
    reader = None
    if cfg.topology == "memory":
        indices = ds.indices
    elif cfg.topology == "mmap":
        indices = ds.raw("indices").mmap()
    else:
        reader = NeighborReader(ds.raw("indices"), indptr, direct=cfg.direct_io)
        readers.append(reader)
    degrees = np.diff(indptr)
    labels = ds.labels
    feats = DiskRows(ds.features, direct=cfg.direct_io, threads=max(1, min(8, cfg.io_depth)),
                     gap=cfg.io_gap if cfg.direct_io else 0, aio_depth=max(1, cfg.io_depth))
    cache = None
    fallback = feats
    if plan.cache_rows > 0 and cfg.cache_policy != "none":
        cache = CachedFeature(feats, plan.cache_rows, cfg.cache_policy)
        fallback = cache
    topo_rows = None
    if cfg.mode == "buffer" and indices is None:
        topo_rows = DiskRows(ds.raw("indices"), direct=cfg.direct_io,
                             threads=max(1, min(4, cfg.io_depth)), aio_depth=0)
    buffer = BufferManager(feats, offsets, plan.slots, fallback, io_threads=cfg.io_threads,
                           topo_rows=topo_rows, indptr=indptr if topo_rows is not None else None)
    resident = ResidentGraph(buffer, indptr, indices) if cfg.mode == "buffer" else None
    sampler = GlobalSampler(indptr, indices, reader)
    loader = EngineLoader(cfg.mode, sampler, buffer, degrees, labels, cfg.fanouts, cfg.seed,
                          replace=cfg.replace, prefetch=cfg.prefetch, feat_norm=cfg.feat_norm,
                          resident=resident, approx=approx)
    train_ids = ds.split("train")
    log.info("mode %s: %d of %d partitions resident (%d per state), slot %s, cache %d rows (%s), "
             "budget %s", cfg.mode, plan.slots, plan.num_parts, plan.state_slots,
             format_bytes(plan.slot), plan.cache_rows, format_bytes(plan.cache),
             format_bytes(plan.budget) if plan.budget else "none")
    return DataPath(cfg, ds, offsets, plan, buffer, cache, loader, readers, train_ids, rss)
