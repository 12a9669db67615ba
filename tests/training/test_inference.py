"""Layer-wise full-neighbour inference: equal to sampled full-neighbour inference, out of core through
per-layer Zarr arrays, `ooc eval` / `ooc predict` with rows in original id order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from ooc.config import TrainConfig
from ooc.inference import layerwise_inference
from ooc.training.runs import predict_run
from ooc.models import MODELS
from ooc.storage.dataset import Dataset, DatasetWriter
from ooc.tools.cli import main
from ooc.tasks.node import NodeTask
from ooc.training.loop import make_model, train


def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=2, seed=3, partitions=8, buffer_partitions=2, progress=False, hidden=16,
                eval_batch_size=256)
    base.update(kw)
    return TrainConfig(**base)


def _three_layers(ds_path: Path, tmp_path: Path, model: str) -> tuple[Dataset, NodeTask, torch.nn.Module]:
    """The dataset, a node task over it and a seeded 3-layer ``model`` in eval mode."""
    cfg = _cfg(ds_path, tmp_path / "run", model=model, heads=2, residual=True, norm="batch",
               fanouts=[4, 4, 4])
    cfg.validate()
    ds = Dataset(ds_path)
    task = NodeTask(cfg, ds)
    torch.manual_seed(0)
    return ds, task, make_model(cfg, ds.feat_dim, task.out_dim).eval()


@pytest.mark.parametrize("model", MODELS)
def test_layerwise_equals_sampled_full_neighbourhood(planted_dataset: Path, tmp_path: Path,
                                                     model: str) -> None:
    ds, task, net = _three_layers(planted_dataset, tmp_path, model)
    outs = layerwise_inference(net, task.data, batch_size=300, out_dir=tmp_path / "layers",
                               keep=(1, 2))
    # one Zarr array per kept layer, all N rows; layer 0 was deleted once layer 1 was done
    assert sorted(p.name for p in (tmp_path / "layers").iterdir()) == ["layer1", "layer2"]
    z = zarr.open_array(tmp_path / "layers" / "layer2", mode="r")
    assert z.shape == (3000, 4)
    ids = np.array([0, 5, 17, 999, 1500, 2999, 2047])
    b = task.data.eval_batch(0, ids, task.data.eval_sampler([-1, -1, -1]))
    with torch.no_grad():
        expect = net(b.blocks, b.x.float()).numpy()
    np.testing.assert_allclose(outs[2].gather(ids), expect, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(z[:][ids], expect, rtol=1e-4, atol=1e-5)
    assert outs[1].shape == (3000, 16)
    for o in outs.values():
        o.close()
    task.close()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("memory", [None, 0, 1 << 30])
def test_layerwise_over_targets_equals_sampled_full_neighbourhood(planted_dataset: Path, tmp_path: Path,
                                                                  model: str, memory: int | None) -> None:
    # memory None: cut rows gathered once, layers in out_dir (given); 0: cut rows batch by batch,
    # layers spilled to out_dir; 1 GiB: cut rows gathered once, layers in memory
    ds, task, net = _three_layers(planted_dataset, tmp_path, model)
    targets = np.array([2999, 5, 17, 5, 1500, 0, 2047])
    outs = layerwise_inference(net, task.data, batch_size=50, out_dir=tmp_path / "layers",
                               keep=(0, 2), targets=targets, memory=memory)
    spilled = (tmp_path / "layers").exists()
    assert spilled == (memory != 1 << 30)
    ids = np.unique(targets)
    np.testing.assert_array_equal(outs[2].ids, ids)  # only the targets' rows, sorted
    # layer 0 computed the 2-hop neighbourhood of the targets and nothing else
    from ooc.inference import needed_nodes
    dests = needed_nodes(task.data.eval_sampler([-1]), targets, 3)
    np.testing.assert_array_equal(outs[0].ids, dests[0])
    assert dests[2].shape[0] < dests[1].shape[0] < dests[0].shape[0] < ds.num_nodes
    b = task.data.eval_batch(0, ids, task.data.eval_sampler([-1, -1, -1]))
    with torch.no_grad():
        expect = net(b.blocks, b.x.float()).numpy()
    np.testing.assert_allclose(outs[2].gather(ids), expect, rtol=1e-4, atol=1e-5)
    outside = np.setdiff1d(np.arange(ds.num_nodes), dests[0])[:1]
    with pytest.raises(KeyError, match=f"node {int(outside[0])}"):
        outs[0].gather(outside)
    for o in outs.values():
        o.close()
    task.close()


def test_cut_rows_held_in_phases_give_the_same_outputs(planted_dataset: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import ooc.inference as inf
    cfg = _cfg(planted_dataset, tmp_path / "run", fanouts=[4, 4])
    cfg.validate()
    ds = Dataset(planted_dataset)
    task = NodeTask(cfg, ds)
    torch.manual_seed(0)
    net = make_model(cfg, ds.feat_dim, task.out_dim).eval()
    targets = np.arange(0, ds.num_nodes, 97)
    whole = layerwise_inference(net, task.data, 64, keep=(1,), targets=targets)[1]
    used = []
    real = inf._halo_phases

    def thirds(cut, num_parts, row_bytes, cap):  # room for about a third of the cut rows
        counts = [c.shape[0] for c in cut.values()]
        total = np.unique(np.concatenate(list(cut.values()))).shape[0]
        got = real(cut, num_parts, row_bytes, max(max(counts), total // 2) * row_bytes)
        used.append(got)
        return got
    monkeypatch.setattr(inf, "_halo_phases", thirds)
    phased = layerwise_inference(net, task.data, 64, keep=(1,), targets=targets)[1]
    assert used and used[0] is not None and 2 <= len(used[0]) <= inf.MAX_HALO_PHASES
    assert [(a, b) for a, b, _ in used[0]] == sorted((a, b) for a, b, _ in used[0])
    assert used[0][0][0] == 0 and used[0][-1][1] == ds.partition_offsets.shape[0] - 1
    np.testing.assert_array_equal(phased.ids, whole.ids)
    np.testing.assert_allclose(phased.array, whole.array, rtol=1e-5, atol=1e-6)
    task.close()


def test_halo_phases_split_partitions_by_their_cut_rows() -> None:
    from ooc.inference import _halo_phases
    cut = {0: np.array([5, 6]), 1: np.array([0, 9]), 2: np.array([1]), 3: np.array([2, 3, 4])}
    assert [(a, b, c.tolist()) for a, b, c in _halo_phases(cut, 4, 10, None)] == \
        [(0, 4, [0, 1, 2, 3, 4, 5, 6, 9])]
    assert [(a, b, c.tolist()) for a, b, c in _halo_phases(cut, 4, 10, 40)] == \
        [(0, 2, [0, 5, 6, 9]), (2, 4, [1, 2, 3, 4])]
    assert _halo_phases(cut, 4, 10, 25) is None  # partition 3 alone needs 30 bytes
    assert _halo_phases(cut, 4, 10, 5) is None  # not one row
    assert [(a, b) for a, b, _ in _halo_phases({}, 3, 10, 0)] == [(0, 3)]


def test_needed_nodes_of_a_path_are_the_hops_behind_the_targets() -> None:
    from ooc.inference import needed_nodes
    from ooc.sampling.samplers import NeighborSampler
    # CSC of the path 0 -> 1 -> 2 -> 3 -> 4 -> 5 (in-neighbour of v is v - 1) plus 5 -> 0's absence
    indptr = np.array([0, 0, 1, 2, 3, 4, 5], dtype=np.int64)
    indices = np.array([0, 1, 2, 3, 4], dtype=np.int64)
    sampler = NeighborSampler(indptr, indices, [-1])
    dests = needed_nodes(sampler, np.array([4, 4]), 3, batch_size=1)
    assert [d.tolist() for d in dests] == [[2, 3, 4], [3, 4], [4]]
    dests = needed_nodes(sampler, np.array([1, 0]), 3)
    assert [d.tolist() for d in dests] == [[0, 1], [0, 1], [0, 1]]
    assert [d.tolist() for d in needed_nodes(sampler, np.array([5]), 1)] == [[5]]


def test_eval_mode_layerwise_matches_sampled(planted_dataset: Path, tmp_path: Path) -> None:
    a = train(_cfg(planted_dataset, tmp_path / "a", model="gcn", epochs=3))
    b = train(_cfg(planted_dataset, tmp_path / "b", model="gcn", epochs=3, eval_mode="layerwise"))
    assert a["losses"] == b["losses"]
    assert [h["val_acc"] for h in a["history"]] == [h["val_acc"] for h in b["history"]]
    assert a["test_acc"] == b["test_acc"]


def test_cli_eval_and_predict(planted_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    m = train(_cfg(planted_dataset, run, model="gat", heads=2, epochs=3))
    assert main(["eval", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "test_acc" in out
    ev = json.loads((run / "eval.json").read_text())
    assert ev["test_acc"] == pytest.approx(m["test_acc"], abs=2 / 900)
    assert ev["val_acc"] == pytest.approx(m["val_acc"], abs=2 / 900)
    assert not (run / "inference").exists()
    assert main(["predict", str(run), "--out", str(tmp_path / "p.zarr"), "--no-progress"]) == 0
    g = zarr.open_group(tmp_path / "p.zarr", mode="r")
    assert g["pred"].shape == (3000,) and g["logits"].shape == (3000, 4)
    assert g["embedding"].shape == (3000, 16)
    assert np.array_equal(g["pred"][:], g["logits"][:].argmax(1))
    ds = Dataset(planted_dataset)
    test = ds.split("test")
    assert float((g["pred"][:][test] == ds.labels[test]).mean()) == pytest.approx(ev["test_acc"])
    assert main(["predict", str(run), "--out", str(tmp_path / "e.npy"), "--what", "embedding",
                 "--no-progress"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), g["embedding"][:])
    assert main(["predict", str(run), "--out", str(tmp_path / "p.csv")]) == 2
    assert ".npy or .zarr" in capsys.readouterr().err
    # nothing of the user's is replaced or deleted: an existing output, the run, the dataset, a
    # missing folder, and the files of a --workdir
    keep = tmp_path / "mine.zarr"
    (keep / "sub").mkdir(parents=True)
    (keep / "notes.txt").write_text("keep")
    for target, why in ((keep, "exists; --overwrite replaces it"),
                        (tmp_path / "e.npy", "exists; --overwrite replaces it"),
                        (run / "p.zarr", f"lies inside the run {run}"),
                        (planted_dataset / "arrays.zarr", f"lies inside the dataset {planted_dataset}"),
                        (tmp_path / "nowhere" / "p.npy", "does not exist")):
        capsys.readouterr()
        assert main(["predict", str(run), "--out", str(target), "--no-progress"]) == 2, target
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err, err
    assert (keep / "notes.txt").read_text() == "keep" and (keep / "sub").is_dir()
    assert not (tmp_path / "nowhere").exists() and not (run / "p.zarr").exists()
    assert main(["predict", str(run), "--out", str(keep), "--overwrite", "--no-progress"]) == 0
    assert zarr.open_group(keep, mode="r")["pred"].shape == (3000,) and not (keep / "notes.txt").exists()
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("keep")
    assert main(["eval", str(run), "--workdir", str(work), "--no-progress"]) == 0
    assert [p.name for p in work.iterdir()] == ["notes.txt"]


def _write(path: Path, n: int, src: np.ndarray, dst: np.ndarray, x: np.ndarray, y: np.ndarray,
           perm: np.ndarray | None) -> Path:
    from ooc.kernels.graph import build_csc
    ip, ix = build_csc(src, dst, n)
    with DatasetWriter(path) as w:
        w.write_array("indptr", ip)
        w.write_array("indices", ix)
        w.write_array("features", x.astype(np.float32))
        w.write_array("labels", y.astype(np.int32))
        w.write_array("train", np.arange(0, n, 2, dtype=np.int64))
        w.write_array("valid", np.arange(1, n, 4, dtype=np.int64))
        w.write_array("test", np.arange(3, n, 4, dtype=np.int64))
        if perm is not None:
            w.write_array("nodes/perm", perm.astype(np.int64))
        return w.commit(name=path.name, num_nodes=n, num_classes=3)


def test_predict_maps_rows_back_through_node_permutation(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 200
    src, dst = rng.integers(0, n, 800), rng.integers(0, n, 800)
    x = rng.normal(size=(n, 5))
    y = rng.integers(0, 3, n)
    perm = rng.permutation(n)  # internal node i is original node perm[i]
    inv = np.argsort(perm)
    plain = _write(tmp_path / "plain", n, src, dst, x, y, None)
    permuted = _write(tmp_path / "permuted", n, inv[src], inv[dst], x[perm], y[perm], perm)
    run = tmp_path / "run"
    train(_cfg(plain, run, model="gcn", epochs=1, partitions=3, buffer_partitions=1))
    a = predict_run(run, tmp_path / "a.zarr")
    b = predict_run(run, tmp_path / "b.zarr", dataset=str(permuted))
    assert a["arrays"] == b["arrays"]
    ga, gb = zarr.open_group(tmp_path / "a.zarr", mode="r"), zarr.open_group(tmp_path / "b.zarr", mode="r")
    np.testing.assert_allclose(gb["logits"][:], ga["logits"][:], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(gb["pred"][:], ga["pred"][:])
    # and without mapping back the rows would be in internal order
    assert not np.allclose(gb["logits"][:], ga["logits"][:][perm])


@pytest.mark.parametrize("model", MODELS)
def test_layer0_inputs_kept_between_passes_give_the_same_outputs(planted_dataset: Path, tmp_path: Path,
                                                                 model: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ooc.inference import Propagated
    ds, task, net = _three_layers(planted_dataset, tmp_path, model)
    targets = np.array([2999, 5, 17, 5, 1500, 0, 2047])
    plain = layerwise_inference(net, task.data, 50, keep=(2,), targets=targets)[2]
    kept = Propagated(tmp_path / "kept")
    first = layerwise_inference(net, task.data, 50, keep=(2,), targets=targets, propagated=kept)[2]
    np.testing.assert_allclose(first.array, plain.array, rtol=1e-5, atol=1e-6)
    if not net.propagates(0):  # GAT: nothing to keep
        assert kept.key is None and not (tmp_path / "kept").exists()
        task.close()
        return
    assert kept.ready(Propagated.key_of(net, targets))
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["dests.npz", "propagated", "rows"]
    # the second pass neither samples layer 0's blocks nor reads a feature row
    import ooc.inference as inf

    def no_features(*a: object, **k: object) -> None:
        raise AssertionError("layer 0 read feature rows")
    monkeypatch.setattr(inf, "_layer0_rows", no_features)
    monkeypatch.setattr(inf, "needed_nodes", no_features)
    with torch.no_grad():  # new weights: the kept inputs do not depend on them
        for p in net.parameters():
            p.mul_(1.5)
    second = layerwise_inference(net, task.data, 50, keep=(2,), targets=targets, propagated=kept)[2]
    monkeypatch.undo()
    again = layerwise_inference(net, task.data, 50, keep=(2,), targets=targets)[2]
    np.testing.assert_array_equal(second.ids, again.ids)
    np.testing.assert_allclose(second.array, again.array, rtol=1e-5, atol=1e-6)
    assert not np.allclose(second.array, first.array)
    # other targets: the kept inputs are rebuilt for them
    other = np.array([1, 2, 3])
    assert not kept.ready(Propagated.key_of(net, other))
    third = layerwise_inference(net, task.data, 50, keep=(2,), targets=other, propagated=kept)[2]
    np.testing.assert_allclose(third.array,
                               layerwise_inference(net, task.data, 50, keep=(2,), targets=other)[2].array,
                               rtol=1e-5, atol=1e-6)
    assert kept.ready(Propagated.key_of(net, other))
    task.close()


def test_layer0_inputs_are_not_kept_when_they_would_outweigh_the_features(planted_dataset: Path,
                                                                           tmp_path: Path) -> None:
    from ooc.inference import Propagated
    ds, task, net = _three_layers(planted_dataset, tmp_path, "sage")
    kept = Propagated(tmp_path / "kept")
    # every node: its row and float32 aggregate are more than half the feature file
    layerwise_inference(net, task.data, 500, keep=(2,), targets=np.arange(ds.num_nodes), propagated=kept)
    assert kept.key is None and not (tmp_path / "kept").exists()
    task.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "dests"])
def test_damaged_kept_inputs_are_rebuilt_from_the_features(planted_dataset: Path, tmp_path: Path,
                                                           damage: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from ooc.inference import Propagated
    ds, task, net = _three_layers(planted_dataset, tmp_path, "sage")
    targets = np.array([2999, 5, 17, 1500, 0, 2047])
    kept = Propagated(tmp_path / "kept")
    first = layerwise_inference(net, task.data, 50, keep=(2,), targets=targets, propagated=kept)[2]
    assert kept.written_bytes > 0 and kept.read_bytes == 0
    chunk = next((tmp_path / "kept" / "propagated").rglob("c/*/*"))
    if damage == "flip":  # same size, one byte changed
        b = bytearray(chunk.read_bytes())
        b[len(b) // 2] ^= 0xFF
        chunk.write_bytes(bytes(b))
    elif damage == "truncate":
        chunk.write_bytes(b"")
    elif damage == "delete":
        import shutil
        shutil.rmtree(tmp_path / "kept" / "rows")
    else:
        (tmp_path / "kept" / "dests.npz").write_bytes(b"not a zip")
    with caplog.at_level("WARNING", logger="ooc.inference"):
        again = layerwise_inference(net, task.data, 50, keep=(2,), targets=targets, propagated=kept)[2]
    assert "reading the features instead" in caplog.text
    np.testing.assert_allclose(again.array, first.array, rtol=1e-5, atol=1e-6)
    assert kept.ready(Propagated.key_of(net, targets)) and kept.written_bytes > 0  # rebuilt
    third = layerwise_inference(net, task.data, 50, keep=(2,), targets=targets, propagated=kept)[2]
    assert kept.read_bytes > 0 and kept.written_bytes == 0  # read back, as written
    np.testing.assert_allclose(third.array, first.array, rtol=1e-5, atol=1e-6)
    task.close()
