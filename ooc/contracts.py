"""The types that cross stage boundaries, in one place.

::

    Dataset ──▶ DataPath (Graph, BufferManager, feature tiers) ──Plan──▶ Loader ──Batch──▶ Task.loss
                                                         ▲                                     │
                            Job (rank, world, collectives; one process or torch.distributed) ──┘

- :class:`Graph` -- the topology a sampler draws from (in memory, mapped, or read from disk).
- :class:`RowSource` -- a feature tier: ``gather(ids) -> (rows, bytes_read)``; tiers wrap the next
  one as fallback (GraphBolt's feature wrappers): resident partition slots -> CPU row cache -> PQ
  codes or disk.  The device cache sits in front of them on the loader thread.
- :class:`Plan` -- one epoch of one process: its steps, each a batch of seed ids (node ids, or
  training-edge ids for link prediction) trained in a buffer state; sharded plans also carry the
  loss weight of every step (data parallelism).
- :class:`Batch` -- what the loader hands the trainer for one step.
- :class:`Job` -- where this process stands in a data-parallel job, and its collectives;
  :class:`SingleProcess` is the job of one process (every collective is the identity).
- :class:`Task` -- node classification or link prediction, as the training loop drives it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    from ooc.models import GNN, TorchBlock
    from ooc.storage.io import NeighborReader

__all__ = ["Graph", "RowSource", "Plan", "EdgePairs", "Batch", "Job", "SingleProcess", "Task"]


@dataclass
class Graph:
    """CSC topology (in-edges) a sampler draws from.

    Attributes:
        indptr: int64 [N+1]; ``indices[indptr[v]:indptr[v+1]]`` are ``v``'s in-neighbours.
        indices: int32|int64 [E] in memory or memory-mapped; ``None`` when the lists are read from
            disk through ``reader`` (``--topology disk``).
        degrees: int64 [N] in-degrees (GCN normalisation, sum scaling).
        reader: page-aligned reader of neighbour lists (``indices`` is None).
        loops: int32 [N] self-loops of every node (GCN / GAT keep exactly one per node); None:
            unknown (degrees then keep the data's loops).
    """

    indptr: np.ndarray
    indices: np.ndarray | None
    degrees: np.ndarray
    reader: "NeighborReader | None" = None
    loops: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indptr[-1])


class RowSource(Protocol):
    """A feature tier: rows of node ids, from wherever this tier keeps them.

    Attributes:
        shape: ``(N, *row_shape)`` of the feature array; dtype: its storage dtype.
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """``(rows [n, *row_shape] in the storage dtype, bytes read from disk)`` for int64 ``ids``
        [n] (any order, duplicates allowed)."""
        ...


@dataclass
class Plan:
    """One epoch of one process.

    Attributes:
        batches: per step, int64 ids of the seeds this process trains (node ids, or training-edge
            ids for link prediction).
        batch_state: per step, the buffer state (index into ``states``) its partitions must be
            resident in; ``-1``: none (exact mode: static residency).
        states: partition sets, in the order the epoch visits them.
        upcoming: per state, the partitions that later states load, in order (prefetch targets).
        weights: per step, the factor on this process's mean loss that makes the data-parallel
            update the gradient of the global batch's mean loss (``n_r * world / g``; 0 for a
            padding step); ``None`` = 1.
        real: per step, seeds of this process's share that count (0 for a padding step); ``None``
            = all of them.
        keys: per step, the batch index its random stream is keyed by (the global batch index
            under data parallelism); ``None`` = the step index.
    """

    batches: list[np.ndarray]
    batch_state: list[int]
    states: list[list[int]] = field(default_factory=list)
    upcoming: list[list[int]] = field(default_factory=list)
    weights: list[float] | None = None
    real: list[int] | None = None
    keys: list[int] | None = None

    def __len__(self) -> int:
        return len(self.batches)

    def weight(self, i: int) -> float:
        return 1.0 if self.weights is None else self.weights[i]

    def counts(self, i: int) -> bool:
        """Whether step ``i``'s seeds count in the epoch's sums (False for a padding step)."""
        return self.real is None or self.real[i] > 0

    def key(self, i: int) -> int:
        return i if self.keys is None else self.keys[i]

    @property
    def swaps(self) -> int:
        """Partitions loaded after the first state (``sum |S_{k+1} - S_k|``)."""
        return sum(len(set(b) - set(a)) for a, b in zip(self.states, self.states[1:]))


@dataclass
class EdgePairs:
    """The edges a link-prediction batch scores, as int64 row positions in the batch's output
    nodes (``Batch.seeds``): positives [B] and negatives [B * neg_ratio]."""

    pos_src: torch.Tensor
    pos_dst: torch.Tensor
    neg_src: torch.Tensor
    neg_dst: torch.Tensor


@dataclass
class Batch:
    """One training (or evaluation) step's data.

    Attributes:
        index: step index in the plan; seeds: int64 [B] global ids of the output nodes.
        blocks: MFGs, input layer first; every block's ``src_ids`` holds the global ids of its
            source nodes (:attr:`input_ids` for the input rows).
        x: input rows [num_input, D] in the storage dtype (float16 stays float16 until use) or
            float32 (row-normalised features); with a device cache, only the rows it missed.
        y: int64 [B] labels (multi-label: [B, C]); link batches: zeros.
        num_edges: sampled edges; sample_s / gather_s: producer time sampling / gathering.
        x_cache: with a device cache, how ``x`` and the cached rows assemble
            (:class:`ooc.features.device.CacheSplit`); None without one.
        loss_weight: float32 [B] per-seed loss weights (GraphSAINT normalisation: the loss is
            ``sum(weight * per-seed loss)``); None = mean loss.
        pairs: link prediction: the positive and negative pairs; None for node batches.
    """

    index: int
    seeds: np.ndarray
    blocks: list["TorchBlock"]
    x: torch.Tensor
    y: torch.Tensor
    num_edges: int
    sample_s: float
    gather_s: float
    x_cache: Any = None
    loss_weight: torch.Tensor | None = None
    pairs: EdgePairs | None = None

    @property
    def input_ids(self) -> torch.Tensor | None:
        """int64 [num_input] global node ids of the input rows ``x``, in row order
        (``blocks[0].src_ids``; what a learnable node embedding is indexed by)."""
        return self.blocks[0].src_ids if self.blocks else None

    def inputs(self, device: torch.device, native: bool = False
               ) -> tuple[list["TorchBlock"], torch.Tensor]:
        """The MFGs and float32 input rows on ``device``.  Rows travel in the storage dtype
        (float16 halves what waits in the prefetch queue and what crosses PCIe) and are converted
        after the copy; with a device cache the cached rows are gathered on the device.  With
        ``native`` on CPU the rows stay as stored (float16): for a model that converts them itself
        (:func:`ooc.models.takes_half`), fused with its input dropout."""
        nb = device.type == "cuda"
        blocks = self.blocks if device.type == "cpu" else [b.to(device, non_blocking=nb)
                                                            for b in self.blocks]
        if self.x_cache is not None:
            return blocks, self.x_cache.assemble(self.x, device)
        if device.type == "cpu":
            return blocks, self.x if native and self.x.dtype == torch.float16 else self.x.float()
        return blocks, self.x.to(device, non_blocking=nb).float()


class Job(Protocol):
    """This process's place in a (possibly data-parallel) job and its CPU-side collectives.

    Attributes:
        rank, world_size: global; local_rank, local_world_size: on this machine;
        node_rank: this machine's index; num_machines: machines in the job.
        device: this process's training device; timeout_s: how long a collective or a shared-buffer
        peer may stay silent before the job fails.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device
    timeout_s: float

    @property
    def num_machines(self) -> int: ...
    @property
    def is_main(self) -> bool: ...
    def run_dir(self, base: str | os.PathLike) -> Path: ...
    def all_reduce_sum(self, values: Any, dtype: torch.dtype = torch.float64) -> np.ndarray: ...
    def all_gather_object(self, obj: Any) -> list[Any]: ...
    def barrier(self) -> None: ...
    def wrap_model(self, model: torch.nn.Module, seed: int) -> torch.nn.Module: ...
    def check_resume(self, global_step: int) -> None: ...
    def host_memory(self) -> dict: ...
    def summary(self, steps: int) -> dict: ...


class SingleProcess:
    """The job of one process: rank 0 of 1, collectives are the identity, the model is unwrapped.

    Args:
        device: the training device.
    """

    rank = 0
    world_size = 1
    local_rank = 0
    local_world_size = 1
    node_rank = 0
    timeout_s = 60.0

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    @property
    def num_machines(self) -> int:
        return 1

    @property
    def is_main(self) -> bool:
        return True

    def run_dir(self, base: str | os.PathLike) -> Path:
        return Path(base)

    def all_reduce_sum(self, values: Any, dtype: torch.dtype = torch.float64) -> np.ndarray:
        return torch.tensor(np.asarray(values), dtype=dtype).numpy()

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        return None

    def wrap_model(self, model: torch.nn.Module, seed: int) -> torch.nn.Module:
        return model

    def check_resume(self, global_step: int) -> None:
        return None

    def host_memory(self) -> dict:
        return {}

    def summary(self, steps: int) -> dict:
        return {}


class Task(Protocol):
    """What the training loop needs from a task (:class:`ooc.tasks.node.NodeTask`,
    :class:`ooc.tasks.link.LinkTask`); the loop calls nothing else.

    Attributes:
        name: ``node`` or ``link``; select: metric key maximised for early stopping and the best
        model (``val_acc``, ``val_mrr``); test_key: its test counterpart; metric: reported name.
        out_dim: the model's output width; data: the run's :class:`ooc.data.path.DataPath`.
        steps_per_epoch: optimiser steps of every epoch (the same on every rank).
        info: facts the run's ``metrics.json`` records (e.g. ``{"ogb": {"dataset", "metric"}}``).
    """

    name: str
    select: str
    test_key: str
    metric: str
    out_dim: int
    data: Any
    info: dict

    @property
    def steps_per_epoch(self) -> int: ...
    def prepare_model(self, model: "GNN") -> None: ...
    def plan(self, epoch: int) -> Plan: ...
    def batches(self, plan: Plan, epoch: int, start: int) -> Iterator[Batch]: ...
    def loss(self, model: torch.nn.Module, batch: Batch, device: torch.device
             ) -> tuple[torch.Tensor, dict]: ...
    def train_score(self, acc: dict) -> float: ...
    def epoch_end(self, acc: dict) -> dict: ...
    def evaluate(self, model: "GNN", device: torch.device) -> dict: ...
    def close(self) -> None: ...
