"""Partitioning trusts neither METIS nor the machine: balance checked, memory estimated first,
SIGTERM stops it promptly with the dataset untouched."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import small_dataset, start_paused
from ooc.partition import check_metis_result, metis_memory_estimate, partition_dataset
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main


def _ring(tmp_path: Path, n: int = 200) -> Path:
    src = list(range(n)) + [(i + 1) % n for i in range(n)]
    dst = [(i + 1) % n for i in range(n)] + list(range(n))
    return small_dataset(tmp_path / "ring", n, src, dst)


def _tree(root: Path) -> list[tuple[str, bytes]]:
    return sorted((str(p.relative_to(root)), p.read_bytes()) for p in root.rglob("*") if p.is_file())


def test_check_metis_result() -> None:
    check_metis_result(np.repeat(np.arange(4), 25), 100, 4)  # balanced
    check_metis_result(np.array([0] * 50 + [1] * 20 + [2] * 20 + [3] * 10), 100, 4)  # 2x: allowed
    with pytest.raises(ValueError, match=r"partition 0 holds 97 of 100 nodes \(97.0%\)"):
        check_metis_result(np.array([0] * 97 + [1, 2, 3]), 100, 4)
    with pytest.raises(ValueError, match="partition 3 is empty"):
        check_metis_result(np.repeat(np.arange(3), 34)[:100], 100, 4)


def test_failed_metis_is_an_error_before_anything_is_written(tmp_path: Path, monkeypatch) -> None:
    import pymetis
    ring = _ring(tmp_path)
    before = _tree(ring)

    def failed(n_parts, *args, **kw):  # what METIS returns after "Failed during initial partitioning"
        return 0, [0] * 200

    monkeypatch.setattr(pymetis, "part_graph", failed)
    with pytest.raises(ValueError, match="METIS failed to balance the graph: partition 0 holds") as e:
        partition_dataset(ring, 8, "metis")
    assert "use --method stream" in str(e.value)
    assert _tree(ring) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ring"]  # no partial, no lock file
    out, res = partition_dataset(ring, 8, "stream", out=tmp_path / "s")  # the advice works
    assert res.sizes.max() <= 200 // 8 * 1.05 + 1


def test_metis_over_the_memory_budget_is_refused(tmp_path: Path, capsys) -> None:
    ring = _ring(tmp_path)
    need = metis_memory_estimate(200, 400)
    assert need == 280 * 400 + 200 * 200
    assert main(["partition", str(ring), "--parts", "4", "--method", "metis",
                 "--memory-budget", "64kB"]) == 2
    err = capsys.readouterr().err
    assert "--method metis needs about 148.4 KiB" in err and "use --method stream" in err
    assert main(["partition", str(ring), "--parts", "4", "--method", "metis",
                 "--memory-budget", "1MB"]) == 0


@pytest.mark.parametrize("point", ["metis", "before-rename"])
def test_sigterm_during_partitioning(tmp_path: Path, point: str) -> None:
    ring = _ring(tmp_path)
    before = _tree(ring)
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE=f"{point}:120:{marker}")
    proc = start_paused(["partition", str(ring), "--parts", "4", "--method", "metis"], env, marker)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    assert rc == 128 + signal.SIGTERM and time.time() - t0 < 5, err
    assert "terminated by SIGTERM; partial output removed" in err and "Traceback" not in err
    assert _tree(ring) == before  # the dataset as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paused", "ring"]  # nothing half-written
    assert Dataset(ring).check_structure() == []


def test_a_corrupt_source_is_never_rewritten(tmp_path: Path, capsys) -> None:
    ring = _ring(tmp_path)
    f = ring / "arrays.zarr/nodes/features/c/0/0"
    b = bytearray(f.read_bytes())
    b[17] ^= 0x01
    f.write_bytes(bytes(b))
    assert main(["partition", str(ring), "--parts", "2", "--method", "stream"]) == 2
    err = capsys.readouterr().err
    assert "nodes/features chunk c/0/0" in err and "fails its blake2b checksum" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ring"]
