"""The ``ooc`` command line: git-style subcommands.

    ooc convert planetoid --raw-dir DIR --name cora --out DATASET
    ooc convert edgelist edges.txt --out DATASET [--undirected] [--ids map] ...
    ooc convert numpy edges.npy --out DATASET --features x.npy --labels y.npy
    ooc generate rmat --nodes 50M --edges 1e9 --feat-dim 128 --classes 16 --out DATASET
    ooc info DATASET
    ooc verify DATASET
    ooc train DATASET --model gcn --fanout 10,10 --partitions 4 --buffer-partitions 1 --output-dir RUN
    ooc demo

Every command exits non-zero with a one-line error naming the offending file or option on bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

__all__ = ["main", "build_parser"]

log = logging.getLogger("ooc")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------- convert
def _cmd_convert_planetoid(args: argparse.Namespace) -> int:
    from ooc.tools.convert import convert_planetoid
    path = convert_planetoid(args.raw_dir, args.name, args.out, overwrite=args.overwrite,
                             feat_dtype=args.feat_dtype)
    print(f"wrote {path}")
    return 0


def _graph_options(args: argparse.Namespace) -> "GraphOptions":
    from ooc.tools.convert import GraphOptions, parse_node_types
    return GraphOptions(
        num_nodes=args.num_nodes, ids=args.ids, one_based=args.one_based, undirected=args.undirected,
        self_loops=args.self_loops, dedup=args.dedup, feat_dtype=args.feat_dtype,
        nan_policy=args.nan_policy, memory_budget=args.memory_budget, partitions=args.partitions,
        node_types=parse_node_types(args.node_types) if args.node_types else [],
        src_type=args.src_type, dst_type=args.dst_type, progress=args.progress, name=args.name)


def _node_inputs(args: argparse.Namespace) -> "NodeInputs":
    from ooc.tools.convert import NodeInputs
    splits = {}
    for spec in args.split or []:
        name, _, path = spec.partition("=")
        if not path:
            raise ValueError(f"--split takes NAME=FILE (train, valid, test), got {spec!r}")
        splits[name] = path
    cols = tuple(c if not c.isdigit() else int(c) for c in args.label_cols.split(","))
    if len(cols) != 2:
        raise ValueError(f"--label-cols takes ID_COLUMN,LABEL_COLUMN, got {args.label_cols!r}")
    return NodeInputs(labels=args.labels, label_cols=cols, features=args.features, splits=splits)


def _col(c: str | None) -> int | str | None:
    return None if c is None else (int(c) if c.isdigit() else c)


def _cmd_convert_edgelist(args: argparse.Namespace) -> int:
    from ooc.tools.convert import convert_edgelist
    header = {"auto": "auto", "yes": True, "no": False}[args.header]
    path = convert_edgelist(args.edges, args.out, _graph_options(args), _node_inputs(args),
                            sep=args.sep, comments=args.comments, header=header,
                            skip_rows=args.skip_rows, src_col=_col(args.src_col),
                            dst_col=_col(args.dst_col), weight_col=_col(args.weight_col),
                            overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _cmd_convert_numpy(args: argparse.Namespace) -> int:
    from ooc.tools.convert import convert_numpy
    path = convert_numpy(args.edges, args.out, _graph_options(args), _node_inputs(args),
                         layout=args.layout, key=args.key, edge_weights=args.edge_weights,
                         overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _cmd_convert_ogb(args: argparse.Namespace) -> int:
    from ooc.tools.convert import convert_ogb
    path = convert_ogb(args.root, args.out, _graph_options(args), scheme=args.scheme,
                       overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _cmd_convert_geom_gcn(args: argparse.Namespace) -> int:
    from ooc.tools.convert import convert_geom_gcn
    path = convert_geom_gcn(args.raw_dir, args.out, _graph_options(args), split=args.split_file,
                            feature_format=args.feature_format, feat_dim=args.feat_dim,
                            overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def _add_graph_args(p: argparse.ArgumentParser, node_files: bool = True) -> None:
    p.add_argument("--out", required=True, help="dataset directory to write")
    p.add_argument("--name", help="dataset name (default: the input's name)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    p.add_argument("--num-nodes", type=_count, help="declared node count N (ids must be below it)")
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
    p.add_argument("--memory-budget", default="2GB", help="memory for the CSC build (default 2GB)")
    p.add_argument("--partitions", type=int, help="store P contiguous node partitions")
    p.add_argument("--progress", action="store_true", help="progress bars")
    if node_files:
        p.add_argument("--labels", help="labels: text table (id, label) or .npy [N]")
        p.add_argument("--label-cols", default="0,1",
                       help="id and label columns of a text label table (indices or header names)")
        p.add_argument("--features", help=".npy [N, D] node features in node-id order")
        p.add_argument("--split", action="append", metavar="NAME=FILE",
                       help="split file (train/valid/test): text ids or .npy ids / bool mask")


def _cmd_generate_rmat(args: argparse.Namespace) -> int:
    from ooc.tools.generate import generate_rmat
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
    from ooc.storage.dataset import Dataset
    ds = Dataset(args.dataset)
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
    print(f"classes      {ds.num_classes}")
    if man.get("id_map"):
        kind = man["id_map"]["kind"]
        extra = (", types " + ", ".join(f"{t['name']} [{t['offset']}, {t['offset'] + t['count']})"
                                        for t in man.get("node_types", [])) if kind == "typed" else "")
        print(f"ids          external {kind} ids mapped to 0..N-1{extra}")
    for s in ("train", "valid", "test"):
        print(f"split {s:<6} {ds.split(s).shape[0]:,} nodes")
    off = ds.partition_offsets
    if off is None:
        print("partitions   none stored (ooc train groups ids into contiguous ranges)")
    else:
        sizes = off[1:] - off[:-1]
        print(f"partitions   {sizes.shape[0]} (nodes per partition min {sizes.min():,} max {sizes.max():,})")
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
    from ooc.storage.dataset import Dataset
    ds = Dataset(args.dataset)
    problems = ds.check_structure()
    if not args.structure_only:
        problems += ds.verify_checksums()
    if problems:
        for p in problems:
            print(f"FAIL {ds.path}: {p}", file=sys.stderr)
        return 1
    print(f"OK {ds.path}: structure{'' if args.structure_only else ' and checksums'} verified")
    return 0


# ---------------------------------------------------------------- train
def _train_config(args: argparse.Namespace) -> "TrainConfig":
    from ooc.config import TrainConfig, parse_fanouts
    return TrainConfig(
        dataset=args.dataset, output_dir=args.output_dir, model=args.model,
        fanouts=parse_fanouts(args.fanout), batch_size=args.batch_size,
        eval_batch_size=args.eval_batch_size, epochs=args.epochs, lr=args.lr,
        weight_decay=args.weight_decay, hidden=args.hidden, dropout=args.dropout, seed=args.seed,
        partitions=args.partitions, buffer_partitions=args.buffer_partitions,
        io_threads=args.io_threads, prefetch=args.prefetch, replace=args.replace,
        feat_norm=args.feat_norm, topology=args.topology, eval_every=args.eval_every,
        progress=not args.no_progress)


def _print_summary(m: dict) -> None:
    print(f"test accuracy {m['test_acc']:.4f} (best validation {m['val_acc']:.4f} at epoch "
          f"{m['best_epoch']})")
    print(f"epoch time    {sum(m['epoch_time_s']) / len(m['epoch_time_s']):.2f} s mean over "
          f"{m['epochs']} epochs")
    print(f"I/O           {_human(m['bytes_read'])} read, buffer hit ratio {m['buffer_hit_ratio']:.3f}, "
          f"{m['row_misses']:,} feature rows read from disk")
    print(f"memory        buffer {_human(m['buffer_bytes'])} of {_human(m['dataset_feature_bytes'])} "
          f"features; peak RSS {_human(m['peak_rss_bytes'])}")


def _cmd_train(args: argparse.Namespace) -> int:
    from ooc.train import train, write_json_atomic
    if args.repeat <= 1:
        m = train(_train_config(args))
        _print_summary(m)
        print(f"metrics       {Path(args.output_dir) / 'metrics.json'}")
        return 0
    import numpy as np
    accs, vals = [], []
    for i in range(args.repeat):
        cfg = _train_config(args)
        cfg.seed = args.seed + i
        cfg.output_dir = str(Path(args.output_dir) / f"seed{cfg.seed}")
        m = train(cfg)
        accs.append(m["test_acc"])
        vals.append(m["val_acc"])
        print(f"seed {cfg.seed}: test {m['test_acc']:.4f} val {m['val_acc']:.4f}")
    summary = {"seeds": list(range(args.seed, args.seed + args.repeat)), "test_acc": accs,
               "val_acc": vals, "test_acc_mean": float(np.mean(accs)),
               "test_acc_std": float(np.std(accs)), "val_acc_mean": float(np.mean(vals)),
               "config": _train_config(args).to_dict()}
    write_json_atomic(Path(args.output_dir) / "summary.json", summary)
    print(f"test accuracy {100 * np.mean(accs):.2f} +- {100 * np.std(accs):.2f} over {args.repeat} seeds "
          f"(validation {100 * np.mean(vals):.2f})")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from ooc.tools.demo import run_demo
    return run_demo(args.workdir, nodes=args.nodes, epochs=args.epochs, seed=args.seed,
                    progress=not args.no_progress)


# ---------------------------------------------------------------- parser
def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", help="dataset directory written by `ooc convert`")
    p.add_argument("--model", choices=["sage", "gcn"], default="sage", help="GNN (default: sage)")
    p.add_argument("--fanout", default="10,10",
                   help="neighbours per layer, output layer first; -1 = all (default: 10,10)")
    p.add_argument("--batch-size", type=int, default=256, help="seeds per batch (default: 256)")
    p.add_argument("--eval-batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1,
                   help="train N times with seeds seed..seed+N-1 and report mean +- std")
    p.add_argument("--partitions", type=int, default=4,
                   help="node partitions (contiguous id ranges unless stored; default: 4)")
    p.add_argument("--buffer-partitions", type=int, default=2,
                   help="feature partitions resident in host memory (default: 2)")
    p.add_argument("--io-threads", type=int, default=1, help="background partition loaders")
    p.add_argument("--prefetch", type=int, default=2, help="batches built ahead (0 = synchronous)")
    p.add_argument("--replace", action="store_true", help="sample neighbours with replacement")
    p.add_argument("--feat-norm", choices=["none", "row"], default="none",
                   help="row: divide feature rows by their sum (Kipf & Welling preprocessing)")
    p.add_argument("--topology", choices=["memory", "mmap"], default="memory",
                   help="load the CSC topology into memory or map it from disk")
    p.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs")
    p.add_argument("--output-dir", default="runs/latest", help="run directory (metrics.json, model.pt)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


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
    rm.add_argument("--memory-budget", default="2GB")
    rm.add_argument("--partitions", type=int)
    rm.add_argument("--progress", action="store_true")
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
    bc.add_argument("--memory-budget", default="2GB")
    bc.add_argument("--baseline", action="store_true", help="also run the in-memory NumPy build")
    bc.add_argument("--no-drop-caches", action="store_true", help="keep the page cache warm")
    bc.add_argument("--seed", type=int, default=0)
    bc.add_argument("--keep", action="store_true", help="keep the generated input")
    bc.add_argument("--results", help="append the JSON record to this file")
    bc.set_defaults(func=_cmd_bench_convert)

    info = sub.add_parser("info", help="print counts, dtypes, sizes on disk, partitions")
    info.add_argument("dataset")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=_cmd_info)

    ver = sub.add_parser("verify", help="check checksums and structural invariants")
    ver.add_argument("dataset")
    ver.add_argument("--structure-only", action="store_true", help="skip the checksum pass")
    ver.set_defaults(func=_cmd_verify)

    tr = sub.add_parser("train", help="train a GNN out of core",
                        description="Train GraphSAGE/GCN with a partition buffer of bounded size.")
    _add_train_args(tr)
    tr.set_defaults(func=_cmd_train)

    demo = sub.add_parser("demo", help="generate a synthetic graph, convert it, train out of core",
                          description="End-to-end run on an embedded synthetic default (no download).")
    demo.add_argument("--workdir", default="ooc-demo", help="where the dataset and run go")
    demo.add_argument("--nodes", type=int, default=200_000)
    demo.add_argument("--epochs", type=int, default=3)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-progress", action="store_true")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ooc`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from ooc.storage.dataset import DatasetError
    from ooc.tools.planetoid import PlanetoidError
    try:
        return int(args.func(args) or 0)
    except (DatasetError, PlanetoidError, FileExistsError, FileNotFoundError, ValueError,
            OSError) as e:
        print(f"ooc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ooc {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
