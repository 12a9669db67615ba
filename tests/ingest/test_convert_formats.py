"""Input formats: OGB raw layout (fixtures), Geom-GCN and GitHub (real files)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_path
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main


def _gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def edges_of(ds: Dataset) -> list[tuple[int, int]]:
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    return sorted(zip(ds.indices.tolist(), dst.tolist()))


@pytest.fixture
def ogb_root(tmp_path: Path) -> Path:
    """A 5-node OGB-layout fixture: ogbn-style raw/ and split/time/."""
    root = tmp_path / "ogbn_tiny"
    _gz(root / "raw" / "edge.csv.gz", "0,1\n1,2\n3,2\n4,0\n")
    _gz(root / "raw" / "num-node-list.csv.gz", "5\n")
    _gz(root / "raw" / "node-feat.csv.gz",
        "\n".join(",".join(f"{v + j / 10:.1f}" for j in range(3)) for v in range(5)) + "\n")
    _gz(root / "raw" / "node-label.csv.gz", "1\n0\nnan\n2\n1\n")
    _gz(root / "split" / "time" / "train.csv.gz", "0\n1\n")
    _gz(root / "split" / "time" / "valid.csv.gz", "3\n")
    _gz(root / "split" / "time" / "test.csv.gz", "4\n")
    return root


def test_ogb_layout(ogb_root: Path, tmp_path: Path) -> None:
    assert main(["convert", "ogb", str(ogb_root), "--out", str(tmp_path / "ds")]) == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.num_nodes == 5
    assert edges_of(ds) == [(0, 1), (1, 2), (3, 2), (4, 0)]
    assert ds.features.read_all()[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert ds.features.read_all()[2].tolist() == pytest.approx([2.0, 2.1, 2.2])
    assert ds.labels.tolist() == [1, 0, -1, 2, 1]
    assert ds.num_classes == 3
    assert [ds.split(s).tolist() for s in ("train", "valid", "test")] == [[0, 1], [3], [4]]
    assert ds.manifest["split_scheme"] == "time"
    assert len(ds.manifest["sources"]) == 7
    assert main(["convert", "ogb", str(ogb_root), "--out", str(tmp_path / "u"), "--undirected"]) == 0
    assert Dataset(tmp_path / "u").num_edges == 8


@pytest.mark.parametrize("damage, message", [
    ("edge", "edge.csv.gz:3: field 2 is not an integer id"),
    ("range", "edge.csv.gz:2: destination id 9 >= node count 5"),
    ("featrows", "node-feat.csv.gz: 4 feature rows but the graph has 5 nodes"),
    ("featcols", "node-feat.csv.gz:2: expected 3 fields, found 2"),
    ("split", "valid.csv.gz:1: node id 7 >= node count 5"),
    ("labels", "node-label.csv.gz: 4 label rows but the graph has 5 nodes"),
])
def test_ogb_bad_input(ogb_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture, damage: str,
                       message: str) -> None:
    raw = ogb_root / "raw"
    if damage == "edge":
        _gz(raw / "edge.csv.gz", "0,1\n1,2\n3,x\n")
    elif damage == "range":
        _gz(raw / "edge.csv.gz", "0,1\n1,9\n")
    elif damage == "featrows":
        _gz(raw / "node-feat.csv.gz", "0,0,0\n1,1,1\n2,2,2\n3,3,3\n")
    elif damage == "featcols":
        _gz(raw / "node-feat.csv.gz", "0,0,0\n1,1\n2,2,2\n3,3,3\n4,4,4\n")
    elif damage == "split":
        _gz(ogb_root / "split" / "time" / "valid.csv.gz", "7\n")
    else:
        _gz(raw / "node-label.csv.gz", "1\n0\n1\n2\n")
    rc = main(["convert", "ogb", str(ogb_root), "--out", str(tmp_path / "out" / "ds")])
    assert rc != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_geom_gcn_fixture(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "out1_node_feature_label.txt").write_text(
        "node_id\tfeature\tlabel\n2\t0,1,1\t1\n0\t1,0,0\t0\n1\t0,0,1\t2\n")
    (raw / "out1_graph_edges.txt").write_text("node_id\tnode_id\n0\t1\n1\t2\n2\t2\n")
    np.savez(tmp_path / "split.npz", train_mask=np.array([1, 0, 0], np.uint8),
             val_mask=np.array([0, 1, 0], np.uint8), test_mask=np.array([0, 0, 1], np.uint8))
    assert main(["convert", "geom-gcn", "--raw-dir", str(raw), "--split-file",
                 str(tmp_path / "split.npz"), "--undirected", "--out", str(tmp_path / "ds")]) == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.features.read_all().tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 1]]
    assert ds.labels.tolist() == [0, 2, 1]
    assert edges_of(ds) == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 2)]
    assert [ds.split(s).tolist() for s in ("train", "valid", "test")] == [[0], [1], [2]]


def test_real_actor_film(tmp_path: Path) -> None:
    base = shared_path("actor_film")
    assert main(["convert", "geom-gcn", "--raw-dir", str(base / "geom_gcn"), "--undirected",
                 "--split-file", str(base / "splits_geom_gcn" / "film_split_0.6_0.2_0.npz"),
                 "--out", str(tmp_path / "film")]) == 0
    ds = Dataset(tmp_path / "film")
    assert ds.num_nodes == 7600
    assert ds.feat_dim == 932
    assert ds.num_classes == 5
    loops = int(sum((ds.indices[ds.indptr[v]:ds.indptr[v + 1]] == v).sum() for v in range(7600)))
    assert loops == 93
    assert (ds.num_edges - loops) // 2 == 26659  # README: 26659 undirected edges (besides self-loops)
    assert [ds.split(s).shape[0] for s in ("train", "valid", "test")] == [3648, 2432, 1520]
    assert ds.check_structure() == []


@pytest.mark.parametrize("name, nodes, undirected_edges", [("cornell", 183, 277), ("texas", 183, 279),
                                                           ("wisconsin", 251, 450)])
def test_real_webkb(tmp_path: Path, name: str, nodes: int, undirected_edges: int) -> None:
    base = shared_path("webkb", name)
    assert main(["convert", "geom-gcn", "--raw-dir", str(base / "geom_gcn"), "--undirected",
                 "--split-file", str(base / "splits_geom_gcn" / f"{name}_split_0.6_0.2_0.npz"),
                 "--out", str(tmp_path / name)]) == 0
    ds = Dataset(tmp_path / name)
    assert ds.num_nodes == nodes
    assert ds.feat_dim == 1703
    loops = int(sum((ds.indices[ds.indptr[v]:ds.indptr[v + 1]] == v).sum() for v in range(nodes)))
    assert (ds.num_edges - loops) // 2 == undirected_edges


def test_real_github_social_csv(tmp_path: Path) -> None:
    base = shared_path("github_social")
    assert main(["convert", "edgelist", str(base / "edges.csv"), "--src-col", "id_1",
                 "--dst-col", "id_2", "--undirected", "--labels", str(base / "target.csv"),
                 "--label-cols", "id,target", "--out", str(tmp_path / "gh")]) == 0
    ds = Dataset(tmp_path / "gh")
    assert ds.num_nodes == 37700
    assert ds.num_edges == 2 * 289003
    assert ds.num_classes == 2
    assert int((ds.labels < 0).sum()) == 0
    assert ds.check_structure() == []
    # the same file through the sparse-id map gives the same graph (ids are already dense)
    assert main(["convert", "edgelist", str(base / "edges.csv"), "--undirected", "--ids", "map",
                 "--out", str(tmp_path / "gh2")]) == 0
    ds2 = Dataset(tmp_path / "gh2")
    assert np.array_equal(ds2.indptr, ds.indptr) and np.array_equal(ds2.indices, ds.indices)
