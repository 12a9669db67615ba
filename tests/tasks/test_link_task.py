"""Link prediction: leakage-free split, decoders, negatives, ranking metrics, training, eval, resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ooc.training.checkpoint import load_checkpoint
from ooc.config import TrainConfig
from ooc.kernels.graph import build_csc
from ooc.tasks.link import (LinkDecoder, LinkTask, candidate_ranks, link_split, metrics_from_ranks,
                            ranking_metrics, training_graph, undirected_pairs)
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main
from ooc.training.loop import Interrupted, train


def _edges_of(indptr: np.ndarray, indices: np.ndarray) -> set[tuple[int, int]]:
    dst = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return set(zip(indices.tolist(), dst.tolist()))


def test_path_graph_split_has_no_leakage() -> None:
    # undirected path 0-1-2-3-4-5 plus isolated nodes 6..9, both directions stored
    src = np.array([0, 1, 1, 2, 2, 3, 3, 4, 4, 5])
    dst = np.array([1, 0, 2, 1, 3, 2, 4, 3, 5, 4])
    ip, ix = build_csc(src, dst, 10)
    assert undirected_pairs(ip, ix).tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]
    sp = link_split(ip, ix, 0.2, 0.2, seed=42)
    assert (sp.valid.shape[0], sp.test.shape[0], sp.train.shape[0]) == (1, 1, 3)
    held = {tuple(e) for e in np.concatenate([sp.valid, sp.test]).tolist()}
    assert held.isdisjoint({tuple(e) for e in sp.train.tolist()})
    assert len(held | {tuple(e) for e in sp.train.tolist()}) == 5
    mp = _edges_of(*training_graph(sp.train, 10))
    assert len(mp) == 6  # 3 training edges, both directions
    for u, v in held:
        assert (u, v) not in mp and (v, u) not in mp
    # deterministic in the seed, different for another seed
    again = link_split(ip, ix, 0.2, 0.2, seed=42)
    assert again.valid.tolist() == sp.valid.tolist() and again.test.tolist() == sp.test.tolist()
    others = {tuple(map(tuple, link_split(ip, ix, 0.2, 0.2, seed=s).valid.tolist())) for s in range(10)}
    assert len(others) > 1


def test_task_message_passing_graph_excludes_held_out_edges(cora_dataset: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(dataset=str(cora_dataset), output_dir=str(tmp_path), task="link", val_frac=0.05,
                      test_frac=0.10, partitions=4, buffer_partitions=1, progress=False)
    cfg.validate()
    task = LinkTask(cfg, Dataset(cora_dataset))
    sp = task.split
    assert sp.train.shape[0] + sp.valid.shape[0] + sp.test.shape[0] == 5278
    assert (sp.valid.shape[0], sp.test.shape[0]) == (264, 528)
    mp = _edges_of(task.data.graph.indptr, task.data.graph.indices)
    assert len(mp) == 2 * sp.train.shape[0]
    for u, v in np.concatenate([sp.valid, sp.test]).tolist():
        assert (u, v) not in mp and (v, u) not in mp
    # evaluation candidates never include a true edge or the head itself
    pairs, tails, valid = task.candidates("test")
    assert tails.shape == (528, 1000)
    known = {tuple(e) for e in np.concatenate([sp.train, sp.valid, sp.test]).tolist()}
    for i in range(0, 528, 50):
        for w in tails[i][valid[i]].tolist():
            u = int(pairs[i, 0])
            assert (min(u, w), max(u, w)) not in known and w != u
    # drawn chunk by chunk (bounded memory): the same candidates whatever the chunk size
    chunks = list(task.candidate_chunks("test", chunk_keys=7000))  # 7 rows per chunk
    assert len(chunks) == 76
    for whole, parts in zip((pairs, tails, valid), zip(*chunks)):
        assert np.array_equal(whole, np.concatenate(parts))
    keys = pairs[:, :1] * sp.num_nodes + tails
    assert np.array_equal(valid, ~np.isin(keys, sp.all_keys()) & (tails != pairs[:, :1]))
    task.close()


def test_ranking_metrics_exact() -> None:
    pos = np.array([5.0, 1.0, 3.0])
    neg = np.array([[1.0, 2.0, 3.0, 4.0],     # rank 1
                    [2.0, 3.0, 0.0, 1.0],     # 2 higher, 1 tie -> 3.5
                    [9.0, 8.0, 0.0, 7.0]])    # 3 higher, but 9 is filtered out -> 3
    valid = np.array([[True] * 4, [True] * 4, [False, True, True, True]])
    m = ranking_metrics(pos, neg, valid, ks=(1, 3))
    assert m["mrr"] == pytest.approx((1 + 1 / 3.5 + 1 / 3) / 3)
    assert m["hits@1"] == pytest.approx(1 / 3)
    assert m["hits@3"] == pytest.approx(2 / 3)
    assert ranking_metrics(np.empty(0), np.empty((0, 4)))["mrr"] == 0.0
    # ranks of row chunks give the same metrics
    ranks = np.concatenate([candidate_ranks(pos[i:i + 2], neg[i:i + 2], valid[i:i + 2]) for i in (0, 2)])
    assert ranks.tolist() == [1.0, 3.5, 3.0]
    assert metrics_from_ranks(ranks, ks=(1, 3)) == m


def test_decoders() -> None:
    hu, hv = torch.tensor([[1.0, 2.0], [0.0, 1.0]]), torch.tensor([[3.0, 4.0], [5.0, 6.0]])
    assert LinkDecoder("dot", 2)(hu, hv).tolist() == [11.0, 6.0]
    dm = LinkDecoder("distmult", 2)
    with torch.no_grad():
        dm.rel.copy_(torch.tensor([2.0, -1.0]))
    assert dm(hu, hv).tolist() == [-2.0, -6.0]
    with pytest.raises(ValueError, match="unknown decoder"):
        LinkDecoder("mlp", 2)


def _cfg(ds: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), task="link", model="sage", fanouts=[4, 4],
                batch_size=1024, epochs=2, seed=1, partitions=8, buffer_partitions=2, progress=False,
                hidden=16, dropout=0.0, weight_decay=0.0, eval_candidates=100, eval_batch_size=512)
    base.update(kw)
    return TrainConfig(**base)


def test_link_batches_point_at_their_edges(planted_dataset: Path, tmp_path: Path) -> None:
    cfg = _cfg(planted_dataset, tmp_path, neg_ratio=3)
    cfg.validate()
    task = LinkTask(cfg, Dataset(planted_dataset))
    plan = task.plan(0)
    b = task._build(0, plan.batches[0], 0, -1, 0)
    e = task.split.train[plan.batches[0]]
    pr = b.pairs
    assert b.seeds[pr.pos_src.numpy()].tolist() == e[:, 0].tolist()
    assert b.seeds[pr.pos_dst.numpy()].tolist() == e[:, 1].tolist()
    assert pr.neg_dst.shape[0] == 3 * e.shape[0]
    assert b.seeds[pr.neg_src.numpy()].tolist() == np.repeat(e[:, 0], 3).tolist()
    again = task._build(0, plan.batches[0], 0, -1, 0)
    assert torch.equal(again.pairs.neg_dst, pr.neg_dst)  # keyed by (seed, epoch, batch)
    other = task._build(0, plan.batches[0], 1, -1, 0)
    assert not torch.equal(other.pairs.neg_dst, pr.neg_dst)
    task.close()


@pytest.mark.parametrize("decoder", ["dot", "distmult"])
def test_link_training_eval_predict(planted_dataset: Path, tmp_path: Path, decoder: str,
                                    capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    m = train(_cfg(planted_dataset, run, decoder=decoder, epochs=3, lr=0.01))
    for k in ("val_mrr", "test_mrr", "test_hits@10", "test_hits@20", "test_hits@50"):
        assert 0 <= m[k] <= 1, k
    # random ranking among ~100 candidates: MRR 0.05, Hits@10 0.1; the 4 planted communities allow
    # about 0.12 / 0.3 (the true tail competes with the ~25 candidates of its community)
    assert m["test_mrr"] > 0.075 and m["test_hits@10"] > 0.17
    assert m["history"][-1]["loss"] < m["history"][0]["loss"]
    w = load_checkpoint(run / "checkpoint.pt")["model"]
    assert ("decoder.rel" in w) == (decoder == "distmult")
    assert main(["eval", str(run), "--no-progress"]) == 0
    ev = json.loads((run / "eval.json").read_text())
    assert ev["test_mrr"] == pytest.approx(m["test_mrr"], abs=1e-6)
    assert main(["predict", str(run), "--out", str(tmp_path / "emb.npy"), "--what", "embedding",
                 "--no-progress"]) == 0
    assert np.load(tmp_path / "emb.npy").shape == (3000, 16)
    capsys.readouterr()
    assert main(["report", str(run), "--no-plots"]) == 0
    assert "sage/link" in capsys.readouterr().out


def test_link_resume_is_bit_identical(planted_dataset: Path, tmp_path: Path) -> None:
    kw = dict(model="gcn", checkpoint_every=5, batch_size=512, neg_ratio=2)
    full = train(_cfg(planted_dataset, tmp_path / "full", **kw))
    with pytest.raises(Interrupted):
        train(_cfg(planted_dataset, tmp_path / "part", **kw), stop_after_steps=full["steps"] - 3)
    resumed = train(_cfg(planted_dataset, tmp_path / "part", **kw), resume=True)
    assert resumed["losses"] == full["losses"]
    assert resumed["test_mrr"] == full["test_mrr"]
    wa = load_checkpoint(tmp_path / "full" / "checkpoint.pt")["model"]
    wb = load_checkpoint(tmp_path / "part" / "checkpoint.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
