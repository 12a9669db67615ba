"""Checkpoints and resume: an interrupted run, resumed, is bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import start_paused
import torch

from ooc.training.checkpoint import load_checkpoint
from ooc.config import TrainConfig
from ooc.tools.cli import main
from ooc.training.loop import Interrupted, train

TIMING = ("time", "_s", "per_s", "io_wait", "load_s", "bytes_read", "partition_loads", "row_hits",
          "row_misses", "buffer_hit_ratio", "bandwidth", "rss", "swaps", "cache_", "bytes",
          "topology_", "read_ahead_", "peak_", "read_requests")
# (I/O and memory counters of the run: a resumed one counts from its start)


def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=2, seed=3, partitions=8, buffer_partitions=2, progress=False,
                checkpoint_every=4, hidden=16)
    base.update(kw)
    return TrainConfig(**base)


def _deterministic(rec: dict) -> dict:
    """An epoch record without its timing and I/O fields (which a resumed run cannot reproduce)."""
    return {k: v for k, v in rec.items() if not any(t in k for t in TIMING)}


def _final_weights(run: Path) -> dict:
    return load_checkpoint(run / "checkpoint.pt")["model"]


def _assert_identical(a: Path, b: Path, ma: dict, mb: dict) -> None:
    wa, wb = _final_weights(a), _final_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert ma["losses"] == mb["losses"]
    assert [_deterministic(h) for h in ma["history"]] == [_deterministic(h) for h in mb["history"]]
    for k in ("test_acc", "val_acc", "best_epoch", "steps"):
        assert ma[k] == mb[k], k
    ba, bb = torch.load(a / "model.pt", weights_only=True), torch.load(b / "model.pt", weights_only=True)
    assert all(torch.equal(ba[k], bb[k]) for k in ba)


@pytest.mark.parametrize("kill_at,opts", [
    (7, {}),                                                  # mid-epoch, 3 steps after a checkpoint
    (15, {"model": "gat", "heads": 2, "attn_dropout": 0.3,    # the last batch of epoch 0
          "lr_schedule": "step", "lr_step": 1, "lr_gamma": 0.5}),
    (22, {"model": "gin", "norm": "batch", "residual": True, "lr_schedule": "cosine",
          "checkpoint_every": 0}),                            # no step checkpoints: back to epoch end
])
def test_resume_is_bit_identical(planted_dataset: Path, tmp_path: Path, kill_at: int, opts: dict) -> None:
    full = train(_cfg(planted_dataset, tmp_path / "full", **opts))
    assert full["steps"] == 30
    part = _cfg(planted_dataset, tmp_path / "part", **opts)
    with pytest.raises(Interrupted):
        train(part, stop_after_steps=kill_at)
    ck = load_checkpoint(tmp_path / "part" / "checkpoint.pt")
    every = opts.get("checkpoint_every", 4)
    expect = kill_at // every * every if every else 15
    assert ck["state"]["global_step"] == expect
    resumed = train(_cfg(planted_dataset, tmp_path / "part", **opts), resume=True)
    assert resumed["resumed"]
    _assert_identical(tmp_path / "full", tmp_path / "part", full, resumed)
    # the per-epoch and per-step logs were cut back to the checkpoint, not duplicated
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    steps = (tmp_path / "part" / "steps.jsonl").read_text().splitlines()
    assert len(steps) == 30


def test_sigkill_mid_epoch_then_resume(planted_dataset: Path, tmp_path: Path) -> None:
    full_run, part_run = tmp_path / "full", tmp_path / "part"
    args = [str(planted_dataset), "--fanout", "5,5", "--batch-size", "64", "--epochs", "2",
            "--seed", "5", "--partitions", "8", "--buffer-partitions", "2", "--hidden", "16",
            "--checkpoint-every", "3", "--no-progress"]
    assert main(["train", *args, "--output-dir", str(full_run)]) == 0
    marker = tmp_path / "paused"
    # step 20 is 5 batches into epoch 1 and 2 steps past the checkpoint of step 18
    env = dict(os.environ, OOC_FAULT_PAUSE_STEP=f"20:120:{marker}")
    proc = start_paused(["train", *args, "--output-dir", str(part_run)], env, marker, timeout=240)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    ck = load_checkpoint(part_run / "checkpoint.pt")
    assert (ck["state"]["epoch"], ck["state"]["step"], ck["state"]["global_step"]) == (1, 3, 18)
    assert not list(part_run.glob(".checkpoint.pt.tmp-*"))
    assert main(["train", "--resume", str(part_run), "--no-progress"]) == 0
    import json
    mf = json.loads((full_run / "metrics.json").read_text())
    mp = json.loads((part_run / "metrics.json").read_text())
    _assert_identical(full_run, part_run, mf, mp)


def test_sigterm_names_the_checkpoint_it_keeps(planted_dataset: Path, tmp_path: Path) -> None:
    """SIGTERM after a checkpoint: exit 143, the run folder and its checkpoint stay, and the
    message says so and how to continue (not "partial output removed"); the resume finishes."""
    run = tmp_path / "run"
    args = [str(planted_dataset), "--fanout", "5,5", "--batch-size", "64", "--epochs", "2",
            "--seed", "5", "--partitions", "8", "--buffer-partitions", "2", "--hidden", "16",
            "--checkpoint-every", "3", "--no-progress", "--output-dir", str(run)]
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE_STEP=f"8:120:{marker}")
    proc = start_paused(["train", *args], env, marker, timeout=240)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 143, err
    assert f"terminated by SIGTERM; {run} keeps its last checkpoint: `ooc train --resume {run}`" in err
    assert "partial output removed" not in err and (run / "checkpoint.pt").exists()
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0


def test_resume_without_checkpoint_fails(tmp_path: Path, planted_dataset: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    _cfg(planted_dataset, run).save(run)
    assert main(["train", "--resume", str(run)]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_resume_refuses_a_different_training(planted_dataset: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    train(_cfg(planted_dataset, run, epochs=1))
    assert main(["train", "--resume", str(run), "--hidden", "32", "--no-progress"]) == 2
    assert "hidden 16 -> 32" in capsys.readouterr().err
    # more epochs is fine: training continues from the end of epoch 0
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert m["epochs_run"] == 2 and m["steps"] == 30


def test_resume_refuses_a_dataset_partitioned_since(planted_dataset: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    """``ooc partition`` renumbers the nodes in place: a checkpoint taken before it refers to the old
    ids, so resuming on the repartitioned dataset is refused, naming both partitionings."""
    import shutil

    from ooc.partition import partition_dataset
    ds = tmp_path / "ds"
    shutil.copytree(planted_dataset, ds)
    run = tmp_path / "run"
    train(_cfg(ds, run, epochs=1))
    assert main(["train", "--resume", str(run), "--epochs", "1", "--no-progress"]) == 0  # unchanged
    partition_dataset(ds, 4, "metis")
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"the dataset {ds} changed since the checkpoint: it was partitioned again" in err
    assert "4 metis partitions now" in err
    assert json.loads((run / "metrics.json").read_text())["epochs_run"] == 1  # the run is kept


def test_sigkill_mid_epoch_then_resume_hybrid(planted_dataset: Path, tmp_path: Path) -> None:
    """Hybrid mode (buffer states, full-graph sampling, cache for misses), killed with SIGKILL in the
    middle of epoch 1: --resume continues from the last step checkpoint and ends bit-identical to an
    uninterrupted run."""
    full_run, part_run = tmp_path / "full", tmp_path / "part"
    args = [str(planted_dataset), "--fanout", "5,5", "--batch-size", "64", "--epochs", "2",
            "--seed", "5", "--partitions", "8", "--buffer-partitions", "3", "--hidden", "16",
            "--mode", "hybrid", "--hybrid-mix", "0.25", "--cache-size", "100kB", "--prefetch", "1",
            "--checkpoint-every", "3", "--no-progress"]
    assert main(["train", *args, "--output-dir", str(full_run)]) == 0
    mf = json.loads((full_run / "metrics.json").read_text())
    assert mf["mode"] == "hybrid" and mf["swaps"] > 0 and 0 < mf["buffer_hit_ratio"] < 1
    per_epoch = [h["steps"] for h in mf["history"]]
    kill = per_epoch[0] + 5  # 5 batches into epoch 1
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE_STEP=f"{kill}:120:{marker}")
    proc = start_paused(["train", *args, "--output-dir", str(part_run)], env, marker, timeout=240)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    ck = load_checkpoint(part_run / "checkpoint.pt")
    last = kill // 3 * 3  # the last step checkpoint before the kill
    assert ck["state"]["global_step"] == last
    assert (ck["state"]["epoch"], ck["state"]["step"]) == (1, last - per_epoch[0])
    assert main(["train", "--resume", str(part_run), "--no-progress"]) == 0
    mp = json.loads((part_run / "metrics.json").read_text())
    assert mp["resumed"] and mp["mode"] == "hybrid"
    _assert_identical(full_run, part_run, mf, mp)


def test_resume_refuses_other_buffer_states(planted_dataset: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    """Hybrid batches follow the buffer states: resuming with a buffer that plans other states
    (here 2 partition slots instead of 4) is refused, naming both; the same buffer resumes."""
    run = tmp_path / "run"
    train(_cfg(planted_dataset, run, epochs=1, mode="hybrid", buffer_partitions=4))
    assert main(["train", "--resume", str(run), "--buffer-partitions", "2", "--epochs", "2",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "buffer states of 3 resident partitions" in err and "plan 1" in err
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0


def test_resume_plans_the_interrupted_split_without_probing(planted_dataset: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a budget with --topology auto (lists on disk or not) and --hot-topology auto, the
    checkpoint holds the probed extents and the split; the resumed run plans them again without
    probing (no list sampled for the probe, no split compared), chooses the same split and ends
    bit-identical.  Changing a planning option at resume (--prefetch) probes again."""
    import ooc.data.autoplan as autoplan
    import ooc.data.path as path
    opts = dict(mode="hybrid", memory_budget="2MB", topology="disk", hot_topology="auto",
                prefetch=1, epochs=1, checkpoint_every=3)
    full = train(_cfg(planted_dataset, tmp_path / "full", **opts))
    part = _cfg(planted_dataset, tmp_path / "part", **opts)
    with pytest.raises(Interrupted):
        train(part, stop_after_steps=5)
    rec = load_checkpoint(tmp_path / "part" / "checkpoint.pt")["plan"]
    assert rec["extents"]["probed_train"] and rec["extents"]["list_bytes"] > 0
    assert rec["split"]["topology"] == "disk"

    def no_probe(*a: object, **k: object) -> None:
        raise AssertionError("probed again")
    monkeypatch.setattr(path, "probe_extents", no_probe)
    monkeypatch.setattr(path, "choose_split", no_probe)
    monkeypatch.setattr(autoplan.ListProbe, "sample", no_probe)
    resumed = train(_cfg(planted_dataset, tmp_path / "part", **opts), resume=True)
    assert resumed["resumed"]
    assert resumed["split"]["hot_topology_bytes"] == full["split"]["hot_topology_bytes"]
    assert resumed["split"]["slots"] == full["split"]["slots"]
    _assert_identical(tmp_path / "full", tmp_path / "part", full, resumed)
    with pytest.raises(AssertionError, match="probed again"):  # another prefetch depth: replanned
        train(_cfg(planted_dataset, tmp_path / "part", **dict(opts, prefetch=0, epochs=2)),
              resume=True)


def test_resume_of_a_finished_run_says_nothing_is_left(planted_dataset: Path, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    import logging
    run = tmp_path / "done"
    assert main(["train", str(planted_dataset), "--epochs", "2", "--partitions", "8",
                 "--no-progress", "--output-dir", str(run)]) == 0
    before = {f.name: f.read_bytes() for f in run.iterdir() if f.is_file()}
    with caplog.at_level(logging.WARNING):
        assert main(["train", "--resume", str(run), "--epochs", "1", "--no-progress"]) == 0
    assert "the run has trained 2 epochs and --epochs is 1: nothing left to train" in caplog.text
    # nothing rewritten: the config keeps --epochs 2 and the metrics the finished run's
    assert {f.name: f.read_bytes() for f in run.iterdir() if f.is_file()} == before
    assert "epochs: 2" in (run / "config.yaml").read_text()


def test_a_resumed_epochs_swaps_are_named_as_counted_from_the_resume(
        planted_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The epoch line of an epoch resumed mid-way counts its swaps from the batch it resumed at,
    and says so beside the whole epoch's lower bound (it read "swaps 0 (lower bound 6)", a count
    below its own bound); the next, whole epoch reads as before."""
    run = tmp_path / "run"
    cfg = _cfg(planted_dataset, run, mode="hybrid", buffer_partitions=3)
    with pytest.raises(Interrupted):
        train(cfg, stop_after_steps=5)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch ")]
    assert " since batch 4 (lower bound " in lines[0] and "for a whole epoch)" in lines[0], lines
    assert "since batch" not in lines[1] and " (lower bound " in lines[1], lines
