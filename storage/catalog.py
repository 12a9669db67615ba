"""The LMDB catalog of a dataset: manifest, per-chunk checksums and (later) the external id map.

Keys (bytes) and values (JSON unless noted):

- ``manifest`` -- format version, counts, dtypes, array records, source files and their sha256.
- ``checksums/<array>`` -- ``{chunk_key: blake2b-128 hex}`` for every chunk file of ``<array>``.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import lmdb

__all__ = ["Catalog", "FORMAT_VERSION", "open_env"]

FORMAT_VERSION = 1
_MAP_SIZE = 1 << 36  # 64 GiB of address space; the file grows only as needed
#: LMDB's meta page (lmdb.h, 64-bit builds): after the 16-byte page header, ``mm_magic`` (u32) at
#: byte 16 and the page size (``mm_psize``, the free DB's ``md_pad``, u32) at byte 40
_META_MAGIC = 0xBEEFC0DE


def open_env(path: str | os.PathLike, readonly: bool, **kw: Any) -> lmdb.Environment:
    """``lmdb.open(path, subdir=True, readonly=readonly, **kw)`` of an environment whose
    ``data.mdb`` is first checked to hold every page its meta pages name: LMDB maps the file and
    a page past a truncated file's end is a SIGBUS when read (the process dies with no message).

    Raises:
        OSError: ``data.mdb`` shorter than its two meta pages or than ``(last_pgno + 1) x psize``
            (naming the file and both sizes), or not an LMDB file.
        lmdb.Error: what ``lmdb.open`` raises.
    """
    data = Path(path) / "data.mdb"
    size = data.stat().st_size if data.exists() else 0
    if size:  # an empty or missing file: LMDB's own error (or a new environment)
        with open(data, "rb") as f:
            head = f.read(44)
        magic, psize = (struct.unpack_from("<I", head, 16)[0], struct.unpack_from("<I", head, 40)[0]) \
            if len(head) == 44 else (0, 0)
        if magic != _META_MAGIC or psize < 512:
            raise OSError(f"{data}: not an LMDB data file (bad meta page)")
        if size < 2 * psize:
            raise OSError(f"{data}: truncated ({size:,} bytes, shorter than its two {psize}-byte meta "
                          "pages)")
    env = lmdb.open(str(path), subdir=True, readonly=readonly, **kw)
    if size:
        need = (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
        if size < need:
            env.close()
            raise OSError(f"{data}: truncated ({size:,} bytes; its pages need {need:,})")
    return env


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
        self.env = open_env(self.path, readonly, map_size=_MAP_SIZE, lock=not readonly,
                            readahead=False, max_dbs=4)

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
