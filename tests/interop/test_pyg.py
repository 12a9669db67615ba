"""PyTorch Geometric layers on ooc's batches: the conversion, the equivalence of PyG's and ooc's
SAGE layers, and Cora accuracy of ``examples/pyg_sage.py`` against ooc's own SAGE."""

from __future__ import annotations

import re
from types import ModuleType
from pathlib import Path

import pytest
import torch

from ooc.interop.pyg import PygStack, pyg_adjs, to_pyg
from ooc.models import SAGEConv as OocSAGE, TorchBlock

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture()
def pyg_nn() -> ModuleType:
    """``torch_geometric.nn``; the tests that need it skip without it."""
    return pytest.importorskip("torch_geometric.nn", reason="torch_geometric not installed "
                               "(pip install 'ooc-gnn[pyg]')")


def test_blocks_become_bipartite_edge_index_and_size() -> None:
    b = TorchBlock.from_edges(4, 2, [2, 3, 1, 0], [0, 0, 1, 1])
    (adj,) = pyg_adjs([b])
    assert torch.equal(adj.edge_index, torch.tensor([[2, 3, 1, 0], [0, 0, 1, 1]]))
    assert adj.size == (4, 2) and adj.edge_weight is None


def test_pyg_sage_equals_ooc_sage_with_the_same_weights(pyg_nn) -> None:
    torch.manual_seed(0)
    # destination 0 has sources 2, 3; destination 1 has 0 (itself) and 3; destination 2 none
    b = TorchBlock.from_edges(5, 3, [2, 3, 0, 3], [0, 0, 1, 1])
    x = torch.randn(5, 6)
    ours = OocSAGE(6, 4, "mean")
    theirs = pyg_nn.SAGEConv(6, 4)   # lin_l (neighbours, bias) + lin_r (root, no bias)
    with torch.no_grad():
        theirs.lin_l.weight.copy_(ours.lin_neigh.weight)
        theirs.lin_l.bias.copy_(ours.lin_self.bias)
        theirs.lin_r.weight.copy_(ours.lin_self.weight)
    adj = pyg_adjs([b])[0]
    got = theirs((x, x[:3]), adj.edge_index, size=adj.size)
    assert torch.allclose(got, ours(b, x), atol=1e-6)
    # the mean of the sampled neighbours, by hand, for destination 0
    want0 = ours.lin_self(x[0]) + ours.lin_neigh((x[2] + x[3]) / 2)
    assert torch.allclose(got[0], want0, atol=1e-6)
    stack = PygStack([theirs], [6, 4], dropout=0.0)
    assert torch.equal(stack([b], x), got) and torch.equal(stack.layer_forward(0, b, x), got)


def test_to_pyg_on_a_data_path_batch(planted_dataset: Path, tmp_path: Path) -> None:
    from ooc.config import TrainConfig
    from ooc.storage.dataset import Dataset
    from ooc.tasks.node import NodeTask
    cfg = TrainConfig(dataset=str(planted_dataset), output_dir=str(tmp_path), fanouts=[3, 3],
                      batch_size=32, partitions=8, progress=False)
    cfg.validate()
    task = NodeTask(cfg, Dataset(planted_dataset))
    try:
        batch = next(iter(task.batches(task.plan(0), 0, 0)))
        pb = to_pyg(batch)
        assert pb.batch_size == 32 and pb.y.shape == (32,) and len(pb.adjs) == 2
        assert torch.equal(pb.n_id[:32], torch.from_numpy(batch.seeds))   # seeds first
        assert pb.x.shape == (pb.adjs[0].size[0], 16) and pb.x.dtype == torch.float32
        assert pb.adjs[0].size[1] == pb.adjs[1].size[0]                    # layers nest
        for adj in pb.adjs:
            ns, nd = adj.size
            assert int(adj.edge_index[0].max()) < ns and int(adj.edge_index[1].max()) < nd
        # the rows are the stored features of n_id
        want = task.data.features(pb.n_id.numpy())
        assert torch.equal(pb.x, want)
    finally:
        task.close()


def test_example_reaches_ooc_sage_accuracy_on_cora(pyg_nn, cora_dataset: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    from ooc.config import TrainConfig
    from ooc.training.loop import train
    epochs = 30
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import pyg_sage
    acc = pyg_sage.main([str(cora_dataset), "--epochs", str(epochs), "--eval-every", "5",
                         "--lr", "0.02", "--seed", "0"])
    out = capsys.readouterr().out
    assert re.search(r"^test accuracy \d\.\d{4}$", out, re.M), out
    ours = train(TrainConfig(dataset=str(cora_dataset), output_dir=str(tmp_path / "ooc"), model="sage",
                             fanouts=[10, 10], batch_size=256, hidden=64, dropout=0.5, lr=0.02,
                             weight_decay=5e-4, feat_norm="row", epochs=epochs, eval_every=5,
                             partitions=4, seed=0, progress=False))
    # the same band: both well above Cora's 0.32 majority class
    print(f"PyG SAGEConv {acc:.4f}, ooc SAGE {ours['test_acc']:.4f}")
    assert acc >= 0.75 and ours["test_acc"] >= 0.75, (acc, ours["test_acc"])


def test_the_example_class_trains_under_ooc_train(pyg_nn, planted_dataset: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``ooc train --model pyg_sage:SAGE`` (examples/ on PYTHONPATH): the loop, layer-wise
    evaluation and ``ooc eval`` run PyG's layers through PygStack."""
    import json
    from ooc.tools.cli import main
    monkeypatch.syspath_prepend(str(EXAMPLES))
    run = tmp_path / "run"
    assert main(["train", str(planted_dataset), "--model", "pyg_sage:SAGE", "--fanout", "5,5",
                 "--batch-size", "256", "--epochs", "2", "--hidden", "16", "--partitions", "8",
                 "--eval-mode", "layerwise", "--no-progress", "--output-dir", str(run)]) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert m["test_acc"] > 0.5                                      # 4 planted classes
    assert main(["eval", str(run)]) == 0
    assert json.loads((run / "eval.json").read_text())["test_acc"] == pytest.approx(m["test_acc"])
