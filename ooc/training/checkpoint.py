"""Checkpoints: atomic writes, ``weights_only`` loads, and the complete RNG state of a process.

A checkpoint is one ``torch.save`` file holding only tensors, numbers, strings, lists, tuples and
dicts, so :func:`load_checkpoint` can use ``torch.load(weights_only=True)`` (no pickled code runs on
load).  It is written to a temporary sibling, flushed with ``fsync`` and renamed over the old one: a
crash at any moment leaves either the previous or the new checkpoint, never a torn file.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ooc.util.files import fsync_dir

__all__ = ["save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = 1


def rng_state() -> dict:
    """The state of every generator a run draws from: Python ``random``, NumPy's global generator,
    torch CPU and (when present) every CUDA device.  Only tensors and plain values, so it survives a
    ``weights_only`` load.  (The samplers need none: their draws are keyed by seed, epoch and batch.)"""
    py = random.getstate()
    np_state = np.random.get_state(False)  # the dict form
    st = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    """Restore a state captured by :func:`rng_state`."""
    py = st["python"]
    random.setstate((int(py[0]), tuple(int(v) for v in py[1]), py[2]))
    n = st["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": int(n["pos"])},
                         "has_gauss": int(n["has_gauss"]), "gauss": float(n["gauss"])})
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])




def save_checkpoint(obj: dict, path: str | os.PathLike) -> None:
    """Write ``obj`` to ``path`` atomically (temporary sibling, fsync, rename, fsync of the folder).

    Args:
        obj: tensors and plain values only (what ``torch.load(weights_only=True)`` accepts).
        path: target file.
    """
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    fsync_dir(p.parent)


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """Load a checkpoint with ``torch.load(weights_only=True)``.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: the file is not an ooc checkpoint of a format this code reads.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no checkpoint to resume from")
    obj = torch.load(p, map_location=map_location, weights_only=True)
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{p}: not an ooc checkpoint (format {CHECKPOINT_FORMAT})")
    return obj
