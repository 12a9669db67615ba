"""The LMDB catalog of a dataset: manifest, per-chunk checksums and (later) the external id map.

Keys (bytes) and values (JSON unless noted):

- ``manifest`` -- format version, counts, dtypes, array records, source files and their sha256.
- ``checksums/<array>`` -- ``{chunk_key: blake2b-128 hex}`` for every chunk file of ``<array>``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lmdb

__all__ = ["Catalog", "FORMAT_VERSION"]

FORMAT_VERSION = 1
_MAP_SIZE = 1 << 36  # 64 GiB of address space; the file grows only as needed


class Catalog:
    """A small key/value catalog in an LMDB environment (``<dataset>/catalog.lmdb``).

    Args:
        path: directory of the LMDB environment.
        readonly: open without write access (the default for readers; no lock file is written).

    Raises:
        FileNotFoundError: ``readonly`` and the environment does not exist.
    """

    def __init__(self, path: str | os.PathLike, readonly: bool = True) -> None:
        self.path = Path(path)
        if readonly and not (self.path / "data.mdb").exists():
            raise FileNotFoundError(f"{self.path}: LMDB catalog missing (not an ooc dataset?)")
        self.env = lmdb.open(str(self.path), map_size=_MAP_SIZE, subdir=True, readonly=readonly,
                             lock=not readonly, readahead=False, max_dbs=4)

    def put_json(self, key: str, value: Any) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(key.encode(), json.dumps(value, sort_keys=True).encode())

    def put_many_json(self, items: dict[str, Any]) -> None:
        with self.env.begin(write=True) as txn:
            for key, value in items.items():
                txn.put(key.encode(), json.dumps(value, sort_keys=True).encode())

    def get_json(self, key: str, default: Any = None) -> Any:
        with self.env.begin() as txn:
            raw = txn.get(key.encode())
        return default if raw is None else json.loads(raw)

    def keys(self, prefix: str = "") -> list[str]:
        out = []
        with self.env.begin() as txn:
            cur = txn.cursor()
            if cur.set_range(prefix.encode()):
                for k in cur.iternext(keys=True, values=False):
                    ks = k.decode()
                    if not ks.startswith(prefix):
                        break
                    out.append(ks)
        return out

    def sync(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> "Catalog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
