"""Locks on datasets and run directories: conflicts fail at once naming the holder, --wait waits,
locks of dead processes are taken over, and the concurrent cases of a real user."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import start_paused
from ooc.storage.dataset import Dataset
from ooc.storage.locks import LockError, PathLock, lock_path
from ooc.tools.cli import main

HOLD = """
import sys, time
from ooc.storage.locks import PathLock
lock = PathLock(sys.argv[1], exclusive=sys.argv[2] == "x").acquire()
open(sys.argv[3], "w").close()
time.sleep(float(sys.argv[4]))
"""


def _holder(tmp_path: Path, target: Path, exclusive: bool, seconds: float) -> subprocess.Popen:
    marker = tmp_path / f"held-{time.time_ns()}"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(target), "x" if exclusive else "s",
                             str(marker), str(seconds)])
    deadline = time.time() + 60
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.02)
    return proc


def test_conflict_names_the_holder_and_shared_locks_coexist(tmp_path: Path) -> None:
    target = tmp_path / "ds"
    proc = _holder(tmp_path, target, exclusive=False, seconds=30)
    try:
        with PathLock(target, exclusive=False):  # another reader: fine
            pass
        with pytest.raises(LockError) as e:
            PathLock(target, exclusive=True, what="dataset", purpose="partition in place").acquire()
        msg = str(e.value)
        assert f"pid {proc.pid}" in msg and "PathLock" in msg  # the holder's command line
        assert "cannot partition in place this dataset" in msg and "--wait" in msg
    finally:
        proc.kill()
        proc.wait()


def test_lock_of_a_killed_process_is_taken_over_and_files_go(tmp_path: Path) -> None:
    target = tmp_path / "run"
    proc = _holder(tmp_path, target, exclusive=True, seconds=60)
    with pytest.raises(LockError):
        PathLock(target, exclusive=False).acquire()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert lock_path(target).exists()  # the empty file a kill -9 leaves ...
    with PathLock(target, exclusive=True):
        pass
    assert not lock_path(target).exists()  # ... is reused, then removed by its last holder


def test_wait_waits_for_the_holder(tmp_path: Path) -> None:
    target = tmp_path / "ds"
    proc = _holder(tmp_path, target, exclusive=True, seconds=1.0)
    t0 = time.time()
    with PathLock(target, exclusive=False, wait=True):
        waited = time.time() - t0
    proc.wait()
    assert 0.3 < waited < 30


def test_same_process_upgrade_and_downgrade(tmp_path: Path) -> None:
    target = tmp_path / "ds"
    reader = PathLock(target, exclusive=False).acquire()
    writer = PathLock(target, exclusive=True).acquire()  # same process: never conflicts
    writer.release()
    proc = _holder(tmp_path, target, exclusive=False, seconds=0.1)  # back to shared: readers ok
    proc.wait()
    reader.release()
    assert not lock_path(target).exists()


def _ooc(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ooc.tools.cli", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def _train_args(ds: Path, out: Path, *extra: str) -> list[str]:
    return ["train", str(ds), "--model", "sage", "--fanout", "5,5", "--batch-size", "64",
            "--hidden", "16", "--epochs", "2", "--partitions", "4", "--buffer-partitions", "2",
            "--output-dir", str(out), "--no-progress", "--seed", "0", *extra]


def test_partition_during_train_and_two_trains_into_one_dir(tmp_path: Path,
                                                            planted_dataset: Path) -> None:
    ds = tmp_path / "planted"
    shutil.copytree(planted_dataset, ds)
    run = tmp_path / "run"
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE_STEP=f"3:60:{marker}")
    proc = start_paused(_train_args(ds, run, "--checkpoint-every", "2"), env, marker)
    try:
        before = sorted(p.name for p in ds.rglob("*"))
        r = _ooc(["partition", str(ds), "--parts", "4", "--method", "stream"])
        assert r.returncode == 2, r.stderr
        assert f"pid {proc.pid}" in r.stderr and "train" in r.stderr
        assert "cannot partition in place this dataset" in r.stderr
        assert "Traceback" not in r.stderr
        assert sorted(p.name for p in ds.rglob("*")) == before  # nothing rewritten
        r = _ooc(_train_args(ds, run))  # a second run into the same directory
        assert r.returncode == 2, r.stderr
        assert f"pid {proc.pid}" in r.stderr and "cannot train into this run directory" in r.stderr
        r = _ooc(["convert", "numpy", str(tmp_path / "e.npy"), "--out", str(ds), "--overwrite"])
        assert r.returncode == 2  # the input does not exist: refused, or the lock: either way kept
    finally:
        proc.send_signal(signal.SIGTERM)  # stops promptly (the pause is a sleep in the main thread)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert Dataset(ds).check_structure() == []
    # the killed run's records are one run's, and the run directory can be resumed
    r = _ooc(_train_args(ds, run))
    assert r.returncode == 2 and "holds another run" in r.stderr and "--resume" in r.stderr
    r = _ooc(["train", "--resume", str(run), "--no-progress", "--checkpoint-every", "2"])
    assert r.returncode == 0, r.stderr
    steps = [line for line in (run / "steps.jsonl").read_text().splitlines() if line]
    assert [int(s.split('"step": ')[1].split(",")[0]) for s in steps] == list(range(len(steps)))


def test_new_run_refuses_a_finished_run_unless_overwrite(tmp_path: Path, planted_dataset: Path) -> None:
    run = tmp_path / "run"
    assert main(_train_args(planted_dataset, run)[:-2] + ["--epochs", "1"]) == 0
    (run / "notes.txt").write_text("mine")
    metrics = (run / "metrics.json").read_bytes()
    assert main(_train_args(planted_dataset, run)) == 2
    assert (run / "metrics.json").read_bytes() == metrics  # untouched
    assert main(_train_args(planted_dataset, run, "--overwrite")) == 0
    assert (run / "metrics.json").read_bytes() != metrics
    assert (run / "notes.txt").read_text() == "mine"  # --overwrite replaces the run's files only
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no lock file left


def test_two_converts_to_one_out(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1, 2], [1, 2, 0]], dtype=np.int64))
    out = tmp_path / "ds"
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE=f"before-rename:60:{marker}")
    proc = start_paused(["convert", "numpy", str(tmp_path / "e.npy"), "--out", str(out)], env, marker)
    try:
        r = _ooc(["convert", "numpy", str(tmp_path / "e.npy"), "--out", str(out)])
        assert r.returncode == 2 and f"pid {proc.pid}" in r.stderr and "cannot write" in r.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert not out.exists()  # the terminated writer left nothing, not even its partial
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "paused"]
