"""Epoch plans and the prefetching mini-batch loader.

The loader runs the pipeline ``sample -> require partitions -> gather features -> tensors`` on a
background thread, ``prefetch`` batches ahead of the trainer (the Numba kernels and ``preadv`` release
the GIL, so sampling and I/O overlap with the model).  Every batch's random stream is keyed by
(seed, epoch, batch index), so batches do not depend on threads, prefetch depth or buffer size.
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import numpy as np
import torch

from ooc.buffer import PartitionBuffer
from ooc.kernels.rng import batch_key
from ooc.kernels.sampling import sample_blocks
from ooc.models import TorchBlock, to_torch_blocks

__all__ = ["Batch", "EpochPlan", "plan_epoch", "plan_from_batches", "prefetched", "BatchLoader"]

T = TypeVar("T")


@dataclass
class EpochPlan:
    """The batches of one epoch and the partition schedule they imply.

    Attributes:
        batches: list of int64 seed arrays.
        batch_parts: per batch, the partitions of its seeds, most seeds first.
        schedule: the sequence of distinct partitions the epoch visits, in order.
        batch_pos: per batch, index in ``schedule`` just after its partitions.
    """

    batches: list[np.ndarray]
    batch_parts: list[list[int]]
    schedule: list[int]
    batch_pos: list[int]


def plan_epoch(seeds: np.ndarray, part_of: np.ndarray, num_parts: int, batch_size: int, seed: int,
               epoch: int, shuffle: bool = True) -> EpochPlan:
    """Order seeds partition by partition (random partition order, random order within one) and cut
    them into batches of ``batch_size`` (the last may be smaller).

    The plan depends on (seeds, partitioning, batch size, seed, epoch) only -- not on the buffer
    capacity -- so any buffer size trains on identical batches.

    Args:
        seeds: int64 [S] training node ids; part_of: int64 [S] their partitions.
    """
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    if shuffle:
        order = rng.permutation(num_parts)
        perm = rng.permutation(seeds.shape[0])
    else:
        order = np.arange(num_parts)
        perm = np.arange(seeds.shape[0])
    rank = np.empty(num_parts, dtype=np.int64)
    rank[order] = np.arange(num_parts)
    s = seeds[perm]
    p = part_of[perm]
    o = np.argsort(rank[p], kind="stable")
    s, p = s[o], p[o]
    return plan_from_batches([s[i:i + batch_size] for i in range(0, s.shape[0], batch_size)],
                             [p[i:i + batch_size] for i in range(0, s.shape[0], batch_size)])


def plan_from_batches(batches: list[np.ndarray], parts_of: list[np.ndarray]) -> EpochPlan:
    """An :class:`EpochPlan` for given seed batches (``parts_of[i]``: partition of each seed of batch i).

    Used by :func:`plan_epoch` and for samplers with their own batches (ClusterGCN, GraphSAINT).
    """
    batch_parts, schedule, batch_pos = [], [], []
    out = []
    for bs, bp in zip(batches, parts_of):
        parts, counts = np.unique(bp, return_counts=True)
        ranked = [int(x) for x in parts[np.argsort(-counts, kind="stable")]]
        for q in [int(x) for x in dict.fromkeys(bp.tolist())]:
            if not schedule or schedule[-1] != q:
                schedule.append(q)
        out.append(bs)
        batch_parts.append(ranked)
        batch_pos.append(len(schedule))
    return EpochPlan(out, batch_parts, schedule, batch_pos)


@dataclass
class Batch:
    """One training step's data.

    Attributes:
        index: batch index in the epoch; seeds: int64 [B];
        blocks: MFGs, input layer first; x: [num_input, D], float32 or the storage's float dtype
            (the engine keeps float16 rows until use; consumers call ``.float()``); y: int64 [B];
        num_edges: sampled edges; sample_s / gather_s: producer time spent sampling / gathering.
        x_cache: with a device feature cache, a :class:`~ooc.features.device.CacheSplit` and ``x``
            holds only the rows not in the cache (``x_cache.assemble(x, device)`` gives all rows).
        loss_weight: optional float32 [B] per-seed loss weights (GraphSAINT normalisation; the loss
            is then ``sum(weight * per-seed loss)``); ``None`` = mean loss.
    """

    index: int
    seeds: np.ndarray
    blocks: list[TorchBlock]
    x: torch.Tensor
    y: torch.Tensor
    num_edges: int
    sample_s: float
    gather_s: float
    x_cache: Any = None
    loss_weight: torch.Tensor | None = None

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of ``logits`` [B, C] against ``y``: the mean, or the weighted sum."""
        if self.loss_weight is None:
            return torch.nn.functional.cross_entropy(logits, self.y)
        per = torch.nn.functional.cross_entropy(logits, self.y, reduction="none")
        return (per * self.loss_weight).sum()


def prefetched(build: Callable[[int], T], start: int, stop: int, depth: int,
               on_wait: Callable[[float], None]) -> Iterator[T]:
    """Yield ``build(i)`` for ``i`` in ``start..stop-1`` in order, built ``depth`` ahead on a
    background thread (``depth <= 0``: built in the caller's thread).

    ``on_wait(seconds)`` receives the time the consumer waited for each item (the I/O + sampling
    stall).  An exception raised by ``build`` is re-raised in the consumer; closing the generator
    stops the producer thread and drops the items it built ahead.  Used by
    :meth:`BatchLoader.iterate` and :meth:`ooc.engine.EngineLoader.iterate`.
    """
    if depth <= 0:
        for i in range(start, stop):
            t = time.perf_counter()
            item = build(i)
            on_wait(time.perf_counter() - t)
            yield item
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    halt = threading.Event()

    def produce() -> None:
        try:
            for i in range(start, stop):
                if halt.is_set():
                    return
                item = build(i)
                while not halt.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
            q.put(None)
        except BaseException as e:  # forwarded to the consumer
            q.put(e)

    th = threading.Thread(target=produce, name="ooc-loader", daemon=True)
    th.start()
    try:
        while True:
            t = time.perf_counter()
            got = q.get()
            on_wait(time.perf_counter() - t)
            if got is None:
                break
            if isinstance(got, BaseException):
                raise got
            yield got
    finally:
        halt.set()
        while th.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                pass
            th.join(timeout=0.05)


class BatchLoader:
    """Build batches on a background thread.

    Args:
        indptr, indices: CSC topology (in memory or mapped).
        degrees: int64 [N] in-degrees.
        labels: int [N].
        buffer: the partition buffer serving feature rows.
        fanouts: per-layer fanouts, output layer first.
        seed: run seed; replace: sample with replacement.
        prefetch: batches built ahead (0 = build synchronously in the caller's thread).
        feat_norm: ``row`` divides each feature row by its sum (Kipf & Welling's preprocessing).
        sampler: a :class:`ooc.sampling.samplers.Sampler` for training batches (default: node-wise uniform
            with ``fanouts``); evaluation batches (explicit ``fanouts``) always use all neighbours.
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, degrees: np.ndarray,
                 labels: np.ndarray, buffer: PartitionBuffer, fanouts: list[int], seed: int,
                 replace: bool = False, prefetch: int = 2, feat_norm: str = "none",
                 sampler: object | None = None) -> None:
        self.indptr = indptr
        self.indices = indices
        self.degrees = degrees
        self.labels = labels
        self.buffer = buffer
        self.fanouts = list(fanouts)
        self.seed = seed
        self.replace = replace
        self.prefetch = prefetch
        self.feat_norm = feat_norm
        self.sampler = sampler
        self.stall_s = 0.0
        self.device_cache: Any = None  # ooc.features.device.DeviceFeatureCache, attached after build

    def features(self, ids: np.ndarray) -> torch.Tensor:
        """float32 [len(ids), D] input features of ``ids`` through the buffer (normalised as
        configured); used by layer-wise inference."""
        return self._features(ids)

    def plan_epoch(self, seeds: np.ndarray, part_of: np.ndarray, num_parts: int, batch_size: int,
                   seed: int, epoch: int) -> EpochPlan:
        """The epoch's plan: the sampler's own batches (subgraph samplers) or :func:`plan_epoch`."""
        own = None if self.sampler is None else self.sampler.plan_batches(seeds, batch_size, seed,
                                                                          epoch)
        if own is None:
            return plan_epoch(seeds, part_of, num_parts, batch_size, seed, epoch)
        return plan_from_batches(own, [self.buffer.part_of(b) for b in own])

    def _features(self, ids: np.ndarray) -> torch.Tensor:
        return self.normalise(torch.from_numpy(self.buffer.gather(ids)).float())

    def host_features(self, ids: np.ndarray) -> torch.Tensor:
        """float32 rows of ``ids`` from the host data path (buffer / disk), never the device cache."""
        return self._features(ids)

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """Apply ``feat_norm`` to float32 rows [n, D] (row by row, so any subset of rows gives the
        same values as the whole)."""
        if self.feat_norm == "row":
            s = x.sum(1, keepdim=True)
            x = x / torch.where(s == 0, torch.ones_like(s), s)
        return x

    def make_batch(self, index: int, seeds: np.ndarray, epoch: int, fanouts: list[int] | None = None,
                   parts: list[int] | None = None, upcoming: list[int] | None = None) -> Batch:
        """Sample and gather one batch (in the calling thread)."""
        t0 = time.perf_counter()
        key = batch_key(self.seed, epoch, index)
        if fanouts is None and self.sampler is not None:
            sg = self.sampler.sample(seeds, key)
        else:
            sg = sample_blocks(self.indptr, self.indices, seeds, fanouts or self.fanouts, key,
                               self.replace)
        blocks = to_torch_blocks(sg, self.degrees)
        t1 = time.perf_counter()
        if parts is not None:
            self.buffer.require(parts, upcoming)
        if self.device_cache is not None:
            x, x_cache = self.device_cache.split_gather(self, sg.input_nodes)
        else:
            x, x_cache = self._features(sg.input_nodes), None
        y = torch.from_numpy(self.labels[sg.seeds].astype(np.int64))
        t2 = time.perf_counter()
        lw = None if sg.node_weight is None else torch.from_numpy(sg.node_weight.astype(np.float32))
        return Batch(index, sg.seeds, blocks, x, y, sg.num_sampled_edges, t1 - t0, t2 - t1, x_cache, lw)

    def iterate(self, plan: EpochPlan, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Yield the plan's batches in order, built ``prefetch`` ahead on a background thread.

        ``start`` skips the first batches (resuming mid-epoch: batch ``i`` is the same whatever the
        start, since its random stream is keyed by its index).  ``stall_s`` accumulates the time the
        consumer waited for a batch (I/O + sampling stall).
        """
        cap = self.buffer.capacity

        def build(i: int) -> Batch:
            pos = plan.batch_pos[i]
            upcoming = plan.schedule[pos:pos + 2 * cap]
            return self.make_batch(i, plan.batches[i], epoch, parts=plan.batch_parts[i],
                                   upcoming=upcoming)

        with closing(prefetched(build, start, len(plan.batches), self.prefetch,
                                self._add_stall)) as it:
            yield from it

    def _add_stall(self, seconds: float) -> None:
        self.stall_s += seconds
