"""Per-device hot-feature cache (PaGraph degree / GNNLab pre-sampling), run on CPU as a separate
tensor tier: it changes where rows come from, never the rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ooc.config import TrainConfig
from ooc.features.device import (DeviceFeatureCache, access_counts, out_degrees, select_hot_nodes)
from ooc.storage.dataset import Dataset
from ooc.tasks.node import NodeTask
from ooc.training.loop import train


def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=2, seed=3, partitions=8, buffer_partitions=2, progress=False, hidden=16,
                feat_norm="row")
    base.update(kw)
    return TrainConfig(**base)


def test_select_hot_nodes_ties_and_bounds() -> None:
    score = np.array([5, 1, 5, 9, 0, 5])
    assert select_hot_nodes(score, 3).tolist() == [0, 2, 3]      # 9, then the 5s by id
    assert select_hot_nodes(score, 0).tolist() == []
    assert select_hot_nodes(score, 99).tolist() == list(range(6))


def test_out_degrees_streamed_in_chunks() -> None:
    idx = np.random.default_rng(0).integers(0, 50, 1000).astype(np.int32)
    assert np.array_equal(out_degrees(idx, 60, chunk=77), np.bincount(idx, minlength=60))


def test_cache_rows_equal_loader_rows(planted_dataset: Path, tmp_path: Path) -> None:
    """Assembled rows (cache hits + host misses) are bitwise the rows of the plain loader."""
    cfg = _cfg(planted_dataset, tmp_path)
    cfg.validate()
    ds = Dataset(planted_dataset)
    task = NodeTask(cfg, ds)
    data = task.data
    hot = select_hot_nodes(out_degrees(data.graph.indices, ds.num_nodes), 500)
    cache = DeviceFeatureCache.fill(data.features, hot, ds.num_nodes, torch.device("cpu"), "degree",
                                    chunk_rows=128)
    assert cache.num_rows == 500 and cache.nbytes == 500 * 16 * 4
    plan = task.plan(0)
    plain = data.node_batch(0, plan.batches[0], 0)
    data.device_cache = cache
    cached = data.node_batch(0, plan.batches[0], 0)
    assert cached.x.shape[0] < plain.x.shape[0]                   # only misses came from the host
    _, x = cached.inputs(torch.device("cpu"))
    assert torch.equal(x, plain.x)
    st = cache.reset_stats()
    assert st["device_cache_lookups"] == plain.x.shape[0]
    assert st["device_cache_hits"] == plain.x.shape[0] - cached.x.shape[0]
    task.close()
    ds.close()


def test_training_with_cache_is_identical(planted_dataset: Path, tmp_path: Path) -> None:
    """Same losses and scores with or without the cache, for both policies; the pre-sampled cache
    (GNNLab) is optimal for epoch 0, so its hit ratio there is at least the degree cache's."""
    base = train(_cfg(planted_dataset, tmp_path / "none"))
    runs = {p: train(_cfg(planted_dataset, tmp_path / p, device_cache="40KiB", device_cache_policy=p))
            for p in ("degree", "presample")}
    for p, m in runs.items():
        assert m["losses"] == base["losses"], p
        assert (m["val_acc"], m["test_acc"]) == (base["val_acc"], base["test_acc"])
        assert m["device_cache_rows"] == 40 * 1024 // (16 * 4)
        assert m["device_cache_policy"] == p
        assert 0 < m["device_cache_hit_ratio"] < 1
        h = m["history"][0]
        assert h["device_cache_lookups"] > h["device_cache_hits"] > 0
        # fewer rows went through the host buffer
        assert h["row_hits"] + h["row_misses"] < base["history"][0]["row_hits"] + \
            base["history"][0]["row_misses"]
    e0 = {p: m["history"][0]["device_cache_hit_ratio"] for p, m in runs.items()}
    assert e0["presample"] >= e0["degree"]
    # each epoch's counters cover exactly its training gathers (not the evaluation before it)
    cfg = _cfg(planted_dataset, tmp_path / "count")
    cfg.validate()
    ds = Dataset(planted_dataset)
    task = NodeTask(cfg, ds)
    for epoch in (0, 1):
        plan = task.plan(epoch)
        rows = access_counts(task.data.sampler, plan.batches, [plan.key(i) for i in range(len(plan))],
                             cfg.seed, epoch, ds.num_nodes).sum()
        assert runs["presample"]["history"][epoch]["device_cache_lookups"] == rows
    task.close()
    ds.close()


def test_presample_counts_are_the_epochs_accesses(planted_dataset: Path, tmp_path: Path) -> None:
    """GNNLab's pre-sampling counts exactly the input rows the loader gathers for those batches."""
    cfg = _cfg(planted_dataset, tmp_path)
    cfg.validate()
    ds = Dataset(planted_dataset)
    task = NodeTask(cfg, ds)
    data = task.data
    plan = task.plan(0)
    counts = access_counts(data.sampler, plan.batches[:3], [0, 1, 2], cfg.seed, 0, ds.num_nodes)
    gathered = np.zeros(ds.num_nodes, dtype=np.int64)
    for i in range(3):
        b = data.node_batch(i, plan.batches[i], 0)
        sg_nodes = _input_nodes(data, plan.batches[i], cfg.seed, i)
        assert sg_nodes.shape[0] == b.x.shape[0]
        gathered += np.bincount(sg_nodes, minlength=ds.num_nodes)
    assert np.array_equal(counts, gathered)
    assert counts.sum() > 0
    task.close()
    ds.close()


def _input_nodes(data, seeds: np.ndarray, seed: int, i: int) -> np.ndarray:
    from ooc.kernels.rng import batch_key
    from ooc.kernels.sampling import sample_blocks
    return sample_blocks(data.graph.indptr, data.graph.indices, seeds, data.cfg.fanouts,
                         batch_key(seed, 0, i), data.cfg.replace).input_nodes


def test_bad_cache_size_is_rejected(planted_dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="parse size"):
        _cfg(planted_dataset, tmp_path, device_cache="lots").validate()
