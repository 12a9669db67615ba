"""Reader of the Planetoid raw files (``ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}``).

Yang, Cohen & Salakhutdinov, "Revisiting semi-supervised learning with graph embeddings", ICML'16;
the split conventions follow Kipf & Welling's ``gcn/utils.py`` and PyG's ``read_planetoid_data``:
train = the first ``len(y)`` nodes, validation = the next 500, test = the ids in ``test.index``;
CiteSeer's isolated test ids get zero feature rows and label -1.

The ``x/tx/allx/y/ty/ally/graph`` files are Python 2 pickles.  They are read with a restricted
unpickler that admits only the handful of classes they contain and maps them to inert stand-ins
(no scipy import, no arbitrary code): ``numpy.ndarray``/``dtype`` reconstruction, a placeholder for
``scipy.sparse.csr_matrix`` that merely records its state, ``collections.defaultdict`` and ``list``.
"""

from __future__ import annotations

import collections
import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["PlanetoidData", "read_planetoid", "restricted_load", "PlanetoidError"]


class PlanetoidError(Exception):
    """A Planetoid raw file is missing, truncated or malformed (the message names the file)."""


class _CSRState:
    """Inert stand-in for a pickled ``scipy.sparse.csr_matrix``: stores the pickled state only."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.state: dict = {}

    def __setstate__(self, state: dict) -> None:
        self.state = dict(state)

    def to_dense(self, dtype: np.dtype = np.float32) -> np.ndarray:
        s = self.state
        shape = s.get("_shape") or s.get("shape")
        data, indices, indptr = s["data"], s["indices"], s["indptr"]
        if shape is None or len(indptr) != shape[0] + 1:
            raise ValueError("inconsistent CSR state")
        out = np.zeros(shape, dtype=dtype)
        rows = np.repeat(np.arange(shape[0]), np.diff(indptr))
        out[rows, indices] = data
        return out


def _np_reconstruct(subtype: object, shape: object, dtype: object) -> np.ndarray:
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError("only numpy.ndarray may be reconstructed")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("scipy.sparse.csr", "csr_matrix"): _CSRState,
    ("scipy.sparse._csr", "csr_matrix"): _CSRState,
    ("collections", "defaultdict"): collections.defaultdict,
    ("__builtin__", "list"): list,
    ("builtins", "list"): list,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed") from None


def restricted_load(path: str | Path, offset: int = 0) -> object:
    """Unpickle a file admitting only plain containers (dict, list, tuple, defaultdict), numpy arrays
    and dtypes, and CSR state: Planetoid raw files, and pickled ``.npy`` object arrays (the pickle
    after the header at ``offset``, e.g. LINKX split files).  No other global is ever imported, so
    a pickle cannot run code.

    Raises:
        PlanetoidError: missing file, truncated or malformed pickle, or a forbidden global.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        raise PlanetoidError(f"{p}: missing Planetoid raw file") from None
    if not data:
        raise PlanetoidError(f"{p}: empty file")
    try:
        return _RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError) as e:
        raise PlanetoidError(f"{p}: truncated or malformed pickle ({type(e).__name__}: {e})") from None


@dataclass
class PlanetoidData:
    """A Planetoid graph in memory (small by construction: Cora, CiteSeer, PubMed).

    Attributes:
        features: float32 [N, D]; labels: int32 [N] (-1 unlabelled);
        src, dst: int64 [E] directed edges, symmetric, no self-loops, no duplicates;
        train, valid, test: int64 sorted node ids; files: the raw files read.
    """

    features: np.ndarray
    labels: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    num_classes: int
    files: list[Path]


def _dense(obj: object, path: Path) -> np.ndarray:
    if isinstance(obj, _CSRState):
        try:
            return obj.to_dense()
        except (KeyError, ValueError, IndexError) as e:
            raise PlanetoidError(f"{path}: malformed sparse matrix ({e})") from None
    if isinstance(obj, np.ndarray):
        return obj.astype(np.float32)
    raise PlanetoidError(f"{path}: expected a matrix, found {type(obj).__name__}")


def read_planetoid(raw_dir: str | Path, name: str) -> PlanetoidData:
    """Read ``ind.<name>.*`` from ``raw_dir``.

    Raises:
        PlanetoidError: any file missing, truncated or inconsistent (the message names the file).
    """
    raw = Path(raw_dir)
    f = {k: raw / f"ind.{name}.{k}" for k in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")}
    for k, p in f.items():
        if not p.is_file():
            raise PlanetoidError(f"{p}: missing Planetoid raw file")
    tx = _dense(restricted_load(f["tx"]), f["tx"])
    allx = _dense(restricted_load(f["allx"]), f["allx"])
    x = _dense(restricted_load(f["x"]), f["x"])
    y = np.asarray(restricted_load(f["y"]))
    ty = np.asarray(restricted_load(f["ty"]))
    ally = np.asarray(restricted_load(f["ally"]))
    graph = restricted_load(f["graph"])
    if not isinstance(graph, dict):
        raise PlanetoidError(f"{f['graph']}: expected an adjacency dict, found {type(graph).__name__}")
    try:
        lines = f["test.index"].read_text().split()
        test_idx = np.array([int(s) for s in lines], dtype=np.int64)
    except ValueError as e:
        raise PlanetoidError(f"{f['test.index']}: malformed line ({e})") from None
    if test_idx.size == 0:
        raise PlanetoidError(f"{f['test.index']}: empty file")
    for a, p, rows in ((ty, f["ty"], tx.shape[0]), (ally, f["ally"], allx.shape[0]),
                       (y, f["y"], x.shape[0])):
        if a.ndim != 2 or a.shape[0] != rows:
            raise PlanetoidError(f"{p}: {a.shape[0] if a.ndim else 0} label rows, expected {rows}")
    if tx.shape[0] != test_idx.shape[0]:
        raise PlanetoidError(f"{f['test.index']}: {test_idx.shape[0]} ids for {tx.shape[0]} rows of "
                             f"{f['tx'].name}")
    test_sorted = np.sort(test_idx)
    lo, hi = int(test_sorted[0]), int(test_sorted[-1])
    # CiteSeer: some test ids are absent (isolated nodes); pad with zero rows / no label
    full = hi - lo + 1
    tx_ext = np.zeros((full, tx.shape[1]), dtype=np.float32)
    tx_ext[test_sorted - lo] = tx
    ty_ext = np.zeros((full, ty.shape[1]), dtype=ty.dtype)
    ty_ext[test_sorted - lo] = ty
    feats = np.vstack([allx, tx_ext]).astype(np.float32)
    onehot = np.vstack([ally, ty_ext])
    num_nodes = feats.shape[0]
    if lo != allx.shape[0]:
        raise PlanetoidError(f"{f['test.index']}: smallest test id {lo}, expected {allx.shape[0]} "
                             f"(= rows of {f['allx'].name})")
    # reorder: the test rows are stored in sorted order, the ids in test.index say where they go
    feats[test_idx] = feats[test_sorted]
    onehot[test_idx] = onehot[test_sorted]
    labels = np.where(onehot.sum(1) > 0, onehot.argmax(1), -1).astype(np.int32)
    src, dst = [], []
    for u, nbrs in graph.items():
        for v in nbrs:
            src.append(u)
            dst.append(v)
    src_a = np.array(src, dtype=np.int64)
    dst_a = np.array(dst, dtype=np.int64)
    if src_a.size and (min(src_a.min(), dst_a.min()) < 0 or max(src_a.max(), dst_a.max()) >= num_nodes):
        raise PlanetoidError(f"{f['graph']}: node id outside [0, {num_nodes})")
    # symmetrise, drop self-loops and duplicates (as PyG does)
    s = np.concatenate([src_a, dst_a])
    d = np.concatenate([dst_a, src_a])
    keep = s != d
    pairs = np.unique(np.stack([s[keep], d[keep]], axis=1), axis=0)
    n_train = y.shape[0]
    train = np.arange(n_train, dtype=np.int64)
    valid = np.arange(n_train, n_train + 500, dtype=np.int64)
    test = test_sorted
    return PlanetoidData(features=feats, labels=labels, src=pairs[:, 0].copy(), dst=pairs[:, 1].copy(),
                         train=train, valid=valid, test=test, num_classes=int(onehot.shape[1]),
                         files=list(f.values()))
