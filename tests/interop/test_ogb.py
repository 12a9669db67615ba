"""OGB's Evaluator on datasets converted from OGB folders: the same number as ooc's accuracy on the
same predictions, reported under OGB's metric name; without the package, a note and ooc's metric."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ogb_folder

from ooc.ingest.convert import GraphOptions, convert_ogb
from ooc.interop.ogb import ogb_dataset_name, ogb_scorer
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main



@pytest.fixture()
def evaluator() -> type:
    """OGB's ``Evaluator`` class; the tests that need it skip without the package."""
    return pytest.importorskip("ogb.nodeproppred", reason="ogb not installed (pip install "
                               "'ooc-gnn[ogb]')").Evaluator


@pytest.fixture(scope="module")
def arxiv_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ogbn_arxiv-named OGB folder (600 nodes, 8 features, 2 planted classes), converted."""
    root = ogb_folder(tmp_path_factory.mktemp("raw") / "ogbn_arxiv", features=True, seed=3)
    return convert_ogb(root, tmp_path_factory.mktemp("ogb") / "arxiv", GraphOptions(undirected=True))


def _train(ds: Path, out: Path, *extra: str) -> list[str]:
    return ["train", str(ds), "--fanout", "5,5", "--batch-size", "64", "--epochs", "3", "--hidden",
            "16", "--partitions", "2", "--no-progress", "--output-dir", str(out), *extra]


def test_ogb_name_and_metric_come_from_the_dataset_and_the_evaluator(evaluator, arxiv_like: Path,
                                                                      planted_dataset: Path) -> None:
    ds = Dataset(arxiv_like)
    assert ds.manifest["source_format"] == "ogb" and ogb_dataset_name(ds) == "ogbn-arxiv"
    scorer, info = ogb_scorer(ds)
    assert info == {"dataset": "ogbn-arxiv", "metric": "acc"} and scorer is not None
    # acc: the argmax of the logits against [n, 1] labels
    logits = torch.tensor([[0.1, 0.9], [2.0, -1.0], [0.0, 1.0], [0.3, 0.2]])
    kept = scorer.compact(logits)
    assert kept.dtype == np.int64 and kept[:, 0].tolist() == [1, 0, 1, 0]
    assert scorer.score(np.array([1, 0, 0, 0]), kept) == 0.75
    assert ogb_scorer(Dataset(planted_dataset)) == (None, {})        # not converted from OGB


def test_rocauc_for_proteins_gets_the_logits(evaluator) -> None:
    from ooc.interop.ogb import OgbScorer
    s = OgbScorer("ogbn-proteins", "rocauc", evaluator("ogbn-proteins"))
    # per task: positives scored 0.4 and 0.8, negatives 0.1 and 0.5 -> 3 of 4 pairs ordered
    y = np.tile(np.array([[0], [1], [0], [1]]), (1, 112))
    scores = torch.tensor([0.1, 0.4, 0.5, 0.8]).unsqueeze(1).repeat(1, 112)
    assert s.score(y, s.compact(scores)) == pytest.approx(0.75)


def test_train_reports_ogb_acc_equal_to_ooc_accuracy(evaluator, arxiv_like: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(_train(arxiv_like, run)) == 0
    out = capsys.readouterr().out
    m = json.loads((run / "metrics.json").read_text())
    assert m["ogb"] == {"dataset": "ogbn-arxiv", "metric": "acc"}
    # the Evaluator's accuracy on the predictions ooc counted, at the best epoch and every epoch
    assert m["test_ogb_acc"] == m["test_acc"] and m["val_ogb_acc"] == m["val_acc"]
    assert all(h["test_ogb_acc"] == h["test_acc"] for h in m["history"])
    assert m["test_acc"] > 0.8                                     # 2 classes, learnable
    assert f"test ogb acc   {m['test_ogb_acc']:.4f} (OGB's ogbn-arxiv Evaluator" in out
    # layer-wise inference (ooc eval) scores the same logits both ways
    assert main(["eval", str(run)]) == 0
    ev = json.loads((run / "eval.json").read_text())
    assert ev["test_ogb_acc"] == ev["test_acc"] and ev["val_ogb_acc"] == ev["val_acc"]


def test_without_the_package_ooc_metric_and_a_note(arxiv_like: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "ogb", None)          # import ogb... raises ImportError
    monkeypatch.setitem(sys.modules, "ogb.nodeproppred", None)
    run = tmp_path / "run"
    assert main(_train(arxiv_like, run, "--epochs", "1")) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert not any(k.startswith(("test_ogb", "val_ogb")) for k in m)
    assert m["ogb"]["dataset"] == "ogbn-arxiv" and "ooc-gnn[ogb]" in m["ogb"]["note"]
    cap = capsys.readouterr()
    assert "note          OGB dataset ogbn-arxiv: the ogb package is not installed" in cap.out
    assert m["test_acc"] > 0.5
