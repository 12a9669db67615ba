"""Opening a dataset for reading: shared lock, leftovers of dead writers removed, verified.

:func:`open_for_read` is what ``ooc train`` / ``eval`` / ``predict`` do before touching a dataset:

1. take the dataset's shared lock (:class:`~ooc.storage.locks.PathLock`), so ``ooc partition`` in
   place, ``ooc compress`` or ``ooc convert --overwrite`` of it fail (or wait) while it is read;
2. remove the ``.NAME.partial-*`` / ``.NAME.old-*`` siblings and in-dataset group leftovers of dead
   writers;
3. run the structural scans (:meth:`~ooc.storage.dataset.Dataset.check_structure`: indptr
   monotone from 0 to E, indices < N, labels in [-1, C), splits in range, sorted and disjoint,
   shapes of ``zarr.json`` = manifest, full-size chunk files) and refuse a dataset that fails;
4. open it with the verification of chunks on read asked for (``checksums``: every chunk is
   checked against its blake2b digest the first time it is used; see :mod:`ooc.storage.verify`).
   Other readers of the dataset in the process (the training loop's own ``Dataset``) follow the
   process default, which :func:`verifying` sets for a block of code.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ooc.storage.dataset import Dataset, DatasetError
from ooc.storage.locks import PathLock
from ooc.storage.verify import VERIFY_MODES, read_verification, set_read_verification
from ooc.util.procs import remove_dead_leftovers

__all__ = ["ReadAccess", "open_for_read", "remove_dataset_leftovers", "verifying"]


def remove_dataset_leftovers(path: str | os.PathLike) -> list[str]:
    """Remove what dead writers left of the dataset at ``path``: its ``.NAME.partial-*`` /
    ``.NAME.old-*`` siblings and, inside it, hidden partial / old array groups."""
    p = Path(os.path.abspath(path))
    removed = remove_dead_leftovers(p.parent, p.name)
    root = p / "arrays.zarr"
    if root.is_dir():
        for group in [root, *(d for d in root.rglob("*") if d.is_dir() and not d.name.startswith("."))]:
            removed += remove_dead_leftovers(group, tags=("partial", "old"))
    return removed


class ReadAccess:
    """A dataset opened by :func:`open_for_read`: :attr:`ds` and the shared lock; :meth:`close`
    (or leaving the ``with`` block) releases both."""

    def __init__(self, ds: Dataset, lock: PathLock) -> None:
        self.ds = ds
        self.lock = lock

    def close(self) -> None:
        self.ds.close()
        self.lock.release()

    def __enter__(self) -> "ReadAccess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def verifying(mode: str) -> Iterator[None]:
    """Run a block with the process's default chunk verification set to ``mode`` (restored after)."""
    old = read_verification()
    set_read_verification(mode)
    try:
        yield
    finally:
        set_read_verification(old)


def open_for_read(path: str | os.PathLike, verify: str = "checksums", wait: bool | None = None,
                  purpose: str = "read") -> ReadAccess:
    """Lock, clean, verify and open the dataset at ``path`` for reading (module docstring).

    Args:
        path: dataset directory.
        verify: ``checksums`` (structural scans now, chunk checksums on first use) or
            ``structure`` (the scans only).
        wait: wait for a writer holding the dataset instead of failing (None: ``--wait`` default).
        purpose: for the lock message, e.g. ``"train on"``.

    Returns:
        A :class:`ReadAccess` (keep it until the reads are done).

    Raises:
        DatasetError: not a dataset, or it fails a structural check (all problems listed).
        LockError: a writer holds the dataset.
        ValueError: unknown ``verify``.
    """
    if verify not in VERIFY_MODES:
        raise ValueError(f"--verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"{p}: no such dataset directory")
    lock = PathLock(p, exclusive=False, wait=wait, what="dataset", purpose=purpose).acquire()
    try:
        remove_dataset_leftovers(p)
        ds = Dataset(p, verify=verify)
        try:
            problems = ds.check_structure()
        except (OSError, ValueError) as e:  # a corrupt chunk met by the scans themselves
            ds.close()
            raise DatasetError(str(e)) from None
        if problems:
            ds.close()
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise DatasetError(f"{p}: dataset fails verification: " + "; ".join(problems[:5]) + more
                               + f"; run `ooc verify {p}` and re-create it from its sources")
    except BaseException:
        lock.release()
        raise
    return ReadAccess(ds, lock)
