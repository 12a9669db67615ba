"""Link prediction: edge split without leakage, negative sampling, decoders, ranking metrics.

- :func:`link_split` splits the graph's *undirected* edges (pairs ``u < v``) into train / validation /
  test.  Messages flow only over the training edges (both directions, :func:`training_graph`), so
  neither direction of a held-out edge is ever seen by the encoder -- in training or in evaluation.
- Training (:class:`LinkTask`), on the data path of every mode: batches of training edges -- a
  uniform shuffle (``exact``), or edge-bucket states (``buffer`` / ``hybrid``: BETA orderings, every
  bucket ``(i, j)`` trained once per epoch with both partitions resident); ``neg_ratio`` uniform
  negatives per positive (the positive's head with a uniform random tail; in ``buffer`` mode a tail
  of the resident partitions), drawn from a generator keyed by (seed, epoch, batch) so resume stays
  bit-exact; the encoder runs once on the union of the batch's endpoints, over MFGs sampled with the
  batch's positive edges (both directions) removed, so the model cannot read the answer from its
  input; loss = BCE(positives -> 1) + BCE(negatives -> 0).  Data-parallel as the node task: sharded
  plans, weighted losses, reduced sums.
- Decoders (:class:`LinkDecoder`): dot product ``<h_u, h_v>`` and DistMult ``<h_u, r * h_v>`` with a
  learnable diagonal relation ``r`` (Yang et al., ICLR'15).
- Evaluation: exact layer-wise inference (:mod:`ooc.inference`) gives every node's embedding on the
  training graph; each held-out edge ``(u, v)`` is ranked against ``eval_candidates`` random tails
  ``(u, w)`` (fixed by ``split_seed``; candidates that are true edges of any split are filtered out,
  the "filtered" setting of knowledge-graph evaluation).  ``rank = 1 + #{w: s(u,w) > s(u,v)}
  + #{ties} / 2``; MRR = mean(1 / rank), Hits@K = mean(rank <= K) (as OGB's ``ogbl-citation2``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import Tensor, nn

from ooc.config import TrainConfig
from ooc.contracts import Batch, Job, Plan, SingleProcess
from ooc.data.budget import RssMonitor
from ooc.data.path import build_data_path
from ooc.data.plan import shard_plan
from ooc.kernels.graph import build_csc
from ooc.models import GNN, takes_half
from ooc.storage.dataset import Dataset

__all__ = ["LinkSplit", "undirected_pairs", "link_split", "training_graph", "LinkDecoder",
           "candidate_ranks", "metrics_from_ranks", "ranking_metrics", "split_bytes", "LinkTask"]

log = logging.getLogger("ooc.tasks")


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

    _keys: np.ndarray | None = field(default=None, repr=False, compare=False)

    def all_keys(self) -> np.ndarray:
        """Sorted int64 keys ``u * N + v`` of every edge of every split, both directions (computed
        once: 16 bytes per undirected edge, counted in the budget as :func:`split_bytes`)."""
        if self._keys is None:
            e = np.concatenate([self.train, self.valid, self.test])
            n = self.num_nodes
            self._keys = np.unique(np.concatenate([e[:, 0] * n + e[:, 1], e[:, 1] * n + e[:, 0]]))
        return self._keys


def split_bytes(num_pairs: int) -> int:
    """Host memory of a link split of ``num_pairs`` undirected edges, per rank: the pairs of the
    three parts (16 B each) and the sorted keys of both directions (16 B per pair).  A graph stored
    in both directions (``ooc convert --undirected``) has ``num_edges / 2`` pairs."""
    return 32 * int(num_pairs)


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


def candidate_ranks(pos: np.ndarray, neg: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """float64 [M]: the rank of each positive among its valid candidates,
    ``1 + #(neg > pos) + #(neg == pos) / 2`` (see :func:`ranking_metrics`)."""
    if valid is None:
        valid = np.ones(neg.shape, dtype=bool)
    higher = ((neg > pos[:, None]) & valid).sum(1)
    ties = ((neg == pos[:, None]) & valid).sum(1)
    return 1.0 + higher + 0.5 * ties


def metrics_from_ranks(rank: np.ndarray, ks: tuple[int, ...] = (10, 20, 50)) -> dict:
    """``{"mrr", "hits@K", ...}`` of positives with ranks ``rank`` (float [M]); 0.0 each when empty."""
    if rank.shape[0] == 0:
        return {"mrr": 0.0, **{f"hits@{k}": 0.0 for k in ks}}
    out = {"mrr": float((1.0 / rank).mean())}
    for k in ks:
        out[f"hits@{k}"] = float((rank <= k).mean())
    return out


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
        return metrics_from_ranks(np.empty(0), ks)
    return metrics_from_ranks(candidate_ranks(pos, neg, valid), ks)


class LinkTask:
    """Link prediction on the dataset's undirected edges (see the module docstring).

    ``out_dim`` is ``cfg.hidden``: the encoder's last layer outputs the embedding.

    Args:
        cfg, ds, job, rss: as :class:`ooc.tasks.node.NodeTask`.

    Raises:
        ValueError: no training edges, or options that cannot work.
    """

    name = "link"
    info: dict = {}  # nothing extra for metrics.json
    select = "val_mrr"
    test_key = "test_mrr"
    metric = "mrr"

    def __init__(self, cfg: TrainConfig, ds: Dataset, job: Job | None = None,
                 rss: RssMonitor | None = None, reuse: dict | None = None) -> None:
        self.cfg, self.ds = cfg, ds
        self.job = job or SingleProcess()
        n = ds.num_nodes
        self.split = link_split(ds.indptr, ds.indices, cfg.val_frac, cfg.test_frac, cfg.split_seed)
        if self.split.train.shape[0] == 0:
            raise ValueError(f"{cfg.dataset}: no training edges for link prediction")
        topo = training_graph(self.split.train, n)
        sp = self.split
        self.data = build_data_path(cfg, ds, self.job, rss, task="link", topology=topo,
                                    task_bytes=split_bytes(sp.train.shape[0] + sp.valid.shape[0]
                                                           + sp.test.shape[0]),
                                    reuse=reuse)
        tr = self.split.train
        self.part_src = self.data.part_of(tr[:, 0])
        self.part_dst = self.data.part_of(tr[:, 1])
        self.out_dim = cfg.hidden
        self.loss_fn = nn.BCEWithLogitsLoss()
        self._plan: Plan | None = None
        self._plan_epoch = -1
        self.decoder: LinkDecoder | None = None
        log.info("link split (seed %d): %d train / %d valid / %d test undirected edges", cfg.split_seed,
                 tr.shape[0], self.split.valid.shape[0], self.split.test.shape[0])

    def prepare_model(self, model: GNN) -> None:
        """Attach the decoder (its parameters train, checkpoint and load with the encoder; under DDP
        they are all-reduced with the encoder's)."""
        model.decoder = LinkDecoder(self.cfg.decoder, self.out_dim)
        self.decoder = model.decoder

    @property
    def steps_per_epoch(self) -> int:
        return len(self.plan(0))

    def plan(self, epoch: int) -> Plan:
        """This rank's share of the epoch's training-edge batches."""
        if self._plan is None or self._plan_epoch != epoch:
            j = self.job
            full = self.data.plan_edges(self.part_src, self.part_dst, self.data.global_batch_size(),
                                        epoch)
            self._plan = shard_plan(full, j.rank, j.world_size, j.local_world_size)
            self._plan_epoch = epoch
        return self._plan

    def _build(self, index: int, edge_ids: np.ndarray, epoch: int, state: int, key: int) -> Batch:
        return self.data.link_batch(index, self.split.train[edge_ids], epoch, state, key,
                                    self.cfg.neg_ratio)

    def batches(self, plan: Plan, epoch: int, start: int) -> Iterator[Batch]:
        return self.data.iterate(plan, epoch, start, self._build)

    def loss(self, model: nn.Module, batch: Batch, device: torch.device) -> tuple[Tensor, dict]:
        blocks, x = batch.inputs(device, native=takes_half(model))
        h = model(blocks, x).float()
        dec = self.decoder
        pr = batch.pairs
        assert pr is not None
        pos = dec(h.index_select(0, pr.pos_src.to(device)), h.index_select(0, pr.pos_dst.to(device)))
        neg = dec(h.index_select(0, pr.neg_src.to(device)), h.index_select(0, pr.neg_dst.to(device)))
        loss = self.loss_fn(pos, torch.ones_like(pos)) + self.loss_fn(neg, torch.zeros_like(neg))
        correct = int((pos.detach() > 0).sum()) + int((neg.detach() <= 0).sum())
        st = {"seen": int(pos.shape[0]), "correct": correct, "edges": batch.num_edges,
              "sample_s": batch.sample_s, "gather_s": batch.gather_s,
              "loss_value": float(loss.detach())}
        plan = self._plan
        if plan is not None and plan.weights is not None:
            if not plan.counts(batch.index):
                for k in ("seen", "correct", "edges"):
                    st[k] = 0
            w = plan.weight(batch.index)
            if w != 1.0:
                loss = loss * w
        return loss, st

    def train_score(self, acc: dict) -> float:
        """Share of training positives and negatives on the right side of 0."""
        return acc["correct"] / max(acc["seen"] * (1 + self.cfg.neg_ratio), 1)

    def epoch_end(self, acc: dict) -> dict:
        """The epoch's running sums over all ranks."""
        if self.job.world_size == 1:
            return acc
        keys = ("loss", "seen", "correct", "edges")
        tot = self.job.all_reduce_sum([float(acc[k]) for k in keys])
        out = dict(acc)
        for k, v in zip(keys, tot):
            out[k] = float(v) if k == "loss" else int(round(v))
        return out

    def candidate_chunks(self, part: str, chunk_keys: int = 1 << 18
                         ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``(pairs [m,2], tails [m,C], valid [m,C])`` of a held-out part, in row chunks of about
        ``chunk_keys`` candidates (the same tails whatever the chunk size: one generator, fixed by
        ``split_seed``, drawn row after row).  A candidate counts unless it is the head itself or a
        true edge of any split (membership by binary search in the sorted keys): memory is
        O(chunk_keys), not O(held-out edges x candidates)."""
        pairs = self.split.valid if part == "valid" else self.split.test
        c = self.cfg.eval_candidates
        n = self.split.num_nodes
        rng = np.random.default_rng([self.cfg.split_seed, 0xCA4D, 1 if part == "valid" else 2])
        known = self.split.all_keys()
        rows = max(1, chunk_keys // max(c, 1))
        for s in range(0, pairs.shape[0], rows):
            p = pairs[s:s + rows]
            tails = rng.integers(0, n, size=(p.shape[0], c), dtype=np.int64)
            keys = p[:, :1] * n + tails
            pos = np.searchsorted(known, keys)
            hit = known[np.minimum(pos, known.shape[0] - 1)] == keys if known.shape[0] else \
                np.zeros(keys.shape, dtype=bool)
            yield p, tails, ~hit & (tails != p[:, :1])

    def candidates(self, part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(pairs [M,2], tails [M,C], valid [M,C])`` of a held-out part, fixed by ``split_seed``
        (all chunks of :meth:`candidate_chunks` at once: for tests and small graphs)."""
        chunks = list(self.candidate_chunks(part))
        c = self.cfg.eval_candidates
        if not chunks:
            return (np.empty((0, 2), dtype=np.int64), np.empty((0, c), dtype=np.int64),
                    np.empty((0, c), dtype=bool))
        return tuple(np.concatenate(a) for a in zip(*chunks))  # type: ignore[return-value]

    @torch.no_grad()
    def evaluate(self, model: GNN, device: torch.device, out_dir: str | Path | None = None) -> dict:
        """Validation and test MRR / Hits@K from one layer-wise inference pass over all nodes (every
        rank runs the same pass; the scores are exact and equal on all ranks).  Candidates are
        drawn, scored and ranked chunk by chunk (:meth:`candidate_chunks`); only each positive's
        rank is kept."""
        from ooc.inference import layerwise_inference, layers_in_memory
        L = model.num_layers
        staging = self.data.budget.staging if self.data.budget.budget else None
        if out_dir is None and not layers_in_memory(self.ds.num_nodes, max(model.dims[1:]), staging):
            out_dir = self.job.run_dir(self.cfg.output_dir) / "inference"
        emb = layerwise_inference(model, self.data, self.cfg.eval_batch_size, out_dir, device,
                                  keep=(L - 1,))[L - 1]
        dec = model.decoder.cpu() if device.type != "cpu" else model.decoder
        n = self.split.num_nodes
        # in memory: score each group of heads against all nodes with one matmul ([step, N] floats,
        # at most 16 MiB) and pick the candidates; on disk: gather the candidates' rows
        full = torch.from_numpy(emb.array) if isinstance(emb.array, np.ndarray) else None
        step = max(1, min(1024, (1 << 22) // max(n, 1))) if full is not None else 256
        res: dict = {}
        for part, prefix in (("valid", "val"), ("test", "test")):
            ranks: list[np.ndarray] = []
            for pairs, tails, valid in self.candidate_chunks(part):
                for s in range(0, pairs.shape[0], step):
                    hu = torch.from_numpy(emb.gather(pairs[s:s + step, 0]))
                    hv = torch.from_numpy(emb.gather(pairs[s:s + step, 1]))
                    t = tails[s:s + step]
                    pos = dec(hu, hv).numpy()
                    if full is not None:
                        q = hu * dec.rel if dec.rel is not None else hu
                        neg = (q @ full.T).gather(1, torch.from_numpy(t)).numpy()
                    else:
                        ht = torch.from_numpy(emb.gather(t.reshape(-1))).view(t.shape[0], t.shape[1], -1)
                        neg = dec(hu.unsqueeze(1), ht).numpy()
                    ranks.append(candidate_ranks(pos, neg, valid[s:s + step]))
            rank = np.concatenate(ranks) if ranks else np.empty(0)
            for k, v in metrics_from_ranks(rank, tuple(self.cfg.hits_k)).items():
                res[f"{prefix}_{k}"] = v
        if device.type != "cpu":
            model.decoder.to(device)
        emb.discard()  # scratch: nothing of it is left in the run folder
        return res

    def close(self) -> None:
        self.data.close()
