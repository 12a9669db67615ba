"""Label tables with integer, boolean or named labels; errors name the label column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ooc.ingest.convert import GraphOptions, NodeInputs, convert_edgelist, convert_numpy
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main


@pytest.fixture
def edges(tmp_path: Path) -> Path:
    f = tmp_path / "e.csv"
    f.write_text("src,dst\n0,1\n1,2\n2,3\n")
    return f


def _convert(edges: Path, labels: str, cols: str, out: Path, *extra: str) -> int:
    lab = edges.parent / "labels.csv"
    lab.write_text(labels)
    return main(["convert", "edgelist", str(edges), "--src-col", "src", "--dst-col", "dst",
                 "--labels", str(lab), "--label-cols", cols, "--out", str(out), *extra])


def test_boolean_labels(edges: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert _convert(edges, "id,is_ml\n0,True\n1,false\n2,TRUE\n3,\n", "id,is_ml", tmp_path / "ds") == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.labels.tolist() == [1, 0, 1, -1]
    assert ds.num_classes == 2
    assert ds.manifest["class_names"] == ["False", "True"]
    capsys.readouterr()
    assert main(["info", str(tmp_path / "ds")]) == 0
    assert "classes      2 (0 = False, 1 = True)\n" in capsys.readouterr().out


def test_string_labels_are_sorted_class_names(edges: Path, tmp_path: Path) -> None:
    assert _convert(edges, "id,name,kind\n3,d,web\n0,a,ml\n2,c,web\n1,b,data\n", "id,kind",
                    tmp_path / "ds") == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.manifest["class_names"] == ["data", "ml", "web"]
    assert ds.labels.tolist() == [1, 0, 2, 2]
    assert ds.num_classes == 3


def test_integer_labels_by_index_and_integral_floats(edges: Path, tmp_path: Path) -> None:
    # classes 0 and 2 only: not dense, so the class count is declared
    assert _convert(edges, "0 2\n1 0.0\n2 nan\n3 -1\n", "0,1", tmp_path / "ds", "--num-classes", "3") == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.labels.tolist() == [2, 0, -1, -1]
    assert ds.num_classes == 3
    assert "class_names" not in ds.manifest


@pytest.mark.parametrize("labels, message", [
    ("id,target\n0,1\n1,1.5\n", "labels.csv:3: label column 'target': '1.5' is not an integer class"),
    ("id,target\n0,1\n1,-3\n", "labels.csv:3: label column 'target': '-3' is negative"),
    ("id,target\n0,1\n1,cat\n", "labels.csv:2: label column 'target' mixes numbers ('1') and names "
                                "('cat')"),
    ("id,target\n0,1\nx,1\n", "labels.csv:3: id column 'id': 'x' is not an integer id"),
])
def test_bad_labels_name_the_column(edges: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                    labels: str, message: str) -> None:
    assert _convert(edges, labels, "id,target", tmp_path / "ds") != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()


def test_label_column_by_index_is_named_by_position(edges: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    assert _convert(edges, "0,1\n1,2.5\n", "0,1", tmp_path / "ds") != 0
    assert "labels.csv:2: label column 2: '2.5' is not an integer class" in capsys.readouterr().err


def test_string_ids_with_named_labels(tmp_path: Path) -> None:
    (tmp_path / "e.tsv").write_text("alice\tbob\nbob\tcarol\n")
    (tmp_path / "y.tsv").write_text("carol\tml\nalice\tweb\ndave\tml\n")
    ds = Dataset(convert_edgelist(tmp_path / "e.tsv", tmp_path / "ds", GraphOptions(ids="string"),
                                  NodeInputs(labels=tmp_path / "y.tsv")))
    assert ds.num_nodes == 4  # dave: only in the label table
    assert ds.labels.tolist() == [1, -1, 0, 0]  # alice bob carol dave
    assert ds.manifest["class_names"] == ["ml", "web"]


def test_label_arrays_bool_and_strings(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1], [1, 2], [2, 0]]))
    np.save(tmp_path / "yb.npy", np.array([True, False, True]))
    np.save(tmp_path / "ys.npy", np.array(["b", "a", ""]))
    ds = Dataset(convert_numpy(tmp_path / "e.npy", tmp_path / "b", nodes=NodeInputs(labels=tmp_path / "yb.npy")))
    assert ds.labels.tolist() == [1, 0, 1] and ds.manifest["class_names"] == ["False", "True"]
    ds = Dataset(convert_numpy(tmp_path / "e.npy", tmp_path / "s", nodes=NodeInputs(labels=tmp_path / "ys.npy")))
    assert ds.labels.tolist() == [1, 0, -1] and ds.manifest["class_names"] == ["a", "b"]
