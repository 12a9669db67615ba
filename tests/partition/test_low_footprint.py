"""In-place ``ooc partition --footprint low``: the same dataset as the copy path, a disk peak of at
most 1.5x the source, and a rewrite killed at any point finished by ``--resume``."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import start_paused
from ooc.kernels.graph import build_csc
from ooc.partition import partition_dataset
from ooc.storage.dataset import Dataset, DatasetError, DatasetWriter, REWRITE_DIR, pending_rewrite
from ooc.tools.cli import main

ARGS = ["--parts", "4", "--method", "stream", "--memory-budget", "16MB"]


def make(path: Path, n: int = 20_000, m: int = 100_000, d: int = 32, chunk_rows: int = 512,
         seed: int = 0, node_type: bool = False, features: bool = True) -> Path:
    """A graph whose features (20,000 x 32 float32 = 2.6 MB, 40 chunks of 64 KiB) are most of it."""
    rng = np.random.default_rng(seed)
    ip, ix = build_csc(rng.integers(0, n, m), rng.integers(0, n, m), n)
    with DatasetWriter(path) as w:
        w.write_array("indptr", ip)
        w.write_array("indices", ix)
        x = rng.standard_normal((n, d)).astype(np.float32)
        if features:
            w.write_array("features", x, chunk_rows=chunk_rows)
        w.write_array("labels", rng.integers(0, 3, n).astype(np.int32))
        w.write_array("train", np.arange(0, n, 3))
        w.write_array("valid", np.arange(1, n, 3))
        if node_type:
            w.write_array("node_type", (np.arange(n) % 3).astype(np.int32))
        w.commit(name="t", num_nodes=n, num_classes=3)
    return path


def same_dataset(a: Path, b: Path) -> None:
    """Same arrays (metadata, catalog checksums, values); both verify."""
    da, db = Dataset(a), Dataset(b)
    assert da.manifest["arrays"] == db.manifest["arrays"]
    for rel in da.manifest["arrays"]:
        assert da.checksums(rel) == db.checksums(rel), rel
        assert np.array_equal(da.raw(rel).read_all(), db.raw(rel).read_all()), rel
    assert da.verify_checksums() == [] and da.check_structure() == []
    assert not (a / REWRITE_DIR).exists()
    da.close()
    db.close()


def disk_bytes(path: Path, seen: set | None = None) -> int:
    """Bytes of the files under ``path``, each inode once (in ``seen``, shared between calls of one
    sample: a folder renamed while the walk runs is met twice)."""
    seen = set() if seen is None else seen
    total = 0
    for dp, _dn, fn in os.walk(path):
        for f in fn:
            try:
                st = os.stat(os.path.join(dp, f))
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


@pytest.fixture()
def copy_result(tmp_path: Path) -> Path:
    ref = make(tmp_path / "ref")
    assert main(["partition", str(ref), *ARGS, "--footprint", "copy"]) == 0
    return ref


@pytest.mark.parametrize("buckets", [True, False])
def test_low_footprint_equals_copy(tmp_path: Path, buckets: bool) -> None:
    """Same arrays and checksums as the copy path, with and without edge buckets, with another node
    array, and partitioning an already partitioned dataset (old buckets and nodes/perm)."""
    extra = [] if buckets else ["--no-edge-buckets"]
    a, b = make(tmp_path / "a", node_type=True), make(tmp_path / "b", node_type=True)
    assert main(["partition", str(a), *ARGS, *extra, "--footprint", "low"]) == 0
    assert main(["partition", str(b), *ARGS, *extra, "--footprint", "copy"]) == 0
    same_dataset(a, b)
    assert main(["verify", str(a)]) == 0
    a_args = ["--parts", "3", "--method", "random", "--memory-budget", "16MB", *extra]
    assert main(["partition", str(a), *a_args, "--footprint", "low"]) == 0
    assert main(["partition", str(b), *a_args, "--footprint", "copy"]) == 0
    same_dataset(a, b)


def test_low_footprint_without_features(tmp_path: Path) -> None:
    a, b = make(tmp_path / "a", features=False), make(tmp_path / "b", features=False)
    assert main(["partition", str(a), *ARGS, "--footprint", "low"]) == 0
    assert main(["partition", str(b), *ARGS, "--footprint", "copy"]) == 0
    same_dataset(a, b)


def test_disk_peak_at_most_1_5x_the_source(tmp_path: Path, monkeypatch) -> None:
    """Bytes of the dataset folder (the rewrite works inside it) at every step of the rewrite (a
    hook at each point where the disk use peaks: before source chunks or spool files are deleted)
    and sampled every 2 ms by a thread: at most 1.5x the source, edge buckets included; the copy
    path, measured the same way, needs ~2x."""
    import ooc.partition as part
    import ooc.partition_inplace as inplace
    import ooc.storage.dataset as dsmod
    cur = [make(tmp_path / "d", n=40_000, m=200_000)]
    source = disk_bytes(cur[0])
    samples: list[int] = []

    def measure(name: str) -> None:
        seen: set = set()
        samples.append(disk_bytes(cur[0], seen) + sum(disk_bytes(p, seen) for p in
                                                      tmp_path.glob(f".{cur[0].name}.*")))

    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            try:
                measure("")
            except FileNotFoundError:  # a file deleted while listed
                pass
            time.sleep(0.002)

    monkeypatch.setattr(inplace, "_fault_point", measure)
    monkeypatch.setattr(part, "_fault_point", measure)
    monkeypatch.setattr(dsmod, "_fault_point", measure)
    t = threading.Thread(target=sampler, daemon=True)
    t.start()
    try:
        from ooc.partition_inplace import disk_estimate
        est = disk_estimate(Dataset(cur[0]), True, 4)
        partition_dataset(cur[0], 4, "stream", memory_budget="16MB", footprint="low")
        peak = max(samples)
        assert peak <= est["low_peak"], (peak, est)  # what `auto` compares with the free space
        assert len(samples) > 20
        assert peak <= 1.5 * source, f"peak {peak / source:.3f}x the source ({peak:,} of {source:,} B)"
        # the copy path, for contrast
        cur[0] = make(tmp_path / "c", n=40_000, m=200_000)
        samples.clear()
        partition_dataset(cur[0], 4, "stream", memory_budget="16MB", footprint="copy")
        assert max(samples) > 1.8 * source
    finally:
        stop.set()
        t.join()


POINTS = ["rewrite-topology", "low-disk-consume", "low-disk-buckets", "low-disk-spool",
          "low-disk-place", "low-disk-finalize", "low-disk-commit"]


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_then_resume_gives_the_same_dataset(tmp_path: Path, copy_result: Path, point: str,
                                                    capsys) -> None:
    """SIGKILL at each step: while preparing the dataset stays whole (it opens; the same command
    starts over); after, it refuses to open naming ``--resume``, which finishes the rewrite to
    the copy path's dataset."""
    ds = make(tmp_path / "d")
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE=f"{point}:120:{marker}")
    proc = start_paused(["partition", str(ds), *ARGS, "--footprint", "low"], env, marker)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    if point == "rewrite-topology":
        assert Dataset(ds).check_structure() == []  # untouched
        assert pending_rewrite(ds)["phase"] == "prepare"
        assert main(["partition", str(ds), "--resume"]) == 0  # runs it again, with its arguments
        assert "(memory budget 15.3 MiB: " in capsys.readouterr().out  # ARGS' 16MB, not the default
    else:
        with pytest.raises(DatasetError, match=rf"interrupted.*`ooc partition {ds} --resume`"):
            Dataset(ds)
        assert main(["verify", str(ds)]) != 0
        assert "--resume" in capsys.readouterr().err
        assert main(["info", str(ds)]) == 2
        assert "--resume" in capsys.readouterr().err
        assert main(["partition", str(ds), "--resume"]) == 0
        assert "finishing the interrupted in-place rewrite" in capsys.readouterr().out
    same_dataset(ds, copy_result)


@pytest.mark.parametrize("point,nth", [("low-disk-consume", 0), ("low-disk-spool", 0),
                                       ("low-disk-spool", 7), ("low-disk-place", 0),
                                       ("low-disk-place", 5), ("low-disk-finalize", 0),
                                       ("low-disk-commit", 0), ("low-disk-commit", 1)])
def test_injected_failures_then_resume(tmp_path: Path, copy_result: Path, monkeypatch, point: str,
                                       nth: int) -> None:
    """An exception at the nth pass of a point, then one more at the next point on the resume,
    then a clean resume: the copy path's dataset; the same command again also finishes."""
    import ooc.partition_inplace as inplace
    ds = make(tmp_path / "d")
    seen: dict[str, int] = {}
    fail = {point: nth}

    def fault(name: str) -> None:
        seen[name] = seen.get(name, 0) + 1
        if name in fail and seen[name] == fail[name] + 1:
            del fail[name]
            raise OSError(28, f"injected at {name}")

    monkeypatch.setattr(inplace, "_fault_point", fault)
    with pytest.raises(DatasetError, match=r"injected.*--resume"):
        partition_dataset(ds, 4, "stream", memory_budget="16MB", footprint="low")
    with pytest.raises(DatasetError, match="--resume"):
        Dataset(ds)
    seen.clear()
    fail.update({"low-disk-place": 2, "low-disk-commit": 0})
    with pytest.raises(DatasetError):
        partition_dataset(ds, 4, "stream", memory_budget="16MB")  # the same command resumes
    with pytest.raises(ValueError, match=r"must finish first: run `ooc partition .* --resume`"):
        partition_dataset(ds, 3, "stream", memory_budget="16MB")  # another one is refused
    fail.clear()
    partition_dataset(ds, None, resume=True)
    same_dataset(ds, copy_result)


def test_resume_reports_the_budget_the_rewrite_was_started_with(tmp_path: Path, monkeypatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    """``--resume`` runs under the interrupted run's settings (its journal) and its summary says so:
    the same budget and split as an uninterrupted run's, not the default (or a new) --memory-budget."""
    import ooc.partition_inplace as inplace
    ref = make(tmp_path / "ref")
    assert main(["partition", str(ref), *ARGS, "--footprint", "low"]) == 0
    want = capsys.readouterr().out.splitlines()[-1]
    assert "(memory budget 15.3 MiB: " in want and "for rewrite groups)" in want
    ds = make(tmp_path / "d")
    fail = ["low-disk-place"]

    def fault(name: str) -> None:
        if name in fail:
            fail.remove(name)
            raise OSError(28, f"injected at {name}")

    monkeypatch.setattr(inplace, "_fault_point", fault)
    assert main(["partition", str(ds), *ARGS, "--footprint", "low"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["partition", str(ds), "--resume", "--memory-budget", "1GB"]) == 0
    got = capsys.readouterr().out.splitlines()[-1]
    assert got == want.replace(str(ref), str(ds)).replace("in place with the low disk footprint",
                                                          "finishing the interrupted in-place rewrite")


def test_sigterm_after_consumption_names_resume(tmp_path: Path, copy_result: Path) -> None:
    ds = make(tmp_path / "d")
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE=f"low-disk-place:120:{marker}")
    proc = start_paused(["partition", str(ds), *ARGS, "--footprint", "low"], env, marker)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    assert rc == 128 + signal.SIGTERM, err
    assert f"`ooc partition {ds} --resume` finishes it" in err and "partial output removed" not in err
    assert main(["partition", str(ds), "--resume"]) == 0
    same_dataset(ds, copy_result)


def test_auto_footprint_follows_free_disk(tmp_path: Path, copy_result: Path, monkeypatch) -> None:
    """auto: the copy path while the disk has room for it, the low-footprint path when only that
    fits, a refusal (nothing written) when neither does."""
    import ooc.partition as part
    from ooc.partition_inplace import disk_estimate
    ds = make(tmp_path / "d")
    est = disk_estimate(Dataset(ds), True, 4)
    assert est["source"] == disk_bytes(ds) and est["low_peak"] <= 1.5 * est["source"]
    real = shutil.disk_usage

    def free(n: int):
        return lambda p: real(p)._replace(free=n)

    monkeypatch.setattr(part.shutil, "disk_usage", free(part._DISK_SLACK // 2))
    with pytest.raises(ValueError, match="not enough disk to partition in place"):
        partition_dataset(ds, 4, "stream", memory_budget="16MB")
    assert Dataset(ds).check_structure() == [] and not (ds / REWRITE_DIR).exists()
    low = int(est["low_extra"] * part._DISK_MARGIN) + part._DISK_SLACK + 1
    assert low < est["copy_extra"] * part._DISK_MARGIN + part._DISK_SLACK
    monkeypatch.setattr(part.shutil, "disk_usage", free(low))
    _, res = partition_dataset(ds, 4, "stream", memory_budget="16MB")
    assert res.extra["footprint"] == "low"
    same_dataset(ds, copy_result)
    monkeypatch.setattr(part.shutil, "disk_usage", real)
    _, res = partition_dataset(ds, 4, "stream", memory_budget="16MB")
    assert res.extra["footprint"] == "copy"


def test_resume_without_a_pending_rewrite(tmp_path: Path, capsys) -> None:
    ds = make(tmp_path / "d")
    assert main(["partition", str(ds), "--resume"]) == 2
    assert "no interrupted in-place `ooc partition` to resume" in capsys.readouterr().err
    assert main(["partition", str(ds), "--resume", "--out", str(tmp_path / "o")]) == 2
    assert main(["partition", str(ds)]) == 2
    assert "--parts is required" in capsys.readouterr().err
