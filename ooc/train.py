"""Out-of-core training (``ooc train``): the loop, checkpoints, resume, metrics.

Structure:

- :func:`build_data_path` -- the out-of-core data path of a run (topology in memory or mapped,
  partitions, :class:`~ooc.buffer.PartitionBuffer`, :class:`~ooc.loader.BatchLoader`).  It is the
  only place that builds them; tasks receive the result.
- a *task* -- :class:`NodeTask` here, :class:`ooc.linkpred.LinkTask` for link prediction -- turns
  an epoch into batches, a batch into a loss, and a model into validation/test metrics.
- :func:`train` -- the loop shared by all tasks: optimiser, learning-rate schedule, mixed precision
  (CUDA), early stopping, best-model selection, checkpoints (every ``checkpoint_every`` steps and at
  every epoch end) and resume, per-epoch ``metrics.jsonl`` and per-step ``steps.jsonl``.

Determinism: batches depend only on (seed, epoch, batch index) and the layers are deterministic on
CPU, so a resumed run (``train(cfg, resume=True)``, ``ooc train --resume RUN``) reproduces the
uninterrupted run bit for bit: the checkpoint holds model, optimiser, scheduler, GradScaler, every
RNG state, the loader position (epoch, next batch) and the running sums of the current epoch.

Run directory::

    RUN/config.yaml, config.json   resolved configuration (nested YAML reusable with --config; flat JSON)
    RUN/checkpoint.pt              latest checkpoint (atomic; torch.load(weights_only=True))
    RUN/model.pt                   best-validation weights (a plain state_dict)
    RUN/metrics.jsonl              one JSON record per epoch (loss, accuracy, throughput, I/O)
    RUN/steps.jsonl                one record per step (time, I/O stall, compute, loss): the timeline
    RUN/metrics.json               final summary (test/val score at the best epoch, I/O, memory...)
"""

from __future__ import annotations

import json
import logging
import os
import random
import resource
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from ooc.buffer import PartitionBuffer, contiguous_partitions
from ooc.training.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from ooc.config import TrainConfig, evaluation_fanouts
from ooc.features.device import build_device_cache
from ooc.loader import Batch, BatchLoader, EpochPlan, plan_epoch
from ooc.models import GNN, build_model, degrees_with_loops
from ooc.storage.dataset import Dataset
from ooc.training.rundir import guarded

__all__ = ["train", "evaluate", "seed_everything", "peak_rss_bytes", "write_json_atomic",
           "build_data_path", "DataPath", "NodeTask", "make_model", "resolve_device", "Interrupted"]

log = logging.getLogger("ooc.train")


class Interrupted(RuntimeError):
    """Raised by :func:`train` when ``stop_after_steps`` is reached (a simulated kill, for tests)."""


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA); the samplers are keyed by the run seed."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (bytes; Linux ``ru_maxrss`` is in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write JSON to ``path`` via a temporary file and rename (never a half-written file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _save_atomic(obj: object, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; otherwise ``torch.device(name)``.

    Raises:
        ValueError: a CUDA device is requested but none is available.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return dev


# ====================================================================== data path
@dataclass
class DataPath:
    """What :func:`build_data_path` builds: the run's topology, partitions, buffer and loader.

    Attributes:
        indptr, indices: CSC topology used for sampling (in memory or mapped).
        degrees: int64 [N] in-degrees of that topology (GCN normalisation, sum scaling).
        offsets: int64 [P+1] partition boundaries; buffer: the feature buffer; loader: the loader.
    """

    indptr: np.ndarray
    indices: np.ndarray
    degrees: np.ndarray
    offsets: np.ndarray
    buffer: PartitionBuffer
    loader: BatchLoader

    def close(self) -> None:
        self.buffer.close()


def build_data_path(cfg: TrainConfig, ds: Dataset, topology: tuple[np.ndarray, np.ndarray] | None = None,
                    loader_cls: type[BatchLoader] = BatchLoader, make_buffer: Any = None,
                    **loader_kw: Any) -> DataPath:
    """Build the out-of-core data path of a run (the one place that does).

    Args:
        cfg: run configuration (``topology``, ``partitions``, ``buffer_partitions``, ``io_threads``,
            ``fanouts``, ``seed``, ``replace``, ``prefetch``, ``feat_norm``).
        ds: the dataset; features are served from disk through the partition buffer.
        topology: ``(indptr, indices)`` to sample from instead of the dataset's (link prediction
            passes its training graph).
        loader_cls, loader_kw: loader class and extra keyword arguments (a task's own loader).
        make_buffer: buffer factory with :class:`PartitionBuffer`'s signature (data-parallel
            runs pass :meth:`ooc.distributed.DistContext.make_buffer`: one shared buffer per machine).

    Raises:
        ValueError: more partitions than nodes, bad buffer capacity.
    """
    if topology is not None:
        indptr, indices = topology
    elif cfg.topology == "mmap":
        indptr = ds.raw("indptr").mmap()
        indices = ds.raw("indices").mmap()
    else:
        indptr, indices = ds.indptr, ds.indices
    degrees = degrees_with_loops(indptr, indices)  # carries self-loop counts for GCN
    stored = ds.partition_offsets
    if stored is not None and stored.shape[0] - 1 == cfg.partitions:
        offsets = stored
    else:
        offsets = contiguous_partitions(ds.num_nodes, cfg.partitions)
    buffer = (make_buffer or PartitionBuffer)(ds.features, offsets, cfg.buffer_partitions,
                                              io_threads=cfg.io_threads)
    labels = ds.labels if ds.has("labels") else np.zeros(ds.num_nodes, dtype=np.int32)
    loader = loader_cls(indptr, indices, degrees, labels, buffer, cfg.fanouts, cfg.seed,
                        replace=cfg.replace, prefetch=cfg.prefetch, feat_norm=cfg.feat_norm, **loader_kw)
    return DataPath(indptr, indices, degrees, offsets, buffer, loader)


# ====================================================================== tasks
class Task(Protocol):
    """What the loop needs from a task (see :class:`NodeTask`, :class:`ooc.linkpred.LinkTask`)."""

    name: str
    data: DataPath
    out_dim: int
    select: str        # metric key maximised for early stopping / best model, e.g. "val_acc"
    test_key: str      # its test counterpart, e.g. "test_acc"

    def plan(self, epoch: int) -> EpochPlan: ...
    def batches(self, plan: EpochPlan, epoch: int, start: int) -> Iterator[Any]: ...
    def loss(self, model: GNN, batch: Any, device: torch.device) -> tuple[torch.Tensor, dict]: ...
    def evaluate(self, model: GNN, device: torch.device) -> dict: ...
    def close(self) -> None: ...


def _to_device(batch: Batch, device: torch.device) -> tuple[list, torch.Tensor]:
    """The batch's MFGs and float32 input rows on ``device``.  Batches may carry rows in the
    storage dtype (float16 halves what waits in the prefetch queue and what crosses PCIe); they
    are converted here, after the copy."""
    if batch.x_cache is not None:  # device feature cache: host misses + cached rows
        nb = device.type == "cuda"
        return ([b.to(device, non_blocking=nb) for b in batch.blocks],
                batch.x_cache.assemble(batch.x, device).float())
    if device.type == "cpu":
        return batch.blocks, batch.x.float()
    nb = device.type == "cuda"
    return [b.to(device, non_blocking=nb) for b in batch.blocks], batch.x.to(device, non_blocking=nb).float()


def _scores(pred_logits: torch.Tensor, y: torch.Tensor, multilabel: bool) -> tuple[int, int, int, int]:
    """``(correct, total, tp, fp_plus_fn)``: multi-class counts argmax hits; multi-label counts
    true positives and errors of ``logit > 0`` (for micro-F1 = 2tp / (2tp + fp + fn))."""
    if multilabel:
        pred = pred_logits > 0
        truth = y > 0.5
        tp = int((pred & truth).sum())
        err = int((pred ^ truth).sum())
        return 0, 0, tp, err
    return int((pred_logits.argmax(1) == y).sum()), int(y.shape[0]), 0, 0


@torch.no_grad()
def evaluate(model: nn.Module, loader: BatchLoader, ids: np.ndarray, num_layers: int,
             batch_size: int, device: torch.device | str = "cpu", multilabel: bool = False,
             fanouts: list[int] | None = None) -> float:
    """Accuracy (micro-F1 when ``multilabel``) on ``ids``.

    Args:
        ids: int64 node ids evaluated, in batches of ``batch_size``.
        num_layers: model depth.
        fanouts: neighbours per layer (output layer first); ``None`` = full neighbourhoods (-1 at
            every layer, i.e. exact inference for these seeds).  Sampled fanouts use the keys
            ``batch_key(seed, -1, i)``, so the score is deterministic for a seed.

    Returns:
        The score in [0, 1] (0.0 if ``ids`` is empty).

    Raises:
        ValueError: ``fanouts`` does not have ``num_layers`` entries.
    """
    return evaluate_with_loss(model, loader, ids, num_layers, batch_size, device, multilabel,
                              fanouts)[0]


def evaluate_with_loss(model: nn.Module, loader: BatchLoader, ids: np.ndarray, num_layers: int,
                       batch_size: int, device: torch.device | str = "cpu",
                       multilabel: bool = False,
                       fanouts: list[int] | None = None, overlap: bool = True) -> tuple[float, float]:
    """:func:`evaluate` and the mean loss on ``ids`` (cross-entropy, or binary cross-entropy when
    ``multilabel``; nodes labelled -1 are left out of the multi-class loss).  With ``overlap`` the
    next batch is sampled and gathered on a background thread while the model runs on this one
    (at most two batches alive, as the engine's budget plans); without it, all on the caller's
    thread.  Batches are keyed by their index, so the result is the same either way.

    Returns:
        ``(score in [0, 1], loss)``; ``(0.0, 0.0)`` if ``ids`` is empty.

    Raises:
        ValueError: ``fanouts`` does not have ``num_layers`` entries.
    """
    fo = list(fanouts) if fanouts else [-1] * num_layers
    if len(fo) != num_layers:
        raise ValueError(f"evaluation fanouts {fo} need {num_layers} entries (one per layer)")
    if ids.shape[0] == 0:
        return 0.0, 0.0
    device = torch.device(device)
    model.eval()
    correct = total = tp = err = 0
    loss_sum, loss_n = 0.0, 0
    for b in _ahead_of_use(lambda i: loader.make_batch(i, ids[i:i + batch_size], epoch=-1, fanouts=fo),
                           range(0, ids.shape[0], batch_size), overlap):
        with torch.no_grad():
            blocks, x = _to_device(b, device)
            logits = model(blocks, x).float().cpu()
            c, t, p, e = _scores(logits, b.y, multilabel)
            correct, total, tp, err = correct + c, total + t, tp + p, err + e
            s, n = node_loss_sum(logits, b.y, multilabel)
            loss_sum, loss_n = loss_sum + s, loss_n + n
    loss = loss_sum / max(loss_n, 1)
    if multilabel:
        return 2 * tp / max(2 * tp + err, 1), loss
    return correct / total, loss


T = TypeVar("T")


def _ahead_of_use(build: Callable[[int], T], keys: Iterable[int], overlap: bool) -> Iterator[T]:
    """Yield ``build(k)`` for ``k`` in ``keys`` in order; with ``overlap`` the next item is built on
    one worker thread while the caller uses the current one (two items alive at most)."""
    keys = list(keys)
    if not overlap or len(keys) < 2:
        for k in keys:
            yield build(k)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="ooc-eval") as pool:
        nxt = pool.submit(build, keys[0])
        for j in range(len(keys)):
            item = nxt.result()
            nxt = pool.submit(build, keys[j + 1]) if j + 1 < len(keys) else None
            yield item
            del item


def node_loss_sum(logits: torch.Tensor, y: torch.Tensor, multilabel: bool) -> tuple[float, int]:
    """Summed loss of a node task and the number of terms: cross-entropy over the nodes whose label
    is not -1 (``logits`` [n, C], ``y`` int [n]), or binary cross-entropy over every entry
    (``y`` [n, C] 0/1)."""
    if multilabel:
        return float(nn.functional.binary_cross_entropy_with_logits(
            logits, y.float(), reduction="sum")), int(y.numel())
    keep = y >= 0
    if not bool(keep.any()):
        return 0.0, 0
    return float(nn.functional.cross_entropy(logits[keep], y[keep].long(), reduction="sum")), \
        int(keep.sum())


class NodeTask:
    """Node classification: multi-class (cross-entropy, accuracy) or multi-label when the labels
    are [N, C] (binary cross-entropy, micro-F1, reported under the ``*_acc`` keys).

    Training seeds with label -1 are dropped; validation and test labels are only read by
    :meth:`evaluate`, never by training (poisoning them changes no loss or weight; tested).
    """

    name = "node"
    select = "val_acc"
    test_key = "test_acc"

    def __init__(self, cfg: TrainConfig, ds: Dataset, rss: Any = None, make_buffer: Any = None,
                 engine: bool | None = None) -> None:
        self.cfg = cfg
        self.ds = ds
        # the out-of-core engine: mode exact | buffer | hybrid under the memory budget (issue 5);
        # data-parallel runs (make_buffer: the machine's shared partition buffer), device-cache runs
        # and the non-default samplers (--sampler) keep the partition-buffer data path of exact
        # sampling (``engine=False``)
        self._engine = (uses_engine(cfg) if engine is None else engine) and make_buffer is None
        if self._engine:
            from ooc import engine as _engine
            self.data = _engine.build_data_path(cfg, ds, rss)
        else:
            self.data = build_data_path(cfg, ds, make_buffer=make_buffer)
        labels = ds.labels
        self.multilabel = labels.ndim == 2
        train_ids = ds.split("train")
        if not self.multilabel:
            keep = labels[train_ids] >= 0
            if not keep.all():
                log.warning("%d training nodes without a label (-1) are skipped", int((~keep).sum()))
            train_ids = train_ids[keep]
        if train_ids.shape[0] == 0:
            raise ValueError(f"{cfg.dataset}: no training nodes")
        self.train_ids = train_ids
        self.val_ids, self.test_ids = ds.split("valid"), ds.split("test")
        self.out_dim = int(labels.shape[1]) if self.multilabel else \
            int(ds.num_classes or int(labels.max()) + 1)
        if not self._engine:
            self.part_of_train = self.data.buffer.part_of(train_ids)
            if cfg.sampler != "neighbor":  # issue 4 samplers (training batches only)
                from ooc.sampling.samplers import make_sampler
                d = self.data
                d.loader.sampler = make_sampler(
                    cfg.sampler, d.indptr, d.indices, cfg.fanouts, train_ids=train_ids,
                    replace=cfg.replace, batch_size=cfg.batch_size, layer_size=cfg.layer_size,
                    num_clusters=cfg.num_clusters, clusters_per_batch=cfg.clusters_per_batch,
                    walk_length=cfg.walk_length, seed=cfg.seed)
        elif self.data.train_ids.shape[0] != train_ids.shape[0]:
            self.data.train_ids = train_ids
            self.data.part_of_train = np.searchsorted(self.data.offsets, train_ids, side="right") - 1
        self.loss_fn: nn.Module = nn.BCEWithLogitsLoss() if self.multilabel else nn.CrossEntropyLoss()
        self.metric = "micro_f1" if self.multilabel else "accuracy"

    @property
    def steps_per_epoch(self) -> int:
        if not self._engine:
            if self.data.loader.sampler is not None:  # ClusterGCN / GraphSAINT: their own batches
                return len(self.plan(0).batches)
            return -(-self.train_ids.shape[0] // self.cfg.batch_size)
        return len(self.data.plan(0).batches)

    def plan(self, epoch: int) -> Any:
        if not self._engine:
            return self.data.loader.plan_epoch(self.train_ids, self.part_of_train,
                                               self.data.buffer.num_parts, self.cfg.batch_size,
                                               self.cfg.seed, epoch)
        return self.data.plan(epoch)

    def batches(self, plan: Any, epoch: int, start: int) -> Iterator[Batch]:
        if not self._engine:
            return self.data.loader.iterate(plan, epoch, start=start)
        return self.data.iterate(plan, epoch, start)

    def loss(self, model: GNN, batch: Batch, device: torch.device) -> tuple[torch.Tensor, dict]:
        blocks, x = _to_device(batch, device)
        logits = model(blocks, x).float()
        y = batch.y.to(device)
        if self.multilabel:
            y = y.float()
        lw = getattr(batch, "loss_weight", None)
        if lw is None or self.multilabel:
            loss = self.loss_fn(logits, y)
        else:  # GraphSAINT normalisation: sum of per-seed losses weighted by 1 / (seed probability)
            loss = (nn.functional.cross_entropy(logits, y, reduction="none") * lw.to(device)).sum()
        c, t, tp, err = _scores(logits.detach().cpu(), batch.y, self.multilabel)
        return loss, {"seen": int(batch.y.shape[0]), "correct": c, "tp": tp, "err": err,
                      "edges": batch.num_edges, "sample_s": batch.sample_s,
                      "gather_s": batch.gather_s}

    def train_score(self, acc: dict) -> float:
        if self.multilabel:
            return 2 * acc["tp"] / max(2 * acc["tp"] + acc["err"], 1)
        return acc["correct"] / max(acc["seen"], 1)

    def evaluate(self, model: GNN, device: torch.device) -> dict:
        if self.cfg.eval_mode == "layerwise":
            from ooc.training.inference import IN_MEMORY_LIMIT, evaluate_node_layerwise
            big = self.ds.num_nodes * max(model.dims[1:]) * 4 > IN_MEMORY_LIMIT
            return evaluate_node_layerwise(model, self, device,
                                           Path(self.cfg.output_dir) / "inference" if big else None)
        nl = len(self.cfg.fanouts)
        fo = evaluation_fanouts(self.cfg)
        val, val_loss = evaluate_with_loss(model, self.data.loader, self.val_ids, nl,
                                           self.cfg.eval_batch_size, device, self.multilabel, fo)
        return {"val_acc": val, "val_loss": val_loss,
                "test_acc": evaluate(model, self.data.loader, self.test_ids, nl,
                                     self.cfg.eval_batch_size, device, self.multilabel, fo)}

    def close(self) -> None:
        self.data.close()


def uses_engine(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` asks for the out-of-core engine (``ooc.engine``): ``--mode buffer|hybrid``,
    ``--memory-budget``, ``--cache-size``, ``--direct-io`` or ``--topology disk``.

    Without them a run takes the partition-buffer path (``ooc.buffer`` + ``ooc.loader``): exact
    sampling, batches grouped by partition, rows outside the resident partitions read from disk.
    Both are exact; they order seeds into batches differently, so their losses differ.
    """
    return bool(cfg.mode != "exact" or cfg.memory_budget or cfg.cache_size or cfg.direct_io
                or cfg.topology == "disk")


def make_task(cfg: TrainConfig, ds: Dataset, rss: Any = None, dist: Any = None) -> Task:
    """The task object of ``cfg.task`` (``node`` or ``link``); ``rss`` is the engine's RSS monitor;
    data-parallel (sharded seeds, shared buffer, distributed evaluation) under ``dist``
    (:class:`ooc.distributed.DistContext`)."""
    engine_opts = uses_engine(cfg)
    legacy = dist is not None or bool(cfg.device_cache) or cfg.sampler != "neighbor" or not engine_opts
    if legacy and engine_opts:
        what = ("data-parallel training (--devices/--nnodes)" if dist is not None else
                "--device-cache" if cfg.device_cache else f"--sampler {cfg.sampler}")
        raise NotImplementedError(f"{what} runs the exact mode over the partition buffer "
                                  "(--buffer-partitions); --mode buffer/hybrid, --memory-budget and "
                                  "--topology disk need the default node-wise sampler, one process "
                                  "and no device cache for now")
    if dist is not None:
        if cfg.task != "node":
            raise NotImplementedError("data-parallel training (--devices/--nnodes) supports "
                                      "task: node only")
        dist.shared_buffer = cfg.shared_buffer
        return dist.wrap_task(NodeTask(cfg, ds, make_buffer=dist.make_buffer))
    if cfg.task == "link":
        if cfg.mode != "exact" or cfg.memory_budget or cfg.topology == "disk":
            raise NotImplementedError("link prediction runs the exact mode over the partition buffer; "
                                      "--mode buffer/hybrid, --memory-budget and --topology disk are "
                                      "node-classification options for now")
        from ooc.linkpred import LinkTask
        return LinkTask(cfg, ds)
    return NodeTask(cfg, ds, rss, engine=not legacy)


def make_model(cfg: TrainConfig, in_dim: int, out_dim: int) -> GNN:
    """The :class:`~ooc.models.GNN` a configuration describes (``len(fanouts)`` layers)."""
    return build_model(cfg.model, in_dim, cfg.hidden, out_dim, len(cfg.fanouts), cfg.dropout,
                       aggregator=cfg.aggregator, heads=cfg.heads, out_heads=cfg.out_heads,
                       attn_dropout=cfg.attn_dropout, residual=cfg.residual, norm=cfg.norm,
                       activation=cfg.activation, gin_eps=cfg.gin_eps,
                       gin_train_eps=cfg.gin_train_eps, feat_dropout=cfg.feat_dropout,
                       dropout_per_head=cfg.dropout_per_head)


def _make_optimizer(cfg: TrainConfig, model: GNN) -> torch.optim.Optimizer:
    params: Any = model.parameters()
    if cfg.weight_decay_scope == "first" and cfg.weight_decay:
        first = list(model.layers[0].parameters())
        ids = {id(p) for p in first}
        params = [{"params": first},
                  {"params": [p for p in model.parameters() if id(p) not in ids], "weight_decay": 0.0}]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _make_scheduler(cfg: TrainConfig, opt: torch.optim.Optimizer) -> Any:
    if cfg.lr_schedule == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=max(cfg.lr_step, 1), gamma=cfg.lr_gamma)
    if cfg.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
    if cfg.lr_schedule == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=cfg.lr_gamma,
                                                          patience=cfg.lr_step)
    return None


# ====================================================================== loop state
@dataclass
class _State:
    """Everything of the loop that a checkpoint must restore (besides model/optimiser/RNG)."""

    epoch: int = 0            # current epoch
    step: int = 0             # next batch index within the epoch
    global_step: int = 0
    losses: list = field(default_factory=list)
    history: list = field(default_factory=list)
    best_val: float = -1.0
    best_test: float = 0.0
    top_val: float = -1.0             # early_stop score_or_loss: best score and loss seen so far
    min_val_loss: float = float("inf")
    best_epoch: int = -1
    bad_evals: int = 0
    stopped_early: bool = False
    elapsed_s: float = 0.0
    acc: dict = field(default_factory=dict)   # running sums of the current epoch
    totals: dict = field(default_factory=lambda: {"bytes_read": 0, "row_hits": 0, "row_misses": 0})

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _gat_rule(st: _State, val: float, scores: dict) -> tuple[bool, bool]:
    """Early stopping of Velickovic et al. (GAT reference code): ``(better, progress)`` for one
    evaluation.  ``progress`` (patience restarts) when the validation score is at least the best
    score so far *or* the validation loss at most the lowest so far; ``better`` (keep this model)
    when both hold.  Updates the running best score and lowest loss in ``st``.

    Raises:
        ValueError: the evaluation has no ``val_loss``.
    """
    if "val_loss" not in scores:
        raise ValueError("early_stop score_or_loss: this evaluation reports no val_loss")
    loss = float(scores["val_loss"])
    up, down = val >= st.top_val, loss <= st.min_val_loss
    st.top_val, st.min_val_loss = max(st.top_val, val), min(st.min_val_loss, loss)
    return up and down, up or down


def _fresh_acc() -> dict:
    return {"loss": 0.0, "seen": 0, "correct": 0, "tp": 0, "err": 0, "edges": 0, "sample_s": 0.0,
            "gather_s": 0.0, "stall_s": 0.0, "compute_s": 0.0, "train_time_s": 0.0}


def _fault_pause(global_step: int) -> None:
    """Test hook: ``OOC_FAULT_PAUSE_STEP=<step>:<seconds>[:<marker>]`` touches the marker and sleeps
    after that global step (and its checkpoint, if any), so a test can SIGKILL the run mid-epoch."""
    spec = os.environ.get("OOC_FAULT_PAUSE_STEP")
    if not spec:
        return
    parts = spec.split(":")
    if int(parts[0]) != global_step:
        return
    if len(parts) > 2:
        Path(parts[2]).touch()
    time.sleep(float(parts[1]))


def _rewrite_jsonl(path: Path, records: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file; a torn last line (killed writer) is dropped."""
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


#: Seconds between flushes of ``steps.jsonl`` during an epoch (a billion-edge epoch takes an hour).
STEPS_FLUSH_S = 10.0

#: Options a resumed run may change: they affect speed, logging or when training stops, never the
#: weights of an epoch (the buffer and prefetch depth do not change batches; tested).
RESUMABLE_CHANGES = frozenset({
    "epochs", "progress", "checkpoint_every", "output_dir", "threads", "device", "io_threads",
    "io_depth", "io_gap",
    "prefetch", "eval_batch_size", "patience", "eval_every", "eval_mode", "eval_fanouts",
    "buffer_partitions",
    "topology", "verify"})


def _check_resume_config(saved: dict, now: dict) -> None:
    """Raise ValueError when ``now`` changes an option a resumed run must keep."""
    diff = [k for k in now if k in saved and k not in RESUMABLE_CHANGES and saved[k] != now[k]]
    if diff:
        raise ValueError("--resume: " + ", ".join(f"{k} {saved[k]!r} -> {now[k]!r}" for k in diff)
                         + " would change the training being resumed; only "
                         + ", ".join(sorted(RESUMABLE_CHANGES)) + " may change")


# ====================================================================== the loop
@guarded
def train(cfg: TrainConfig, resume: bool = False, stop_after_steps: int | None = None,
          dist: Any = None) -> dict:
    """Train as configured; see the module docstring for the run directory.

    Args:
        cfg: the run configuration (validated here).
        resume: continue from ``RUN/checkpoint.pt`` (``cfg.output_dir``); the result is bit-identical
            to an uninterrupted run on CPU.
        stop_after_steps: raise :class:`Interrupted` after this many global steps (and the
            checkpoint due at that step, if any), as if the process were killed; for tests.
        dist: this rank's :class:`ooc.distributed.DistContext` in a data-parallel job (None: one
            process).  Rank 0 writes ``RUN``, rank ``r`` writes ``RUN/rank{r}``.

    Returns:
        The metrics dictionary (also written to ``metrics.json``): ``test_acc`` / ``val_acc`` (node
        tasks) or ``test_mrr`` / ``val_mrr`` and Hits@K (link), at the best validation epoch;
        ``best_epoch``, ``epochs``, ``epoch_time_s``, ``losses`` (per step), ``bytes_read``,
        ``buffer_hit_ratio``, ``peak_rss_bytes``, ``seed``, ``config``, per-epoch ``history``.

    Raises:
        DatasetError: the dataset cannot be opened.
        FileNotFoundError: ``resume`` without a checkpoint.
        ValueError: invalid options (e.g. more partitions than nodes).
        Interrupted: ``stop_after_steps`` reached.
    """
    cfg.validate()
    t_start = time.perf_counter()
    out = Path(cfg.output_dir) if dist is None else dist.run_dir(cfg.output_dir)
    if dist is None and not resume and not out.exists():
        try:  # set-up errors (no dataset, a budget too small) leave no half-made run folder
            out.mkdir(parents=True)
            return _train(cfg, out, resume, stop_after_steps, dist, t_start)
        except BaseException:
            if not (out / "metrics.jsonl").exists():  # created once set-up is done: keep from then
                shutil.rmtree(out, ignore_errors=True)
            raise
    out.mkdir(parents=True, exist_ok=True)
    return _train(cfg, out, resume, stop_after_steps, dist, t_start)


def _train(cfg: TrainConfig, out: Path, resume: bool, stop_after_steps: int | None, dist,
           t_start: float) -> dict:
    """The body of :func:`train` once its output folder exists."""
    ckpt_path = out / "checkpoint.pt"
    ckpt = load_checkpoint(ckpt_path) if resume else None
    if ckpt is not None:
        _check_resume_config(ckpt.get("config", {}), cfg.to_dict())
    cfg.save(out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rss = None
    if cfg.task == "node" and dist is None and uses_engine(cfg):
        # RSS baseline of the runtime, before any data (the budget excludes it); before seeding,
        # so the warm-up step does not move the random streams of the run
        from ooc.engine import warm_up_runtime
        rss = warm_up_runtime(cfg.model, len(cfg.fanouts))
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device) if dist is None else dist.device
    use_amp = cfg.amp and device.type == "cuda"
    if cfg.amp and not use_amp:
        log.warning("--amp ignored on %s (mixed precision is used on CUDA only)", device)
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16

    ds = Dataset(cfg.dataset)
    task = make_task(cfg, ds, rss, dist)
    model = make_model(cfg, ds.feat_dim, task.out_dim)
    if hasattr(task, "prepare_model"):
        task.prepare_model(model)
    model.to(device)
    net = model if dist is None else dist.wrap_model(model, cfg.seed)  # DDP: trains `model`
    cache = build_device_cache(cfg, task, device)  # None without --device-cache
    opt = _make_optimizer(cfg, model)
    sched = _make_scheduler(cfg, opt)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16) \
        if use_amp else None
    buffer = task.data.buffer
    log.info("dataset %s: %d nodes, %d edges, %d features, task %s (%d outputs); %d partitions, "
             "buffer %d (%.1f MiB); device %s", ds.name, ds.num_nodes, ds.num_edges, ds.feat_dim,
             task.name, task.out_dim, buffer.num_parts, cfg.buffer_partitions,
             buffer.nbytes / 2**20, device)

    st = _State()
    metrics_path, steps_path = out / "metrics.jsonl", out / "steps.jsonl"
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        if sched is not None and ckpt.get("scheduler") is not None:
            sched.load_state_dict(ckpt["scheduler"])
        if scaler is not None and ckpt.get("scaler") is not None:
            scaler.load_state_dict(ckpt["scaler"])
        for k, v in ckpt["state"].items():
            setattr(st, k, v)
        set_rng_state(ckpt["rng"])
        _rewrite_jsonl(metrics_path, st.history)
        _rewrite_jsonl(steps_path, [r for r in _read_jsonl(steps_path) if r["step"] < st.global_step])
        log.info("resumed %s at epoch %d, batch %d (step %d)", out, st.epoch, st.step, st.global_step)
        if dist is not None:
            dist.check_resume(st.global_step)
    else:
        for p in (metrics_path, steps_path):
            p.write_text("")
    steps_f = open(steps_path, "a")
    last_flush = time.perf_counter()  # flushed every STEPS_FLUSH_S: long epochs show progress

    def checkpoint() -> None:
        steps_f.flush()
        save_checkpoint({
            "format": CHECKPOINT_FORMAT, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict() if sched is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None, "rng": rng_state(),
            "state": dict(st.as_dict(), elapsed_s=st.elapsed_s + time.perf_counter() - t_start),
            "config": cfg.to_dict()}, ckpt_path)

    steps_per_epoch = task.steps_per_epoch
    bar = tqdm(total=cfg.epochs * steps_per_epoch, initial=st.global_step, disable=not cfg.progress,
               unit="batch", dynamic_ncols=True, desc="train")
    elapsed0 = st.elapsed_s
    try:
        for epoch in range(st.epoch, cfg.epochs):
            if st.stopped_early:
                break
            t0 = time.perf_counter()
            net.train()
            plan = task.plan(epoch)
            if st.step == 0:
                st.acc = _fresh_acc()
                buffer.reset_stats()
            if cache is not None:
                cache.reset_stats()  # count this epoch's training gathers only
            acc = st.acc
            it = task.batches(plan, epoch, st.step)
            try:
                while True:
                    t_wait = time.perf_counter()
                    batch = next(it, None)
                    t_got = time.perf_counter()
                    if batch is None:
                        break
                    ctx = torch.autocast(device_type=device.type, dtype=amp_dtype) if use_amp \
                        else nullcontext()
                    with ctx:
                        loss, bstats = task.loss(net, batch, device)
                    opt.zero_grad()
                    if scaler is not None:
                        scaler.scale(loss).backward()
                        scaler.step(opt)
                        scaler.update()
                    else:
                        loss.backward()
                        opt.step()
                    lv = bstats["loss_value"] if "loss_value" in bstats else float(loss.detach())
                    t_done = time.perf_counter()
                    st.losses.append(lv)
                    acc["loss"] += lv * bstats["seen"]
                    for k in ("seen", "correct", "tp", "err", "edges", "sample_s", "gather_s"):
                        acc[k] += bstats.get(k, 0)
                    acc["stall_s"] += t_got - t_wait
                    acc["compute_s"] += t_done - t_got
                    acc["train_time_s"] += t_done - t_wait
                    st.global_step += 1
                    st.step += 1
                    steps_f.write(json.dumps({
                        "step": st.global_step - 1, "epoch": epoch, "batch": st.step - 1,
                        "t": round(elapsed0 + t_done - t_start, 6), "stall_s": round(t_got - t_wait, 6),
                        "compute_s": round(t_done - t_got, 6), "sample_s": round(bstats.get("sample_s", 0.0), 6),
                        "gather_s": round(bstats.get("gather_s", 0.0), 6), "loss": lv,
                        "seeds": bstats["seen"]}) + "\n")
                    if t_done - last_flush > STEPS_FLUSH_S:
                        steps_f.flush()
                        last_flush = t_done
                    bar.update(1)
                    if hasattr(task.data, "postfix"):
                        bar.set_postfix(epoch=epoch, loss=f"{lv:.4f}", **task.data.postfix())
                    else:
                        bar.set_postfix(epoch=epoch, loss=f"{lv:.4f}", hit=f"{buffer.stats.hit_ratio:.3f}")
                    if cfg.checkpoint_every and st.global_step % cfg.checkpoint_every == 0 \
                            and st.step < len(plan.batches):
                        checkpoint()
                    _fault_pause(st.global_step)
                    if stop_after_steps is not None and st.global_step >= stop_after_steps:
                        raise Interrupted(f"stopped after {st.global_step} steps")
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
            # ---- epoch end: evaluation, record, schedule, early stopping, checkpoint
            cstats = cache.reset_stats() if cache is not None else {}
            if hasattr(task, "epoch_end"):  # data-parallel: sums over all ranks
                acc = task.epoch_end(acc)
            seen = max(acc["seen"], 1)
            tt = max(acc["train_time_s"], 1e-9)
            rec: dict = {"epoch": epoch, "loss": acc["loss"] / seen, "train_acc": task.train_score(acc)
                         if hasattr(task, "train_score") else None,
                         "train_time_s": acc["train_time_s"], "seeds_per_s": acc["seen"] / tt,
                         "edges_per_s": acc["edges"] / tt, "sampled_edges": acc["edges"],
                         "stall_s": acc["stall_s"], "compute_s": acc["compute_s"],
                         "sample_s": acc["sample_s"], "gather_s": acc["gather_s"],
                         "lr": opt.param_groups[0]["lr"], "steps": st.global_step, **cstats}
            if (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1:
                te = time.perf_counter()
                scores = task.evaluate(model, device)
                rec.update(scores)
                rec["eval_time_s"] = time.perf_counter() - te
                val = scores[task.select]
                if cfg.early_stop == "score_or_loss":
                    better, progress = _gat_rule(st, val, scores)
                else:
                    better = progress = val > st.best_val
                if better:
                    st.best_val, st.best_test, st.best_epoch = val, scores[task.test_key], epoch
                    _save_atomic(model.state_dict(), out / "model.pt")
                if progress:
                    st.bad_evals = 0
                else:
                    st.bad_evals += 1
                if cfg.patience and st.bad_evals >= cfg.patience:
                    st.stopped_early = True
                if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    sched.step(val)
            if sched is not None and not isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sched.step()
            buffer.drain()
            io = buffer.reset_stats()
            rec.update(io.as_dict())
            if hasattr(task.data, "extra_stats"):  # engine: topology bytes, cache, swaps, RSS peak
                rec.update(task.data.extra_stats(io.bytes_read))
            if dist is not None:
                rec.update(dist.host_memory())
            rec["epoch_time_s"] = time.perf_counter() - t0
            for k in ("bytes_read", "row_hits", "row_misses", "cache_hits", "cache_misses", "swaps",
                      "approx_rows"):
                st.totals[k] = st.totals.get(k, 0) + int(rec.get(k, getattr(io, k, 0)))
            st.history.append(rec)
            with open(metrics_path, "a") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
            msg = (f"epoch {epoch}: loss {rec['loss']:.4f} "
                   + (f"train {rec['train_acc']:.4f} " if rec["train_acc"] is not None else "")
                   + f"{rec['seeds_per_s']:.0f} seeds/s {rec['edges_per_s'] / 1e6:.2f} M edges/s "
                   f"read {io.bytes_read / 2**20:.1f} MiB hit {io.hit_ratio:.3f} "
                   f"stall {rec['stall_s']:.2f}s")
            if "swaps" in rec and cfg.mode != "exact":
                msg += f" swaps {rec['swaps']} (lower bound {rec.get('swaps_lower_bound')})"
            if rec.get("cache_hits", 0) + rec.get("cache_misses", 0):
                msg += f" cache hit {rec['cache_hit_ratio']:.3f}"
            if task.select in rec:
                msg += f" {task.select} {rec[task.select]:.4f} {task.test_key} {rec[task.test_key]:.4f}"
            if cfg.progress:
                bar.write(msg)
            log.info(msg)
            st.epoch, st.step = epoch + 1, 0
            if st.stopped_early:
                log.info("early stop after epoch %d: no better %s for %d evaluations", epoch,
                         task.select, cfg.patience)
            checkpoint()
    finally:
        bar.close()
        steps_f.close()
        engine_summary = task.data.summary() if hasattr(task.data, "summary") else {}
        task.close()
    history = st.history
    metrics = {
        task.test_key: st.best_test,
        task.select: st.best_val,
        "val_score": st.best_val,
        "test_score": st.best_test,
        "metric": getattr(task, "metric", task.select),
        "task": task.name,
        "best_epoch": st.best_epoch,
        "final_test_score": history[-1].get(task.test_key) if history else None,
        "epochs": cfg.epochs,
        "epochs_run": len(history),
        "stopped_early": st.stopped_early,
        "steps": st.global_step,
        "epoch_time_s": [h["epoch_time_s"] for h in history],
        "losses": st.losses,
        "bytes_read": st.totals["bytes_read"],
        "buffer_hit_ratio": st.totals["row_hits"] / max(st.totals["row_hits"] + st.totals["row_misses"], 1),
        "row_hits": st.totals["row_hits"],
        "row_misses": st.totals["row_misses"],
        "buffer_bytes": buffer.nbytes,
        "dataset_feature_bytes": ds.features.nbytes,
        # per-epoch peaks reset the kernel's high-water mark, which ru_maxrss follows: the run's peak
        # is the larger of the last reading and every epoch's
        "peak_rss_bytes": max([peak_rss_bytes()] + [h.get("peak_rss_bytes", 0) for h in history]),
        "epoch_peak_rss_bytes": max([h.get("peak_rss_bytes", 0) for h in history], default=0),
        "wall_time_s": elapsed0 + time.perf_counter() - t_start,
        "resumed": ckpt is not None,
        "seed": cfg.seed,
        "config": cfg.to_dict(),
        "history": history,
    }
    if cache is not None:
        hits = sum(h.get("device_cache_hits", 0) for h in history)
        lookups = sum(h.get("device_cache_lookups", 0) for h in history)
        metrics.update(cache.describe(), device_cache_hit_ratio=hits / lookups if lookups else 0.0)
    if dist is not None:
        metrics["distributed"] = dist.summary(st.global_step)
    if history:
        last = {k: v for k, v in history[-1].items() if k.startswith(("val_", "test_"))}
        best = next((h for h in history if h["epoch"] == st.best_epoch), {})
        metrics.update({k: best[k] for k in best if k.startswith(("val_", "test_"))})
        metrics["final"] = last
    if engine_summary:
        metrics.update({k: v for k, v in engine_summary.items()
                        if k not in ("bytes_read", "row_hits", "row_misses", "buffer_hit_ratio")})
        ch, cm = st.totals.get("cache_hits", 0), st.totals.get("cache_misses", 0)
        metrics.update(cache_hits=ch, cache_misses=cm, cache_hit_ratio=ch / max(ch + cm, 1),
                       swaps=st.totals.get("swaps", 0), approx_rows=st.totals.get("approx_rows", 0))
    write_json_atomic(out / "metrics.json", metrics)
    ds.close()
    return metrics
