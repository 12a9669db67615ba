"""Data verified on read: chunk checksums on first use, structural scans when a dataset is opened.

Chunk checksums.  Every chunk file of a dataset has a blake2b-128 digest in the catalog
(``checksums/<array>``).  When a dataset is read with verification ``"checksums"`` (the default of
``ooc train`` / ``eval`` / ``predict``, and of ``partition`` / ``compress`` for their source),
each :class:`~ooc.storage.rawarray.RawArray` it hands out carries a :class:`ChunkVerifier`, and
every read path -- ``RawArray.read`` / ``gather`` / ``mmap``, ``DiskRows.read_range_async`` /
``gather`` and ``NeighborReader.read`` (the partition buffer, row gathers and out-of-core
topology) -- first checks the chunks it touches.  Each chunk is checked **once per process**, the
first time any of its bytes is used: the whole chunk file is read and hashed (one extra read of
the file, from the page cache when the read that follows is buffered) and the chunk is marked
good; later reads of it cost one array lookup.  Several chunks met at once (a partition load) are
read and hashed on a pool of threads, one per core.  ``mmap()`` (the sampler's mapped topology) checks
every chunk when the map is made, since page faults cannot be intercepted.  A chunk that fails is
a :class:`CorruptChunkError` naming the array, the chunk and its file.  With verification
``"structure"`` only the structural scans run.

The verified state is keyed by the array directory and its ``zarr.json`` (inode and mtime), so a
dataset rewritten in place (``ooc partition``) is verified afresh.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Iterable

import numpy as np

__all__ = ["CorruptChunkError", "ChunkVerifier", "VERIFY_MODES", "set_read_verification",
           "read_verification", "verifier_for"]

#: Verification of data on read: ``checksums`` (chunk checksums on first use and structural scans
#: at open) or ``structure`` (structural scans at open only).
VERIFY_MODES = ("checksums", "structure")
_MODE = "none"
_HASH_BLOCK = 256 << 10


def set_read_verification(mode: str) -> None:
    """Set this process's default verification of datasets opened for reading (see
    :data:`VERIFY_MODES`; ``"none"``, the library default, checks no chunk).  The commands that read
    a dataset set it for their duration: ``ooc train`` / ``eval`` / ``predict`` to their
    ``--verify`` (``checksums`` unless told otherwise); ``partition`` and ``compress`` open their
    source with ``checksums``.

    Raises:
        ValueError: unknown mode.
    """
    global _MODE
    if mode not in VERIFY_MODES + ("none",):
        raise ValueError(f"--verify must be one of {', '.join(VERIFY_MODES)}, got {mode!r}")
    _MODE = mode


def read_verification() -> str:
    """This process's default verification mode (``none`` unless set)."""
    return _MODE


class CorruptChunkError(OSError):
    """A chunk file does not match its checksum (the dataset is corrupt).

    Subclass of OSError so that every reader's error handling (and the CLI's clean one-line
    error) applies; :attr:`array`, :attr:`chunk` and :attr:`file` name the chunk.
    """

    def __init__(self, dataset: Path, array: str, chunk: str, file: Path, why: str) -> None:
        self.array, self.chunk, self.file = array, chunk, file
        super().__init__(f"{dataset}: array {array} chunk {chunk} ({file}) {why}; the dataset is "
                         f"corrupt: run `ooc verify {dataset}` and re-create it from its sources")


class ChunkVerifier:
    """Check the chunks of one array against their catalog digests, each once per process.

    Args:
        dataset: dataset directory (for messages).
        array: the array's Zarr path, e.g. ``topology/indices``.
        path: the array directory.
        num_chunks, chunk_key: the array's chunk count and ``i -> "c/i/0"`` key function.
        checksums: ``{chunk_key: blake2b-128 hex}`` from the catalog.

    Thread-safe: concurrent readers of one chunk hash it once (the others wait for the result).
    """

    def __init__(self, dataset: Path, array: str, path: Path, num_chunks: int, chunk_key,
                 checksums: dict[str, str]) -> None:
        self.dataset, self.array, self.path = Path(dataset), array, Path(path)
        self.num_chunks = num_chunks
        self.keys = [chunk_key(i) for i in range(num_chunks)]
        self.expected = [checksums.get(k) for k in self.keys]
        self.done = np.zeros(num_chunks, dtype=np.bool_)
        self.complete = num_chunks == 0
        self._locks = [threading.Lock() for _ in range(num_chunks)]
        self.bytes_hashed = 0

    def _check(self, i: int) -> None:
        with self._locks[i]:
            if self.done[i]:
                return
            key, file = self.keys[i], self.path / self.keys[i]
            want = self.expected[i]
            if want is None:
                raise CorruptChunkError(self.dataset, self.array, key, file,
                                        "has no checksum in the catalog")
            h = hashlib.blake2b(digest_size=16)
            try:
                fd = os.open(file, os.O_RDONLY)
            except FileNotFoundError:
                raise CorruptChunkError(self.dataset, self.array, key, file, "is missing") from None
            buf = memoryview(bytearray(_HASH_BLOCK))  # small: verification runs inside budgets
            try:
                off = 0
                while True:
                    got = os.preadv(fd, [buf], off)
                    if not got:
                        break
                    h.update(buf[:got])
                    off += got
            finally:
                os.close(fd)
            self.bytes_hashed += off
            if h.hexdigest() != want:
                raise CorruptChunkError(self.dataset, self.array, key, file,
                                        "fails its blake2b checksum")
            self.done[i] = True

    def ensure(self, chunks: Iterable[int] | np.ndarray) -> None:
        """Verify chunks ``chunks`` (indices; repeats and verified ones cost nothing).

        Raises:
            CorruptChunkError: a chunk is missing, has no digest or fails it.
        """
        if self.complete:
            return
        c = np.asarray(chunks, dtype=np.int64).reshape(-1)
        if c.size == 0:
            return
        todo = c[~self.done[np.clip(c, 0, max(self.num_chunks - 1, 0))]]
        todo = [int(i) for i in np.unique(todo).tolist() if 0 <= i < self.num_chunks]
        if len(todo) > 1:  # hashlib releases the GIL: chunks are read and hashed in parallel
            for f in [_pool().submit(self._check, i) for i in todo]:
                f.result()
        elif todo:
            self._check(todo[0])
        if not self.complete and self.done.all():
            self.complete = True

    def ensure_rows(self, start: int, stop: int, chunk_rows: int) -> None:
        """Verify the chunks holding rows ``[start, stop)``."""
        if self.complete or stop <= start:
            return
        self.ensure(np.arange(start // chunk_rows, (stop - 1) // chunk_rows + 1))

    def ensure_bytes(self, start: int, stop: int, chunk_bytes: int) -> None:
        """Verify the chunks holding bytes ``[start, stop)`` of the stitched chunk files."""
        if self.complete or stop <= start:
            return
        self.ensure(np.arange(start // chunk_bytes, (stop - 1) // chunk_bytes + 1))

    def ensure_all(self) -> None:
        """Verify every chunk."""
        if not self.complete:
            self.ensure(np.arange(self.num_chunks))


_POOL = None
_POOL_LOCK = threading.Lock()


def _pool():
    """The process's verification threads (one per core, at most 8)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from concurrent.futures import ThreadPoolExecutor
            _POOL = ThreadPoolExecutor(min(os.cpu_count() or 2, 8), thread_name_prefix="ooc-verify")
        return _POOL


_REGISTRY: dict[tuple, ChunkVerifier] = {}
_REG_LOCK = threading.Lock()


def verifier_for(dataset: Path, array: str, path: Path, num_chunks: int, chunk_key,
                 checksums: dict[str, str]) -> ChunkVerifier:
    """The process-wide :class:`ChunkVerifier` of an array (one per array directory and version of
    its ``zarr.json``, so chunks verified by one reader count for every other)."""
    try:
        st = os.stat(Path(path) / "zarr.json")
        ident = (os.path.realpath(path), st.st_ino, st.st_mtime_ns)
    except OSError:
        ident = (os.path.realpath(path), 0, 0)
    with _REG_LOCK:
        v = _REGISTRY.get(ident)
        if v is None or v.expected != [checksums.get(k) for k in v.keys]:
            v = _REGISTRY[ident] = ChunkVerifier(dataset, array, path, num_chunks, chunk_key,
                                                 checksums)
        return v
