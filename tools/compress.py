"""``ooc compress``: product-quantisation codes of a dataset's feature rows (see :mod:`ooc.compress`)."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_compress_parser"]


def _cmd_compress(args: argparse.Namespace) -> int:
    from ooc.compress import compress_dataset
    info = compress_dataset(args.dataset, args.subspaces, centroids=args.centroids,
                            sample_rows=args.sample_rows, iters=args.iters, seed=args.seed,
                            overwrite=args.overwrite, progress=not args.no_progress)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(f"pq codes     {info['subspaces']} subspaces x {info['centroids']} centroids, "
              f"{info['bytes_per_node']} B per node; relative squared error of the sample "
              f"{info['relative_error']:.3f}, decoding gain {info['mean_gain']:.3f} (decoded "
              "deviations from the column means are scaled by 1/gain); codebooks "
              f"{info['train_s']:.1f} s, encoding "
              f"{info['encode_s']:.1f} s")
    return 0


def add_compress_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``ooc compress`` on the CLI's subparsers."""
    p = sub.add_parser(
        "compress", help="product-quantisation codes of the feature rows (for --miss-features pq)",
        description="Learn k-means codebooks of M feature subspaces on a sample of rows and store "
                    "every node's codes (M bytes) in the dataset (nodes/pq/*), atomically. Hybrid "
                    "training with --miss-features pq decodes the rows a batch's outermost hop needs from "
                    "partitions that are not resident from them instead of reading them (seeds, inner "
                    "hops and evaluation stay exact). `ooc partition` keeps the codes (permuted with "
                    "the rows).")
    p.add_argument("dataset", help="dataset directory (codes are added in place)")
    p.add_argument("--subspaces", type=int, default=32,
                   help="M: bytes per node; more is closer to the rows (default: 32)")
    p.add_argument("--centroids", type=int, default=256, help="K per subspace, 2..256 (default: 256)")
    p.add_argument("--sample-rows", type=int, default=32768,
                   help="rows the codebooks are learnt on (default: 32768)")
    p.add_argument("--iters", type=int, default=15, help="k-means iterations (default: 15)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace existing codes")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--wait", action="store_true",
                   help="wait for processes using the dataset (a training run) instead of failing")
    p.set_defaults(func=_cmd_compress)
