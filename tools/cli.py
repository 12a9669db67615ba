"""The ``ooc`` command line: git-style subcommands.

    ooc convert planetoid --raw-dir DIR --name cora --out DATASET
    ooc convert edgelist edges.txt --out DATASET [--undirected] [--ids map] [--features x.json] ...
    ooc convert numpy edges.npy --out DATASET --features x.npy --labels y.npy
    ooc convert ogb ROOT | geom-gcn --raw-dir DIR | matlab FILE.mat | graphbolt DIR  --out DATASET
    ooc generate rmat --nodes 50M --edges 1e9 --feat-dim 128 --classes 16 --out DATASET
    ooc info DATASET
    ooc verify DATASET
    ooc partition DATASET --parts 8 --method metis
    ooc compress DATASET --subspaces 32
    ooc train DATASET --model gcn --fanout 10,10 --partitions 4 --buffer-partitions 1 --output-dir RUN
    ooc train --config run.yaml --set model.hidden=256       ooc train --resume RUN
    ooc eval RUN                                             ooc predict RUN --out preds.zarr
    ooc report RUN [RUN...] --out report/
    ooc demo

Every command exits non-zero with a one-line error naming the offending file or option on bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ooc.tools.options import SizeAction, size_options
from ooc.util.sizes import format_bytes as _human
from ooc.util.sizes import parse_bytes

__all__ = ["main", "build_parser"]

log = logging.getLogger("ooc")


# ---------------------------------------------------------------- convert
def _cmd_convert_planetoid(args: argparse.Namespace) -> int:
    from ooc.ingest.convert import convert_planetoid
    path = convert_planetoid(args.raw_dir, args.name, args.out, overwrite=args.overwrite,
                             feat_dtype=args.feat_dtype)
    print(f"wrote {path}")
    return 0


def _graph_options(args: argparse.Namespace) -> "GraphOptions":
    from ooc.ingest.convert import GraphOptions, parse_node_types
    from ooc.ingest.splits import parse_fractions
    return GraphOptions(
        num_nodes=args.num_nodes, ids=args.ids, one_based=args.one_based, undirected=args.undirected,
        self_loops=args.self_loops, dedup=args.dedup, feat_dtype=args.feat_dtype,
        nan_policy=args.nan_policy, memory_budget=args.memory_budget, partitions=args.partitions,
        num_classes=args.num_classes,
        node_types=parse_node_types(args.node_types) if args.node_types else [],
        src_type=args.src_type, dst_type=args.dst_type, progress=args.progress, name=args.name,
        split_random=parse_fractions(args.split_random) if args.split_random else None,
        stratify=args.stratify, split_seed=args.split_seed)


def _node_inputs(args: argparse.Namespace) -> "NodeInputs":
    from ooc.ingest.convert import NodeInputs
    splits = {}
    for spec in args.split or []:
        name, _, path = spec.partition("=")
        if not path:
            raise ValueError(f"--split takes NAME=FILE[:MEMBER] (train, valid, test), got {spec!r}")
        splits[name] = path
    cols = tuple(c if not c.isdigit() else int(c) for c in args.label_cols.split(","))
    if len(cols) != 2:
        raise ValueError(f"--label-cols takes ID_COLUMN,LABEL_COLUMN, got {args.label_cols!r}")
    return NodeInputs(labels=args.labels, label_cols=cols, features=args.features, splits=splits,
                      feature_format=args.feature_format, feat_dim=args.feat_dim)


def _col(c: str | None) -> int | str | None:
    return None if c is None else (int(c) if c.isdigit() else c)


def _cmd_convert_edgelist(args: argparse.Namespace) -> int:
    from ooc.ingest.convert import convert_edgelist
    header = {"auto": "auto", "yes": True, "no": False}[args.header]
    path = convert_edgelist(args.edges, args.out, _graph_options(args), _node_inputs(args),
                            sep=args.sep, comments=args.comments, header=header,
                            skip_rows=args.skip_rows, src_col=_col(args.src_col),
                            dst_col=_col(args.dst_col), weight_col=_col(args.weight_col),
                            overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _cmd_convert_numpy(args: argparse.Namespace) -> int:
    from ooc.ingest.convert import convert_numpy
    path = convert_numpy(args.edges, args.out, _graph_options(args), _node_inputs(args),
                         layout=args.layout, key=args.key, edge_weights=args.edge_weights,
                         overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _cmd_convert_ogb(args: argparse.Namespace) -> int:
    from ooc.ingest.convert import convert_ogb
    path = convert_ogb(args.root, args.out, _graph_options(args), scheme=args.scheme,
                       overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _cmd_convert_geom_gcn(args: argparse.Namespace) -> int:
    from ooc.ingest.convert import convert_geom_gcn
    path = convert_geom_gcn(args.raw_dir, args.out, _graph_options(args), split=args.split_file,
                            feature_format=args.feature_format, feat_dim=args.feat_dim,
                            overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _cmd_convert_matlab(args: argparse.Namespace) -> int:
    from ooc.ingest.matlab import convert_matlab
    path = convert_matlab(args.mat, args.out, _graph_options(args), _node_inputs(args),
                          adjacency=args.adjacency, attributes=args.attributes,
                          label_col=args.label_col, overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _cmd_convert_graphbolt(args: argparse.Namespace) -> int:
    from ooc.ingest.graphbolt import convert_graphbolt
    path = convert_graphbolt(args.root, args.out, _graph_options(args), task=args.task,
                             feature=args.feature, overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _add_graph_args(p: argparse.ArgumentParser, node_files: bool = True) -> None:
    p.add_argument("--out", required=True, help="dataset directory to write")
    p.add_argument("--name", help="dataset name (default: the input's name)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    p.add_argument("--num-nodes", type=_count, help="declared node count N (ids must be below it)")
    p.add_argument("--num-classes", type=_count,
                   help="declared class count C: labels in [-1, C) (default: labels dense 0..C-1)")
    p.add_argument("--ids", choices=["dense", "map", "string", "typed"], default="dense",
                   help="dense: ids are 0..N-1; map: sparse 64-bit ids renumbered in order; "
                        "string: any token; typed: per-type ids (--node-types)")
    p.add_argument("--one-based", action="store_true", help="ids start at 1 (0 is rejected)")
    p.add_argument("--node-types", help="typed nodes NAME:COUNT,... e.g. user:3,item:4")
    p.add_argument("--src-type", help="node type of the source column (--ids typed)")
    p.add_argument("--dst-type", help="node type of the destination column (--ids typed)")
    p.add_argument("--undirected", action="store_true", help="symmetrise and deduplicate")
    p.add_argument("--self-loops", choices=["keep", "remove"], default="keep")
    p.add_argument("--dedup", action="store_true", help="drop repeated (src, dst) pairs")
    p.add_argument("--feat-dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--nan-policy", choices=["error", "zero"], default="error",
                   help="NaN/inf features: reject (default) or replace by 0")
    p.add_argument("--memory-budget", action=SizeAction, default="2GB",
                   help="memory for the CSC build (default 2GB)")
    p.add_argument("--partitions", type=int, help="store P contiguous node partitions")
    p.add_argument("--progress", action="store_true", help="progress bars")
    p.add_argument("--split-random", metavar="TRAIN,VALID,TEST",
                   help="draw random splits of the labelled nodes, e.g. 0.6,0.2,0.2 (recorded in "
                        "the manifest)")
    p.add_argument("--stratify", action="store_true",
                   help="with --split-random: keep each class's share in every split")
    p.add_argument("--split-seed", type=int, default=0, help="seed of --split-random (default 0)")
    p.add_argument("--wait", action="store_true", help="wait for a process using --out")
    if node_files:
        p.add_argument("--labels", help="labels: text table (id, label: integers, true/false or "
                                        "class names) or .npy [N]")
        p.add_argument("--label-cols", default="0,1",
                       help="id and label columns of a text label table (indices or header names)")
        p.add_argument("--features",
                       help="node features: .npy [N, D] in node-id order; a .json object keyed by "
                            "node id ({\"id\": [active feature ids]} or {\"id\": [values]}; ids "
                            "mapped like the edge list's, stored dense); or structural[:D] "
                            "(log-degree + random projection of the adjacency, D = 64)")
        p.add_argument("--feature-format", choices=["auto", "dense", "indices"], default="auto",
                       help="JSON feature lists: indices (active feature ids), dense (values), or "
                            "auto (decided from the file)")
        p.add_argument("--feat-dim", type=int, help="feature width D for index lists (default: "
                                                    "the largest id + 1)")
        p.add_argument("--split", action="append", metavar="NAME=FILE[:MEMBER]",
                       help="split (train/valid/test): text ids, .npy ids or bool mask, an .npz "
                            "member (masks.npz:train_mask), or entry INDEX of a pickled LINKX "
                            "split list (splits.npy:0; read with a restricted unpickler)")


def _cmd_generate_rmat(args: argparse.Namespace) -> int:
    from ooc.ingest.generate import generate_rmat
    splits = tuple(float(x) for x in args.splits.split(","))
    if len(splits) != 3:
        raise ValueError(f"--splits takes TRAIN,VALID,TEST fractions, got {args.splits!r}")
    abc = tuple(float(x) for x in args.abc.split(","))
    if len(abc) != 3:
        raise ValueError(f"--abc takes A,B,C, got {args.abc!r}")
    path = generate_rmat(args.out, args.nodes, args.edges, feat_dim=args.feat_dim,
                         num_classes=args.classes, seed=args.seed, homophily=args.homophily,
                         noise=args.noise, feat_dtype=args.feat_dtype, splits=splits, abc=abc,
                         undirected=args.undirected, self_loops=args.self_loops, dedup=args.dedup,
                         memory_budget=args.memory_budget, partitions=args.partitions,
                         overwrite=args.overwrite, progress=args.progress)
    print(f"wrote {path}")
    return 0


def _count(text: str) -> int:
    """``1e9``, ``50M``, ``1_000_000`` -> int."""
    t = text.strip().replace("_", "").upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    return int(float(t) * mult)


def _cmd_bench_convert(args: argparse.Namespace) -> int:
    from ooc.tools.bench import bench_convert
    for e in args.edges:
        rec = bench_convert(e, args.nodes, args.workdir, args.memory_budget, baseline=args.baseline,
                            drop=not args.no_drop_caches, seed=args.seed, keep=args.keep,
                            results=args.results)
        s = rec["streaming"]
        print(f"{e:,} edges, {rec['nodes']:,} nodes: streaming {s['seconds']:.1f} s "
              f"({s['edges_per_s'] / 1e6:.2f} M edges/s), peak RSS {_human(s['peak_rss_bytes'])}")
        if "numpy" in rec:
            b = rec["numpy"]
            print(f"    numpy in-memory {b['seconds']:.1f} s ({b['edges_per_s'] / 1e6:.2f} M edges/s), "
                  f"peak RSS {_human(b['peak_rss_bytes'])}; time ratio numpy/streaming "
                  f"{rec['speed_ratio_streaming_over_numpy']:.2f}, RSS ratio streaming/numpy "
                  f"{rec['rss_ratio_streaming_over_numpy']:.2f}")
    return 0


# ---------------------------------------------------------------- info / verify
def _cmd_info(args: argparse.Namespace) -> int:
    from ooc.storage.dataset import Dataset, DatasetError
    ds = Dataset(args.dataset)
    problems = ds.check_metadata(chunk_files=False)  # what info shows comes from this metadata
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DatasetError(f"{problems[0]}{more}: the dataset is damaged (`ooc verify {ds.path}` lists "
                           "every problem)")
    man = ds.manifest
    usage = ds.disk_usage()
    if args.json:
        print(json.dumps({"manifest": man, "disk_usage": usage}, indent=2))
        return 0
    print(f"dataset      {ds.path}")
    print(f"name         {ds.name} (format v{man['format_version']}, written {man.get('created')}, "
          f"ooc {man.get('tool_version')})")
    print(f"nodes        {ds.num_nodes:,}")
    print(f"edges        {ds.num_edges:,} directed (CSC, in-edges)")
    print(f"features     {ds.feat_dim} x {man['arrays']['nodes/features']['dtype']}"
          if ds.has("features") else "features     none")
    names = man.get("class_names")
    shown = "" if not names else " (" + ", ".join(f"{i} = {n}" for i, n in enumerate(names[:10])) + \
        (f", ... {len(names) - 10} more" if len(names) > 10 else "") + ")"
    print(f"classes      {ds.num_classes}{shown}")
    if man.get("id_map"):
        kind = man["id_map"]["kind"]
        extra = (", types " + ", ".join(f"{t['name']} [{t['offset']}, {t['offset'] + t['count']})"
                                        for t in man.get("node_types", [])) if kind == "typed" else "")
        print(f"ids          external {kind} ids mapped to 0..N-1{extra}")
    for s in ("train", "valid", "test"):
        print(f"split {s:<6} {ds.split(s).shape[0]:,} nodes")
    drawn = man.get("split")
    if drawn:
        print(f"split drawn  at random: fractions {','.join(f'{f:g}' for f in drawn['fractions'])} of "
              f"{drawn['labelled_nodes']:,} labelled nodes, seed {drawn['seed']}"
              + (", stratified by class" if drawn["stratify"] else ""))
    off = ds.partition_offsets
    if off is None:
        print("partitions   none stored (ooc train groups ids into contiguous ranges)")
    else:
        sizes = off[1:] - off[:-1]
        print(f"partitions   {sizes.shape[0]} (nodes per partition min {sizes.min():,} max {sizes.max():,})")
        part = man.get("partitioning")
        if part:
            print(f"partitioned  {part['method']}: edge cut {100 * part['cut_fraction']:.2f}%, training "
                  f"nodes per partition {min(part['train_per_part']):,}-{max(part['train_per_part']):,}")
    pq = man.get("pq")
    if pq:
        print(f"pq codes     {pq['subspaces']} B per node ({pq['subspaces']} subspaces x {pq['centroids']} "
              f"centroids), relative squared error {pq['relative_error']:.3f}"
              + (f", decoding gain {pq['mean_gain']:.3f}" if "mean_gain" in pq else
                 ", decoded without gains (older codes: `ooc compress --overwrite` adds them)")
              + " (ooc compress)")
    print("arrays:")
    for rel, rec in sorted(man["arrays"].items()):
        print(f"  {rel:<26} {str(tuple(rec['shape'])):<20} {rec['dtype']:<8} "
              f"chunk {rec['chunk_rows']:>9,} rows  {_human(usage.get(rel, 0)):>10}")
    print(f"  {'catalog.lmdb':<26} {'':<20} {'':<8} {'':>20}  {_human(usage['catalog.lmdb']):>10}")
    print(f"total on disk {_human(sum(usage.values()))}")
    for src in man.get("sources", []):
        print(f"source       {src['path']} ({_human(src['size'])}, sha256 {src['sha256'][:16]}...)")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    """Status 0: sound; 1: problems found, one ``ooc verify: error:`` line each; 2: not checked
    (not a dataset, an unreadable catalog, a pending rewrite: the CLI's one-line error)."""
    from ooc.storage.dataset import Dataset
    ds = Dataset(args.dataset, verify="none")  # every problem listed: chunks re-hashed below
    problems = ds.check_structure()
    if not args.structure_only:
        problems += ds.verify_checksums()
    if problems:
        for p in dict.fromkeys(problems):  # an unreadable zarr.json is met by both passes
            where = "" if p.startswith(str(ds.path)) else f"{ds.path}: "
            print(f"ooc verify: error: {where}{p}", file=sys.stderr)
        return 1
    print(f"OK {ds.path}: structure{'' if args.structure_only else ' and checksums'} verified")
    return 0


# ---------------------------------------------------------------- train
def _flags(args: argparse.Namespace) -> dict:
    """Options given explicitly on the command line (every config field has a flag)."""
    from dataclasses import fields
    from ooc.config import TrainConfig
    names = {f.name for f in fields(TrainConfig)}
    return {k: v for k, v in vars(args).items() if k in names}


def _train_config(args: argparse.Namespace) -> "TrainConfig":
    """Defaults < ``--config`` YAML (or the run's saved config with ``--resume``) < flags < ``--set``."""
    from ooc.config import TrainConfig
    resume = getattr(args, "resume", None)
    if resume:
        if getattr(args, "config", None):
            raise ValueError("--resume RUN uses RUN/config.yaml; do not pass --config as well")
        saved = Path(resume) / "config.yaml"
        if not Path(resume).is_dir():
            raise FileNotFoundError(f"--resume {resume}: no such run directory")
        if not saved.exists():
            raise FileNotFoundError(f"{resume}: not a run directory (it has no config.yaml)")
        cfg = TrainConfig.from_sources(saved, _flags(args), getattr(args, "set", None))
        cfg.output_dir = str(resume)
        return cfg
    return TrainConfig.from_sources(getattr(args, "config", None), _flags(args),
                                    getattr(args, "set", None))


def _print_summary(m: dict) -> None:
    if m.get("task") == "link":
        ks = sorted((k for k in m if k.startswith("test_hits@")), key=lambda k: int(k.split("@")[1]))
        print(f"test MRR      {m['test_mrr']:.4f} (best validation MRR {m['val_mrr']:.4f} at epoch "
              f"{m['best_epoch']}); " + ", ".join(f"{k[5:]} {m[k]:.4f}" for k in ks))
    else:
        name = "micro-F1" if m.get("metric") == "micro_f1" else "accuracy"
        print(f"test {name} {m['test_acc']:.4f} (best validation {m['val_acc']:.4f} at epoch "
              f"{m['best_epoch']})")
        ogb = m.get("ogb") or {}
        for k in sorted(k for k in m if k.startswith("test_ogb_")):
            v = "val" + k[4:]
            print(f"test ogb {k[9:]:<5} {m[k]:.4f} (OGB's {ogb.get('dataset')} Evaluator"
                  + (f"; validation {m[v]:.4f}" if v in m else "") + ")")
        if ogb.get("note"):
            print(f"note          {ogb['note']}")
    if m["epoch_time_s"]:
        k = len(m["epoch_time_s"])
        print(f"epoch time    {sum(m['epoch_time_s']) / k:.2f} s mean over {k} epoch{'' if k == 1 else 's'}"
              + (" (early stop)" if m.get("stopped_early") else ""))
    approx = int(m.get("approx_rows", 0))
    outside = int(m["row_misses"])
    print(f"I/O           {_human(m['bytes_read'])} read (training and evaluation), buffer hit ratio {m['buffer_hit_ratio']:.3f}; "
          f"{outside:,} feature rows not in the partition buffer (cache hit ratio "
          f"{m.get('cache_hit_ratio', 0.0):.3f}" + (f", {approx:,} decoded from PQ codes" if approx else "")
          + ", the rest read from disk)")
    hist = m.get("history") or [{}]
    if m.get("eval_mode"):
        ev = [h["eval_time_s"] for h in hist if h.get("eval_time_s")]
        print("evaluation    " + ("layer-wise, each node the validation and test nodes need once"
                                  if m["eval_mode"] == "layerwise" else "sampled batches of seeds")
              + (f", {sum(ev) / len(ev):.2f} s mean" if ev else ""))
    top = max(hist, key=lambda h: h.get("machine_data_peak_bytes", 0))
    machine = top.get("machine_data_peak_bytes", 0)
    where = f", {top['peak_private_phase']} of epoch {top['epoch']}" if top.get("peak_private_phase") else ""
    ranks = (m.get("distributed") or {}).get("world_size", 1)
    whole = m["buffer_bytes"] >= m["dataset_feature_bytes"]  # slots are sized by the largest partition
    print(f"memory        buffer {_human(m['buffer_bytes'])} "
          + (f"(every partition of the {_human(m['dataset_feature_bytes'])} of features resident)"
             if whole else f"of {_human(m['dataset_feature_bytes'])} features")
          + f"; peak RSS {_human(m['peak_rss_bytes'])}" + (" (rank 0)" if ranks > 1 else "")
          + f"; machine data peak {_human(machine)} over the runtime{where}"
          + (" (held to the budget + up to 64 MiB per process of runtime growth)"
             if m["budget"].get("budget") else ""))
    b = m["budget"]
    budget = f"budget {_human(b['budget'])} planned {_human(b['planned'])}" if b.get("budget") else \
        "no budget"
    lowered = f", prefetch lowered to {b['prefetch']} to fit" if b.get("budget") and \
        b.get("prefetch", 0) < m["config"].get("prefetch", 0) else ""
    topo = f", topology {m['topology']}" if m.get("topology") else ""
    hot = (m.get("split") or {}).get("hot_topology_bytes")
    if hot is None and m.get("topology") == "disk" and m["config"].get("hot_topology") not in (None, "", "auto"):
        hot = parse_bytes(m["config"]["hot_topology"])
    if hot and m.get("topology") == "disk":
        topo += f" (hot lists {_human(hot)})"
    slots = f"{b['slots']} partition slot{'' if b['slots'] == 1 else 's'}"
    staging = f", batches in flight {_human(b['staging'])}" if b.get("budget") else ""
    ahead = ""
    cfg = m["config"]
    if str(cfg.get("read_ahead", "")).lower() == "auto" and m["mode"] == "exact" \
            and b.get("budget") and not b.get("read_ahead") and b["slots"] < b["num_parts"]:
        ahead = (", read-ahead off (--cache-size given)" if cfg.get("cache_size") else
                 ", read-ahead off (the budget holds no window of 2 batches)")
    if b.get("read_ahead") and b["slots"] < b["num_parts"]:
        last = hist[-1]
        reads = last.get("read_ahead_reads", 0)
        ahead = (f", read-ahead {b['read_ahead']} batches ({_human(b.get('read_ahead_bytes', 0))}"
                 + (f"; last epoch {reads} window read{'' if reads == 1 else 's'} of "
                    f"{_human(last.get('read_ahead_bytes', 0))} in {last.get('read_ahead_s', 0.0):.1f} s"
                    if reads else "") + ")")
    sa = m.get("sample_ahead", 0)
    sampled = (f", {sa} batch{'' if sa == 1 else 'es'} sampled ahead on "
               f"{'its' if sa == 1 else 'their'} own thread" if sa
               else ", windows sampled on the read-ahead's own thread"
               if b.get("read_ahead") and b["slots"] < b["num_parts"]
               else ", batches sampled on the loader thread")
    knobs = {"hybrid": f" (--hybrid-mix {m['config']['hybrid_mix']:g}, --ordering "
                       f"{m['config']['ordering']})",
             "buffer": f" (--ordering {m['config']['ordering']})"}
    mix = knobs.get(m["mode"], "")
    print(f"data path     mode {m['mode']}{mix}{topo}, {budget}{lowered}{staging}; {slots} of "
          f"{b['num_parts']} ({b['state_slots']} resident per state), swaps {m['swaps']}, cache "
          f"{_human(m['cache_bytes'])}{ahead}{sampled}, runtime overhead "
          f"{_human(m['rss_baseline_bytes'])}")
    split = m.get("split")
    if split:
        per_epoch = [h["train_bytes_read"] for h in hist if "train_bytes_read" in h]
        reqs = [h["train_read_requests"] for h in hist if "train_read_requests" in h]
        in_reqs = (f" in {int(sum(reqs) / len(reqs)):,} requests"
                   if reqs and len(reqs) == len(per_epoch) else "")
        mean = sum(per_epoch) / len(per_epoch) if per_epoch else 0.0
        off = (f", {100 * (mean / split['predicted_bytes'] - 1):+.1f}% of the bytes predicted"
               if split["predicted_bytes"] else "")
        real = (f"; measured {_human(int(mean))}{in_reqs} (mean over {len(per_epoch)} "
                f"epoch{'s' if len(per_epoch) > 1 else ''}{off})") if per_epoch else ""
        tried = len(split["candidates"])
        refused = sum(1 for c in split["candidates"] if c.get("refused"))
        print(f"budget split  chose topology {split['topology']}"
              + (f" (hot lists {_human(split['hot_topology_bytes'])})"
                 if split.get("hot_topology_bytes") else "")
              + (", PQ codes" if split["pq"] else ", exact rows (the dataset's PQ codes weighed, not chosen)"
                 if any(", pq" in c["split"] for c in split["candidates"]) else "")
              + f", {split['slots']} partition slot"
              f"{'' if split['slots'] == 1 else 's'}, cache {_human(split['cache_bytes'])}"
              + (f", read-ahead {split['read_ahead']} batches" if split.get("read_ahead") else "")
              + (" (the split planned when the run began" if not tried else " (best of "
                 f"{tried - refused} split{'' if tried - refused == 1 else 's'}"
                 + (f"; {refused} did not fit" if refused else ""))
              + f"); predicted training read {_human(split['predicted_bytes'])} per epoch in "
              f"{split['predicted_requests']:,} request{'' if split['predicted_requests'] == 1 else 's'}"
              f"{real}"
              + (f"; batches' label mix {split['class_mix'][0]:.2f} from the training set's "
                 f"(uniform batches {split['class_mix'][1]:.2f})" if split.get("class_mix") else ""))
    if m.get("miss_features") == "pq":
        print(f"pq            {approx:,} outer-hop rows decoded from PQ codes instead of "
              f"read ({_human(b.get('compressed', 0))} of codes in the budget)")
    if m.get("device_cache_rows"):
        print(f"device cache  {m['device_cache_rows']:,} rows ({_human(m['device_cache_bytes'])}, "
              f"{m['device_cache_policy']}) on {m['device_cache_device']}, hit ratio "
              f"{m['device_cache_hit_ratio']:.3f}")


def _cmd_train(args: argparse.Namespace) -> int:
    import copy

    from ooc.training.loop import train
    from ooc.training.rundir import set_run_control
    from ooc.util.files import write_json_atomic
    base = set_run_control(_train_config(args), overwrite=args.overwrite, wait=args.wait)
    from ooc.distributed.launch import launch_spec_from_args
    spec = launch_spec_from_args(args, base)  # --devices / --nnodes / torchrun: data-parallel
    if spec is not None:
        return _cmd_train_distributed(args, base, spec)
    if args.repeat <= 1:
        if not args.resume:  # a --repeat config (data/actor/split{i}) also runs alone: seed, i = 0
            base.dataset = base.dataset.format(seed=base.seed, i=0)
        m = train(base, resume=bool(args.resume))
        _print_summary(m)
        print(f"metrics       {Path(base.output_dir) / 'metrics.json'}")
        return 0
    if args.resume:
        raise ValueError("--resume continues one run; resume a repeat's runs one by one (RUN/seedN)")
    import numpy as np
    runs = []
    for i in range(args.repeat):
        cfg = copy.deepcopy(base)
        cfg.seed = base.seed + i
        cfg.dataset = base.dataset.format(seed=cfg.seed, i=i)
        cfg.output_dir = str(Path(base.output_dir) / f"seed{cfg.seed}")
        m = train(cfg)
        runs.append(m)
        print(f"seed {cfg.seed}: test {m['test_score']:.4f} val {m['val_score']:.4f} "
              f"({m['metric']}, best epoch {m['best_epoch']})")
    keys = sorted(k for k in runs[0] if k.startswith(("test_", "val_")) and
                  isinstance(runs[0][k], (int, float)) and not isinstance(runs[0][k], bool))
    summary: dict = {"seeds": [r["seed"] for r in runs], "runs": [r["config"]["output_dir"] for r in runs],
                     "metric": runs[0]["metric"], "config": base.to_dict()}
    for k in keys:
        vals = [float(r[k]) for r in runs]
        summary[k] = vals
        summary[f"{k}_mean"] = float(np.mean(vals))
        summary[f"{k}_std"] = float(np.std(vals))
    Path(base.output_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(base.output_dir) / "summary.json", summary)
    shown = [k for k in keys if k.startswith("test_") and k != "test_score"] or ["test_score"]
    for k in shown:
        if k.startswith("test_"):
            v = k.replace("test_", "val_", 1)
            extra = f" (validation {100 * summary[v + '_mean']:.2f})" if v + "_mean" in summary else ""
            print(f"{k} {100 * summary[k + '_mean']:.2f} +- {100 * summary[k + '_std']:.2f} over "
                  f"{args.repeat} seeds{extra}")
    return 0


def _check_machine_budget(cfg: "TrainConfig", spec: object) -> None:
    """Plan one machine's budget for its local ranks (as every rank will): a budget too small is
    refused here, with its reason, instead of in every rank."""
    from ooc.data.path import partition_offsets, plan_machine
    from ooc.storage.dataset import Dataset
    ds = Dataset(cfg.dataset)
    try:
        devices = spec.devices  # type: ignore[attr-defined]
        kind = "cuda" if str(devices[0]).startswith("cuda") else "cpu"
        plan_machine(cfg, ds, partition_offsets(cfg, ds), len(devices), kind, cfg.task,
                     ds.num_edges if cfg.task == "link" else None)
    finally:
        ds.close()


def _cmd_train_distributed(args: argparse.Namespace, cfg: "TrainConfig", spec: object) -> int:
    """``ooc train`` with ``--devices`` / ``--nnodes``, or one rank of a torchrun job."""
    import json

    from ooc.distributed.launch import run_cli
    if args.repeat > 1:
        raise ValueError("--repeat is not supported with --devices / --nnodes / torchrun; run one "
                         "job per seed (--seed S --output-dir RUN/seedS)")
    cfg.validate()
    if spec != "torchrun":  # the launcher: refuse a budget too small before starting any process
        _check_machine_budget(cfg, spec)
    rc = run_cli(cfg, bool(args.resume), spec if spec != "torchrun" else None)
    metrics = Path(cfg.output_dir) / "metrics.json"
    if rc == 0 and spec != "torchrun" and getattr(spec, "node_rank", 0) == 0 and metrics.exists():
        m = json.loads(metrics.read_text())
        _print_summary(m)
        d = m.get("distributed", {})
        print(f"ranks         {d.get('world_size')} ({d.get('backend')}), steps per rank "
              f"{d.get('steps_per_rank')}")
        print(f"metrics       {metrics}")
    elif rc != 0:
        print("ooc train: error: a rank failed (see its message above); the job was stopped",
              file=sys.stderr)
    return rc


# ---------------------------------------------------------------- eval / predict
def _cmd_eval(args: argparse.Namespace) -> int:
    from ooc.training.rundir import guard_inference
    from ooc.training.runs import eval_run
    with guard_inference(args.run, args.dataset, args.verify, weights=args.weights):
        res = eval_run(args.run, dataset=args.dataset, weights=args.weights, workdir=args.workdir,
                       progress=not args.no_progress)
    for k in sorted(k for k in res if k.startswith(("val_", "test_"))):
        print(f"{k:<16} {res[k]:.4f}")
    print(f"exact layer-wise inference over all nodes in {res['time_s']:.1f} s; "
          f"{_human(res['bytes_read'])} of features read; results in {Path(args.run) / 'eval.json'}")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from ooc.training.rundir import guard_inference
    from ooc.training.runs import predict_run
    with guard_inference(args.run, args.dataset, args.verify, weights=args.weights):
        res = predict_run(args.run, args.out, what=args.what, dataset=args.dataset,
                          weights=args.weights, workdir=args.workdir, progress=not args.no_progress,
                          overwrite=args.overwrite)
    for name, shape in res["arrays"].items():
        print(f"{name:<10} {tuple(shape)}")
    print(f"wrote {res['out']} (rows in original node id order)")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from ooc.training.report import make_report
    out = args.out or (str(Path(args.runs[0]) / "report") if len(args.runs) == 1 else "report")
    try:
        table, files = make_report(args.runs, out, plots=not args.no_plots)
    except ImportError as e:
        print(f"ooc report: error: {e}", file=sys.stderr)
        return 2
    print(table)
    for f in files:
        print(f"wrote {f}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from ooc.tools.demo import run_demo
    return run_demo(args.workdir, nodes=args.nodes, epochs=args.epochs, seed=args.seed,
                    progress=not args.no_progress)


# ---------------------------------------------------------------- parser
def _add_train_args(p: argparse.ArgumentParser) -> None:
    """One flag per :class:`~ooc.config.TrainConfig` field (``--hidden``, ``--residual/--no-residual``,
    ...), all without defaults so that only given flags override ``--config``."""
    import typing
    from dataclasses import MISSING, fields

    from ooc.config import TrainConfig
    p.add_argument("dataset", nargs="?", default=argparse.SUPPRESS,
                   help="dataset directory written by `ooc convert` (or data.dataset in --config)")
    p.add_argument("--config", metavar="YAML", help="run configuration file (see README: Configuration)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one option, e.g. --set model.hidden=256 (repeatable; wins over flags)")
    p.add_argument("--resume", metavar="RUN",
                   help="continue RUN from RUN/checkpoint.pt with RUN/config.yaml (bit-identical on CPU)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in --output-dir if it holds one (default: refuse)")
    p.add_argument("--wait", action="store_true",
                   help="wait for a process holding the run directory or writing the dataset")
    p.add_argument("--repeat", type=int, default=1,
                   help="train N times with seeds seed..seed+N-1 and report mean +- std; {seed} / {i} "
                        "in the dataset path are replaced per run")
    dp = p.add_argument_group("data-parallel training (README: Several devices and machines)")
    dp.add_argument("--devices", help="one process per device: N, cuda, or a list such as "
                    "cuda:0,cuda:1 or cpu,cpu (N CPU processes without CUDA; gloo on CPU, NCCL on CUDA)")
    dp.add_argument("--nnodes", type=int, default=1, help="machines in the job (default 1)")
    dp.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0 .. nnodes-1")
    dp.add_argument("--master-addr", default="127.0.0.1", help="address of machine 0 (rendezvous)")
    dp.add_argument("--master-port", type=int, default=0,
                    help="rendezvous port on machine 0 (default: a free port; required with --nnodes)")
    dp.add_argument("--dist-timeout", type=float, default=60.0,
                    help="seconds a collective waits for a silent rank before the job fails (default 60)")
    dp.add_argument("--dist-init-timeout", type=float, default=600.0,
                    help="seconds to wait for all ranks to join (default 600)")
    dp.add_argument("--dist-backend", choices=["gloo", "nccl"],
                    help="process-group backend (default: nccl on CUDA, gloo on CPU)")
    types = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        if f.name == "dataset":
            continue
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        if isinstance(default, list):
            default = ",".join(str(v) for v in default)
        kw: dict = {"dest": f.name, "default": argparse.SUPPRESS,
                    "help": f"{f.metadata.get('help', '')} (default: {default})"}
        tp = types[f.name]
        names = ["--" + f.name.replace("_", "-")]
        if f.name in ("fanouts", "eval_fanouts"):
            names.insert(0, names[0][:-1])  # --fanout, --fanouts
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = tp if tp in (int, float, str) else str
            if f.metadata.get("choices"):
                kw["choices"] = list(f.metadata["choices"])
            if f.metadata.get("size"):
                kw.update(action=SizeAction, empty=True, auto=bool(f.metadata.get("auto")))
        p.add_argument(*names, **kw)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ooc", description="Out-of-core GNN training on graphs larger than memory.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    conv = sub.add_parser("convert", help="convert a raw dataset into an ooc dataset",
                          description="Convert raw files into an ooc dataset directory (atomic).")
    csub = conv.add_subparsers(dest="format", metavar="FORMAT", required=True)
    pl = csub.add_parser("planetoid", help="Planetoid raw files ind.<name>.* (Cora, CiteSeer, PubMed)")
    pl.add_argument("--raw-dir", required=True, help="directory holding ind.<name>.{x,tx,allx,...}")
    pl.add_argument("--name", required=True, help="dataset name, e.g. cora or citeseer")
    pl.add_argument("--out", required=True, help="dataset directory to write")
    pl.add_argument("--feat-dtype", choices=["float32", "float16"], default="float32")
    pl.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    pl.add_argument("--wait", action="store_true", help="wait for a process using --out")
    pl.set_defaults(func=_cmd_convert_planetoid)

    el = csub.add_parser("edgelist", help="text edge list (SNAP, CSV/TSV, Matrix Market body; .gz ok)",
                         description="Stream a text edge list into a dataset in bounded memory.")
    el.add_argument("edges", help="edge list file")
    el.add_argument("--sep", help="separator (default: whitespace runs, tabs or commas)")
    el.add_argument("--comments", default="#%", help="comment line prefixes (default: #%%)")
    el.add_argument("--header", choices=["auto", "yes", "no"], default="auto",
                    help="first data line names the columns (auto: when it has no number)")
    el.add_argument("--skip-rows", type=int, default=0, help="lines to skip at the top")
    el.add_argument("--src-col", default="0", help="source column (index or header name)")
    el.add_argument("--dst-col", default="1", help="destination column (index or header name)")
    el.add_argument("--weight-col", help="edge weight column (index or header name)")
    _add_graph_args(el)
    el.set_defaults(func=_cmd_convert_edgelist)

    npc = csub.add_parser("numpy", help="NumPy .npy/.npz edge array: COO (2,E)/(E,2) or CSR",
                          description="Stream a NumPy edge array (memory-mapped) into a dataset.")
    npc.add_argument("edges", help=".npy (2,E)/(E,2) or .npz (edge_index | src,dst | row,col | "
                                   "indptr,indices)")
    npc.add_argument("--layout", choices=["auto", "2xE", "Ex2", "csr"], default="auto")
    npc.add_argument("--key", help=".npz member holding the COO array")
    npc.add_argument("--edge-weights", help=".npy [E] per-edge values (edge role)")
    _add_graph_args(npc)
    npc.set_defaults(func=_cmd_convert_numpy)

    og = csub.add_parser("ogb", help="OGB node-property raw layout (raw/edge.csv.gz, split/<scheme>/)",
                         description="Stream an OGB dataset folder (raw/ + split/) into a dataset.")
    og.add_argument("root", help="dataset folder holding raw/ and split/")
    og.add_argument("--scheme", help="split scheme folder under split/ (default: the only one)")
    _add_graph_args(og, node_files=False)
    og.set_defaults(func=_cmd_convert_ogb)

    gg = csub.add_parser("geom-gcn", help="Geom-GCN text layout (out1_*.txt + split .npz)",
                         description="Convert Geom-GCN files (Actor/film, Cornell, Texas, Wisconsin, "
                                     "Chameleon, Squirrel). Pass --undirected for Geom-GCN's graph.")
    gg.add_argument("--raw-dir", required=True, help="folder holding out1_node_feature_label.txt")
    gg.add_argument("--split-file", help="split .npz with train_mask/val_mask/test_mask")
    gg.add_argument("--feature-format", choices=["auto", "dense", "indices"], default="auto")
    gg.add_argument("--feat-dim", type=int, help="feature dimension for index lists")
    _add_graph_args(gg, node_files=False)
    gg.set_defaults(func=_cmd_convert_geom_gcn)

    mt = csub.add_parser("matlab", help="MATLAB .mat: sparse adjacency + node-attribute matrix",
                         description="Convert a .mat file (scipy.io, MATLAB v4-v7.2) holding an N x N "
                                     "adjacency and optionally an N x K attribute matrix (e.g. "
                                     "Facebook100: A, local_info). Integer attributes are categorical: "
                                     "--label-col I is the label (0 = missing), every other column is "
                                     "one-hot encoded (0 = missing: all zero); sparse or fractional "
                                     "attributes are stored as they are.")
    mt.add_argument("mat", help=".mat file")
    mt.add_argument("--adjacency", default="A", help="adjacency variable (default A)")
    mt.add_argument("--attributes", help="attribute variable (default: the only other N-row matrix)")
    mt.add_argument("--label-col", type=int, help="attribute column (0-based) holding the label")
    _add_graph_args(mt)
    mt.set_defaults(func=_cmd_convert_matlab)

    gb = csub.add_parser("graphbolt", help="DGL GraphBolt OnDiskDataset directory (metadata.yaml + .npy)",
                         description="Import a homogeneous GraphBolt OnDiskDataset: edges (numpy "
                                     "(2, E) or csv), one node feature, and one node-classification "
                                     "task's train/validation/test seeds and labels. Heterogeneous "
                                     "graphs and GraphBolt's preprocessed layout are refused.")
    gb.add_argument("root", help="directory holding metadata.yaml")
    gb.add_argument("--task", help="task name (default: the first node-classification task)")
    gb.add_argument("--feature", help="node feature name (default: feat, or the only one)")
    _add_graph_args(gb, node_files=False)
    gb.set_defaults(func=_cmd_convert_graphbolt)

    gen = sub.add_parser("generate", help="generate a synthetic dataset directly in the store")
    gsub = gen.add_subparsers(dest="model", metavar="MODEL", required=True)
    rm = gsub.add_parser("rmat", help="R-MAT graph (Graph500 a=0.57 b=0.19 c=0.19), planted labels",
                         description="Stream an R-MAT graph with learnable planted labels (classes are "
                                     "communities, features class centroids plus noise) into a "
                                     "dataset. Deterministic for a seed.")
    rm.add_argument("--nodes", type=_count, required=True, help="N (e.g. 50M)")
    rm.add_argument("--edges", type=_count, required=True, help="E directed edges (e.g. 1e9)")
    rm.add_argument("--feat-dim", type=int, default=128)
    rm.add_argument("--classes", type=int, default=16)
    rm.add_argument("--seed", type=int, default=0)
    rm.add_argument("--homophily", type=float, default=0.6,
                    help="probability that an edge stays in the source's class (default 0.6)")
    rm.add_argument("--noise", type=float, default=4.0, help="feature noise std (default 4.0)")
    rm.add_argument("--splits", default="0.1,0.05,0.05", help="train,valid,test fractions")
    rm.add_argument("--abc", default="0.57,0.19,0.19", help="R-MAT a,b,c (default Graph500)")
    rm.add_argument("--out", required=True)
    rm.add_argument("--overwrite", action="store_true")
    rm.add_argument("--undirected", action="store_true", help="symmetrise and deduplicate")
    rm.add_argument("--self-loops", choices=["keep", "remove"], default="keep")
    rm.add_argument("--dedup", action="store_true")
    rm.add_argument("--feat-dtype", choices=["float16", "float32"], default="float16")
    rm.add_argument("--memory-budget", action=SizeAction, default="2GB")
    rm.add_argument("--partitions", type=int)
    rm.add_argument("--progress", action="store_true")
    rm.add_argument("--wait", action="store_true", help="wait for a process using --out")
    rm.set_defaults(func=_cmd_generate_rmat)

    bench = sub.add_parser("bench", help="benchmarks")
    bsub = bench.add_subparsers(dest="what", metavar="WHAT", required=True)
    bc = bsub.add_parser("convert", help="streaming conversion of a binary edge list vs in-memory NumPy",
                         description="Time `ooc convert numpy` on an R-MAT (E,2) int32 .npy edge list "
                                     "(made if absent) and, with --baseline, a plain in-memory NumPy "
                                     "conversion; reports edges/s and peak RSS.")
    bc.add_argument("--edges", type=_count, nargs="+", default=[100_000_000],
                    help="edge counts, e.g. 100M 1B (default 100M)")
    bc.add_argument("--nodes", type=_count, help="N (default E/20)")
    bc.add_argument("--workdir", default="bench-data", help="input/output folder (~20 B per edge)")
    bc.add_argument("--memory-budget", action=SizeAction, default="2GB")
    bc.add_argument("--baseline", action="store_true", help="also run the in-memory NumPy build")
    bc.add_argument("--no-drop-caches", action="store_true", help="keep the page cache warm")
    bc.add_argument("--seed", type=int, default=0)
    bc.add_argument("--keep", action="store_true", help="keep the generated input")
    bc.add_argument("--results", help="append the JSON record to this file")
    bc.set_defaults(func=_cmd_bench_convert)
    from ooc.tools.bench_ooc import add_bench_ooc
    add_bench_ooc(bsub)
    from ooc.tools.bench_sample import add_sample_parser
    add_sample_parser(bsub)
    from ooc.tools.bench_scale import add_bench_scale
    add_bench_scale(bsub)
    from ooc.tools.bench_peer import add_bench_peer
    add_bench_peer(bsub)

    info = sub.add_parser("info", help="print counts, dtypes, sizes on disk, partitions")
    info.add_argument("dataset")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=_cmd_info)

    ver = sub.add_parser("verify", help="check checksums and structural invariants",
                         description="Check every array's metadata and chunk files, the structural "
                                     "invariants and every chunk's checksum. Exit status 0: sound; 1: "
                                     "problems found (one `ooc verify: error:` line each); 2: not "
                                     "checked (not a dataset, an unreadable catalog, an interrupted "
                                     "in-place partition).")
    ver.add_argument("dataset")
    ver.add_argument("--structure-only", action="store_true", help="skip the checksum pass")
    ver.set_defaults(func=_cmd_verify)

    tr = sub.add_parser("train", help="train a GNN out of core",
                        # the full usage is ~55 lines of options: an error shows one line instead
                        usage="%(prog)s [DATASET] [OPTIONS]  (ooc train --help lists them)",
                        description="Train GCN / GraphSAGE / GAT / GIN for node classification or "
                                    "link prediction with a partition buffer of bounded size. "
                                    "Options: defaults < --config YAML < flags < --set.")
    _add_train_args(tr)
    tr.set_defaults(func=_cmd_train)

    def run_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("run", help="run directory of `ooc train` (config.yaml, model.pt)")
        q.add_argument("--dataset", help="dataset to run on instead of the configured one")
        q.add_argument("--weights", choices=["best", "last"], default="best",
                       help="best: model.pt (best validation); last: the latest checkpoint")
        q.add_argument("--workdir", help="folder for the per-layer Zarr arrays (default RUN/inference; "
                                         "they go to a new folder inside it, removed afterwards)")
        q.add_argument("--no-progress", action="store_true")
        q.add_argument("--verify", choices=["checksums", "structure"], default="checksums",
                       help="dataset checks: structural scans, and chunk checksums on first read")
        q.add_argument("--wait", action="store_true", help="wait for a process writing the run or dataset")

    ev = sub.add_parser("eval", help="exact layer-wise inference of a trained run; validation/test scores",
                        description="Full-neighbour inference over the whole graph, layer by layer, out "
                                    "of core (each layer's embeddings written to a Zarr array).")
    run_args(ev)
    ev.set_defaults(func=_cmd_eval)

    pr = sub.add_parser("predict", help="predictions and embeddings for every node (original id order)",
                        description="Layer-wise inference; writes predictions, logits and embeddings "
                                    "with rows in original node id order.")
    run_args(pr)
    pr.add_argument("--out", required=True, help="preds.npy (one array, see --what) or preds.zarr "
                                                 "(group: pred, logits, embedding)")
    pr.add_argument("--what", choices=["pred", "logits", "embedding"], default=None,
                    help="the array written to a .npy file (default: pred; embedding for a "
                         "link-prediction run)")
    pr.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    pr.set_defaults(func=_cmd_predict)

    rep = sub.add_parser("report", help="loss/accuracy curves, I/O-stall timeline (PNG), summary table",
                         description="Compare training runs: curves.png, io.png and summary.md in --out; "
                                     "a --repeat directory is one group (mean +- std over its seeds).")
    rep.add_argument("runs", nargs="+", help="run directories (or --repeat directories)")
    rep.add_argument("--out", help="output folder (default RUN/report for one run, else ./report)")
    rep.add_argument("--no-plots", action="store_true", help="print the table only")
    rep.set_defaults(func=_cmd_report)

    from ooc.tools.partition import add_partition_parser
    add_partition_parser(sub)
    from ooc.tools.compress import add_compress_parser
    add_compress_parser(sub)

    demo = sub.add_parser("demo", help="generate a synthetic graph, convert it, train out of core",
                          description="End-to-end run on an embedded synthetic default (no download).")
    demo.add_argument("--workdir", default="ooc-demo", help="where the dataset and run go")
    demo.add_argument("--nodes", type=int, default=200_000,
                      help="nodes of the planted-partition graph (default 200,000: ~2 M edges)")
    demo.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    demo.add_argument("--seed", type=int, default=0,
                      help="seed of the graph and the training (default 0: test accuracy 0.9664)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(func=_cmd_demo)
    return parser


def _join_dash_values(argv: list[str], sizes: set[str]) -> list[str]:
    """``--fanout -1,-1`` -> ``--fanout=-1,-1`` and ``--memory-budget -16MB`` ->
    ``--memory-budget=-16MB`` (for every option in ``sizes``): argparse would take a value that
    begins with ``-`` for an option and report ``expected one argument``; joined, a fanout of -1
    means all neighbours and a negative size is refused by its option (:mod:`ooc.tools.options`)."""
    import re
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if (a in ("--fanout", "--fanouts", "--eval-fanout", "--eval-fanouts") and
                re.fullmatch(r"-?\d+(,-?\d+)*,?", nxt)) or \
                (a in sizes and re.match(r"-\.?\d", nxt)):
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _setup_logging(command: str, verbose: bool) -> None:
    """Warnings of every command on stderr as plain lines (``ooc partition: warning: ...``, like
    ``ooc partition: error: ...``); with ``-v`` every record from DEBUG on, timestamped and named by
    its logger, for diagnosis. Does nothing where logging is already configured (an embedding
    program, pytest)."""
    if verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        return
    handler = logging.StreamHandler()
    from ooc.util.logs import PlainFormatter
    handler.setFormatter(PlainFormatter(f"ooc {command}"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


_HUGETLB = "glibc.malloc.hugetlb=1"


def _hugepage_env() -> dict[str, str] | None:
    """The environment to re-execute the ``ooc`` command with so glibc's malloc backs large blocks
    with transparent huge pages (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, glibc >= 2.35, read
    only at process start), or None where that does not apply: not glibc / too old, already set,
    ``OOC_HUGEPAGES=0``, or already re-executed.

    Why: every batch allocates its rows (and torch its float32 copy and activations) afresh, and
    each 4 KiB page of those blocks is a page fault on first touch; with 2 MiB pages the 2 M-node
    bench trained 23% faster with everything resident and 9% faster in hybrid (docs/benchmarks.md).
    """
    import os
    import platform
    if os.environ.get("OOC_HUGEPAGES", "1") == "0" or os.environ.get("_OOC_REEXEC"):
        return None
    tun = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tun or not sys.executable:
        return None
    lib, ver = platform.libc_ver()
    try:
        if lib != "glibc" or tuple(int(x) for x in ver.split(".")[:2]) < (2, 35):
            return None
    except ValueError:
        return None
    return {**os.environ, "GLIBC_TUNABLES": f"{tun}:{_HUGETLB}" if tun else _HUGETLB,
            "_OOC_REEXEC": "1"}


def _reexec_argv() -> list[str] | None:
    """The command line of the huge-page re-execution: ``python -P -m ooc.tools.cli ARGS``. ``-P``
    (Python >= 3.11) keeps ``-m`` from putting the current directory first on ``sys.path``, where
    an ``ooc/`` folder would be imported instead of the installed package; without it (3.10) there
    is no re-execution."""
    if sys.version_info < (3, 11):
        return None
    return [sys.executable, "-P", "-m", "ooc.tools.cli", *sys.argv[1:]]


# Kernels each command is sure to compile on a first run, and the compile time measured for it on a
# 2-core VM (seconds; a cold Numba cache against a warm one).
_FIRST_RUN = {
    "convert": (("ooc.kernels.graph:sort_segments",), 15),
    "generate": (("ooc.kernels.graph:sort_segments", "ooc.kernels.rmat:rmat_edges"), 15),
    "train": (("ooc.kernels.sampling:_sample_hops", "ooc.kernels.aggregate:spmm_csr",
               "ooc.features.cache:_lookup"), 35),
    "demo": (("ooc.kernels.graph:sort_segments", "ooc.kernels.sampling:_sample_hops"), 55),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ooc`` console script; returns the exit status."""
    import os
    if argv is None:  # the console script: once, restart with huge-page malloc (see _hugepage_env)
        env = _hugepage_env()
        cmd = _reexec_argv()
        if env is not None and cmd is not None:
            os.execve(sys.executable, cmd, env)
    # OpenMP waiters that spin make torch ops ~100x slower when other processes share the cores;
    # sleeping waiters cost little.  Set before torch is imported; an explicit setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(_join_dash_values(list(sys.argv[1:] if argv is None else argv),
                                               size_options(parser)))
    _setup_logging(args.command, args.verbose)
    from ooc.config import ConfigError
    from ooc.storage.dataset import DatasetError
    from ooc.ingest.planetoid import PlanetoidError
    from ooc.storage.locks import set_lock_wait
    from ooc.util.signals import Terminated, exit_on_signals, stop_on_signals
    set_lock_wait(getattr(args, "wait", False))
    try:
        if args.command in _FIRST_RUN:
            from ooc.util.jit import first_run_notice
            first_run_notice(*_FIRST_RUN[args.command])
        with stop_on_signals(command=f"ooc {args.command}"):
            rc = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that left shows here, not at interpreter exit
        if argv is None:  # the console script: a signal during the interpreter's exit keeps rc
            exit_on_signals(rc)
        return rc
    except BrokenPipeError:  # `ooc info DS | head`: the reader left; stop quietly, as a pipe tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (DatasetError, PlanetoidError, ConfigError, FileExistsError, FileNotFoundError, ValueError,
            OSError) as e:
        print(f"ooc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        left = getattr(e, "left", None) or "partial output removed"
        print(f"ooc {args.command}: interrupted; {left}", file=sys.stderr)
        return 130
    except Terminated as e:
        left = getattr(e, "left", None) or "partial output removed"
        print(f"ooc {args.command}: {e}; {left}", file=sys.stderr)
        return 128 + e.signum


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
