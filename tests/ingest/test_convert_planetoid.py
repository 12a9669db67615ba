"""Planetoid conversion: real counts and splits, restricted unpickling, bad input, kill safety."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import start_paused

from ooc.storage.dataset import Dataset
from ooc.tools.cli import main
from ooc.ingest.planetoid import PlanetoidError, restricted_load


def test_cora_counts_and_splits(cora_dataset: Path) -> None:
    ds = Dataset(cora_dataset)
    assert ds.num_nodes == 2708
    assert ds.num_edges == 10556
    assert ds.feat_dim == 1433
    assert ds.num_classes == 7
    assert [ds.split(s).shape[0] for s in ("train", "valid", "test")] == [140, 500, 1000]
    assert ds.split("train").tolist() == list(range(140))
    assert float(ds.features.read_all().sum()) == 49216.0
    assert ds.check_structure() == []
    # symmetric, no self-loops
    ip, ix = ds.indptr, ds.indices
    dst = np.repeat(np.arange(2708), np.diff(ip))
    fwd = set(zip(ix.tolist(), dst.tolist()))
    assert all((d, s) in fwd for s, d in fwd)
    assert all(s != d for s, d in fwd)
    assert len(ds.manifest["sources"]) == 8
    assert all(len(s["sha256"]) == 64 for s in ds.manifest["sources"])


def test_citeseer_counts(citeseer_raw: Path, tmp_path: Path) -> None:
    assert main(["convert", "planetoid", "--raw-dir", str(citeseer_raw), "--name", "citeseer",
                 "--out", str(tmp_path / "cs")]) == 0
    ds = Dataset(tmp_path / "cs")
    assert ds.num_nodes == 3327
    assert ds.num_edges == 9104
    assert [ds.split(s).shape[0] for s in ("train", "valid", "test")] == [120, 500, 1000]
    assert int((ds.labels < 0).sum()) == 15
    assert int((ds.labels[ds.split("test")] < 0).sum()) == 0


def test_restricted_unpickler_refuses_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, ("echo pwned",))

    p = tmp_path / "ind.evil.x"
    p.write_bytes(pickle.dumps(Evil(), protocol=2))
    with pytest.raises(PlanetoidError, match="not allowed"):
        restricted_load(p)


def _copy_raw(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for f in dst.iterdir():
        f.chmod(0o644)
    return dst


@pytest.mark.parametrize("damage", ["missing", "truncated", "empty"])
def test_bad_raw_file_names_file_and_leaves_nothing(cora_raw: Path, tmp_path: Path, damage: str,
                                                    capsys: pytest.CaptureFixture) -> None:
    raw = _copy_raw(cora_raw, tmp_path / "raw")
    victim = raw / "ind.cora.allx"
    if damage == "missing":
        victim.unlink()
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:1000])
    else:
        victim.write_bytes(b"")
    out = tmp_path / "out" / "cora"
    rc = main(["convert", "planetoid", "--raw-dir", str(raw), "--name", "cora", "--out", str(out)])
    assert rc != 0
    err = capsys.readouterr().err
    assert "ind.cora.allx" in err
    assert not out.exists()
    assert not any(out.parent.glob(".cora.partial-*")) if out.parent.exists() else True


def test_sigkill_mid_conversion_leaves_no_dataset(cora_raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "cora"
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE=f"before-rename:60:{marker}")
    proc = start_paused(["convert", "planetoid", "--raw-dir", str(cora_raw), "--name", "cora",
                         "--out", str(out)], env, marker)
    assert any(tmp_path.glob(".cora.partial-*"))  # the arrays were being written
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    # a later conversion succeeds and clears the dead process's partial directory
    assert main(["convert", "planetoid", "--raw-dir", str(cora_raw), "--name", "cora",
                 "--out", str(out)]) == 0
    assert Dataset(out).num_nodes == 2708
    assert not any(tmp_path.glob(".cora.partial-*"))
