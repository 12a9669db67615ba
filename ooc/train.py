"""Out-of-core node-classification training (``ooc train``).

Pipeline per epoch: :func:`~ooc.loader.plan_epoch` orders the training seeds partition by partition;
the :class:`~ooc.loader.BatchLoader` samples blocks, makes the batch's partitions resident in the
:class:`~ooc.buffer.PartitionBuffer` (prefetching the next ones), gathers features (misses read from
disk) and hands tensors to the model.  Evaluation uses all neighbours (exact inference for the
sampled layers) over the validation and test seeds; the reported ``test_acc`` is the test accuracy
of the epoch with the best validation accuracy.
"""

from __future__ import annotations

import json
import logging
import os
import random
import resource
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from ooc.buffer import PartitionBuffer, contiguous_partitions
from ooc.config import TrainConfig
from ooc.loader import BatchLoader
from ooc.models import build_model
from ooc.samplers import make_sampler
from ooc.storage.dataset import Dataset

__all__ = ["train", "evaluate", "seed_everything", "peak_rss_bytes", "write_json_atomic"]

log = logging.getLogger("ooc.train")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (bytes; Linux ``ru_maxrss`` is in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write JSON to ``path`` via a temporary file and rename (never a half-written file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _save_atomic(obj: object, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


@torch.no_grad()
def evaluate(model: nn.Module, loader: BatchLoader, ids: np.ndarray, num_layers: int,
             batch_size: int) -> float:
    """Accuracy on ``ids`` with full neighbourhoods (fanout -1 at every layer).

    Returns:
        Fraction of correctly classified nodes (0.0 if ``ids`` is empty).
    """
    if ids.shape[0] == 0:
        return 0.0
    model.eval()
    correct = 0
    for i in range(0, ids.shape[0], batch_size):
        b = loader.make_batch(i, ids[i:i + batch_size], epoch=-1, fanouts=[-1] * num_layers)
        pred = model(b.blocks, b.x).argmax(1)
        correct += int((pred == b.y).sum())
    return correct / ids.shape[0]


def train(cfg: TrainConfig) -> dict:
    """Train a model as configured; writes ``RUN/metrics.json``, ``RUN/config.json``, ``RUN/model.pt``.

    Returns:
        The metrics dictionary (also written to ``metrics.json``): ``test_acc``, ``val_acc``,
        ``epochs``, ``epoch_time_s``, ``losses`` (per step), ``bytes_read``, ``buffer_hit_ratio``,
        ``peak_rss_bytes``, ``seed``, ``config``, per-epoch records under ``history``.

    Raises:
        DatasetError: the dataset cannot be opened.
        ValueError: invalid options (e.g. more partitions than nodes).
    """
    cfg.validate()
    t_start = time.perf_counter()
    seed_everything(cfg.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", cfg.to_dict())

    ds = Dataset(cfg.dataset)
    n = ds.num_nodes
    if cfg.topology == "mmap":
        indptr = ds.raw("indptr").mmap()
        indices = ds.raw("indices").mmap()
    else:
        indptr, indices = ds.indptr, ds.indices
    degrees = np.diff(ds.indptr)
    labels = ds.labels
    train_ids, val_ids, test_ids = ds.split("train"), ds.split("valid"), ds.split("test")
    if train_ids.shape[0] == 0:
        raise ValueError(f"{cfg.dataset}: no training nodes")
    stored = ds.partition_offsets
    if stored is not None and stored.shape[0] - 1 == cfg.partitions:
        offsets = stored
    else:
        offsets = contiguous_partitions(n, cfg.partitions)
    buffer = PartitionBuffer(ds.features, offsets, cfg.buffer_partitions, io_threads=cfg.io_threads)
    sampler = make_sampler(cfg.sampler, indptr, indices, cfg.fanouts, train_ids=train_ids,
                           replace=cfg.replace, batch_size=cfg.batch_size, layer_size=cfg.layer_size,
                           num_clusters=cfg.num_clusters, clusters_per_batch=cfg.clusters_per_batch,
                           walk_length=cfg.walk_length, seed=cfg.seed)
    loader = BatchLoader(indptr, indices, degrees, labels, buffer, cfg.fanouts, cfg.seed,
                         replace=cfg.replace, prefetch=cfg.prefetch, feat_norm=cfg.feat_norm,
                         sampler=sampler)
    num_classes = ds.num_classes or int(labels.max()) + 1
    model = build_model(cfg.model, ds.feat_dim, cfg.hidden, num_classes, len(cfg.fanouts), cfg.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    part_of_train = buffer.part_of(train_ids)
    log.info("dataset %s: %d nodes, %d edges, %d features, %d classes; %d partitions, buffer %d "
             "(%.1f MiB)", ds.name, n, ds.num_edges, ds.feat_dim, num_classes, cfg.partitions,
             cfg.buffer_partitions, buffer.nbytes / 2**20)

    steps_per_epoch = -(-train_ids.shape[0] // cfg.batch_size)
    bar = tqdm(total=cfg.epochs * steps_per_epoch, disable=not cfg.progress, unit="batch",
               dynamic_ncols=True, desc="train")
    history: list[dict] = []
    losses: list[float] = []
    best_val, best_test, best_epoch = -1.0, 0.0, -1
    total_bytes = 0
    total_hits = total_misses = 0
    for epoch in range(cfg.epochs):
        t0 = time.perf_counter()
        model.train()
        plan = loader.plan_epoch(train_ids, part_of_train, cfg.partitions, cfg.batch_size, cfg.seed,
                                 epoch)
        loader.stall_s = 0.0
        ep_loss, ep_correct, ep_seen, ep_edges = 0.0, 0, 0, 0
        sample_s = gather_s = 0.0
        for batch in loader.iterate(plan, epoch):
            opt.zero_grad()
            logits = model(batch.blocks, batch.x)
            loss = loss_fn(logits, batch.y) if batch.loss_weight is None else batch.loss(logits)
            loss.backward()
            opt.step()
            lv = float(loss.detach())
            losses.append(lv)
            ep_loss += lv * batch.y.shape[0]
            ep_correct += int((logits.argmax(1) == batch.y).sum())
            ep_seen += batch.y.shape[0]
            ep_edges += batch.num_edges
            sample_s += batch.sample_s
            gather_s += batch.gather_s
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{lv:.4f}", hit=f"{buffer.stats.hit_ratio:.3f}")
        train_time = time.perf_counter() - t0
        stall = loader.stall_s
        rec: dict = {"epoch": epoch, "loss": ep_loss / max(ep_seen, 1),
                     "train_acc": ep_correct / max(ep_seen, 1), "train_time_s": train_time,
                     "seeds_per_s": ep_seen / train_time, "edges_per_s": ep_edges / train_time,
                     "sampled_edges": ep_edges, "stall_s": stall, "sample_s": sample_s,
                     "gather_s": gather_s}
        if (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1:
            val_acc = evaluate(model, loader, val_ids, len(cfg.fanouts), cfg.eval_batch_size)
            test_acc = evaluate(model, loader, test_ids, len(cfg.fanouts), cfg.eval_batch_size)
            rec.update(val_acc=val_acc, test_acc=test_acc)
            if val_acc > best_val:
                best_val, best_test, best_epoch = val_acc, test_acc, epoch
                _save_atomic(model.state_dict(), out / "model.pt")
        buffer.drain()
        st = buffer.reset_stats()
        rec.update(st.as_dict())
        rec["epoch_time_s"] = time.perf_counter() - t0
        total_bytes += st.bytes_read
        total_hits += st.row_hits
        total_misses += st.row_misses
        history.append(rec)
        msg = (f"epoch {epoch}: loss {rec['loss']:.4f} train_acc {rec['train_acc']:.4f} "
               f"{rec['seeds_per_s']:.0f} seeds/s {rec['edges_per_s'] / 1e6:.2f} M edges/s "
               f"read {st.bytes_read / 2**20:.1f} MiB hit {st.hit_ratio:.3f} stall {stall:.2f}s")
        if "val_acc" in rec:
            msg += f" val {rec['val_acc']:.4f} test {rec['test_acc']:.4f}"
        if cfg.progress:
            bar.write(msg)
        log.info(msg)
    bar.close()
    buffer.close()
    metrics = {
        "test_acc": best_test,
        "val_acc": best_val,
        "best_epoch": best_epoch,
        "final_test_acc": history[-1].get("test_acc"),
        "epochs": cfg.epochs,
        "epoch_time_s": [h["epoch_time_s"] for h in history],
        "losses": losses,
        "bytes_read": total_bytes,
        "buffer_hit_ratio": total_hits / max(total_hits + total_misses, 1),
        "row_hits": total_hits,
        "row_misses": total_misses,
        "buffer_bytes": buffer.nbytes,
        "dataset_feature_bytes": ds.features.nbytes,
        "peak_rss_bytes": peak_rss_bytes(),
        "wall_time_s": time.perf_counter() - t_start,
        "seed": cfg.seed,
        "config": cfg.to_dict(),
        "history": history,
    }
    write_json_atomic(out / "metrics.json", metrics)
    ds.close()
    return metrics
