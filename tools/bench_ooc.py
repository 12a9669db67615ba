"""``ooc bench ooc``: the out-of-core engine measured side by side (results go to docs/benchmarks.md).

Synthetic part: a streaming planted-partition graph (communities -> classes, class-correlated
float16 features; :func:`ooc.kernels.generators.planted_in_edges`) written straight into the store,
partitioned with ``ooc partition --method metis`` (the streaming partitioner's cut is recorded
too), then, with the page cache dropped before every
run (``sync; echo 3 > /proc/sys/vm/drop_caches``, needs root) and O_DIRECT reads:

1. ``dd iflag=direct`` read bandwidth of the dataset's feature chunk files vs the partition-load bandwidth of
   the buffer manager (all partitions, sequentially, as swaps do), three alternating rounds, medians;
2. training runs, each in its own process (so peak RSS is per run): everything resident (budget >=
   dataset), then ``hybrid``, ``hybrid-pq`` (``--miss-features pq``, after ``ooc compress`` when the
   dataset has no codes yet), ``buffer`` and ``exact`` at a budget <= dataset / 3;
3. a table: epoch time, ratio to everything-resident, bytes read, hit ratios, swaps vs lower bound,
   I/O stall, peak RSS over the runtime baseline vs the budget, test accuracy.

Planetoid part: Cora and CiteSeer partitioned with METIS into P = 8, every mode at budgets of 1, 2
and 8 partitions, test accuracy (mean of ``seeds`` seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["write_planted_stream", "drop_caches", "dd_direct_bandwidth", "partition_load_bandwidth",
           "BENCH_MODES", "check_modes", "parse_modes", "run_bench_ooc", "run_planetoid_table", "add_bench_ooc"]


def write_planted_stream(out: str | Path, num_nodes: int, feat_dim: int = 128, num_classes: int = 16,
                         num_groups: int = 512, degree: int = 10, p_intra: float = 0.85,
                         noise: float = 25.0, train_frac: float = 0.01, eval_frac: float = 0.0025,
                         seed: int = 0, block: int = 1 << 18, overwrite: bool = True) -> Path:
    """Write a planted-partition dataset block by block (O(N) memory, float16 features).

    Nodes belong to ``num_groups`` random communities (labels ``group % num_classes``); features are
    ``centroid[label] + noise * N(0, I)``; every node has ``degree`` in-edges (``p_intra`` from its
    community).  Splits: random ``train_frac`` / ``eval_frac`` / ``eval_frac`` of the nodes.

    Returns:
        The dataset path.
    """
    from ooc.kernels.generators import planted_in_edges
    from ooc.storage.dataset import DatasetWriter
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, num_groups, num_nodes).astype(np.int32)
    labels = (groups % num_classes).astype(np.int32)
    order = np.argsort(groups, kind="stable").astype(np.int64)
    starts = np.zeros(num_groups + 1, dtype=np.int64)
    starts[1:] = np.cumsum(np.bincount(groups, minlength=num_groups))
    centroids = rng.normal(0.0, 1.0, (num_classes, feat_dim)).astype(np.float32)
    idx_dtype = np.int32 if num_nodes < 2**31 else np.int64
    with DatasetWriter(out, overwrite=overwrite) as w:
        w.write_array("indptr", np.arange(num_nodes + 1, dtype=np.int64) * degree)
        iw = w.array_writer("indices", idx_dtype, (), expected_rows=num_nodes * degree)
        fw = w.array_writer("features", np.float16, (feat_dim,), expected_rows=num_nodes)
        for a in range(0, num_nodes, block):
            b = min(num_nodes, a + block)
            brng = np.random.default_rng([seed, a])
            iw.append(planted_in_edges(groups, order, starts, a, b, degree, p_intra, brng)
                      .astype(idx_dtype))
            x = centroids[labels[a:b]] + noise * brng.standard_normal((b - a, feat_dim),
                                                                       dtype=np.float32)
            fw.append(x.astype(np.float16))
        w.finish_array(iw)
        w.finish_array(fw)
        w.write_array("labels", labels)
        perm = rng.permutation(num_nodes)
        t, e = int(train_frac * num_nodes), int(eval_frac * num_nodes)
        w.write_array("train", np.sort(perm[:t]))
        w.write_array("valid", np.sort(perm[t:t + e]))
        w.write_array("test", np.sort(perm[t + e:t + 2 * e]))
        return w.commit(name="planted-stream", num_nodes=num_nodes, num_classes=num_classes,
                        source_format="planted-stream",
                        generator={"seed": seed, "groups": num_groups, "degree": degree,
                                   "p_intra": p_intra, "noise": noise})


_DROP = True


def drop_caches() -> bool:
    """:func:`ooc.tools.bench.drop_caches` unless disabled (``--no-drop-caches``: all feature reads
    are O_DIRECT anyway, so the page cache cannot serve them); False where not permitted or disabled."""
    from ooc.tools.bench import drop_caches as _drop
    return _drop() if _DROP else False


def dd_direct_bandwidth(ds_path: Path) -> dict:
    """``dd if=CHUNK of=/dev/null bs=8M iflag=direct`` over every feature chunk file of the dataset
    (page cache dropped first): the same bytes the partition loads read, in the same state of any
    cache below the guest (a file written just before would be served from the host's write cache).
    Seconds are the sum of dd's own reported copy times (process start-up excluded); bytes/s."""
    import re
    from ooc.storage.dataset import Dataset
    ds = Dataset(ds_path)
    paths = [ds.features.chunk_path(i) for i in range(ds.features.num_chunks)]
    ds.close()
    drop_caches()
    total, secs, last = 0, 0.0, ""
    for path in paths:
        r = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=8M", "iflag=direct"],
                           capture_output=True, text=True, check=True)
        last = r.stderr.strip().splitlines()[-1]
        m = re.match(r"(\d+) bytes .* copied, ([0-9.eE+-]+) s", last)
        if m is None:
            raise RuntimeError(f"unexpected dd output: {last!r}")
        total += int(m.group(1))
        secs += float(m.group(2))
    return {"bytes": total, "seconds": secs, "bandwidth_Bps": total / max(secs, 1e-9),
            "files": len(paths), "dd": last}


def partition_load_bandwidth(ds_path: Path, direct: bool = True, threads: int = 4) -> dict:
    """Load every partition once, in order, as the buffer manager's swaps do (page cache dropped)."""
    from ooc.storage.io import ALIGN, DiskRows, aligned_empty
    from ooc.storage.dataset import Dataset
    ds = Dataset(ds_path)
    off = ds.partition_offsets
    rows = DiskRows(ds.features, direct=direct, threads=threads)
    buf = aligned_empty(int(np.diff(off).max()) * rows.row_bytes + 2 * ALIGN)
    drop_caches()
    t = time.perf_counter()
    total = 0
    for p in range(off.shape[0] - 1):
        total += rows.read_range(int(off[p]), int(off[p + 1]), buf)
    dt = time.perf_counter() - t
    rows.close()
    ds.close()
    return {"bytes": total, "seconds": dt, "bandwidth_Bps": total / dt, "direct": direct,
            "threads": threads}


def _train(ds: Path, out: Path, args: list[str], python: str = sys.executable,
           cwd: Path | None = None) -> dict:
    """``ooc train DS --output-dir OUT ARGS`` in a fresh ``python`` process (from ``cwd``: the
    checkout whose ``ooc`` it imports), page cache dropped first; its metrics.json."""
    import shutil
    shutil.rmtree(out, ignore_errors=True)  # the bench's own run folder from an earlier round
    drop_caches()
    cmd = [python, "-m", "ooc.tools.cli", "train", str(ds), "--output-dir", str(out),
           "--no-progress", *args]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    m = json.loads((out / "metrics.json").read_text())
    m["command"] = "ooc train " + " ".join(str(c) for c in cmd[4:])
    m["process_wall_s"] = time.perf_counter() - t
    return m


def _row(name: str, m: dict, base_epoch: float | None) -> dict:
    h = m["history"]
    ep = float(h[-1]["train_time_s"])  # steady state: the last epoch (the first also fills the buffer)
    return {"run": name, "mode": m["mode"], "epoch_train_s": ep,
            "first_epoch_train_s": float(h[0]["train_time_s"]),
            "ratio_to_resident": ep / base_epoch if base_epoch else 1.0,
            "bytes_read_per_epoch": float(np.mean([x["bytes_read"] for x in h])),
            "buffer_hit_ratio": m["buffer_hit_ratio"], "cache_hit_ratio": m["cache_hit_ratio"],
            "swaps_per_epoch": float(np.mean([x.get("swaps", 0) for x in h])),
            "swaps_lower_bound": h[-1].get("swaps_lower_bound"),
            "stall_s_per_epoch": float(np.mean([x["stall_s"] for x in h])),
            "peak_rss_over_baseline": m.get("epoch_peak_rss_bytes", m["peak_rss_bytes"]) - m["rss_baseline_bytes"],
            "rss_baseline": m["rss_baseline_bytes"], "budget": m["budget"]["budget"],
            # the machine: every local rank's private peak + shared segments once, over baselines
            "machine_data_peak": max(x.get("machine_data_peak_bytes", 0) for x in h),
            "ranks": m.get("distributed", {}).get("world_size", 1),
            "test_acc": m["test_acc"],
            "final_test_acc": m.get("final", {}).get("test_acc", m.get("final_test_acc")),
            "resident_partitions": m["budget"]["slots"], "num_parts": m["budget"]["num_parts"],
            # the mix only matters when not every partition is resident (else: exact's plan)
            "hybrid_mix": m.get("hybrid_mix", 0.0)
            if m["budget"]["state_slots"] < m["budget"]["num_parts"] else 0.0,
            "command": m["command"]}


#: --modes entries (each optionally :MIX for hybrid runs)
BENCH_MODES = ("exact", "buffer", "hybrid", "hybrid-pq")


def parse_modes(text: str, allowed: tuple[str, ...] = BENCH_MODES) -> list[str]:
    """The entries of a comma-separated ``--modes`` value, stripped, empty ones dropped, checked by
    :func:`check_modes` (ValueError)."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    check_modes(modes, allowed)
    return modes


def check_modes(modes: list[str], allowed: tuple[str, ...] = BENCH_MODES) -> None:
    """Raises ValueError naming a ``--modes`` entry that is not one of ``allowed`` or a hybrid one
    of them with ``:MIX`` (its ``--hybrid-mix``, in ``[0, 1)``), or listed twice (its runs would
    share one folder)."""
    for spec in modes:
        if modes.count(spec) > 1:
            raise ValueError(f"--modes entry {spec!r} is listed twice")
        mode, sep, mix = spec.partition(":")
        if mode not in allowed or (sep and not mode.startswith("hybrid")):
            raise ValueError(f"--modes entry {spec!r}: use {', '.join(allowed)}, or a hybrid "
                             "one with :MIX")
        if sep:
            try:
                ok = 0 <= float(mix) < 1
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"--modes entry {spec!r}: MIX must be a number in [0, 1)")


def _ensure_pq(ds_path: Path) -> dict:
    """The dataset's PQ codes (``ooc compress`` defaults), written now if absent (timed)."""
    from ooc.compress import compress_dataset
    from ooc.storage.dataset import Dataset
    ds = Dataset(ds_path)
    info = ds.manifest.get("pq")
    ds.close()
    if info is not None:
        return dict(info, reused=True)
    t = time.perf_counter()
    info = compress_dataset(ds_path, 32, progress=False)
    info["seconds"] = time.perf_counter() - t
    return info


def _reusable(ds_path: Path, nodes: int, feat_dim: int, parts: int) -> bool:
    """Whether ``ds_path`` holds a planted dataset of this size, partitioned into ``parts``."""
    from ooc.storage.dataset import Dataset
    try:
        ds = Dataset(ds_path)
    except Exception:  # noqa: BLE001 - missing or incomplete: regenerate
        return False
    try:
        off = ds.partition_offsets
        return (ds.num_nodes == nodes and ds.feat_dim == feat_dim and off is not None
                and off.shape[0] - 1 == parts)
    finally:
        ds.close()


def run_bench_ooc(workdir: Path, nodes: int, feat_dim: int, parts: int, budget: int | None,
                  epochs: int, modes: list[str], keep: bool = False, reuse: bool = False,
                  hybrid_mix: float = 0.25, lr_schedule: str = "none", devices: int = 1) -> dict:
    """The synthetic side-by-side benchmark; returns (and writes) the result dictionary.

    ``reuse``: keep a dataset left in ``workdir/planted`` by an earlier ``--keep`` run when its
    size and partition count match (generation and partitioning are then not re-measured).
    ``hybrid_mix``: ``--hybrid-mix`` of the hybrid run; ``lr_schedule``: every run's
    ``--lr-schedule`` (``cosine`` takes the step noise out of accuracy comparisons over several
    epochs); ``devices`` > 1: every mode also runs with ``--devices N`` on this machine (the same
    budget for all ranks together, the per-rank training and evaluation batches divided by N so the
    global batches are the same), its epoch time and machine memory beside the one-rank run.
    """
    from ooc.partition import partition_dataset
    from ooc.storage.dataset import Dataset
    workdir.mkdir(parents=True, exist_ok=True)
    res: dict = {"drop_caches": _DROP, "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
                            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    ds_path = workdir / "planted"
    if reuse and _reusable(ds_path, nodes, feat_dim, parts):
        res["reused_dataset"] = str(ds_path)
    else:
        t = time.perf_counter()
        ds_path = write_planted_stream(ds_path, nodes, feat_dim)
        res["generate_s"] = time.perf_counter() - t
        from ooc.partition import partition_nodes
        from ooc.storage.dataset import Dataset as _D
        d0 = _D(ds_path)  # the streaming partitioner's cut, for the record (not used for training)
        t = time.perf_counter()
        sres = partition_nodes(d0.indptr, d0.raw("indices"), d0.num_nodes, parts, "stream",
                               d0.split("train"))
        res["stream_partition"] = {"seconds": time.perf_counter() - t,
                                   "cut_fraction": sres.cut_fraction}
        d0.close()
        del sres
        t = time.perf_counter()
        _, pres = partition_dataset(ds_path, parts, "metis", memory_budget="12GB")
        res["partition_s"] = time.perf_counter() - t
        res["partition"] = {k: v for k, v in pres.summary().items()
                            if k not in ("sizes", "train_per_part")}
        (workdir / "partition.json").write_text(json.dumps(
            {k: res[k] for k in ("generate_s", "stream_partition", "partition_s", "partition")}))
    if "partition" not in res and (workdir / "partition.json").exists():
        res.update(json.loads((workdir / "partition.json").read_text()))
    ds = Dataset(ds_path)
    size = ds.features.nbytes + ds.raw("indices").nbytes + ds.raw("indptr").nbytes
    res["dataset_bytes"] = size
    res["features_bytes"] = ds.features.nbytes
    res["num_edges"] = ds.num_edges
    ds.close()
    budget = budget or size // 3
    res["budget"] = budget
    # alternate dd and partition loads (3 rounds, medians): caches below the guest serve either
    # side now and then, and one round swung between 76% and 330% on the VM
    rounds = [(dd_direct_bandwidth(ds_path), partition_load_bandwidth(ds_path)) for _ in range(3)]
    res["bandwidth_rounds"] = [{"dd_Bps": d["bandwidth_Bps"], "loads_Bps": l["bandwidth_Bps"]}
                               for d, l in rounds]
    res["dd"] = sorted((d for d, _ in rounds), key=lambda r: r["bandwidth_Bps"])[1]
    res["partition_loads"] = sorted((l for _, l in rounds), key=lambda r: r["bandwidth_Bps"])[1]
    common = ["--model", "sage", "--fanout", "10,10", "--batch-size", "256", "--hidden", "64",
              "--epochs", str(epochs), "--prefetch", "1", "--eval-batch-size", "256",
              "--partitions", str(parts), "--direct-io", "--seed", "0", "--lr", "0.01",
              "--weight-decay", "0", "--lr-schedule", lr_schedule]
    if any(m.partition(":")[0] == "hybrid-pq" for m in modes):
        res["pq"] = _ensure_pq(ds_path)
    runs = {}
    runs["resident"] = _train(ds_path, workdir / "run-resident",
                              common + ["--mode", "hybrid", "--memory-budget", str(64 << 30)])
    base = float(runs["resident"]["history"][-1]["train_time_s"])
    for spec in modes:  # MODE, or hybrid[-pq]:MIX for a hybrid run with another --hybrid-mix
        mode, _, mix = spec.partition(":")
        name = mode if not mix else f"{mode} (mix {mix})"
        train_mode = "hybrid" if mode == "hybrid-pq" else mode
        runs[name] = _train(ds_path, workdir / f"run-{spec.replace(':', '-')}",
                            common + ["--mode", train_mode, "--memory-budget", str(budget)]
                            + (["--topology", "disk"] if mode == "buffer" else [])
                            + (["--miss-features", "pq" if mode == "hybrid-pq" else "disk"]
                               if train_mode == "hybrid" else [])
                            + (["--hybrid-mix", mix or str(hybrid_mix)]
                               if train_mode == "hybrid" else []))
        if devices > 1:
            per = common.copy()  # the same global batches: per-rank batch sizes divided by N
            per[per.index("--batch-size") + 1] = str(max(256 // devices, 1))
            per[per.index("--eval-batch-size") + 1] = str(max(256 // devices, 1))
            runs[f"{name} x{devices} ranks"] = _train(
                ds_path, workdir / f"run-{spec.replace(':', '-')}-x{devices}",
                per + ["--mode", train_mode, "--memory-budget", str(budget), "--devices", str(devices)]
                + (["--topology", "disk"] if mode == "buffer" else [])
                + (["--miss-features", "pq" if mode == "hybrid-pq" else "disk"]
                   if train_mode == "hybrid" else [])
                + (["--hybrid-mix", mix or str(hybrid_mix)] if train_mode == "hybrid" else []))
    res["rows"] = [_row(k, m, base) for k, m in runs.items()]
    (workdir / "bench_ooc.json").write_text(json.dumps(res, indent=2))
    if not keep:
        import shutil
        shutil.rmtree(workdir / "planted", ignore_errors=True)
    return res


def run_planetoid_table(shared: Path, workdir: Path, names: list[str], seeds: int,
                        epochs: int, eval_every: int = 5) -> list[dict]:
    """Accuracy of every mode on Planetoid datasets, METIS P = 8, budgets of 1, 2, 8 partitions.

    Runs that are identical by construction are trained once and reported for each budget:
    ``exact`` does not depend on the budget (tested: identical loss sequences), and with all 8
    partitions resident ``buffer``, ``hybrid`` and ``hybrid-pq`` (hybrid with ``--miss-features
    pq``, codes of ``ooc compress --subspaces 32``) share the plan and sample the full graph.
    """
    from ooc.config import TrainConfig
    from ooc.partition import partition_dataset
    from ooc.compress import compress_dataset
    from ooc.ingest.convert import convert_planetoid
    from ooc.training.loop import train
    from ooc.training.rundir import set_run_control
    rows = []
    for name in names:
        ds = convert_planetoid(shared / name / "planetoid", name, workdir / name, overwrite=True)
        _, pres = partition_dataset(ds, 8, "metis")
        compress_dataset(ds, 32, progress=False)  # hybrid-pq: the default codes (32 B per node)
        runs: dict = {}
        for mode, c in [("exact", 8), ("hybrid", 1), ("hybrid", 2), ("hybrid", 8), ("hybrid-pq", 1),
                        ("hybrid-pq", 2), ("buffer", 1), ("buffer", 2)]:
            accs, hits = [], []
            for s in range(seeds):
                cfg = TrainConfig(dataset=str(ds), output_dir=str(workdir / f"{name}-{mode}-{c}-{s}"),
                                  model="gcn", fanouts=[10, 10], batch_size=256, epochs=epochs,
                                  hidden=16, feat_norm="row", partitions=8, buffer_partitions=c,
                                  seed=s, mode=mode.removesuffix("-pq"),
                                  miss_features="pq" if mode == "hybrid-pq" else "disk",
                                  eval_every=eval_every, progress=False)
                m = train(set_run_control(cfg, overwrite=True))  # reruns replace their runs
                accs.append(m["test_acc"])
                hits.append(m["buffer_hit_ratio"])
            runs[(mode, c)] = (accs, hits)
        runs[("buffer", 8)] = runs[("hybrid", 8)]
        runs[("hybrid-pq", 8)] = runs[("hybrid", 8)]  # everything resident: no misses to decode
        for c in (1, 2):
            runs[("exact", c)] = runs[("exact", 8)]
        for mode in ("exact", "hybrid", "hybrid-pq", "buffer"):
            for c in (1, 2, 8):
                accs, hits = runs[(mode, c)]
                rows.append({"dataset": name, "mode": mode, "resident": c, "seeds": seeds,
                             "edge_cut": pres.cut_fraction,
                             "test_acc_mean": float(np.mean(accs)), "test_acc_std": float(np.std(accs)),
                             "buffer_hit_ratio": float(np.mean(hits))})
                print(f"{name:9s} {mode:9s} {c}/8 resident: {100 * np.mean(accs):.1f} "
                      f"+- {100 * np.std(accs):.1f} (hit ratio {np.mean(hits):.3f})", flush=True)
    (workdir / "planetoid_table.json").write_text(json.dumps(rows, indent=2))
    return rows


def _print_synthetic(res: dict) -> None:
    gb = 1e9
    if "partition" not in res:
        print(f"reused {res.get('reused_dataset')}")
        res = {**res, "generate_s": float("nan"), "partition_s": float("nan"),
               "partition": {"cut_fraction": float("nan")},
               "stream_partition": {"cut_fraction": float("nan"), "seconds": float("nan")}}
    print(f"dataset {res['dataset_bytes'] / gb:.2f} GB (features {res['features_bytes'] / gb:.2f} GB, "
          f"{res['num_edges']:,} edges), budget {res['budget'] / gb:.2f} GB; generate "
          f"{res['generate_s']:.0f} s, METIS partition + rewrite {res['partition_s']:.0f} s "
          f"(cut {100 * res['partition']['cut_fraction']:.1f}%; stream/Fennel cut "
          f"{100 * res['stream_partition']['cut_fraction']:.1f}% in "
          f"{res['stream_partition']['seconds']:.0f} s)")
    print(f"dd iflag=direct {res['dd']['bandwidth_Bps'] / 1e6:.0f} MB/s; partition loads "
          f"{res['partition_loads']['bandwidth_Bps'] / 1e6:.0f} MB/s "
          f"({100 * res['partition_loads']['bandwidth_Bps'] / res['dd']['bandwidth_Bps']:.0f}% of dd; "
          "medians of rounds " + ", ".join(f"{r['dd_Bps'] / 1e6:.0f}/{r['loads_Bps'] / 1e6:.0f}"
                                           for r in res.get("bandwidth_rounds", [])) + " MB/s)")
    print("| run | resident parts | last epoch (s) | vs resident | read/epoch (GB) | buffer hit | cache hit "
          "| swaps (lower bound) | stall (s) | peak RSS - baseline (GB) | machine memory - baselines (GB) "
          "| test acc |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        name = r["run"] + (f" (mix {r['hybrid_mix']})" if r.get("hybrid_mix") and "mix" not in r["run"]
                           else "")
        print(f"| {name} | {r['resident_partitions']}/{r['num_parts']} | {r['epoch_train_s']:.1f} | "
              f"{r['ratio_to_resident']:.2f}x | {r['bytes_read_per_epoch'] / gb:.2f} | "
              f"{r['buffer_hit_ratio']:.3f} | {r['cache_hit_ratio']:.3f} | {r['swaps_per_epoch']:.0f} "
              f"({r['swaps_lower_bound']}) | {r['stall_s_per_epoch']:.1f} | "
              f"{r['peak_rss_over_baseline'] / gb:.2f} (budget {r['budget'] / gb:.2f}) | "
              f"{r.get('machine_data_peak', 0) / gb:.2f} | {100 * r['test_acc']:.2f} |")


def _cmd_bench_ooc(args: argparse.Namespace) -> int:
    from ooc.util.sizes import parse_bytes
    global _DROP
    _DROP = not args.no_drop_caches
    work = Path(args.workdir)
    modes = parse_modes(args.modes)
    if not args.skip_synthetic:
        res = run_bench_ooc(work, args.nodes, args.feat_dim, args.parts,
                            parse_bytes(args.budget) if args.budget else None, args.epochs,
                            modes, keep=args.keep or args.reuse, reuse=args.reuse,
                            hybrid_mix=args.hybrid_mix, lr_schedule=args.lr_schedule,
                            devices=args.devices)
        _print_synthetic(res)
    if not args.skip_planetoid:
        from ooc.tools.cli import log  # noqa: F401 (same logging setup)
        shared = Path(args.shared_data)
        run_planetoid_table(shared, work / "planetoid", ["cora", "citeseer"], args.seeds,
                            args.planetoid_epochs)
    return 0


def add_bench_ooc(bsub: argparse._SubParsersAction) -> None:
    """Register ``ooc bench ooc`` on the subparsers of ``ooc bench``."""
    from ooc.tools.bench import doc_help
    from ooc.tools.options import SizeAction
    p = bsub.add_parser("ooc", help="out-of-core engine: bandwidth, epoch time, RSS, accuracy",
                        description=doc_help(__doc__))
    p.add_argument("--workdir", default="/work/bench-data/issue5/bench")
    p.add_argument("--nodes", type=int, default=4_000_000)
    p.add_argument("--feat-dim", type=int, default=256)
    p.add_argument("--parts", type=int, default=256,
                   help="METIS partitions: many small ones, grouped into buffer states (COMET)")
    p.add_argument("--budget", action=SizeAction, empty=True, default="",
                   help="default: dataset bytes / 3")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--modes", default="hybrid,buffer,exact",
                   help="comma-separated among exact, buffer, hybrid, hybrid-pq (hybrid with "
                        "--miss-features pq; the dataset is compressed first if it has no codes); "
                        "hybrid:MIX / hybrid-pq:MIX run with --hybrid-mix MIX")
    p.add_argument("--devices", type=int, default=1,
                   help="also run every mode with --devices N (CPU ranks here), same budget")
    p.add_argument("--keep", action="store_true", help="keep the generated dataset")
    p.add_argument("--reuse", action="store_true",
                   help="reuse WORKDIR/planted when it matches --nodes/--feat-dim/--parts (implies --keep)")
    p.add_argument("--hybrid-mix", type=float, default=0.25, help="--hybrid-mix of the hybrid run")
    p.add_argument("--lr-schedule", default="none", choices=("none", "cosine"),
                   help="--lr-schedule of every training run (cosine: accuracy over several epochs "
                        "without the constant-rate step noise)")
    p.add_argument("--skip-synthetic", action="store_true")
    p.add_argument("--skip-planetoid", action="store_true")
    p.add_argument("--shared-data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--no-drop-caches", action="store_true",
                   help="do not drop the page cache (reads are O_DIRECT; spares other users)")
    p.add_argument("--planetoid-epochs", type=int, default=100)
    p.set_defaults(func=_cmd_bench_ooc)
