"""Out-of-core training: the buffer changes speed, never results; metrics; real accuracy."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ooc.config import TrainConfig
from ooc.data.buffer import BufferManager
from ooc.data.plan import plan_states
from ooc.kernels.partition import contiguous_partitions
from ooc.storage.dataset import Dataset
from ooc.storage.io import DiskRows
from ooc.tools.cli import main
from ooc.training.loop import train


def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=2, seed=3, partitions=8, buffer_partitions=2, progress=False)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_buffer_size_does_not_change_results(planted_dataset: Path, tmp_path: Path, model: str) -> None:
    full = train(_cfg(planted_dataset, tmp_path / "full", model=model, buffer_partitions=8))
    one = train(_cfg(planted_dataset, tmp_path / "one", model=model, buffer_partitions=1))
    assert len(full["losses"]) == 2 * int(np.ceil(900 / 64))
    assert full["losses"] == one["losses"]
    assert full["test_acc"] == one["test_acc"]
    assert full["val_acc"] == one["val_acc"]
    # ...but the I/O differs: everything resident vs most rows read from disk
    assert one["row_misses"] > full["row_misses"]
    assert one["buffer_bytes"] * 8 == full["buffer_bytes"]


def test_prefetch_depth_does_not_change_results(planted_dataset: Path, tmp_path: Path) -> None:
    a = train(_cfg(planted_dataset, tmp_path / "a", prefetch=0, epochs=1))
    b = train(_cfg(planted_dataset, tmp_path / "b", prefetch=4, epochs=1))
    assert a["losses"] == b["losses"]


def test_metrics_file_fields(planted_dataset: Path, tmp_path: Path) -> None:
    m = train(_cfg(planted_dataset, tmp_path / "run", epochs=3))
    on_disk = json.loads((tmp_path / "run" / "metrics.json").read_text())
    for k in ("test_acc", "val_acc", "epochs", "epoch_time_s", "bytes_read", "buffer_hit_ratio",
              "peak_rss_bytes", "seed", "config"):
        assert k in on_disk, k
    assert on_disk["epochs"] == 3 and len(on_disk["epoch_time_s"]) == 3
    assert on_disk["config"]["buffer_partitions"] == 2
    assert 0 < on_disk["buffer_hit_ratio"] < 1
    assert on_disk["bytes_read"] > 0
    assert (tmp_path / "run" / "model.pt").exists()
    # the planted labels are learnable: well above chance (0.25)
    assert m["test_acc"] > 0.6


def test_buffer_never_holds_more_than_capacity(planted_dataset: Path) -> None:
    ds = Dataset(planted_dataset)
    off = ds.partition_offsets
    rows = DiskRows(ds.features)
    buf = BufferManager(rows, off, capacity=2, fallback=rows, io_threads=1)
    train = ds.split("train")
    plan = plan_states(train, buf.part_of(train), 8, 1, 64, seed=0, epoch=0, ordering="sequential",
                       group=1)
    x = ds.features.read_all()
    for i, seeds in enumerate(plan.batches):
        k = plan.batch_state[i]
        buf.require(plan.states[k], plan.upcoming[k])
        assert len(buf.resident()) + len(buf._loading) <= 2
        assert plan.states[k][0] in buf.resident()
        assert np.array_equal(buf.gather(seeds)[0], x[seeds])
    buf.close()
    rows.close()
    assert buf.stats.partition_loads >= 8


def test_partitions_never_empty() -> None:
    assert contiguous_partitions(10, 10).tolist() == list(range(11))
    with pytest.raises(ValueError, match="empty"):
        contiguous_partitions(2, 3)


def test_cli_train_on_cora(cora_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(["train", str(cora_dataset), "--model", "gcn", "--fanout", "10,10", "--batch-size", "256",
               "--epochs", "100", "--seed", "0", "--partitions", "4", "--buffer-partitions", "1",
               "--hidden", "16", "--feat-norm", "row", "--output-dir", str(tmp_path / "run"),
               "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "test accuracy" in out
    # no bar, but one line per epoch still
    assert [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("epoch ")][:100] == \
        [f"epoch {i}" for i in range(100)]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["test_acc"] >= 0.78  # GCN on Cora: 81.5 published; one seed, 100 epochs


def test_cli_help_and_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "convert" in capsys.readouterr().out
    assert main(["train", str(tmp_path / "missing"), "--no-progress"]) == 2
    assert "no such dataset" in capsys.readouterr().err


@pytest.mark.parametrize("sampler", ["neighbor", "labor", "ladies", "cluster", "saint"])
def test_every_sampler_trains(planted_dataset: Path, tmp_path: Path, sampler: str) -> None:
    """``--sampler`` trains end to end; the planted labels are learnt by each sampler."""
    m = train(_cfg(planted_dataset, tmp_path / sampler, sampler=sampler, epochs=3, layer_size=256,
                   num_clusters=16, clusters_per_batch=2, model="sage"))
    assert m["config"]["sampler"] == sampler
    assert all(np.isfinite(m["losses"]))
    assert m["test_acc"] > 0.5  # chance is 0.25


def test_sampler_prefetch_does_not_change_results(planted_dataset: Path, tmp_path: Path) -> None:
    a = train(_cfg(planted_dataset, tmp_path / "a", sampler="saint", prefetch=0, epochs=1))
    b = train(_cfg(planted_dataset, tmp_path / "b", sampler="saint", prefetch=4, epochs=1))
    assert a["losses"] == b["losses"]


def test_sampled_evaluation_fanouts(planted_dataset: Path, tmp_path: Path) -> None:
    """--eval-fanout samples evaluation neighbourhoods: training is unchanged, the batches are
    bounded by the fanouts, the score is deterministic and the budget planner counts the smaller
    evaluation batches."""
    from ooc.data.budget import _staging_bytes
    from ooc.tasks.node import evaluate_nodes

    full = train(_cfg(planted_dataset, tmp_path / "full", epochs=1, mode="hybrid"))
    samp = train(_cfg(planted_dataset, tmp_path / "samp", epochs=1, mode="hybrid",
                      eval_fanouts=[2, 2]))
    assert samp["losses"] == full["losses"]          # evaluation never touches training
    assert samp["test_acc"] > 0.5                      # chance is 0.25
    again = train(_cfg(planted_dataset, tmp_path / "again", epochs=1, mode="hybrid",
                       eval_fanouts=[2, 2]))
    assert again["test_acc"] == samp["test_acc"] and again["val_acc"] == samp["val_acc"]

    class Stop(Exception):
        pass

    class Spy:
        def __init__(self) -> None:
            self.fanouts: list = []

        def eval_sampler(self, fanouts):  # noqa: ANN001, ANN202
            self.fanouts.append(fanouts)
            raise Stop

    spy = Spy()
    with pytest.raises(Stop):
        evaluate_nodes(torch.nn.Identity(), spy, np.arange(10), 2, 4, fanouts=[3, 2])
    with pytest.raises(Stop):
        evaluate_nodes(torch.nn.Identity(), spy, np.arange(10), 2, 4)
    assert spy.fanouts == [[3, 2], [-1, -1]]
    # batches built ahead on the loader thread (default) score exactly as built in the caller's thread
    from ooc.storage.dataset import Dataset
    from ooc.tasks.node import NodeTask
    from ooc.training.loop import make_model
    cfg = _cfg(planted_dataset, tmp_path / "samp", epochs=1, mode="hybrid", eval_fanouts=[2, 2])
    cfg.validate()
    ds = Dataset(planted_dataset)
    task = NodeTask(cfg, ds)
    try:
        model = make_model(cfg, ds.feat_dim, task.out_dim)
        model.load_state_dict(torch.load(tmp_path / "samp" / "model.pt", weights_only=True))
        test_ids = ds.split("test")
        ahead = evaluate_nodes(model, task.data, test_ids, 2, 8, fanouts=[2, 2])
        inline = evaluate_nodes(model, task.data, test_ids, 2, 8, fanouts=[2, 2], prefetch=0)
        assert (ahead == inline).all() and ahead[0] / ahead[1] > 0.5  # chance is 0.25
    finally:
        task.close()
        ds.close()
    with pytest.raises(ValueError, match="one per layer"):
        evaluate_nodes(torch.nn.Identity(), spy, np.arange(10), 2, 4, fanouts=[3])
    with pytest.raises(ValueError, match="one entry per layer"):
        _cfg(planted_dataset, tmp_path / "bad", eval_fanouts=[5]).validate()
    with pytest.raises(ValueError, match="--eval-mode layerwise uses them whole"):
        _cfg(planted_dataset, tmp_path / "bad", eval_fanouts=[5, -1], eval_mode="layerwise").validate()
    _cfg(planted_dataset, tmp_path / "ok", eval_fanouts=[-1, -1], eval_mode="layerwise").validate()
    # planner: full 3-hop neighbourhoods of 1,024 seeds on a 50 M-node, degree-20 graph are
    # estimated at the whole graph; sampled 15,10,5 batches (three training batches in flight
    # dominate then) at a fraction of it
    kw = dict(n=50_000_000, avg_deg=20.0, row_bytes=256, feat_dim=128, batch_size=1024,
              fanouts=[15, 10, 5], prefetch=1, hidden=256, eval_batch_size=1024)
    full_b = _staging_bytes(**kw)
    samp_b = _staging_bytes(**kw, eval_fanouts=[15, 10, 5])
    assert full_b > 50_000_000 * 256 > 2 * samp_b
    assert samp_b == _staging_bytes(**dict(kw, eval_batch_size=1))


def test_cli_refuses_combinations_that_cannot_work(planted_dataset: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """A combination that cannot work is an error that says why (exit 2), never a silent fallback:
    GraphSAINT inside the buffer, LABOR over lists read from disk, link prediction with a
    subgraph sampler."""
    base = ["train", str(planted_dataset), "--epochs", "1", "--no-progress",
            "--output-dir", str(tmp_path / "r")]
    for extra, words in ((["--sampler", "saint", "--mode", "buffer"], ("--sampler saint", "--mode buffer")),
                         (["--sampler", "labor", "--topology", "disk"], ("--sampler labor", "--topology disk")),
                         (["--sampler", "cluster", "--task", "link"], ("--task link", "--sampler cluster"))):
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert all(w in err for w in words), (extra, err)
    assert not (tmp_path / "r").exists()


def test_a_bad_size_in_a_config_names_its_option(planted_dataset: Path, tmp_path: Path) -> None:
    """Sizes from --config or --set are checked like the flags' (ooc.tools.options), by name."""
    for key in ("memory_budget", "cache_size", "hot_topology", "device_cache"):
        flag = "--" + key.replace("_", "-")
        with pytest.raises(ValueError, match=rf"^{flag}: -16MB is not a size \(sizes are positive"):
            _cfg(planted_dataset, tmp_path / "a", **{key: "-16MB"}).validate()
        with pytest.raises(ValueError, match=rf"^{flag}: cannot parse size 'lots'"):
            _cfg(planted_dataset, tmp_path / "a", **{key: "lots"}).validate()
    for zero in ("0", "0MB"):  # a zero budget is not a budget (no run fits it)
        with pytest.raises(ValueError, match=rf"^--memory-budget .data.memory_budget. {zero}: a budget "
                                             "must be positive .leave it out"):
            _cfg(planted_dataset, tmp_path / "a", memory_budget=zero).validate()


def test_bad_options_and_setup_errors_leave_no_run_folder(planted_dataset: Path, tmp_path: Path) -> None:
    """``--io-depth`` outside [1, 512] and a negative ``--io-gap`` are refused; a missing dataset and a memory
    budget too small for the run fail before training and leave no output folder behind, nor the
    parent folders made for it (a folder that existed before stays)."""
    from ooc.storage.dataset import DatasetError
    for depth in (0, 513):
        with pytest.raises(ValueError, match="--io-depth .data.io_depth. must be between 1 and 512"):
            _cfg(planted_dataset, tmp_path / "a", io_depth=depth).validate()
    with pytest.raises(ValueError, match="--io-gap .data.io_gap. must be >= 0"):
        _cfg(planted_dataset, tmp_path / "a", io_gap=-5).validate()
    with pytest.raises(DatasetError):
        train(_cfg(tmp_path / "no-such-dataset", tmp_path / "nods"))
    assert not (tmp_path / "nods").exists()
    with pytest.raises(ValueError, match="too small"):
        train(_cfg(planted_dataset, tmp_path / "tiny", mode="hybrid", memory_budget="4KB"))
    assert not (tmp_path / "tiny").exists()
    with pytest.raises(ValueError, match="too small"):  # nor the folders made for it
        train(_cfg(planted_dataset, tmp_path / "runs" / "a" / "tiny", mode="hybrid",
                   memory_budget="4KB"))
    assert not (tmp_path / "runs").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(DatasetError):
        train(_cfg(tmp_path / "no-such-dataset", tmp_path / "kept" / "a" / "b"))
    assert sorted(p.name for p in tmp_path.joinpath("kept").iterdir()) == []
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError, match="lies under .*afile, which is a file"):
        train(_cfg(planted_dataset, tmp_path / "afile" / "sub"))
    (tmp_path / "mine").mkdir()  # a folder the user made is never removed
    with pytest.raises(DatasetError):
        train(_cfg(tmp_path / "no-such-dataset", tmp_path / "mine"))
    assert (tmp_path / "mine").is_dir()


def test_console_script_restarts_with_huge_page_malloc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``ooc`` command re-executes itself once with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``
    on glibc >= 2.35, keeping other tunables; ``OOC_HUGEPAGES=0``, an explicit hugetlb setting or
    a process that already re-executed is left alone."""
    import platform

    from ooc.tools.cli import _hugepage_env
    lib, ver = platform.libc_ver()
    for k in ("GLIBC_TUNABLES", "OOC_HUGEPAGES", "_OOC_REEXEC"):
        monkeypatch.delenv(k, raising=False)
    if lib != "glibc" or tuple(int(x) for x in ver.split(".")[:2]) < (2, 35):
        assert _hugepage_env() is None
        return
    env = _hugepage_env()
    assert env is not None and env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and env["_OOC_REEXEC"] == "1"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert _hugepage_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    assert _hugepage_env() is None
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("OOC_HUGEPAGES", "0")
    assert _hugepage_env() is None
    monkeypatch.delenv("OOC_HUGEPAGES")
    monkeypatch.setenv("_OOC_REEXEC", "1")
    assert _hugepage_env() is None
    # the console script restarts (as ``python -m ooc.tools.cli``) and its exit status carries over
    monkeypatch.delenv("_OOC_REEXEC")
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['ooc', 'info', '/nonexistent'];"
                        "from ooc.tools.cli import main; sys.exit(main())"], capture_output=True, text=True)
    assert r.returncode == 2 and "/nonexistent" in r.stderr


def test_console_script_restart_ignores_an_ooc_folder_in_cwd(tmp_path: Path) -> None:
    """The re-executed command imports the installed ``ooc``, not an ``ooc/`` folder in the current
    directory (``python -m`` would put the directory first on ``sys.path``)."""
    import subprocess
    import sys
    (tmp_path / "ooc").mkdir()
    (tmp_path / "ooc" / "__init__.py").write_text("raise SystemExit('decoy ooc imported')\n")
    if sys.version_info < (3, 11):
        pytest.skip("no -P before Python 3.11 (and no re-execution)")
    env = {k: v for k, v in os.environ.items() if k not in ("_OOC_REEXEC", "OOC_HUGEPAGES")}
    code = ("import sys; sys.argv = ['ooc', 'info', '/nonexistent'];"
            "from ooc.tools.cli import main; sys.exit(main())")
    # -P: like the console script, whose sys.path starts with its bin/ directory, not the cwd
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, env=env)
    assert "decoy" not in r.stderr and r.returncode == 2 and "/nonexistent" in r.stderr


def test_bench_help_is_plain_text(capsys: pytest.CaptureFixture) -> None:
    """``ooc bench ooc|scale --help`` show their docstring paragraph without Sphinx markup."""
    from ooc.tools.bench import doc_help
    from ooc.tools.cli import main
    assert doc_help("Title.\n\nSee :func:`ooc.x` and ``y``\n   here.") == "See ooc.x and y here."
    for cmd in ("ooc", "scale"):
        with pytest.raises(SystemExit):
            main(["bench", cmd, "--help"])
        out = capsys.readouterr().out
        assert "``" not in out and ":func:" not in out and len(out) > 200
