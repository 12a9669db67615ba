"""Checkpoints: atomic writes, ``weights_only`` loads, and the complete RNG state of a process.

A checkpoint is one ``torch.save`` file holding only tensors, numbers, strings, lists, tuples and
dicts, so :func:`load_checkpoint` can use ``torch.load(weights_only=True)`` (no pickled code runs on
load).  It is written to a temporary sibling, flushed with ``fsync`` and renamed over the old one: a
crash at any moment leaves either the previous or the new checkpoint, never a torn file.

Every checkpoint carries a blake2b checksum of its content (:func:`content_digest`: tensors' bytes,
dtypes and shapes, and every value, in a canonical order), checked on load: a corrupt, truncated,
empty, crafted or foreign file is a :class:`CheckpointError` naming it.  The checkpoint a save
replaces is kept as ``NAME.prev.pt``, and :func:`load_checkpoint` falls back to it, with a warning,
when the latest one is unusable.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ooc.util.files import fsync_dir
from ooc.util.signals import deferred_signals

__all__ = ["save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state", "CHECKPOINT_FORMAT",
           "CheckpointError", "content_digest", "previous_path", "DIGEST_KEY", "check_weights_file"]

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




class CheckpointError(ValueError):
    """A checkpoint file is empty, truncated, corrupt, crafted or not an ooc checkpoint."""


#: Key of the content checksum stored in every checkpoint (blake2b-256 over :func:`content_digest`).
DIGEST_KEY = "content_blake2b"


def _feed(h: "hashlib._Hash", x: Any) -> None:
    """Hash ``x`` canonically: type tags, lengths, sorted dict keys, tensors' dtype, shape and bytes."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        h.update(b"T" + str(t.dtype).encode() + repr(tuple(t.shape)).encode())
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    elif isinstance(x, dict):
        h.update(b"D%d" % len(x))
        for k in sorted(x, key=repr):
            _feed(h, k)
            _feed(h, x[k])
    elif isinstance(x, (list, tuple)):
        h.update((b"L" if isinstance(x, list) else b"U") + b"%d" % len(x))
        for v in x:
            _feed(h, v)
    elif isinstance(x, str):
        b = x.encode()
        h.update(b"S%d:" % len(b) + b)
    elif isinstance(x, bytes):
        h.update(b"B%d:" % len(x) + x)
    else:  # None, bool, int, float (repr round-trips floats exactly)
        h.update(type(x).__name__.encode() + b":" + repr(x).encode() + b";")


def content_digest(obj: dict) -> str:
    """blake2b-256 hex of a checkpoint's content (every key but :data:`DIGEST_KEY`), independent of
    how ``torch.save`` lays the file out: a loaded checkpoint hashes to the digest saved in it."""
    h = hashlib.blake2b(digest_size=32)
    _feed(h, {k: v for k, v in obj.items() if k != DIGEST_KEY})
    return h.hexdigest()


def previous_path(path: str | os.PathLike) -> Path:
    """Where :func:`save_checkpoint` keeps the checkpoint it replaced: ``checkpoint.prev.pt``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.prev{p.suffix}")


def save_checkpoint(obj: dict, path: str | os.PathLike, keep_previous: bool = True) -> None:
    """Write ``obj`` to ``path`` atomically (temporary sibling, fsync, rename, fsync of the folder),
    with its content checksum (:data:`DIGEST_KEY`); the checkpoint it replaces is kept as
    :func:`previous_path` (a hard link made before the rename), for :func:`load_checkpoint` to fall
    back to.  A SIGINT or SIGTERM during the write is acted on once the checkpoint is complete
    (:func:`ooc.util.signals.deferred_signals`).

    Args:
        obj: tensors and plain values only (what ``torch.load(weights_only=True)`` accepts).
        path: target file.
        keep_previous: keep the replaced checkpoint as ``NAME.prev.pt``.
    """
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    data = dict(obj)
    data[DIGEST_KEY] = content_digest(data)
    with deferred_signals():  # a SIGINT inside torch.save's writer is a RuntimeError, not an interrupt
        _write_checkpoint(data, p, tmp, keep_previous)


def _write_checkpoint(data: dict, p: Path, tmp: Path, keep_previous: bool) -> None:
    try:
        with open(tmp, "wb") as f:
            torch.save(data, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and p.exists():
            prev = previous_path(p)
            ptmp = prev.with_name(f".{prev.name}.tmp-{os.getpid()}")
            try:
                if ptmp.exists():
                    ptmp.unlink()
                os.link(p, ptmp)
                os.replace(ptmp, prev)
            except OSError:  # no hard links here: keep the previous one by renaming it
                if ptmp.exists():
                    ptmp.unlink()
                os.replace(p, prev)
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(p.parent)


def _check_zip_crc(p: Path, unreadable: str, corrupt: str) -> None:
    """Check the CRC-32 of every member of ``p`` (torch's zip format).

    Raises:
        CheckpointError: ``"{p}: {unreadable} (why)"`` when it is not a readable zip,
            ``"{p}: {corrupt} (member M fails its CRC)"`` when a member's data is damaged.
    """
    import zipfile
    try:
        with zipfile.ZipFile(p) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"{p}: {unreadable} ({e})") from None
    if bad is not None:
        raise CheckpointError(f"{p}: {corrupt} (member {bad} fails its CRC)")


def _load_one(p: Path, map_location: Any) -> dict:
    """Load and check one checkpoint file (see :func:`load_checkpoint`)."""
    import pickle
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no checkpoint to resume from") from None
    if size == 0:
        raise CheckpointError(f"{p}: checkpoint is empty (0 bytes)")
    try:
        obj = torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e):
            raise CheckpointError(f"{p}: holds objects other than tensors and plain values (a "
                                  "crafted or foreign file); ooc never loads such a file") from None
        raise CheckpointError(f"{p}: corrupt checkpoint ({e})") from None
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for truncated / foreign files
        raise CheckpointError(f"{p}: not a readable checkpoint: truncated, corrupt or not written by "
                              f"ooc ({type(e).__name__}: {str(e).split('. ')[0].splitlines()[0] if str(e) else ''})") \
            from None
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{p}: not an ooc checkpoint (format {CHECKPOINT_FORMAT})")
    want = obj.get(DIGEST_KEY)
    if want is None:  # written before checksums: the zip's CRC-32 of every member, at least
        _check_zip_crc(p, "corrupt checkpoint", "corrupt checkpoint")
    elif content_digest(obj) != want:
        raise CheckpointError(f"{p}: corrupt checkpoint: its content does not match its checksum "
                              f"({DIGEST_KEY})")
    obj.pop(DIGEST_KEY, None)
    return obj


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", fallback: bool = True) -> dict:
    """Load a checkpoint with ``torch.load(weights_only=True)`` and check its content checksum.

    When ``path`` is corrupt, truncated, empty or missing and the previous checkpoint
    (:func:`previous_path`) is sound, that one is returned with a warning on stderr (``fallback``).

    Raises:
        FileNotFoundError: no checkpoint at ``path`` (nor a previous one).
        CheckpointError: (a ValueError) the file is empty, truncated, corrupt (content checksum),
            crafted (objects other than tensors and plain values) or not an ooc checkpoint of a
            format this code reads -- and so is the previous one; the message names the file(s).
    """
    import sys
    p = Path(path)
    try:
        return _load_one(p, map_location)
    except (CheckpointError, FileNotFoundError) as e:
        prev = previous_path(p)
        if not fallback or not prev.exists():
            raise
        try:
            obj = _load_one(prev, map_location)
        except (CheckpointError, FileNotFoundError) as e2:
            raise CheckpointError(f"{e}; the previous checkpoint is unusable too: {e2}") from None
        print(f"ooc: warning: {e}; using the previous checkpoint {prev}", file=sys.stderr)
        return obj


def check_weights_file(path: str | os.PathLike) -> None:
    """Check a plain ``state_dict`` file (``RUN/model.pt``) before it is used: it loads with
    ``torch.load(weights_only=True)``, every zip member passes its CRC-32, and it holds a mapping of
    tensors.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: empty, truncated, corrupt, crafted or not a state_dict (the file named).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such weights file")
    if p.stat().st_size == 0:
        raise CheckpointError(f"{p}: weights file is empty (0 bytes)")
    _check_zip_crc(p, "not a readable weights file: truncated or corrupt", "corrupt weights file")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{p}: not a readable weights file ({type(e).__name__}: "
                              f"{str(e).split('. ')[0].splitlines()[0] if str(e) else ''})") from None
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{p}: not a state_dict of tensors")
