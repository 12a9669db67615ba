"""Train / validation / test splits: split files (text, ``.npy``, ``.npz`` members, pickled LINKX
split lists) and random splits drawn at conversion (optionally stratified by class).

A split file is named ``FILE`` or ``FILE:MEMBER``:

- text (ids in column 0, one per line), ``.npy`` ids or a boolean mask [N];
- ``FILE.npz:MEMBER`` -- one member of an ``.npz`` (ids or a boolean mask), e.g. ``masks.npz:train_mask``;
- ``FILE.npy:INDEX`` -- a pickled object array of dicts ``{"train", "valid", "test"}`` (LINKX's
  ``*-splits.npy``): entry INDEX, the dict key of the split being read (``valid`` also as ``val``).
  The pickle is read with the Planetoid reader's restricted unpickler (plain containers and NumPy
  arrays only), so a crafted file cannot run code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ooc.ingest.planetoid import PlanetoidError, restricted_load
from ooc.ingest.readers import InputError, TextTable, load_array
from ooc.storage.dataset import SPLITS

__all__ = ["SPLITS", "split_spec", "read_split", "load_pickled_npy", "random_split",
           "parse_fractions"]

_KEYS = {"train": ("train", "train_idx", "train_mask"), "valid": ("valid", "val", "validation",
                                                                "valid_idx", "val_idx", "val_mask"),
         "test": ("test", "test_idx", "test_mask")}


def split_spec(spec: str | Path) -> tuple[Path, str | None]:
    """``"masks.npz:train_mask"`` -> ``(Path("masks.npz"), "train_mask")``; a path that exists as
    given (even with a colon in its name) has no member."""
    text = str(spec)
    if Path(text).exists() or ":" not in text:
        return Path(text), None
    path, member = text.rsplit(":", 1)
    return Path(path), member


def load_pickled_npy(path: Path) -> object:
    """The object stored in a pickled ``.npy`` (an object array), read with the restricted unpickler.

    Raises:
        InputError: not a ``.npy``, not an object array, or a pickle that is malformed or names a
            global other than NumPy arrays and plain containers (never imported).
    """
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, _fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
    except (ValueError, OSError) as e:
        raise InputError(f"{path}: not a readable .npy file ({e})") from None
    if not dtype.hasobject:
        raise InputError(f"{path}: a {dtype} array of shape {shape}, not a pickled object array")
    try:
        obj = restricted_load(path, offset)
    except PlanetoidError as e:
        raise InputError(f"{e} (pickled splits may hold only dicts, lists and NumPy arrays)") from None
    return obj


def _split_from_pickle(path: Path, member: str | None, name: str) -> np.ndarray:
    obj = load_pickled_npy(path)
    arr = np.asarray(obj, dtype=object)
    if member is None:
        if arr.ndim != 0:
            raise InputError(f"{path}: holds {arr.shape[0] if arr.ndim else 1} splits; name one as "
                             f"{path}:INDEX (0 .. {len(arr) - 1})")
        entry = arr.item()
    else:
        if not member.lstrip("-").isdigit():
            raise InputError(f"{path}: {member!r} is not an index into the pickled split list")
        i = int(member)
        if arr.ndim != 1 or not -arr.shape[0] <= i < arr.shape[0]:
            raise InputError(f"{path}: no split {i} (the file holds {arr.size})")
        entry = arr[i]
    if not isinstance(entry, dict):
        raise InputError(f"{path}:{member}: expected a dict {{train, valid, test}}, found "
                         f"{type(entry).__name__}")
    for key in _KEYS[name]:
        if key in entry:
            return np.asarray(entry[key])
    raise InputError(f"{path}:{member}: no {name} entry (keys {sorted(map(str, entry))})")


def read_split(spec: str | Path, name: str, num_nodes: int,
               resolve: Callable[[np.ndarray, Callable[[int], str]], np.ndarray],
               block_bytes: int = 16 << 20) -> np.ndarray:
    """Internal node ids of split ``name`` from ``spec`` (``FILE`` or ``FILE:MEMBER``, see the module).

    Args:
        spec: the split file, optionally with a member.
        name: ``train``, ``valid`` or ``test`` (the dict key read from a pickled split list).
        num_nodes: N (boolean masks must have N entries).
        resolve: maps external integer ids to internal ones (``resolve(ids, where)``; ``where(i)``
            names row i in errors), as the converter maps edge-list ids.

    Returns:
        int64 internal ids (unsorted, as given).

    Raises:
        InputError: unreadable file, missing member, a mask of the wrong length, ids that are not
            integers or not nodes (file and row or line named).
    """
    p, member = split_spec(spec)
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    where_name = f"{p}:{member}" if member is not None else str(p)
    if p.suffix == ".npy" and _is_object_npy(p):
        arr = _split_from_pickle(p, member, name)
        where_name = f"{p}:{member}[{name}]" if member is not None else f"{p}[{name}]"
    elif p.suffix in (".npy", ".npz"):
        if p.suffix == ".npy" and member is not None:
            raise InputError(f"{p}: a plain .npy has no members (got :{member})")
        arr = np.asarray(load_array(p, key=member, mmap=False))
    else:
        t = TextTable(p, [0], ["int"], header="auto", block_bytes=block_bytes)
        blk = t.read_all()
        return resolve(blk.ints[:, 0], lambda i, L=blk.lines: f"{p}:{L[i]}")
    if arr.dtype == bool:
        if arr.shape != (num_nodes,):
            raise InputError(f"{where_name}: boolean mask of shape {arr.shape}, expected ({num_nodes},)")
        return np.flatnonzero(arr).astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise InputError(f"{where_name}: split ids of dtype {arr.dtype}, expected integers or a "
                         "boolean mask")
    return resolve(arr.reshape(-1).astype(np.int64), lambda i: f"{where_name}: row {i}")


def _is_object_npy(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            version = np.lib.format.read_magic(f)
            hdr = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                   else np.lib.format.read_array_header_2_0(f))
    except (ValueError, OSError):
        return False
    return bool(hdr[2].hasobject)


# ---------------------------------------------------------------------------- random splits
def parse_fractions(text: str) -> tuple[float, float, float]:
    """``"0.6,0.2,0.2"`` -> (0.6, 0.2, 0.2).

    Raises:
        ValueError: not three fractions >= 0 with a sum <= 1.
    """
    try:
        fr = tuple(float(x) for x in str(text).split(","))
    except ValueError:
        fr = ()
    if len(fr) != 3 or any(not 0 <= f <= 1 for f in fr) or sum(fr) > 1 + 1e-9:
        raise ValueError(f"--split-random takes TRAIN,VALID,TEST fractions >= 0 with a sum <= 1, "
                         f"got {text!r}")
    return fr  # type: ignore[return-value]


def _apportion(quotas: np.ndarray, total: int, caps: np.ndarray | None = None) -> np.ndarray:
    """Integers summing to ``total``, each the floor or the ceiling of its quota (largest remainders
    first; ties to the lower index), never above ``caps``."""
    base = np.floor(quotas + 1e-9).astype(np.int64)
    if caps is not None:
        base = np.minimum(base, caps)
    rest = int(total - base.sum())
    if rest > 0:
        frac = quotas - base
        if caps is not None:
            frac = np.where(base < caps, frac, -np.inf)
        order = np.lexsort((np.arange(quotas.shape[0]), -frac))
        base[order[:rest]] += 1
    return base


def random_split(labels: np.ndarray, fractions: Sequence[float], seed: int = 0,
                 stratify: bool = False) -> tuple[dict[str, np.ndarray], dict]:
    """Draw disjoint train / validation / test sets from the labelled nodes (``labels >= 0``).

    Split sizes are the fractions of the L labelled nodes rounded by largest remainders, so each
    is within one node of ``fraction * L`` and together they take ``round(sum * L)`` nodes.  With
    ``stratify`` every split's nodes of class c number (to within two nodes) its fraction of
    class c (measured worst case 1.55 nodes): each class's share of a split is apportioned the same
    way, split after split.
    The nodes are a pure function of (labels, fractions, seed, stratify).

    Args:
        labels: int [N], -1 = unlabelled.
        fractions: (train, valid, test), each >= 0, sum <= 1.
        seed: random seed (``numpy.random.default_rng``).
        stratify: keep class proportions in every split.

    Returns:
        ``({"train"|"valid"|"test": sorted int64 node ids}, record)``; the record (for the
        manifest) holds the fractions, seed, stratify flag and counts.

    Raises:
        ValueError: no labelled node.
    """
    labels = np.asarray(labels)
    pool = np.flatnonzero(labels >= 0)
    n = int(pool.shape[0])
    if n == 0:
        raise ValueError("--split-random draws from the labelled nodes, and no node has a label "
                         "(pass --labels)")
    fr = np.asarray(fractions, dtype=np.float64)
    total = min(int(np.floor(fr.sum() * n + 0.5)), n)
    counts = _apportion(fr * n, total)
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    if not stratify:
        perm = pool[rng.permutation(n)]
        a = 0
        for name, c in zip(SPLITS, counts.tolist()):
            out[name] = np.sort(perm[a:a + c])
            a += c
    else:
        classes, cls_count = np.unique(labels[pool], return_counts=True)
        members = [pool[labels[pool] == c] for c in classes]
        members = [m[rng.permutation(m.shape[0])] for m in members]
        left = cls_count.astype(np.int64).copy()
        taken = np.zeros_like(left)
        for name, c in zip(SPLITS, counts.tolist()):
            avail = int(left.sum())
            share = _apportion(left * (c / avail) if avail else left * 0.0, c, caps=left)
            out[name] = np.sort(np.concatenate([m[t:t + k] for m, t, k in
                                                zip(members, taken.tolist(), share.tolist())]))
            taken += share
            left -= share
    record = {"kind": "random", "fractions": [float(f) for f in fr], "seed": int(seed),
              "stratify": bool(stratify), "labelled_nodes": n,
              "counts": {k: int(v.shape[0]) for k, v in out.items()}}
    return {k: v.astype(np.int64) for k, v in out.items()}, record
