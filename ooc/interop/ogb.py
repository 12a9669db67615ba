"""OGB's own evaluators for datasets converted from OGB (``pip install 'ooc-gnn[ogb]'``).

A dataset written by ``ooc convert ogb ROOT`` records ``source_format: ogb`` and its name (the
folder's, e.g. ``ogbn_arxiv``, OGB's download folder name) in the manifest.  For such a dataset
:func:`ogb_scorer` builds ``ogb.nodeproppred.Evaluator("ogbn-arxiv")`` and the node task reports
its score under OGB's metric name next to ooc's own: ``val_ogb_acc`` / ``test_ogb_acc`` for the
accuracy datasets (ogbn-arxiv, -products, -papers100M), ``val_ogb_rocauc`` / ``test_ogb_rocauc``
for ogbn-proteins, in every epoch record, ``metrics.json`` (at the best epoch), ``ooc eval`` and
the summary of ``ooc train``.  The metric is read from the Evaluator (``eval_metric``), never
assumed.  The best epoch is still chosen by ooc's validation metric (for ``acc`` the two are the
same number).

Without the ``ogb`` package, or for a name the Evaluator does not know, nothing changes but a
one-line note (logged, and kept as ``metrics.json`` ``ogb.note``): ooc's own metric is reported.

What the Evaluator is given, per metric: ``acc`` -- ``y_true`` int64 [n, 1] labels and ``y_pred``
int64 [n, 1] the argmax of the logits; ``rocauc`` -- ``y_true`` [n, T] 0/1 labels (a multi-label
dataset, T tasks) and ``y_pred`` float32 [n, T] logits (ROC-AUC needs only their order).
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ooc.storage.dataset import Dataset

__all__ = ["OgbScorer", "ogb_dataset_name", "ogb_scorer"]

log = logging.getLogger("ooc.interop.ogb")

_INSTALL = "pip install 'ooc-gnn[ogb]'"


def ogb_dataset_name(ds: Dataset) -> str | None:
    """The OGB name (``ogbn-arxiv``) of a dataset converted from an OGB folder, or None.

    ``ooc convert ogb`` names a dataset after its folder; OGB's folders use ``_`` where its names
    use ``-`` (``ogbn_arxiv`` holds ``ogbn-arxiv``)."""
    if ds.manifest.get("source_format") != "ogb":
        return None
    return ds.name.strip().lower().replace("_", "-")


@dataclass
class OgbScorer:
    """An OGB ``Evaluator`` and how to feed it ooc's logits.

    Attributes:
        dataset: OGB's name of the dataset; metric: the Evaluator's ``eval_metric`` (``acc``,
            ``rocauc``); evaluator: the ``ogb.nodeproppred.Evaluator``.
    """

    dataset: str
    metric: str
    evaluator: Any

    def compact(self, logits: torch.Tensor) -> np.ndarray:
        """What to keep of a batch's float logits [n, C] to score it later: int64 [n, 1] class
        predictions (``acc``) or float32 [n, C] scores (``rocauc``)."""
        lg = logits.detach().float().cpu()
        if self.metric == "acc":
            return lg.argmax(1, keepdim=True).numpy().astype(np.int64)
        return lg.numpy().astype(np.float32, copy=False)

    def score(self, labels: np.ndarray, kept: np.ndarray) -> float:
        """OGB's score of predictions ``kept`` (rows of :meth:`compact`, in the order of
        ``labels``) against ``labels`` int [n] or [n, T].

        Raises:
            RuntimeError: the Evaluator rejects the shapes (another number of tasks).
        """
        y = np.asarray(labels)
        y_true = y.reshape(-1, 1) if y.ndim == 1 else y
        return float(self.evaluator.eval({"y_true": y_true, "y_pred": kept})[self.metric])


def ogb_scorer(ds: Dataset) -> tuple[OgbScorer | None, dict]:
    """The scorer of a dataset converted from OGB, and what to record about it.

    Returns:
        ``(scorer or None, info)``: ``info`` is ``{}`` for a dataset not converted from OGB, else
        ``{"dataset": name, "metric": metric}`` or, when OGB's scores cannot be computed,
        ``{"dataset": name, "note": why}`` (also logged as one warning line).
    """
    name = ogb_dataset_name(ds)
    if name is None:
        return None, {}

    def note(why: str) -> tuple[None, dict]:
        log.warning("%s; reporting ooc's own metric", why)
        return None, {"dataset": name, "note": f"{why}; ooc's own metric reported"}

    try:
        from ogb.nodeproppred import Evaluator
    except ImportError:
        return note(f"OGB dataset {name}: the ogb package is not installed ({_INSTALL} for OGB's "
                    "Evaluator)")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the Evaluator prints unknown names
            ev = Evaluator(name)
    except ValueError:
        return note(f"{name} (from ooc convert ogb) is not a dataset OGB's node Evaluator knows")
    labels = ds.labels
    tasks = int(labels.shape[1]) if labels.ndim == 2 else 1
    if (ev.eval_metric == "acc" and labels.ndim == 2) or tasks != int(ev.num_tasks):
        return note(f"{name}: OGB's Evaluator expects {ev.num_tasks} task(s) of {ev.eval_metric}, the "
                    f"dataset's labels have {tasks}")
    return OgbScorer(name, str(ev.eval_metric), ev), {"dataset": name, "metric": str(ev.eval_metric)}
