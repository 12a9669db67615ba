"""``ooc train --model MODULE:CLASS``: a user's module trains through the one loop; a class that
does not fit the documented contract is refused before training, naming the class and the gap."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ooc.config import TrainConfig
from ooc.interop.custom import build_custom_model
from ooc.tools.cli import main
from ooc.training.loop import train

NETS = '''
import torch
from torch import nn
from ooc.models import GNN, aggregate


class Mean(nn.Module):
    """x_v W_s + mean_u x_u W_n per layer, written against ooc's TorchBlock."""

    def __init__(self, in_dim, hidden, out_dim, num_layers, dropout=0.0, act="relu"):
        super().__init__()
        self.dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.self_lin = nn.ModuleList(nn.Linear(a, b) for a, b in zip(self.dims, self.dims[1:]))
        self.neigh_lin = nn.ModuleList(nn.Linear(a, b) for a, b in zip(self.dims, self.dims[1:]))
        self.act = act

    def forward(self, blocks, x):
        for i, b in enumerate(blocks):
            x = self.self_lin[i](x[: b.num_dst]) + self.neigh_lin[i](aggregate(b, x, "mean"))
            if i < len(blocks) - 1:
                x = torch.relu(x)
        return x


class MeanLayerwise(Mean):
    num_layers = 2

    def layer_forward(self, i, block, h):
        out = self.self_lin[i](h[: block.num_dst]) + self.neigh_lin[i](aggregate(block, h, "mean"))
        return torch.relu(out) if i < len(self.self_lin) - 1 else out


class Sage(nn.Module):
    """ooc's own GNN inside a user's class: must train exactly like --model sage."""

    def __init__(self, in_dim, hidden, out_dim, num_layers, dropout):
        super().__init__()
        self.gnn = GNN("sage", in_dim, hidden, out_dim, num_layers, dropout)

    def forward(self, blocks, x):
        return self.gnn(blocks, x)


class NoHidden(nn.Module):
    def __init__(self, in_dim, out_dim, num_layers):
        super().__init__()

    def forward(self, blocks, x):
        return x


class OneArgForward(Mean):
    def forward(self, x):
        return x


class WrongShape(Mean):
    def forward(self, blocks, x):
        return x


class NotAModule:
    pass
'''


@pytest.fixture()
def nets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "mynets.py").write_text(textwrap.dedent(NETS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _args(ds: Path, out: Path, model: str, *extra: str) -> list[str]:
    return ["train", str(ds), "--model", model, "--fanout", "5,5", "--batch-size", "256",
            "--epochs", "2", "--hidden", "16", "--partitions", "8", "--no-progress",
            "--output-dir", str(out), *extra]


def test_user_module_trains_and_evaluates(planted_dataset: Path, nets: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    run = nets / "run"
    assert main(_args(planted_dataset, run, "mynets:Mean")) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert m["config"]["model"] == "mynets:Mean" and m["test_acc"] > 0.5   # 4 classes
    # without layer_forward, ooc eval is refused by name
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert "mynets:Mean" in err and "layer_forward" in err
    run2 = nets / "run2"
    assert main(_args(planted_dataset, run2, "mynets:MeanLayerwise", "--eval-mode", "layerwise")) == 0
    m2 = json.loads((run2 / "metrics.json").read_text())
    assert main(["eval", str(run2)]) == 0
    ev = json.loads((run2 / "eval.json").read_text())
    assert ev["test_acc"] == pytest.approx(m2["test_acc"])


def test_user_class_wrapping_ooc_sage_trains_bit_identically(planted_dataset: Path, nets: Path) -> None:
    kw = dict(dataset=str(planted_dataset), fanouts=[5, 5], batch_size=256, epochs=1, hidden=16,
              partitions=8, progress=False, seed=2)
    a = train(TrainConfig(output_dir=str(nets / "a"), model="sage", **kw))
    b = train(TrainConfig(output_dir=str(nets / "b"), model="mynets:Sage", **kw))
    # the check forward before training leaves the random streams alone
    assert a["losses"] == b["losses"] and a["test_acc"] == b["test_acc"]


@pytest.mark.parametrize("model,extra,words", [
    ("mynets:Mean", ["--eval-mode", "layerwise"], ["mynets:Mean", "--eval-mode layerwise",
                                                   "layer_forward"]),
    ("mynets:Mean", ["--task", "link"], ["mynets:Mean", "--task link", "layer_forward"]),
    ("mynets:NoHidden", [], ["NoHidden.__init__", "hidden"]),
    ("mynets:OneArgForward", [], ["OneArgForward.forward", "(blocks, x)"]),
    ("mynets:WrongShape", [], ["mynets:WrongShape", "returned (2, 16)", "(1, 4)"]),
    ("mynets:NotAModule", [], ["NotAModule", "torch.nn.Module"]),
    ("mynets:Missing", [], ["mynets", "no 'Missing'"]),
    ("nosuchmodule:Net", [], ["cannot import module 'nosuchmodule'", "PYTHONPATH"]),
    ("mynets:Mean", ["--model-options", "{heads: 4}"], ["Mean.__init__", "'heads'"]),
])
def test_classes_that_do_not_fit_are_refused_before_training(planted_dataset: Path, nets: Path,
                                                             capsys: pytest.CaptureFixture,
                                                             model: str, extra: list[str],
                                                             words: list[str]) -> None:
    run = nets / "refused"
    assert main(_args(planted_dataset, run, model, *extra)) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, (w, err)
    assert not run.exists()    # nothing trained, no run folder left


def test_model_options_reach_the_constructor(planted_dataset: Path, nets: Path) -> None:
    cfg = TrainConfig(dataset=str(planted_dataset), model="mynets:Mean", model_options={"act": "elu"},
                      dropout=0.25)
    cfg.validate()
    m = build_custom_model(cfg, 16, 4)
    assert m.act == "elu" and m.dims == [16, 64, 4]
    with pytest.raises(ValueError, match="model.options applies to --model MODULE:CLASS"):
        TrainConfig(dataset=str(planted_dataset), model="sage", model_options={"act": "elu"}).validate()
