"""Exact layer-wise full-neighbour inference over the whole graph, out of core (``ooc eval``,
``ooc predict``).

Sampled inference (``fanout -1`` around each batch of seeds) recomputes the L-hop neighbourhood of
every batch, which on a large graph is most of the graph per batch.  Layer-wise inference computes
each layer once for *all* nodes, as in DGL's and PyG's ``inference`` examples and GraphSAGE's
appendix: for layer ``l`` and each batch of destination nodes ``[a, b)`` (in id order, partition by
partition), take all in-neighbours (one full-neighbour block), gather their layer-``l`` inputs and run
:meth:`~ooc.models.GNN.layer_forward`.  Layer 0 reads the features through the partition buffer (the
batch's partition resident, the next one prefetched, other rows read from disk); every layer's output
for all nodes is appended, partition by partition, to an uncompressed Zarr array
(:class:`~ooc.storage.rawarray.RawArrayWriter`) and read back through a memory map
(:class:`~ooc.storage.rawarray.RawArray`) as the next layer's input.  Host memory holds one batch's
neighbourhood, never a layer.  The result equals sampled inference with ``fanout -1`` up to float
rounding (tested).

Predictions are written in original id order: when the dataset holds ``nodes/perm`` (``perm[i]`` =
original id of internal node ``i``), rows are mapped back through it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from ooc.models import GNN, to_torch_blocks
from ooc.util.progress import progress as progress_bar
from ooc.storage.rawarray import RawArray, RawArrayWriter, write_group_metadata

if TYPE_CHECKING:  # pragma: no cover
    from ooc.config import TrainConfig
    from ooc.data.path import DataPath
    from ooc.tasks.node import NodeTask

__all__ = ["layerwise_inference", "LayerOutput", "evaluate_node_layerwise", "load_run",
           "eval_run", "predict_run", "write_rows_in_original_order"]

log = logging.getLogger("ooc.training.inference")

#: Layers smaller than this are kept in memory when no output folder is given.
IN_MEMORY_LIMIT = 1 << 30


@dataclass
class LayerOutput:
    """One layer's output for all N nodes: an in-memory array or an on-disk Zarr array."""

    array: np.ndarray | RawArray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """float32 rows ``ids`` (any order)."""
        if isinstance(self.array, RawArray):
            return self.array.gather(ids)[0]
        return self.array[ids]

    def read(self, start: int, stop: int) -> np.ndarray:
        if isinstance(self.array, RawArray):
            return self.array.read(start, stop)
        return self.array[start:stop]

    def close(self) -> None:
        if isinstance(self.array, RawArray):
            self.array.close()


@torch.no_grad()
def layerwise_inference(model: GNN, data: "DataPath", batch_size: int = 1024,
                        out_dir: str | os.PathLike | None = None, device: torch.device | str = "cpu",
                        keep: tuple[int, ...] | None = None, progress: bool = False) -> dict[int, LayerOutput]:
    """Run ``model`` layer by layer over every node with full neighbourhoods.

    Args:
        model: the GNN (put in eval mode here).
        data: the run's data path: topology ``indptr``/``indices`` (the graph messages flow on),
            ``degrees``, partition ``offsets`` and the loader whose buffer serves layer-0 features.
        batch_size: destination nodes per block.
        out_dir: folder for the per-layer Zarr arrays ``layer{i}`` (created; must not hold them).
            ``None``: in memory (refused for a layer above :data:`IN_MEMORY_LIMIT` bytes).
        device: where the model runs.
        keep: layer indices whose outputs are returned (default: the last two); intermediate ones
            are deleted as soon as the next layer is done.
        progress: show a progress bar.

    Returns:
        ``{layer index: LayerOutput}`` for the kept layers; row ``v`` is node ``v`` (internal ids).

    Raises:
        ValueError: ``out_dir`` is None and a layer would exceed :data:`IN_MEMORY_LIMIT`.

    Shapes:
        layer ``i`` output: [N, model.dims[i+1]] float32.
    """
    model.eval()
    device = torch.device(device)
    n = data.num_nodes
    L = model.num_layers
    keep = tuple(range(max(L - 2, 0), L)) if keep is None else tuple(keep)
    sampler = data.eval_sampler([-1])
    degrees = data.graph.degrees
    offsets = np.asarray(data.offsets, dtype=np.int64)
    num_parts = offsets.shape[0] - 1
    widest = max(model.dims[1:]) * 4 * n
    root = Path(out_dir) if out_dir is not None else None
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    on_disk = root is not None
    if not on_disk and widest > IN_MEMORY_LIMIT:
        raise ValueError(f"a layer of {widest / 2**30:.1f} GiB needs an out_dir for its Zarr array")
    outputs: dict[int, LayerOutput] = {}
    prev: LayerOutput | None = None
    bar = progress_bar(total=L * n, enabled=progress, unit="node", desc="inference")
    try:
        for i in range(L):
            width = model.dims[i + 1]
            if on_disk:
                path = root / f"layer{i}"  # type: ignore[operator]
                if path.exists():
                    shutil.rmtree(path)
                writer: RawArrayWriter | None = RawArrayWriter(path, np.float32, (width,), expected_rows=n)
                mem = None
            else:
                writer, mem = None, np.empty((n, width), dtype=np.float32)
            for p in range(num_parts):
                a, b = int(offsets[p]), int(offsets[p + 1])
                # layer 0: the partition's rows in one sequential read unless resident (the buffer
                # is not moved: a shared buffer's other ranks may be reading it)
                window = data.partition_rows(p) if i == 0 else None
                for s in range(a, b, batch_size):
                    e = min(s + batch_size, b)
                    dst = np.arange(s, e, dtype=np.int64)
                    sg = sampler.sample(dst, 0)  # all neighbours: no randomness
                    block = to_torch_blocks(sg, degrees)[0]
                    ids = sg.nodes[: block.num_src]
                    if i == 0 and window is None:
                        h = data.features(ids)
                    elif i == 0:
                        inside = (ids >= a) & (ids < b)
                        raw = np.empty((ids.shape[0], *window.shape[1:]), dtype=window.dtype)
                        raw[inside] = window[ids[inside] - a]
                        if not inside.all():
                            raw[~inside] = data.buffer.gather(ids[~inside])[0]
                        h = data.to_input(raw)
                    else:
                        h = torch.from_numpy(np.ascontiguousarray(prev.gather(ids)))  # type: ignore[union-attr]
                    if device.type != "cpu":
                        block, h = block.to(device), h.to(device)
                    out = model.layer_forward(i, block, h).float().cpu().numpy()
                    if writer is not None:
                        writer.append(out)
                    else:
                        mem[s:e] = out  # type: ignore[index]
                    bar.update(e - s)
            if writer is not None:
                writer.close()
                cur = LayerOutput(RawArray(root / f"layer{i}"))  # type: ignore[operator]
            else:
                cur = LayerOutput(mem)  # type: ignore[arg-type]
            if prev is not None and (i - 1) not in keep:
                prev.close()
                if on_disk:
                    shutil.rmtree(root / f"layer{i - 1}", ignore_errors=True)  # type: ignore[operator]
            if i in keep:
                outputs[i] = cur
            prev = cur
    finally:
        bar.close()
    return outputs


def _node_scores(logits: np.ndarray, labels: np.ndarray, ids: np.ndarray, multilabel: bool) -> float:
    if ids.shape[0] == 0:
        return 0.0
    if multilabel:
        pred = logits > 0
        truth = labels[ids] > 0
        tp = int((pred & truth).sum())
        err = int((pred ^ truth).sum())
        return 2 * tp / max(2 * tp + err, 1)
    return float((logits.argmax(1) == labels[ids]).mean())


def evaluate_node_layerwise(model: GNN, task: "NodeTask", device: torch.device | str = "cpu",
                            out_dir: str | os.PathLike | None = None) -> dict:
    """Validation and test scores of a node task from one layer-wise pass over all nodes."""
    outs = layerwise_inference(model, task.data, task.cfg.eval_batch_size, out_dir, device,
                               keep=(model.num_layers - 1,))
    logits = outs[model.num_layers - 1]
    labels = task.ds.labels
    from ooc.tasks.node import node_loss_sum
    res = {}
    for k, ids in (("val_acc", task.val_ids), ("test_acc", task.test_ids)):
        res[k] = _node_scores(logits.gather(ids), labels, ids, task.multilabel)
    val_logits = torch.from_numpy(np.ascontiguousarray(logits.gather(task.val_ids)))
    s, n = node_loss_sum(val_logits, torch.from_numpy(np.asarray(labels[task.val_ids])), task.multilabel)
    res["val_loss"] = s / max(n, 1)
    if task.ogb is not None:  # OGB's Evaluator on the same logits (datasets converted from OGB)
        res.update(task.ogb_scores(*(task.ogb.compact(torch.from_numpy(np.ascontiguousarray(
            logits.gather(ids)))) for ids in (task.val_ids, task.test_ids))))
    logits.close()
    return res


# ====================================================================== runs: eval / predict
def load_run(run: str | os.PathLike, dataset: str | None = None,
             weights: str = "best") -> tuple["TrainConfig", Any, GNN, torch.device]:
    """Rebuild a finished run: its configuration, task (with data path) and model with weights.

    Args:
        run: run directory (``config.yaml`` and ``model.pt`` / ``checkpoint.pt``).
        dataset: evaluate on this dataset instead of the configured one (same features/classes).
        weights: ``best`` (``model.pt``) or ``last`` (the checkpoint's model).

    Raises:
        FileNotFoundError: the run lacks its config or weights.
    """
    from ooc.training.checkpoint import load_checkpoint
    from ooc.config import TrainConfig
    from ooc.storage.dataset import Dataset
    from ooc.training.loop import make_model, make_task, resolve_device
    run = Path(run)
    conf = run / "config.yaml"
    if not conf.exists():
        raise FileNotFoundError(f"{conf}: not a run directory (no config.yaml)")
    cfg = TrainConfig.from_sources(conf)
    cfg.progress = False
    if dataset:
        cfg.dataset = str(dataset)
    cfg.validate()
    if weights == "best":
        wpath = run / "model.pt"
        if not wpath.exists():
            raise FileNotFoundError(f"{wpath}: no trained weights")
        state = torch.load(wpath, map_location="cpu", weights_only=True)
    else:
        state = load_checkpoint(run / "checkpoint.pt")["model"]
    device = resolve_device(cfg.device)
    ds = Dataset(cfg.dataset)
    task = make_task(cfg, ds)
    model = make_model(cfg, ds.feat_dim, task.out_dim, ds.num_nodes)
    from ooc.interop.custom import is_custom, require_layerwise
    if is_custom(cfg.model):
        require_layerwise(model, cfg.model, "ooc eval / ooc predict (layer-wise inference)")
    task.prepare_model(model)
    model.load_state_dict(state)
    model.to(device).eval()
    return cfg, task, model, device


def eval_run(run: str | os.PathLike, dataset: str | None = None, weights: str = "best",
             workdir: str | os.PathLike | None = None, progress: bool = False) -> dict:
    """``ooc eval``: exact layer-wise inference of a trained run, scores on validation and test,
    written to ``RUN/eval.json``.  Layer outputs go to ``workdir`` (default ``RUN/inference``) and
    are removed afterwards."""
    from ooc.util.files import write_json_atomic
    t0 = time.perf_counter()
    cfg, task, model, device = load_run(run, dataset, weights)
    work = Path(workdir) if workdir else Path(run) / "inference"
    try:
        if cfg.task == "link":
            res = task.evaluate(model, device, out_dir=work)
        else:
            res = evaluate_node_layerwise(model, task, device, out_dir=work)
        io = task.data.buffer.stats
        res.update({"weights": weights, "dataset": cfg.dataset, "task": cfg.task,
                    "metric": getattr(task, "metric", ""), "time_s": time.perf_counter() - t0,
                    "bytes_read": io.bytes_read, "buffer_hit_ratio": io.hit_ratio})
    finally:
        task.close()
        shutil.rmtree(work, ignore_errors=True)
    write_json_atomic(Path(run) / "eval.json", res)
    return res


def write_rows_in_original_order(source: Callable[[np.ndarray], np.ndarray], n: int, width: tuple[int, ...],
                                 dtype: np.dtype, sink: Callable[[np.ndarray], None],
                                 perm: np.ndarray | None, chunk: int = 65536) -> None:
    """Stream ``n`` rows to ``sink`` in original id order.

    Args:
        source: ``internal ids -> rows``.
        perm: int64 [N], ``perm[i]`` = original id of internal node ``i`` (``None``: identity).
        sink: called with consecutive row blocks (original ids ``0, 1, ...``).
    """
    inv = None
    if perm is not None:
        perm = np.asarray(perm, dtype=np.int64)
        if perm.shape != (n,) or not np.array_equal(np.sort(perm), np.arange(n)):
            raise ValueError(f"nodes/perm is not a permutation of 0..{n - 1}")
        inv = np.empty(n, dtype=np.int64)
        inv[perm] = np.arange(n, dtype=np.int64)
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        ids = np.arange(s, e, dtype=np.int64) if inv is None else inv[s:e]
        sink(np.ascontiguousarray(source(ids), dtype=dtype).reshape((e - s, *width)))


def predict_run(run: str | os.PathLike, out: str | os.PathLike, what: str = "pred",
                dataset: str | None = None, weights: str = "best",
                workdir: str | os.PathLike | None = None, progress: bool = False) -> dict:
    """``ooc predict``: layer-wise inference of a trained run; predictions and embeddings for every
    node, rows in original id order.

    Args:
        out: ``*.npy`` (one array: ``what``) or ``*.zarr`` (a Zarr v3 group with ``pred`` int64 [N]
            (multi-label: int8 [N, C]), ``logits`` float32 [N, C] and ``embedding`` float32 [N, H],
            the input of the last layer; link-prediction runs: ``embedding`` only, the encoder output).
        what: for ``.npy``: ``pred``, ``logits`` or ``embedding``.

    Returns:
        ``{"out": path, "arrays": {name: shape}}``.

    Raises:
        ValueError: unknown output suffix or ``what``.
    """
    out = Path(out)
    if out.suffix not in (".npy", ".zarr"):
        raise ValueError(f"{out}: --out must end in .npy or .zarr")
    if what not in ("pred", "logits", "embedding"):
        raise ValueError(f"--what must be pred, logits or embedding, got {what!r}")
    cfg, task, model, device = load_run(run, dataset, weights)
    work = Path(workdir) if workdir else Path(run) / "inference"
    L = model.num_layers
    link = cfg.task == "link"
    if link and what != "embedding" and out.suffix == ".npy":
        raise ValueError("a link-prediction run predicts embeddings: use --what embedding")
    try:
        keep = (L - 1,) if link or L == 1 else (L - 2, L - 1)
        outs = layerwise_inference(model, task.data, cfg.eval_batch_size, work, device, keep=keep,
                                   progress=progress)
        ds = task.ds
        n = ds.num_nodes
        perm = ds.load("nodes/perm") if ds.has("nodes/perm") else None
        multilabel = getattr(task, "multilabel", False)
        arrays: dict[str, tuple[Callable[[np.ndarray], np.ndarray], tuple[int, ...], Any]] = {}
        if link:
            emb = outs[L - 1]
            arrays["embedding"] = (emb.gather, emb.shape[1:], np.float32)
        else:
            logits = outs[L - 1]
            c = logits.shape[1]
            if multilabel:
                arrays["pred"] = (lambda ids: (logits.gather(ids) > 0).astype(np.int8), (c,), np.int8)
            else:
                arrays["pred"] = (lambda ids: logits.gather(ids).argmax(1), (), np.int64)
            arrays["logits"] = (logits.gather, (c,), np.float32)
            if L >= 2:
                emb = outs[L - 2]
                arrays["embedding"] = (emb.gather, emb.shape[1:], np.float32)
        if out.suffix == ".npy" and what not in arrays:
            raise ValueError(f"this run has no {what!r} output (available: {', '.join(arrays)})")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}")
        shapes: dict[str, list[int]] = {}
        if out.suffix == ".npy":
            src, width, dt = arrays[what]
            mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=dt, shape=(n, *width))
            pos = [0]

            def sink(rows: np.ndarray) -> None:
                mm[pos[0]:pos[0] + rows.shape[0]] = rows
                pos[0] += rows.shape[0]

            write_rows_in_original_order(src, n, width, dt, sink, perm)
            mm.flush()
            del mm
            shapes[what] = [n, *width]
        else:
            write_group_metadata(tmp, {"ooc": {"run": str(run), "task": cfg.task, "rows": "original ids",
                                               "weights": weights}})
            for name, (src, width, dt) in arrays.items():
                w = RawArrayWriter(tmp / name, dt, width, expected_rows=n)
                write_rows_in_original_order(src, n, width, dt, w.append, perm)
                w.close()
                shapes[name] = [n, *width]
        if out.exists():
            if out.is_dir():
                shutil.rmtree(out)
            else:
                out.unlink()
        os.replace(tmp, out)
        for o in outs.values():
            o.close()
    finally:
        task.close()
        shutil.rmtree(work, ignore_errors=True)
        for t in out.parent.glob(f".{out.name}.partial-{os.getpid()}-*"):
            shutil.rmtree(t, ignore_errors=True) if t.is_dir() else t.unlink()
    log.info("wrote %s: %s", out, json.dumps(shapes))
    return {"out": str(out), "arrays": shapes}
