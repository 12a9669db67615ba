"""Split files: .npz members, pickled LINKX split lists (restricted unpickler), random splits."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from ooc.ingest.splits import random_split
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main

N = 8


@pytest.fixture
def graph(tmp_path: Path) -> Path:
    f = tmp_path / "e.txt"
    f.write_text("".join(f"{v} {(v + 1) % N}\n" for v in range(N)))
    (tmp_path / "y.txt").write_text("".join(f"{v} {v % 2}\n" for v in range(N)))
    return f


def _splits(ds: Dataset) -> list[list[int]]:
    return [ds.split(s).tolist() for s in ("train", "valid", "test")]


def test_npz_members_masks_and_ids(graph: Path, tmp_path: Path) -> None:
    train = np.zeros(N, dtype=bool)
    train[[0, 3, 5]] = True
    np.savez(tmp_path / "masks.npz", train_mask=train, val_ids=np.array([6, 1]),
             test_ids=np.array([[7], [2]]))
    m = tmp_path / "masks.npz"
    assert main(["convert", "edgelist", str(graph), "--out", str(tmp_path / "ds"),
                 "--split", f"train={m}:train_mask", "--split", f"valid={m}:val_ids",
                 "--split", f"test={m}:test_ids"]) == 0
    assert _splits(Dataset(tmp_path / "ds")) == [[0, 3, 5], [1, 6], [2, 7]]


def test_npz_missing_member_and_no_member(graph: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    np.savez(tmp_path / "m.npz", a=np.arange(2), b=np.arange(2))
    base = ["convert", "edgelist", str(graph), "--out", str(tmp_path / "ds")]
    assert main(base + ["--split", f"train={tmp_path / 'm.npz'}:c"]) != 0
    assert "m.npz: no member 'c' (has ['a', 'b'])" in capsys.readouterr().err
    assert main(base + ["--split", f"train={tmp_path / 'm.npz'}"]) != 0
    assert "m.npz: holds ['a', 'b']; name the member to use" in capsys.readouterr().err


def test_linkx_pickled_split_list(graph: Path, tmp_path: Path) -> None:
    lists = [{"train": np.array([0, 1, 2]), "valid": np.array([3]), "test": np.array([4, 5])},
             {"train": np.array([7, 6]), "val": np.array([0, 5]), "test": np.array([1])}]
    np.save(tmp_path / "penn-splits.npy", np.array(lists, dtype=object), allow_pickle=True)
    f = tmp_path / "penn-splits.npy"
    for i, want in enumerate(([[0, 1, 2], [3], [4, 5]], [[6, 7], [0, 5], [1]])):
        out = tmp_path / f"ds{i}"
        assert main(["convert", "edgelist", str(graph), "--out", str(out)] +
                    [a for s in ("train", "valid", "test") for a in ("--split", f"{s}={f}:{i}")]) == 0
        assert _splits(Dataset(out)) == want


class _Evil:
    def __reduce__(self) -> tuple:
        import os
        return (os.system, (f"touch {_Evil.marker}",))


def test_malicious_pickled_split_file_is_refused(graph: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    _Evil.marker = tmp_path / "pwned"
    header = {"descr": "|O", "fortran_order": False, "shape": (1,)}
    f = tmp_path / "evil.npy"
    with open(f, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        pickle.dump(np.array([{"train": _Evil()}], dtype=object), fh, protocol=3)
    assert main(["convert", "edgelist", str(graph), "--out", str(tmp_path / "ds"),
                 "--split", f"train={f}:0"]) != 0
    err = capsys.readouterr().err
    assert "evil.npy: truncated or malformed pickle (UnpicklingError: global 'posix.system' is not " \
           "allowed)" in err
    assert not _Evil.marker.exists() and not (tmp_path / "ds").exists()


def test_random_split_exact_disjoint_reproducible() -> None:
    labels = np.full(1003, -1)
    labels[::2] = np.arange(502) % 3  # 502 labelled nodes, classes 168/167/167
    a, rec = random_split(labels, (0.6, 0.2, 0.2), seed=5)
    assert [a[s].shape[0] for s in ("train", "valid", "test")] == [301, 101, 100]  # 301.2, 100.4, 100.4
    assert rec == {"kind": "random", "fractions": [0.6, 0.2, 0.2], "seed": 5, "stratify": False,
                   "labelled_nodes": 502, "counts": {"train": 301, "valid": 101, "test": 100}}
    every = np.concatenate(list(a.values()))
    assert np.array_equal(np.sort(every), np.flatnonzero(labels >= 0))  # disjoint, labelled only
    b, _ = random_split(labels, (0.6, 0.2, 0.2), seed=5)
    assert all(np.array_equal(a[s], b[s]) for s in a)
    c, _ = random_split(labels, (0.6, 0.2, 0.2), seed=6)
    assert not np.array_equal(a["train"], c["train"])
    d, _ = random_split(labels, (0.5, 0.1, 0.0), seed=0)
    assert [d[s].shape[0] for s in ("train", "valid", "test")] == [251, 50, 0]  # 251.0, 50.2


def test_random_split_stratified() -> None:
    labels = np.array([0] * 70 + [1] * 20 + [2] * 10)
    sp, rec = random_split(labels, (0.5, 0.3, 0.2), seed=1, stratify=True)
    per_class = [np.bincount(labels[sp[s]], minlength=3).tolist() for s in ("train", "valid", "test")]
    assert per_class == [[35, 10, 5], [21, 6, 3], [14, 4, 2]]
    assert rec["stratify"] is True
    plain, _ = random_split(labels, (0.5, 0.3, 0.2), seed=1)
    assert [np.bincount(labels[plain[s]], minlength=3).tolist() for s in ("train", "valid", "test")] \
        != per_class  # without stratification the draw does not keep the proportions exactly


def test_split_random_at_conversion(graph: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["convert", "edgelist", str(graph), "--labels", str(tmp_path / "y.txt"),
            "--split-random", "0.5,0.25,0.25", "--stratify", "--split-seed", "3"]
    assert main(args + ["--out", str(tmp_path / "a")]) == 0
    assert main(args + ["--out", str(tmp_path / "b")]) == 0
    a, b = Dataset(tmp_path / "a"), Dataset(tmp_path / "b")
    assert _splits(a) == _splits(b)
    assert [len(s) for s in _splits(a)] == [4, 2, 2]
    assert [np.bincount(a.labels[s], minlength=2).tolist() for s in _splits(a)] == [[2, 2], [1, 1], [1, 1]]
    assert a.manifest["split"]["seed"] == 3 and a.check_structure() == []
    capsys.readouterr()
    assert main(["info", str(tmp_path / "a")]) == 0
    assert "split drawn  at random: fractions 0.5,0.25,0.25 of 8 labelled nodes, seed 3, stratified " \
           "by class" in capsys.readouterr().out
    assert main(["convert", "edgelist", str(graph), "--split-random", "0.5,0.25,0.25",
                 "--out", str(tmp_path / "c")]) != 0
    assert "--split-random draws from the labelled nodes: pass --labels" in capsys.readouterr().err
    assert main(args + ["--out", str(tmp_path / "d"), "--split", f"train={tmp_path / 'y.txt'}"]) != 0
    assert "split files are given too (train)" in capsys.readouterr().err
    assert main(args[:-5] + ["--split-random", "0.7,0.3,0.2", "--out", str(tmp_path / "e")]) != 0
    assert "--split-random takes TRAIN,VALID,TEST fractions >= 0 with a sum <= 1" in capsys.readouterr().err
