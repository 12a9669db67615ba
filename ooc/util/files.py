"""Durable files: fsync of files and folders, atomic JSON writes, JSON-lines records.

Every writer of ooc that must never leave a torn file writes a temporary sibling, flushes it and
renames it over the target (``os.replace`` is atomic on POSIX filesystems); the folder is fsynced
so the rename survives a power cut.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

__all__ = ["fsync_dir", "fsync_tree", "write_json_atomic", "read_jsonl", "write_jsonl_atomic", "write_to",
           "temp_sibling", "remove_made_dirs"]


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """``DIR/.NAME.TAG-PID`` next to ``path``: the temporary file an atomic write of ``path`` uses."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}")


def remove_made_dirs(made: list[Path]) -> None:
    """Remove the folders ``made`` (a command created them: deepest first), as far as they are
    empty (a folder something else has written into since stays, and so do its parents)."""
    for p in made:
        try:
            p.rmdir()
        except OSError:
            return


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a folder (makes the renames and creations inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file and folder below ``root`` (and ``root`` itself)."""
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def write_json_atomic(path: str | os.PathLike, obj: dict, durable: bool = False) -> None:
    """Write ``obj`` as indented JSON to ``path`` via a temporary sibling and a rename (never a
    half-written file); with ``durable``, the file is fsynced before the rename and the folder
    after it (the new content survives a power cut once this returns)."""
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(obj, indent=2, sort_keys=True))
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Records of a JSON-lines file (``[]`` if it does not exist); a torn last line (a killed
    writer) ends the list."""
    path = Path(path)
    out: list[dict] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def write_jsonl_atomic(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """Replace ``path`` with ``records``, one JSON object per line (atomic)."""
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "w") as f:
            for r in records:
                f.write(json.dumps(r, sort_keys=True) + "\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_to(f, data, path: str | os.PathLike | None = None) -> None:
    """Write a NumPy array's bytes (or a bytes-like ``data``) to the open binary file ``f``, with
    disk-full named as such.

    Args:
        f: an open binary file; data: ndarray (written C-contiguous) or bytes-like.
        path: the file's path for the message (default ``f.name``).

    Raises:
        OSError: ``ENOSPC`` as "PATH: no space left on device (FOLDER has F bytes free, N more
            bytes needed)"; other write errors unchanged.
    """
    import errno

    import numpy as np
    buf = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray) \
        else memoryview(data).cast("B")
    try:
        f.write(buf)
    except OSError as e:
        target = Path(path if path is not None else getattr(f, "name", "."))
        folder = target.parent if str(target.parent) else Path(".")
        try:
            free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
        except OSError:
            free = -1
        if e.errno == errno.ENOSPC or (e.errno is None and 0 <= free < len(buf)):
            raise OSError(errno.ENOSPC, f"{target}: no space left on device ({folder} has {free:,} "
                                        f"bytes free; {len(buf):,} bytes needed for this write alone)") \
                from None
        raise
