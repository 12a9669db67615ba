"""``ooc bench peer``: ooc's training epoch beside DGL's standard mini-batch loop, on the same graph,
in the same run.

The dataset (an ooc dataset, e.g. the planted graph ``ooc bench ooc --keep`` writes) is exported once
to plain ``.npy`` files with the peer recipe's ``export_zarr_npy.py`` (``../shared/peers``), then every
repetition runs, one after the other and each in its own process with the page cache dropped first:
DGL's ``train_dgl.py`` (NeighborSampler + DataLoader + SAGEConv, in memory, in its own virtual
environment with torch 2.2.1: ``--dgl-python``), then ooc in every ``--modes`` entry (each followed by
the same run of ``--baseline-python``'s ooc, an older checkout, when given) -- ``resident``
(every partition resident: hybrid with a budget above the dataset, which is exact's plan), ``hybrid``,
``hybrid-pq`` (``--miss-features pq``; the dataset is compressed first if it has no codes),
``hybrid-pq-auto`` (``--miss-features auto``, the default: the budget split decides, codes made
likewise; the other hybrid entries read exact rows, ``--miss-features disk``) and
``exact`` (its default read-ahead windows; ``exact-cache``: ``--read-ahead 0``, per-batch reads
behind the CPU row cache; ``exact-belady``: with ``--cache-policy belady``; ``hybrid-serial`` and
``exact-serial``: ``--sample-ahead 0``, batches sampled on the loader thread; ``-layerwise`` and
``-sampled``: ``--eval-mode layerwise`` / ``sampled``, ``auto`` being layer-wise out of core; a
hybrid entry with ``:MIX``, e.g. ``hybrid:0.1``, runs with ``--hybrid-mix MIX``), each at
``--budget`` (default dataset / 3) with O_DIRECT reads.  Repetition ``i`` uses seed
``i`` for every run, so the repetitions also give the accuracy over seeds.  Same model and
hyper-parameters for all: GraphSAGE-mean, 2 layers, ``--fanout``, ``--batch-size``, ``--hidden``,
dropout on every layer's input, Adam, ``--lr``, ``--weight-decay``, the same weight initialisation
(``--init``: DGL SAGEConv's Glorot by default); evaluation on full neighbourhoods of the validation
and test nodes, ``--eval-batch-size`` per batch.

The table: per run, the last epoch's training time of each repetition and its ratio to DGL's in the
same repetition, the median ratio, the last epoch's evaluation time, the test accuracy after the last
epoch (mean over the repetitions' seeds), peak RSS and the load average before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["PEER_MODES", "run_bench_peer", "add_bench_peer"]

#: --modes entries
PEER_MODES = ("resident", "hybrid", "hybrid-pq", "hybrid-pq-auto", "hybrid-serial", "hybrid-layerwise",
              "hybrid-sampled", "exact", "exact-cache", "exact-belady", "exact-serial", "exact-layerwise",
              "exact-sampled")


def _default_peers() -> Path:
    for base in (os.environ.get("OOC_SHARED_PEERS"),
                 Path(__file__).resolve().parents[1].parent / "shared" / "peers", "/work/shared/peers"):
        if base and (Path(base) / "train_dgl.py").exists():
            return Path(base)
    return Path("shared/peers")


def _export(dataset: Path, npy: Path, peers: Path) -> dict:
    """The dataset as ``.npy`` files for the peer (made once: kept while newer than the dataset)."""
    stamp = npy / "features.npy"
    if stamp.exists() and stamp.stat().st_mtime >= (dataset / "catalog.lmdb").stat().st_mtime:
        return {"reused": True}
    t = time.perf_counter()
    subprocess.run([sys.executable, str(peers / "export_zarr_npy.py"), str(dataset), str(npy)], check=True,
                   capture_output=True)
    return {"reused": False, "seconds": time.perf_counter() - t}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _run_dgl(py: str, peers: Path, npy: Path, out: Path, a: argparse.Namespace, seed: int) -> dict:
    from ooc.tools.bench_ooc import drop_caches
    drop_caches()
    cmd = [py, str(peers / "train_dgl.py"), str(npy), "--fanout", a.fanout, "--batch-size",
           str(a.batch_size), "--eval-batch-size", str(a.eval_batch_size), "--hidden", str(a.hidden),
           "--epochs", str(a.epochs), "--threads", str(a.threads), "--lr", str(a.lr), "--weight-decay",
           str(a.weight_decay), "--dropout", str(a.dropout), "--seed", str(seed), "--json", str(out),
           "--init", "dgl" if a.init == "glorot" else "torch"]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), DGLBACKEND="pytorch")
    load = _load()
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    m = json.loads(out.read_text())
    h = m["history"]
    return {"run": "DGL, in memory", "seed": seed, "load_before": load, "load_after": _load(),
            "train_s": [x["train_time_s"] for x in h], "eval_s": [x["eval_s"] for x in h],
            "test_acc": h[-1]["test_acc"], "valid_acc": h[-1]["valid_acc"],
            "peak_rss_bytes": m["peak_rss_bytes"], "wall_s": time.perf_counter() - t,
            "command": " ".join(cmd), "peer": m["peer"]}


def _mode_args(spec: str, budget: int) -> list[str]:
    mode, _, mix = spec.partition(":")
    if mix:
        return _mode_args(mode, budget) + ["--hybrid-mix", mix]
    if mode == "resident":
        return ["--mode", "hybrid", "--memory-budget", str(64 << 30), "--direct-io"]
    args = ["--mode", "hybrid" if mode.startswith("hybrid") else "exact", "--memory-budget", str(budget),
            "--direct-io"]
    # hybrid entries read exact rows (--miss-features disk) unless they name pq or auto (the default)
    miss = "pq" if mode == "hybrid-pq" else "auto" if mode == "hybrid-pq-auto" else \
        "disk" if mode.startswith("hybrid") else None
    return args + (["--miss-features", miss] if miss else []) \
        + (["--cache-policy", "belady"] if mode == "exact-belady" else []) \
        + (["--read-ahead", "0"] if mode == "exact-cache" else []) \
        + (["--sample-ahead", "0"] if mode.endswith("-serial") else []) \
        + (["--eval-mode", "layerwise"] if mode.endswith("-layerwise") else []) \
        + (["--eval-mode", "sampled"] if mode.endswith("-sampled") else [])


_NAMES = {"resident": "ooc, everything resident", "hybrid": "ooc hybrid --miss-features disk, budget {}",
          "hybrid-pq": "ooc hybrid --miss-features pq, budget {}",
          "hybrid-pq-auto": "ooc hybrid (--miss-features auto, the default), budget {}",
          "exact": "ooc exact, budget {}",
          "exact-cache": "ooc exact --read-ahead 0, budget {}",
          "exact-belady": "ooc exact --cache-policy belady, budget {}",
          "hybrid-serial": "ooc hybrid --sample-ahead 0, budget {}",
          "exact-serial": "ooc exact --sample-ahead 0, budget {}",
          "hybrid-layerwise": "ooc hybrid --eval-mode layerwise, budget {}",
          "exact-layerwise": "ooc exact --eval-mode layerwise, budget {}",
          "hybrid-sampled": "ooc hybrid --eval-mode sampled, budget {}",
          "exact-sampled": "ooc exact --eval-mode sampled, budget {}"}


def _run_ooc(dataset: Path, out: Path, mode: str, budget: int, a: argparse.Namespace, seed: int,
             python: str = sys.executable, label: str = "") -> dict:
    from ooc.tools.bench_ooc import _train
    args = ["--model", "sage", "--fanout", a.fanout, "--batch-size", str(a.batch_size),
            "--eval-batch-size", str(a.eval_batch_size), "--hidden", str(a.hidden),
            "--epochs", str(a.epochs), "--lr", str(a.lr), "--weight-decay", str(a.weight_decay),
            "--dropout", str(a.dropout), "--seed", str(seed), "--partitions", str(a.partitions),
            "--threads", str(a.threads), *_mode_args(mode, budget), *a.ooc_args]
    if a.init != "torch":  # (an older checkout may not have --init; its default is torch's)
        args += ["--init", a.init]
    load = _load()
    # another checkout's interpreter runs from that checkout (python -m puts the folder first)
    cwd = Path(python).absolute().parents[2] if python != sys.executable else None
    m = _train(dataset, out, args, python, cwd)
    h = m["history"]
    from ooc.util.sizes import format_bytes
    what = "= dataset/3" if not a.budget else format_bytes(budget)
    base, _, mix = mode.partition(":")
    name = _NAMES[base].format(what) + (f", --hybrid-mix {mix}" if mix else "")
    return {"run": name + label, "mode": mode, "seed": seed, "load_before": load, "load_after": _load(),
            "train_s": [x["train_time_s"] for x in h], "eval_s": [x.get("eval_time_s", 0.0) for x in h],
            "compute_s": [x["compute_s"] for x in h], "stall_s": [x["stall_s"] for x in h],
            "gather_s": [x["gather_s"] for x in h], "sample_s": [x["sample_s"] for x in h],
            "bytes_read": [x["bytes_read"] for x in h],
            "cache_hit_ratio": [x.get("cache_hit_ratio", 0.0) for x in h],
            "buffer_hit_ratio": [x.get("buffer_hit_ratio", 0.0) for x in h],
            "test_acc": h[-1]["test_acc"], "valid_acc": h[-1]["val_acc"],
            "peak_rss_bytes": m["peak_rss_bytes"], "wall_s": m["process_wall_s"],
            "command": m["command"]}


def run_bench_peer(a: argparse.Namespace) -> dict:
    """Run the alternating repetitions (see the module docstring); returns and writes the results
    (``WORKDIR/bench_peer.json``).

    Raises:
        RuntimeError: no interpreter with DGL, or a run failed.
        ValueError: an unknown ``--modes`` entry.
    """
    from ooc.storage.dataset import Dataset
    from ooc.tools.bench_ooc import _ensure_pq, parse_modes
    from ooc.tools.bench_sample import _peer_python
    modes = parse_modes(a.modes, PEER_MODES)
    dataset = Path(a.dataset)
    if not dataset.is_dir():
        raise FileNotFoundError(f"{dataset}: no such dataset directory")
    peers = Path(a.peers_dir)
    py, why = _peer_python("dgl", a.dgl_python)
    if py is None:  # a one-line error (exit 2): the peer is not installed where we looked
        raise FileNotFoundError(f"ooc bench peer needs DGL: {why}")
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    ds = Dataset(dataset)
    size = ds.features.nbytes + ds.raw("indices").nbytes + ds.raw("indptr").nbytes
    if not a.partitions:
        off = ds.partition_offsets
        a.partitions = off.shape[0] - 1 if off is not None else 1
    info = {"nodes": ds.num_nodes, "edges": ds.num_edges, "feat_dim": ds.feat_dim,
            "feat_dtype": str(ds.features.dtype), "dataset_bytes": size}
    ds.close()
    from ooc.util.sizes import parse_bytes
    budget = parse_bytes(a.budget) if a.budget else size // 3
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
                            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
                 "dataset": str(dataset), **info, "budget": budget,
                 "args": {k: v for k, v in vars(a).items() if k != "func"}}
    if any(m.partition(":")[0] in ("hybrid-pq", "hybrid-pq-auto") for m in modes):  # first: adding the codes makes an older export stale
        res["pq"] = _ensure_pq(dataset)
    res["export"] = _export(dataset, work / "npy", peers)
    runs = []
    for rep in range(a.repeats):
        seed = a.seed + rep
        runs.append(dict(_run_dgl(py, peers, work / "npy", work / f"dgl-{rep}.json", a, seed), rep=rep))
        print(_line(runs[-1]), flush=True)
        for mode in modes:
            runs.append(dict(_run_ooc(dataset, work / f"run-{mode}-{rep}", mode, budget, a, seed),
                             rep=rep))
            print(_line(runs[-1]), flush=True)
            if a.baseline_python:
                runs.append(dict(_run_ooc(dataset, work / f"run-{mode}-{rep}-baseline", mode, budget, a,
                                          seed, a.baseline_python, " (baseline)"), rep=rep))
                print(_line(runs[-1]), flush=True)
    res["runs"] = runs
    res["table"] = _table(runs, a.repeats)
    (work / "bench_peer.json").write_text(json.dumps(res, indent=2))
    return res


def _line(r: dict) -> str:
    return (f"{r['run']} (seed {r['seed']}, load {r['load_before']}): train s/epoch "
            f"{', '.join(f'{t:.2f}' for t in r['train_s'])}; eval {r['eval_s'][-1]:.2f} s; "
            f"test acc {r['test_acc']:.4f}; peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB")


def _table(runs: list[dict], repeats: int) -> list[dict]:
    """One row per run kind: last-epoch train and eval times per repetition, ratios to DGL's in the
    same repetition, their medians, mean test accuracy, peak RSS range, loads."""
    dgl = {r["rep"]: r for r in runs if r["run"].startswith("DGL")}
    rows = []
    for name in dict.fromkeys(r["run"] for r in runs):
        rs = sorted((r for r in runs if r["run"] == name), key=lambda r: r["rep"])
        tr = [r["train_s"][-1] for r in rs]
        ev = [r["eval_s"][-1] for r in rs]
        ratio = [r["train_s"][-1] / dgl[r["rep"]]["train_s"][-1] for r in rs]
        eratio = [r["eval_s"][-1] / max(dgl[r["rep"]]["eval_s"][-1], 1e-9) for r in rs]
        accs = [r["test_acc"] for r in rs]
        row = {"run": name, "train_s": tr, "ratio": ratio, "median_ratio": statistics.median(ratio),
               "eval_s": ev, "eval_ratio": eratio, "median_eval_ratio": statistics.median(eratio),
               "test_acc": accs, "mean_test_acc": statistics.fmean(accs),
               "peak_rss_bytes": [r["peak_rss_bytes"] for r in rs],
               "loads": [r["load_before"] for r in rs]}
        for k in ("bytes_read", "cache_hit_ratio", "buffer_hit_ratio", "compute_s", "gather_s"):
            if k in rs[0]:
                row[k] = [r[k][-1] for r in rs]
        rows.append(row)
    return rows


def print_table(res: dict) -> None:
    """The markdown table of :func:`run_bench_peer`'s result."""
    gb = 1e9
    print(f"{res['date']}, {res['machine']}; {res['nodes']:,} nodes, {res['edges']:,} edges, "
          f"{res['feat_dim']}-d {res['feat_dtype']} (dataset {res['dataset_bytes'] / gb:.2f} GB), "
          f"budget {res['budget'] / gb:.2f} GB")
    print("| run | train s/epoch (last) | vs DGL | median | eval s/epoch | eval vs DGL | test acc "
          "(mean) | peak RSS | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res["table"]:
        j = " / ".join
        print(f"| {r['run']} | {j(f'{t:.2f}' for t in r['train_s'])} | "
              f"{j(f'{x:.2f}x' for x in r['ratio'])} | {r['median_ratio']:.2f}x | "
              f"{j(f'{t:.2f}' for t in r['eval_s'])} | {r['median_eval_ratio']:.2f}x | "
              f"{j(f'{x:.3f}' for x in r['test_acc'])} ({r['mean_test_acc']:.3f}) | "
              f"{min(r['peak_rss_bytes']) / gb:.2f}–{max(r['peak_rss_bytes']) / gb:.2f} GB | "
              f"{j(f'{x:.1f}' for x in r['loads'])} |")


def _cmd(a: argparse.Namespace) -> int:
    from ooc.tools import bench_ooc
    bench_ooc._DROP = not a.no_drop_caches
    try:
        res = run_bench_peer(a)
    except RuntimeError as e:  # a run failed: its command and the end of its stderr, no traceback
        print(f"ooc bench peer: {e}", file=sys.stderr)
        return 1
    print_table(res)
    return 0


def add_bench_peer(bsub: argparse._SubParsersAction) -> None:
    """Register ``ooc bench peer`` on the subparsers of ``ooc bench``."""
    from ooc.tools.bench import doc_help
    from ooc.tools.options import SizeAction
    p = bsub.add_parser("peer", help="ooc's training epoch beside DGL's loop, same graph, alternating",
                        description=doc_help(__doc__))
    p.add_argument("dataset", help="an ooc dataset (e.g. WORKDIR/planted of `ooc bench ooc --keep`)")
    p.add_argument("--workdir", default="bench-data/peer", help="export, runs and bench_peer.json")
    p.add_argument("--dgl-python", default=None, help="python with dgl (or $OOC_DGL_PYTHON)")
    p.add_argument("--peers-dir", default=str(_default_peers()),
                   help="the peer scripts (train_dgl.py, export_zarr_npy.py)")
    p.add_argument("--modes", default="resident,hybrid,hybrid-pq,exact",
                   help=f"comma-separated among {', '.join(PEER_MODES)}; a hybrid one with "
                        ":MIX (e.g. hybrid:0.1) runs with --hybrid-mix MIX")
    p.add_argument("--repeats", type=int, default=2, help="alternating repetitions, seeds SEED..")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--fanout", default="10,10")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--eval-batch-size", type=int, default=256,
                   help="seeds per evaluation batch, full neighbourhoods (1024 does not fit a budget "
                        "of dataset/3 on the 2 M-node bench)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2, help="torch threads of every run")
    p.add_argument("--init", default="glorot", choices=("glorot", "torch"),
                   help="the same weight init on both sides: glorot (DGL SAGEConv's own; ooc --init "
                        "glorot) or torch (nn.Linear's default; train_dgl.py --init torch)")
    p.add_argument("--partitions", type=int, default=0, help="default: the dataset's partitions")
    p.add_argument("--budget", action=SizeAction, empty=True, default="",
                   help="default: dataset bytes / 3")
    p.add_argument("--ooc-args", nargs=argparse.REMAINDER, default=[],
                   help="further `ooc train` options for every ooc run (last on the line)")
    p.add_argument("--baseline-python", default=None,
                   help="CHECKOUT/.venv/bin/python of another checkout (e.g. the main branch): every "
                        "ooc mode also runs with its ooc, right after this one: before/after in the "
                        "same run")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="do not drop the page cache before each run (dropping it writes "
                        "/proc/sys/vm/drop_caches, which needs root; without it out-of-core runs "
                        "read from the page cache and their times are not honest)")
    p.set_defaults(func=_cmd)
