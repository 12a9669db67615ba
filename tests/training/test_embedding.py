"""Learnable node embeddings (``--embedding D``): the input layer, its memory in the budget,
featureless datasets end to end, resume and layer-wise inference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ogb_folder

from ooc.config import TrainConfig
from ooc.data.budget import plan_budget
from ooc.embedding import NodeEmbeddingInput, embedding_bytes
from ooc.ingest.convert import GraphOptions, convert_ogb
from ooc.models import GNN, TorchBlock
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main
from ooc.training.checkpoint import load_checkpoint
from ooc.training.runs import eval_run
from ooc.training.loop import Interrupted, train


@pytest.fixture(scope="module")
def featureless(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two planted communities (600 nodes, 90 % of edges inside a community), no node features."""
    root = ogb_folder(tmp_path_factory.mktemp("ogb") / "ogbn_arxiv")
    ds = convert_ogb(root, tmp_path_factory.mktemp("fl") / "ds", GraphOptions(undirected=True))
    assert not Dataset(ds).has("features")
    return ds


def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=6, seed=1, embedding=16, hidden=16, dropout=0.0, progress=False, partitions=4)
    base.update(kw)
    return TrainConfig(**base)


def test_embedding_bytes_counts_weights_gradient_and_optimizer_state() -> None:
    assert embedding_bytes(10, 4, "adam") == 10 * 4 * 4 * 4      # weights, gradient, 2 moments
    assert embedding_bytes(10, 4, "sgd") == 10 * 4 * 4 * 3       # weights, gradient, momentum
    with pytest.raises(ValueError, match="unknown optimizer"):
        embedding_bytes(10, 4, "lbfgs")


def test_input_is_features_then_embedding_rows_of_the_source_ids() -> None:
    inner = GNN("sage", 3, 4, 2, 1, dropout=0.0)
    m = NodeEmbeddingInput(inner, num_nodes=5, dim=2, feat_dim=1)
    with torch.no_grad():
        m.embedding.weight.copy_(torch.arange(10, dtype=torch.float32).view(5, 2))
    b = TorchBlock.from_edges(2, 1, [1], [0])
    b.src_ids = torch.tensor([4, 2])
    x = torch.tensor([[7.0], [8.0]])
    assert torch.equal(m.inputs(b, x), torch.tensor([[7.0, 8.0, 9.0], [8.0, 4.0, 5.0]]))
    assert torch.equal(m([b], x), inner([b], m.inputs(b, x)))
    assert torch.equal(m.layer_forward(0, b, x), m([b], x))
    assert m.dims == [1, 2] and m.num_layers == 1
    b.src_ids = None
    with pytest.raises(ValueError, match="src_ids"):
        m([b], x)


def test_budget_counts_the_table_per_rank(featureless: Path) -> None:
    ds = Dataset(featureless)
    off = np.array([0, 300, 600])
    args = ("exact", 64 << 20, ds, off, "memory", 64, [5, 5], 2, 16, 1, None, "sieve", "comet")
    emb = embedding_bytes(600, 16)
    plain = plan_budget(*args)
    with_emb = plan_budget(*args, embedding=emb, embedding_dim=16, local_world=2)
    assert with_emb.embedding == emb
    assert with_emb.per_rank - plain.per_rank >= emb
    assert with_emb.planned - plain.planned >= 2 * emb      # one replica per local rank
    big = embedding_bytes(600, 100_000)                     # 3.8 GB of table: no budget holds it
    with pytest.raises(ValueError, match="node embeddings"):
        plan_budget(*args, embedding=big, embedding_dim=100_000)


def test_featureless_dataset_needs_embedding(featureless: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    rc = main(["train", str(featureless), "--output-dir", str(tmp_path / "r"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "has no node features" in err and "--embedding D" in err
    rc = main(["train", str(featureless), "--embedding", "8", "--device-cache", "1MB",
               "--output-dir", str(tmp_path / "r"), "--no-progress"])
    assert rc == 2 and "--device-cache" in capsys.readouterr().err


def test_embeddings_learn_two_communities_and_layerwise_eval_agrees(featureless: Path,
                                                                   tmp_path: Path) -> None:
    m = train(_cfg(featureless, tmp_path / "run"))
    # chance is 0.5; neighbours' trained embeddings carry the community
    assert m["test_acc"] >= 0.85, m["test_acc"]
    assert m["config"]["embedding"] == 16 and m["budget"]["embedding"] == embedding_bytes(600, 16)
    weights = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert weights["embedding.weight"].shape == (600, 16)
    # exact layer-wise inference (ooc eval) of the best model gives the scores sampled
    # full-neighbourhood evaluation gave during training
    ev = eval_run(tmp_path / "run")
    assert ev["val_acc"] == pytest.approx(m["val_acc"]) and ev["test_acc"] == pytest.approx(m["test_acc"])


def test_embedding_run_resumes_bit_identical(featureless: Path, tmp_path: Path) -> None:
    kw = dict(epochs=2, checkpoint_every=3, dropout=0.3, mode="hybrid", memory_budget="64MB")
    full = train(_cfg(featureless, tmp_path / "full", **kw))
    assert full["steps"] == 10
    with pytest.raises(Interrupted):
        train(_cfg(featureless, tmp_path / "part", **kw), stop_after_steps=7)
    resumed = train(_cfg(featureless, tmp_path / "part", **kw), resume=True)
    assert resumed["resumed"] and resumed["losses"] == full["losses"]
    wa = load_checkpoint(tmp_path / "full" / "checkpoint.pt")["model"]
    wb = load_checkpoint(tmp_path / "part" / "checkpoint.pt")["model"]
    assert wa.keys() == wb.keys() and "embedding.weight" in wa
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_embedding_concatenated_to_features(planted_dataset: Path, tmp_path: Path) -> None:
    m = train(_cfg(planted_dataset, tmp_path / "run", epochs=1, embedding=4, partitions=8))
    w = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert w["embedding.weight"].shape == (3000, 4)
    # the first layer reads 16 feature columns + 4 embedding columns
    assert w["model.layers.0.lin_self.weight"].shape == (16, 20)
    assert m["test_acc"] > 0.25
