"""Node classification: multi-class (cross-entropy, accuracy) or multi-label (binary
cross-entropy, micro-F1) on any data path, in one process or data-parallel.

Data parallelism is part of the task, not a wrapper: the plan is the global plan sharded for this
rank (:func:`ooc.data.plan.shard_plan`), the loss of a step is scaled by the rank's share, the
epoch's sums and the evaluation counts are all-reduced.  With one process (``SingleProcess``)
every collective is the identity, so the same code is the single-process trainer.

Evaluation (:meth:`NodeTask.evaluate`): the validation/test ids are split into ``world``
contiguous slices; each rank counts (correct, total) -- micro-F1 counts for multi-label -- and the
loss sum on its slice with full neighbourhoods (or ``--eval-fanout``), batches built ahead on the
loader thread; the counts are all-reduced, so the score is exactly the single-process one.  A rank
with no ids contributes zeros and still joins the all-reduce.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn

from ooc.config import TrainConfig, auto_layerwise_eval, evaluation_fanouts
from ooc.contracts import Batch, Job, Plan, SingleProcess
from ooc.data.budget import RssMonitor, release_free_memory
from ooc.data.loader import prefetched
from ooc.data.path import DataPath, build_data_path
from ooc.data.plan import shard_plan
from ooc.inference import Propagated
from ooc.models import GNN, takes_half
from ooc.storage.dataset import Dataset

__all__ = ["NodeTask", "scores", "node_loss_sum", "evaluate_nodes", "evaluate_node_layerwise",
           "node_eval_mode"]

log = logging.getLogger("ooc.tasks")


def scores(pred_logits: torch.Tensor, y: torch.Tensor, multilabel: bool) -> tuple[int, int, int, int]:
    """``(correct, total, tp, fp_plus_fn)``: multi-class counts argmax hits; multi-label counts
    true positives and errors of ``logit > 0`` (for micro-F1 = 2tp / (2tp + fp + fn))."""
    if multilabel:
        pred = pred_logits > 0
        truth = y > 0.5
        return 0, 0, int((pred & truth).sum()), int((pred ^ truth).sum())
    return int((pred_logits.argmax(1) == y).sum()), int(y.shape[0]), 0, 0


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


@torch.no_grad()
def evaluate_nodes(model: nn.Module, data: DataPath, ids: np.ndarray, num_layers: int,
                   batch_size: int, device: torch.device | str = "cpu", multilabel: bool = False,
                   fanouts: list[int] | None = None, prefetch: int = 1,
                   sink: Callable[[torch.Tensor], None] | None = None) -> np.ndarray:
    """Counts of a node evaluation on ``ids``: float64 ``[correct, total, tp, err, loss_sum,
    loss_terms]`` (see :func:`scores`, :func:`node_loss_sum`).

    Args:
        ids: int64 node ids, in batches of ``batch_size``; batch ``i`` (starting at offset ``s``)
            is keyed ``batch_key(seed, -1, s)``, so the result is deterministic for a seed.
        num_layers: model depth; fanouts: neighbours per layer (output layer first); ``None`` = full
            neighbourhoods (exact inference for these seeds).
        prefetch: batches built ahead on the loader thread (0: in the caller's thread); the result
            does not depend on it.
        sink: called with every batch's float32 logits [batch, C] on the CPU, in the order of
            ``ids`` (an OGB Evaluator's predictions are collected with it).

    Raises:
        ValueError: ``fanouts`` does not have ``num_layers`` entries.
    """
    fo = list(fanouts) if fanouts else [-1] * num_layers
    if len(fo) != num_layers:
        raise ValueError(f"evaluation fanouts {fo} need {num_layers} entries (one per layer)")
    out = np.zeros(6, dtype=np.float64)
    if ids.shape[0] == 0:
        return out
    device = torch.device(device)
    model.eval()
    sampler = data.eval_sampler(fo)
    it = prefetched(data.eval_builder(ids, batch_size, sampler), 0, -(-ids.shape[0] // batch_size),
                    prefetch, lambda s: None)
    half = takes_half(model)
    release_free_memory()
    for b in it:
        blocks, x = b.inputs(device, native=half)
        logits = model(blocks, x).float().cpu()
        if sink is not None:
            sink(logits)
        c, t, p, e = scores(logits, b.y, multilabel)
        s, n = node_loss_sum(logits, b.y, multilabel)
        out += np.array([c, t, p, e, s, n], dtype=np.float64)
        del b, blocks, x, logits  # not held while the next batch is built
        data.release_heap_near_budget()  # this batch's freed pages, where the next could pass the budget
    return out


def _score(counts: np.ndarray, multilabel: bool) -> float:
    correct, total, tp, err = counts[:4]
    if multilabel:
        return float(2 * tp / max(2 * tp + err, 1))
    return float(correct / total) if total else 0.0


def _node_scores(logits: np.ndarray, labels: np.ndarray, ids: np.ndarray, multilabel: bool) -> float:
    if ids.shape[0] == 0:
        return 0.0
    if multilabel:
        pred = logits > 0
        truth = labels[ids] > 0
        tp = int((pred & truth).sum())
        err = int((pred ^ truth).sum())
        return 2 * tp / max(2 * tp + err, 1)
    return float((logits.argmax(1) == labels[ids]).mean())


def evaluate_node_layerwise(model: GNN, task: "NodeTask", device: torch.device | str = "cpu",
                            out_dir: "str | os.PathLike | None" = None, memory: int | None = None,
                            propagated: "Propagated | None" = None) -> dict:
    """Validation and test scores of a node task from one layer-wise pass over what the validation
    and test nodes need (their full ``L``-hop neighbourhoods, each node's layer computed once;
    :func:`~ooc.inference.layerwise_inference` with ``targets``; ``memory`` what it may hold, the
    rest spilled to ``out_dir``; ``propagated``: layer 0's inputs kept from one evaluation to the
    next, see :class:`~ooc.inference.Propagated`)."""
    from ooc.inference import layerwise_inference
    targets = np.concatenate([task.val_ids, task.test_ids]).astype(np.int64, copy=False)
    # a block of one layer reads about the rows a sampled evaluation batch reads over all layers
    # (its destinations times the graph's branching for the other layers), up to 64 K destinations
    branching = 1.0 + task.ds.num_edges / max(task.ds.num_nodes, 1)
    block = int(min(1 << 16, task.cfg.eval_batch_size * branching ** (model.num_layers - 1)))
    outs = layerwise_inference(model, task.data, max(block, task.cfg.eval_batch_size), out_dir, device,
                               keep=(model.num_layers - 1,), targets=targets, memory=memory,
                               propagated=propagated)
    logits = outs[model.num_layers - 1]
    labels = task.ds.labels
    res: dict = {}
    if propagated is not None:  # bytes of layer 0's kept inputs this evaluation read / wrote
        res["eval_kept_read_bytes"] = propagated.read_bytes
        res["eval_kept_written_bytes"] = propagated.written_bytes
    for k, ids in (("val_acc", task.val_ids), ("test_acc", task.test_ids)):
        res[k] = _node_scores(logits.gather(ids), labels, ids, task.multilabel)
    val_logits = torch.from_numpy(np.ascontiguousarray(logits.gather(task.val_ids)))
    s, n = node_loss_sum(val_logits, torch.from_numpy(np.asarray(labels[task.val_ids])), task.multilabel)
    res["val_loss"] = s / max(n, 1)
    if task.ogb is not None:  # OGB's Evaluator on the same logits (datasets converted from OGB)
        res.update(task.ogb_scores(*(task.ogb.compact(torch.from_numpy(np.ascontiguousarray(
            logits.gather(ids)))) for ids in (task.val_ids, task.test_ids))))
    logits.discard()  # scratch: nothing of it is left in the run folder
    return res


def node_eval_mode(cfg: TrainConfig, world_size: int, resident: bool,
                   eval_batches: bool = True) -> str:
    """``sampled`` or ``layerwise``: ``cfg.eval_mode``, with ``auto`` resolved to ``layerwise``
    out of core (a memory budget that does not hold every partition, ``resident`` False: each
    needed node's layers computed once and the feature rows read partition by partition beat
    per-batch neighbourhoods read row by row; measured in docs/benchmarks.md), or where the budget
    plan holds no evaluation batches (``eval_batches`` False: they did not fit beside training),
    when :func:`ooc.config.auto_layerwise_eval` allows it."""
    if cfg.eval_mode != "auto":
        return cfg.eval_mode
    if cfg.memory_budget and (not resident or not eval_batches) \
            and auto_layerwise_eval(cfg, world_size):
        return "layerwise"
    return "sampled"


class NodeTask:
    """Node classification (see the module docstring).

    Training seeds with label -1 are dropped; validation and test labels are only read by
    :meth:`evaluate`, never by training (poisoning them changes no loss or weight; tested).

    Args:
        cfg: the run configuration; ds: the dataset; job: this process's place in the job
            (default one process); rss: the RSS monitor of the run.

    Raises:
        ValueError: no training nodes, or a combination of options that cannot work.
    """

    name = "node"
    select = "val_acc"
    test_key = "test_acc"

    def __init__(self, cfg: TrainConfig, ds: Dataset, job: Job | None = None,
                 rss: RssMonitor | None = None, reuse: dict | None = None) -> None:
        self.cfg, self.ds = cfg, ds
        self.job = job or SingleProcess()
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
        if self.job.world_size > 1:
            self._check_copies()
        self.data = build_data_path(cfg, ds, self.job, rss, task="node", train_ids=train_ids,
                                    reuse=reuse)
        self.out_dim = int(labels.shape[1]) if self.multilabel else \
            int(ds.num_classes or int(labels.max()) + 1)
        self.loss_fn: nn.Module = nn.BCEWithLogitsLoss() if self.multilabel else nn.CrossEntropyLoss()
        self.metric = "micro_f1" if self.multilabel else "accuracy"
        from ooc.interop.ogb import ogb_scorer
        self.ogb, ogb_info = ogb_scorer(ds)  # OGB's Evaluator for datasets converted from OGB
        self.info: dict = {"ogb": ogb_info} if ogb_info else {}
        bp = self.data.budget
        self.eval_mode = node_eval_mode(cfg, self.job.world_size, bp.slots >= bp.num_parts,
                                        bp.eval_batches)
        self.info["eval_mode"] = self.eval_mode
        # layer-wise evaluation: layer 0's inputs for the validation and test nodes, kept on disk
        # from one evaluation to the next (created at the first)
        self._propagated: Propagated | None = None
        self._plan: Plan | None = None
        self._plan_epoch = -1

    def _check_copies(self) -> None:
        """Every machine reads its own dataset copy: they must agree, or step counts would differ."""
        ds, ids = self.ds, self.train_ids
        mine = (int(ds.num_nodes), int(ds.num_edges), int(ds.feat_dim), int(ids.shape[0]),
                int(ids.sum()), int(self.val_ids.shape[0]), int(self.test_ids.shape[0]))
        every = self.job.all_gather_object(mine)
        if len(set(every)) != 1:
            raise ValueError("the ranks' dataset copies differ (nodes, edges, feature dim, train/valid/"
                             f"test counts): {sorted(set(every))}; every machine needs the same dataset")

    # ---------------------------------------------------------------- the loop's interface
    def prepare_model(self, model: GNN) -> None:
        """Nothing to attach (the last layer's width is :attr:`out_dim`)."""

    @property
    def steps_per_epoch(self) -> int:
        return len(self.plan(0))

    def plan(self, epoch: int) -> Plan:
        """This rank's share of the epoch's global plan (memoised for the current epoch)."""
        if self._plan is None or self._plan_epoch != epoch:
            j = self.job
            full = self.data.plan_nodes(self.train_ids, self.data.global_batch_size(), epoch)
            self._plan = shard_plan(full, j.rank, j.world_size, j.local_world_size)
            self._plan_epoch = epoch
        return self._plan

    def batches(self, plan: Plan, epoch: int, start: int) -> Iterator[Batch]:
        return self.data.iterate(plan, epoch, start, then=lambda: self._plan_of(epoch + 1))

    def _plan_of(self, epoch: int) -> Plan | None:
        """This rank's plan of ``epoch`` without memoising it (None past the last epoch); pure,
        so the read-ahead's thread may ask for the next epoch's while this one trains.  Exact
        mode only (buffer states chain from epoch to epoch and are planned in order)."""
        if epoch >= self.cfg.epochs or self.cfg.mode != "exact":
            return None
        j = self.job
        full = self.data.plan_nodes(self.train_ids, self.data.global_batch_size(), epoch)
        return shard_plan(full, j.rank, j.world_size, j.local_world_size)

    def loss(self, model: nn.Module, batch: Batch, device: torch.device) -> tuple[torch.Tensor, dict]:
        blocks, x = batch.inputs(device, native=takes_half(model))
        logits = model(blocks, x).float()
        y = batch.y.to(device)
        if self.multilabel:
            y = y.float()
        lw = batch.loss_weight
        if lw is None or self.multilabel:
            loss = self.loss_fn(logits, y)
        else:  # GraphSAINT normalisation: sum of per-seed losses weighted by 1 / (seed probability)
            loss = (nn.functional.cross_entropy(logits, y, reduction="none") * lw.to(device)).sum()
        c, t, tp, err = scores(logits.detach().cpu(), batch.y, self.multilabel)
        st = {"seen": int(batch.y.shape[0]), "correct": c, "tp": tp, "err": err,
              "edges": batch.num_edges, "sample_s": batch.sample_s, "gather_s": batch.gather_s,
              "loss_value": float(loss.detach())}
        plan = self._plan
        if plan is not None and plan.weights is not None:
            w = plan.weight(batch.index)
            if not plan.counts(batch.index):  # a padding share: runs, counts for nothing
                for k in ("seen", "correct", "tp", "err", "edges"):
                    st[k] = 0
            if w != 1.0:
                loss = loss * w
        return loss, st

    def train_score(self, acc: dict) -> float:
        if self.multilabel:
            return 2 * acc["tp"] / max(2 * acc["tp"] + acc["err"], 1)
        return acc["correct"] / max(acc["seen"], 1)

    def epoch_end(self, acc: dict) -> dict:
        """The epoch's running sums over all ranks (loss, seeds, hits, sampled edges); timings stay
        this rank's."""
        if self.job.world_size == 1:
            return acc
        keys = ("loss", "seen", "correct", "tp", "err", "edges")
        tot = self.job.all_reduce_sum([float(acc[k]) for k in keys])
        out = dict(acc)
        for k, v in zip(keys, tot):
            out[k] = float(v) if k == "loss" else int(round(v))
        return out

    def evaluate(self, model: GNN, device: torch.device) -> dict:
        """``val_acc``, ``val_loss`` and ``test_acc`` (micro-F1 under the same keys when
        multi-label), exact over all ranks (see the module docstring)."""
        if self.eval_mode == "layerwise":
            from ooc.inference import IN_MEMORY_LIMIT
            # under a budget: its parts idle while evaluating (batches in flight, the read-ahead
            # window, the samples ahead); without: a layer up to the limit
            bp = self.data.budget
            # (less what the read-ahead keeps of the next epoch's first window)
            memory = (bp.staging + bp.read_ahead_bytes + bp.sample_ahead_bytes
                      - self.data.held_between_epochs if bp.budget else 2 * IN_MEMORY_LIMIT)
            root = self.job.run_dir(self.cfg.output_dir) / "inference"
            if self._propagated is None:
                self._propagated = Propagated(root / "propagated")
            # the training steps' freed heap pages go back first (as sampled evaluation does):
            # on the 2 M-node bench they were 68-90 MiB on top of the memory evaluation is given
            release_free_memory()
            res = evaluate_node_layerwise(model, self, device, root, memory=memory,
                                          propagated=self._propagated)
            try:  # nothing kept or spilled: no empty folder left in the run
                root.rmdir()
            except OSError:
                pass
            return res
        j = self.job
        nl = len(self.cfg.fanouts)
        fo = evaluation_fanouts(self.cfg)
        counts = []
        kept: list[list[np.ndarray]] = [[], []]
        for k, ids in enumerate((self.val_ids, self.test_ids)):
            mine = np.array_split(ids, j.world_size)[j.rank] if j.world_size > 1 else ids
            sink = None if self.ogb is None else (lambda lg, out=kept[k]: out.append(self.ogb.compact(lg)))
            counts.append(evaluate_nodes(model, self.data, mine, nl, self.cfg.eval_batch_size, device,
                                         self.multilabel, fo, prefetch=min(1, self.data.budget.prefetch),
                                         sink=sink))
        tot = j.all_reduce_sum(np.concatenate(counts)) if j.world_size > 1 else np.concatenate(counts)
        val, test = tot[:6], tot[6:]
        res = {"val_acc": _score(val, self.multilabel), "val_loss": float(val[4] / max(val[5], 1)),
               "test_acc": _score(test, self.multilabel)}
        if self.ogb is not None:
            res.update(self.ogb_scores(*(self._gathered(p) for p in kept)))
        return res

    def _gathered(self, parts: list[np.ndarray]) -> np.ndarray | None:
        """This rank's kept predictions joined with every rank's, in id order (ranks evaluate
        contiguous slices in rank order); None when there are none."""
        mine = np.concatenate(parts) if parts else None
        if self.job.world_size == 1:
            return mine
        every = [p for p in self.job.all_gather_object(mine) if p is not None]
        return np.concatenate(every) if every else None

    def ogb_scores(self, val: np.ndarray | None, test: np.ndarray | None) -> dict:
        """``val_ogb_<metric>`` and ``test_ogb_<metric>``: OGB's Evaluator on the predictions kept
        (:meth:`ooc.interop.ogb.OgbScorer.compact`) for the validation and test ids, in id order;
        {} without a scorer."""
        if self.ogb is None:
            return {}
        res = {}
        for split, ids, kept in (("val", self.val_ids, val), ("test", self.test_ids, test)):
            if kept is not None and ids.shape[0]:
                res[f"{split}_ogb_{self.ogb.metric}"] = self.ogb.score(self.ds.labels[ids], kept)
        return res

    def close(self) -> None:
        self.data.close()
