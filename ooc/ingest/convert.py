"""``ooc convert``: raw datasets -> the on-disk store (atomic; see :mod:`ooc.storage.dataset`)."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import lmdb
import numpy as np

from ooc.kernels.graph import build_csc, index_dtype_for, take_edges
from ooc.storage.dataset import DatasetWriter
from ooc.util.sizes import parse_bytes
from ooc.ingest.planetoid import read_planetoid
from ooc.storage.idmap import write_int_id_map, write_str_id_map
from ooc.ingest.nodetables import (JsonFeatures, is_json, keyed_feature_rows, labels_from_array,
                                   parse_int_ids, read_label_table)
from ooc.ingest.structural import parse_structural, structural_feature_rows
from ooc.ingest.splits import SPLITS, parse_fractions, random_split, read_split, split_spec
from ooc.ingest.readers import (InputError, check_input_file, NumpyEdges, TextTable, _pread_into,
                               load_array, read_string_pairs)
from ooc.ingest.streaming import (DEFAULT_CHUNK_EDGES, EdgeChunk, SpoolEdgeSource, SpoolWriter,
                                 SymmetricSource, build_csc_to_writer,
                                 rank_of, spool_with_id_map)

__all__ = ["convert_planetoid", "write_graph_dataset", "convert_edgelist", "convert_numpy",
           "convert_ogb", "convert_geom_gcn", "GraphOptions", "NodeInputs", "parse_node_types"]

log = logging.getLogger("ooc.convert")


#: Largest class count accepted (labels are stored as int32; a larger count is a mistake: a
#: classifier with 2^31 outputs does not fit any memory).
MAX_CLASSES = 1 << 24
_F16_MAX = float(np.finfo(np.float16).max)


def cast_features(rows: np.ndarray, dtype: str, nan_policy: str, what: str, first: int = 0) -> np.ndarray:
    """Rows cast to the storage dtype, with non-finite values (and, for float16, values beyond its
    range, which would become inf) refused (``nan_policy="error"``) or replaced by 0 (``"zero"``).

    Args:
        rows: [n, D] feature rows (float or integer); what: the input's name for messages; first:
            the node id of ``rows[0]``.

    Raises:
        InputError: naming the input, the row (node id), the column and the value.
    """
    rows = np.asarray(rows)
    if rows.dtype.kind not in "fiub":
        raise InputError(f"{what}: features of dtype {rows.dtype}")
    out_dtype = np.dtype(dtype)
    if rows.dtype.kind == "f":
        bad = ~np.isfinite(rows)
        if bad.any():
            if nan_policy == "error":
                r, c = (int(x) for x in np.argwhere(bad.reshape(rows.shape[0], -1))[0])
                v = rows.reshape(rows.shape[0], -1)[r, c]
                raise InputError(f"{what}: row {first + r}: non-finite feature value {v} in column {c} "
                                 "(use --nan-policy zero to store 0)")
            rows = np.where(bad, 0, rows)
    if out_dtype == np.float16 and (rows.dtype.kind in "iu" or float(np.finfo(rows.dtype).max) > _F16_MAX):
        over = np.abs(rows) > _F16_MAX
        if over.any():
            if nan_policy == "error":
                r, c = (int(x) for x in np.argwhere(over.reshape(rows.shape[0], -1))[0])
                v = rows.reshape(rows.shape[0], -1)[r, c]
                raise InputError(f"{what}: row {first + r}: feature value {v:g} in column {c} is beyond float16's "
                                 f"range (+-{_F16_MAX:g}) and would be stored as inf; use --feat-dtype "
                                 "float32, rescale the features, or --nan-policy zero to store 0")
            rows = np.where(over, 0, rows)
    return rows.astype(out_dtype, copy=False)


def check_labels(lab: np.ndarray, num_classes: int | None, what: str,
                 ids: np.ndarray | None = None) -> int:
    """Check class labels and return the class count C.

    Labels are ``-1`` (unlabelled) or a class in ``[0, C)``: with ``num_classes`` given, C is it;
    without, the labels must be dense (every class ``0 .. max`` used) and C = max + 1.

    Raises:
        InputError: a label below -1, a label >= C, or sparse labels without ``num_classes``;
            naming the input, the node and the label, and how to remap.
    """
    lab = np.asarray(lab)
    if lab.size == 0:
        return int(num_classes or 0)

    def node(i: int) -> str:
        return f"node {int(ids[i])}" if ids is not None else f"row {i}"

    if lab.min() < -1:
        i = int(np.argmax(lab < -1))
        raise InputError(f"{what}: {node(i)} has label {int(lab[i])}; labels are -1 (unlabelled) or "
                         "a class 0..C-1")
    top = int(lab.max())
    if num_classes is not None:
        if top >= num_classes:
            i = int(np.argmax(lab >= num_classes))
            raise InputError(f"{what}: {node(i)} has label {int(lab[i])}, not below --num-classes "
                             f"{num_classes}")
        return int(num_classes)
    if top < 0:
        return 0
    used = np.unique(lab[lab >= 0])
    if top >= MAX_CLASSES or used.shape[0] != top + 1:
        i = int(np.argmax(lab == top))
        raise InputError(f"{what}: labels are not dense: {used.shape[0]:,} distinct classes but "
                         f"{node(i)} has label {top:,}, which would make {top + 1:,} classes; "
                         "remap the labels to 0..C-1 (e.g. numpy.unique(labels, return_inverse=True)) "
                         f"or declare --num-classes C (at most {MAX_CLASSES:,})")
    return top + 1


def write_graph_dataset(out: str | Path, num_nodes: int, src: np.ndarray, dst: np.ndarray,
                        features: np.ndarray, labels: np.ndarray, splits: dict[str, np.ndarray],
                        num_classes: int, name: str, overwrite: bool = False,
                        feat_dtype: str = "float32", sources: list[Path] | None = None,
                        partition_offsets: np.ndarray | None = None,
                        extra_manifest: dict | None = None) -> Path:
    """Write an in-memory graph as a dataset (CSC topology, features, labels, splits), atomically.

    Args:
        out: dataset directory to create.
        num_nodes: N (never inferred from edge ids).
        src, dst: int [E] directed edges ``src -> dst``.
        features: [N, D] node features; labels: int [N] (-1 = unlabelled).
        splits: ``{"train"|"valid"|"test": node ids}``.
        num_classes: number of classes.
        feat_dtype: ``float32`` or ``float16`` on disk.
        sources: input files recorded with their sha256.
        partition_offsets: optional int64 [P+1] contiguous partition boundaries.

    Returns:
        The dataset path.

    Raises:
        ValueError: feature/label rows disagree with ``num_nodes`` or ids are out of range.
        FileExistsError: ``out`` exists and not ``overwrite``.
    """
    if features.shape[0] != num_nodes:
        raise ValueError(f"{features.shape[0]} feature rows for {num_nodes} nodes")
    if labels.shape[0] != num_nodes:
        raise ValueError(f"{labels.shape[0]} labels for {num_nodes} nodes")
    indptr, indices = build_csc(src, dst, num_nodes)
    with DatasetWriter(out, overwrite=overwrite, inputs=sources or ()) as w:
        for s in sources or []:
            w.add_source(s)
        w.write_array("indptr", indptr)
        w.write_array("indices", indices)
        w.write_array("features", np.ascontiguousarray(cast_features(
            np.asarray(features), feat_dtype, "error", "features")))
        w.write_array("labels", labels.astype(np.int32))
        for k, ids in splits.items():
            w.write_array(k, np.unique(np.asarray(ids, dtype=np.int64)))
        if partition_offsets is not None:
            w.write_array("partition_offsets", np.asarray(partition_offsets, dtype=np.int64))
        man = {"name": name, "num_nodes": int(num_nodes), "num_classes": int(num_classes),
               "directed_edges": int(indices.shape[0])}
        man.update(extra_manifest or {})
        return w.commit(**man)


def convert_planetoid(raw_dir: str | Path, name: str, out: str | Path, overwrite: bool = False,
                      feat_dtype: str = "float32") -> Path:
    """Convert Planetoid raw files (Cora, CiteSeer, PubMed) into a dataset.

    Edges are symmetrised, self-loops and duplicates dropped (10,556 directed edges for Cora);
    splits are the standard Planetoid ones (Cora 140/500/1000, CiteSeer 120/500/1000).

    Raises:
        PlanetoidError: a raw file is missing or malformed (nothing is written).
    """
    t0 = time.perf_counter()
    data = read_planetoid(raw_dir, name)
    path = write_graph_dataset(
        out, data.features.shape[0], data.src, data.dst, data.features, data.labels,
        {"train": data.train, "valid": data.valid, "test": data.test}, data.num_classes, name,
        overwrite=overwrite, feat_dtype=feat_dtype, sources=data.files,
        extra_manifest={"source_format": "planetoid", "undirected": True})
    log.info("converted %s: %d nodes, %d directed edges in %.2f s", name, data.features.shape[0],
             data.src.shape[0], time.perf_counter() - t0)
    return path


# ---------------------------------------------------------------- streaming converters
ID_MODES = ("dense", "map", "string", "typed")


@dataclass
class GraphOptions:
    """Options shared by every ``ooc convert`` input format.

    Attributes:
        num_nodes: declared N (ids must be below it); ``None`` = max id + 1, or the id map's size.
        ids: ``dense`` (ids are 0..N-1, or 1..N with ``one_based``), ``map`` (sparse 64-bit integers,
            renumbered order-preservingly), ``string`` (any token, renumbered in byte order), ``typed``
            (per-type local ids, see ``node_types``).
        one_based: ids start at 1 (an id 0 is an error).
        undirected: symmetrise (every edge in both directions) and deduplicate.
        self_loops: ``keep`` or ``remove``.
        dedup: keep one of each repeated ``(src, dst)`` pair.
        feat_dtype: ``float32`` or ``float16`` on disk.
        nan_policy: ``error`` (NaN/inf features are rejected with their row) or ``zero`` (replaced by 0).
        memory_budget: bytes (or "2GB") for the CSC build and id collection.
        partitions: store P contiguous partitions (``partitions/offsets``), or none.
        node_types: typed nodes ``[(name, count), ...]`` (internal id = type offset + local id).
        src_type, dst_type: node types of the edge columns (with ``ids="typed"``).
        chunk_edges: edges per streamed chunk; chunk_bytes: bytes per text block.
        split_random: draw (train, valid, test) fractions of the labelled nodes at random
            (:func:`ooc.ingest.splits.random_split`; recorded in the manifest as ``split``);
            ``stratify`` keeps the class proportions; ``split_seed`` seeds the draw.
        num_classes: declared class count C (labels must be in ``[-1, C)``); ``None``: the labels
            must be dense, every class ``0 .. max`` used.
    """

    num_nodes: int | None = None
    ids: str = "dense"
    one_based: bool = False
    undirected: bool = False
    self_loops: str = "keep"
    dedup: bool = False
    feat_dtype: str = "float32"
    nan_policy: str = "error"
    memory_budget: int | str = "2GB"
    partitions: int | None = None
    node_types: list[tuple[str, int]] = field(default_factory=list)
    src_type: str | None = None
    dst_type: str | None = None
    chunk_edges: int = DEFAULT_CHUNK_EDGES
    chunk_bytes: int = 16 << 20
    progress: bool = False
    name: str | None = None
    split_random: tuple[float, float, float] | None = None
    stratify: bool = False
    split_seed: int = 0
    num_classes: int | None = None

    def validate(self) -> None:
        if self.ids not in ID_MODES:
            raise ValueError(f"--ids must be one of {ID_MODES}, got {self.ids!r}")
        if self.self_loops not in ("keep", "remove"):
            raise ValueError(f"--self-loops must be keep or remove, got {self.self_loops!r}")
        if self.feat_dtype not in ("float32", "float16"):
            raise ValueError(f"--feat-dtype must be float32 or float16, got {self.feat_dtype!r}")
        if self.nan_policy not in ("error", "zero"):
            raise ValueError(f"--nan-policy must be error or zero, got {self.nan_policy!r}")
        if self.num_classes is not None and not 1 <= self.num_classes <= MAX_CLASSES:
            raise ValueError(f"--num-classes must be in [1, {MAX_CLASSES:,}], got {self.num_classes}")
        if self.ids == "typed":
            if not self.node_types or self.src_type is None or self.dst_type is None:
                raise ValueError("--ids typed needs --node-types, --src-type and --dst-type")
            names = [t for t, _ in self.node_types]
            for t in (self.src_type, self.dst_type):
                if t not in names:
                    raise ValueError(f"node type {t!r} not in --node-types {names}")
        if self.num_nodes is not None and self.num_nodes < 0:
            raise ValueError(f"--num-nodes must be >= 0, got {self.num_nodes}")
        if self.split_random is not None:
            self.split_random = parse_fractions(",".join(str(f) for f in self.split_random))
        elif self.stratify:
            raise ValueError("--stratify applies to --split-random")


def parse_node_types(spec: str) -> list[tuple[str, int]]:
    """``"user:3,item:4"`` -> ``[("user", 3), ("item", 4)]``.

    Raises:
        ValueError: malformed spec.
    """
    out = []
    for part in spec.split(","):
        name, _, count = part.partition(":")
        if not name or not count.strip().isdigit():
            raise ValueError(f"--node-types entries are NAME:COUNT, got {part!r}")
        out.append((name.strip(), int(count)))
    return out


@dataclass
class NodeInputs:
    """Node-role inputs (never classified by length: every array here has one row per node).

    Attributes:
        labels: a text table path (``label_cols`` = id column, label column; integer, boolean or
            named labels) or a ``.npy`` [N].
        features: a ``.npy`` [N, D] (rows in node-id order; dense ids only) or an array; a JSON
            object keyed by node id (``.json``, :class:`~ooc.ingest.nodetables.JsonFeatures`; ids
            mapped like the edge list's); or ``"structural[:D]"``
            (:mod:`ooc.ingest.structural`).
        feature_format: JSON layout, ``auto``, ``dense`` or ``indices``; feat_dim: D for
            ``indices``.
        splits: ``{"train"|"valid"|"test": FILE or FILE:MEMBER}``: text (ids in column 0), ``.npy``
            (ids, or a bool mask [N]), an ``.npz`` member, or entry INDEX of a pickled split list
            (see :mod:`ooc.ingest.splits`).
    """

    labels: str | Path | None = None
    label_cols: tuple[int | str, int | str] = (0, 1)
    features: str | Path | np.ndarray | None = None
    splits: dict[str, str | Path] = field(default_factory=dict)
    feature_format: str = "auto"
    feat_dim: int | None = None

    def split_files(self) -> list[Path]:
        """The distinct files behind ``splits`` (``FILE:MEMBER`` -> ``FILE``)."""
        return list(dict.fromkeys(split_spec(v)[0] for v in self.splits.values()))


def _inputs(path: Path, nodes: NodeInputs) -> tuple:
    """The input files of a conversion (the output may be none of them)."""
    feats = (nodes.features,) if isinstance(nodes.features, (str, Path)) else ()
    return (path, nodes.labels, *nodes.splits.values(), *feats)


class _Job:
    """One conversion: the atomic writer, its scratch directory, the id space and the manifest."""

    def __init__(self, out: str | Path, opts: GraphOptions, overwrite: bool, source_format: str,
                 inputs: tuple = ()) -> None:
        opts.validate()
        self.opts = opts
        self.budget = parse_bytes(opts.memory_budget)
        # chunk buffers take ~40 B per chunk edge; keep them to ~10% of the budget
        opts.chunk_edges = min(opts.chunk_edges, max(self.budget // 400, 1024))
        self.w = DatasetWriter(out, overwrite=overwrite, inputs=inputs)
        self.work = self.w.tmp / "_work"
        self.work.mkdir()
        self.manifest: dict = {"source_format": source_format}
        self.num_nodes: int | None = opts.num_nodes
        self.sorted_ids: np.ndarray | None = None  # map mode
        self.num_classes: int | None = None  # set by class names
        self.structural_dim: int | None = None  # --features structural[:D]
        self.type_offsets: dict[str, int] = {}
        if opts.ids == "typed":
            off = 0
            recs = []
            for t, c in opts.node_types:
                self.type_offsets[t] = off
                recs.append({"name": t, "offset": off, "count": c})
                off += c
            if self.num_nodes is not None and self.num_nodes != off:
                raise ValueError(f"--num-nodes {self.num_nodes} disagrees with --node-types ({off} nodes)")
            self.num_nodes = off
            self.manifest["node_types"] = recs
            self.manifest["id_map"] = {"kind": "typed"}

    # ------------------------------------------------------------ id handling (dense / typed)
    def dense_ids(self, ids: np.ndarray, where: Callable[[int], str], kind: str = "node") -> np.ndarray:
        """Validate and shift raw integer ids (one-based, declared N); ``where(i)`` names row i."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return ids
        if ids.min() < 0:
            i = int(np.argmax(ids < 0))
            raise InputError(f"{where(i)}: negative {kind} id {ids[i]}")
        if self.opts.one_based:
            if ids.min() == 0:
                i = int(np.argmax(ids == 0))
                raise InputError(f"{where(i)}: {kind} id 0 with --one-based (ids start at 1)")
            ids = ids - 1
        n = self.num_nodes
        if n is not None and ids.size and ids.max() >= n:
            i = int(np.argmax(ids >= n))
            raise InputError(f"{where(i)}: {kind} id {ids[i] + (1 if self.opts.one_based else 0)} >= "
                             f"node count {n}")
        return ids

    def typed_ids(self, ids: np.ndarray, t: str, where: Callable[[int], str]) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if self.opts.one_based:
            if ids.size and ids.min() == 0:
                i = int(np.argmax(ids == 0))
                raise InputError(f"{where(i)}: {t} id 0 with --one-based")
            ids = ids - 1
        count = dict(self.opts.node_types)[t]
        bad = (ids < 0) | (ids >= count)
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{where(i)}: {t} id {ids[i]} outside [0, {count})")
        return ids + self.type_offsets[t]

    def map_ids(self, ids: np.ndarray, where: Callable[[int], str]) -> np.ndarray:
        """External int64 ids -> internal (map mode); every id must be in the map."""
        ids = np.asarray(ids, dtype=np.int64)
        sid = self.sorted_ids
        pos = rank_of(sid, ids)
        ok = pos < sid.shape[0]
        ok[ok] = np.asarray(sid[pos[ok]]) == ids[ok]
        if not ok.all():
            i = int(np.argmax(~ok))
            raise InputError(f"{where(i)}: id {ids[i]} is not a node of the graph")
        return pos.astype(np.int64)

    def set_map(self, ids: np.ndarray) -> None:
        """Adopt the sorted distinct external ids as the node set and store the LMDB id map."""
        if self.opts.num_nodes is not None and self.opts.num_nodes != ids.shape[0]:
            raise InputError(f"--num-nodes {self.opts.num_nodes} but the inputs hold {ids.shape[0]} "
                             "distinct ids")
        self.sorted_ids = ids
        self.num_nodes = int(ids.shape[0])
        write_int_id_map(self.w.tmp / "catalog.lmdb", ids)
        self.manifest["id_map"] = {"kind": "int64", "order": "ascending external id"}

    def spool_dense_edges(self, path: Path, sep: str | None = None,
                          header: bool | str = False) -> SpoolEdgeSource:
        """Spool a two-column text edge list of dense ids (validated, naming file and line)."""
        table = TextTable(path, [0, 1], ["int", "int"], sep=sep, header=header,
                          block_bytes=self.opts.chunk_bytes)
        spool = SpoolWriter(self.work, "edges", False)
        for blk in table.blocks():
            where = _where_line(path, blk.lines)
            spool.append(self.dense_ids(blk.ints[:, 0], where, "source"),
                         self.dense_ids(blk.ints[:, 1], where, "destination"))
        return spool.close(self.opts.chunk_edges)

    # ------------------------------------------------------------ node inputs
    def read_label_table(self, path: str | Path, cols: Sequence[int | str],
                         string_ids: bool = False) -> tuple[np.ndarray | list[str], np.ndarray, np.ndarray]:
        """(ids, labels int64, lines) of a text label table (ids not yet mapped: int64, or tokens
        with ``string_ids``); boolean or named labels put their class names in the manifest."""
        t = read_label_table(path, cols, string_ids=string_ids)
        self._label_name = str(path)
        self.set_class_names(t.class_names)
        return t.ids, t.labels, t.lines

    def set_class_names(self, names: list[str] | None) -> None:
        """Record the names of classes 0..K-1 (manifest ``class_names``; ``ooc info`` shows them)."""
        if names is not None:
            self.manifest["class_names"] = list(names)
            self.num_classes = len(names)

    def write_graph(self, source: object, name: str, nodes: NodeInputs,
                    labels_in: tuple[np.ndarray, np.ndarray] | None = None,
                    features_rows: Iterator[tuple[int, np.ndarray]] | None = None,
                    feat_shape: tuple[int, int] | None = None,
                    split_ids: dict[str, np.ndarray] | None = None,
                    num_classes: int | None = None) -> Path:
        """Build the CSC from ``source``, write node arrays, commit.  ``labels_in`` = (internal ids,
        labels); ``split_ids`` = internal ids per split (already validated)."""
        opts = self.opts
        n = int(self.num_nodes or 0)
        sym = SymmetricSource(source, opts.undirected, opts.self_loops == "remove")
        stats = build_csc_to_writer(sym, n, self.w, self.work, dedup=opts.dedup or opts.undirected,
                                    memory_budget=self.budget, progress=opts.progress)
        # features
        if features_rows is None and self.structural_dim:
            features_rows = structural_feature_rows(self.w.arrays_root, n, self.structural_dim)
            feat_shape = (n, self.structural_dim)
            self._feat_name = "structural features"
            self.manifest["feature_source"] = {
                "kind": "structural", "dim": self.structural_dim,
                "columns": "log(1 + in-degree), random projection of the adjacency row"}
        if features_rows is not None:
            assert feat_shape is not None
            if feat_shape[0] is not None and feat_shape[0] != n:
                raise InputError(f"{self._feat_name}: {feat_shape[0]} feature rows but the graph has "
                                 f"{n} nodes")
            fw = self.w.array_writer("features", opts.feat_dtype, (feat_shape[1],), expected_rows=n)
            for start, rows in features_rows:
                if start + rows.shape[0] > n:
                    raise InputError(f"{self._feat_name}: more than {n} feature rows (the graph has "
                                     f"{n} nodes)")
                rows = np.asarray(rows)
                if rows.dtype.kind not in "fiub":
                    raise InputError(f"{self._feat_name}: features of dtype {rows.dtype}")
                fw.append(cast_features(rows, opts.feat_dtype, opts.nan_policy, self._feat_name,
                                        start))
            if fw.rows != n:
                raise InputError(f"{self._feat_name}: {fw.rows} feature rows but the graph has {n} nodes")
            self.w.finish_array(fw)
        # labels
        ncls = num_classes if num_classes is not None else (
            opts.num_classes if opts.num_classes is not None else self.num_classes)
        if labels_in is not None:
            ids, lab = labels_in
            ncls = check_labels(np.asarray(lab), ncls, self._label_name, ids)
            labels = np.full(n, -1, dtype=np.int32)
            labels[ids] = lab
            self.w.write_array("labels", labels)
        if opts.split_random is not None:
            if split_ids:
                raise ValueError("--split-random draws the splits; the input has splits already")
            if labels_in is None:
                raise ValueError("--split-random draws from the labelled nodes: pass --labels")
            split_ids, self.manifest["split"] = random_split(labels, opts.split_random,
                                                             opts.split_seed, opts.stratify)
        for s, ids in (split_ids or {}).items():
            self.w.write_array(s, np.unique(np.asarray(ids, dtype=np.int64)))
        if opts.ids == "typed":
            nt = np.repeat(np.arange(len(opts.node_types), dtype=np.int16),
                           [c for _, c in opts.node_types])
            self.w.write_array("node_type", nt)
        if opts.partitions:
            from ooc.kernels.partition import contiguous_partitions
            self.w.write_array("partition_offsets", contiguous_partitions(n, opts.partitions))
        env = getattr(self, "_str_env", None)
        if env is not None:
            env.close()
        shutil.rmtree(self.work, ignore_errors=True)
        man = dict(self.manifest)
        man.update({"name": opts.name or name, "num_nodes": n, "num_classes": int(ncls or 0),
                    "directed_edges": stats["num_edges"], "input_edges": stats["input_edges"],
                    "undirected": opts.undirected, "self_loops": opts.self_loops,
                    "dedup": bool(opts.dedup or opts.undirected),
                    "build": {"buckets": stats["buckets"], "memory_budget": self.budget,
                              "seconds": stats["seconds"]}})
        path = self.w.commit(**man)
        log.info("converted %s: %d nodes, %d directed edges in %.2f s", name, n, stats["num_edges"],
                 stats["seconds"]["total"])
        return path

    _feat_name = "features"
    _label_name = "labels"

    def features_from_array(self, feat: str | Path | np.ndarray) -> tuple[Iterator, tuple[int, int]]:
        if self.opts.ids in ("map", "string"):
            raise InputError(f"{feat if not isinstance(feat, np.ndarray) else 'features'}: feature rows "
                             "are in node-id order, which needs dense ids (--ids dense); give a "
                             "table keyed by node id (.json) instead")
        arr = feat if isinstance(feat, np.ndarray) else load_array(feat)
        self._feat_name = "features" if isinstance(feat, np.ndarray) else str(feat)
        if arr.ndim == 1:
            arr = arr[:, None]
        if arr.ndim != 2:
            raise InputError(f"{self._feat_name}: features must be [N, D], got shape {arr.shape}")
        step = max(1, (64 << 20) // max(arr.shape[1] * arr.dtype.itemsize, 1))

        def rows() -> Iterator[tuple[int, np.ndarray]]:
            mm = isinstance(arr, np.memmap) and arr.flags.c_contiguous
            for a in range(0, arr.shape[0], step):
                if mm:  # positioned reads: file pages do not pile up in the resident set
                    blk = np.empty((min(step, arr.shape[0] - a), arr.shape[1]), dtype=arr.dtype)
                    _pread_into(arr.filename, arr.offset + a * arr.shape[1] * arr.dtype.itemsize, blk)
                    yield a, blk
                else:
                    yield a, np.asarray(arr[a:a + step])
        return rows(), (int(arr.shape[0]), int(arr.shape[1]))

    def json_features(self, nodes: NodeInputs) -> JsonFeatures | None:
        """The JSON feature table of ``nodes`` (scanned by the caller with the other node ids), or None."""
        if not is_json(nodes.features):
            return None
        if self.opts.ids == "typed":
            raise InputError(f"{nodes.features}: JSON features are keyed by node id; --ids typed "
                             "is not supported with them")
        return JsonFeatures(nodes.features, nodes.feature_format, nodes.feat_dim,
                            block_chars=self.opts.chunk_bytes)

    def node_features(self, nodes: NodeInputs, table: JsonFeatures | None,
                      resolve_keys: Callable[[list[str], Callable[[int], str]], np.ndarray]
                      ) -> tuple[Iterator | None, tuple[int | None, int] | None]:
        """The feature rows of ``nodes`` for :meth:`write_graph`: none, structural (computed there),
        a keyed JSON table (``table``, already scanned; keys resolved with ``resolve_keys``) or an
        array in node order."""
        f = nodes.features
        if f is None:
            return None, None
        dim = parse_structural(f)
        if dim is not None:
            self.structural_dim = dim
            return None, None
        if table is not None:
            self._feat_name = str(table.path)
            rec: dict = {"kind": "json", "layout": table.format, "dim": table.dim}
            self.manifest["feature_source"] = rec
            rows = keyed_feature_rows(table, int(self.num_nodes or 0), resolve_keys, self.work,
                                      self.budget, self.opts.chunk_edges, rec)
            return rows, (None, int(table.dim or 0))
        return self.features_from_array(f)

    def int_key_resolver(self, resolve: Callable) -> Callable[[list[str], Callable[[int], str]], np.ndarray]:
        """``resolve`` (int64 ids -> internal) for the string keys of a JSON table."""
        return lambda keys, where: resolve(parse_int_ids(keys, where, "node id"), where)

    def split_ids_from(self, splits: dict[str, str | Path], resolve: Callable) -> dict[str, np.ndarray]:
        """Read split files (``FILE`` or ``FILE:MEMBER``, see :mod:`ooc.ingest.splits`)."""
        out = {}
        if splits and self.opts.split_random is not None:
            raise ValueError(f"--split-random draws the splits, but split files are given too "
                             f"({', '.join(sorted(splits))})")
        for s, path in splits.items():
            if s not in SPLITS:
                raise ValueError(f"unknown split {s!r} (train, valid, test)")
            out[s] = read_split(path, s, int(self.num_nodes or 0), resolve, self.opts.chunk_bytes)
        return out




def _where_line(path: Path, lines: np.ndarray) -> Callable[[int], str]:
    return lambda i: f"{path}:{int(lines[i])}"


def convert_edgelist(path: str | Path, out: str | Path, opts: GraphOptions | None = None,
                     nodes: NodeInputs | None = None, sep: str | None = None, comments: str = "#%",
                     header: bool | str = "auto", skip_rows: int = 0, src_col: int | str = 0,
                     dst_col: int | str = 1, weight_col: int | str | None = None,
                     overwrite: bool = False) -> Path:
    """Convert a text edge list (plain or ``.gz``) into a dataset, streaming.

    Lines hold ``src dst [more fields]`` separated by whitespace runs, tabs or commas (or ``sep``);
    ``#`` / ``%`` comment lines, blank lines and trailing whitespace are skipped; a header row
    (auto-detected, or ``header=True``) names the columns, which ``src_col`` / ``dst_col`` /
    ``weight_col`` may then use.  Ids are handled as ``opts.ids`` says (dense, map, string, typed).

    Returns:
        The dataset path.

    Raises:
        InputError: malformed input, naming file and line (nothing is written).
        FileExistsError: ``out`` exists and not ``overwrite``.
    """
    opts = opts or GraphOptions()
    nodes = nodes or NodeInputs()
    p = Path(path)
    mm = _matrix_market_size(p)
    if mm is not None:  # Matrix Market coordinate file: size line = header, 1-based, N declared
        header, opts.one_based = True, True
        if opts.ids == "dense" and opts.num_nodes is None:
            opts.num_nodes = max(mm[0], mm[1])
    job = _Job(out, opts, overwrite, "edgelist" if mm is None else "matrix-market",
               inputs=_inputs(p, nodes))
    with job.w:
        for f in [p] + [Path(x) for x in (nodes.labels, *nodes.split_files()) if x is not None] + \
                ([Path(nodes.features)] if isinstance(nodes.features, (str, Path)) and
                 parse_structural(nodes.features) is None else []):
            check_input_file(f)
        ftable = job.json_features(nodes)
        has_w = weight_col is not None
        labels_in = None
        if opts.ids == "string":
            source, labels_in, resolve = _string_edges(job, p, sep, comments, header, skip_rows,
                                                       src_col, dst_col, nodes, ftable)
            resolve_keys = resolve
        else:
            cols = [src_col, dst_col] + ([weight_col] if has_w else [])
            kinds = ["int", "int"] + (["float"] if has_w else [])
            table = TextTable(p, cols, kinds, sep=sep, comments=comments, header=header,
                              skip_rows=skip_rows, block_bytes=opts.chunk_bytes)
            spool = SpoolWriter(job.work, "edges", has_w)
            lab = None
            if nodes.labels is not None and Path(nodes.labels).suffix not in (".npy", ".npz"):
                lab = job.read_label_table(nodes.labels, nodes.label_cols)
            if opts.ids == "map":
                source, ids = spool_with_id_map(
                    ((b.ints[:, 0], b.ints[:, 1], b.floats[:, 0] if has_w else None)
                     for b in table.blocks()), job.work, job.budget // 8, has_w, opts.chunk_edges,
                    _node_ids(lab[0] if lab is not None else None, ftable))
                job.set_map(ids)
                resolve = job.map_ids
            else:
                max_id = -1
                for blk in table.blocks():
                    where = _where_line(p, blk.lines)
                    if opts.ids == "typed":
                        s = job.typed_ids(blk.ints[:, 0], opts.src_type, where)
                        d = job.typed_ids(blk.ints[:, 1], opts.dst_type, where)
                    else:
                        s = job.dense_ids(blk.ints[:, 0], where, "source")
                        d = job.dense_ids(blk.ints[:, 1], where, "destination")
                    if s.size:
                        max_id = max(max_id, int(s.max()), int(d.max()))
                    spool.append(s, d, blk.floats[:, 0] if has_w else None)
                source = spool.close(opts.chunk_edges)
                resolve = job.dense_ids
                if lab is not None:
                    lab = (job.dense_ids(lab[0], _where_line(Path(nodes.labels), lab[2])), lab[1], lab[2])
                    if job.num_nodes is None and lab[0].size and int(lab[0].max()) > max_id:
                        i = int(np.argmax(lab[0] > max_id))
                        raise InputError(
                            f"{nodes.labels}:{int(lab[2][i])}: label for node {int(lab[0][i])}, but the "
                            f"edges name nodes 0..{max_id} only; pass --num-nodes N if the graph has "
                            "isolated nodes (ids up to N-1)")
                kmax = _max_key_id(job, ftable)
                if job.num_nodes is None and kmax > max_id:
                    raise InputError(
                        f"{nodes.features}: features for node {kmax}, but the edges name nodes "
                        f"0..{max_id} only; pass --num-nodes N if the graph has isolated nodes (ids "
                        "up to N-1)")
                if job.num_nodes is None:
                    job.num_nodes = max_id + 1
            resolve_keys = job.int_key_resolver(resolve)
            if lab is not None:
                if opts.ids == "map":
                    labels_in = (job.map_ids(lab[0], _where_line(Path(nodes.labels), lab[2])), lab[1])
                else:
                    labels_in = (lab[0], lab[1])
        if nodes.labels is not None and Path(nodes.labels).suffix in (".npy", ".npz"):
            labels_in = _label_array(job, nodes.labels)
        feats, shape = job.node_features(nodes, ftable, resolve_keys)
        split_ids = job.split_ids_from(nodes.splits, resolve)
        job.w.add_source(p)
        for f in (nodes.labels, nodes.features, *nodes.split_files()):
            if isinstance(f, (str, Path)) and parse_structural(f) is None:
                job.w.add_source(f)
        return job.write_graph(source, p.stem, nodes, labels_in, feats, shape, split_ids)


def _json_key_ids(table: JsonFeatures | None) -> Iterator[tuple[np.ndarray, Callable[[int], str]]]:
    """Pass 1 of a JSON feature table: blocks of its keys as integer ids, with ``where(i)``."""
    if table is not None:
        p = table.path
        for keys, lines in table.scan():
            where = (lambda i, L=lines: f"{p}:{L[i]}")
            yield parse_int_ids(keys, where, "node id"), where


def _node_ids(label_ids: np.ndarray | None, table: JsonFeatures | None) -> Iterator[np.ndarray]:
    """The integer node ids of the node tables (label ids, JSON feature keys), for the id map."""
    if label_ids is not None:
        yield label_ids
    for ids, _ in _json_key_ids(table):
        yield ids


def _max_key_id(job: _Job, table: JsonFeatures | None) -> int:
    """Largest (shifted, validated) node id among the keys of a JSON feature table (dense ids)."""
    mx = -1
    for ids, where in _json_key_ids(table):
        if ids.size:
            mx = max(mx, int(job.dense_ids(ids, where).max()))
    return mx


def _matrix_market_size(p: Path) -> tuple[int, int, int] | None:
    """``(rows, cols, nnz)`` of a Matrix Market coordinate file, ``None`` for other files.

    Raises:
        InputError: a Matrix Market file that is not in coordinate format, or a bad size line.
    """
    from ooc.ingest.readers import open_text
    if not p.is_file():
        return None
    with open_text(p) as f:
        first = f.readline()
        if not first.startswith(b"%%MatrixMarket"):
            return None
        if b"coordinate" not in first.lower():
            raise InputError(f"{p}:1: only coordinate Matrix Market files hold edge lists")
        line_no = 1
        for raw in iter(f.readline, b""):
            line_no += 1
            t = raw.strip()
            if not t or t.startswith(b"%"):
                continue
            parts = t.split()
            if len(parts) != 3 or not all(x.isdigit() for x in parts):
                raise InputError(f"{p}:{line_no}: Matrix Market size line must be 'rows cols nnz'")
            r, c, z = (int(x) for x in parts)
            return r, c, z
    raise InputError(f"{p}: Matrix Market file without a size line")


def _label_array(job: _Job, path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    if job.opts.ids in ("map", "string"):
        raise InputError(f"{path}: a label array is in node-id order, which needs dense ids")
    lab = np.asarray(load_array(path, mmap=False))
    if lab.ndim != 1 or lab.shape[0] != job.num_nodes:
        raise InputError(f"{path}: label array of shape {lab.shape}, expected ({job.num_nodes},)")
    lab, names = labels_from_array(lab, str(path))
    job._label_name = str(path)
    job.set_class_names(names)
    return np.arange(job.num_nodes, dtype=np.int64), lab


def _string_edges(job: _Job, p: Path, sep: str | None, comments: str, header: bool | str,
                  skip_rows: int, src_col: int | str, dst_col: int | str,
                  nodes: NodeInputs, table: JsonFeatures | None = None) -> tuple:
    """String ids: collect distinct tokens in a scratch LMDB (sorted, bounded memory), store the
    map, then re-read the file and spool internal ids."""
    hdr = header is True or (header == "auto" and (isinstance(src_col, str) and not src_col.isdigit()))
    tmp_env = lmdb.open(str(job.work / "strings.lmdb"), map_size=1 << 40, subdir=True, lock=False)
    lab_rows: list[tuple[str, int, int]] = []
    try:
        def add(tokens: set[str]) -> None:
            with tmp_env.begin(write=True) as txn:
                for t in tokens:
                    txn.put(t.encode(), b"", overwrite=False)

        for rows, _ in read_string_pairs(p, [src_col, dst_col], sep, comments, hdr, skip_rows):
            add({t for r in rows for t in r})
        if nodes.labels is not None and Path(nodes.labels).suffix not in (".npy", ".npz"):
            toks, labs, lines = job.read_label_table(nodes.labels, nodes.label_cols, string_ids=True)
            lab_rows = list(zip(toks, labs.tolist(), lines.tolist()))
            add(set(toks))
        if table is not None:
            for keys, _ in table.scan():
                add(set(keys))
        with tmp_env.begin() as txn:
            n = write_str_id_map(job.w.tmp / "catalog.lmdb",
                                 (bytes(k) for k in txn.cursor().iternext(keys=True, values=False)))
    finally:
        tmp_env.close()
        shutil.rmtree(job.work / "strings.lmdb", ignore_errors=True)
    if job.opts.num_nodes is not None and job.opts.num_nodes != n:
        raise InputError(f"--num-nodes {job.opts.num_nodes} but the inputs hold {n} distinct ids")
    job.num_nodes = n
    job.manifest["id_map"] = {"kind": "string", "order": "utf-8 byte order"}
    from ooc.storage.idmap import FWD_DB
    env = lmdb.open(str(job.w.tmp / "catalog.lmdb"), map_size=1 << 40, subdir=True, readonly=True,
                    lock=False, max_dbs=4)
    fwd = env.open_db(FWD_DB, create=False)

    def lookup(tokens: Sequence[str], where: Callable[[int], str]) -> np.ndarray:
        out = np.empty(len(tokens), dtype=np.int64)
        with env.begin(db=fwd) as txn:
            for i, t in enumerate(tokens):
                v = txn.get(str(t).encode())
                if v is None:
                    raise InputError(f"{where(i)}: id {t!r} is not a node of the graph")
                out[i] = int.from_bytes(v, "big")
        return out

    spool = SpoolWriter(job.work, "edges", False)
    for rows, first in read_string_pairs(p, [src_col, dst_col], sep, comments, hdr, skip_rows):
        ids = lookup([t for r in rows for t in r], lambda i: f"{p}: line >= {first}")
        spool.append(ids[0::2], ids[1::2])
    labels_in = None
    if lab_rows:
        ids = lookup([t for t, _, _ in lab_rows], lambda i: f"{nodes.labels}:{lab_rows[i][2]}")
        labels_in = (ids, np.asarray([x for _, x, _ in lab_rows], dtype=np.int64))

    def resolve(ids: np.ndarray | list[str], where: Callable[[int], str]) -> np.ndarray:
        return lookup([str(x) for x in ids.tolist()] if isinstance(ids, np.ndarray) else ids, where)
    source = spool.close(job.opts.chunk_edges)
    job._str_env = env  # closed with the process; read-only
    return source, labels_in, resolve


class _CheckedNumpySource:
    """A :class:`NumpyEdges` streamed in chunks, ids validated (naming the row) and shifted."""

    def __init__(self, edges: NumpyEdges, job: _Job, weight: np.ndarray | None, wpath: str) -> None:
        self.edges = edges
        self.job = job
        self.weight = weight
        self.has_weight = weight is not None
        self.num_edges = edges.num_edges
        self.chunk_edges = job.opts.chunk_edges

    def chunks(self) -> Iterator[EdgeChunk]:
        e = self.edges
        job = self.job
        if e.pairs is not None and job.opts.ids == "dense":
            # fast path: one fused Numba pass per chunk (copy + shift + validate) in the index dtype
            col_major = e.layout == "2xE"
            n = -1 if job.num_nodes is None else int(job.num_nodes)
            dt = index_dtype_for(n if n >= 0 else 2**62)
            shift = 1 if job.opts.one_based else 0
            self.max_id = -1
            for a in range(0, e.num_edges, self.chunk_edges):
                b = min(a + self.chunk_edges, e.num_edges)
                block = e.pair_block(a, b)
                s = np.empty(b - a, dtype=dt)
                d = np.empty(b - a, dtype=dt)
                bad, col, val, mx = take_edges(block, col_major, n, shift, s, d)
                if bad >= 0:
                    kind = "source" if col == 0 else "destination"
                    if val - shift < 0:
                        msg = (f"{kind} id 0 with --one-based (ids start at 1)" if val == 0 and shift
                               else f"negative {kind} id {val}")
                    else:
                        msg = f"{kind} id {val} >= node count {n}"
                    raise InputError(f"{e.path}: edge {a + bad}: {msg}")
                self.max_id = max(self.max_id, int(mx))
                w = None if self.weight is None else np.asarray(self.weight[a:b], dtype=np.float32)
                yield EdgeChunk(s, d, w)
            return
        p = e.path
        for a, s, d in e.chunks(self.chunk_edges):
            where = (lambda i, a=a: f"{p}: edge {a + i}")
            if job.opts.ids == "typed":
                s = job.typed_ids(s, job.opts.src_type, where)
                d = job.typed_ids(d, job.opts.dst_type, where)
            else:
                s = job.dense_ids(s, where, "source")
                d = job.dense_ids(d, where, "destination")
            w = None if self.weight is None else np.asarray(self.weight[a:a + s.shape[0]],
                                                            dtype=np.float32)
            yield EdgeChunk(s, d, w)


def convert_numpy(path: str | Path, out: str | Path, opts: GraphOptions | None = None,
                  nodes: NodeInputs | None = None, layout: str = "auto", key: str | None = None,
                  edge_weights: str | Path | None = None, overwrite: bool = False) -> Path:
    """Convert a NumPy edge array into a dataset, streaming (``.npy`` files are memory-mapped).

    Args:
        path: ``.npy`` COO array (2, E) or (E, 2), or ``.npz`` (``edge_index``, ``src``/``dst``,
            ``row``/``col``, or CSR ``indptr``/``indices`` with rows as sources).
        layout: ``auto``, ``2xE``, ``Ex2`` or ``csr``.
        edge_weights: ``.npy`` float [E], an edge-role array (carried through sorting, symmetrisation
            and deduplication).

    Raises:
        InputError: bad arrays (file and row named; nothing is written).
    """
    opts = opts or GraphOptions()
    nodes = nodes or NodeInputs()
    p = Path(path)
    edges = NumpyEdges(p, layout, key)
    job = _Job(out, opts, overwrite, "numpy", inputs=_inputs(p, nodes) + (edge_weights,))
    with job.w:
        weight = None
        if edge_weights is not None:
            weight = load_array(edge_weights)
            if weight.shape != (edges.num_edges,):
                raise InputError(f"{edge_weights}: edge weights of shape {weight.shape}, expected "
                                 f"({edges.num_edges},) (one per edge)")
        table = job.json_features(nodes)
        if opts.ids == "map":
            source, ids = spool_with_id_map(
                ((s, d, None if weight is None else weight[a:a + s.shape[0]])
                 for a, s, d in edges.chunks(opts.chunk_edges)), job.work, job.budget // 8,
                weight is not None, opts.chunk_edges, _node_ids(None, table))
            job.set_map(ids)
            resolve = job.map_ids
        elif opts.ids == "string":
            raise InputError(f"{p}: NumPy edge arrays hold integers; use --ids dense or map")
        else:
            source = _CheckedNumpySource(edges, job, weight, str(edge_weights))
            resolve = job.dense_ids
            if job.num_nodes is None:
                mx = -1
                for c in source.chunks():  # validation pass that also finds the largest id
                    if c.src.size:
                        mx = max(mx, int(c.src.max()), int(c.dst.max()))
                kmax = _max_key_id(job, table)
                if kmax > mx:
                    raise InputError(
                        f"{nodes.features}: features for node {kmax}, but the edges name nodes "
                        f"0..{mx} only; pass --num-nodes N if the graph has isolated nodes (ids up "
                        "to N-1)")
                job.num_nodes = mx + 1
            elif table is not None:
                _max_key_id(job, table)  # pass 1 of the JSON: keys checked against N, layout found
        labels_in = _label_array(job, nodes.labels) if nodes.labels is not None and \
            Path(nodes.labels).suffix in (".npy", ".npz") else None
        if nodes.labels is not None and labels_in is None:
            ids, lab, lines = job.read_label_table(nodes.labels, nodes.label_cols)
            labels_in = (resolve(ids, _where_line(Path(nodes.labels), lines)), lab)
        feats, shape = job.node_features(nodes, table, job.int_key_resolver(resolve))
        split_ids = job.split_ids_from(nodes.splits, resolve)
        for f in (p, edge_weights, nodes.labels, nodes.features, *nodes.split_files()):
            if isinstance(f, (str, Path)) and parse_structural(f) is None:
                job.w.add_source(f)
        return job.write_graph(source, p.stem, nodes, labels_in, feats, shape, split_ids)


# ---------------------------------------------------------------------------- OGB raw layout
def _ogb_file(root: Path, *names: str) -> Path:
    for n in names:
        for cand in (root / "raw" / n, root / n):
            if cand.is_file():
                return cand
    raise InputError(f"{root}: no {names[0]} (expected the OGB layout raw/{names[0]})")


def convert_ogb(root: str | Path, out: str | Path, opts: GraphOptions | None = None,
                scheme: str | None = None, overwrite: bool = False) -> Path:
    """Convert an OGB node-property dataset in its raw folder layout, streaming.

    Layout (as downloaded and unzipped by OGB)::

        ROOT/raw/edge.csv.gz            "src,dst" per line, 0-based, no header
        ROOT/raw/num-node-list.csv.gz   N (one graph)
        ROOT/raw/node-feat.csv.gz       D comma-separated floats per node (optional)
        ROOT/raw/node-label.csv.gz      one label per node, "nan" = unlabelled (optional)
        ROOT/split/<scheme>/{train,valid,test}.csv.gz   node ids, one per line

    Args:
        scheme: split folder name (default: the only one under ``split/``).
        opts: conversion options (``undirected`` for datasets OGB marks ``add_inverse_edge``).

    Raises:
        InputError: missing files, malformed lines (file and line), counts that disagree.
    """
    opts = opts or GraphOptions()
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: no such directory")
    edge_f = _ogb_file(root, "edge.csv.gz", "edge.csv")
    nn_f = _ogb_file(root, "num-node-list.csv.gz", "num-node-list.csv")
    counts = TextTable(nn_f, [0], ["int"], header=False).read_all()
    if counts.ints.shape[0] != 1:
        raise InputError(f"{nn_f}: {counts.ints.shape[0]} graphs; only single-graph datasets convert")
    n = int(counts.ints[0, 0])
    if opts.num_nodes is not None and opts.num_nodes != n:
        raise InputError(f"{nn_f}: {n} nodes but --num-nodes {opts.num_nodes}")
    opts.num_nodes = n
    if opts.ids != "dense":
        raise InputError(f"{root}: OGB ids are dense 0..N-1; --ids {opts.ids} does not apply")
    job = _Job(out, opts, overwrite, "ogb", inputs=(root,))
    with job.w:
        source = job.spool_dense_edges(edge_f, header=False)
        sources = [edge_f, nn_f]
        feats = shape = None
        try:
            feat_f: Path | None = _ogb_file(root, "node-feat.csv.gz", "node-feat.csv")
        except InputError:
            feat_f = None
        if feat_f is not None:
            probe = TextTable(feat_f, [0], ["float"], header=False)
            d = probe.num_fields
            ft = TextTable(feat_f, list(range(d)), ["float"] * d, header=False,
                           block_bytes=opts.chunk_bytes)
            job._feat_name = str(feat_f)

            def feat_rows(ft: TextTable = ft) -> Iterator[tuple[int, np.ndarray]]:
                r = 0
                for blk in ft.blocks():
                    yield r, blk.floats
                    r += blk.floats.shape[0]
            feats, shape = feat_rows(), (None, d)
            sources.append(feat_f)
        labels_in = None
        try:
            lab_f: Path | None = _ogb_file(root, "node-label.csv.gz", "node-label.csv")
        except InputError:
            lab_f = None
        if lab_f is not None:
            lt = TextTable(lab_f, [0], ["float"], header=False).read_all()
            vals = lt.floats[:, 0]
            if vals.shape[0] != n:
                raise InputError(f"{lab_f}: {vals.shape[0]} label rows but the graph has {n} nodes")
            ok = np.isfinite(vals)
            bad = ok & ((vals < 0) | (vals != np.round(vals)))
            if bad.any():
                i = int(np.argmax(bad))
                raise InputError(f"{lab_f}:{int(lt.lines[i])}: label {vals[i]} is not a class index")
            lab = np.where(ok, vals, -1).astype(np.int64)
            labels_in = (np.arange(n, dtype=np.int64), lab)
            sources.append(lab_f)
        split_root = root / "split"
        split_files: dict[str, Path] = {}
        if split_root.is_dir():
            schemes = sorted(p.name for p in split_root.iterdir() if p.is_dir())
            if scheme is None and len(schemes) > 1:
                raise InputError(f"{split_root}: several split schemes {schemes}; pass --scheme")
            if scheme is None and schemes:
                scheme = schemes[0]
            if scheme is not None:
                sdir = split_root / scheme
                if not sdir.is_dir():
                    raise InputError(f"{sdir}: no such split scheme (have {schemes})")
                for s in ("train", "valid", "test"):
                    for cand in (sdir / f"{s}.csv.gz", sdir / f"{s}.csv"):
                        if cand.is_file():
                            split_files[s] = cand
                            break
        split_ids = job.split_ids_from(split_files, job.dense_ids)
        sources += list(split_files.values())
        for f in sources:
            job.w.add_source(f)
        if scheme:
            job.manifest["split_scheme"] = scheme
        return job.write_graph(source, root.name, NodeInputs(), labels_in, feats, shape, split_ids)


# ---------------------------------------------------------------------------- Geom-GCN layout
def convert_geom_gcn(raw_dir: str | Path, out: str | Path, opts: GraphOptions | None = None,
                     split: str | Path | None = None, feature_format: str = "auto",
                     feat_dim: int | None = None, overwrite: bool = False) -> Path:
    """Convert the Geom-GCN text layout (Chameleon, Squirrel, Actor/film, Cornell, Texas, Wisconsin).

    Files: ``out1_node_feature_label.txt`` (header, then ``id<TAB>features<TAB>label`` with features a
    comma-separated 0/1 vector, or for film a comma-separated list of active feature indices) and
    ``out1_graph_edges.txt`` (header, then ``src<TAB>dst``); a split ``.npz`` holds ``train_mask``,
    ``val_mask``, ``test_mask`` [N].  Geom-GCN reads the edges as an undirected graph, so pass
    ``opts.undirected`` to reproduce its adjacency.

    Args:
        feature_format: ``dense`` (0/1 vector), ``indices`` (active indices), or ``auto`` (indices when
            the header says ``feature_amount``, else dense).
        feat_dim: feature dimension for ``indices`` (default: the largest index + 1).

    Raises:
        InputError: missing files, malformed lines (file and line), ids that are not 0..N-1.
    """
    opts = opts or GraphOptions()
    raw = Path(raw_dir)
    nf = raw / "out1_node_feature_label.txt"
    ef = raw / "out1_graph_edges.txt"
    for f in (nf, ef):
        if not f.is_file():
            raise InputError(f"{f}: no such file (expected the Geom-GCN layout)")
    lines = nf.read_text().splitlines()
    if not lines:
        raise InputError(f"{nf}: no data lines (empty file)")
    header = lines[0]
    if feature_format == "auto":
        feature_format = "indices" if "feature_amount" in header else "dense"
    ids, labels, rows = [], [], []
    for ln, text in enumerate(lines[1:], 2):
        if not text.strip():
            continue
        parts = text.split("\t")
        if len(parts) != 3:
            raise InputError(f"{nf}:{ln}: expected 3 tab-separated fields, found {len(parts)}")
        try:
            ids.append(int(parts[0]))
            labels.append(int(parts[2]))
            vals = [int(x) for x in parts[1].split(",")] if parts[1].strip() else []
        except ValueError:
            raise InputError(f"{nf}:{ln}: non-integer id, label or feature: {text[:80]!r}") from None
        rows.append(vals)
    n = len(ids)
    if n == 0:
        raise InputError(f"{nf}: no data lines (empty file)")
    id_arr = np.asarray(ids, dtype=np.int64)
    if not np.array_equal(np.sort(id_arr), np.arange(n)):
        raise InputError(f"{nf}: node ids are not 0..{n - 1} (each exactly once)")
    if feature_format == "indices":
        dim = feat_dim or (max((max(r) for r in rows if r), default=-1) + 1)
        x = np.zeros((n, dim), dtype=np.float32)
        for i, r in zip(ids, rows):
            if r and (min(r) < 0 or max(r) >= dim):
                raise InputError(f"{nf}: node {i}: feature index outside [0, {dim})")
            x[i, r] = 1.0
    else:
        dims = {len(r) for r in rows}
        if len(dims) != 1:
            raise InputError(f"{nf}: feature vectors of different lengths {sorted(dims)}")
        x = np.zeros((n, dims.pop()), dtype=np.float32)
        x[id_arr] = np.asarray(rows, dtype=np.float32)
    y = np.full(n, -1, dtype=np.int64)
    y[id_arr] = labels
    if opts.num_nodes is not None and opts.num_nodes != n:
        raise InputError(f"{nf}: {n} nodes but --num-nodes {opts.num_nodes}")
    opts.num_nodes = n
    job = _Job(out, opts, overwrite, "geom-gcn", inputs=(raw_dir, split))
    with job.w:
        source = job.spool_dense_edges(ef, sep="\t", header=True)
        split_ids: dict[str, np.ndarray] = {}
        if split is not None:
            sp = Path(split)
            try:
                with np.load(sp, allow_pickle=False) as z:
                    for key, name in (("train_mask", "train"), ("val_mask", "valid"),
                                      ("test_mask", "test")):
                        if key not in z.files:
                            raise InputError(f"{sp}: no {key} (has {z.files})")
                        m = np.asarray(z[key]).astype(bool)
                        if m.shape != (n,):
                            raise InputError(f"{sp}: {key} of shape {m.shape}, expected ({n},)")
                        split_ids[name] = np.flatnonzero(m)
            except (OSError, ValueError) as e:
                if isinstance(e, InputError):
                    raise
                raise InputError(f"{sp}: not a readable .npz ({e})") from None
            job.manifest["split_file"] = sp.name
        job._feat_name = str(nf)
        feats, shape = job.features_from_array(x)
        job._feat_name = str(nf)
        for f in (nf, ef) + ((Path(split),) if split is not None else ()):
            job.w.add_source(f)
        return job.write_graph(source, raw.parent.name if raw.name == "geom_gcn" else raw.name,
                               NodeInputs(), (np.arange(n, dtype=np.int64), y), feats, shape,
                               split_ids)
