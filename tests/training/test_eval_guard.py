"""ooc eval / predict: the run's lock, the dataset verified, another feature width refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conftest import small_dataset
from ooc.tools.cli import main


def test_eval_on_a_dataset_of_another_width_is_a_clean_error(tmp_path: Path, capsys) -> None:
    src, dst = [0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]
    narrow = small_dataset(tmp_path / "narrow", 6, src, dst, feat_dim=3)
    wide = small_dataset(tmp_path / "wide", 6, src, dst, feat_dim=5)
    run = tmp_path / "run"
    assert main(["train", str(narrow), "--model", "gcn", "--fanout", "2", "--epochs", "1",
                 "--partitions", "1", "--buffer-partitions", "1", "--output-dir", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--dataset", str(wide), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--dataset {wide}: features of width 5, but {run} was trained on {narrow} with width 3" in err
    assert "Traceback" not in err
    assert main(["eval", str(run), "--dataset", str(narrow), "--no-progress"]) == 0


def test_eval_refuses_a_run_being_written(tmp_path: Path, capsys) -> None:
    import subprocess
    import sys
    import time
    ds = small_dataset(tmp_path / "ds", 4, [0, 1, 2, 3], [1, 2, 3, 0])
    run = tmp_path / "run"
    assert main(["train", str(ds), "--fanout", "2", "--epochs", "1", "--partitions", "1",
                 "--buffer-partitions", "1", "--output-dir", str(run), "--no-progress"]) == 0
    marker = tmp_path / "held"
    hold = ("import sys, time\nfrom ooc.storage.locks import PathLock\n"
            "PathLock(sys.argv[1], exclusive=True).acquire()\nopen(sys.argv[2], 'w').close()\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", hold, str(run), str(marker)])
    try:
        while not marker.exists():
            assert proc.poll() is None
            time.sleep(0.02)
        capsys.readouterr()
        assert main(["eval", str(run), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"cannot evaluate this run directory: it is in use by pid {proc.pid}" in err
    finally:
        proc.kill()
        proc.wait()
    assert main(["predict", str(run), "--out", str(tmp_path / "p.npy"), "--no-progress"]) == 0
    assert np.load(tmp_path / "p.npy").shape == (4,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "held", "p.npy", "run"]


def test_eval_with_corrupt_best_weights_is_a_clean_error(tmp_path: Path, capsys) -> None:
    ds = small_dataset(tmp_path / "ds", 4, [0, 1, 2, 3], [1, 2, 3, 0])
    run = tmp_path / "run"
    assert main(["train", str(ds), "--fanout", "2", "--epochs", "1", "--partitions", "1",
                 "--buffer-partitions", "1", "--output-dir", str(run), "--no-progress"]) == 0
    w = run / "model.pt"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    capsys.readouterr()
    assert main(["eval", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{w}: not a readable weights file" in err and "Traceback" not in err
    assert main(["eval", str(run), "--weights", "last", "--no-progress"]) == 0  # the checkpoint
