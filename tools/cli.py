"""The ``ooc`` command line: git-style subcommands.

    ooc convert planetoid --raw-dir DIR --name cora --out DATASET
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
        progress=not args.no_progress, sampler=args.sampler, layer_size=args.layer_size,
        num_clusters=args.num_clusters, clusters_per_batch=args.clusters_per_batch,
        walk_length=args.walk_length)


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
    g = p.add_argument_group("sampler (issue 4)")
    g.add_argument("--sampler", choices=["neighbor", "labor", "ladies", "cluster", "saint"],
                   default="neighbor",
                   help="training sampler: node-wise (GraphSAGE), LABOR-0, LADIES, ClusterGCN, "
                        "GraphSAINT random walks (default: neighbor); evaluation uses all neighbours")
    g.add_argument("--layer-size", type=int, default=512, help="LADIES nodes per layer (default 512)")
    g.add_argument("--num-clusters", type=int, default=32, help="ClusterGCN clusters (default 32)")
    g.add_argument("--clusters-per-batch", type=int, default=4,
                   help="ClusterGCN clusters per batch (default 4)")
    g.add_argument("--walk-length", type=int, default=2,
                   help="GraphSAINT random-walk length; --batch-size roots per batch (default 2)")


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

    bench = sub.add_parser("bench", help="benchmarks")
    bsub = bench.add_subparsers(dest="what", metavar="WHAT", required=True)
    from ooc.tools.bench_sample import add_sample_parser
    add_sample_parser(bsub)
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
