"""Link prediction: edge split without leakage, negative sampling, decoders, ranking metrics.

- :func:`link_split` splits the graph's *undirected* edges (pairs ``u < v``) into train / validation /
  test.  Messages flow only over the training edges (both directions, :func:`training_graph`), so
  neither direction of a held-out edge is ever seen by the encoder -- in training or in evaluation.
- Training (:class:`LinkTask`): batches of training edges in partition order (by the partition of
  the first endpoint, so the buffer keeps its locality), ``neg_ratio`` uniform negatives per positive
  (the positive's head with a uniform random tail), drawn from a generator keyed by (seed, epoch,
  batch) so resume stays bit-exact; the encoder runs once on the union of the batch's endpoints;
  loss = BCE(positives -> 1) + BCE(negatives -> 0).
- Decoders (:class:`LinkDecoder`): dot product ``<h_u, h_v>`` and DistMult ``<h_u, r * h_v>`` with a
  learnable diagonal relation ``r`` (Yang et al., ICLR'15).
- Evaluation: exact layer-wise inference (:mod:`ooc.training.inference`) gives every node's embedding on the
  training graph; each held-out edge ``(u, v)`` is ranked against ``eval_candidates`` random tails
  ``(u, w)`` (fixed by ``split_seed``; candidates that are true edges of any split are filtered out,
  the "filtered" setting of knowledge-graph evaluation).  ``rank = 1 + #{w: s(u,w) > s(u,v)}
  + #{ties} / 2``; MRR = mean(1 / rank), Hits@K = mean(rank <= K) (as OGB's ``ogbl-citation2``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import Tensor, nn

from ooc.config import TrainConfig
from ooc.kernels.graph import build_csc
from ooc.loader import Batch, BatchLoader, EpochPlan, plan_epoch
from ooc.models import GNN
from ooc.storage.dataset import Dataset

__all__ = ["LinkSplit", "undirected_pairs", "link_split", "training_graph", "LinkDecoder",
           "ranking_metrics", "LinkBatch", "LinkBatchLoader", "LinkTask"]

log = logging.getLogger("ooc.linkpred")


def undirected_pairs(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """int64 [M, 2] unique undirected edges ``(u, v)``, ``u < v``, sorted; self-loops dropped.

    Args:
        indptr, indices: CSC topology (``indices[indptr[v]:indptr[v+1]]`` are ``v``'s in-neighbours);
            an edge present in one direction only counts once.
    """
    n = indptr.shape[0] - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    src = np.asarray(indices, dtype=np.int64)
    u, v = np.minimum(src, dst), np.maximum(src, dst)
    keep = u != v
    key = np.unique(u[keep] * n + v[keep])
    return np.stack([key // n, key % n], 1) if n else np.empty((0, 2), dtype=np.int64)


@dataclass
class LinkSplit:
    """Undirected edges ``[M, 2]`` (``u < v``) of each part; ``num_nodes`` N."""

    num_nodes: int
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray

    def all_keys(self) -> np.ndarray:
        """Sorted int64 keys ``u * N + v`` of every edge of every split, both directions."""
        e = np.concatenate([self.train, self.valid, self.test])
        n = self.num_nodes
        return np.unique(np.concatenate([e[:, 0] * n + e[:, 1], e[:, 1] * n + e[:, 0]]))


def link_split(indptr: np.ndarray, indices: np.ndarray, val_frac: float, test_frac: float,
               seed: int) -> LinkSplit:
    """Random split of the undirected edges: ``round(val_frac * M)`` for validation,
    ``round(test_frac * M)`` for test, the rest for training (and message passing).

    Deterministic in (graph, fractions, seed).

    Raises:
        ValueError: fractions outside [0, 1) or summing to 1 or more.
    """
    if not (0 <= val_frac < 1 and 0 <= test_frac < 1 and val_frac + test_frac < 1):
        raise ValueError(f"val_frac {val_frac} + test_frac {test_frac} must be in [0, 1)")
    pairs = undirected_pairs(indptr, indices)
    m = pairs.shape[0]
    n_val, n_test = int(round(val_frac * m)), int(round(test_frac * m))
    perm = np.random.default_rng([seed, 0x11A4]).permutation(m)
    val = np.sort(perm[:n_val])
    test = np.sort(perm[n_val:n_val + n_test])
    train = np.sort(perm[n_val + n_test:])
    return LinkSplit(indptr.shape[0] - 1, pairs[train], pairs[val], pairs[test])


def training_graph(train: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """CSC ``(indptr, indices)`` of the training edges in both directions (the message-passing graph)."""
    src = np.concatenate([train[:, 0], train[:, 1]])
    dst = np.concatenate([train[:, 1], train[:, 0]])
    return build_csc(src, dst, num_nodes, dedup=True)


class LinkDecoder(nn.Module):
    """Edge scores from node embeddings.

    Args:
        kind: ``dot`` (``<h_u, h_v>``) or ``distmult`` (``<h_u, r * h_v>``, learnable ``r`` [dim]
            initialised to ones; Yang et al., "Embedding Entities and Relations for Learning and
            Inference in Knowledge Bases", ICLR'15).
        dim: embedding size.

    Shapes:
        forward(h_u [E, dim], h_v [E, dim]) -> [E] float32 logits.
    """

    def __init__(self, kind: str, dim: int) -> None:
        super().__init__()
        if kind not in ("dot", "distmult"):
            raise ValueError(f"unknown decoder {kind!r} (choose dot or distmult)")
        self.kind = kind
        self.rel = nn.Parameter(torch.ones(dim)) if kind == "distmult" else None

    def forward(self, h_u: Tensor, h_v: Tensor) -> Tensor:
        if self.rel is not None:
            h_v = h_v * self.rel
        return (h_u * h_v).sum(-1)


def ranking_metrics(pos: np.ndarray, neg: np.ndarray, valid: np.ndarray | None = None,
                    ks: tuple[int, ...] = (10, 20, 50)) -> dict:
    """MRR and Hits@K of each positive ranked among its candidates.

    Args:
        pos: float [M] score of each positive.
        neg: float [M, C] scores of its candidates.
        valid: bool [M, C] candidates that count (filtered setting); default all.
        ks: the K of Hits@K.

    Returns:
        ``{"mrr": float, "hits@K": float, ...}`` (0.0 for each when ``M == 0``); the rank of a positive is
        ``1 + #(neg > pos) + #(neg == pos) / 2`` over its valid candidates.
    """
    if pos.shape[0] == 0:
        return {"mrr": 0.0, **{f"hits@{k}": 0.0 for k in ks}}
    if valid is None:
        valid = np.ones(neg.shape, dtype=bool)
    higher = ((neg > pos[:, None]) & valid).sum(1)
    ties = ((neg == pos[:, None]) & valid).sum(1)
    rank = 1.0 + higher + 0.5 * ties
    out = {"mrr": float((1.0 / rank).mean())}
    for k in ks:
        out[f"hits@{k}"] = float((rank <= k).mean())
    return out


@dataclass
class LinkBatch(Batch):
    """A :class:`~ooc.loader.Batch` of training edges.

    The model's output rows are the batch's unique endpoints (``seeds``); ``pos_*`` / ``neg_*`` are
    int64 local row indices of the positive edges [B] and the negatives [B * neg_ratio].
    """

    pos_src: Tensor = None  # type: ignore[assignment]
    pos_dst: Tensor = None  # type: ignore[assignment]
    neg_src: Tensor = None  # type: ignore[assignment]
    neg_dst: Tensor = None  # type: ignore[assignment]


class LinkBatchLoader(BatchLoader):
    """A :class:`~ooc.loader.BatchLoader` whose plan batches are training-edge ids.

    Args:
        pairs: int64 [M, 2] training edges; neg_ratio: negatives per positive; num_nodes: N.
        (other arguments as :class:`~ooc.loader.BatchLoader`.)
    """

    def __init__(self, *args: object, pairs: np.ndarray, neg_ratio: int, num_nodes: int,
                 **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.pairs = pairs
        self.neg_ratio = neg_ratio
        self.num_nodes = num_nodes

    def make_batch(self, index: int, seeds: np.ndarray, epoch: int, fanouts: list[int] | None = None,
                   parts: list[int] | None = None, upcoming: list[int] | None = None) -> Batch:
        if epoch < 0:  # evaluation batches are node batches
            return super().make_batch(index, seeds, epoch, fanouts, parts, upcoming)
        e = self.pairs[seeds]
        b = e.shape[0]
        rng = np.random.default_rng([self.seed, epoch, index, 0x4E6])
        neg_tail = rng.integers(0, self.num_nodes, size=b * self.neg_ratio, dtype=np.int64)
        nodes = np.concatenate([e[:, 0], e[:, 1], neg_tail])
        uniq, inv = np.unique(nodes, return_inverse=True)
        base = super().make_batch(index, uniq, epoch, fanouts, parts, upcoming)
        inv_t = torch.from_numpy(inv.astype(np.int64))
        return LinkBatch(base.index, base.seeds, base.blocks, base.x, base.y, base.num_edges,
                         base.sample_s, base.gather_s, pos_src=inv_t[:b], pos_dst=inv_t[b:2 * b],
                         neg_src=inv_t[:b].repeat_interleave(self.neg_ratio), neg_dst=inv_t[2 * b:])


class LinkTask:
    """Link prediction on the dataset's undirected edges (see the module docstring).

    ``out_dim`` is ``cfg.hidden``: the encoder's last layer outputs the embedding.
    """

    name = "link"
    select = "val_mrr"
    test_key = "test_mrr"
    metric = "mrr"

    def __init__(self, cfg: TrainConfig, ds: Dataset) -> None:
        from ooc.train import build_data_path
        self.cfg, self.ds = cfg, ds
        n = ds.num_nodes
        self.split = link_split(ds.indptr, ds.indices, cfg.val_frac, cfg.test_frac, cfg.split_seed)
        if self.split.train.shape[0] == 0:
            raise ValueError(f"{cfg.dataset}: no training edges for link prediction")
        topo = training_graph(self.split.train, n)
        self.data = build_data_path(cfg, ds, topology=topo, loader_cls=LinkBatchLoader,
                                    pairs=self.split.train, neg_ratio=cfg.neg_ratio, num_nodes=n)
        self.part_of_train = self.data.buffer.part_of(self.split.train[:, 0])
        self.edge_ids = np.arange(self.split.train.shape[0], dtype=np.int64)
        self.out_dim = cfg.hidden
        self.loss_fn = nn.BCEWithLogitsLoss()
        log.info("link split (seed %d): %d train / %d valid / %d test undirected edges", cfg.split_seed,
                 self.split.train.shape[0], self.split.valid.shape[0], self.split.test.shape[0])

    def prepare_model(self, model: GNN) -> None:
        """Attach the decoder (its parameters train, checkpoint and load with the encoder)."""
        model.decoder = LinkDecoder(self.cfg.decoder, self.out_dim)

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.edge_ids.shape[0] // self.cfg.batch_size)

    def plan(self, epoch: int) -> EpochPlan:
        return plan_epoch(self.edge_ids, self.part_of_train, self.data.buffer.num_parts,
                          self.cfg.batch_size, self.cfg.seed, epoch)

    def batches(self, plan: EpochPlan, epoch: int, start: int) -> Iterator[Batch]:
        return self.data.loader.iterate(plan, epoch, start=start)

    def loss(self, model: GNN, batch: LinkBatch, device: torch.device) -> tuple[Tensor, dict]:
        from ooc.train import _to_device
        blocks, x = _to_device(batch, device)
        h = model(blocks, x).float()
        dec = model.decoder
        pos = dec(h.index_select(0, batch.pos_src.to(device)), h.index_select(0, batch.pos_dst.to(device)))
        neg = dec(h.index_select(0, batch.neg_src.to(device)), h.index_select(0, batch.neg_dst.to(device)))
        loss = self.loss_fn(pos, torch.ones_like(pos)) + self.loss_fn(neg, torch.zeros_like(neg))
        correct = int((pos.detach() > 0).sum()) + int((neg.detach() <= 0).sum())
        return loss, {"seen": int(pos.shape[0]), "correct": correct, "total": pos.shape[0] + neg.shape[0],
                      "edges": batch.num_edges, "sample_s": batch.sample_s, "gather_s": batch.gather_s}

    def train_score(self, acc: dict) -> float:
        """Share of training positives and negatives on the right side of 0."""
        return acc["correct"] / max(acc["seen"] * (1 + self.cfg.neg_ratio), 1)

    def candidates(self, part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(pairs [M,2], tails [M,C], valid [M,C])`` of a held-out part, fixed by ``split_seed``."""
        pairs = self.split.valid if part == "valid" else self.split.test
        c = self.cfg.eval_candidates
        rng = np.random.default_rng([self.cfg.split_seed, 0xCA4D, 1 if part == "valid" else 2])
        tails = rng.integers(0, self.split.num_nodes, size=(pairs.shape[0], c), dtype=np.int64)
        keys = pairs[:, :1] * self.split.num_nodes + tails
        known = self.split.all_keys()
        valid = ~np.isin(keys, known) & (tails != pairs[:, :1])
        return pairs, tails, valid

    @torch.no_grad()
    def evaluate(self, model: GNN, device: torch.device, out_dir: str | Path | None = None) -> dict:
        """Validation and test MRR / Hits@K from one layer-wise inference pass over all nodes."""
        from ooc.training.inference import IN_MEMORY_LIMIT, layerwise_inference
        L = model.num_layers
        if out_dir is None and self.ds.num_nodes * max(model.dims[1:]) * 4 > IN_MEMORY_LIMIT:
            out_dir = Path(self.cfg.output_dir) / "inference"
        emb = layerwise_inference(model, self.data, self.cfg.eval_batch_size, out_dir, device,
                                  keep=(L - 1,))[L - 1]
        dec = model.decoder.cpu() if device.type != "cpu" else model.decoder
        n = self.split.num_nodes
        # in memory: score each chunk of heads against all nodes with one matmul and pick the
        # candidates; on disk: gather the candidates' rows
        full = torch.from_numpy(emb.array) if isinstance(emb.array, np.ndarray) else None
        res: dict = {}
        for part, prefix in (("valid", "val"), ("test", "test")):
            pairs, tails, valid = self.candidates(part)
            pos_l, neg_l = [], []
            step = max(1, min(1024, (1 << 24) // max(n, 1))) if full is not None else 256
            for s in range(0, pairs.shape[0], step):
                hu = torch.from_numpy(emb.gather(pairs[s:s + step, 0]))
                hv = torch.from_numpy(emb.gather(pairs[s:s + step, 1]))
                t = tails[s:s + step]
                pos_l.append(dec(hu, hv).numpy())
                if full is not None:
                    q = hu * dec.rel if dec.rel is not None else hu
                    neg_l.append((q @ full.T).gather(1, torch.from_numpy(t)).numpy())
                else:
                    ht = torch.from_numpy(emb.gather(t.reshape(-1))).view(t.shape[0], t.shape[1], -1)
                    neg_l.append(dec(hu.unsqueeze(1), ht).numpy())
            pos = np.concatenate(pos_l) if pos_l else np.empty(0, dtype=np.float32)
            neg = np.concatenate(neg_l) if neg_l else np.empty((0, tails.shape[1]), dtype=np.float32)
            for k, v in ranking_metrics(pos, neg, valid, tuple(self.cfg.hits_k)).items():
                res[f"{prefix}_{k}"] = v
        if device.type != "cpu":
            model.decoder.to(device)
        emb.close()
        return res

    def close(self) -> None:
        self.data.close()
