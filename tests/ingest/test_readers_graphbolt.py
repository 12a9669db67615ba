"""ooc convert graphbolt: a GraphBolt OnDiskDataset directory written by the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ooc.storage.dataset import Dataset
from ooc.tools.cli import main

EDGES = np.array([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])


def _write(root: Path, yaml_text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata.yaml").write_text(yaml_text)
    return root


@pytest.fixture
def gb_dir(tmp_path: Path) -> Path:
    root = tmp_path / "gb"
    root.mkdir()
    np.save(root / "edges.npy", EDGES)
    np.save(root / "feat.npy", np.arange(12, dtype=np.float32).reshape(6, 2))
    np.save(root / "other.npy", np.zeros((6, 3), dtype=np.float32))
    np.save(root / "train-ids.npy", np.array([0, 1, 2]))
    torch.save(torch.tensor([1, 0, 1]), root / "train-labels.pt")
    np.save(root / "val-ids.npy", np.array([3]))
    np.save(root / "val-labels.npy", np.array([2]))
    np.save(root / "test-ids.npy", np.array([5, 4]))
    np.save(root / "test-labels.npy", np.array([0, 2]))
    np.save(root / "lp-seeds.npy", EDGES.T[:3])
    return _write(root, """
dataset_name: tiny
graph:
  nodes:
    - num: 6
  edges:
    - format: numpy
      path: edges.npy
feature_data:
  - domain: node
    name: feat
    format: numpy
    in_memory: false
    path: feat.npy
  - domain: node
    name: other
    format: numpy
    path: other.npy
  - domain: edge
    name: w
    format: numpy
    path: edges.npy
tasks:
  - name: link_prediction
    train_set:
      - data:
          - {name: seeds, format: numpy, path: lp-seeds.npy}
  - name: node_classification
    num_classes: 3
    train_set:
      - data:
          - {name: seeds, format: numpy, path: train-ids.npy}
          - {name: labels, format: torch, path: train-labels.pt}
    validation_set:
      - data:
          - {name: seeds, format: numpy, path: val-ids.npy}
          - {name: labels, format: numpy, path: val-labels.npy}
    test_set:
      - data:
          - {name: seeds, format: numpy, path: test-ids.npy}
          - {name: labels, format: numpy, path: test-labels.npy}
""")


def _edges(ds: Dataset) -> list[tuple[int, int]]:
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    return sorted(zip(ds.indices.tolist(), dst.tolist()))


def test_homogeneous_ondisk_dataset(gb_dir: Path, tmp_path: Path) -> None:
    assert main(["convert", "graphbolt", str(gb_dir), "--out", str(tmp_path / "ds")]) == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.name == "tiny" and ds.num_nodes == 6
    assert _edges(ds) == sorted(zip(EDGES[0].tolist(), EDGES[1].tolist()))
    assert ds.features.read_all().tolist() == np.arange(12).reshape(6, 2).tolist()
    assert ds.labels.tolist() == [1, 0, 1, 2, 2, 0]
    assert ds.num_classes == 3
    assert [ds.split(s).tolist() for s in ("train", "valid", "test")] == [[0, 1, 2], [3], [4, 5]]
    assert ds.manifest["graphbolt_task"] == "node_classification"
    assert ds.manifest["graphbolt_not_converted"] == ["edge:w"]
    assert ds.check_structure() == []


def test_csv_edges_other_feature_and_random_split(gb_dir: Path, tmp_path: Path) -> None:
    (gb_dir / "edges.csv").write_text("".join(f"{s},{d}\n" for s, d in EDGES.T.tolist()))
    text = (gb_dir / "metadata.yaml").read_text().replace("format: numpy\n      path: edges.npy",
                                                         "format: csv\n      path: edges.csv")
    _write(gb_dir, text)
    assert main(["convert", "graphbolt", str(gb_dir), "--feature", "other", "--task",
                 "node_classification", "--out", str(tmp_path / "ds")]) == 0
    ds = Dataset(tmp_path / "ds")
    assert _edges(ds) == sorted(zip(EDGES[0].tolist(), EDGES[1].tolist()))
    assert ds.feat_dim == 3


@pytest.mark.parametrize("yaml_text, message", [
    ("graph:\n  nodes:\n    - {type: user, num: 3}\n    - {type: item, num: 4}\n  edges:\n"
     "    - {type: 'user:buys:item', format: numpy, path: e.npy}\n",
     "2 node types (user, item): heterogeneous graphs are not supported"),
    ("graph_topology:\n  type: FusedCSCSamplingGraph\n  path: preprocessed/g.pt\n",
     "GraphBolt's preprocessed layout (graph_topology"),
    ("graph:\n  nodes: [{num: 3}]\n  edges: [{format: parquet, path: e.pq}]\n",
     "edge format 'parquet' is not supported (numpy or csv)"),
    ("graph:\n  nodes: [{num: 6}]\n  edges: [{format: numpy, path: edges.npy}]\nfeature_data:\n"
     "  - {domain: node, name: feat, format: hdf5, path: x.h5}\n",
     "feature feat: format 'hdf5' is not supported (numpy or torch)"),
])
def test_unsupported_layouts_are_named(tmp_path: Path, capsys: pytest.CaptureFixture, yaml_text: str,
                                       message: str) -> None:
    root = _write(tmp_path / "gb", yaml_text)
    np.save(root / "edges.npy", EDGES)
    assert main(["convert", "graphbolt", str(root), "--out", str(tmp_path / "ds")]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()


def test_missing_metadata(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["convert", "graphbolt", str(tmp_path), "--out", str(tmp_path / "ds")]) != 0
    assert "metadata.yaml: no such file" in capsys.readouterr().err
