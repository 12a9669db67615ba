"""``ooc generate rmat``: determinism, structure, planted labels a GNN can learn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ooc.kernels.rmat import scramble
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main
from ooc.ingest.generate import RmatSource, generate_rmat


def test_rmat_deterministic_for_any_chunking() -> None:
    a = RmatSource(1000, 5000, 4, 0.6, seed=3, chunk_edges=7)
    b = RmatSource(1000, 5000, 4, 0.6, seed=3, chunk_edges=5000)
    sa = np.concatenate([c.src for c in a.chunks()])
    da = np.concatenate([c.dst for c in a.chunks()])
    cb = next(b.chunks())
    assert np.array_equal(sa, cb.src) and np.array_equal(da, cb.dst)
    assert sa.min() >= 0 and sa.max() < 1000 and da.max() < 1000
    c = next(RmatSource(1000, 5000, 4, 0.6, seed=4).chunks())
    assert not np.array_equal(c.src, cb.src)


def test_scramble_is_a_bijection() -> None:
    for n in (1, 5, 1000, 1024, 1025):
        scale = max(1, (n - 1).bit_length())
        img = [scramble(v, n, scale, np.uint64(11), np.uint64(22)) for v in range(n)]
        assert sorted(img) == list(range(n))


def test_rmat_skewed_degrees_and_homophily() -> None:
    n, e = 1 << 14, 1 << 18
    c = next(RmatSource(n, e, 8, 0.6, seed=0, chunk_edges=e).chunks())
    out_deg = np.bincount(c.src, minlength=n)
    # R-MAT is heavy-tailed: the top 1% of nodes hold far more than 1% of the edges
    top = np.sort(out_deg)[::-1][: n // 100].sum() / e
    assert top > 0.1
    same = (c.src % 8 == c.dst % 8).mean()
    assert 0.6 < same < 0.7  # 0.6 planted + 0.4 * 1/8 by chance = 0.65
    plain = next(RmatSource(n, e, 8, 0.0, seed=0, chunk_edges=e).chunks())
    assert abs((plain.src % 8 == plain.dst % 8).mean() - 1 / 8) < 0.02


def test_generate_dataset_and_determinism(tmp_path: Path) -> None:
    rc = main(["generate", "rmat", "--nodes", "3000", "--edges", "20000", "--feat-dim", "8",
               "--classes", "4", "--seed", "5", "--out", str(tmp_path / "a"), "--partitions", "4",
               "--memory-budget", "300000"])
    assert rc == 0
    ds = Dataset(tmp_path / "a")
    assert ds.num_nodes == 3000 and ds.num_edges == 20000 and ds.feat_dim == 8
    assert ds.manifest["build"]["buckets"] > 1
    assert ds.check_structure() == [] and ds.verify_checksums() == []
    assert ds.labels.tolist() == [v % 4 for v in range(3000)]
    assert ds.features.read_all().dtype == np.float16
    sizes = [ds.split(s).shape[0] for s in ("train", "valid", "test")]
    assert abs(sizes[0] - 300) < 60 and abs(sizes[1] - 150) < 45 and abs(sizes[2] - 150) < 45
    b = Dataset(generate_rmat(tmp_path / "b", 3000, 20000, feat_dim=8, num_classes=4, seed=5))
    for name in ("indptr", "indices", "labels", "train", "valid", "test"):
        assert np.array_equal(ds.load(name), b.load(name)), name
    assert np.array_equal(ds.features.read_all(), b.features.read_all())


def test_gnn_learns_planted_labels(tmp_path: Path) -> None:
    from ooc.config import TrainConfig
    from ooc.training.loop import train
    p = generate_rmat(tmp_path / "g", 2000, 20000, feat_dim=16, num_classes=4, seed=0, homophily=0.7,
                      noise=3.0, splits=(0.3, 0.1, 0.2), undirected=True)
    m = train(TrainConfig(dataset=str(p), output_dir=str(tmp_path / "run"), model="sage",
                          fanouts=[5, 5], batch_size=128, epochs=4, hidden=32, lr=0.02,
                          weight_decay=0.0, partitions=2, buffer_partitions=2, progress=False,
                          seed=0))
    # features alone: the nearest centroid at noise 3.0 in 16-d gets roughly 0.6; chance is 0.25
    assert m["test_acc"] > 0.85, m["test_acc"]


@pytest.mark.slow
def test_bench_convert_smoke(tmp_path: Path) -> None:
    """Three fresh interpreters (input, streaming, NumPy): slow on a loaded machine."""
    from ooc.tools.bench import bench_convert
    rec = bench_convert(20_000, 1_000, tmp_path, "64MB", baseline=True, drop=False,
                        results=tmp_path / "r.jsonl")
    assert rec["edges"] == 20_000 and rec["nodes"] == 1_000
    for k in ("streaming", "numpy"):
        assert rec[k]["seconds"] > 0 and rec[k]["peak_rss_bytes"] > 0
    assert rec["streaming"]["buckets"] == 1
    assert (tmp_path / "r.jsonl").read_text().count("\n") == 1
    assert not list(tmp_path.glob("*.npy")) and not (tmp_path / "ds-e20000").exists()
