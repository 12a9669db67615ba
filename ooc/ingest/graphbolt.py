"""``ooc convert graphbolt``: import a DGL GraphBolt ``OnDiskDataset`` directory (homogeneous graphs).

The directory holds ``metadata.yaml`` and the files it names (paths relative to it)::

    dataset_name: my_graph
    graph:
      nodes: [{num: 1000}]                                  # one node type (type omitted or single)
      edges: [{format: numpy, path: edges.npy}]             # numpy (2, E) or csv "src,dst" lines
    feature_data:
      - {domain: node, name: feat, format: numpy, path: node-feat.npy}     # [N, D]
    tasks:
      - name: node_classification
        num_classes: 10
        train_set:      [{data: [{name: seeds, format: numpy, path: train-ids.npy},
                                 {name: labels, format: numpy, path: train-labels.npy}]}]
        validation_set: [...]
        test_set:       [...]

Read: the edges (streamed), one node feature (``feat`` by default; ``numpy`` memory-mapped and
streamed, or ``torch`` tensors loaded with ``weights_only=True``), and one node-classification
task's sets (``seeds`` -- ``seed_nodes`` in older releases -- become the splits, ``labels`` the node
labels).  Refused with a message naming what is not supported: several node or edge types
(heterogeneous graphs), GraphBolt's preprocessed ``graph_topology`` files, formats other than
numpy / torch / csv.  Edge features and link-prediction tasks are not converted (noted in the
manifest).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ooc.ingest.convert import GraphOptions, NodeInputs, _CheckedNumpySource, _Job
from ooc.ingest.nodetables import labels_from_array
from ooc.ingest.readers import InputError, NumpyEdges, load_array

__all__ = ["convert_graphbolt", "read_metadata"]

log = logging.getLogger("ooc.convert")

_SETS = (("train_set", "train"), ("validation_set", "valid"), ("test_set", "test"))
_ID_NAMES = ("seeds", "seed_nodes")


def read_metadata(root: Path) -> dict:
    """``root/metadata.yaml`` as a dict.

    Raises:
        InputError: missing, not YAML, or not the raw (unprocessed) layout.
    """
    import yaml
    f = root / "metadata.yaml"
    if not f.is_file():
        raise InputError(f"{f}: no such file (a GraphBolt OnDiskDataset directory holds metadata.yaml)")
    try:
        meta = yaml.safe_load(f.read_text())
    except yaml.YAMLError as e:
        raise InputError(f"{f}: not valid YAML ({e})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{f}: expected a mapping with graph, feature_data, tasks")
    if "graph" not in meta:
        if "graph_topology" in meta:
            raise InputError(f"{f}: GraphBolt's preprocessed layout (graph_topology, a torch "
                             "FusedCSCSamplingGraph) is not supported; convert the raw dataset "
                             "directory (its metadata.yaml has graph: nodes / edges)")
        raise InputError(f"{f}: no graph section")
    return meta


def _types(items: list[dict], what: str, f: Path) -> None:
    """Refuse several node / edge types (heterogeneous graphs)."""
    if not isinstance(items, list) or not items:
        raise InputError(f"{f}: graph.{what} must be a non-empty list")
    if len(items) > 1:
        names = [str(i.get("type")) for i in items]
        raise InputError(f"{f}: {len(items)} {what[:-1]} types ({', '.join(names)}): heterogeneous "
                         "graphs are not supported (ooc converts one node and one edge type)")


def _load(root: Path, item: dict, where: str, mmap: bool = True) -> np.ndarray:
    """The array of a ``{format, path}`` item: numpy (memory-mapped) or torch (weights_only)."""
    fmt = item.get("format")
    if "path" not in item:
        raise InputError(f"{where}: no path")
    path = root / str(item["path"])
    if fmt == "numpy":
        return load_array(path, mmap=mmap)
    if fmt == "torch":
        import torch
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        try:
            t = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is reported with its name
            raise InputError(f"{path}: not a readable torch tensor file ({type(e).__name__}: {e})") from None
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{path}: holds a {type(t).__name__}, expected one tensor")
        return t.numpy()
    raise InputError(f"{where}: format {fmt!r} is not supported (numpy or torch)")


def _pick_task(tasks: list[dict], name: str | None, f: Path, root: Path) -> dict | None:
    if not tasks:
        if name is not None:
            raise InputError(f"{f}: no tasks, so no task {name!r}")
        return None
    if name is not None:
        for t in tasks:
            if t.get("name") == name:
                return t
        raise InputError(f"{f}: no task {name!r} (tasks: {[t.get('name') for t in tasks]})")
    for t in tasks:
        if _is_node_task(t, root):
            return t
    log.warning("%s: no node-classification task (tasks %s); converting graph and features only",
                f, [t.get("name") for t in tasks])
    return None


def _is_node_task(task: dict, root: Path) -> bool:
    for s in task.get("train_set") or []:
        for d in s.get("data") or []:
            if d.get("name") in _ID_NAMES:
                try:
                    return _load(root, d, "task").ndim == 1
                except InputError:
                    return False
    return False


def convert_graphbolt(root: str | Path, out: str | Path, opts: GraphOptions | None = None,
                      task: str | None = None, feature: str | None = None,
                      overwrite: bool = False) -> Path:
    """Convert a homogeneous GraphBolt ``OnDiskDataset`` directory into a dataset.

    Args:
        root: the directory holding ``metadata.yaml``.
        task: task name (default: the first node-classification task, i.e. with 1-D ``seeds``).
        feature: node feature name (default ``feat``, or the only node feature).

    Returns:
        The dataset path.

    Raises:
        InputError: unsupported layouts (named), missing files, malformed arrays.
    """
    opts = opts or GraphOptions()
    root = Path(root)
    f = root / "metadata.yaml"
    meta = read_metadata(root)
    graph = meta["graph"] or {}
    _types(graph.get("nodes"), "nodes", f)
    _types(graph.get("edges"), "edges", f)
    try:
        n = int(graph["nodes"][0]["num"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{f}: graph.nodes[0].num (the node count) is missing") from None
    if opts.ids != "dense":
        raise InputError(f"{root}: GraphBolt ids are dense 0..N-1; --ids {opts.ids} does not apply")
    if opts.num_nodes is not None and opts.num_nodes != n:
        raise InputError(f"{f}: {n} nodes but --num-nodes {opts.num_nodes}")
    opts.num_nodes = n
    edge = graph["edges"][0]
    efmt, epath = edge.get("format"), root / str(edge.get("path", ""))
    if efmt not in ("numpy", "csv"):
        raise InputError(f"{f}: edge format {efmt!r} is not supported (numpy or csv)")
    node_feats = [d for d in meta.get("feature_data") or [] if d.get("domain") == "node"]
    skipped = [f"{d.get('domain')}:{d.get('name')}" for d in meta.get("feature_data") or []
               if d.get("domain") != "node"]
    job = _Job(out, opts, overwrite, "graphbolt")
    with job.w:
        job.w.add_source(f)
        if efmt == "numpy":
            source = _CheckedNumpySource(NumpyEdges(epath, layout="2xE"), job, None, "")
        else:
            source = job.spool_dense_edges(epath, sep=",", header=False)
        job.w.add_source(epath)
        # features
        feats = shape = None
        by_name = {str(d.get("name")): d for d in node_feats}
        label_feat = by_name.pop("label", None) or by_name.pop("labels", None)
        if feature is None and by_name:
            if "feat" in by_name:
                feature = "feat"
            elif len(by_name) == 1:
                feature = next(iter(by_name))
            else:
                raise InputError(f"{f}: several node features ({', '.join(by_name)}); pass --feature")
        if feature is not None:
            if feature not in by_name:
                raise InputError(f"{f}: no node feature {feature!r} (has {sorted(by_name)})")
            item = by_name[feature]
            x = _load(root, item, f"{f}: feature {feature}")
            feats, shape = job.features_from_array(x)
            job._feat_name = str(root / str(item["path"]))
            job.w.add_source(root / str(item["path"]))
        # labels and splits of one node task
        t = _pick_task(meta.get("tasks") or [], task, f, root)
        labels = np.full(n, -1, dtype=np.int64)
        have_labels = False
        split_ids: dict[str, np.ndarray] = {}
        if t is not None:
            for key, split in _SETS:
                ids, lab = _task_set(root, t, key, f, job)
                if ids is None:
                    continue
                split_ids[split] = job.dense_ids(ids, lambda i, k=key: f"{f}: {k} seeds row {i}")
                if lab is not None:
                    sid = split_ids[split]
                    clash = (labels[sid] >= 0) & (labels[sid] != lab)
                    if clash.any():
                        i = int(np.argmax(clash))
                        raise InputError(f"{f}: node {sid[i]} has label {labels[sid[i]]} in one set "
                                         f"and {lab[i]} in {key}")
                    labels[sid] = lab
                    have_labels = True
            job.manifest["graphbolt_task"] = t.get("name")
        if label_feat is not None and not have_labels:
            lab, names = labels_from_array(_load(root, label_feat, f"{f}: feature label", mmap=False),
                                           str(root / str(label_feat["path"])))
            if lab.shape[0] != n:
                raise InputError(f"{f}: node feature label has {lab.shape[0]} rows, expected {n}")
            labels, have_labels = lab, True
            job.set_class_names(names)
        if skipped:
            job.manifest["graphbolt_not_converted"] = skipped
        job.manifest["dataset_name"] = meta.get("dataset_name")
        ncls = t.get("num_classes") if t is not None else None
        if ncls is not None and have_labels and labels.max() >= int(ncls):
            raise InputError(f"{f}: label {labels.max()} >= num_classes {ncls}")
        name = str(meta.get("dataset_name") or root.name)
        return job.write_graph(source, name, NodeInputs(),
                               (np.arange(n, dtype=np.int64), labels) if have_labels else None,
                               feats, shape, split_ids,
                               num_classes=int(ncls) if ncls is not None and have_labels else None)


def _task_set(root: Path, task: dict, key: str, f: Path, job: _Job
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(seed node ids, labels or None) of one train/validation/test set of a node task."""
    sets: list[dict[str, Any]] = task.get(key) or []
    if not sets:
        return None, None
    if len(sets) > 1:
        raise InputError(f"{f}: {key} has {len(sets)} typed sets ({[s.get('type') for s in sets]}): "
                         "heterogeneous tasks are not supported")
    data = {str(d.get("name")): d for d in sets[0].get("data") or []}
    id_item = next((data[k] for k in _ID_NAMES if k in data), None)
    if id_item is None:
        raise InputError(f"{f}: {key} of task {task.get('name')!r} has no seeds ({sorted(data)})")
    ids = np.asarray(_load(root, id_item, f"{f}: {key} seeds", mmap=False))
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise InputError(f"{root / str(id_item['path'])}: seeds of shape {ids.shape} and dtype "
                         f"{ids.dtype}; node tasks have one integer id per row (link-prediction "
                         "tasks are not converted)")
    job.w.add_source(root / str(id_item["path"]))
    lab = None
    if "labels" in data:
        lab_arr = np.asarray(_load(root, data["labels"], f"{f}: {key} labels", mmap=False))
        lp = root / str(data["labels"]["path"])
        if lab_arr.shape != ids.shape:
            raise InputError(f"{lp}: {lab_arr.shape[0] if lab_arr.ndim else 0} labels for "
                             f"{ids.shape[0]} seeds")
        lab, names = labels_from_array(lab_arr, str(lp))
        if names is not None:
            raise InputError(f"{lp}: GraphBolt labels must be class indices, found {lab_arr.dtype}")
        job.w.add_source(lp)
    return ids.astype(np.int64), lab
