"""Product-quantised feature rows: kernels, ``ooc compress`` (atomic), partition rewrite, and hybrid
training with ``--miss-features pq``."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import start_paused

from ooc.config import TrainConfig
from ooc.data.budget import plan_budget
from ooc.data.path import build_data_path
from ooc.kernels.pq import kmeans_subspace, subspace_bounds
from ooc.kernels.rng import batch_key
from ooc.partition import partition_dataset
from ooc.compress import MIN_GAIN, PQ_GROUP, compress_dataset, decode_gains, encode_rows, train_codebooks
from ooc.features.pq import CompressedRows, calibrated, open_compressed, pq_bytes
from ooc.storage.dataset import Dataset, DatasetError
from ooc.tools.cli import main


# ------------------------------------------------------------------------------------------ kernels
def test_subspace_bounds_exact() -> None:
    assert subspace_bounds(10, 3).tolist() == [0, 4, 7, 10]
    assert subspace_bounds(8, 8).tolist() == list(range(9))
    assert subspace_bounds(5, 1).tolist() == [0, 5]
    for bad in (0, 11):
        with pytest.raises(ValueError, match=r"\[1, 10\]"):
            subspace_bounds(10, bad)


def test_kmeans_recovers_separated_clusters() -> None:
    centres = np.array([[0, 0], [10, 0], [0, 10], [10, 10]], dtype=np.float32)
    rng = np.random.default_rng(0)
    x = np.repeat(centres, 50, axis=0)
    cent, err = kmeans_subspace(x, 4, 10, rng)
    assert err == 0.0
    assert sorted(map(tuple, cent.tolist())) == sorted(map(tuple, centres.tolist()))
    with pytest.raises(ValueError, match="at least 4 rows"):
        kmeans_subspace(x[:3], 4, 10, rng)


def _grid_rows(n: int, dim: int, m: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose every subspace takes one of ``k`` values: PQ with ``k`` centroids is lossless."""
    rng = np.random.default_rng(seed)
    bounds = subspace_bounds(dim, m)
    vals = [rng.integers(-8, 8, (k, int(bounds[j + 1] - bounds[j]))).astype(np.float32)
            for j in range(m)]
    pick = rng.integers(0, k, (n, m))
    rows = np.concatenate([vals[j][pick[:, j]] for j in range(m)], axis=1)
    return rows, bounds


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pq_round_trip_is_exact_when_rows_are_centroids(dtype: type) -> None:
    rows, bounds = _grid_rows(2000, 10, 3, 4)
    rows = rows.astype(dtype)
    cent, b, err = train_codebooks(rows, 3, centroids=4, iters=10, seed=1)
    assert b.tolist() == bounds.tolist() == [0, 4, 7, 10]
    assert cent.shape == (3, 4, 4)  # dmax 4; the 3-wide subspaces are zero-padded
    assert np.all(cent[1:, :, 3] == 0)
    assert err == pytest.approx(0.0, abs=1e-12)
    codes = encode_rows(rows, cent, b)
    assert codes.dtype == np.uint8 and codes.shape == (2000, 3)
    dec = CompressedRows(codes, cent, b, np.dtype(dtype), 10)
    ids = np.array([5, 0, 1999, 5, 17])
    got, nbytes = dec.gather(ids)
    assert nbytes == 0 and got.dtype == dtype
    np.testing.assert_array_equal(got, rows[ids])
    assert dec.rows_decoded == 5


def test_pq_codes_are_nearest_centroids() -> None:
    """Random rows: every code is the argmin of the squared distance in its subspace."""
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (500, 12)).astype(np.float32)
    cent, b, err = train_codebooks(x, 4, centroids=16, iters=8, seed=0)
    assert 0 < err < 1
    codes = encode_rows(x, cent, b)
    for m in range(4):
        sub = x[:, b[m]:b[m + 1]]
        c = cent[m, :, :b[m + 1] - b[m]]
        d = ((sub[:, None, :] - c[None]) ** 2).sum(2)
        np.testing.assert_allclose(d[np.arange(500), codes[:, m]], d.min(1), rtol=1e-4, atol=1e-5)


def test_calibrated_decoding_keeps_a_small_class_shift() -> None:
    """Rows = unit Gaussian noise +- a class shift 0.1: the plain decoding keeps g ~ 1 - the relative
    error of the shift; divided by the gain it keeps the whole shift (to sampling noise)."""
    rng = np.random.default_rng(0)
    n, d = 40_000, 12
    y = rng.integers(0, 2, n)
    x = (rng.normal(0, 1, (n, d)) + np.where(y[:, None] == 1, 0.1, -0.1)).astype(np.float32)
    cent, b, err = train_codebooks(x, 3, centroids=16, iters=12, seed=0)
    means, gains = decode_gains(x, cent, b)
    assert means.shape == (12,) and gains.shape == (3,)
    codes = encode_rows(x, cent, b)
    plain = CompressedRows(codes, cent, b, np.dtype(np.float32), d).gather(np.arange(n))[0]
    for m in range(3):  # the slope of the decoding is 1 - its relative error about the mean
        sl = slice(int(b[m]), int(b[m + 1]))
        rel = ((x[:, sl] - plain[:, sl]) ** 2).sum() / ((x[:, sl] - means[sl]) ** 2).sum()
        assert gains[m] == pytest.approx(1 - rel, abs=0.02)
    assert 0.5 < gains.min() and gains.max() < 0.9
    cal = CompressedRows(codes, calibrated(cent, b, means, gains), b, np.dtype(np.float32),
                         d).gather(np.arange(n))[0]

    def shift(a: np.ndarray) -> float:
        return float((a[y == 1].mean(0) - a[y == 0].mean(0)).mean())
    exact = shift(x)
    assert exact == pytest.approx(0.2, abs=0.02)
    assert shift(plain) / exact == pytest.approx(float(gains.mean()), abs=0.06)
    assert shift(cal) / exact == pytest.approx(1.0, abs=0.06)


def test_calibration_of_lossless_or_constant_subspaces_is_the_identity() -> None:
    rows, _ = _grid_rows(2000, 10, 3, 4)
    rows[:, 7:] = 2.5  # the last subspace constant
    cent, b, _ = train_codebooks(rows, 3, centroids=4, iters=10, seed=1)
    means, gains = decode_gains(rows, cent, b)
    np.testing.assert_allclose(gains, 1.0, atol=1e-5)
    np.testing.assert_allclose(calibrated(cent, b, means, gains), cent, atol=1e-4)
    # a gain below the floor boosts by 1 / MIN_GAIN only
    low = calibrated(cent, b, means, np.array([0.01, 1.0, 1.0], np.float32))
    np.testing.assert_allclose(low[0, :, :4], means[:4] + (cent[0, :, :4] - means[:4]) / MIN_GAIN,
                               rtol=1e-5)
    with pytest.raises(DatasetError, match="rerun ooc compress"):
        calibrated(cent, b, means[:5], gains)
    with pytest.raises(DatasetError, match="not finite"):
        calibrated(cent, b, means, np.array([np.nan, 1, 1], np.float32))


def test_train_codebooks_rejects_bad_sizes() -> None:
    x = np.zeros((100, 8), np.float32)
    with pytest.raises(ValueError, match="centroids"):
        train_codebooks(x, 2, centroids=300)
    with pytest.raises(ValueError, match="subspaces"):
        train_codebooks(x, 9, centroids=4)


# ------------------------------------------------------------------------------------------ storage
@pytest.fixture()
def planted_copy(planted_dataset: Path, tmp_path: Path) -> Path:
    out = tmp_path / "planted"
    shutil.copytree(planted_dataset, out)
    return out


def test_compress_writes_codes_that_verify(planted_copy: Path) -> None:
    info = compress_dataset(planted_copy, 4, centroids=16, sample_rows=1000, iters=5, progress=False)
    assert info["bytes_per_node"] == 4 and info["centroids"] == 16 and info["sample_rows"] == 1000
    ds = Dataset(planted_copy)
    assert ds.manifest["pq"]["subspaces"] == 4
    assert ds.verify_checksums() == [] and ds.check_structure() == []
    codes = ds.raw(f"{PQ_GROUP}/codes").read_all()
    cent = ds.raw(f"{PQ_GROUP}/centroids").read_all()
    bounds = ds.raw(f"{PQ_GROUP}/bounds").read_all()
    assert codes.shape == (3000, 4) and cent.shape == (4, 16, 4) and bounds.tolist() == [0, 4, 8, 12, 16]
    np.testing.assert_array_equal(codes, encode_rows(ds.features.read_all(), cent, bounds))
    assert pq_bytes(ds) == codes.nbytes + cent.nbytes
    rows = open_compressed(ds)
    assert rows.gather(np.array([0, 2999]))[0].dtype == ds.features.dtype
    # decoding uses the centroids scaled by the gains measured at compression
    want = calibrated(cent, bounds, ds.raw(f"{PQ_GROUP}/means").read_all(),
                      ds.raw(f"{PQ_GROUP}/gains").read_all())
    np.testing.assert_array_equal(rows.centroids, want.astype(ds.features.dtype))
    assert 0 < info["mean_gain"] <= 1
    ds.close()
    with pytest.raises(FileExistsError, match="--overwrite"):
        compress_dataset(planted_copy, 8, centroids=16, sample_rows=1000, progress=False)
    compress_dataset(planted_copy, 8, centroids=16, sample_rows=1000, iters=3, overwrite=True,
                     progress=False)
    ds = Dataset(planted_copy)
    assert ds.raw(f"{PQ_GROUP}/codes").shape == (3000, 8) and ds.manifest["pq"]["subspaces"] == 8
    assert ds.verify_checksums() == []
    assert not list((planted_copy / "arrays.zarr" / "nodes").glob(".pq.*"))


def test_compress_cli_errors_write_nothing(planted_copy: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["compress", str(planted_copy), "--subspaces", "17", "--no-progress"]) == 2
    assert "[1, 16]" in capsys.readouterr().err
    for k in ("0", "1"):
        assert main(["compress", str(planted_copy), "--subspaces", "4", "--centroids", k,
                     "--no-progress"]) == 2
        assert "--centroids must be in [2, 256]" in capsys.readouterr().err
    ds = Dataset(planted_copy)
    assert "pq" not in ds.manifest and not ds.has(f"{PQ_GROUP}/codes")
    assert not list((planted_copy / "arrays.zarr" / "nodes").glob(".pq.*"))
    assert main(["compress", str(planted_copy.parent / "nope"), "--no-progress"]) == 2


def test_sigkill_during_compress_keeps_the_dataset_valid(planted_copy: Path, tmp_path: Path) -> None:
    compress_dataset(planted_copy, 4, centroids=16, sample_rows=1000, iters=3, progress=False)
    marker = tmp_path / "paused"
    env = dict(os.environ, OOC_FAULT_PAUSE=f"group-before-rename:60:{marker}")
    proc = start_paused(["compress", str(planted_copy), "--subspaces", "8", "--centroids", "16",
                         "--sample-rows", "1000", "--overwrite", "--no-progress"], env, marker)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ds = Dataset(planted_copy)  # the old codes were dropped first; the new ones never recorded
    assert not ds.has(f"{PQ_GROUP}/codes") and "pq" not in ds.manifest
    assert ds.verify_checksums() == [] and ds.check_structure() == []
    ds.close()
    assert main(["compress", str(planted_copy), "--subspaces", "8", "--centroids", "16",
                 "--sample-rows", "1000", "--no-progress"]) == 0
    ds = Dataset(planted_copy)
    assert ds.raw(f"{PQ_GROUP}/codes").shape == (3000, 8) and ds.verify_checksums() == []
    assert not list((planted_copy / "arrays.zarr" / "nodes").glob(".pq.*"))


def test_partition_keeps_codes_permuted_with_rows(planted_copy: Path) -> None:
    compress_dataset(planted_copy, 4, centroids=16, sample_rows=1000, iters=3, progress=False)
    before = Dataset(planted_copy)
    old_codes = before.raw(f"{PQ_GROUP}/codes").read_all()
    old_cent = before.raw(f"{PQ_GROUP}/centroids").read_all()
    old_gains = before.raw(f"{PQ_GROUP}/gains").read_all()
    assert old_gains.shape == (4,) and before.raw(f"{PQ_GROUP}/means").shape == (16,)
    before.close()
    out, _ = partition_dataset(planted_copy, 3, "random", seed=2)
    ds = Dataset(out)
    perm = ds.load("nodes/perm")
    np.testing.assert_array_equal(ds.raw(f"{PQ_GROUP}/codes").read_all(), old_codes[perm])
    np.testing.assert_array_equal(ds.raw(f"{PQ_GROUP}/centroids").read_all(), old_cent)
    np.testing.assert_array_equal(ds.raw(f"{PQ_GROUP}/gains").read_all(), old_gains)
    assert ds.manifest["pq"]["subspaces"] == 4 and ds.verify_checksums() == []


# ------------------------------------------------------------------------------------------ training
def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[5, 5], batch_size=64,
                epochs=1, seed=3, partitions=8, buffer_partitions=2, progress=False, mode="hybrid",
                miss_features="pq")
    base.update(kw)
    return TrainConfig(**base)


def test_pq_batches_decode_only_outer_hop_misses(planted_copy: Path, tmp_path: Path) -> None:
    compress_dataset(planted_copy, 4, centroids=16, sample_rows=1000, iters=3, progress=False)
    ds = Dataset(planted_copy)
    feats = ds.features.read_all()
    dp = build_data_path(_cfg(planted_copy, tmp_path / "r"), ds)
    try:
        codes = open_compressed(ds)
        plan = dp.plan_nodes(ds.split("train"), dp.cfg.batch_size, 0)
        approx_seen = 0
        for b in dp.iterate(plan, 0):
            # recompute the batch's input nodes with the same key to compare row by row
            sg = dp.sampler.sample(plan.batches[b.index], batch_key(3, 0, b.index))
            sg_nodes = sg.input_nodes
            x = b.x.numpy()
            inner = sg.blocks[0].num_dst
            np.testing.assert_array_equal(x[:inner], feats[sg_nodes[:inner]])  # seeds + hop 1 exact
            outer = sg_nodes[inner:]
            exact = (x[inner:] == feats[outer]).all(1)
            decoded = (x[inner:] == codes.gather(outer)[0]).all(1)
            assert (exact | decoded).all()  # every outer row: exact or its decoded code
            part = np.searchsorted(dp.offsets, outer, side="right") - 1
            in_state = np.isin(part, plan.states[plan.batch_state[b.index]])
            assert exact[in_state].all()  # the state's partitions are resident: exact rows
            assert decoded[~in_state].all()  # the others decoded: never a prefetched slot's row
            approx_seen += int((decoded & ~exact).sum())
            if b.index >= 3:
                break
        assert approx_seen > 0
        assert dp.misses.approx_rows >= approx_seen
        # evaluation batches (no buffer state) stay exact
        nodes = ds.split("test")[:50]
        full = dp.eval_sampler([-1, -1])
        eb = dp.eval_batch(0, nodes, full)
        sg = full.sample(nodes, batch_key(3, -1, 0))
        np.testing.assert_array_equal(eb.x.numpy(), feats[sg.input_nodes])
    finally:
        dp.close()
        ds.close()


def test_a_resumed_hybrid_pq_run_with_a_row_cache_is_bit_identical(planted_copy: Path,
                                                                   tmp_path: Path) -> None:
    """With PQ codes and a CPU row cache, an outer-hop row the cache held was served exact and
    one it did not was decoded: a resumed run (its cache empty) then trained other rows and its
    losses parted from the uninterrupted run's.  Outer-hop rows are always decoded now: the
    resumed run ends with the same losses, and the cache still serves the inner rows."""
    from ooc.training.loop import Interrupted, train
    compress_dataset(planted_copy, 4, centroids=16, sample_rows=1000, iters=3, progress=False)
    kw = dict(epochs=2, cache_size="150kB", checkpoint_every=4, hidden=16)
    full = train(_cfg(planted_copy, tmp_path / "full", **kw))
    with pytest.raises(Interrupted):
        train(_cfg(planted_copy, tmp_path / "part", **kw), stop_after_steps=full["steps"] // 2 + 1)
    resumed = train(_cfg(planted_copy, tmp_path / "part", **kw), resume=True)
    assert resumed["losses"] == full["losses"]
    assert full["cache_hits"] > 0 and full["approx_rows"] > 0


def test_pq_budget_counts_codes(planted_copy: Path) -> None:
    compress_dataset(planted_copy, 8, centroids=16, sample_rows=1000, iters=3, progress=False)
    ds = Dataset(planted_copy)
    off = ds.partition_offsets
    args = dict(mode="hybrid", budget=2_000_000, ds=ds, offsets=off, topology="memory",
                batch_size=64, fanouts=[5, 5], prefetch=1, hidden=16, buffer_partitions=2,
                cache_size=None, cache_policy="none", ordering="sequential", eval_batch_size=64,
                eval_fanouts=[5, 5])
    plain = plan_budget(**args)
    need = pq_bytes(ds)
    assert need == 3000 * 8 + 8 * 16 * 2 * 4
    pq = plan_budget(**args, compressed=need)
    assert pq.compressed == need and pq.planned <= 2_000_000
    assert pq.slots == min(plain.num_parts, (2_000_000 - (plain.planned - plain.slot * plain.slots)
                                              - need) // plain.slot)
    ds.close()


def test_pq_option_errors(planted_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hybrid only"):
        _cfg(planted_copy, tmp_path / "a", mode="exact").validate()
    ds = Dataset(planted_copy)
    with pytest.raises(DatasetError, match="ooc compress"):
        build_data_path(_cfg(planted_copy, tmp_path / "b"), ds)
    ds.close()


def test_hybrid_pq_trains_close_to_disk_misses(planted_copy: Path, tmp_path: Path) -> None:
    """The planted graph (4 classes, 16-d features) in hybrid mode with 2 of 8 partitions resident:
    decoding the outer hop's misses from 8-byte codes keeps accuracy within 3 points."""
    from ooc.training.loop import train
    compress_dataset(planted_copy, 8, centroids=64, sample_rows=3000, iters=10, progress=False)
    accs = {}
    for mf in ("disk", "pq"):
        m = train(_cfg(planted_copy, tmp_path / mf, miss_features=mf, epochs=4))
        accs[mf] = m["test_acc"]
        h = m["history"][-1]
        assert (h["approx_rows"] > 0) == (mf == "pq")
        assert m["approx_rows"] == sum(x["approx_rows"] for x in m["history"])
        assert m["miss_features"] == mf
    assert accs["disk"] > 0.8
    assert accs["pq"] > accs["disk"] - 0.03


def test_bench_modes_accept_hybrid_pq() -> None:
    from ooc.tools.bench_ooc import check_modes
    check_modes(["hybrid", "hybrid-pq", "hybrid-pq:0.1", "hybrid:0.5", "buffer", "exact"])
    for bad, msg in (("hybrid-zip", "use exact"), ("buffer:0.1", "use exact"),
                     ("hybrid-pq:1.5", r"\[0, 1\)"), ("hybrid:x", r"\[0, 1\)")):
        with pytest.raises(ValueError, match=msg):
            check_modes([bad])
    assert main(["bench", "ooc", "--modes", "hybrid,zip", "--skip-planetoid"]) == 2


def test_compress_refuses_before_any_work(planted_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Existing codes without --overwrite, too small a sample, no iterations, K > 256: refused
    before the codebooks are learnt (the check used to come after them)."""
    import ooc.compress as pqmod
    compress_dataset(planted_copy, 4, centroids=16, sample_rows=1000, iters=2, progress=False)

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("codebooks learnt before the refusal")
    monkeypatch.setattr(pqmod, "train_codebooks", boom)
    with pytest.raises(FileExistsError, match="--overwrite"):
        compress_dataset(planted_copy, 4, centroids=16, progress=False)
    for kw, msg in ((dict(sample_rows=15), "smaller than the 16 centroids"),
                    (dict(iters=0), "--iters"), (dict(centroids=257), r"\[2, 256\]"),
                    (dict(centroids=1), r"--centroids must be in \[2, 256\]"),
                    (dict(subspaces=17), r"--subspaces must be in \[1, 16\]")):
        args = dict(subspaces=4, centroids=16, sample_rows=1000, overwrite=True, progress=False)
        args.update(kw)
        with pytest.raises(ValueError, match=msg):
            compress_dataset(planted_copy, **args)


def test_compress_refuses_features_beyond_float32_distances(tmp_path: Path) -> None:
    from ooc.ingest.convert import write_graph_dataset
    x = np.ones((300, 4), np.float32)
    x[123, 2] = 1e30
    p = write_graph_dataset(tmp_path / "big", 300, np.arange(299), np.arange(1, 300), x,
                            np.zeros(300, np.int64), {"train": np.arange(10)}, 1, "big")
    with pytest.raises(ValueError, match="1e\\+30 at node 123, column 2"):
        compress_dataset(p, 2, centroids=4, sample_rows=300, progress=False)
    with pytest.raises(ValueError, match="1e\\+30 at node 123, column 2"):  # not in the sample
        compress_dataset(p, 2, centroids=4, sample_rows=4, seed=5, progress=False)
    ds = Dataset(p)
    assert "pq" not in ds.manifest and ds.verify_checksums() == []


def test_codes_beyond_the_codebook_are_refused(planted_copy: Path) -> None:
    compress_dataset(planted_copy, 4, centroids=16, sample_rows=1000, iters=2, progress=False)
    ds = Dataset(planted_copy)
    chunk = ds.raw(f"{PQ_GROUP}/codes").chunk_path(0)
    with open(chunk, "r+b") as f:  # on-disk damage: a code of 255 with K = 16
        f.write(bytes([255]))
    with pytest.raises(DatasetError, match="16 centroids"):
        open_compressed(ds)
    ds.close()


def test_pq_codes_not_loaded_when_everything_is_resident(planted_copy: Path, tmp_path: Path) -> None:
    compress_dataset(planted_copy, 4, centroids=16, sample_rows=1000, iters=2, progress=False)
    ds = Dataset(planted_copy)
    dp = build_data_path(_cfg(planted_copy, tmp_path / "r", buffer_partitions=8), ds)
    try:
        assert dp.pq is None and dp.budget.compressed == 0
        assert dp.budget.slots == 8
    finally:
        dp.close()
        ds.close()
