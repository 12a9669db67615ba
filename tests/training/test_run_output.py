"""What a training run prints when its output goes to a log file: one line per epoch, no bar frames."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ooc.tools.cli import main


def test_log_of_a_200_epoch_cora_run_is_small(cora_dataset: Path, tmp_path: Path,
                                              capfd: pytest.CaptureFixture) -> None:
    """The README's Cora command with its output captured (not a terminal): no ``\\r`` frames, one
    line per epoch plus at most a bar line every 10 s, under 40 KB for 200 epochs."""
    rc = main(["train", str(cora_dataset), "--model", "gcn", "--fanout", "10,10", "--batch-size", "256",
               "--epochs", "200", "--hidden", "16", "--feat-norm", "row", "--partitions", "4",
               "--buffer-partitions", "1", "--seed", "0", "--output-dir", str(tmp_path / "run")])
    assert rc == 0
    out, err = capfd.readouterr()
    log = out + err
    assert "\r" not in log
    assert sum(re.match(r"epoch \d+: loss", line) is not None for line in log.splitlines()) == 200
    assert len(log.encode()) < 40_000, len(log.encode())
    assert "test accuracy" in out
