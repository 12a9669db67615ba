"""Finished runs: ``ooc eval`` (exact layer-wise scores) and ``ooc predict`` (predictions and
embeddings of every node, rows in original id order), rebuilt from a run directory.

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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from ooc.inference import layerwise_inference, write_rows_in_original_order
from ooc.models import GNN
from ooc.storage.rawarray import RawArrayWriter, write_group_metadata

if TYPE_CHECKING:  # pragma: no cover
    from ooc.config import TrainConfig

__all__ = ["load_run", "eval_run", "predict_run"]

log = logging.getLogger("ooc.inference")


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
        raise FileNotFoundError(f"{run}: not a run directory (it has no config.yaml)")
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


def _scratch(run: str | os.PathLike, workdir: str | os.PathLike | None) -> Path:
    """The folder for the layer outputs of one inference: ``RUN/inference``, or a new folder of its
    own inside ``workdir`` (created), so that removing it afterwards removes nothing else."""
    if not workdir:
        return Path(run) / "inference"
    Path(workdir).mkdir(parents=True, exist_ok=True)
    return Path(workdir) / f".ooc-inference-{os.getpid()}-{secrets.token_hex(4)}"


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both resolved)."""
    p, f = path.resolve(), folder.resolve()
    return p == f or f in p.parents


def eval_run(run: str | os.PathLike, dataset: str | None = None, weights: str = "best",
             workdir: str | os.PathLike | None = None, progress: bool = False) -> dict:
    """``ooc eval``: exact layer-wise inference of a trained run, scores on validation and test,
    written to ``RUN/eval.json``.  Layer outputs go to ``RUN/inference`` or a folder of their own
    inside ``workdir``, removed afterwards (nothing else in ``workdir`` is touched)."""
    from ooc.util.files import write_json_atomic
    t0 = time.perf_counter()
    cfg, task, model, device = load_run(run, dataset, weights)
    work = _scratch(run, workdir)
    try:
        if cfg.task == "link":
            res = task.evaluate(model, device, out_dir=work)
        else:
            from ooc.tasks.node import evaluate_node_layerwise
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


def predict_run(run: str | os.PathLike, out: str | os.PathLike, what: str | None = None,
                dataset: str | None = None, weights: str = "best",
                workdir: str | os.PathLike | None = None, progress: bool = False,
                overwrite: bool = False) -> dict:
    """``ooc predict``: layer-wise inference of a trained run; predictions and embeddings for every
    node, rows in original id order.

    Args:
        out: ``*.npy`` (one array: ``what``) or ``*.zarr`` (a Zarr v3 group with ``pred`` int64 [N]
            (multi-label: int8 [N, C]), ``logits`` float32 [N, C] and ``embedding`` float32 [N, H],
            the input of the last layer; link-prediction runs: ``embedding`` only, the encoder output).
        what: for ``.npy``: ``pred``, ``logits`` or ``embedding`` (default: ``pred``; ``embedding``
            for a link-prediction run).
        overwrite: replace an existing ``out`` (refused otherwise).

    Returns:
        ``{"out": path, "arrays": {name: shape}}``.

    Raises:
        ValueError: unknown output suffix or ``what``; ``out`` exists (without ``overwrite``), lies
            inside the run or the dataset, or its folder does not exist.
    """
    out = Path(out)
    if out.suffix not in (".npy", ".zarr"):
        raise ValueError(f"{out}: --out must end in .npy or .zarr")
    if what not in (None, "pred", "logits", "embedding"):
        raise ValueError(f"--what must be pred, logits or embedding, got {what!r}")
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: folder {out.parent} does not exist")
    if _inside(out, Path(run)):
        raise ValueError(f"--out {out} lies inside the run {run}; write it elsewhere")
    cfg, task, model, device = load_run(run, dataset, weights)
    refused = None
    if _inside(out, Path(cfg.dataset)):
        refused = f"lies inside the dataset {cfg.dataset}; write it elsewhere"
    elif (out.exists() or out.is_symlink()) and not overwrite:
        refused = "exists; --overwrite replaces it"
    if refused:
        task.close()
        raise ValueError(f"--out {out} {refused}")
    work = _scratch(run, workdir)
    L = model.num_layers
    link = cfg.task == "link"
    if what is None:  # what the run predicts: classes, or a link run's embeddings
        what = "embedding" if link else "pred"
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
