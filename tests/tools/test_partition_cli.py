"""``ooc partition`` on the command line: ``--progress`` like the other long-running commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import small_dataset
from ooc.tools.cli import main


@pytest.mark.parametrize("footprint", ["copy", "low"])
def test_progress_bars_of_each_step(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch,
                                    footprint: str) -> None:
    """``--progress`` draws a bar per step (as lines off a terminal); without it nothing is drawn."""
    monkeypatch.setenv("OOC_PROGRESS_INTERVAL", "0")
    n = 300
    ds = small_dataset(tmp_path / "d", n, list(range(n)), [(i + 1) % n for i in range(n)])
    cmd = ["partition", str(ds), "--parts", "3", "--method", "stream", "--footprint", footprint]
    assert main([*cmd, "--progress"]) == 0
    err = capsys.readouterr().err
    done = {ln.split(":")[0] for ln in err.splitlines() if ": 100%" in ln}
    steps = {"features"} if footprint == "copy" else {"features spool", "features place"}
    assert {"fennel passes", "edge cut", "topology", "edge buckets", *steps} <= done, err
    assert "\r" not in err
    assert main(cmd) == 0
    assert capsys.readouterr().err == ""
