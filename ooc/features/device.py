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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    from ooc.sampling.samplers import Sampler

__all__ = ["DeviceFeatureCache", "CacheSplit", "select_hot_nodes", "out_degrees", "access_counts",
           "hot_nodes"]

log = logging.getLogger("ooc.features.device")


def out_degrees(indices: np.ndarray, num_nodes: int, chunk: int = 1 << 24) -> np.ndarray:
    """int64 [N] out-degree of every node from the CSC source array ``indices`` [E] (streamed in
    chunks of ``chunk`` edges, so a memory-mapped ``indices`` is never loaded whole)."""
    deg = np.zeros(num_nodes, dtype=np.int64)
    for i in range(0, indices.shape[0], chunk):
        deg += np.bincount(np.asarray(indices[i:i + chunk]), minlength=num_nodes)
    return deg


def access_counts(sampler: "Sampler", batches: list[np.ndarray], keys: list[int], seed: int,
                  epoch: int, num_nodes: int) -> np.ndarray:
    """int64 [N]: how often each node is an input node of ``batches`` (GNNLab's pre-sampling).

    Sampling only (no features are read); batch ``i`` uses the key of (seed, ``epoch``,
    ``keys[i]``), exactly as training does over the full graph.
    """
    from ooc.kernels.rng import batch_key
    counts = np.zeros(num_nodes, dtype=np.int64)
    for seeds, k in zip(batches, keys):
        counts += np.bincount(sampler.sample(seeds, batch_key(seed, epoch, k)).input_nodes,
                              minlength=num_nodes)
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
                            x_miss.to(device, non_blocking=nb).float())
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
    def fill(cls, rows: Callable[[np.ndarray], torch.Tensor], ids: np.ndarray, num_nodes: int,
             device: torch.device, policy: str, chunk_rows: int = 1 << 16) -> "DeviceFeatureCache":
        """Fill with ``rows(ids)`` (float32 [n, D] as the loader produces them, normalised) chunk
        by chunk onto ``device`` (bounded host memory)."""
        ids = np.asarray(ids, dtype=np.int64)
        first = rows(ids[:1]) if ids.shape[0] else None
        dim = int(first.shape[1]) if first is not None else 0
        out = torch.empty((ids.shape[0], dim), dtype=torch.float32, device=device)
        for i in range(0, ids.shape[0], chunk_rows):
            x = rows(ids[i:i + chunk_rows])
            out[i:i + x.shape[0]].copy_(x.reshape(x.shape[0], dim))
        return cls(ids, out, num_nodes, device, policy)

    def split(self, nodes: np.ndarray) -> tuple[np.ndarray, CacheSplit]:
        """Split ``nodes`` (int64 [n]) into cache hits and misses: ``(miss positions int64 [n - h],
        split)``; the caller gathers the misses' rows from the host tiers in that order."""
        pos = self.pos_of[nodes]
        hit = pos >= 0
        hit_pos = np.flatnonzero(hit)
        miss_pos = np.flatnonzero(~hit)
        self.hits += int(hit_pos.shape[0])
        self.lookups += int(nodes.shape[0])
        return miss_pos, CacheSplit(int(nodes.shape[0]), torch.from_numpy(hit_pos),
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


def hot_nodes(policy: str, budget_bytes: int, dim: int, num_nodes: int,
              indices: np.ndarray | None, counts: Callable[[], np.ndarray]) -> np.ndarray:
    """The node ids a ``budget_bytes`` cache of float32 rows of width ``dim`` holds under ``policy``:
    ``degree`` (highest out-degree, from the CSC ``indices``) or ``presample`` (``counts()``).

    Raises:
        ValueError: unknown policy, or ``degree`` without ``indices`` in memory.
    """
    k = min(num_nodes, budget_bytes // (4 * max(dim, 1)))
    if policy == "degree":
        if indices is None:
            raise ValueError("--device-cache-policy degree counts out-degrees over the topology; "
                             "with --topology disk use --device-cache-policy presample")
        score = out_degrees(indices, num_nodes)
    elif policy == "presample":
        score = counts()
    else:
        raise ValueError(f"device cache policy must be degree or presample, got {policy!r}")
    return select_hot_nodes(score, k)
