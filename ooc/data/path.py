"""The data path of a run -- one for every mode, sampler, task, device cache and number of ranks.

``build_data_path(cfg, ds, job)`` turns a :class:`~ooc.config.TrainConfig` into a
:class:`DataPath`: the topology (in memory, mapped or on disk; shared by the machine's ranks), the
budget plan, the machine's partition buffer and the feature tiers behind it, the training sampler
and the loader.  Tasks (:mod:`ooc.tasks`) plan epochs and build batches through it.

Modes (``--mode``):

- ``exact`` -- full-graph sampling, batches a uniform shuffle of the training ids (what an
  in-memory trainer does).  The partitions that fit stay resident (static residency); other rows
  come from the CPU cache or batched disk reads.  Memory never changes results: the same seed
  gives the identical loss sequence for any budget (Ginex / GraphBolt style).
- ``buffer`` -- MariusGNN style: an ordering policy makes ``c`` partitions resident at a time;
  every training id is trained once per epoch in a state that holds its partition(s), and
  neighbours are sampled inside the resident partitions only (the in-buffer subgraph, whose degrees
  GCN uses).  Only sequential partition loads.
- ``hybrid`` -- batches from the seeds of the resident partitions (as ``buffer``) but full-graph
  sampling (as ``exact``): with a locality-preserving partition most sampled neighbours are
  resident; the rest come through the cache, PQ codes (``--miss-features pq``) or a batched read.

Feature rows are looked up, in order: device cache (on the loader thread) -> resident partition
slots -> CPU row cache -> PQ codes (outermost hop of hybrid training batches) or disk.

Budget (``--memory-budget``, per machine): :func:`ooc.data.budget.plan_budget`; the runtime itself
(interpreter, torch, Numba, model and autograd workspace) is the stated fixed overhead per process
(``rss_baseline_bytes``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import torch

from ooc.config import auto_layerwise_eval, read_ahead_batches, sample_ahead_batches
from ooc.contracts import Batch, EdgePairs, Graph, Job, Plan, SingleProcess
from ooc.data.autoplan import (AUTO_HOT_SHARES, MIX_EXCESS, Extents, ListProbe, ReadCost,
                               SplitChoice, choose_split, feature_rows, list_reader, probe_extents)
from ooc.data.budget import (BudgetPlan, BudgetTooSmall, RssMonitor, mmap_threshold_for, plan_budget,
                             release_free_memory, tune_allocator)
from ooc.data.buffer import BufferManager, make_buffer
from ooc.data.loader import BuildFn, Loader
from ooc.data.lookahead import Lookahead, ReadAhead, SampleAhead
from ooc.data.ordering import node_swap_lower_bound
from ooc.data.plan import (class_mix_distance, plan_bucket_states, plan_classes, plan_cluster_states,
                           plan_exact, plan_own, plan_states, uniform_class_mix)
from ooc.data.resident import ResidentGraph
from ooc.data.shared import shared_array
from ooc.embedding import embedding_bytes
from ooc.features.cache import LOOKAHEAD_POLICIES, CachedFeature
from ooc.features.tiers import MissRows, NoFeatures
from ooc.kernels.graph import degree_dtype_for, degrees_into, self_loop_counts
from ooc.kernels.partition import contiguous_partitions
from ooc.kernels.rng import batch_key
from ooc.kernels.sampling import MiniBatch, excluded_edge_keys
from ooc.models import needs_loop_counts, to_torch_blocks
from ooc.sampling.samplers import (NeighborSampler, Sampler, check_sampler, make_sampler,
                                  partition_clusters)
from ooc.storage.dataset import Dataset
from ooc.storage.io import DiskRows, HotLists
from ooc.util.sizes import format_bytes, parse_bytes

if TYPE_CHECKING:  # pragma: no cover
    from ooc.config import TrainConfig
    from ooc.features.device import DeviceFeatureCache
    from ooc.features.pq import CompressedRows

__all__ = ["DataPath", "MachinePlan", "build_data_path", "plan_machine", "partition_offsets"]

log = logging.getLogger("ooc.data")

def partition_offsets(cfg: "TrainConfig", ds: Dataset) -> np.ndarray:
    """int64 [P+1]: the dataset's stored ``partitions/offsets`` when ``cfg.partitions`` is 0 or
    their count; else ``cfg.partitions`` contiguous id ranges (0 and none stored: 4, at most N) --
    with a warning when that replaces stored partitions."""
    stored = ds.partition_offsets
    p = int(cfg.partitions)
    if stored is not None and p in (0, stored.shape[0] - 1):
        return stored
    if stored is not None:
        log.warning("%s holds %d stored partitions (ooc partition); --partitions %d splits its ids "
                    "into %s instead (omit --partitions to use the stored ones)",
                    ds.path, stored.shape[0] - 1, p,
                    "one range" if p == 1 else f"{p} contiguous ranges")
    return contiguous_partitions(ds.num_nodes, p or min(4, ds.num_nodes))


class DataPath:
    """The run's data path (see the module docstring); built by :func:`build_data_path`.

    Attributes:
        cfg, ds, job: configuration, dataset, this process's place in the job.
        graph: the message-passing topology (the training edges' graph for link prediction).
        labels: int [N] (or [N, C]); offsets: int64 [P+1] partitions.
        budget: the :class:`~ooc.data.budget.BudgetPlan`.
        buffer: the machine's :class:`~ooc.data.buffer.BufferManager`; misses: the tiers behind it.
        cache: the CPU row cache or None; pq: the PQ codes or None; device_cache: set by
            :meth:`attach_device_cache`.
        sampler: the training sampler (over the whole graph); resident: the buffer-mode subgraph.
        loader: the :class:`~ooc.data.loader.Loader`.
    """

    def __init__(self, cfg: "TrainConfig", ds: Dataset, job: Job, graph: Graph, labels: np.ndarray,
                 offsets: np.ndarray, budget: BudgetPlan, buffer: BufferManager, misses: MissRows,
                 sampler: Sampler, readers: list, rss: RssMonitor) -> None:
        self.cfg, self.ds, self.job = cfg, ds, job
        self.mode = cfg.mode
        self.graph = graph
        self.labels = labels
        self.offsets = offsets
        self.budget = budget
        self.buffer = buffer
        self.misses = misses
        self.cache = misses.cache
        self.pq = misses.pq
        self.device_cache: "DeviceFeatureCache | None" = None
        self.sampler = sampler
        self.readers = readers
        self.rss = rss
        self.resident = ResidentGraph(buffer, graph.indptr, graph.indices, graph.loops) \
            if cfg.mode == "buffer" else None
        self._state_sampler: tuple[tuple | None, Sampler | None] = (None, None)
        self.loader = Loader(buffer, budget.prefetch)
        if self.resident is not None:
            self.loader.on_state = self.resident.build
        self._requests0 = 0  # _load_requests() at the last reset_stats
        self.shared_bytes = 0  # shared-memory segments of this machine (set by build_data_path)
        self.topology = cfg.topology  # resolved by build_data_path (--topology auto)
        self.split: SplitChoice | None = None
        #: the probed extents and split, for a checkpoint (set by build_data_path; None: none)
        self.plan_record: dict | None = None
        self.lookahead: Lookahead | None = None
        if self.cache is not None and self.cache.lookahead:  # --cache-policy belady (exact mode)
            self.lookahead = Lookahead(self._sample_step, self.cache, cfg.lookahead, graph.num_nodes)
        self.readahead: ReadAhead | None = None  # --read-ahead (set by build_data_path)
        #: --sample-ahead: training samples made on their own thread (node batches)
        self.sampleahead: SampleAhead | None = SampleAhead(self._sample_step, budget.sample_ahead) \
            if budget.sample_ahead and self.lookahead is None else None
        self._eval_ahead: ReadAhead | None = None  # evaluation's (made on first use)
        self._eval_sampler: NeighborSampler | None = None
        self._eval_sa: SampleAhead | None = None  # evaluation's sample-ahead (made per evaluation)
        self._plans: dict[tuple, Plan] = {}
        self._last_plan: Plan | None = None
        self._then: Callable[[], Plan | None] | None = None  # the plan after _last_plan's (iterate)
        self.totals = {"bytes_read": 0, "row_hits": 0, "row_misses": 0}
        self._setup = None
        if cfg.mode == "exact" and buffer.capacity:
            buffer.require(list(range(buffer.capacity)), [], ticket=1)  # static residency
            self._setup = buffer.reset_stats()  # its loads count in the first epoch's record

    # ---------------------------------------------------------------- shape of the data
    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def feat_shape(self) -> tuple[int, ...]:
        return tuple(self.buffer.features.shape)

    def part_of(self, ids: np.ndarray) -> np.ndarray:
        """int64 partition of each node id."""
        return np.searchsorted(self.offsets, ids, side="right") - 1

    # ---------------------------------------------------------------- planning
    def plan_nodes(self, ids: np.ndarray, batch_size: int, epoch: int) -> Plan:
        """The global plan of node ``ids`` for ``epoch`` (batches of ``batch_size`` seeds): the
        sampler's own batches (ClusterGCN, GraphSAINT), a uniform shuffle (``exact``) or buffer
        states (``buffer`` / ``hybrid``).  State plans of successive epochs chain (each epoch
        begins with the previous one's last state), so they are computed in order and memoised."""
        c, b = self.cfg, self.budget
        if c.mode == "exact":
            own = self.sampler.plan_batches(ids, batch_size, c.seed, epoch)
            return plan_own(own) if own is not None else plan_exact(ids, batch_size, c.seed, epoch)
        key0 = ("nodes", int(ids.shape[0]), int(ids.sum()), batch_size)
        done = [e for (k, e) in self._plans if k == key0 and e <= epoch]
        for e in range(max(done, default=-1) + 1, epoch + 1):  # on from the latest memoised
            prev = self._plans.get((key0, e - 1))
            start = prev.states[-1] if prev is not None and prev.states else None
            if c.sampler == "cluster":
                cl = self.sampler.cluster_of  # type: ignore[attr-defined]
                part_of_cluster = np.zeros(int(cl.max()) + 1 if cl.size else 0, dtype=np.int64)
                part_of_cluster[cl] = self.part_of(np.arange(cl.shape[0]))
                p = plan_cluster_states(cl[ids], ids, part_of_cluster, b.num_parts, b.state_slots,
                                        c.clusters_per_batch, c.seed, e, c.ordering, b.group, start)
            else:
                classes = plan_classes(self.labels if self.ds.has("labels") else None, ids)
                p = plan_states(ids, self.part_of(ids), b.num_parts, b.state_slots, batch_size,
                                c.seed, e, c.ordering, b.group, start,
                                mix=c.hybrid_mix if c.mode == "hybrid" else 0.0, classes=classes)
                if e == 0 and classes is not None and b.budget is None:
                    self._warn_label_mix(p, ids, classes, batch_size)
            self._plans[(key0, e)] = p
            self._plans.pop((key0, e - 2), None)
        return self._plans[(key0, epoch)]

    def _warn_label_mix(self, plan: Plan, ids: np.ndarray, classes: np.ndarray,
                        batch_size: int) -> None:
        """Warn (once per job, on rank 0) where a state plan sized by ``--buffer-partitions``, not
        by a budget's split, gives batches further than :data:`~ooc.data.autoplan.MIX_EXCESS`
        from the training set's label mix beyond uniform batches (fewer partitions per state:
        batches of a few classes where partitions follow communities; accuracy suffers)."""
        if self.job.rank != 0 or self.budget.state_slots >= self.budget.num_parts:
            return
        mix = class_mix_distance(plan.batches, ids, classes)
        iid = uniform_class_mix(ids, batch_size, self.cfg.seed, classes)
        if mix - iid > MIX_EXCESS:
            s = self.budget.state_slots
            log.warning("%d partition%s per buffer state (--buffer-partitions %d of %d): the batches' "
                        "label mix is %.2f from the training set's (uniform batches %.2f), which can "
                        "lower accuracy; a --memory-budget lets the split size the states, or raise "
                        "--buffer-partitions", s, "" if s == 1 else "s", self.cfg.buffer_partitions,
                        self.budget.num_parts, mix, iid)

    def plan_edges(self, part_src: np.ndarray, part_dst: np.ndarray, batch_size: int,
                   epoch: int) -> Plan:
        """The global plan of ``M`` training edges (ids ``0..M-1``; ``part_src``/``part_dst``: the
        partitions of their endpoints): a uniform shuffle (``exact``) or edge-bucket states."""
        c, b = self.cfg, self.budget
        m = part_src.shape[0]
        if c.mode == "exact":
            return plan_exact(np.arange(m, dtype=np.int64), batch_size, c.seed, epoch)
        return plan_bucket_states(part_src, part_dst, b.num_parts, b.state_slots, batch_size,
                                  c.seed, epoch)

    def global_batch_size(self) -> int:
        """Seeds per global batch: ``batch_size`` per rank, over every rank of the job (``exact``
        or one machine) or of one machine (states divided among machines, see
        :func:`ooc.data.plan.shard_plan`)."""
        j = self.job
        per = j.local_world_size if (self.cfg.mode != "exact" and j.num_machines > 1) else j.world_size
        return self.cfg.batch_size * per

    # ---------------------------------------------------------------- batches
    def _sample_step(self, plan: Plan, step: int, epoch: int) -> MiniBatch:
        """The training sample of ``plan`` step ``step`` (the look-ahead's, ahead of its use)."""
        return self.sampler.sample(plan.batches[step], batch_key(self.cfg.seed, epoch, plan.key(step)))

    def _missing_rows(self, plan: Plan, step: int, mb: MiniBatch) -> np.ndarray:
        """int64 ids of the rows ``plan`` step ``step`` (sampled as ``mb``) will ask the miss tiers
        for: its input rows outside its state's partitions (exact mode: outside the static slots),
        not in the device cache, and not decoded from PQ codes (a hybrid batch's outer hop)."""
        ids = mb.input_nodes
        k = plan.batch_state[step]
        if self.pq is not None and k >= 0 and mb.blocks:
            ids = ids[:mb.blocks[0].num_dst]
        if self.device_cache is not None:
            ids = ids[self.device_cache.pos_of[ids] < 0]
        if k >= 0:
            held = np.zeros(self.budget.num_parts, dtype=np.bool_)
            held[plan.states[k]] = True
        else:
            held = self.buffer.slot_of >= 0
        return ids[~held[self.part_of(ids)]]

    def iterate(self, plan: Plan, epoch: int, start: int = 0, build: BuildFn | None = None,
                then: Callable[[], Plan | None] | None = None) -> Iterator[Batch]:
        """Steps ``start..`` of ``plan`` (node batches unless ``build`` is given).  ``then`` gives
        the plan of epoch ``epoch + 1`` (None: none follows): a read-ahead samples its first
        window while this epoch ends (:meth:`ooc.data.lookahead.ReadAhead.release`)."""
        self._last_plan = plan
        self._then = then
        it = self.loader.iterate(plan, epoch, start, build or self.node_batch)
        return it if self.readahead is None and self.sampleahead is None else \
            self._then_release(it, plan)

    def _then_release(self, it: Iterator[Batch], plan: Plan) -> Iterator[Batch]:
        """``it``, then the read-ahead's window dropped (its rows are not kept for evaluation; the
        next epoch's first samples are, where ``it`` ran to its end) and the sample-ahead's thread
        stopped."""
        ended = False
        try:
            yield from it
            ended = True
        finally:
            it.close()  # type: ignore[attr-defined]
            if self.readahead is not None:
                self.readahead.release(plan if ended else None)
            if self.sampleahead is not None:
                self.sampleahead.close()

    @property
    def held_between_epochs(self) -> int:
        """Bytes the data path holds through an evaluation for the next epoch (the read-ahead's
        first window of samples)."""
        return self.readahead.held_bytes if self.readahead is not None else 0

    def _tensor(self, rows: np.ndarray, native: bool = False) -> torch.Tensor:
        """``rows`` as a tensor: float32, row-normalised with ``feat_norm='row'``; with ``native``
        and no normalisation, the storage dtype (a float16 store gives half the bytes; the trainer
        converts after the copy to the device)."""
        x = torch.from_numpy(rows)
        if native and self.cfg.feat_norm != "row" and x.is_floating_point():
            return x
        x = x.float()
        if self.cfg.feat_norm == "row":
            s = x.sum(1, keepdim=True)
            x = x / torch.where(s == 0, torch.ones_like(s), s)
        return x

    def features(self, ids: np.ndarray) -> torch.Tensor:
        """float32 feature rows [len(ids), D] of global ``ids``, exact, normalised as in training
        (slots, then CPU cache or disk)."""
        return self._tensor(self.buffer.gather(ids)[0])

    def to_input(self, rows: np.ndarray) -> torch.Tensor:
        """Stored rows as the model's float32 input (normalised as in training)."""
        return self._tensor(rows)

    def _inputs(self, mb: MiniBatch, to_global: np.ndarray | None, slot_local: np.ndarray | None,
                approx_from: int | None, next_use: np.ndarray | None = None
                ) -> tuple[torch.Tensor, Any]:
        """The input rows of ``mb``: device cache hits, the rest through the host tiers (slot-local
        rows in buffer mode); ``next_use``: when each row is asked for next (look-ahead cache)."""
        nodes = mb.input_nodes if to_global is None else to_global
        split = None
        pos = None
        if self.device_cache is not None:
            pos, split = self.device_cache.split(nodes)
        if slot_local is not None:
            rows = self.buffer.gather_local(slot_local if pos is None else slot_local[pos])
        else:
            ids = nodes if pos is None else nodes[pos]
            af = approx_from
            if af is not None and pos is not None:
                af = int(np.searchsorted(pos, af))
            nu = next_use if next_use is None or pos is None else next_use[pos]
            rows = self.buffer.gather(ids, af, nu)[0]
        x = self._tensor(rows, native=True)
        if split is not None and self.device_cache is not None and self.device_cache.pin and x.numel():
            x = x.pin_memory()  # the trainer copies it with non_blocking=True
        return x, split

    def sample(self, seeds: np.ndarray, key: int | np.uint64, state: int,
               exclude: tuple[np.ndarray, np.ndarray] | None = None, approx: bool = False,
               ahead: tuple[MiniBatch, np.ndarray | None] | None = None
               ) -> tuple[MiniBatch, np.ndarray, list, torch.Tensor, Any, float]:
        """Sample around global ``seeds`` and gather the input rows.

        Args:
            seeds: int64 global seed ids (all in the state's partitions in buffer mode).
            key: the batch's random stream key; state: its buffer state (-1: none).
            exclude: ``(src, dst)`` global edges the sampler must not draw.
            approx: outer-hop misses may be decoded from PQ codes (hybrid training batches).
            ahead: the batch's sample made ahead by the look-ahead, with its rows' next uses
                (exact mode, ``--cache-policy belady``; None with ``--read-ahead``): not sampled
                again.

        Returns:
            ``(sample, global output ids, blocks, x, device-cache split, sampling seconds)``.
        """
        t0 = time.perf_counter()
        rg = self.resident
        if rg is not None and state >= 0:
            skey = rg.key
            if self._state_sampler[0] != skey:
                self._state_sampler = (skey, self.sampler.on(rg.indptr, rg.indices, rg.local_to_global))
            smp = self._state_sampler[1]
            ex = None
            if exclude is not None:
                ex = excluded_edge_keys(rg.to_local(exclude[0]), rg.to_local(exclude[1]))
            mb = smp.sample(rg.to_local(seeds), key, exclude=ex)  # type: ignore[union-attr]
            blocks = to_torch_blocks(mb, rg.degrees, rg.loops, rg.local_to_global[mb.nodes])
            t1 = time.perf_counter()
            local_in = mb.input_nodes
            x, split = self._inputs(mb, rg.local_to_global[local_in], rg.to_slot_local(local_in), None)
            out = rg.local_to_global[mb.seeds]
        else:
            ex = None if exclude is None else excluded_edge_keys(exclude[0], exclude[1])
            mb, uses = ahead if ahead is not None else (self.sampler.sample(seeds, key, exclude=ex), None)
            blocks = to_torch_blocks(mb, self.graph.degrees, self.graph.loops)
            t1 = time.perf_counter()
            af = mb.blocks[0].num_dst if (approx and self.pq is not None and state >= 0
                                          and mb.blocks) else None
            x, split = self._inputs(mb, None, None, af, uses)
            out = mb.seeds
        return mb, out, blocks, x, split, t1 - t0

    def node_batch(self, index: int, seeds: np.ndarray, epoch: int, state: int = -1,
                   key_index: int | None = None) -> Batch:
        """One node-classification training batch (its state resident)."""
        t0 = time.perf_counter()
        key = batch_key(self.cfg.seed, epoch, index if key_index is None else key_index)
        ahead = None
        sampled_s = 0.0  # sampling done on the sample-ahead thread, overlapped with this one
        if self.lookahead is not None and self._last_plan is not None:
            ahead = self.lookahead.take(self._last_plan, epoch, index)
        elif self.readahead is not None and self._last_plan is not None:
            ahead = (self.readahead.take(self._last_plan, epoch, index, self._then), None)
        elif self.sampleahead is not None and self._last_plan is not None:
            mb0, sampled_s = self.sampleahead.take(self._last_plan, epoch, index)
            ahead = (mb0, None)
            t0 = time.perf_counter()  # the wait for the sample is the consumer's stall, not gather
        mb, out, blocks, x, split, ts = self.sample(seeds, key, state, approx=True, ahead=ahead)
        y = torch.from_numpy(np.asarray(self.labels[out]).astype(np.int64))
        lw = None if mb.node_weight is None else torch.from_numpy(mb.node_weight.astype(np.float32))
        return Batch(index, out, blocks, x, y, mb.num_sampled_edges, ts + sampled_s,
                     time.perf_counter() - t0 - ts, split, lw)

    def link_batch(self, index: int, edges: np.ndarray, epoch: int, state: int, key_index: int,
                   neg_ratio: int) -> Batch:
        """One link-prediction training batch: the positive ``edges`` (int64 [B, 2] global), then
        ``neg_ratio`` uniform negative tails per positive (over all nodes; over the resident
        partitions' nodes in buffer mode), drawn from a generator keyed by (seed, epoch, batch);
        the MFGs are sampled around the unique endpoints with the positive edges (both
        directions) removed."""
        t0 = time.perf_counter()
        b = edges.shape[0]
        rng = np.random.default_rng([self.cfg.seed, epoch, key_index, 0x4E6])
        rg = self.resident
        if rg is not None and state >= 0:
            pool = rg.local_to_global[rg.local_to_global >= 0]
            neg = pool[rng.integers(0, pool.shape[0], size=b * neg_ratio)]
        else:
            neg = rng.integers(0, self.num_nodes, size=b * neg_ratio, dtype=np.int64)
        nodes = np.concatenate([edges[:, 0], edges[:, 1], neg])
        uniq, inv = np.unique(nodes, return_inverse=True)
        src, dst = edges[:, 0], edges[:, 1]
        excl = (np.concatenate([src, dst]), np.concatenate([dst, src]))
        key = batch_key(self.cfg.seed, epoch, key_index)
        mb, out, blocks, x, split, ts = self.sample(uniq, key, state, exclude=excl)
        inv_t = torch.from_numpy(inv.astype(np.int64))
        pairs = EdgePairs(inv_t[:b], inv_t[b:2 * b], inv_t[:b].repeat_interleave(neg_ratio),
                          inv_t[2 * b:])
        y = torch.zeros(out.shape[0], dtype=torch.int64)
        return Batch(index, out, blocks, x, y, mb.num_sampled_edges, ts, time.perf_counter() - t0 - ts,
                     split, None, pairs)

    def _global_sampler(self) -> Sampler:
        """The training sampler when it can draw from the whole graph, else node-wise sampling with
        the training fanouts (buffer mode over lists on disk: pre-sampling the device cache)."""
        if self.graph.indices is None and self.cfg.sampler != "neighbor":
            return self.eval_sampler(self.cfg.fanouts)
        return self.sampler

    def eval_sampler(self, fanouts: list[int]) -> NeighborSampler:
        """Node-wise sampler over the whole graph with ``fanouts`` (``-1``: full neighbourhoods)."""
        g = self.graph
        return NeighborSampler(g.indptr, g.indices, fanouts, replace=self.cfg.replace, reader=g.reader
                               if g.indices is None else None)

    def eval_builder(self, ids: np.ndarray, batch_size: int, sampler: NeighborSampler
                     ) -> Callable[[int], Batch]:
        """``build(j)``: evaluation batch ``j`` of ``ids`` in batches of ``batch_size`` (keyed by
        its first position, :meth:`eval_batch`).  With a training read-ahead the missing rows of
        ``budget.eval_read_ahead`` batches are read together in its memory (built in order)."""
        starts = list(range(0, ids.shape[0], batch_size))
        w = self.budget.eval_read_ahead if self.readahead is not None else 0
        plan = Plan(batches=[ids[s:s + batch_size] for s in starts], batch_state=[-1] * len(starts),
                    keys=starts)
        self._eval_sampler = sampler
        if w < 2 and self.sampleahead is not None:  # sampled on its own thread, as training is
            if self._eval_sa is not None:
                self._eval_sa.close()
            sa = self._eval_sa = SampleAhead(self._eval_sample, self.sampleahead.depth)

            def build_ahead(j: int) -> Batch:
                mb, seconds = sa.take(plan, -1, j)
                b = self.eval_batch(starts[j], plan.batches[j], sampler, mb, seconds)
                if j == len(starts) - 1:
                    sa.close()
                return b
            return build_ahead
        if w < 2:
            return lambda j: self.eval_batch(starts[j], plan.batches[j], sampler)
        if self._eval_ahead is None:
            self._eval_ahead = ReadAhead(self._eval_sample, self.misses, w, self._missing_rows)
        ra = self._eval_ahead

        def build(j: int) -> Batch:
            b = self.eval_batch(starts[j], plan.batches[j], sampler, ra.take(plan, -1, j))
            if j == len(starts) - 1:
                ra.release()
            return b
        return build

    def _eval_sample(self, plan: Plan, j: int, epoch: int) -> MiniBatch:
        """Evaluation batch ``j`` of ``plan`` sampled by the current evaluation's sampler, keyed by
        its first position (``epoch`` is -1)."""
        assert self._eval_sampler is not None
        return self._eval_sampler.sample(plan.batches[j], batch_key(self.cfg.seed, -1, plan.key(j)))

    def eval_batch(self, index: int, seeds: np.ndarray, sampler: NeighborSampler,
                   sample: MiniBatch | None = None, sampled_s: float = 0.0) -> Batch:
        """An evaluation batch: exact rows, keyed by ``batch_key(seed, -1, index)`` (``sample``:
        that sample, made ahead in ``sampled_s`` seconds)."""
        t0 = time.perf_counter()
        mb = sample if sample is not None else sampler.sample(seeds, batch_key(self.cfg.seed, -1, index))
        blocks = to_torch_blocks(mb, self.graph.degrees, self.graph.loops)
        t1 = time.perf_counter()
        x, split = self._inputs(mb, None, None, None)
        y = torch.from_numpy(np.asarray(self.labels[mb.seeds]).astype(np.int64))
        return Batch(index, mb.seeds, blocks, x, y, mb.num_sampled_edges, t1 - t0 + sampled_s,
                     time.perf_counter() - t1, split)

    def partition_rows(self, p: int, q: int | None = None) -> np.ndarray | None:
        """The stored rows of partitions ``[p, q)`` (default ``q = p + 1``) when none is resident
        (one sequential read, counted in the buffer's bytes), or None when one is (layer-wise
        inference reads partition by partition without moving the buffer)."""
        q = p + 1 if q is None else q
        if (self.buffer.slot_of[p:q] >= 0).any():
            return None
        a, b = int(self.offsets[p]), int(self.offsets[q])
        rows = self.buffer.features.read_rows(a, b)
        self.buffer.stats.bytes_read += int(rows.nbytes)
        return rows

    # ---------------------------------------------------------------- device cache
    def attach_device_cache(self, device: torch.device, plan0: Plan) -> "DeviceFeatureCache | None":
        """Build the ``--device-cache`` (None without one): its hot nodes by out-degree (PaGraph)
        or by pre-sampling ``plan0``'s batches over the whole graph (GNNLab), rows exact and
        normalised as the loader's."""
        if not self.cfg.device_cache:
            return None
        from ooc.features.device import DeviceFeatureCache, access_counts, hot_nodes
        t0 = time.perf_counter()
        n = self.num_nodes
        dim = int(np.prod(self.feat_shape[1:], dtype=np.int64))
        budget = parse_bytes(self.cfg.device_cache)
        keys = [plan0.key(i) for i in range(len(plan0))]
        ids = hot_nodes(self.cfg.device_cache_policy, budget, dim, n, self.graph.indices,
                        lambda: access_counts(self._global_sampler(), plan0.batches, keys,
                                              self.cfg.seed, 0, n))
        cache = DeviceFeatureCache.fill(self.features, ids, n, device, self.cfg.device_cache_policy)
        self.device_cache = cache
        log.info("device cache on %s: %d of %d rows (%.1f MiB, %s) filled in %.2f s", device,
                 ids.shape[0], n, cache.nbytes / 2**20, self.cfg.device_cache_policy,
                 time.perf_counter() - t0)
        return cache

    # ---------------------------------------------------------------- statistics
    def reset_stats(self) -> None:
        """Start the epoch's counters (buffer, tiers, device cache, loader stall)."""
        self.buffer.reset_stats()
        if self.cache is not None:
            self.cache.reset_stats()
        self.misses.reset_stats()
        if self.readahead is not None:
            self.readahead.reset_stats()
        if self.device_cache is not None:
            self.device_cache.reset_stats()
        for r in self.readers:
            r.reset_stats()
        self._requests0 = self._load_requests()
        self.loader.stall_s = 0.0

    def device_cache_stats(self) -> dict:
        """The device cache's counters since the last reset (then reset); {} without one."""
        return self.device_cache.reset_stats() if self.device_cache is not None else {}

    def postfix(self) -> dict:
        """Short live figures for the progress bar."""
        st = self.buffer.stats
        d: dict = {"hit": f"{st.hit_ratio:.3f}", "read": format_bytes(st.bytes_read).replace(" ", "")}
        if self.cache is not None and self.cache.capacity:
            d["cache"] = f"{self.cache.stats.hit_ratio:.3f}"
        if self.cfg.mode != "exact":
            d["swaps"] = st.swaps
        return d

    def bytes_read_so_far(self) -> int:
        """Bytes read since the epoch's counters were last reset (features, partition loads and
        lists), without resetting them: the training share of an epoch, read before evaluation."""
        setup = self._setup.bytes_read if self._setup is not None else 0
        ahead = self.readahead.bytes_read if self.readahead is not None else 0
        return int(self.buffer.stats.bytes_read + setup + ahead
                   + sum(r.counters.bytes_read for r in self.readers))

    def requests_so_far(self) -> int:
        """Read requests issued since the epoch's counters were last reset (feature gathers,
        partition loads with their in-edges, read-ahead windows and lists), without resetting
        them."""
        return int(self._load_requests() - self._requests0
                   + sum(r.counters.requests for r in self.readers))

    def _load_requests(self) -> int:
        """Requests of the feature reader and, in buffer mode with the topology on disk, of the
        partitions' in-edge loads, since the process began."""
        edges = self.buffer.topo_rows
        return int(self.buffer.features.counters.requests
                   + (edges.counters.requests if edges is not None else 0))

    def epoch_stats(self) -> dict:
        """The epoch's counters (then reset): bytes read (features and topology), buffer and cache
        hit ratios, loads and swaps (with the lower bound), rows decoded from PQ codes, I/O wait,
        loader stall, peak RSS."""
        self.buffer.drain()
        st = self.buffer.reset_stats()
        if self._setup is not None:
            for k in ("bytes_read", "bytes_read_loads", "partition_loads", "load_s", "io_wait_s"):
                setattr(st, k, getattr(st, k) + getattr(self._setup, k))
            self._setup = None
        d = st.as_dict()
        topo = sum(r.counters.bytes_read for r in self.readers)
        d["topology_read_requests"] = sum(r.counters.requests for r in self.readers)
        d["topology_hot_lists"] = sum(r.lists_hot for r in self.readers)
        d["topology_disk_lists"] = sum(r.lists_disk for r in self.readers)
        for r in self.readers:
            r.reset_stats()
        d["topology_bytes_read"] = topo
        d["bytes_read"] += topo
        d["approx_rows"] = d["approx_rows"] + self.misses.reset_stats()
        for pre, ra in (("", self.readahead), ("eval_", self._eval_ahead)):
            st = ra.reset_stats() if ra is not None else ReadAhead.no_stats()
            d["bytes_read"] += st["read_ahead_bytes"]
            d.update({pre + k: v for k, v in st.items()})
        if self.cache is not None:
            d.update(self.cache.reset_stats().as_dict())
        else:
            d.update(cache_hits=0, cache_misses=0, cache_hit_ratio=0.0, cache_bytes_read=0)
        plan = self._last_plan
        if self.cfg.mode != "exact":
            d["swaps_lower_bound"] = node_swap_lower_bound(self.budget.num_parts, self.budget.slots)
            d["planned_swaps"] = plan.swaps if plan is not None else 0
            d["buffer_states"] = len(plan.states) if plan is not None else 0
        d["stall_s"] = self.loader.stall_s
        self.loader.stall_s = 0.0
        d["peak_rss_bytes"] = self.rss.peak()
        d["peak_private_bytes"] = self.rss.peak_private()
        d["peak_private_phase"], d["peak_private_at_s"] = self.rss.peak_private_where()
        d["shared_bytes"] = self.shared_bytes if self.job.local_rank == 0 else 0
        release_free_memory()
        self.rss.reset_peak()
        for k in ("bytes_read", "row_hits", "row_misses"):
            self.totals[k] += int(d[k])
        return d

    def release_heap_near_budget(self) -> bool:
        """Return the heap's free pages to the OS (:func:`~ooc.data.budget.release_free_memory`)
        when one more batch in flight (the plan's ``staging``) on top of what this process holds
        beyond the runtime baseline would pass its share of the budget; True when it did.  Called
        between evaluation batches: their arrays differ in size from one batch to the next, so
        freed heap pages are seldom reused whole and would sit on top of the next batch.  With
        room to spare (or no budget) it does nothing: returned pages are faulted in again by the
        next batch (on every batch it cost 0.2-0.3 s of a 0.6-0.8 s evaluation on the 2 M-node
        bench with every partition resident)."""
        b = self.budget
        if b.budget is None:
            return False
        if self.rss.current() - self.rss.baseline + b.staging <= b.budget // max(b.local_world, 1):
            return False
        release_free_memory()
        return True

    def summary(self) -> dict:
        """Run facts for metrics.json."""
        b = self.buffer
        return {"mode": self.cfg.mode, "buffer_bytes": b.nbytes, "buffer_alloc_bytes": b.alloc_bytes,
                "cache_bytes": self.cache.nbytes if self.cache is not None else 0,
                "dataset_feature_bytes": int(self.buffer.features.nbytes),
                "budget": self.budget.as_dict(), "rss_baseline_bytes": self.rss.baseline,
                "direct_io": bool(self.cfg.direct_io), "num_parts": self.budget.num_parts,
                "resident_partitions": self.budget.state_slots,
                "miss_features": "pq" if self.pq is not None else "disk",
                "sample_ahead": self.sampleahead.depth if self.sampleahead is not None else 0,
                "hybrid_mix": self.cfg.hybrid_mix if self.cfg.mode == "hybrid" else 0.0,
                "shared_buffer": b.shared, "buffer_role": b.role,
                "prefetch": self.budget.prefetch, "topology": self.topology,
                "split": self.split.as_dict() if self.split is not None else None}

    def close(self) -> None:
        for sa in (self.sampleahead, self._eval_sa):  # their threads read the topology closed below
            if sa is not None:
                sa.close()
        for ra in (self.readahead, self._eval_ahead):
            if ra is not None:
                ra.release()
        self.buffer.close()
        self.misses.close()
        for r in self.readers:
            r.close()
        if self.buffer.topo_rows is not None:
            self.buffer.topo_rows.close()


def _topology(cfg: "TrainConfig", where: str, ds: Dataset, job: Job,
              override: tuple[np.ndarray, np.ndarray] | None, hot: int = 0,
              hot_bits: np.ndarray | None = None) -> tuple[Graph, list]:
    """The message-passing graph: ``override`` (link prediction's training graph) or the
    dataset's topology in memory (``where`` = ``memory``: one copy per machine), mapped
    (``mmap``), or on disk (``disk``: indptr in memory, lists read page-aligned; ``hot`` bytes of
    the hottest lists held in memory, one copy per machine)."""
    readers: list = []
    if override is not None:
        ip, ix = override
        indptr = shared_array(job, "indptr", ip.shape, ip.dtype, lambda o: o.__setitem__(..., ip))
        indices = shared_array(job, "indices", ix.shape, ix.dtype, lambda o: o.__setitem__(..., ix))
    else:
        rip = ds.raw("indptr")
        indptr = shared_array(job, "indptr", tuple(rip.shape), rip.dtype,
                              lambda o: rip.read(0, rip.shape[0], o))
        indices = None
        if where == "memory":
            rix = ds.raw("indices")
            indices = shared_array(job, "indices", tuple(rix.shape), rix.dtype,
                                   lambda o: rix.read(0, rix.shape[0], o))
        elif where == "mmap":
            indices = ds.raw("indices").mmap()
    reader = None
    if indices is None:
        reader = list_reader(ds, indptr, cfg)
        if hot:  # the hottest lists in memory, one copy per machine
            fo = -1 if min(cfg.fanouts) < 0 else max(cfg.fanouts)
            reader.hot = HotLists.build(reader, hot, fo, lambda tag, shape, dtype, fill:
                                        shared_array(job, tag, shape, dtype, fill), bits=hot_bits)
            log.info("hot topology: lists of %d nodes (%d edges) in memory, %s of %s",
                     reader.hot.num_nodes, reader.hot.ids.shape[0], format_bytes(reader.hot.nbytes),
                     format_bytes(hot))
        readers.append(reader)
    degrees = shared_array(job, "degrees", (indptr.shape[0] - 1,),
                           degree_dtype_for(int(indptr[-1]) if indptr.shape[0] else 0),
                           lambda o: degrees_into(indptr, o))
    loops = None
    if needs_loop_counts(cfg.model):
        loops = shared_array(job, "loops", (indptr.shape[0] - 1,), np.int32,
                             lambda o: _loop_counts(indptr, indices, ds, o))
    return Graph(indptr, indices, degrees, reader, loops), readers


def _loop_counts(indptr: np.ndarray, indices: np.ndarray | None, ds: Dataset, out: np.ndarray,
                 block_edges: int = 1 << 24) -> None:
    """Self-loops of every node into ``out`` (int32 [N]): one pass over the edges, in node blocks
    of about ``block_edges`` edges read from disk when ``indices`` is not in memory."""
    if indices is not None:
        out[:] = self_loop_counts(indptr, indices)
        return
    raw = ds.raw("indices")
    n = indptr.shape[0] - 1
    a = 0
    while a < n:
        b = int(np.searchsorted(indptr, indptr[a] + block_edges, side="right")) - 1
        b = min(max(b, a + 1), n)
        ea, eb = int(indptr[a]), int(indptr[b])
        ip = indptr[a:b + 1] - ea
        idx = raw.read(ea, eb) if eb > ea else np.empty(0, dtype=raw.dtype)
        out[a:b] = self_loop_counts(ip, idx, a)
        a = b


def _check_featureless(cfg: "TrainConfig", ds: Dataset) -> None:
    """A dataset without ``nodes/features`` trains on learnable node embeddings only.

    Raises:
        ValueError: no ``--embedding``, or an option that needs stored feature rows.
    """
    if not cfg.embedding:
        raise ValueError(f"{ds.path}: the dataset has no node features (no array nodes/features); "
                         "train learnable node embeddings as the input with --embedding D (e.g. "
                         "--embedding 64, config model.embedding), or convert it again with "
                         "--features structural")
    for opt, on in (("--device-cache", bool(cfg.device_cache)),
                    ("--miss-features pq", cfg.miss_features == "pq")):
        if on:
            raise ValueError(f"{opt}: {ds.path} has no node features to cache or compress "
                             "(its input is the --embedding table)")


@dataclass
class MachinePlan:
    """What :func:`plan_machine` decided for one machine.

    Attributes:
        plan: the :class:`BudgetPlan`.
        pq_bytes: bytes of the PQ codes it holds (0: misses read from disk).
        replan: the plan of the same split without PQ codes (everything resident: nothing to
            decode).
        topology: ``memory``, ``mmap`` or ``disk`` (``--topology auto`` resolved).
        split: the automatic split's choice and its predicted reads, or None when the
            configuration left nothing to choose.
        extents: the batch extents the batches in flight were sized with (None: no budget).
        hot_topology: bytes of hot lists to hold with the topology on disk (given, or chosen by
            the split for ``--hot-topology auto``; 0: none); hot_bits: the split's bitmap of them.
    """

    @property
    def record(self) -> dict | None:
        """What a resumed run needs to plan this again without probing (``plan_machine(reuse=)``):
        the probed extents and the split's choice, plain values and tensors (None: nothing was
        probed)."""
        if self.extents is None:
            return None
        return {"extents": self.extents.record(),
                "split": self.split.record() if self.split is not None else None}

    plan: BudgetPlan
    pq_bytes: int
    replan: Callable[[], BudgetPlan]
    topology: str
    split: SplitChoice | None = None
    extents: Extents | None = None
    hot_topology: int = 0
    hot_bits: np.ndarray | None = None


def _read_ahead(cfg: "TrainConfig", task: str, ds: Dataset) -> int | None:
    """``plan_budget``'s ``read_ahead``: the batches given, None for ``auto`` where it applies
    (exact mode, node task, features, no look-ahead cache policy), else 0."""
    n = read_ahead_batches(cfg.read_ahead)
    if n is not None:
        return n if task == "node" and ds.has("features") else 0
    if cfg.mode == "exact" and task == "node" and ds.has("features") \
            and cfg.cache_policy not in LOOKAHEAD_POLICIES:
        return None
    return 0


def _sample_ahead(cfg: "TrainConfig", task: str) -> int:
    """``plan_budget``'s ``sample_ahead``: the batches given, 1 for ``auto`` where it applies (a
    node task in exact or hybrid mode without a look-ahead cache policy or a given read-ahead;
    the budget drops it where it plans a read-ahead window), else 0 (:func:`TrainConfig.validate`
    refuses a count given where it cannot apply)."""
    n = sample_ahead_batches(cfg.sample_ahead)
    applies = task == "node" and cfg.mode in ("exact", "hybrid") \
        and cfg.cache_policy not in LOOKAHEAD_POLICIES and not read_ahead_batches(cfg.read_ahead)
    return (1 if n is None else n) if applies else 0


def _disk_topology_allowed(cfg: "TrainConfig", task: str, topology_edges: int | None) -> bool:
    """Whether ``--topology auto`` may keep the lists on disk for this run."""
    if task == "link" or topology_edges is not None:
        return False
    try:
        check_sampler(cfg.sampler, cfg.mode, "disk", task)
    except ValueError:
        return False
    return True


def plan_machine(cfg: "TrainConfig", ds: Dataset, offsets: np.ndarray, local_world: int = 1,
                 device_type: str = "cpu", task: str = "node", topology_edges: int | None = None,
                 task_bytes: int | None = None, reuse: dict | None = None,
                 world_size: int | None = None) -> MachinePlan:
    """The budget plan of one machine running ``local_world`` ranks of ``cfg`` on ``device_type``
    devices.  The launcher of a data-parallel job calls it before starting any process (a budget
    too small is refused there, with its reason); every rank calls it again (the probe is keyed by
    the seed, so all of them choose the same split).

    Under a budget, the batches in flight are sized by a probe of a few batches
    (:func:`ooc.data.autoplan.probe_extents`), and whatever the configuration leaves open --
    ``--topology auto`` (memory or disk), ``--miss-features auto`` and, in hybrid mode without
    ``--cache-size``, the row cache's share -- is chosen by
    :func:`ooc.data.autoplan.choose_split`.  Without a budget ``auto`` is ``memory``.

    ``task_bytes``: host memory of the task's own arrays per rank (link prediction's split; default
    for ``link``: 16 B per stored edge, a graph stored in both directions).

    ``reuse``: an interrupted run's :attr:`MachinePlan.record` (from its checkpoint): its probed
    extents and split are planned again as they were, without probing (the probe is keyed by the
    seed, so it would choose them again; at 100 M nodes it reads ~10 GB of lists).

    With ``--eval-mode auto`` under a budget, where evaluation could run layer-wise
    (:func:`ooc.config.auto_layerwise_eval`; ``world_size``: ranks of the job, default
    ``local_world``), the plan is made without sampled evaluation batches
    (:attr:`BudgetPlan.eval_batches` False: the run evaluates layer-wise, as it does out of core),
    and planned again with them only where it holds every partition and still does with them
    (sampled evaluation, as resident runs evaluate).  Otherwise, where the sampled evaluation
    batches are what the budget cannot hold, the run evaluates layer-wise instead of being refused
    in the same way.

    Raises:
        ValueError: a budget that cannot hold the mode's minimum (naming every part).
        DatasetError: ``--miss-features pq`` without codes.
    """
    if task_bytes is None:
        task_bytes = 16 * ds.num_edges if task == "link" else 0
    budget_bytes = parse_bytes(cfg.memory_budget) if cfg.memory_budget else None
    cache_size = parse_bytes(cfg.cache_size) if cfg.cache_size else None
    pq_need = 0
    # --miss-features auto (the default) weighs the codes in hybrid mode only, where they exist
    if cfg.miss_features == "pq" or (cfg.miss_features == "auto" and cfg.mode == "hybrid"
                                     and ds.has("features")):
        from ooc.features.pq import open_compressed, pq_bytes
        pq_need = pq_bytes(ds)
        if not pq_need and cfg.miss_features == "pq":
            open_compressed(ds)  # raises the "run ooc compress" error
    # a device cache kept in host memory (CPU runs) is host memory of every rank
    host_cache = parse_bytes(cfg.device_cache) if cfg.device_cache and device_type == "cpu" else 0
    host_cache += 4 * ds.num_nodes if cfg.device_cache else 0  # node -> row map
    # a node-embedding table trained on the CPU is host memory of every rank (its replica)
    emb = embedding_bytes(ds.num_nodes, cfg.embedding, cfg.optimizer) \
        if cfg.embedding and device_type == "cpu" else 0
    if cfg.embedding and not emb:
        log.info("node embeddings %d x %d on %s: %s of device memory with %s (not host memory)",
                 ds.num_nodes, cfg.embedding, device_type,
                 format_bytes(embedding_bytes(ds.num_nodes, cfg.embedding, cfg.optimizer)),
                 cfg.optimizer)
    # one list sampler for the probes of the batch extents and of the split
    reuse = reuse if budget_bytes is not None else None
    probe = ListProbe(ds, ds.indptr, cfg) \
        if budget_bytes is not None and reuse is None else None
    try:
        if reuse is not None:
            extents: Extents | None = Extents.from_record(reuse["extents"])
        else:
            extents = probe_extents(cfg, ds, probe) if probe is not None else None
        kw: dict[str, Any] = dict(local_world=local_world, share=cfg.shared_buffer,
                                  per_rank_extra=host_cache + int(task_bytes),
                                  min_state=2 if task == "link" else 1,
                                  embedding=emb, embedding_dim=cfg.embedding,
                                  topology_edges=topology_edges, lookahead=cfg.lookahead,
                                  read_ahead=_read_ahead(cfg, task, ds),
                                  sample_ahead=_sample_ahead(cfg, task),
                                  train_batches=-(-ds.split("train").shape[0] // cfg.batch_size),
                                  loop_counts=needs_loop_counts(cfg.model), extents=extents)
        # at most every list: bitmap and ranks (16 B per 64 nodes), offsets, the lists themselves
        n, item = ds.num_nodes, ds.raw("indices").dtype.itemsize
        whole = HotLists.fixed_bytes(n) + HotLists.PER_NODE * n + ds.num_edges * item
        auto_hot = cfg.hot_topology == "auto"
        hot = 0 if auto_hot or not cfg.hot_topology else min(parse_bytes(cfg.hot_topology), whole)

        # layer-wise evaluation (asked for) runs no evaluation batches: none are planned; it works
        # in the parts of the budget idle while it runs
        eval_bs = 0 if task == "node" and cfg.eval_mode == "layerwise" else cfg.eval_batch_size
        # --eval-mode auto evaluates layer-wise out of core (node_eval_mode): sampled evaluation
        # batches are planned only where the plan holds every partition (below), else their bytes
        # would idle through training and a larger budget could plan fewer slots than a smaller one
        auto_layerwise = bool(task == "node" and budget_bytes is not None and eval_bs
                              and auto_layerwise_eval(cfg, world_size or local_world))
        if auto_layerwise:
            eval_bs = 0

        def plan_with(topology: str, pq: bool, cache: int | None, hot_bytes: int = hot) -> BudgetPlan:
            return plan_budget(cfg.mode, budget_bytes, ds, offsets, topology, cfg.batch_size,
                               cfg.fanouts, cfg.prefetch, cfg.hidden, cfg.buffer_partitions,
                               cache if cache is not None else cache_size, cfg.cache_policy,
                               cfg.ordering, eval_bs, cfg.eval_fanouts,
                               compressed=pq_need if pq else 0,
                               hot_topology=hot_bytes if topology == "disk" else 0, **kw)

        if cfg.topology != "auto":
            topologies = [cfg.topology]
        elif budget_bytes is None or not _disk_topology_allowed(cfg, task, topology_edges):
            topologies = ["memory"]
        else:
            topologies = ["memory", "disk"]
        # auto: the split weighs the codes (under a budget; without one, rows from disk)
        pqs = [True] if cfg.miss_features == "pq" else [False, True] if cfg.miss_features == "auto" \
            and pq_need and budget_bytes is not None else [False]
        fractions: list[float | None] = [None]
        if (budget_bytes is not None and cfg.mode == "hybrid" and cfg.cache_policy != "none"
                and cache_size is None
                and (cfg.topology == "auto" or (cfg.miss_features == "auto" and pq_need))
                and ds.has("features")):
            fractions = [0.0, 0.25, 0.5]
        # --hot-topology auto: the split tries hot sets of these shares of the whole topology
        hots = [hot]
        if auto_hot and budget_bytes is not None and "disk" in topologies and ds.num_edges:
            hots = [0] + [int(whole * f) for f in AUTO_HOT_SHARES]
        split = None
        chosen = reuse.get("split") if reuse is not None else None
        while True:
            try:
                if chosen is not None:  # the interrupted run's split, planned again
                    topology, pq, size = chosen["topology"], bool(chosen["pq"]), chosen["cache_size"]
                    hot = int(chosen["hot_topology"])
                    plan = plan_with(topology, pq, size, hot)
                    split = SplitChoice(topology, pq, size, plan, ReadCost(*chosen["predicted"]),
                                        hot_topology=hot, hot_bits=SplitChoice.bits_of(chosen),
                                        reused=True)
                elif len(topologies) * len(pqs) * len(fractions) * len(hots) == 1:
                    topology, pq, size = topologies[0], pqs[0], None
                    plan = plan_with(topology, pq, None)
                else:
                    split = choose_split(cfg, ds, offsets, plan_with, topologies, pqs, fractions,
                                         probe, hot_sizes=hots)
                    topology, pq, size, plan = split.topology, split.pq, split.cache_size, split.plan
                    hot = split.hot_topology
                break
            except BudgetTooSmall as e:
                # --eval-mode auto: where the sampled evaluation batches are what does not fit,
                # evaluate layer-wise (it needs none) rather than refuse the run
                if not (e.eval_bound and eval_bs and task == "node"
                        and auto_layerwise_eval(cfg, world_size or local_world)):
                    raise
                log.info("evaluation batches of %d seeds do not fit the budget beside training: "
                         "evaluating layer-wise", eval_bs)
                eval_bs = 0
        if auto_layerwise and plan.slots >= plan.num_parts:
            # everything resident: auto evaluates sampled batches, planned if the plan stays resident
            eval_bs = cfg.eval_batch_size
            try:
                sampled = plan_with(topology, pq, size, hot)
            except BudgetTooSmall:
                sampled = None
            if sampled is not None and sampled.slots >= sampled.num_parts:
                plan = sampled
                if split is not None:
                    split.plan = sampled
            else:
                eval_bs = 0
        if budget_bytes is not None and cfg.buffer_partitions != type(cfg).buffer_partitions:
            log.warning("--buffer-partitions %d not used: under --memory-budget the budget split "
                        "sizes the partition slots (%d slot%s%s)", cfg.buffer_partitions, plan.slots,
                        "" if plan.slots == 1 else "s",
                        "" if cfg.mode == "exact" else
                        f", {plan.state_slots} partitions per buffer state")
        if hot and topology != "disk":
            log.warning("--hot-topology %s not used: %s", cfg.hot_topology,
                        "the budget split keeps the whole topology in memory" if budget_bytes is not None
                        else "without --memory-budget, --topology auto keeps the whole topology in memory")
            hot = 0
        if cfg.miss_features == "auto" and cfg.mode == "hybrid" and not pq_need:
            log.info("--miss-features auto: %s has no PQ codes (`ooc compress` writes them); "
                     "the rows a batch misses are read from disk", ds.path)
        return MachinePlan(plan, pq_need if pq else 0,
                           lambda: plan_with(topology, False, size, hot if topology == "disk" else 0),
                           topology, split, extents, hot if topology == "disk" else 0,
                           split.hot_bits if split is not None and topology == "disk" else None)
    finally:
        if probe is not None:
            probe.close()


def build_data_path(cfg: "TrainConfig", ds: Dataset, job: Job | None = None,
                    rss: RssMonitor | None = None, task: str = "node",
                    topology: tuple[np.ndarray, np.ndarray] | None = None,
                    train_ids: np.ndarray | None = None, task_bytes: int | None = None,
                    reuse: dict | None = None) -> DataPath:
    """Build the data path of ``cfg`` under ``cfg.memory_budget`` (the one factory; every rank of
    a job calls it at the same point).

    Args:
        cfg: the run configuration (validated).
        ds: the dataset; job: this process's place in the job (default: one process).
        rss: the RSS monitor whose baseline is the runtime's overhead.
        task: ``node`` or ``link`` (edge-bucket states need 2 partitions per state).
        topology: ``(indptr, indices)`` to sample from instead of the dataset's (link prediction's
            training graph).
        train_ids: the training nodes (GraphSAINT's roots; default the dataset's ``train`` split).
        task_bytes: host memory of the task's own arrays per rank (see :func:`plan_machine`).
        reuse: a resumed run's plan record (:attr:`DataPath.plan_record` of the interrupted run,
            from its checkpoint): planned again without probing.

    Raises:
        ValueError: bad options, or a budget that cannot hold the mode's minimum.
        DatasetError: ``--miss-features pq`` without codes.
    """
    cfg.validate()
    job = job or SingleProcess()
    rss = rss or RssMonitor()
    has_feats = ds.has("features")
    if not has_feats:
        _check_featureless(cfg, ds)
    offsets = partition_offsets(cfg, ds)
    mp = plan_machine(cfg, ds, offsets, job.local_world_size, job.device.type, task,
                      int(topology[1].shape[0]) if topology is not None else None, task_bytes,
                      reuse=reuse, world_size=job.world_size)
    plan, pq_need, replan = mp.plan, mp.pq_bytes, mp.replan
    # the planner's in-memory indptr: the topology below holds its own copy (counted in the plan)
    ds.release("indptr")
    if mp.split is not None:
        log.info("budget split: %s", mp.split.describe())
    approx: "CompressedRows | None" = None
    if pq_need and plan.slots >= plan.num_parts:  # everything resident: nothing to decode
        plan = replan()
        log.info("every partition is resident: PQ codes not loaded")
    elif pq_need:
        from ooc.features.pq import open_compressed
        approx = open_compressed(ds, lambda shape, dtype, fill: shared_array(job, "pq", shape, dtype,
                                                                               fill))
    # heap retention within a small budget (each local rank has its own heap)
    tune_allocator(mmap_threshold_for(plan.budget // max(job.local_world_size, 1)
                                      if plan.budget else None))
    if plan.prefetch < cfg.prefetch:
        log.info("prefetch depth %d -> %d %s", cfg.prefetch, plan.prefetch,
                 f"for a read-ahead window of {plan.read_ahead} batches (fewer window reads)"
                 if plan.read_ahead and cfg.read_ahead == "auto" else
                 "to fit the batches in flight into the budget")
    graph, readers = _topology(cfg, mp.topology, ds, job, topology, mp.hot_topology, mp.hot_bits)
    labels = ds.labels if ds.has("labels") else np.zeros(ds.num_nodes, dtype=np.int32)
    feats: "DiskRows | NoFeatures" = NoFeatures(ds.num_nodes)
    if has_feats:
        feats = feature_rows(ds, cfg)
    cache = None
    rows_each = plan.cache_rows // max(job.local_world_size, 1)  # the ranks split the cache
    if rows_each > 0 and cfg.cache_policy != "none" and has_feats:
        cache = CachedFeature(feats, rows_each, cfg.cache_policy)
    if cache is None and cfg.cache_policy in LOOKAHEAD_POLICIES and has_feats:
        log.warning("--cache-policy %s: no CPU row cache to manage (%s), so nothing is sampled ahead; "
                    "give --memory-budget or --cache-size", cfg.cache_policy,
                    "the budget leaves it no room" if plan.budget else "no --memory-budget or --cache-size")
    misses = MissRows(feats, cache, approx)
    topo_rows = None
    if cfg.mode == "buffer" and graph.indices is None:
        topo_rows = DiskRows(ds.raw("indices"), direct=cfg.direct_io,
                             threads=max(1, min(4, cfg.io_depth)), aio_depth=0)
    buffer = make_buffer(job, feats, offsets, plan.slots, misses, io_threads=cfg.io_threads,
                         topo_rows=topo_rows, indptr=graph.indptr if topo_rows is not None else None,
                         share=cfg.shared_buffer)
    ids = ds.split("train") if train_ids is None else train_ids
    cluster_of = None
    if cfg.sampler == "cluster" and cfg.mode != "exact":  # clusters inside partitions
        cluster_of = partition_clusters(graph.indptr, graph.indices, offsets,
                                        min(cfg.num_clusters, graph.num_nodes), cfg.seed)
    indices = graph.indices
    if indices is None and cfg.mode == "buffer" and cfg.sampler in ("labor", "ladies"):
        # buffer mode samples only the states' resident subgraphs (Sampler.on); the whole graph's
        # lists stay on disk and this sampler is never asked to draw from them
        indices = np.empty(0, dtype=np.int64)
    sampler = make_sampler(cfg.sampler, graph.indptr, indices, cfg.fanouts, train_ids=ids,
                           replace=cfg.replace, batch_size=cfg.batch_size, layer_size=cfg.layer_size,
                           num_clusters=cfg.num_clusters, clusters_per_batch=cfg.clusters_per_batch,
                           walk_length=cfg.walk_length, seed=cfg.seed, reader=graph.reader,
                           cluster_of=cluster_of)
    log.info("mode %s: %d of %d partitions resident (%d per state), slot %s, cache %d rows (%s), "
             "budget %s%s", cfg.mode, plan.slots, plan.num_parts, plan.state_slots,
             format_bytes(plan.slot), plan.cache_rows, format_bytes(plan.cache),
             format_bytes(plan.budget) if plan.budget else "none",
             f" for {job.local_world_size} local ranks" if job.local_world_size > 1 else "")
    data = DataPath(cfg, ds, job, graph, labels, offsets, plan, buffer, misses, sampler, readers, rss)
    data.topology, data.split = mp.topology, mp.split
    data.plan_record = mp.record
    if plan.read_ahead and task == "node" and has_feats:  # (none planned when all is resident)
        data.readahead = ReadAhead(data._sample_step, misses, plan.read_ahead, data._missing_rows)
    if job.local_world_size > 1:  # what the machine's ranks hold once
        data.shared_bytes = (buffer.alloc_bytes if buffer.shared else 0) + graph.indptr.nbytes \
            + graph.degrees.nbytes + (graph.loops.nbytes if graph.loops is not None else 0) \
            + (graph.indices.nbytes if mp.topology == "memory" or
                                      topology is not None else 0) \
            + (graph.reader.hot.nbytes if graph.reader is not None and graph.reader.hot is not None
               else 0) \
            + (approx.codes.nbytes if approx is not None else 0)
    return data
