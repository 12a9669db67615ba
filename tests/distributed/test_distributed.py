"""Data-parallel training on CPU with gloo: sharding, equivalence, step counts, exact
evaluation, several "machines", torchrun, a dead rank, shared-buffer memory.

Every multi-process test runs under a timeout (``launch(timeout_s=...)`` or a subprocess timeout
that kills the whole process group), so a hang fails the test instead of blocking the suite.
Machine load varies a lot on the shared development machine: the limits are generous, the
assertions are not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ooc.config import TrainConfig
from ooc.data.plan import plan_exact, shard_plan
from ooc.distributed.launch import LaunchSpec, free_port, launch, parse_devices
from ooc.ingest.convert import write_graph_dataset
from ooc.training.loop import train

JOB_TIMEOUT = 420  # seconds for a whole multi-process job on a loaded 2-core machine


# ---------------------------------------------------------------------------- helpers
def _ring_dataset(path: Path, n: int, train: np.ndarray, valid: np.ndarray, test: np.ndarray,
                  feat_dim: int = 4, seed: int = 0) -> Path:
    """A ring (v-1 -> v, v+1 -> v) with random features and labels ``v % 2``."""
    v = np.arange(n, dtype=np.int64)
    src = np.concatenate([(v - 1) % n, (v + 1) % n])
    dst = np.concatenate([v, v])
    x = np.random.default_rng(seed).standard_normal((n, feat_dim)).astype(np.float32)
    labels = (v % 2).astype(np.int32)
    return write_graph_dataset(path, n, src, dst, x, labels, {"train": train, "valid": valid,
                                                              "test": test}, 2, "ring")


def _cli(args: list[str], timeout: float, env: dict | None = None) -> subprocess.Popen:
    """Start ``python -m ooc.tools.cli ARGS`` in its own session (so the test can kill it and all
    its ranks by process group)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "ooc.tools.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=e)


def _finish(p: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Wait for ``p``; on timeout kill its process group and fail the test."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _killpg(p)
        out, err = p.communicate()
        pytest.fail(f"job did not finish within {timeout} s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
    return p.returncode, out, err


def _killpg(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _weights(run: Path) -> dict:
    return torch.load(run / "checkpoint.pt", weights_only=True)["model"]


def _assert_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0), (k, (a[k] - b[k]).abs().max())


def _base(ds: Path, out: Path, **kw: object) -> list[str]:
    """CLI arguments of the equivalence runs: dropout off (masks are per rank) and SGD, whose
    update is linear in the gradient -- the ranks' gradients equal the single process's up to float
    rounding (~1e-7), which Adam's per-weight normalisation would amplify for weights with
    near-zero gradients (to ~1e-4 after 8 steps on some batch orders)."""
    args = ["train", str(ds), "--model", "sage", "--fanout", "5,5", "--hidden", "16", "--epochs", "1",
            "--partitions", "8", "--buffer-partitions", "2", "--dropout", "0", "--seed", "3",
            "--optimizer", "sgd", "--output-dir", str(out), "--no-progress"]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return args


@pytest.fixture(scope="module")
def single_128(planted_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The reference: one process, batch 128, one epoch (run directory, metrics)."""
    out = tmp_path_factory.mktemp("single") / "one"
    return out, _single(planted_dataset, out, batch_size=128)


def _single(ds: Path, out: Path, batch_size: int) -> dict:
    cfg = TrainConfig(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], hidden=16,
                      epochs=1, partitions=8, buffer_partitions=2, dropout=0.0, seed=3,
                      optimizer="sgd", batch_size=batch_size, progress=False)
    return train(cfg)


# ---------------------------------------------------------------------------- sharding (no processes)
@pytest.mark.parametrize("num_seeds,world,batch", [(4097, 4, 1024), (10, 4, 2), (900, 2, 64), (3, 4, 5),
                                                   (1, 3, 1), (64, 2, 32)])
def test_shard_plan_equal_steps_every_seed_once(num_seeds: int, world: int, batch: int) -> None:
    seeds = np.arange(100, 100 + num_seeds, dtype=np.int64)
    full = plan_exact(seeds, batch * world, seed=1, epoch=2)
    shards = [shard_plan(full, r, world) for r in range(world)]
    steps = -(-num_seeds // (batch * world))
    assert [len(s.batches) for s in shards] == [steps] * world
    trained = []
    for i in range(steps):
        g = full.batches[i].shape[0]
        sizes = [s.real[i] for s in shards]
        assert sum(sizes) == g and max(sizes) - min(sizes) <= 1
        for s in shards:
            assert s.batches[i].shape[0] >= 1           # every rank runs a step
            assert s.weights[i] == pytest.approx(s.real[i] * world / g)
            assert np.isin(s.batches[i], full.batches[i]).all()  # pads are real ids of the batch
            assert s.key(i) == i                                # keyed by the global batch
            if s.real[i]:
                trained.append(s.batches[i])
        assert sum(s.weights[i] for s in shards) == pytest.approx(world)
        assert all(s.batch_state[i] == full.batch_state[i] for s in shards)
    allt = np.concatenate(trained)
    assert np.array_equal(np.sort(allt), seeds)        # every seed exactly once, none dropped


def test_parse_devices_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU-only expectations")
    assert parse_devices("3") == ["cpu"] * 3
    assert parse_devices("cpu,cpu") == ["cpu", "cpu"]
    with pytest.raises(ValueError, match="CUDA"):
        parse_devices("cuda:0")
    with pytest.raises(ValueError, match="at least one"):
        parse_devices("0")
    with pytest.raises(ValueError, match="not a device"):
        parse_devices("gpu7")


def test_cli_rejects_impossible_layouts(planted_dataset: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    """Layout errors are reported before any process is started."""
    from ooc.tools.cli import main
    base = ["train", str(planted_dataset), "--output-dir", str(tmp_path / "r"), "--no-progress"]
    assert main(base + ["--nnodes", "2", "--node-rank", "0"]) == 2
    assert "--master-port" in capsys.readouterr().err
    assert main(base + ["--devices", "2", "--nnodes", "2", "--node-rank", "2",
                        "--master-port", "1234"]) == 2
    assert "--node-rank 2" in capsys.readouterr().err
    assert main(base + ["--devices", "2", "--repeat", "2"]) == 2
    assert "--repeat" in capsys.readouterr().err
    # a budget too small for the machine's ranks is refused by the launcher: no process, no folder
    assert main(base + ["--devices", "2", "--mode", "hybrid", "--memory-budget", "100kB"]) == 2
    err = capsys.readouterr().err
    assert "too small for 2 local ranks" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------- must hold
def test_one_process_2B_equals_two_processes_B(planted_dataset: Path, tmp_path: Path,
                                               single_128: tuple[Path, dict]) -> None:
    """1 process with batch 2B and 2 processes with batch B (shared buffer on) train the same model."""
    p = _cli(_base(planted_dataset, tmp_path / "two", batch_size=64, devices=2), JOB_TIMEOUT)
    one, single = single_128
    rc, out, err = _finish(p, JOB_TIMEOUT)
    assert rc == 0, err[-3000:]
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert two["distributed"]["steps_per_rank"] == [single["steps"]] * 2 == [8, 8]
    assert two["distributed"]["shared_buffer"] is True
    _assert_close(_weights(one), _weights(tmp_path / "two"), atol=1e-5)
    _assert_close(_weights(tmp_path / "two"), _weights(tmp_path / "two" / "rank1"), atol=0)
    h1, h2 = single["history"][0], two["history"][0]
    assert h2["loss"] == pytest.approx(h1["loss"], abs=1e-5)
    assert h2["train_acc"] == h1["train_acc"]
    assert (h2["val_acc"], h2["test_acc"]) == (h1["val_acc"], h1["test_acc"])
    assert "ranks         2 (gloo), steps per rank [8, 8]" in out


def test_uneven_seeds_equal_steps_and_exact_eval(tmp_path: Path) -> None:
    """4097 seeds / 4 ranks / batch 1024 and 10 seeds / 4 ranks / batch 2: every rank performs the
    same number of steps; 3 validation nodes [5, 9, 11] over 4 ranks (eval batch 2): evaluation
    completes on every rank and equals the single-process metric."""
    from dist_jobs import steps_and_eval
    n = 4200
    many = _ring_dataset(tmp_path / "many", n, np.arange(4097), np.arange(4097, 4150),
                         np.arange(4150, n))
    train_few = np.array([0, 1, 2, 3, 4, 6, 7, 8, 10, 12])
    few = _ring_dataset(tmp_path / "few", 16, train_few, np.array([5, 9, 11]), np.array([13, 14, 15]))
    out = tmp_path / "out"
    out.mkdir()
    rc = launch(steps_and_eval, (str(many), str(few), str(out)), LaunchSpec(["cpu"] * 4),
                timeout_s=JOB_TIMEOUT)
    assert rc == 0
    res = [json.loads((out / f"result{r}.json").read_text()) for r in range(4)]
    for r in res:
        assert r["many_steps"] == [2, 2, 2, 2]      # ceil(4097 / 4096)
        assert r["few_steps"] == [2, 2, 2, 2]       # ceil(10 / 8)
        assert r["resume_losses_equal"] and r["resume_weights_equal"]  # per-rank checkpoints
    assert len({(r["few_val"], r["few_test"]) for r in res}) == 1  # the same on every rank
    assert res[0]["few_val"] == res[0]["single_val"]
    assert res[0]["few_test"] == res[0]["single_test"]
    assert res[0]["few_val"] * 3 == pytest.approx(round(res[0]["few_val"] * 3))  # k of 3 nodes


def test_two_machines_each_with_its_own_dataset_copy(planted_dataset: Path, tmp_path: Path,
                                                     single_128: tuple[Path, dict]) -> None:
    """Two local launchers stand in for two machines (gloo on 127.0.0.1, a device cache per rank),
    each with its own dataset copy: 2 ranks of batch B train the model of one process with 2B."""
    copies = []
    for m in range(2):
        copies.append(tmp_path / f"machine{m}" / "planted")
        shutil.copytree(planted_dataset, copies[-1])
    port = free_port()
    procs = [_cli(_base(copies[m], tmp_path / f"machine{m}" / "run", batch_size=64, devices=1,
                        nnodes=2, node_rank=m, master_addr="127.0.0.1", master_port=port,
                        device_cache="24KiB"),
                  JOB_TIMEOUT) for m in range(2)]
    try:
        results = [_finish(p, JOB_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            _killpg(p)
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
    one, single = single_128
    m0 = json.loads((tmp_path / "machine0" / "run" / "metrics.json").read_text())
    d = m0["distributed"]
    assert d["world_size"] == 2 and d["nodes"] == [0, 1] and d["nnodes"] == 2
    assert d["steps_per_rank"] == [8, 8]
    _assert_close(_weights(one), _weights(tmp_path / "machine0" / "run"), atol=1e-5)
    # machine 1 wrote its rank's files into its own run directory
    _assert_close(_weights(one), _weights(tmp_path / "machine1" / "run" / "rank1"), atol=1e-5)
    assert m0["history"][0]["val_acc"] == single["history"][0]["val_acc"]
    # each rank had a device feature cache (CPU tier); it changed no weight above
    assert m0["device_cache_rows"] == 24 * 1024 // (16 * 4) and 0 < m0["device_cache_hit_ratio"] < 1


def test_torchrun(planted_dataset: Path, tmp_path: Path, single_128: tuple[Path, dict]) -> None:
    """Under torchrun (its environment variables), `ooc train` joins the job as one rank."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "ooc.tools.cli", *_base(planted_dataset, tmp_path / "tr", batch_size=64)]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    rc, out, err = _finish(p, JOB_TIMEOUT)
    assert rc == 0, err[-3000:]
    m = json.loads((tmp_path / "tr" / "metrics.json").read_text())
    assert m["distributed"]["steps_per_rank"] == [8, 8]
    assert m["distributed"]["local_world_size"] == 2
    _assert_close(_weights(single_128[0]), _weights(tmp_path / "tr"), atol=1e-5)


def test_successful_rank_exits_zero_whatever_its_teardown(tmp_path: Path,
                                                          capfd: pytest.CaptureFixture) -> None:
    """A rank whose work succeeded exits 0 even when an object left for the interpreter's teardown
    would abort the process (as a library's joinable C++ thread does at exit); its ``atexit``
    handlers still run and its unflushed output still arrives."""
    from dist_jobs import aborting_teardown
    out = tmp_path / "out"
    out.mkdir()
    assert launch(aborting_teardown, (str(out),), LaunchSpec(["cpu"] * 2), timeout_s=JOB_TIMEOUT) == 0
    assert (out / "atexit-ran").read_text() == "1"
    assert capfd.readouterr().out.count("rank done") == 2


def test_torchrun_rank_exits_zero_whatever_its_teardown(tmp_path: Path) -> None:
    """A rank started by torchrun is the ``ooc train`` process itself: after its work succeeded it
    too exits 0 with its ``atexit`` handlers run and its output flushed, whatever its teardown does."""
    out = tmp_path / "out"
    out.mkdir()
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib\n"
            "L = importlib.import_module('ooc.distributed.launch')\n"
            "from dist_jobs import aborting_teardown\n"
            "L.train_worker = lambda cfg, resume, control: aborting_teardown(sys.argv[2])\n"
            "class Cfg:\n    def to_dict(self): return {}\n"
            "L.run_cli(Cfg(), False, None)\nraise SystemExit(3)  # run_cli must not return\n")
    p = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent.parent), str(out)],
                       capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert (out / "atexit-ran").read_text() == "1"
    assert p.stdout == "rank done"


def test_overwrite_reaches_the_ranks(tmp_path: Path) -> None:
    """``--overwrite`` is not a configuration field; under ``--devices 2`` it still reaches rank 0,
    which replaces the earlier run; without it the earlier run is refused and left as it was.  A
    one-process run over it removes the earlier job's rank folder too."""
    n = 400
    ds = _ring_dataset(tmp_path / "ring", n, np.arange(20, n), np.arange(10), np.arange(10, 20))
    out = tmp_path / "run"
    args = ["train", str(ds), "--fanout", "2", "--hidden", "8", "--batch-size", "32", "--epochs", "1",
            "--partitions", "1", "--buffer-partitions", "1", "--output-dir", str(out),
            "--no-progress", "--devices", "2"]
    rc, _, err = _finish(_cli(args, JOB_TIMEOUT), JOB_TIMEOUT)
    assert rc == 0, err[-3000:]
    first = (out / "metrics.json").read_bytes()
    (out / "metrics.json").write_bytes(first + b" ")  # marks the earlier run's file
    rc, _, err = _finish(_cli(args, JOB_TIMEOUT), JOB_TIMEOUT)
    assert rc == 2 and "holds another run" in err and "pass --overwrite" in err  # bad input: 2
    assert (out / "metrics.json").read_bytes() == first + b" "
    rc, _, err = _finish(_cli(args + ["--overwrite"], JOB_TIMEOUT), JOB_TIMEOUT)
    assert rc == 0, err[-3000:]
    assert (out / "metrics.json").read_bytes() != first + b" "
    assert (out / "rank1" / "model.pt").exists()
    assert not (out / "rank1" / "checkpoint.prev.pt").exists()  # rank 1 cleared the earlier run too
    rc, _, err = _finish(_cli(args[:-2] + ["--overwrite"], JOB_TIMEOUT), JOB_TIMEOUT)  # one process
    assert rc == 0, err[-3000:]
    assert not (out / "rank1").exists()  # the earlier job's rank 1 went with its run


def test_killed_rank_ends_the_job(tmp_path: Path) -> None:
    """Two "machines" of one rank each; SIGKILL machine 1's rank mid-epoch: both launchers exit
    non-zero within 60 s with an error naming the failure."""
    n = 2000
    ds = _ring_dataset(tmp_path / "ring", n, np.arange(20, n), np.arange(10), np.arange(10, 20))
    marker = tmp_path / "paused"
    port = free_port()
    env = {"OOC_FAULT_PAUSE_STEP": f"3:1:{marker}"}
    procs = [_cli(["train", str(ds), "--fanout", "2", "--hidden", "8", "--batch-size", "4",
                   "--epochs", "1", "--partitions", "1", "--buffer-partitions", "1",
                   "--output-dir", str(tmp_path / f"run{m}"), "--no-progress", "--devices", "1",
                   "--nnodes", "2", "--node-rank", str(m), "--master-port", str(port)],
                  JOB_TIMEOUT, env) for m in range(2)]
    try:
        t0 = time.monotonic()
        while not marker.exists():  # a rank reached step 3 (every rank pauses there for 1 s)
            assert time.monotonic() - t0 < JOB_TIMEOUT, "the job never reached step 3"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        import psutil
        workers = [c for c in psutil.Process(procs[1].pid).children()
                   if "resource_tracker" not in " ".join(c.cmdline())]
        assert len(workers) == 1
        workers[0].kill()
        t_kill = time.monotonic()
        results = [_finish(p, 90) for p in procs]
        elapsed = time.monotonic() - t_kill
    finally:
        for p in procs:
            _killpg(p)
    assert elapsed < 60, elapsed
    assert results[1][0] != 0 and "SIGKILL" in results[1][2]
    assert results[0][0] != 0
    assert "rank 0 failed" in results[0][2] or "rank 0 (pid" in results[0][2]
    assert not (tmp_path / "run0" / "metrics.json").exists()


def test_shared_buffer_memory_is_one_buffer(tmp_path: Path) -> None:
    """Two local ranks, every partition resident (a 96 MiB buffer): with the shared buffer the
    processes hold about one buffer (sum of PSS; no private copy in either rank), without it two."""
    from dist_jobs import memory
    n, d = 98304, 256
    rng = np.random.default_rng(0)
    v = np.arange(n, dtype=np.int64)
    x = rng.standard_normal((n, d), dtype=np.float32)
    ds = write_graph_dataset(tmp_path / "big", n, np.concatenate([(v - 1) % n, (v + 1) % n]),
                             np.concatenate([v, v]), x, (v % 2).astype(np.int32),
                             {"train": v[::96], "valid": v[1:200:2], "test": v[2:200:4]}, 2, "big")
    del x
    out = tmp_path / "out"
    out.mkdir()
    rc = launch(memory, (str(ds), str(out)), LaunchSpec(["cpu"] * 2), timeout_s=JOB_TIMEOUT)
    assert rc == 0
    private = json.loads((out / "memory0.json").read_text())
    shared = json.loads((out / "memory1.json").read_text())
    buf = shared["buffer_bytes"]
    assert buf == private["buffer_bytes"] == n * d * 4
    assert shared["losses"] == private["losses"]          # sharing changes memory, not results
    # one I/O owner: rank 0 loaded the 4 partitions, rank 1 none (its buffer is a view)
    assert shared["partition_loads"] == 4
    # memory each rank gained during the run (from just before train() to the epoch end)
    def grown(run: dict, key: str) -> list[int]:
        return [e[key] - b[key] for b, e in zip(run["start_memory"], run["host_memory"])]

    # private buffers: each rank holds its own copy in anonymous memory -- two buffers in all
    assert all(g > 0.9 * buf for g in grown(private, "rss_anon")), (grown(private, "rss_anon"), grown(shared, "rss_anon"), buf)
    # shared: no rank holds a private copy; the segment exists once (the owner touched all of it)
    assert all(g < 0.3 * buf for g in grown(shared, "rss_anon"))
    assert shared["host_memory"][0]["rss_shmem"] >= 0.95 * buf
    # machine total = anonymous memory of the ranks + the segment once: about one buffer
    total_private = sum(grown(private, "rss_anon"))
    total_shared = sum(grown(shared, "rss_anon")) + max(m["rss_shmem"] for m in shared["host_memory"])
    assert 1.8 * buf < total_private < 2.6 * buf, (total_private, buf)
    assert 0.9 * buf < total_shared < 1.4 * buf, (total_shared, buf)


def test_hot_topology_is_one_copy_per_machine(planted_dataset: Path, tmp_path: Path) -> None:
    """Two local ranks with --topology disk --hot-topology: rank 1 maps rank 0's hot arrays
    (read-only shared memory), both equal a private build and both samplers draw the in-memory
    sample."""
    from dist_jobs import hot_topology
    out = tmp_path / "out"
    out.mkdir()
    rc = launch(hot_topology, (str(planted_dataset), str(out), 60_000), LaunchSpec(["cpu"] * 2),
                timeout_s=JOB_TIMEOUT)
    assert rc == 0
    recs = [json.loads((out / f"hot{r}.json").read_text()) for r in range(2)]
    assert recs[1]["shared"] and recs[0]["num_nodes"] == recs[1]["num_nodes"] > 0
    assert all(r["same"] and r["equal"] and r["hot_lists"] > 0 for r in recs)
    assert recs[0]["nbytes"] <= 60_000
