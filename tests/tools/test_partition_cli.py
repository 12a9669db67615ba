"""``ooc partition`` on the command line: ``--progress`` like the other long-running commands,
warnings worded like its errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import small_dataset
from ooc.kernels.graph import build_csc
from ooc.storage.dataset import DatasetWriter
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


#: ``ooc partition`` run where the disk has room for the low-footprint rewrite only (auto picks it,
#: with a warning): the file system's free space is what the estimate says the low path needs.
_LOW_DISK_ONLY = """
import shutil, sys
import ooc.partition as part
from ooc.partition_inplace import disk_estimate
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main
real = shutil.disk_usage
est = disk_estimate(Dataset(sys.argv[1]), True, 4)
free = int(est["low_extra"] * part._DISK_MARGIN) + part._DISK_SLACK + 1
assert free < est["copy_extra"] * part._DISK_MARGIN + part._DISK_SLACK
shutil.disk_usage = lambda p: real(p)._replace(free=free)
sys.exit(main([*sys.argv[2:], "partition", sys.argv[1], "--parts", "4", "--method", "stream",
               "--memory-budget", "16MB"]))
"""


def test_warnings_are_plain_lines(tmp_path: Path) -> None:
    """The footprint warning reads ``ooc partition: warning: ...`` (no timestamp, logger or level
    name), as ``ooc partition: error: ...`` does; ``-v`` keeps the timestamped records."""
    n, m = 20_000, 100_000
    rng = np.random.default_rng(0)
    ip, ix = build_csc(rng.integers(0, n, m), rng.integers(0, n, m), n)
    with DatasetWriter(tmp_path / "d") as w:  # features (2.6 MB in 40 chunks) most of the dataset
        w.write_array("indptr", ip)
        w.write_array("indices", ix)
        w.write_array("features", rng.standard_normal((n, 32)).astype(np.float32), chunk_rows=512)
        w.write_array("train", np.arange(0, n, 3))
        w.commit(name="t", num_nodes=n)
    ds = tmp_path / "d"
    r = subprocess.run([sys.executable, "-c", _LOW_DISK_ONLY, str(ds)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"ooc partition: warning: {ds}: ") and r.stderr.count("\n") == 1, r.stderr
    assert "rewriting in place with the low disk footprint" in r.stderr
    r = subprocess.run([sys.executable, "-c", _LOW_DISK_ONLY, str(ds), "-v"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert " ooc.partition WARNING " in r.stderr
