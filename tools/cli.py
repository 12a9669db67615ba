"""The ``ooc`` command line: git-style subcommands.

    ooc convert planetoid --raw-dir DIR --name cora --out DATASET
    ooc info DATASET
    ooc verify DATASET
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
        if not saved.exists():
            raise FileNotFoundError(f"{saved}: not a run directory (no config.yaml)")
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
    if m["epoch_time_s"]:
        print(f"epoch time    {sum(m['epoch_time_s']) / len(m['epoch_time_s']):.2f} s mean over "
              f"{len(m['epoch_time_s'])} epochs" + (" (early stop)" if m.get("stopped_early") else ""))
    print(f"I/O           {_human(m['bytes_read'])} read, buffer hit ratio {m['buffer_hit_ratio']:.3f}, "
          f"{m['row_misses']:,} feature rows read from disk")
    print(f"memory        buffer {_human(m['buffer_bytes'])} of {_human(m['dataset_feature_bytes'])} "
          f"features; peak RSS {_human(m['peak_rss_bytes'])}")


def _cmd_train(args: argparse.Namespace) -> int:
    import copy

    from ooc.train import train, write_json_atomic
    base = _train_config(args)
    if args.repeat <= 1:
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


# ---------------------------------------------------------------- eval / predict
def _cmd_eval(args: argparse.Namespace) -> int:
    from ooc.inference import eval_run
    res = eval_run(args.run, dataset=args.dataset, weights=args.weights, workdir=args.workdir,
                   progress=not args.no_progress)
    for k in sorted(k for k in res if k.startswith(("val_", "test_"))):
        print(f"{k:<16} {res[k]:.4f}")
    print(f"exact layer-wise inference over all nodes in {res['time_s']:.1f} s; "
          f"{_human(res['bytes_read'])} of features read; results in {Path(args.run) / 'eval.json'}")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from ooc.inference import predict_run
    res = predict_run(args.run, args.out, what=args.what, dataset=args.dataset, weights=args.weights,
                      workdir=args.workdir, progress=not args.no_progress)
    for name, shape in res["arrays"].items():
        print(f"{name:<10} {tuple(shape)}")
    print(f"wrote {res['out']} (rows in original node id order)")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from ooc.report import make_report
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
    p.add_argument("--repeat", type=int, default=1,
                   help="train N times with seeds seed..seed+N-1 and report mean +- std; {seed} / {i} "
                        "in the dataset path are replaced per run")
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
        if f.name == "fanouts":
            names = ["--fanout", "--fanouts"]
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = tp if tp in (int, float, str) else str
            if f.metadata.get("choices"):
                kw["choices"] = list(f.metadata["choices"])
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
        q.add_argument("--workdir", help="folder for the per-layer Zarr arrays (default RUN/inference, "
                                         "removed afterwards)")
        q.add_argument("--no-progress", action="store_true")

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
    pr.add_argument("--what", choices=["pred", "logits", "embedding"], default="pred",
                    help="the array written to a .npy file (default: pred)")
    pr.set_defaults(func=_cmd_predict)

    rep = sub.add_parser("report", help="loss/accuracy curves, I/O-stall timeline (PNG), summary table",
                         description="Compare training runs: curves.png, io.png and summary.md in --out; "
                                     "a --repeat directory is one group (mean +- std over its seeds).")
    rep.add_argument("runs", nargs="+", help="run directories (or --repeat directories)")
    rep.add_argument("--out", help="output folder (default RUN/report for one run, else ./report)")
    rep.add_argument("--no-plots", action="store_true", help="print the table only")
    rep.set_defaults(func=_cmd_report)

    demo = sub.add_parser("demo", help="generate a synthetic graph, convert it, train out of core",
                          description="End-to-end run on an embedded synthetic default (no download).")
    demo.add_argument("--workdir", default="ooc-demo", help="where the dataset and run go")
    demo.add_argument("--nodes", type=int, default=200_000)
    demo.add_argument("--epochs", type=int, default=3)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-progress", action="store_true")
    demo.set_defaults(func=_cmd_demo)
    return parser


def _join_list_values(argv: list[str]) -> list[str]:
    """``--fanout -1,-1`` -> ``--fanout=-1,-1``: argparse would take ``-1,-1`` for an option."""
    import re
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--fanout", "--fanouts") and i + 1 < len(argv) and \
                re.fullmatch(r"-?\d+(,-?\d+)*,?", argv[i + 1]):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ooc`` console script; returns the exit status."""
    # OpenMP waiters that spin make torch ops ~100x slower when other processes share the cores;
    # sleeping waiters cost little.  Set before torch is imported; an explicit setting wins.
    import os
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(_join_list_values(list(sys.argv[1:] if argv is None else argv)))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from ooc.config import ConfigError
    from ooc.storage.dataset import DatasetError
    from ooc.tools.planetoid import PlanetoidError
    try:
        return int(args.func(args) or 0)
    except (DatasetError, PlanetoidError, ConfigError, FileExistsError, FileNotFoundError, ValueError,
            OSError) as e:
        print(f"ooc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ooc {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
