"""Minimal reader of the Geom-GCN text layout (Actor/film, WebKB), one dataset per split.

Written for the accuracy table before ``ooc convert geom-gcn`` (:func:`ooc.ingest.convert.convert_geom_gcn`)
read this layout, which is the converter to use now; nothing imports this module.  Layout (Pei et al., ICLR'20, ``new_data/<name>/``)::

    out1_node_feature_label.txt   header, then "node_id<TAB>f1,f2,...<TAB>label" (feature indices of a
                                  binary bag of words; WebKB rows hold the dense 0/1 vector instead)
    out1_graph_edges.txt          header, then "src<TAB>dst"
    <name>_split_0.6_0.2_<k>.npz  train_mask / val_mask / test_mask, uint8 [N] (48/32/20 despite the name)

Edges are symmetrised, self-loops and duplicates dropped (Actor: 26,659 undirected edges).

    python -m ooc.ingest.geomgcn --raw-dir ../shared/data/actor_film/geom_gcn \\
        --splits ../shared/data/actor_film/splits_geom_gcn --name film --out data/actor
    # -> data/actor/split0 ... data/actor/split9
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ooc.ingest.convert import write_graph_dataset

__all__ = ["read_geom_gcn", "convert_geom_gcn"]


def read_geom_gcn(raw_dir: str | Path) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read nodes, features, labels and edges.

    Returns:
        ``(N, src, dst, features float32 [N, D], labels int32 [N])`` with symmetrised, deduplicated
        edges without self-loops.

    Raises:
        ValueError: a malformed line (file and line number named) or non-contiguous node ids.
    """
    raw = Path(raw_dir)
    feat_file, edge_file = raw / "out1_node_feature_label.txt", raw / "out1_graph_edges.txt"
    ids, rows, labels = [], [], []
    with open(feat_file) as f:
        next(f)
        for ln, line in enumerate(f, start=2):
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                raise ValueError(f"{feat_file}:{ln}: expected 3 tab-separated fields")
            ids.append(int(parts[0]))
            rows.append([int(v) for v in parts[1].split(",") if v != ""])
            labels.append(int(parts[2]))
    n = len(ids)
    if sorted(ids) != list(range(n)):
        raise ValueError(f"{feat_file}: node ids are not 0..{n - 1}")
    dense = all(set(r) <= {0, 1} for r in rows) and len({len(r) for r in rows}) == 1 and len(rows[0]) > 2
    if dense:  # WebKB: the 0/1 vector itself
        d = len(rows[0])
        x = np.zeros((n, d), dtype=np.float32)
        for i, r in zip(ids, rows):
            x[i] = r
    else:  # Actor: indices of the ones
        d = max(max(r) for r in rows if r) + 1
        x = np.zeros((n, d), dtype=np.float32)
        for i, r in zip(ids, rows):
            x[i, r] = 1.0
    y = np.empty(n, dtype=np.int32)
    y[np.asarray(ids)] = labels
    e = np.loadtxt(edge_file, skiprows=1, dtype=np.int64, ndmin=2)
    if e.shape[1] != 2:
        raise ValueError(f"{edge_file}: expected 2 columns")
    if e.size and (e.min() < 0 or e.max() >= n):
        raise ValueError(f"{edge_file}: node id outside [0, {n})")
    s = np.concatenate([e[:, 0], e[:, 1]])
    t = np.concatenate([e[:, 1], e[:, 0]])
    keep = s != t
    pairs = np.unique(np.stack([s[keep], t[keep]], 1), axis=0)
    return n, pairs[:, 0], pairs[:, 1], x, y


def convert_geom_gcn(raw_dir: str | Path, split_files: list[Path], name: str, out: str | Path,
                     overwrite: bool = False) -> list[Path]:
    """Write one dataset per split file: ``out/split{k}`` for the k-th file (sorted by its index)."""
    n, src, dst, x, y = read_geom_gcn(raw_dir)
    written = []
    for k, sf in enumerate(split_files):
        z = np.load(sf)
        splits = {s: np.flatnonzero(z[m]) for s, m in (("train", "train_mask"), ("valid", "val_mask"),
                                                      ("test", "test_mask"))}
        written.append(write_graph_dataset(
            Path(out) / f"split{k}", n, src, dst, x, y, splits, int(y.max()) + 1, name,
            overwrite=overwrite, sources=[Path(raw_dir) / "out1_node_feature_label.txt",
                                          Path(raw_dir) / "out1_graph_edges.txt", Path(sf)],
            extra_manifest={"source_format": "geom-gcn", "undirected": True, "split_index": k}))
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ooc.ingest.geomgcn", description=__doc__.split("\n")[0])
    p.add_argument("--raw-dir", required=True, help="folder with out1_node_feature_label.txt, out1_graph_edges.txt")
    p.add_argument("--splits", required=True, help="folder with <name>_split_0.6_0.2_<k>.npz")
    p.add_argument("--name", required=True, help="dataset name, e.g. film")
    p.add_argument("--out", required=True, help="parent folder of split0..split9")
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args(argv)
    files = sorted(Path(a.splits).glob(f"{a.name}_split_*.npz"),
                   key=lambda f: int(f.stem.rsplit("_", 1)[1]))
    if not files:
        print(f"error: no {a.name}_split_*.npz in {a.splits}", file=sys.stderr)
        return 2
    for path in convert_geom_gcn(a.raw_dir, files, a.name, a.out, a.overwrite):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
