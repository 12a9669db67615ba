"""Memory budgets and resident-set measurement.

:func:`plan_budget` splits one machine's ``--memory-budget`` between the parts of the data path
(:class:`BudgetPlan`); :class:`RssMonitor` reports the current and peak resident set size of this process with psutil and
``/proc/self/status`` (``VmHWM``), and can reset the peak between epochs (Linux ``clear_refs``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import psutil

from ooc.data.buffer import BufferManager
from ooc.features.cache import LOOKAHEAD_POLICIES, CachedFeature
from ooc.kernels.graph import degree_dtype_for
from ooc.kernels.sampling import workspace_bytes
from ooc.storage.dataset import Dataset
from ooc.util.sizes import format_bytes

if TYPE_CHECKING:
    from ooc.data.autoplan import Extents

__all__ = ["BudgetPlan", "BudgetTooSmall", "plan_budget", "RssMonitor", "mmap_threshold_for", "release_free_memory",
           "tune_allocator", "high_water_bytes"]


#: Sustained read bandwidth the cost models assume (bytes/s): the budget split's predicted reads
#: (:mod:`ooc.data.autoplan`) and exact mode's choice of read-ahead window.
DISK_BYTES_PER_S = 1.0e9
#: Bytes per second a batch's rows are gathered at from a read-ahead window's staged rows (binary
#: search and copy on the loader thread; about 7 ms for 27,000 rows of 512 B on the 2-core VM).
STAGED_GATHER_BYTES_PER_S = 2.0e9


def _status_field(name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def high_water_bytes() -> int:
    """This process's peak resident set size (bytes): the kernel's ``VmHWM``, which a new program
    starts afresh (since :meth:`RssMonitor.reset_peak` where one was called). ``ru_maxrss``, the
    fallback where /proc is missing, also keeps the parent's pages copied between fork and exec:
    a run started from a 1.3 GB process would report 1.3 GB."""
    hwm = _status_field("VmHWM")
    if hwm is not None:
        return hwm
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _private_rss() -> int:
    """Resident pages of this process that are not shared memory: ``RssAnon + RssFile`` (bytes)."""
    anon, file = _status_field("RssAnon"), _status_field("RssFile")
    return int((anon or 0) + (file or 0))


class RssMonitor:
    """Current and peak RSS of this process (bytes).

    ``peak()`` is the kernel's high-water mark ``VmHWM`` (falls back to the current RSS where /proc is
    missing); ``reset_peak()`` writes ``5`` to ``/proc/self/clear_refs`` so the next ``peak()`` covers
    only what follows (per-epoch peaks).  ``baseline`` is the RSS when the monitor was created: the
    runtime's fixed overhead (interpreter, torch, Numba) before any data is loaded.

    ``VmHWM`` counts the shared-memory pages a process touched, so the ranks of a machine would count
    a shared buffer once each.  :meth:`start_sampling` runs a thread that reads the private part
    (``RssAnon + RssFile``) every ``interval_s`` and keeps its peak (:meth:`peak_private`): a machine's
    peak is then the sum of its ranks' private peaks plus the shared segments once (sampled: a spike
    shorter than the interval can be missed).  The caller names what the process is doing in
    :attr:`phase` (``"start-up"``, ``"training"``, ``"evaluation"``); :meth:`peak_private_where`
    says in which phase, and how many seconds after the last reset, the sampled peak was reached.
    """

    def __init__(self) -> None:
        self._proc = psutil.Process()
        release_free_memory()
        self.baseline = self.current()
        self.phase = "start-up"
        self._private_peak = _private_rss()
        self._peak_phase = self.phase
        self._reset_t = self._peak_t = time.monotonic()
        self._stop: threading.Event | None = None
        self.reset_peak()

    def _note(self, v: int) -> None:
        if v > self._private_peak:
            self._private_peak = v
            self._peak_phase = self.phase
            self._peak_t = time.monotonic()

    def start_sampling(self, interval_s: float = 0.02) -> None:
        """Sample the private RSS every ``interval_s`` on a daemon thread (idempotent)."""
        if self._stop is not None:
            return
        self._stop = threading.Event()

        def loop(stop: threading.Event) -> None:
            while not stop.wait(interval_s):
                self._note(_private_rss())

        threading.Thread(target=loop, args=(self._stop,), name="ooc-rss", daemon=True).start()

    def stop_sampling(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def peak_private(self) -> int:
        """Peak private RSS (anonymous + file pages) since the last reset (sampled)."""
        self._note(_private_rss())
        return self._private_peak

    def peak_private_where(self) -> tuple[str, float]:
        """``(phase, seconds)``: the :attr:`phase` in which :meth:`peak_private` was reached and
        how long after the last reset (or the monitor's creation)."""
        return self._peak_phase, self._peak_t - self._reset_t

    def current(self) -> int:
        """Resident set size now."""
        return int(self._proc.memory_info().rss)

    def peak(self) -> int:
        """Peak resident set size since the last reset (or process start):
        :func:`high_water_bytes`."""
        return high_water_bytes()

    def reset_peak(self) -> bool:
        """Reset the peaks to the current RSS; False where the kernel does not allow it."""
        self._private_peak = _private_rss()
        self._peak_phase = self.phase
        self._reset_t = self._peak_t = time.monotonic()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False


def tune_allocator(mmap_threshold: int = 64 << 20, arena_max: int = 2) -> bool:
    """Make RSS follow live data under glibc: allocations >= ``mmap_threshold`` are always mapped
    (and unmapped on free; glibc's own threshold moves with the sizes freed), and at most
    ``arena_max`` malloc arenas (each thread would otherwise get its own heap).  Returns False where
    ``mallopt`` is unavailable.

    64 MiB: one step's arrays (input rows, the float32 copy, activations, gradients: tens of MB on
    the 2 M-node bench) come from the heap and are reused step after step; with a 1 MiB threshold
    each was a fresh mapping whose pages fault and are zeroed on first touch, and the SAGE step
    took 62-67 ms instead of 33-47 ms.  The heap then holds at most about one step's peak, which the
    budget counts (batches in flight, activations); partition slots, the topology and other large
    arrays are still mapped, and :func:`release_free_memory` trims the heap after each epoch."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(-3, int(mmap_threshold))  # M_MMAP_THRESHOLD
        ok &= libc.mallopt(-8, int(arena_max))  # M_ARENA_MAX
        return bool(ok)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False


def mmap_threshold_for(budget: int | None) -> int:
    """The allocator's mmap threshold for one process under ``budget`` bytes (None: no budget):
    1/128 of the budget, between 1 MiB and 64 MiB (the full 64 MiB from an 8 GiB budget on).

    Allocations below the threshold come from the heap and stay there after they are freed (until
    :func:`release_free_memory`), so RSS runs above the live data by about one step's heap arrays:
    65-85 MiB at a 64 MiB threshold on the 1 M-node bench against a 178 MiB budget, 20-30 MiB at
    1.4 MiB (1/128), where a step pays page faults on fresh mappings instead.  Without a budget the
    steps reuse heap memory (the faster setting, see :func:`tune_allocator`)."""
    if budget is None:
        return 64 << 20
    return int(min(64 << 20, max(1 << 20, int(budget) // 128)))


def release_free_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``), so RSS tracks live data."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


class BudgetTooSmall(ValueError):
    """A memory budget that cannot hold the run (the message says what it would need).

    Attributes:
        eval_bound: the evaluation batches are what did not fit (they are larger than the training
            batches): the run fits if evaluation uses none (layer-wise).
        needed: the smallest budget these settings run under, in bytes (None: not computed).
    """

    def __init__(self, message: str, eval_bound: bool = False, needed: int | None = None) -> None:
        super().__init__(message)
        self.eval_bound = eval_bound
        self.needed = needed


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
            evaluation threads); with the topology on disk, the neighbour lists a batch holds
            while it is sampled (probed, :attr:`ooc.data.autoplan.Extents.list_bytes`).
        compressed: PQ codes and centroids of every node (``--miss-features pq``).
        embedding: a learnable node-embedding table kept in host memory (``--embedding D`` on
            CPU): weights, gradient and optimiser state, per rank (each holds its replica).
        local_world: ranks of this machine sharing the budget; per_rank: bytes every one of them
            holds privately (node arrays, batches in flight, scratch, the resident subgraph of
            buffer mode, a device cache kept in host memory, a node-embedding table), counted
            ``local_world`` times.
        prefetch: batches built ahead, as planned (lowered from the configured depth when the
            batches in flight would not fit otherwise, or, in exact mode with ``--read-ahead
            auto``, when they would leave a window under 2/3 of the one planned with none built
            ahead; speed only, never results).
        read_ahead: training batches whose missing rows are read together (0: each its own);
            read_ahead_bytes: the window's memory per rank (part of ``scratch``); eval_read_ahead:
            evaluation batches read together in that same memory (evaluation and training never
            hold a window at the same time).
        sample_ahead: training batches sampled ahead on their own thread (0: none);
            sample_ahead_bytes: their samples' memory per rank (part of ``scratch``).
        eval_batches: sampled evaluation batches are planned (False: evaluation must run
            layer-wise, in the parts of the budget idle while it runs).
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
    local_world: int = 1
    per_rank: int = 0
    prefetch: int = 2
    slot_private: int = 0
    shared_slots: bool = True
    embedding: int = 0
    read_ahead: int = 0
    read_ahead_bytes: int = 0
    eval_read_ahead: int = 0
    sample_ahead: int = 0
    sample_ahead_bytes: int = 0
    eval_batches: bool = True

    @property
    def planned(self) -> int:
        """Bytes of the machine: shared parts once, per-rank parts ``local_world`` times."""
        lw = self.local_world
        slots = self.slots * (self.slot if self.shared_slots else self.slot * lw)
        return (self.topology + self.compressed + self.cache + slots
                + lw * (self.per_rank + self.slots * self.slot_private))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["planned"] = self.planned
        return d


def _staging_bytes(n: int, avg_deg: float, row_bytes: int, feat_dim: int, batch_size: int,
                   fanouts: list[int], prefetch: int, hidden: int, eval_batch_size: int = 0,
                   eval_fanouts: list[int] | None = None, float_copy: bool = True,
                   embedding_dim: int = 0, extents: "Extents | None" = None) -> int:
    """Bytes of batches in flight: ``prefetch + 2`` training batches (queued, being built, being
    trained; one with ``prefetch`` 0, built when the previous one is released) holding their rows in the storage dtype, plus the float32 copy (``float_copy``: rows
    not stored as float32) and activations of the one being trained (with node embeddings of
    width ``embedding_dim``: the gathered rows and the concatenated input, 8 B per column); or the
    same for three evaluation batches (queued, being built, being scored; one with ``prefetch`` 0;
    ``eval_fanouts``; ``None``: full neighbourhoods), whichever is larger.  ``extents`` (:func:`ooc.data.autoplan.probe_extents`): measured batch sizes instead
    of the no-deduplication bound."""
    def need(bs: int, fo: list[int], alive: int, train: bool) -> int:
        if bs <= 0:
            rows, edges = 0, 0
        elif extents is not None:
            rows, edges = ((extents.train_rows, extents.train_edges) if train
                           else (extents.eval_rows, extents.eval_edges))
        else:
            rows, edges = _batch_extent(n, avg_deg, bs, fo)
        queued = rows * (row_bytes + 24) + edges * 40  # rows, ids / labels, MFG arrays
        return alive * queued + rows * ((4 * feat_dim if float_copy else 0) + 8 * embedding_dim
                                        + 4 * hidden)

    # queued + being built + being trained; synchronous (prefetch 0): the one being trained only
    train = need(batch_size, fanouts, prefetch + 2 if prefetch > 0 else 1, True)
    # evaluation builds one batch ahead (none when training builds none ahead)
    ev = need(eval_batch_size, list(eval_fanouts) if eval_fanouts else [-1] * len(fanouts),
              3 if prefetch > 0 else 1, False)
    return int(max(train, ev))


def _largest_window(fits: "Callable[[int], bool]", cap: int) -> int:
    """The largest window ``w <= cap`` batches with ``fits(w)`` (bytes grow with ``w``); 0 below 2."""
    w = 0
    while w < cap and fits(w + 1):
        w += 1
    return w if w >= 2 else 0


def _read_ahead_depth(widths: dict[int, int], steps: int, feature_bytes: int,
                      batch_bytes: int) -> tuple[int, int]:
    """Exact mode's batches built ahead and read-ahead window: ``(depth, window)`` from
    ``widths`` (depth -> the widest window the budget holds beside that many batches in flight,
    0 for none).

    An epoch of ``steps`` batches costs about one pass over the ``feature_bytes`` of features per
    window (a window's rows are spread over the whole file: its coalesced read approaches the
    file) at :data:`DISK_BYTES_PER_S`, plus, with no batch built ahead (depth 0), every batch's
    ``batch_bytes`` of rows gathered on the trainer's thread at
    :data:`STAGED_GATHER_BYTES_PER_S`.  The cheapest depth is kept (ties: the deepest), and its
    window is the narrowest that reads no more often (windows of near-equal width).  ``steps`` 0
    (not known): windows are counted as ``steps / width``.  No window fits: ``(the deepest, 0)``."""
    deepest = max(widths)
    if not any(widths.values()):
        return deepest, 0

    def windows(w: int) -> float:
        return float(-(-steps // w)) if steps > 0 else 1.0 / w

    def cost(d: int) -> float:
        w = widths[d]
        if not w:
            return float("inf")
        serial = 0.0 if d else max(steps, 1) * batch_bytes / STAGED_GATHER_BYTES_PER_S
        return windows(w) * feature_bytes / DISK_BYTES_PER_S + serial

    d = min(widths, key=lambda k: (cost(k), -k))
    w = widths[d]
    if steps > 0:
        w = -(-steps // int(windows(w)))
    return d, w


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
                eval_fanouts: list[int] | None = None, compressed: int = 0, *,
                local_world: int = 1, share: bool = True, per_rank_extra: int = 0,
                topology_edges: int | None = None, min_state: int = 1,
                float_copy: bool | None = None, embedding: int = 0,
                embedding_dim: int = 0, lookahead: int = 0, loop_counts: bool = True,
                extents: "Extents | None" = None, hot_topology: int = 0,
                read_ahead: int | None = 0, train_batches: int = 0,
                sample_ahead: int = 0) -> BudgetPlan:
    """Split one machine's ``budget`` between topology, node arrays, batches in flight, sampler
    scratch, compressed rows (``compressed`` bytes of PQ codes, see :mod:`ooc.features.pq`),
    partition slots and the CPU row cache.

    Shared by the machine's ``local_world`` ranks, hence counted once: the topology held in memory,
    the PQ codes, the partition slots (``share``; else one buffer per rank) and the cache (split
    between the ranks).  Counted per rank: node arrays, batches in flight, sampler scratch, the
    resident subgraph of buffer mode, ``per_rank_extra`` (a CPU device cache, link prediction's split).  When the
    batches in flight do not fit, the batches sampled ahead are dropped and then the prefetch depth
    is lowered (they change speed, never results) before the budget is refused.

    Args:
        topology_edges: edges of the graph held in memory instead of the dataset's (link
            prediction's message-passing graph, int64 indices).
        min_state: partitions a buffer state must hold (2 for link prediction's edge buckets).
        float_copy: the training step converts rows to float32 (storage not float32); default from
            the dataset's feature dtype.  A dataset without features has rows of 0 bytes.
        embedding: bytes of a node-embedding table held in host memory by every rank
            (:func:`ooc.embedding.embedding_bytes`); embedding_dim: its width D (each batch's input
            rows gain D float32 columns, counted with the batches in flight).
        lookahead: batches a look-ahead cache keeps sampled ahead (``--cache-policy belady``),
            charged per rank (:func:`ooc.data.lookahead.lookahead_bytes`); 0 = none.
        loop_counts: the model reads each node's self-loop count (int32 [N] in memory,
            :func:`ooc.models.needs_loop_counts`).
        extents: probed batch sizes (:func:`ooc.data.autoplan.probe_extents`) for the batches in
            flight; None: the no-deduplication bound (at most the graph).
        hot_topology: bytes of an on-disk topology's hottest lists held in memory
            (``--hot-topology``, :class:`ooc.storage.io.HotLists`), counted with the topology.
        read_ahead: training batches whose missing rows are read together (``--read-ahead``,
            :class:`ooc.data.lookahead.ReadAhead`): their samples and rows, charged per rank
            (:func:`ooc.data.lookahead.read_ahead_bytes`); 0 = none; None (``auto``): in exact mode
            under a budget with rows left on disk and no ``cache_size``, as many batches as the
            memory a CPU cache would get holds (no cache then: a window serves every row outside
            the slots), at most ``train_batches`` (a rank's steps per epoch, which caps a given
            window too), none below 2; otherwise 0.  A window is dropped where every partition
            is resident.
        sample_ahead: training (and evaluation) batches sampled ahead on their own thread
            (``--sample-ahead``, :class:`ooc.data.lookahead.SampleAhead`): their samples (of the
            larger of a training and an evaluation batch), charged per rank as sampler scratch (:func:`ooc.data.lookahead.sample_ahead_bytes`); not used, and not charged,
            when a read-ahead window is planned (it samples its window itself) or where the
            budget cannot hold them beside the mode's minimum.

    Raises:
        BudgetTooSmall (a ValueError): the budget cannot hold the fixed parts plus the minimum the
            mode needs (one partition slot for ``buffer``/``hybrid``, ``min_state`` + 1 with
            states), naming the sizes.
    """
    n, e = ds.num_nodes, ds.num_edges
    has_feats = ds.has("features")
    row_bytes = ds.features.row_bytes if has_feats else 0
    idx_item = ds.raw("indices").dtype.itemsize
    if float_copy is None:
        float_copy = has_feats and np.dtype(ds.features.dtype) != np.float32
    num_parts = offsets.shape[0] - 1
    sizes = np.diff(offsets)
    indptr = ds.indptr
    part_edges = indptr[offsets[1:]] - indptr[offsets[:-1]]
    lw = max(int(local_world), 1)
    deg_item = degree_dtype_for(e if topology_edges is None else int(topology_edges)).itemsize
    topo = 8 * (n + 1) + deg_item * n + (4 * n if loop_counts else 0)  # indptr, degrees, self-loops
    if topology_edges is not None:
        topo += 8 * int(topology_edges)
        e = int(topology_edges)
    elif topology in ("memory", "mmap"):
        topo += e * idx_item
    topo += int(hot_topology)
    nodes = 4 * n + 8 * sum(ds.split(s).shape[0] for s in ("train", "valid", "test"))
    # sampler workspaces of the loader and evaluation threads (N-sized for small graphs); the
    # miss reads' request staging (AIO: at most AIO_STAGING_BYTES = 8 MiB per reader; pread
    # threads, where AIO is missing: 8 x MISS_RUN_BYTES) is a fixed cost, part of the stated
    # runtime overhead
    scratch = 2 * workspace_bytes(n)
    if topology == "disk" and extents is not None:  # a batch's lists while it is sampled
        scratch += int(extents.list_bytes)
    window = 0
    if lookahead and cache_policy in LOOKAHEAD_POLICIES:
        from ooc.data.lookahead import lookahead_bytes
        rows, edges = _batch_extent(n, e / max(n, 1), batch_size, fanouts)
        window = lookahead_bytes(lookahead, rows, edges, n)
        scratch += window
    from ooc.data.lookahead import read_ahead_bytes
    ra_rows, ra_edges = (extents.per_window_batch(True) if extents is not None
                         else _batch_extent(n, e / max(n, 1), batch_size, fanouts))

    def window_bytes(w: int) -> int:
        return read_ahead_bytes(w, ra_rows, ra_edges, n, row_bytes) if w else 0

    def eval_window(room: int) -> int:
        """Evaluation batches whose read-ahead fits in ``room`` bytes (0 below 2)."""
        if not eval_batch_size:
            return 0
        if extents is not None:
            er, ee = extents.per_window_batch(False)
        else:
            er, ee = _batch_extent(n, e / max(n, 1), eval_batch_size,
                                   list(eval_fanouts) if eval_fanouts else [-1] * len(fanouts))
        return _largest_window(lambda w: read_ahead_bytes(w, er, ee, n, row_bytes) <= room, 1 << 16)

    auto_ahead = read_ahead is None
    steps_cap = max(int(train_batches), 0) or 1 << 30  # a window holds at most an epoch's steps
    ahead_n = 0 if auto_ahead or mode == "buffer" or row_bytes == 0 else \
        min(int(read_ahead or 0), steps_cap)
    ahead = window_bytes(ahead_n) if ahead_n >= 2 else 0
    ahead_n = ahead_n if ahead else 0
    scratch += ahead
    from ooc.data.lookahead import sample_ahead_bytes
    # training's samples, or evaluation's (sampled ahead the same way), whichever are larger
    sa_rows, sa_edges = ((extents.train_rows, extents.train_edges) if extents is not None
                         else _batch_extent(n, e / max(n, 1), batch_size, fanouts))
    if eval_batch_size:
        er, ee = ((extents.eval_rows, extents.eval_edges) if extents is not None else
                  _batch_extent(n, e / max(n, 1), eval_batch_size,
                                list(eval_fanouts) if eval_fanouts else [-1] * len(fanouts)))
        sa_rows, sa_edges = max(sa_rows, er), max(sa_edges, ee)
    sample_ahead = 0 if ahead_n else max(int(sample_ahead), 0)
    sampled = sample_ahead_bytes(sample_ahead, sa_rows, sa_edges)
    scratch += sampled
    slot = BufferManager.slot_bytes(int(sizes.max()), row_bytes)
    slot_private = 0
    if mode == "buffer":  # in-edges of the partition (raw) travel with it; its local CSC per rank
        slot += BufferManager.slot_bytes(int(part_edges.max()), idx_item)
        slot_private = 8 * int(part_edges.max()) + 24 * (int(sizes.max()) + 1)
    depth = max(int(prefetch), 0)

    def staging(d: int) -> int:
        return _staging_bytes(n, e / max(n, 1), row_bytes, ds.feat_dim, batch_size, fanouts, d,
                              hidden, eval_batch_size, eval_fanouts, float_copy, embedding_dim,
                              extents)

    def slots_cost(k: int) -> int:
        return k * (slot if share else slot * lw) + lw * k * slot_private

    stage = staging(depth)
    if budget is None:
        # rows of 0 bytes (no features): slots hold nothing, every partition is resident
        slots = num_parts if row_bytes == 0 and mode != "buffer" else min(buffer_partitions, num_parts)
        cache = cache_size or 0
    else:
        need_slots = 0 if mode == "exact" else min_state
        need_slots = min(need_slots, num_parts)
        fixed = topo + compressed + lw * (nodes + scratch + per_rank_extra + embedding)
        if sampled and fixed + lw * stage + slots_cost(need_slots) > budget:
            fixed -= lw * sampled  # sampled on the loader thread instead (speed only)
            scratch -= sampled
            sample_ahead = sampled = 0
        while depth > 0 and fixed + lw * stage + slots_cost(need_slots) > budget:
            depth -= 1
            stage = staging(depth)
        avail = budget - fixed - lw * stage
        if avail < slots_cost(need_slots):
            tr = _staging_bytes(n, e / max(n, 1), row_bytes, ds.feat_dim, batch_size, fanouts, depth,
                                hidden, 0, None, float_copy, embedding_dim, extents)
            ev = _staging_bytes(n, e / max(n, 1), row_bytes, ds.feat_dim, 0, fanouts, depth, hidden,
                                eval_batch_size, eval_fanouts, float_copy, embedding_dim, extents)
            needed = fixed + lw * stage + slots_cost(need_slots)
            which = (f" (the larger of training batches {format_bytes(tr)}: --batch-size, --fanout, "
                     f"--prefetch; and evaluation batches {format_bytes(ev)}: --eval-batch-size, "
                     "--eval-fanout; a batch's neighbourhood is at most the whole graph)")
            raise BudgetTooSmall(
                f"--memory-budget {format_bytes(budget)} too small"
                + (f" for {lw} local ranks" if lw > 1 else "")
                + f" (these settings need at least {format_bytes(needed, up=True)})"
                + f": topology {format_bytes(topo)}"
                + (f" (of which --hot-topology {format_bytes(hot_topology)})" if hot_topology else "")
                + ", "
                f"node arrays {format_bytes(nodes)}, batches in flight {format_bytes(stage)}{which}, "
                f"sampler scratch {format_bytes(scratch)}"
                + (f" (of which the look-ahead window of --lookahead {lookahead} batches "
                   f"{format_bytes(window)})" if window else "")
                + (f" (of which the rows of --read-ahead {read_ahead} batches "
                   f"{format_bytes(ahead)})" if ahead else "")
                + (" per rank" if lw > 1 else "")
                + (f", PQ codes {format_bytes(compressed)}" if compressed else "")
                + (f", host-side device cache and task arrays (link split) "
                   f"{format_bytes(per_rank_extra)}" if per_rank_extra else "")
                + (f", node embeddings {format_bytes(embedding)}" if embedding else "")
                + (f", {need_slots} partition slot{'s' if need_slots > 1 else ''} "
                   f"{format_bytes(slots_cost(need_slots))}" if need_slots else "")
                + " (use more partitions" + (", --topology disk" if topology != "disk" else "")
                + ", a smaller batch or a larger budget"
                + ("; or a smaller --eval-batch-size, or --eval-mode layerwise (no evaluation batches)"
                   if ev > tr else "")
                + ("; or a smaller --embedding" if embedding else "")
                + ("; or a smaller --hot-topology" if hot_topology else "")
                + ("; or a smaller --read-ahead" if ahead else "")
                + ("; or --miss-features disk / fewer `ooc compress --subspaces`" if compressed
                   else "") + ")", eval_bound=ev > tr, needed=needed)
        per_slot = slots_cost(1)
        if mode == "exact":
            if slots_cost(num_parts) <= avail + lw * ahead and not cache_size:
                slots, cache = num_parts, 0  # (a window given would read nothing: dropped below)
            else:
                slots, cache = 0, min(avail, cache_size) if cache_size else avail
                if ahead_n:
                    cache = 0  # the window serves every row outside the slots: no cache is asked
                elif auto_ahead and row_bytes and not cache_size:
                    # the memory a cache would get holds a read-ahead window instead: one sweep of
                    # the features serves the window's batches, where a cache of a few % of the
                    # rows saves a few % of the scattered reads (with --cache-size: the cache);
                    # what is left is not a cache either (no row would be asked of it)
                    # the window beside d batches built ahead, for every d up to the depth; fewer
                    # are built ahead where the window is otherwise under 2/3 of the widest (a
                    # window's read serves all its batches, a batch built ahead overlaps one
                    # batch's work), so that a larger budget does not plan a narrower window than
                    # a smaller one whose batches in flight did not fit
                    def width(d: int) -> int:
                        room = (budget - fixed - lw * staging(d)) // max(lw, 1)
                        return _largest_window(lambda k: window_bytes(k) <= room, steps_cap)

                    widths = {d: width(d) for d in range(depth, -1, -1)}
                    d, w = _read_ahead_depth(widths, int(train_batches), n * row_bytes,
                                             ra_rows * row_bytes)
                    if d != depth:
                        depth, stage = d, staging(d)
                        avail = budget - fixed - lw * stage
                    if w:
                        ahead_n, ahead = w, window_bytes(w)
                        scratch += ahead - sampled  # the window samples its batches itself
                        sample_ahead = sampled = 0
                        cache = 0
        else:
            cache = 0
            if mode == "hybrid" and cache_policy != "none":
                cache = min(cache_size, avail - slots_cost(max(need_slots, 1))) if cache_size else 0
            slots = min(num_parts + max(1, num_parts // 3), (avail - cache) // per_slot)
            if slots >= num_parts:
                slots = num_parts
                if mode == "hybrid" and not cache_size:
                    cache = 0
    if ahead_n and slots >= num_parts:  # every partition resident: a window would read nothing
        scratch -= ahead
        ahead_n = ahead = 0
    if cache_policy == "none":
        cache = 0
    cache_rows = CachedFeature.rows_for(cache // lw, row_bytes, cache_policy) * lw if cache else 0
    group = 1
    if slots >= num_parts:
        state = num_parts
    elif mode == "exact":
        state = slots
    elif slots <= 1:
        state = max(slots, 1)
    elif ordering == "comet" and min_state <= 1:
        group = max(1, slots // 3)
        # whole logical partitions per state (comet_states rounds down); the rest prefetch
        state = max(group, (slots - group) // group * group)
    else:
        state = max(slots - 1, min(min_state, slots))
    return BudgetPlan(budget, int(topo), int(nodes), int(stage), int(slot), int(slots), int(state),
                      int(cache), int(cache_rows), int(group), num_parts, int(scratch),
                      int(compressed), lw, int(nodes + stage + scratch + per_rank_extra + embedding),
                      depth, int(slot_private), bool(share), int(embedding), int(ahead_n),
                      int(ahead), eval_window(ahead) if ahead_n else 0, int(sample_ahead),
                      int(sampled), eval_batch_size > 0)
