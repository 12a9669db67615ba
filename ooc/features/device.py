"""Per-device hot-feature cache: a static set of feature rows kept on the training device.

Mini-batch GNN training spends most of its data movement on the input-layer features of the sampled
neighbourhood, and a few nodes (high out-degree hubs) are sampled over and over.  A static cache of
their rows on the device turns those host->device copies into device-local gathers:

- ``degree`` policy (PaGraph, Lin et al., SoCC'20): cache the nodes with the highest out-degree --
  in-neighbour sampling reaches node ``u`` through its out-edges, so out-degree predicts access.
- ``presample`` policy (GNNLab, Yang et al., EuroSys'22, "PreSC"): run the sampler over one epoch
  of this rank's batches without touching features, count how often each node is an input node, and
  cache the most accessed.  With ooc's counter-based sampler the counts are those of epoch 0 exactly.

The cache is sized in bytes (``--device-cache 8GB``): rows are stored as the float32 rows the model
consumes (after ``--feat-norm``), so ``budget // (4 * D)`` rows fit.  It is filled once, before
training, from the dataset on disk.

Data path with a cache (:meth:`DeviceFeatureCache.split_gather`, called by the loader thread):
the batch's input nodes are split into hits (positions and cache rows) and misses; only the misses go
through the partition buffer / disk and, on CUDA, into pinned host memory; the trainer
(:meth:`CacheSplit.assemble`) copies the misses with ``non_blocking=True`` and fills the hits with an
``index_select`` on the device.  On CPU the same code runs with the cache as a separate tensor tier,
so the logic (and the exactness: rows are bitwise the rows the loader would have produced) is tested
without a GPU.

Hit ratio = cached rows / all input rows gathered, reported per epoch (``device_cache_hit_ratio``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from ooc.loader import BatchLoader

__all__ = ["DeviceFeatureCache", "CacheSplit", "select_hot_nodes", "out_degrees", "access_counts",
           "build_device_cache"]

log = logging.getLogger("ooc.features.device")


def out_degrees(indices: np.ndarray, num_nodes: int, chunk: int = 1 << 24) -> np.ndarray:
    """int64 [N] out-degree of every node from the CSC source array ``indices`` [E] (streamed in
    chunks of ``chunk`` edges, so a memory-mapped ``indices`` is never loaded whole)."""
    deg = np.zeros(num_nodes, dtype=np.int64)
    for i in range(0, indices.shape[0], chunk):
        deg += np.bincount(np.asarray(indices[i:i + chunk]), minlength=num_nodes)
    return deg


def access_counts(loader: "BatchLoader", batches: list[np.ndarray], epoch: int, num_nodes: int,
                  fanouts: list[int] | None = None) -> np.ndarray:
    """int64 [N]: how often each node is an input node of ``batches`` (GNNLab's pre-sampling).

    Sampling only (no features are read); batch ``i`` uses the key of (seed, ``epoch``, ``i``),
    exactly as training does.
    """
    from ooc.kernels.rng import batch_key
    from ooc.kernels.sampling import sample_blocks
    counts = np.zeros(num_nodes, dtype=np.int64)
    for i, seeds in enumerate(batches):
        sg = sample_blocks(loader.indptr, loader.indices, seeds, fanouts or loader.fanouts,
                           batch_key(loader.seed, epoch, i), loader.replace)
        counts += np.bincount(sg.input_nodes, minlength=num_nodes)
    return counts


def select_hot_nodes(score: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` nodes of highest ``score``, ties broken by smaller id; sorted by id (int64 [k])."""
    n = score.shape[0]
    k = max(0, min(int(k), n))
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if k == n:
        return np.arange(n, dtype=np.int64)
    # lexicographic (score desc, id asc) via a stable sort of -score
    order = np.argsort(-score, kind="stable")[:k]
    return np.sort(order).astype(np.int64)


@dataclass
class CacheSplit:
    """How one batch's input rows split between the device cache and the host.

    Attributes:
        n: input rows of the batch; hit_pos: int64 [h] positions served by the cache;
        cache_rows: int64 [h] their rows in the cache; miss_pos: int64 [n - h] positions whose rows
        come from the host (in this order in the host tensor).
    """

    n: int
    hit_pos: torch.Tensor
    cache_rows: torch.Tensor
    miss_pos: torch.Tensor
    cache: "DeviceFeatureCache"

    def assemble(self, x_miss: torch.Tensor, device: torch.device) -> torch.Tensor:
        """float32 [n, D] on ``device``: host rows copied (non-blocking from pinned memory on
        CUDA), cached rows gathered on the device."""
        cache = self.cache
        nb = device.type == "cuda"
        out = torch.empty((self.n, cache.dim), dtype=torch.float32, device=device)
        if self.miss_pos.shape[0]:
            out.index_copy_(0, self.miss_pos.to(device, non_blocking=nb),
                            x_miss.to(device, non_blocking=nb))
        if self.hit_pos.shape[0]:
            out.index_copy_(0, self.hit_pos.to(device, non_blocking=nb),
                            cache.rows.index_select(0, self.cache_rows.to(device, non_blocking=nb)))
        return out


class DeviceFeatureCache:
    """Static cache of float32 feature rows on one device.

    Args:
        ids: int64 [k] cached node ids.
        rows: float32 [k, D] their rows (as the loader produces them, i.e. after ``feat_norm``),
            already on ``device``.
        num_nodes: N.
        device: where ``rows`` live (``cpu`` = a separate host tier, for tests).
        policy: ``degree`` or ``presample`` (recorded in the metrics).

    The node -> row map is int32 [N] on the host (4 bytes per node), used by the loader thread.
    """

    def __init__(self, ids: np.ndarray, rows: torch.Tensor, num_nodes: int, device: torch.device,
                 policy: str) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)
        self.rows = rows
        self.dim = int(rows.shape[1])
        self.device = torch.device(device)
        self.policy = policy
        self.pos_of = np.full(num_nodes, -1, dtype=np.int32)
        self.pos_of[self.ids] = np.arange(self.ids.shape[0], dtype=np.int32)
        self.pin = self.device.type == "cuda"
        self.hits = 0
        self.lookups = 0

    @property
    def nbytes(self) -> int:
        """Device bytes of the cached rows."""
        return int(self.rows.numel() * self.rows.element_size())

    @property
    def num_rows(self) -> int:
        return int(self.ids.shape[0])

    @classmethod
    def fill(cls, loader: "BatchLoader", ids: np.ndarray, num_nodes: int, device: torch.device,
             policy: str, chunk_rows: int = 1 << 16) -> "DeviceFeatureCache":
        """Read the rows of ``ids`` from disk (``loader.buffer.features``), normalise them as the
        loader does, and copy them to ``device`` chunk by chunk (bounded host memory)."""
        ids = np.asarray(ids, dtype=np.int64)
        feats = loader.buffer.features
        dim = int(np.prod(feats.shape[1:], dtype=np.int64))
        rows = torch.empty((ids.shape[0], dim), dtype=torch.float32, device=device)
        for i in range(0, ids.shape[0], chunk_rows):
            part, _ = feats.gather(ids[i:i + chunk_rows])
            x = loader.normalise(torch.from_numpy(np.ascontiguousarray(part)).float())
            rows[i:i + x.shape[0]].copy_(x.reshape(x.shape[0], dim))
        return cls(ids, rows, num_nodes, device, policy)

    def split_gather(self, loader: "BatchLoader", nodes: np.ndarray) -> tuple[torch.Tensor, CacheSplit]:
        """Split ``nodes`` (int64 [n]) into cache hits and misses and gather the misses through the
        loader's buffer.  Returns ``(x_miss float32 [n - h, D] (pinned on CUDA), split)``."""
        pos = self.pos_of[nodes]
        hit = pos >= 0
        hit_pos = np.flatnonzero(hit)
        miss_pos = np.flatnonzero(~hit)
        x_miss = loader.host_features(nodes[miss_pos])
        if self.pin and x_miss.numel():
            x_miss = x_miss.pin_memory()
        self.hits += int(hit_pos.shape[0])
        self.lookups += int(nodes.shape[0])
        return x_miss, CacheSplit(int(nodes.shape[0]), torch.from_numpy(hit_pos),
                                  torch.from_numpy(pos[hit_pos].astype(np.int64)),
                                  torch.from_numpy(miss_pos), self)

    def reset_stats(self) -> dict[str, Any]:
        """Counters since the last reset: ``device_cache_hit_ratio`` (cached / all input rows),
        ``device_cache_hits``, ``device_cache_lookups``."""
        out = {"device_cache_hits": self.hits, "device_cache_lookups": self.lookups,
               "device_cache_hit_ratio": self.hits / self.lookups if self.lookups else 0.0}
        self.hits = self.lookups = 0
        return out

    def describe(self) -> dict[str, Any]:
        return {"device_cache_policy": self.policy, "device_cache_rows": self.num_rows,
                "device_cache_bytes": self.nbytes, "device_cache_device": str(self.device)}


def build_device_cache(cfg: Any, task: Any, device: torch.device) -> DeviceFeatureCache | None:
    """The cache ``cfg.device_cache`` (bytes, e.g. ``"8GB"``; empty = none) asks for, filled by
    ``cfg.device_cache_policy`` and attached to the task's loader.

    Presampling uses the task's epoch-0 plan (under data parallelism: this rank's slices).

    Raises:
        ValueError: unparseable size or unknown policy.
    """
    if not getattr(cfg, "device_cache", ""):
        return None
    from ooc.util.sizes import parse_bytes
    budget = parse_bytes(cfg.device_cache)
    loader = task.data.loader
    feats = loader.buffer.features
    n = int(feats.shape[0])
    dim = int(np.prod(feats.shape[1:], dtype=np.int64))
    k = min(n, budget // (4 * dim))
    t0 = time.perf_counter()
    if cfg.device_cache_policy == "degree":
        score = out_degrees(loader.indices, n)
    elif cfg.device_cache_policy == "presample":
        score = access_counts(loader, task.plan(0).batches, 0, n)
    else:
        raise ValueError(f"device cache policy must be degree or presample, got "
                         f"{cfg.device_cache_policy!r}")
    ids = select_hot_nodes(score, k)
    cache = DeviceFeatureCache.fill(loader, ids, n, device, cfg.device_cache_policy)
    loader.device_cache = cache
    log.info("device cache on %s: %d of %d rows (%.1f MiB, %s) filled in %.2f s", device, k, n,
             cache.nbytes / 2**20, cfg.device_cache_policy, time.perf_counter() - t0)
    return cache
