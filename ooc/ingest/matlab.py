"""``ooc convert matlab``: a MATLAB ``.mat`` file holding a sparse adjacency matrix and, optionally, a
node-attribute matrix (Facebook100 ``A`` + ``local_info``, and similar releases), read with
:func:`scipy.io.loadmat` (MATLAB formats v4 to v7.2; v7.3 files are HDF5 and refused with a message).

The file is read whole (the format is not streamable); the graph is then built by the streaming
converter.  ``A[i, j] != 0`` is the edge ``i -> j``; the attribute matrix has one row per node:

- integer attributes are categorical columns: column ``label_col`` becomes the label (0 = missing,
  -1; the other values are classes in increasing order, their values kept as class names), every
  other column is one-hot encoded over its non-zero values (0 = missing: an all-zero block);
- sparse or fractional attributes are stored as they are (``label_col`` does not apply).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from ooc.ingest.convert import GraphOptions, NodeInputs, _Job, _label_array, _max_key_id
from ooc.ingest.readers import InputError
from ooc.ingest.streaming import ArrayEdgeSource

__all__ = ["convert_matlab", "load_mat"]


def load_mat(path: Path) -> dict[str, object]:
    """The variables of a ``.mat`` file (``scipy.io.loadmat``), without MATLAB's ``__header__`` entries.

    Raises:
        InputError: scipy missing, a v7.3 (HDF5) file, or not a MATLAB file.
    """
    try:
        import scipy.io
    except ImportError:
        raise InputError(f"{path}: ooc convert matlab needs scipy (pip install 'ooc-gnn[matlab]')") from None
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        mat = scipy.io.loadmat(str(path))
    except NotImplementedError:
        raise InputError(f"{path}: a MATLAB v7.3 (HDF5) file, which scipy.io cannot read: save it "
                         "with save(..., '-v7') or export the matrices to .npy") from None
    except (ValueError, TypeError, OSError) as e:
        raise InputError(f"{path}: not a readable MATLAB file ({e})") from None
    return {k: v for k, v in mat.items() if not k.startswith("__")}


def _describe(mat: dict[str, object]) -> str:
    return ", ".join(f"{k} {getattr(v, 'shape', '?')}" for k, v in mat.items())


def _is_integral(a: np.ndarray) -> bool:
    if a.dtype.kind in "iub":
        return True
    return a.dtype.kind == "f" and bool(np.all(np.isfinite(a))) and bool(np.all(a == np.round(a)))


def convert_matlab(path: str | Path, out: str | Path, opts: GraphOptions | None = None,
                   nodes: NodeInputs | None = None, adjacency: str = "A",
                   attributes: str | None = None, label_col: int | None = None,
                   overwrite: bool = False) -> Path:
    """Convert a ``.mat`` adjacency (+ attributes) into a dataset.

    Args:
        path: the ``.mat`` file.
        adjacency: variable holding the N x N adjacency (sparse or dense).
        attributes: variable holding the N x K attribute matrix; default: the only other variable
            with N rows (none: no features unless ``nodes.features`` gives them).
        label_col: attribute column (0-based) holding the label (integer attributes only).
        nodes: further node inputs: split files, a label file, or features (``structural`` or a
            file) in place of the attributes.

    Returns:
        The dataset path.

    Raises:
        InputError: a missing or malformed variable (named), an unsupported combination.
    """
    opts = opts or GraphOptions()
    nodes = nodes or NodeInputs()
    p = Path(path)
    if opts.ids != "dense":
        raise InputError(f"{p}: matrix rows are node ids 0..N-1; --ids {opts.ids} does not apply")
    mat = load_mat(p)
    import scipy.sparse as sp
    if adjacency not in mat:
        raise InputError(f"{p}: no variable {adjacency!r} (has {_describe(mat)}); pass --adjacency")
    adj = mat[adjacency]
    if not (sp.issparse(adj) or isinstance(adj, np.ndarray)) or adj.ndim != 2 or \
            adj.shape[0] != adj.shape[1]:
        raise InputError(f"{p}: {adjacency} of shape {getattr(adj, 'shape', None)} is not a square "
                         "adjacency matrix")
    n = int(adj.shape[0])
    if opts.num_nodes is not None and opts.num_nodes != n:
        raise InputError(f"{p}: {adjacency} has {n} rows but --num-nodes {opts.num_nodes}")
    opts.num_nodes = n
    if attributes is None and nodes.features is None:
        cands = [k for k, v in mat.items() if k != adjacency and getattr(v, "ndim", 0) == 2 and
                 v.shape[0] == n and v.shape[1] != n]
        if len(cands) > 1:
            raise InputError(f"{p}: several attribute matrices ({', '.join(cands)}); pass --attributes")
        attributes = cands[0] if cands else None
    elif attributes is not None and nodes.features is not None:
        raise InputError(f"{p}: --attributes and --features both give features; pass one")
    if attributes is not None and attributes not in mat:
        raise InputError(f"{p}: no variable {attributes!r} (has {_describe(mat)})")
    if label_col is not None and attributes is None:
        raise InputError(f"{p}: --label-col needs an attribute matrix (--attributes)")
    if label_col is not None and nodes.labels is not None:
        raise InputError(f"{p}: --label-col and --labels both give labels; pass one")
    coo = sp.coo_matrix(adj)
    keep = coo.data != 0
    src, dst = coo.row[keep].astype(np.int64), coo.col[keep].astype(np.int64)
    del coo, adj
    job = _Job(out, opts, overwrite, "matlab")
    with job.w:
        job.w.add_source(p)
        job.manifest["matlab"] = {"adjacency": adjacency, "attributes": attributes,
                                  "label_col": label_col}
        feats = shape = labels_in = None
        if attributes is not None:
            feats, shape, labels_in = _attribute_inputs(job, p, attributes, mat[attributes], n,
                                                        label_col)
        else:
            table = job.json_features(nodes)
            _max_key_id(job, table)  # pass 1 of a JSON table: keys checked against N, layout found
            feats, shape = job.node_features(nodes, table, job.int_key_resolver(job.dense_ids))
        if nodes.labels is not None:
            if Path(nodes.labels).suffix in (".npy", ".npz"):
                labels_in = _label_array(job, nodes.labels)
            else:
                ids, lab, lines = job.read_label_table(nodes.labels, nodes.label_cols)
                labels_in = (job.dense_ids(ids, lambda i: f"{nodes.labels}:{int(lines[i])}"), lab)
            job.w.add_source(nodes.labels)
        split_ids = job.split_ids_from(nodes.splits, job.dense_ids)
        for f in nodes.split_files():
            job.w.add_source(f)
        source = ArrayEdgeSource(src, dst, None, opts.chunk_edges)
        return job.write_graph(source, p.stem, nodes, labels_in, feats, shape, split_ids)


def _attribute_inputs(job: _Job, p: Path, key: str, attr: object, n: int, label_col: int | None
                      ) -> tuple[Iterator[tuple[int, np.ndarray]], tuple[int, int],
                                 tuple[np.ndarray, np.ndarray] | None]:
    """Feature rows (one-hot or raw), their shape, and the labels (if ``label_col``)."""
    import scipy.sparse as sp
    job._feat_name = f"{p}:{key}"
    if getattr(attr, "ndim", 0) != 2 or attr.shape[0] != n:
        raise InputError(f"{p}: {key} of shape {getattr(attr, 'shape', None)}, expected ({n}, K)")
    step = 4096
    if sp.issparse(attr) or not _is_integral(np.asarray(attr)):
        if label_col is not None:
            raise InputError(f"{p}: --label-col reads a categorical column, but {key} is "
                             f"{'sparse' if sp.issparse(attr) else 'fractional'}")
        m = sp.csr_matrix(attr) if sp.issparse(attr) else np.asarray(attr)
        job.manifest["feature_source"] = {"kind": "matlab", "variable": key, "encoding": "as stored"}

        def raw() -> Iterator[tuple[int, np.ndarray]]:
            for a in range(0, n, step):
                blk = m[a:a + step]
                yield a, np.asarray(blk.toarray() if sp.issparse(blk) else blk, dtype=np.float32)
        return raw(), (n, int(attr.shape[1])), None
    a = np.asarray(attr).astype(np.int64)
    k = a.shape[1]
    labels_in = None
    if label_col is not None:
        if not 0 <= label_col < k:
            raise InputError(f"{p}: --label-col {label_col} outside the {k} columns of {key}")
        col = a[:, label_col]
        classes = np.unique(col[col != 0])
        lab = np.where(col != 0, np.searchsorted(classes, col), -1).astype(np.int64)
        labels_in = (np.arange(n, dtype=np.int64), lab)
        job.set_class_names([str(int(c)) for c in classes])
    cols = [c for c in range(k) if c != label_col]
    cats = [np.unique(a[:, c][a[:, c] != 0]) for c in cols]
    offsets = np.concatenate([[0], np.cumsum([c.shape[0] for c in cats])]).astype(np.int64)
    width = int(offsets[-1])
    job.manifest["feature_source"] = {
        "kind": "matlab", "variable": key, "encoding": "one-hot per column, 0 = missing",
        "columns": [{"column": c, "values": int(v.shape[0])} for c, v in zip(cols, cats)]}

    def onehot() -> Iterator[tuple[int, np.ndarray]]:
        for s in range(0, n, step):
            blk = a[s:s + step]
            out = np.zeros((blk.shape[0], width), dtype=np.float32)
            for j, (c, cat) in enumerate(zip(cols, cats)):
                v = blk[:, c]
                r = np.flatnonzero(v != 0)
                out[r, offsets[j] + np.searchsorted(cat, v[r])] = 1.0
            yield s, out
    return onehot(), (n, width), labels_in
