"""The training loop: YAML config and overrides, label leakage, early stopping, LR schedule,
per-epoch/per-step logs, multi-label tasks, mixed-precision code path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ooc.training.checkpoint import load_checkpoint
from ooc.config import ConfigError, TrainConfig
from ooc.models import MODELS, TorchBlock, build_model
from ooc.tools.cli import main
from ooc.training.loop import make_model, train


def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=2, seed=3, partitions=8, buffer_partitions=2, progress=False, hidden=16)
    base.update(kw)
    return TrainConfig(**base)


# ---------------------------------------------------------------- configuration
def test_yaml_nested_and_flat_with_precedence(tmp_path: Path) -> None:
    p = tmp_path / "run.yaml"
    p.write_text("data: {dataset: d, partitions: 3}\nmodel: {name: gat, hidden: 32, heads: 4}\n"
                 "epochs: 7\nsampler: {fanouts: [4, 3]}\n")
    cfg = TrainConfig.from_sources(p, {"hidden": 64, "lr": 0.1}, ["model.hidden=256", "train.lr=0.005",
                                                                   "residual=true", "fanouts=2,2,2"])
    assert (cfg.dataset, cfg.partitions, cfg.model, cfg.heads, cfg.epochs) == ("d", 3, "gat", 4, 7)
    assert cfg.hidden == 256 and cfg.lr == 0.005 and cfg.residual is True
    assert cfg.fanouts == [2, 2, 2]
    # the saved YAML reproduces the configuration
    again = TrainConfig().update(yaml.safe_load(cfg.to_yaml()))
    assert again == cfg


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    """A config file that is not YAML is refused naming the file (twice: ours, and the parser's
    mark, which used to say ``<unicode string>``) and the line of the error."""
    p = tmp_path / "run.yaml"
    p.write_text("epochs: 3\nmodel: {name: sage\nlr: 0.1\n")
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_sources(p, {}, [])
    msg = str(err.value)
    assert msg.startswith(f"{p}: not valid YAML") and f'in "{p}", line 3' in msg
    assert "<unicode string>" not in msg


@pytest.mark.parametrize("sets,match", [
    (["model.hiden=3"], "did you mean 'model.hidden'"),
    (["hidden=abc"], "hidden expects int"),
    (["residual=maybe"], "residual expects bool"),
    (["lr"], "expected KEY=VALUE"),
])
def test_config_errors_name_the_option(sets: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrainConfig().apply_sets(sets)


def test_validate_rejects_bad_combinations() -> None:
    with pytest.raises(ValueError, match=r"--model \(model.name\) must be one of"):
        TrainConfig(dataset="d", model="mlp").validate()
    with pytest.raises(ValueError, match="divisible by heads"):
        TrainConfig(dataset="d", model="gat", hidden=10, heads=4).validate()
    with pytest.raises(ValueError, match=r"--feat-dropout \(model.feat_dropout\) must be in"):
        TrainConfig(dataset="d", model="gat", feat_dropout=1.0).validate()
    with pytest.raises(ValueError, match="no dataset"):
        TrainConfig().validate()


def test_cli_config_file_flags_and_set(planted_dataset: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    conf = tmp_path / "run.yaml"
    conf.write_text(yaml.safe_dump({
        "data": {"dataset": str(planted_dataset), "partitions": 8, "buffer_partitions": 2},
        "sampler": {"fanouts": [5, 5], "batch_size": 128},
        "model": {"name": "gcn", "hidden": 32},
        "train": {"epochs": 3, "lr": 0.02},
        "run": {"output_dir": str(tmp_path / "ignored"), "progress": False}}))
    run = tmp_path / "run"
    rc = main(["train", "--config", str(conf), "--epochs", "1", "--output-dir", str(run),
               "--set", "model.hidden=8", "--set", "model.name=gin"])
    assert rc == 0, capsys.readouterr().err
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["name"] == "gin" and saved["model"]["hidden"] == 8
    assert saved["train"]["epochs"] == 1 and saved["train"]["lr"] == 0.02
    assert saved["sampler"]["batch_size"] == 128
    flat = json.loads((run / "config.json").read_text())
    assert flat["model"] == "gin" and flat["hidden"] == 8
    assert not (tmp_path / "ignored").exists()
    # the saved config reruns the same training
    assert main(["train", "--config", str(run / "config.yaml"), "--output-dir", str(tmp_path / "b")]) == 0
    a = json.loads((run / "metrics.json").read_text())
    b = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert a["losses"] == b["losses"]
    assert main(["train", "--config", str(conf), "--set", "model.hidden=x"]) == 2
    assert "hidden expects int" in capsys.readouterr().err


# ---------------------------------------------------------------- label leakage
def test_poisoned_validation_and_test_labels_leave_training_unchanged(tmp_path: Path) -> None:
    from ooc.kernels.generators import planted_partition
    from ooc.ingest.convert import write_graph_dataset
    g = planted_partition(1500, num_classes=4, avg_degree=8, feat_dim=16, noise=2.0, seed=2,
                          train_frac=0.3)
    poisoned = g.labels.copy()
    poisoned[g.valid] = -1
    poisoned[g.test] = -1
    paths = []
    for name, labels in (("clean", g.labels), ("poisoned", poisoned)):
        paths.append(write_graph_dataset(tmp_path / name, g.num_nodes, g.src, g.dst, g.features, labels,
                                         {"train": g.train, "valid": g.valid, "test": g.test},
                                         g.num_classes, name))
    runs = []
    for p in paths:
        m = train(_cfg(p, tmp_path / f"run-{p.name}", model="gat", heads=2, epochs=3))
        runs.append((m, load_checkpoint(tmp_path / f"run-{p.name}" / "checkpoint.pt")["model"]))
    (ma, wa), (mb, wb) = runs
    assert ma["losses"] == mb["losses"]
    assert [h["train_acc"] for h in ma["history"]] == [h["train_acc"] for h in mb["history"]]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert ma["test_acc"] > 0.5 and mb["test_acc"] == 0.0  # only evaluation saw the labels


# ---------------------------------------------------------------- loop features
def test_early_stopping_and_best_model(planted_dataset: Path, tmp_path: Path) -> None:
    # lr 0: the model never changes, so validation never improves after the first evaluation
    m = train(_cfg(planted_dataset, tmp_path / "run", epochs=10, lr=0.0, patience=2))
    assert m["stopped_early"] and m["epochs_run"] == 3
    assert m["best_epoch"] == 0
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3


def test_gat_early_stopping_rule_sequence() -> None:
    from ooc.training.loop import _gat_rule, _State
    st = _State()
    seq = [(0.5, 1.0), (0.6, 1.1), (0.55, 0.9), (0.6, 0.8), (0.58, 0.85), (0.61, 0.95)]
    got = [_gat_rule(st, acc, {"val_loss": loss}) for acc, loss in seq]
    # (better = keep the model, progress = restart patience)
    assert got == [(True, True), (False, True), (False, True), (True, True), (False, False), (False, True)]
    assert (st.top_val, st.min_val_loss) == (0.61, 0.8)
    with pytest.raises(ValueError, match="no val_loss"):
        _gat_rule(st, 0.7, {})


def test_gat_early_stopping_keeps_ties_and_does_not_stop_on_them(planted_dataset: Path,
                                                                 tmp_path: Path) -> None:
    # lr 0: every evaluation ties the best score and loss; the score rule stops after `patience`
    # evaluations (test above), the GAT rule counts a tie as progress and keeps the latest model
    m = train(_cfg(planted_dataset, tmp_path / "run", epochs=4, lr=0.0, patience=2,
                   early_stop="score_or_loss"))
    assert not m["stopped_early"] and m["epochs_run"] == 4 and m["best_epoch"] == 3
    assert len({h["val_loss"] for h in m["history"]}) == 1


def test_val_loss_same_in_layerwise_and_sampled_evaluation(planted_dataset: Path, tmp_path: Path) -> None:
    runs = {mode: train(_cfg(planted_dataset, tmp_path / mode, epochs=3, eval_mode=mode,
                             early_stop="score_or_loss", patience=5))
            for mode in ("layerwise", "sampled")}
    a, b = ([h["val_loss"] for h in runs[k]["history"]] for k in ("layerwise", "sampled"))
    assert a == pytest.approx(b, rel=1e-5) and 0.05 < a[-1] < a[0] < 2.0  # learning: the loss drops
    assert runs["layerwise"]["losses"] == runs["sampled"]["losses"]
    # the best epoch is the latest one at least as good as all before in score and loss
    hist = runs["layerwise"]["history"]
    best = max(i for i, h in enumerate(hist) if all(h["val_acc"] >= g["val_acc"] and
                                                    h["val_loss"] <= g["val_loss"] for g in hist[:i]))
    assert runs["layerwise"]["best_epoch"] == best


def test_early_stop_rule_needs_a_node_task() -> None:
    with pytest.raises(ValueError, match="task node only"):
        TrainConfig(dataset="d", task="link", early_stop="score_or_loss").validate()


def test_lr_schedule_and_logs(planted_dataset: Path, tmp_path: Path) -> None:
    m = train(_cfg(planted_dataset, tmp_path / "run", epochs=3, lr_schedule="step", lr_step=1,
                   lr_gamma=0.5))
    assert [h["lr"] for h in m["history"]] == [0.01, 0.005, 0.0025]
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in recs] == [0, 1, 2]
    for r in recs:
        for k in ("loss", "train_acc", "val_acc", "test_acc", "seeds_per_s", "edges_per_s", "stall_s",
                  "bytes_read", "buffer_hit_ratio", "epoch_time_s", "lr"):
            assert k in r, k
        assert r["seeds_per_s"] > 0 and r["edges_per_s"] > 0
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(45))
    assert [s["loss"] for s in steps] == m["losses"]
    assert all(s["stall_s"] >= 0 and s["compute_s"] > 0 for s in steps)
    assert steps[-1]["t"] > steps[0]["t"]
    assert sum(s["seeds"] for s in steps[:15]) == 900


def test_multilabel_node_classification(tmp_path: Path) -> None:
    from ooc.kernels.generators import planted_partition
    from ooc.ingest.convert import write_graph_dataset
    g = planted_partition(1500, num_classes=4, avg_degree=8, feat_dim=16, noise=1.0, seed=4,
                          train_frac=0.4)
    y = np.zeros((g.num_nodes, 3), dtype=np.int32)  # class 0/1 -> bit 0, class 1/2 -> bit 1, 3 -> bit 2
    y[:, 0] = g.labels <= 1
    y[:, 1] = (g.labels == 1) | (g.labels == 2)
    y[:, 2] = g.labels == 3
    ds = write_graph_dataset(tmp_path / "ml", g.num_nodes, g.src, g.dst, g.features, y,
                             {"train": g.train, "valid": g.valid, "test": g.test}, 3, "multilabel")
    m = train(_cfg(ds, tmp_path / "run", epochs=3, model="sage", lr=0.02))
    assert m["metric"] == "micro_f1"
    assert m["test_acc"] > 0.7
    assert m["history"][-1]["train_acc"] > 0.6


def test_amp_flag_is_ignored_on_cpu(planted_dataset: Path, tmp_path: Path) -> None:
    a = train(_cfg(planted_dataset, tmp_path / "a", epochs=1))
    b = train(_cfg(planted_dataset, tmp_path / "b", epochs=1, amp=True, device="cpu"))
    assert a["losses"] == b["losses"]


@pytest.mark.parametrize("model", MODELS)
def test_every_model_runs_under_autocast(model: str) -> None:
    """The mixed-precision code path (autocast) on CPU with bfloat16: the layers accept mixed dtypes."""
    torch.manual_seed(0)
    net = build_model(model, 6, 8, 3, num_layers=2, dropout=0.1, heads=2, residual=True, norm="batch")
    blocks = [TorchBlock.from_edges(7, 5, [5, 6, 0, 1], [0, 0, 2, 3]), TorchBlock.from_edges(5, 3, [3, 4], [0, 2])]
    x = torch.randn(7, 6)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = net(blocks, x)
    loss = out.float().square().mean()
    loss.backward()
    assert torch.isfinite(out.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)


def test_weight_decay_scope_first_layer_only(planted_dataset: Path) -> None:
    from ooc.training.loop import _make_optimizer
    net = build_model("gcn", 16, 8, 4, num_layers=2, dropout=0.5)
    opt = _make_optimizer(TrainConfig(weight_decay=0.1, weight_decay_scope="first"), net)
    g0, g1 = opt.param_groups
    assert g0["weight_decay"] == 0.1 and g1["weight_decay"] == 0.0
    assert {id(p) for p in g0["params"]} == {id(p) for p in net.layers[0].parameters()}
    assert len(g0["params"]) + len(g1["params"]) == len(list(net.parameters()))


def test_cli_accepts_negative_fanouts(planted_dataset: Path, tmp_path: Path) -> None:
    assert main(["train", str(planted_dataset), "--fanout", "-1,-1", "--epochs", "1", "--partitions", "8",
                 "--hidden", "8", "--output-dir", str(tmp_path / "r"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "r" / "config.json").read_text())["fanouts"] == [-1, -1]


# ---------------------------------------------------------------- accuracy-table configs
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_table_configs_load_and_hold_the_published_settings() -> None:
    cfgs = {p.stem: TrainConfig.from_sources(p) for p in sorted(CONFIGS.glob("*.yaml"))}
    assert set(cfgs) >= {f"{d}-{m}" for d in ("cora", "citeseer") for m in ("gcn", "gat", "sage", "gin")} | \
        {"actor-sage", "actor-gcn"}
    for name, cfg in cfgs.items():
        cfg.validate()
        assert cfg.model == name.split("-")[1] and cfg.fanouts == [-1, -1] and cfg.feat_norm == "row"
        assert cfg.eval_mode == "layerwise" and cfg.batch_size >= 3648  # full batch (Actor: 3648 train)
    for name in ("cora-gat", "citeseer-gat"):
        # Velickovic et al.: 8 heads x 8 hidden, 1 output head; dropout 0.6 on the input (per head, as
        # the reference code), on the aggregated W x and on the attention weights
        gat = cfgs[name]
        assert (gat.heads, gat.hidden, gat.out_heads, gat.dropout, gat.attn_dropout, gat.feat_dropout,
                gat.dropout_per_head, gat.lr, gat.weight_decay, gat.patience * gat.eval_every,
                gat.activation, gat.early_stop) == \
            (8, 64, 1, 0.6, 0.6, 0.6, True, 0.005, 5e-4, 100, "elu", "score_or_loss")
        net = make_model(gat, 20, 6)  # the trainer's model carries both options into the layers
        assert net.dropout.p == 0.0
        assert [(m.head_dropout, m.feat_dropout.p) for m in net.layers] == [(0.6, 0.6), (0.6, 0.6)]
    gcn = cfgs["cora-gcn"]  # Kipf & Welling: 16 hidden, dropout 0.5, lr 0.01, L2 5e-4 on layer 1, 200 epochs
    assert (gcn.hidden, gcn.dropout, gcn.lr, gcn.weight_decay, gcn.weight_decay_scope, gcn.epochs) == \
        (16, 0.5, 0.01, 5e-4, "first", 200)
    assert cfgs["actor-sage"].dataset == "data/actor/split{i}"


def test_split_placeholder_in_a_single_run(planted_dataset: Path, tmp_path: Path) -> None:
    # data/actor/split{i} of a --repeat config names split0 when the run is alone
    (tmp_path / "split0").symlink_to(planted_dataset, target_is_directory=True)
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "split{i}"), "--epochs", "1", "--fanout", "3,3", "--hidden", "8",
                 "--no-progress", "--output-dir", str(run)]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["dataset"] == str(tmp_path / "split0")


def test_a_non_finite_loss_stops_the_run_with_an_error(tmp_path: Path, capsys) -> None:
    """Features with NaN in them (as damaged chunks read under ``--verify structure`` give): the
    first non-finite loss stops training with an error that names the epoch and batch and points
    at ``ooc verify``; the command exits non-zero and leaves no run directory behind."""
    from ooc.ingest.convert import write_graph_dataset
    from ooc.kernels.generators import planted_partition
    from ooc.training.loop import DivergedError
    g = planted_partition(600, num_classes=3, avg_degree=6, feat_dim=8, noise=1.0, seed=2,
                          train_frac=0.5)
    ds = write_graph_dataset(tmp_path / "nan", g.num_nodes, g.src, g.dst, g.features, g.labels,
                             {"train": g.train, "valid": g.valid, "test": g.test}, g.num_classes,
                             "nan")
    from ooc.storage.dataset import Dataset
    d = Dataset(ds)
    chunk = Path(d.raw("features").chunk_path(0))
    d.close()
    raw = np.fromfile(chunk, dtype=np.uint8)
    raw[: 4 * 8 * 600].view(np.float32)[:] = np.nan  # every row of the first chunk (8 columns)
    raw.tofile(chunk)
    with pytest.raises(DivergedError, match=r"epoch 0, batch 0 \(step 0\): the training loss is nan"):
        train(_cfg(ds, tmp_path / "run", partitions=1, buffer_partitions=1, verify="structure"))
    out = tmp_path / "cli"
    assert main(["train", str(ds), "--epochs", "1", "--no-progress", "--verify", "structure",
                 "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the training loss is nan" in err and f"ooc verify {ds}" in err
    assert not out.exists()
