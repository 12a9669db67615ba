"""Bad input in, one clean error out (file, line, row or id named), nothing written or lost."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import small_dataset
from ooc.config import ConfigError, TrainConfig, load_yaml
from ooc.ingest.readers import MAX_LINE_BYTES
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main


def _err(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _edges(tmp_path: Path, text: str = "0 1\n1 2\n2 0\n") -> Path:
    p = tmp_path / "in.txt"
    p.write_text(text)
    return p


def test_overwrite_never_deletes_a_directory_that_is_not_a_dataset(tmp_path: Path, capsys) -> None:
    mine = tmp_path / "mydir"
    mine.mkdir()
    (mine / "thesis.tex").write_text("weeks of work")
    assert main(["convert", "edgelist", str(_edges(tmp_path)), "--out", str(mine), "--overwrite"]) == 2
    assert "is not an ooc dataset" in _err(capsys)
    assert (mine / "thesis.tex").read_text() == "weeks of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "mydir"]
    # a dataset is replaced
    ds = tmp_path / "ds"
    assert main(["convert", "edgelist", str(_edges(tmp_path)), "--out", str(ds)]) == 0
    assert main(["convert", "edgelist", str(_edges(tmp_path, "0 1\n")), "--out", str(ds),
                 "--overwrite"]) == 0
    assert Dataset(ds).num_edges == 1


def test_refused_input_leaves_no_folders_made_for_the_output(tmp_path: Path, capsys) -> None:
    """A bad edge list refused with its line: no dataset, no partial folder, and none of the
    parent folders made for ``--out``; a folder that existed stays."""
    bad = _edges(tmp_path, "0 1\n1 2\nfoo bar\n")
    assert main(["convert", "edgelist", str(bad), "--out", str(tmp_path / "a" / "b" / "ds")]) == 2
    assert "in.txt:3" in _err(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    (tmp_path / "kept").mkdir()
    assert main(["convert", "edgelist", str(bad), "--out", str(tmp_path / "kept" / "c" / "ds")]) == 2
    _err(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "kept"]
    assert list((tmp_path / "kept").iterdir()) == []


def test_out_equal_to_the_input_is_refused(tmp_path: Path, capsys) -> None:
    src = _edges(tmp_path)
    assert main(["convert", "edgelist", str(src), "--out", str(src), "--overwrite"]) == 2
    assert f"--out {src} would replace the input {src}" in _err(capsys)
    other = tmp_path / "other.txt"
    other.write_text("x")
    assert main(["convert", "edgelist", str(src), "--out", str(other), "--overwrite"]) == 2
    assert "is a file, not an ooc dataset" in _err(capsys)
    assert other.read_text() == "x"
    assert src.read_text() == "0 1\n1 2\n2 0\n"
    ds = tmp_path / "ds"
    assert main(["convert", "edgelist", str(src), "--out", str(ds)]) == 0
    inside = ds / "edges.txt"
    inside.write_text("0 1\n")
    assert main(["convert", "edgelist", str(inside), "--out", str(ds), "--overwrite"]) == 2
    assert "would replace the input" in _err(capsys)
    assert inside.read_text() == "0 1\n"


def test_long_line_is_refused_at_once(tmp_path: Path, capsys) -> None:
    p = tmp_path / "big.txt"
    with open(p, "wb") as f:
        f.write(b"0 1\n1 2\n")
        f.write(b"7" * (MAX_LINE_BYTES * 4))  # a runaway line, no newline
    t0 = time.perf_counter()
    assert main(["convert", "edgelist", str(p), "--out", str(tmp_path / "ds")]) == 2
    assert time.perf_counter() - t0 < 10
    assert f"big.txt:3: line longer than {MAX_LINE_BYTES:,} bytes" in _err(capsys)
    assert not (tmp_path / "ds").exists()


def test_gzip_by_magic_bom_and_directory(tmp_path: Path, capsys) -> None:
    gz = tmp_path / "edges.dat"  # gzip data without .gz
    gz.write_bytes(gzip.compress(b"0 1\n1 2\n"))
    assert main(["convert", "edgelist", str(gz), "--out", str(tmp_path / "a")]) == 0
    assert Dataset(tmp_path / "a").num_edges == 2
    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbf0 1\n1 2\n")
    assert main(["convert", "edgelist", str(bom), "--out", str(tmp_path / "b")]) == 0
    assert Dataset(tmp_path / "b").num_edges == 2
    assert main(["convert", "edgelist", str(tmp_path), "--out", str(tmp_path / "c")]) == 2
    assert f"{tmp_path}: is a directory, not a file" in _err(capsys)


def test_float16_overflow_is_an_error_with_row_and_column(tmp_path: Path, capsys) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1, 2], [1, 2, 0]], dtype=np.int64))
    x = np.ones((3, 4), dtype=np.float32)
    x[1, 2] = 1e6
    np.save(tmp_path / "x.npy", x)
    base = ["convert", "numpy", str(tmp_path / "e.npy"), "--features", str(tmp_path / "x.npy"),
            "--feat-dtype", "float16"]
    assert main(base + ["--out", str(tmp_path / "ds")]) == 2
    assert "x.npy: row 1: feature value 1e+06 in column 2 is beyond float16's range" in _err(capsys)
    assert not (tmp_path / "ds").exists()
    assert main(base + ["--out", str(tmp_path / "ds"), "--nan-policy", "zero"]) == 0
    f = Dataset(tmp_path / "ds").features.read_all()
    assert f[1].tolist() == [1.0, 1.0, 0.0, 1.0] and f.dtype == np.float16


def test_label_range(tmp_path: Path, capsys) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1, 2], [1, 2, 0]], dtype=np.int64))
    base = ["convert", "numpy", str(tmp_path / "e.npy"), "--labels", str(tmp_path / "y.npy")]
    np.save(tmp_path / "y.npy", np.array([0, 2**40, 1], dtype=np.int64))
    assert main(base + ["--out", str(tmp_path / "ds")]) == 2
    err = _err(capsys)
    assert "node 1 has label 1,099,511,627,776" in err and "remap the labels to 0..C-1" in err
    np.save(tmp_path / "y.npy", np.array([0, 5, 1], dtype=np.int64))
    assert main(base + ["--out", str(tmp_path / "ds")]) == 2
    assert "3 distinct classes but node 1 has label 5" in _err(capsys)
    assert main(base + ["--out", str(tmp_path / "ds"), "--num-classes", "4"]) == 2
    assert "node 1 has label 5, not below --num-classes 4" in _err(capsys)
    assert main(base + ["--out", str(tmp_path / "ds"), "--num-classes", "6"]) == 0
    assert Dataset(tmp_path / "ds").num_classes == 6
    np.save(tmp_path / "y.npy", np.array([0, -2, 1], dtype=np.int64))
    assert main(base + ["--out", str(tmp_path / "d2")]) == 2
    assert "node 1 has label -2" in _err(capsys)


def test_label_table_naming_a_node_outside_the_graph(tmp_path: Path, capsys) -> None:
    e = _edges(tmp_path)
    lab = tmp_path / "labels.txt"
    lab.write_text("0 1\n1 0\n99 1\n")
    base = ["convert", "edgelist", str(e), "--labels", str(lab)]
    assert main(base + ["--out", str(tmp_path / "ds")]) == 2
    assert "labels.txt:3: label for node 99, but the edges name nodes 0..2 only; pass --num-nodes" \
        in _err(capsys)
    assert main(base + ["--out", str(tmp_path / "ds"), "--num-nodes", "100"]) == 0
    assert Dataset(tmp_path / "ds").num_nodes == 100


def _bomb(levels: int = 9, width: int = 9) -> str:
    items = ["&a [" + ",".join(["1"] * width) + "]"]
    names = "abcdefghijklmnopqrstuvwxyz"
    for i in range(1, levels):
        items.append(f"&{names[i]} [" + ",".join([f"*{names[i - 1]}"] * width) + "]")
    return "sampler:\n  fanouts: [" + ", ".join(items) + "]\n"


def test_yaml_bomb_refused_under_a_second(tmp_path: Path) -> None:
    p = tmp_path / "bomb.yaml"
    p.write_text(_bomb())  # 72 aliases, 9^9 items once expanded
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="fanouts expects a flat list of integers, got nested lists"):
        TrainConfig.from_sources(p)
    assert time.perf_counter() - t0 < 1.0
    p.write_text(_bomb(levels=12, width=12))  # over the alias limit: refused while parsing
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="more than 100 YAML aliases"):
        load_yaml(p)
    assert time.perf_counter() - t0 < 1.0


def test_fanout_zero_says_why(tmp_path: Path, capsys) -> None:
    assert main(["train", str(tmp_path), "--fanout", "0"]) == 2
    assert "fanout 0 invalid: use a positive count or -1 for all neighbours" in _err(capsys)


@pytest.mark.parametrize("fanout", ["10,,5", "10,", ",10"])
def test_an_empty_fanout_entry_is_refused_not_dropped(tmp_path: Path, capsys, fanout: str) -> None:
    """Dropping the empty entry would train a model with one layer fewer than written."""
    assert main(["train", str(tmp_path), "--fanout", fanout]) == 2
    assert f"fanouts must be comma-separated integers, got '{fanout}' (an empty entry" in _err(capsys)


def test_disk_full_is_named(tmp_path: Path) -> None:
    import errno

    from ooc.util.files import write_to

    class Full:
        name = str(tmp_path / "spool.bin")

        def write(self, b: memoryview) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=r"spool.bin: no space left on device \(.* bytes free; 8,000 "
                                      r"bytes needed"):
        write_to(Full(), np.zeros(1000, dtype=np.int64))


def test_leftovers_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ds = small_dataset(tmp_path / "ds", 4, [0, 1, 2, 3], [1, 2, 3, 0])
    old = tmp_path / f".ds.old-{dead.pid}-abcd1234"  # a kill right after the rename
    (old / "arrays.zarr").mkdir(parents=True)
    tmp = tmp_path / f".ds.partial-{dead.pid}-0000"
    tmp.mkdir()
    live = tmp_path / f".ds.partial-{os.getpid()}-ffff"  # a writer still at work: kept
    live.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / f".config.yaml.tmp-{dead.pid}").write_text("")  # 0-byte leftover of a failed write
    assert main(["train", str(ds), "--epochs", "1", "--fanout", "2", "--partitions", "1",
                 "--buffer-partitions", "1", "--output-dir", str(run), "--no-progress"]) == 0
    assert not old.exists() and not tmp.exists() and live.exists()
    assert not (run / f".config.yaml.tmp-{dead.pid}").exists()


def test_compress_bound_works_for_float16() -> None:
    import warnings

    from ooc.compress import _check_finite
    rows = np.array([[1.0, 60000.0], [2.0, 3.0]], dtype=np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overflow encountered in cast"
        _check_finite(rows, "f16")  # every finite float16 is below the bound
        rows[1, 0] = np.inf
        with pytest.raises(ValueError, match="f16: value inf at node 1, column 0"):
            _check_finite(rows, "f16")
        with pytest.raises(ValueError, match="value 1e\\+16 at node 0, column 1"):
            _check_finite(np.array([[0.0, 1e16]], dtype=np.float32), "f32")
