"""The external-id map of a dataset, stored in its LMDB catalog.

Inputs whose node ids are not ``0..N-1`` (sparse 64-bit integers, strings) are renumbered densely.
The catalog holds both directions in two named LMDB databases:

- ``idmap.fwd``: external id -> internal id
- ``idmap.rev``: internal id (8-byte big-endian) -> external id

Integer ids are keyed by their 8-byte big-endian encoding with the sign bit flipped, so LMDB's byte
order is the integers' order; internal ids are assigned in that order (order-preserving: ``a < b``
externally iff ``map(a) < map(b)``).  String ids are UTF-8 keys and numbered in byte order.  Both
maps are written with LMDB's append mode (keys arrive sorted), which is fast and compact.

Typed nodes (``--node-types user:3,item:4``) need no LMDB map: internal id = type offset + local id,
and the offsets live in the manifest (``node_types``); :class:`IdMap` answers for them too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import lmdb
import numpy as np

from ooc.storage.catalog import open_env

__all__ = ["IdMap", "write_int_id_map", "write_str_id_map", "encode_int_keys", "FWD_DB", "REV_DB"]

FWD_DB = b"idmap.fwd"
REV_DB = b"idmap.rev"
_MAP_SIZE = 1 << 40
_SIGN = np.uint64(1 << 63)


def encode_int_keys(ids: np.ndarray) -> np.ndarray:
    """int64 [n] -> uint8 [n, 8]: big-endian bytes of ``id XOR 2^63`` (byte order = integer order)."""
    u = np.asarray(ids, dtype=np.int64).view(np.uint64) ^ _SIGN
    return u.astype(">u8").view(np.uint8).reshape(-1, 8)


def _encode_internal(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=">u8").view(np.uint8).reshape(-1, 8)


def _open(path: Path, readonly: bool) -> lmdb.Environment:
    return open_env(path, readonly, map_size=_MAP_SIZE, lock=not readonly, readahead=False,
                    max_dbs=4)


def write_int_id_map(catalog_path: str | os.PathLike, sorted_ids: np.ndarray,
                     batch: int = 1 << 20) -> None:
    """Store the map of sorted, distinct int64 external ids (internal id = position).

    Args:
        catalog_path: the dataset's ``catalog.lmdb`` directory (created if needed).
        sorted_ids: int64 [N] ascending distinct external ids (may be a memory map).
    """
    env = _open(Path(catalog_path), readonly=False)
    try:
        fwd = env.open_db(FWD_DB)
        rev = env.open_db(REV_DB)
        n = sorted_ids.shape[0]
        for a in range(0, n, batch):
            b = min(a + batch, n)
            ext = encode_int_keys(np.asarray(sorted_ids[a:b]))
            internal = _encode_internal(a, b - a)
            ext_b = [bytes(r) for r in ext]
            int_b = [bytes(r) for r in internal]
            with env.begin(write=True) as txn:
                txn.cursor(fwd).putmulti(zip(ext_b, int_b), append=True)
                txn.cursor(rev).putmulti(zip(int_b, ext_b), append=True)
        env.sync(True)
    finally:
        env.close()


def write_str_id_map(catalog_path: str | os.PathLike, sorted_keys: Iterable[bytes],
                     batch: int = 1 << 18) -> int:
    """Store the map of sorted, distinct byte-string ids (internal id = position); returns N."""
    env = _open(Path(catalog_path), readonly=False)
    n = 0
    try:
        fwd = env.open_db(FWD_DB)
        rev = env.open_db(REV_DB)
        buf: list[bytes] = []

        def flush() -> None:
            nonlocal n
            internal = [bytes(r) for r in _encode_internal(n, len(buf))]
            with env.begin(write=True) as txn:
                txn.cursor(fwd).putmulti(zip(buf, internal), append=True)
                txn.cursor(rev).putmulti(zip(internal, buf), append=True)
            n += len(buf)
            buf.clear()

        for k in sorted_keys:
            buf.append(k)
            if len(buf) >= batch:
                flush()
        if buf:
            flush()
        env.sync(True)
    finally:
        env.close()
    return n


class IdMap:
    """Read the external-id map of a dataset.

    Args:
        dataset_path: the dataset directory.
        manifest: its manifest (``id_map`` record: ``{"kind": "int64"|"string"|"typed", ...}``).

    Raises:
        KeyError: the dataset has no id map.
    """

    def __init__(self, dataset_path: str | os.PathLike, manifest: dict) -> None:
        rec = manifest.get("id_map")
        if not rec:
            raise KeyError(f"{dataset_path}: dataset has dense ids (no id map)")
        self.kind: str = rec["kind"]
        self.num_nodes = int(manifest["num_nodes"])
        self.types: list[dict] = manifest.get("node_types", [])
        self._env = None
        if self.kind in ("int64", "string"):
            self._env = _open(Path(dataset_path) / "catalog.lmdb", readonly=True)
            self._fwd = self._env.open_db(FWD_DB, create=False)
            self._rev = self._env.open_db(REV_DB, create=False)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def __enter__(self) -> "IdMap":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_internal(self, ids: Sequence) -> np.ndarray:
        """External ids -> int64 internal ids.

        ``ids``: int64 values (kind ``int64``), str/bytes (``string``) or ``(type, local)`` pairs
        (``typed``).

        Raises:
            KeyError: an id is not in the map.
        """
        out = np.empty(len(ids), dtype=np.int64)
        if self.kind == "typed":
            by_name = {t["name"]: t for t in self.types}
            for i, (t, local) in enumerate(ids):
                rec = by_name.get(t)
                if rec is None or not 0 <= int(local) < rec["count"]:
                    raise KeyError(f"typed id ({t!r}, {local}) not in the map")
                out[i] = rec["offset"] + int(local)
            return out
        if self.kind == "int64":
            keys = [bytes(r) for r in encode_int_keys(np.asarray(ids, dtype=np.int64))]
        else:
            keys = [k if isinstance(k, bytes) else str(k).encode() for k in ids]
        with self._env.begin(db=self._fwd) as txn:  # type: ignore[union-attr]
            for i, k in enumerate(keys):
                v = txn.get(k)
                if v is None:
                    raise KeyError(f"external id {ids[i]!r} not in the map")
                out[i] = int.from_bytes(v, "big")
        return out

    def to_external(self, internal: Sequence[int]) -> list:
        """Internal ids -> external ids (int, str, or ``(type, local)`` for typed nodes).

        Raises:
            KeyError: an internal id is outside ``[0, N)``.
        """
        ids = [int(v) for v in internal]
        for v in ids:
            if not 0 <= v < self.num_nodes:
                raise KeyError(f"internal id {v} outside [0, {self.num_nodes})")
        if self.kind == "typed":
            offs = [t["offset"] for t in self.types]
            out = []
            for v in ids:
                t = int(np.searchsorted(offs, v, side="right")) - 1
                out.append((self.types[t]["name"], v - offs[t]))
            return out
        res = []
        with self._env.begin(db=self._rev) as txn:  # type: ignore[union-attr]
            for v in ids:
                raw = txn.get(int(v).to_bytes(8, "big"))
                if self.kind == "int64":
                    u = int.from_bytes(raw, "big") ^ (1 << 63)
                    res.append(u - (1 << 64) if u >= 1 << 63 else u)
                else:
                    res.append(raw.decode())
        return res

    def iter_items(self) -> Iterator[tuple[bytes, int]]:
        """(encoded external key, internal id) in key order (for checks)."""
        with self._env.begin(db=self._fwd) as txn:  # type: ignore[union-attr]
            for k, v in txn.cursor():
                yield k, int.from_bytes(v, "big")
