"""Which per-epoch evaluation a node task runs (``--eval-mode auto``), and that out of core the
layer-wise one scores what sampled full-neighbourhood evaluation scores."""

from __future__ import annotations

from pathlib import Path

import pytest

from ooc.config import TrainConfig
from ooc.tasks.node import node_eval_mode
from ooc.training.loop import train


def _cfg(ds: Path | str, out: Path | str, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=2, seed=3, partitions=8, progress=False, hidden=16, eval_batch_size=64)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("kw, world, resident, want", [
    (dict(memory_budget="4MB"), 1, False, "layerwise"),                     # out of core
    (dict(memory_budget="4MB"), 1, True, "sampled"),                        # every partition resident
    (dict(), 1, False, "sampled"),                                          # no budget
    (dict(memory_budget="4MB"), 2, False, "sampled"),                       # ranks split sampled seeds
    (dict(memory_budget="4MB", eval_fanouts=[3, 3]), 1, False, "sampled"),  # sampled neighbourhoods
    (dict(memory_budget="4MB", eval_fanouts=[-1, -1]), 1, False, "layerwise"),
    (dict(memory_budget="4MB", model="mynets:Mean"), 1, False, "sampled"),  # may lack layer_forward
    (dict(memory_budget="4MB", eval_mode="sampled"), 1, False, "sampled"),
    (dict(eval_mode="layerwise"), 1, True, "layerwise"),
])
def test_auto_evaluates_layerwise_only_out_of_core_with_whole_neighbourhoods(
        kw: dict, world: int, resident: bool, want: str) -> None:
    assert node_eval_mode(_cfg("DS", "OUT", **kw), world, resident) == want


def test_out_of_core_layerwise_evaluation_scores_what_sampled_evaluation_scores(
        planted_dataset: Path, tmp_path: Path) -> None:
    kw = dict(memory_budget="2650kB", cache_size="40kB", topology="memory", mode="exact", epochs=3)
    auto = train(_cfg(planted_dataset, tmp_path / "auto", **kw))
    sampled = train(_cfg(planted_dataset, tmp_path / "sampled", eval_mode="sampled", **kw))
    assert auto["eval_mode"] == "layerwise" and sampled["eval_mode"] == "sampled"
    assert auto["budget"]["slots"] < auto["budget"]["num_parts"]
    assert auto["losses"] == sampled["losses"]
    for a, b in zip(auto["history"], sampled["history"]):
        assert a["val_acc"] == b["val_acc"] and a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    assert auto["test_acc"] == sampled["test_acc"] > 0.5


def test_layerwise_evaluation_plans_no_evaluation_batches(planted_dataset: Path, tmp_path: Path) -> None:
    # a full-neighbourhood batch of every validation node does not fit the budget; layer-wise
    # evaluation runs none, so the same budget trains with it and scores what sampled does unbounded
    kw = dict(memory_budget="1000kB", cache_size="40kB", topology="memory", mode="exact", epochs=1,
              eval_batch_size=3000, fanouts=[5, 5])
    with pytest.raises(ValueError, match=r"evaluation batches.*or --eval-mode layerwise \(no evaluation"):
        train(_cfg(planted_dataset, tmp_path / "sampled", eval_mode="sampled", **kw))
    m = train(_cfg(planted_dataset, tmp_path / "layerwise", eval_mode="layerwise", **kw))
    ref = train(_cfg(planted_dataset, tmp_path / "free", eval_mode="sampled", epochs=1,
                     eval_batch_size=3000, fanouts=[5, 5], topology="memory", mode="exact"))
    assert m["eval_mode"] == "layerwise" and m["losses"] == ref["losses"]
    inference = tmp_path / "layerwise" / "inference"  # scratch: nothing, or only kept inputs
    assert not inference.exists() or [p.name for p in inference.iterdir()] == ["propagated"]
    assert m["test_acc"] == ref["test_acc"] and m["val_acc"] == ref["val_acc"]


@pytest.fixture(scope="module")
def few_targets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 planted-partition nodes with 30 validation and 30 test nodes: their one-hop
    neighbourhoods are a small part of the graph."""
    from ooc.ingest.convert import write_graph_dataset
    from ooc.kernels.generators import planted_partition
    from ooc.kernels.partition import contiguous_partitions
    g = planted_partition(3000, num_classes=4, avg_degree=8, feat_dim=16, noise=2.0, seed=1,
                          train_frac=0.3)
    out = tmp_path_factory.mktemp("few") / "few"
    return write_graph_dataset(out, g.num_nodes, g.src, g.dst, g.features, g.labels,
                               {"train": g.train, "valid": g.valid[:30], "test": g.test[:30]},
                               g.num_classes, "few", partition_offsets=contiguous_partitions(3000, 8))


def test_layerwise_evaluations_after_the_first_reuse_layer0_inputs_and_score_the_same(
        few_targets: Path, tmp_path: Path) -> None:
    kw = dict(memory_budget="2650kB", cache_size="40kB", topology="memory", mode="exact", epochs=3)
    auto = train(_cfg(few_targets, tmp_path / "auto", **kw))
    sampled = train(_cfg(few_targets, tmp_path / "sampled", eval_mode="sampled", **kw))
    assert auto["eval_mode"] == "layerwise" and auto["losses"] == sampled["losses"]
    kept = tmp_path / "auto" / "inference" / "propagated"
    assert sorted(p.name for p in kept.iterdir()) == ["dests.npz", "propagated", "rows"]
    # the layers spilled to disk are scratch: only the kept inputs stay in the run folder
    assert sorted(p.name for p in kept.parent.iterdir()) == ["propagated"]
    for a, b in zip(auto["history"], sampled["history"]):
        assert a["val_acc"] == b["val_acc"] and a["test_acc"] == b["test_acc"]
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)


def test_a_dataset_without_validation_nodes_warns_that_model_selection_keeps_the_first(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from ooc.ingest.convert import write_graph_dataset
    from ooc.kernels.generators import planted_partition
    from ooc.kernels.partition import contiguous_partitions
    g = planted_partition(600, num_classes=2, avg_degree=6, feat_dim=4, noise=2.0, seed=1,
                          train_frac=0.5)
    ds = write_graph_dataset(tmp_path / "noval", g.num_nodes, g.src, g.dst, g.features, g.labels,
                             {"train": g.train, "test": g.test}, g.num_classes, "noval",
                             partition_offsets=contiguous_partitions(600, 8))
    with caplog.at_level("WARNING", logger="ooc"):
        m = train(_cfg(ds, tmp_path / "run", epochs=1))
    assert caplog.text.count("has no validation nodes") == 1 and "--weights last" in caplog.text
    assert m["val_acc"] == 0.0 and m["test_acc"] > 0.5
    caplog.clear()  # evaluating the run is not training it: no advice about model.pt
    from ooc.tools.cli import main
    with caplog.at_level("WARNING", logger="ooc"):
        assert main(["eval", str(tmp_path / "run"), "--weights", "last"]) == 0
    assert "validation" not in caplog.text
