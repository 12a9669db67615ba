"""ooc convert matlab: a .mat with a sparse adjacency and a node-attribute matrix (scipy.io)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

scipy_io = pytest.importorskip("scipy.io")
import scipy.sparse as sp  # noqa: E402

from ooc.storage.dataset import Dataset  # noqa: E402
from ooc.tools.cli import main  # noqa: E402

EDGES = [(0, 1), (1, 0), (1, 2), (2, 1), (3, 4), (4, 3), (2, 4)]
# Facebook100-style local_info: status, gender (label; 0 = missing), dorm
INFO = np.array([[1, 2, 7], [2, 1, 0], [1, 0, 9], [0, 2, 7], [1, 1, 9]], dtype=np.float64)


def _edges(ds: Dataset) -> list[tuple[int, int]]:
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    return sorted(zip(ds.indices.tolist(), dst.tolist()))


@pytest.fixture
def mat(tmp_path: Path) -> Path:
    r, c = zip(*EDGES)
    a = sp.csc_matrix((np.ones(len(EDGES)), (r, c)), shape=(5, 5))
    f = tmp_path / "Penn.mat"
    scipy_io.savemat(f, {"A": a, "local_info": INFO})
    return f


def test_sparse_adjacency_onehot_attributes_and_label_column(mat: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    assert main(["convert", "matlab", str(mat), "--label-col", "1", "--out", str(tmp_path / "ds")]) == 0
    ds = Dataset(tmp_path / "ds")
    assert ds.num_nodes == 5
    assert _edges(ds) == sorted(EDGES)
    assert ds.labels.tolist() == [1, 0, -1, 1, 0]  # gender 2 -> class 1, 1 -> 0, 0 -> missing
    assert ds.manifest["class_names"] == ["1", "2"]
    # status {1, 2} -> 2 columns, dorm {7, 9} -> 2 columns; 0 = missing -> all zero
    assert ds.features.read_all().tolist() == [[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 1],
                                               [0, 0, 1, 0], [1, 0, 0, 1]]
    assert ds.manifest["feature_source"]["columns"] == [{"column": 0, "values": 2},
                                                        {"column": 2, "values": 2}]
    assert ds.check_structure() == []


def test_sparse_fractional_attributes_stored_as_they_are(tmp_path: Path) -> None:
    a = sp.csr_matrix((np.ones(2), ([0, 1], [1, 2])), shape=(3, 3))
    x = sp.csr_matrix(np.array([[0.5, 0], [0, 0], [0, -2.25]]))
    scipy_io.savemat(tmp_path / "g.mat", {"Network": a, "Attributes": x})
    assert main(["convert", "matlab", str(tmp_path / "g.mat"), "--adjacency", "Network",
                 "--undirected", "--out", str(tmp_path / "ds")]) == 0
    ds = Dataset(tmp_path / "ds")
    assert _edges(ds) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    assert ds.features.read_all().tolist() == [[0.5, 0], [0, 0], [0, -2.25]]


@pytest.mark.parametrize("args, message", [
    (["--adjacency", "W"], "no variable 'W' (has A (5, 5), local_info (5, 3)); pass --adjacency"),
    (["--label-col", "3"], "--label-col 3 outside the 3 columns of local_info"),
    (["--attributes", "B"], "no variable 'B'"),
])
def test_bad_variables_are_named(mat: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                 args: list[str], message: str) -> None:
    assert main(["convert", "matlab", str(mat), *args, "--out", str(tmp_path / "ds")]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()


def test_not_a_mat_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "x.mat").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 600)
    assert main(["convert", "matlab", str(tmp_path / "x.mat"), "--out", str(tmp_path / "ds")]) != 0
    assert "x.mat: " in capsys.readouterr().err


def test_v73_hdf5_file_is_refused_with_advice(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    head = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, HDF5 schema 1.00 ."
    (tmp_path / "v73.mat").write_bytes(head.ljust(116) + b"\0" * 8 + b"\x00\x02IM" + b"\0" * 400)
    assert main(["convert", "matlab", str(tmp_path / "v73.mat"), "--out", str(tmp_path / "ds")]) != 0
    assert "v73.mat: a MATLAB v7.3 (HDF5) file, which scipy.io cannot read" in capsys.readouterr().err


def test_adjacency_only_with_json_features(tmp_path: Path) -> None:
    a = sp.csr_matrix((np.ones(2), ([0, 1], [1, 2])), shape=(3, 3))
    scipy_io.savemat(tmp_path / "g.mat", {"A": a})
    (tmp_path / "x.json").write_text('{"2": [1], "0": [0, 1]}')
    assert main(["convert", "matlab", str(tmp_path / "g.mat"), "--features", str(tmp_path / "x.json"),
                 "--out", str(tmp_path / "ds")]) == 0
    assert Dataset(tmp_path / "ds").features.read_all().tolist() == [[1, 1], [0, 0], [0, 1]]
