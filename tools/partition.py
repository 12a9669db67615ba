"""``ooc partition``: assign nodes to partitions and rewrite the dataset in partition order."""

from __future__ import annotations

import argparse

from ooc.tools.options import SizeAction

__all__ = ["add_partition_parser"]


def _cmd_partition(args: argparse.Namespace) -> int:
    from ooc.partition import partition_dataset
    from ooc.util.sizes import format_bytes
    if args.parts is None and not args.resume:
        raise ValueError("--parts is required (unless --resume)")
    path, res = partition_dataset(args.dataset, args.parts, args.method, out=args.out, seed=args.seed,
                                  balance_train=not args.no_balance_train, passes=args.passes,
                                  objective=args.objective, memory_budget=args.memory_budget,
                                  edge_buckets=not args.no_edge_buckets, tol=args.tolerance,
                                  overwrite=args.overwrite, footprint=args.footprint,
                                  resume=args.resume, progress=args.progress)
    print(res.format())
    held, group = res.extra.get("held_bytes"), res.extra.get("group_bytes")
    split = (f": {format_bytes(held)} held whole (index arrays, one output chunk), "
             f"{format_bytes(group)} for rewrite groups" if held is not None else "")
    how = {"low": ", in place with the low disk footprint",
           "resumed": ", finishing the interrupted in-place rewrite"}.get(res.extra.get("footprint"), "")
    # the budget the rewrite ran under: a resumed one's is the interrupted run's, not --memory-budget
    print(f"wrote {path}{how} (memory budget {format_bytes(res.extra['memory_budget'])}{split})")
    return 0


def add_partition_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``ooc partition`` on the CLI's subparsers."""
    p = sub.add_parser(
        "partition", help="partition nodes (random | metis | stream) and reorder the dataset",
        description="Assign nodes to P partitions (training nodes balanced, none empty), report edge "
                    "cut and sizes, and rewrite the dataset so each partition is a contiguous id range "
                    "(features, CSC, labels, splits, partitions/offsets, nodes/perm, edge buckets).")
    p.add_argument("dataset", help="dataset directory (rewritten in place unless --out)")
    p.add_argument("--parts", type=int, default=None,
                   help="number of partitions P (<= nodes); required unless --resume")
    p.add_argument("--method", choices=["random", "metis", "stream"], default="metis",
                   help="metis (in memory, best cut), stream (Fennel/LDG over the on-disk CSC, any "
                        "size), random (baseline); default: metis")
    p.add_argument("--out", default=None,
                   help="write the partitioned dataset here instead (the dataset's own folder, "
                        "however spelled: in place; a folder inside it is refused)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--passes", type=int, default=2, help="restreaming passes of --method stream")
    p.add_argument("--objective", choices=["fennel", "ldg"], default="fennel",
                   help="streaming objective (default: fennel)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="allowed imbalance of nodes (stream) and training nodes (default: 0.05)")
    p.add_argument("--no-balance-train", action="store_true",
                   help="do not balance training nodes across partitions")
    p.add_argument("--memory-budget", action=SizeAction, default="2GB",
                   help="memory of the rewrite: its node-sized index arrays (~36 B/node) plus "
                        "the rewrite groups (default: 2GB)")
    p.add_argument("--no-edge-buckets", action="store_true",
                   help="skip partitions/buckets/* (edges grouped by source and destination partition)")
    p.add_argument("--footprint", choices=["auto", "low", "copy"], default="auto",
                   help="in place: copy (a whole new dataset beside the old, renamed over it: the "
                        "old stays whole until then; peak disk ~2x the dataset) or low (the old "
                        "feature chunks consumed as they are spooled: peak ~1.1-1.3x; a run cut "
                        "after it began is finished by --resume); auto: copy when the disk has "
                        "room for it (default)")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted in-place rewrite (the arguments it was started "
                        "with are kept; the same command again does the same)")
    p.add_argument("--progress", action="store_true",
                   help="progress bars (streaming passes, edge cut, each step of the rewrite; METIS "
                        "runs as one call without one)")
    p.add_argument("--wait", action="store_true",
                   help="wait for processes using the dataset (a training run) instead of failing")
    p.set_defaults(func=_cmd_partition)
