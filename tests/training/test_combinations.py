"""Every feature composes: modes x tasks x ranks under a memory budget, every sampler under a budget,
and the combinations a user of a partitioned Cora asks for.

Multi-process parts run under a timeout (a hang fails the test instead of blocking the suite).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ooc.config import TrainConfig
from ooc.distributed.launch import LaunchSpec, launch
from ooc.storage.dataset import Dataset
from ooc.training.loop import Interrupted, make_task, train

JOB_TIMEOUT = 420
#: the stated runtime overhead per process beyond the runtime's baseline RSS (model, autograd
#: workspace, allocator slack; docs/ARCHITECTURE.md)
OVERHEAD = 64 << 20
#: budgets that hold fewer than all 8 partitions of the planted graph (3,000 nodes x 16 floats) in
#: every mode, by (ranks, task, mode): the batches in flight are most of it (the planner lowers the
#: prefetch depth to fit, and a synchronous loader holds one batch); link prediction also holds its
#: split, 32 B per undirected edge per rank.  Found by planning budgets in 0.25 MB steps.
BUDGETS = {(1, "node", "exact"): 1_250_000, (1, "node", "buffer"): 1_500_000,
           (1, "node", "hybrid"): 1_250_000, (1, "link", "exact"): 2_000_000,
           (1, "link", "buffer"): 2_250_000, (1, "link", "hybrid"): 4_250_000,
           (2, "node", "exact"): 2_250_000, (2, "node", "buffer"): 2_500_000,
           (2, "node", "hybrid"): 2_250_000, (2, "link", "exact"): 3_750_000,
           (2, "link", "buffer"): 4_000_000, (2, "link", "hybrid"): 3_750_000}


def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    # the topology in memory: with --topology auto the planner would free its bytes for slots and
    # hold every partition (tests/data/test_autoplan.py covers that choice)
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=1, seed=3, partitions=8, buffer_partitions=2, progress=False, hidden=16,
                eval_batch_size=256, eval_candidates=100, topology="memory")
    base.update(kw)
    return TrainConfig(**base)


def _seen_once(cfg: TrainConfig, epochs: int = 1) -> list[tuple[int, np.ndarray]]:
    """Per epoch: (steps, every seed id trained, from this process's plan)."""
    cfg.validate()
    ds = Dataset(cfg.dataset)
    task = make_task(cfg, ds)
    out = []
    try:
        for e in range(epochs):
            plan = task.plan(e)
            real = [b[:plan.real[i]] if plan.real is not None else b for i, b in enumerate(plan.batches)]
            out.append((len(plan.batches), np.concatenate(real)))
    finally:
        task.close()
        ds.close()
    return out


# ---------------------------------------------------------------------------- one process
@pytest.mark.parametrize("task", ["node", "link"])
@pytest.mark.parametrize("mode", ["exact", "buffer", "hybrid"])
def test_every_mode_and_task_under_a_budget(planted_dataset: Path, tmp_path: Path, mode: str,
                                            task: str) -> None:
    """One process, a budget that holds fewer than all partitions: it trains, every training node
    (edge) is seen once per epoch, and the machine's data memory stays within budget + overhead."""
    budget = BUDGETS[(1, task, mode)]
    kw = dict(task=task, mode=mode, memory_budget=str(budget))
    if task == "link":
        kw.update(batch_size=512, dropout=0.0)
    m = train(_cfg(planted_dataset, tmp_path / "run", **kw))
    assert all(np.isfinite(m["losses"]))
    assert m["budget"]["planned"] <= budget
    assert m["budget"]["slots"] < 8 if mode != "exact" else m["budget"]["slots"] == 0
    h = m["history"][0]
    assert h["machine_data_peak_bytes"] <= budget + OVERHEAD, (h["machine_data_peak_bytes"], m["budget"])
    assert h["peak_private_phase"] in ("start-up", "training", "evaluation", "epoch end")
    assert 0.0 <= h["peak_private_at_s"] <= h["epoch_time_s"] + 60.0
    ((steps, seen),) = _seen_once(_cfg(planted_dataset, tmp_path / "p", **kw))
    assert steps == m["steps"]
    if task == "node":
        assert np.array_equal(np.sort(seen), Dataset(planted_dataset).split("train"))
        assert m["test_acc"] > 0.6  # chance is 0.25
    else:
        ds = Dataset(planted_dataset)
        from ooc.tasks.link import link_split
        n_train = link_split(ds.indptr, ds.indices, 0.05, 0.10, 0).train.shape[0]
        assert np.array_equal(np.sort(seen), np.arange(n_train))  # every training edge once
        assert 0 <= m["test_mrr"] <= 1


@pytest.mark.parametrize("sampler", ["neighbor", "labor", "ladies", "cluster", "saint"])
def test_exact_with_a_budget_trains_what_exact_without_one_does(planted_dataset: Path, tmp_path: Path,
                                                                sampler: str) -> None:
    """``exact`` mode: the same seed gives the same loss sequence with or without a budget (and a
    CPU cache in front of the disk), for every sampler.  Evaluation sampled in both (out of core
    the default evaluates layer-wise, which reads other rows), so the row misses compare."""
    kw = dict(sampler=sampler, layer_size=256, num_clusters=16, clusters_per_batch=2, eval_mode="sampled")
    free = train(_cfg(planted_dataset, tmp_path / "free", **kw))
    tight = train(_cfg(planted_dataset, tmp_path / "tight", memory_budget="2650kB", cache_size="40kB",
                       **kw))
    assert tight["budget"]["slots"] < 8
    assert free["losses"] == tight["losses"] and free["test_acc"] == tight["test_acc"]
    assert tight["row_misses"] > free["row_misses"] or free["budget"]["slots"] <= tight["budget"]["slots"]


@pytest.mark.parametrize("sampler", ["labor", "ladies", "cluster"])
def test_samplers_train_in_buffer_and_hybrid_mode(planted_dataset: Path, tmp_path: Path,
                                                  sampler: str) -> None:
    """Samplers whose batches come from the resident partitions train in buffer and hybrid mode;
    ClusterGCN's clusters then lie inside partitions (every batch's subgraph resident)."""
    for mode in ("buffer", "hybrid"):
        m = train(_cfg(planted_dataset, tmp_path / mode, sampler=sampler, mode=mode, epochs=3,
                       buffer_partitions=4, layer_size=256, num_clusters=16, clusters_per_batch=2))
        assert m["test_acc"] > 0.6, (sampler, mode, m["test_acc"])
        if mode == "buffer":
            assert m["history"][0]["swaps"] > 0
    if sampler == "cluster":
        assert m["history"][-1]["buffer_hit_ratio"] > 0


# ---------------------------------------------------------------------------- two processes
def test_two_ranks_every_mode_and_task_under_a_budget(planted_dataset: Path, tmp_path: Path) -> None:
    """Two local ranks sharing one buffer per machine, {exact, buffer, hybrid} x {node, link}: equal
    step counts, every training node (edge) trained once per epoch over both ranks, and the
    machine's data memory (both ranks, shared pages once) within budget + overhead per process."""
    from dist_jobs import modes_and_tasks
    out = tmp_path / "out"
    out.mkdir()
    budgets = {f"{t}-{m}": b for (r, t, m), b in BUDGETS.items() if r == 2}
    rc = launch(modes_and_tasks, (str(planted_dataset), str(out), budgets), LaunchSpec(["cpu"] * 2),
                timeout_s=JOB_TIMEOUT)
    assert rc == 0
    res = [json.loads((out / f"modes{r}.json").read_text()) for r in range(2)]
    ds = Dataset(planted_dataset)
    from ooc.tasks.link import link_split
    n_train = link_split(ds.indptr, ds.indices, 0.05, 0.10, 0).train.shape[0]
    for name in res[0]:
        a, b = res[0][name], res[1][name]
        assert a["steps_per_rank"] == b["steps_per_rank"] and len(set(a["steps_per_rank"])) == 1, name
        seen = np.sort(np.array(a["seen"] + b["seen"], dtype=np.int64))
        want = ds.split("train") if name.startswith("node") else np.arange(n_train)
        assert np.array_equal(seen, want), name
        budget = budgets[name]
        assert a["machine_data_peak"] <= budget + 2 * OVERHEAD, (name, a["machine_data_peak"])
        assert a["shared_buffer"] and a["planned"] <= budget, name
        assert a["slots"] < 8 if not name.endswith("exact") else a["slots"] == 0, name
        assert np.isfinite(a["loss"]), name


# ---------------------------------------------------------------------------- Cora, as a user asks
@pytest.fixture(scope="module")
def cora_metis(cora_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ooc.partition import partition_dataset
    out, _ = partition_dataset(cora_dataset, 4, "metis", out=tmp_path_factory.mktemp("cm") / "cora4")
    return out


def _cli(args: list[str], timeout: float = JOB_TIMEOUT) -> tuple[int, str, str]:
    p = subprocess.Popen([sys.executable, "-m", "ooc.tools.cli", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"timed out\n{err[-3000:]}")
    return p.returncode, out, err


CORA = ["--partitions", "4", "--mode", "hybrid", "--model", "gcn", "--hidden", "16",
        "--feat-norm", "row", "--batch-size", "32", "--lr", "0.02", "--epochs", "20", "--seed", "0",
        "--no-progress"]


@pytest.mark.parametrize("extra", [["--devices", "2", "--batch-size", "16", "--memory-budget", "45MB"],
                                   ["--memory-budget", "16MB", "--eval-batch-size", "64",
                                    "--eval-fanout", "10,10"],
                                   ["--memory-budget", "16MB"],
                                   ["--sampler", "labor", "--memory-budget", "60MB"],
                                   ["--device-cache", "2MB", "--memory-budget", "30MB"],
                                   ["--task", "link", "--hidden", "128", "--feat-norm", "none",
                                    "--batch-size", "256", "--dropout", "0", "--lr", "0.01",
                                    "--weight-decay", "0", "--memory-budget", "80MB"]],
                         ids=["devices2", "16MB", "16MB-layerwise", "labor", "device-cache", "link"])
def test_cora_combinations_train(cora_metis: Path, tmp_path: Path, extra: list[str]) -> None:
    """METIS-partitioned Cora (4 parts), hybrid under a budget that holds fewer than all partitions
    (most of it goes to batches in flight: a full-neighbourhood evaluation batch is the whole
    graph), with several devices / LABOR / a device cache / link prediction: each trains, to test
    accuracy >= 0.75 (node) or MRR >= 0.05 (link) after 20 epochs.  At 16 MB with the default
    evaluation (batches of 1,024 seeds, full neighbourhoods: they do not fit beside training) it
    evaluates layer-wise instead of refusing the run."""
    run = tmp_path / "run"
    rc, out, err = _cli(["train", str(cora_metis), *CORA, *extra, "--output-dir", str(run)])
    assert rc == 0, err[-3000:]
    m = json.loads((run / "metrics.json").read_text())
    assert m["budget"]["slots"] < 4, m["budget"]
    if "link" in extra:
        assert m["test_mrr"] >= 0.05, m["test_mrr"]
    else:
        assert m["test_acc"] >= 0.75, m["test_acc"]
    if "--devices" in extra:
        assert m["distributed"]["steps_per_rank"][0] == m["distributed"]["steps_per_rank"][1]
    if extra == ["--memory-budget", "16MB"]:
        assert m["eval_mode"] == "layerwise" and not m["budget"]["eval_batches"]


# ---------------------------------------------------------------------------- resume
def _weights(run: Path) -> dict:
    return torch.load(run / "checkpoint.pt", weights_only=True)["model"]


def test_link_buffer_mode_resume_is_bit_identical(planted_dataset: Path, tmp_path: Path) -> None:
    """Link prediction in buffer mode (edge-bucket states), interrupted mid-epoch, resumed:
    bit-identical to the uninterrupted run."""
    kw = dict(task="link", mode="buffer", batch_size=256, epochs=2,
              checkpoint_every=3, dropout=0.0, memory_budget="4.5MB")
    full = train(_cfg(planted_dataset, tmp_path / "full", **kw))
    with pytest.raises(Interrupted):
        train(_cfg(planted_dataset, tmp_path / "part", **kw), stop_after_steps=full["steps"] // 2 + 1)
    resumed = train(_cfg(planted_dataset, tmp_path / "part", **kw), resume=True)
    assert resumed["losses"] == full["losses"] and resumed["test_mrr"] == full["test_mrr"]
    wa, wb = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert full["history"][0]["swaps"] > 0


def test_two_ranks_hybrid_sigkill_then_resume_is_bit_identical(planted_dataset: Path,
                                                               tmp_path: Path) -> None:
    """Two ranks in hybrid mode (shared buffer), the whole job SIGKILLed mid-epoch 1, resumed with
    --resume: the weights of both ranks equal the uninterrupted run's bit for bit."""
    args = [str(planted_dataset), "--fanout", "5,5", "--batch-size", "32", "--epochs", "2", "--seed",
            "5", "--partitions", "8", "--buffer-partitions", "3", "--hidden", "16", "--mode", "hybrid",
            "--checkpoint-every", "3", "--prefetch", "1", "--devices", "2", "--no-progress"]
    rc, _, err = _cli(["train", *args, "--output-dir", str(tmp_path / "full")])
    assert rc == 0, err[-3000:]
    mf = json.loads((tmp_path / "full" / "metrics.json").read_text())
    per_epoch = mf["history"][0]["steps"]
    kill = per_epoch + 4
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE_STEP=f"{kill}:120:{marker}")
    p = subprocess.Popen([sys.executable, "-m", "ooc.tools.cli", "train", *args, "--output-dir",
                          str(tmp_path / "part")], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    t0 = time.monotonic()
    while not marker.exists():
        assert p.poll() is None, p.stderr.read().decode()[-3000:]
        assert time.monotonic() - t0 < JOB_TIMEOUT
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    # resuming with another layout would change the training: refused, the checkpoint kept
    rc, _, err = _cli(["train", "--resume", str(tmp_path / "part"), "--no-progress"])
    assert rc == 2 and "trained by 2 processes" in err and "--devices 2" in err, err[-2000:]
    rc, _, err = _cli(["train", "--resume", str(tmp_path / "part"), "--devices", "2", "--no-progress"])
    assert rc == 0, err[-3000:]
    mp = json.loads((tmp_path / "part" / "metrics.json").read_text())
    assert mp["resumed"] and mp["losses"] == mf["losses"]
    for sub in ("", "rank1"):
        wa, wb = _weights(tmp_path / "full" / sub), _weights(tmp_path / "part" / sub)
        assert all(torch.equal(wa[k], wb[k]) for k in wa), sub
