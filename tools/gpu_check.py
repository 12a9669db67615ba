"""GPU check of data-parallel training: run the GPU-only paths of data-parallel training in one short script.

``tools/gpu_check.sh`` (or ``python -m ooc.tools.gpu_check``) on a machine with CUDA:

1. generates a planted-partition graph (default 400,000 nodes, 128-d float32 features) and writes
   it as a dataset;
2. probes the device cache data path on ``cuda:0``: the host rows of the misses are in pinned
   memory, copied with ``non_blocking=True``, and the assembled rows equal the plain loader's bit for
   bit;
3. trains one GPU without a cache, with a degree (PaGraph) cache and a pre-sampled (GNNLab) cache
   of ``--cache-frac`` of the features, and prints seeds/s and the cache hit ratio;
4. trains with NCCL DDP over all visible GPUs (one process each, global batch ``N x B``; with one
   GPU a one-rank NCCL job, which still runs DDP's NCCL all-reduce) and checks that the model is the
   single-process model of batch ``N x B`` up to float tolerance (GPU ``index_add_`` uses atomics).

Exits 2 with a clear message when no CUDA device is visible; ``--allow-cpu`` runs the same script on
CPU processes with gloo (a dry run of the script itself, for machines without a GPU).  Results are
printed as a table and written to ``WORKDIR/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _dataset(work: Path, nodes: int, feat_dim: int) -> Path:
    from ooc.kernels.partition import contiguous_partitions
    from ooc.kernels.generators import planted_partition
    from ooc.ingest.convert import write_graph_dataset
    path = work / f"planted-{nodes}-{feat_dim}"
    if path.exists():
        return path
    g = planted_partition(nodes, num_classes=8, avg_degree=10, p_intra=0.7, feat_dim=feat_dim,
                          noise=8.0, seed=0, train_frac=0.2)
    return write_graph_dataset(path, g.num_nodes, g.src, g.dst, g.features, g.labels,
                               {"train": g.train, "valid": g.valid, "test": g.test}, g.num_classes,
                               "planted", partition_offsets=contiguous_partitions(nodes, 8))


def _cfg(ds: Path, out: Path, device: str, **kw: object):
    from ooc.config import TrainConfig
    base = dict(dataset=str(ds), output_dir=str(out), model="sage", fanouts=[10, 10], hidden=128,
                batch_size=1024, eval_batch_size=4096, epochs=2, partitions=8, buffer_partitions=8,
                dropout=0.0, seed=0, progress=False, device=device, prefetch=4)
    base.update(kw)
    return TrainConfig(**base)


def _probe_pinned(ds: Path, work: Path, device: str, cache_bytes: int) -> dict:
    """Device cache data path on one device: pinned host rows, non-blocking copies, exact rows."""
    import torch

    from ooc.storage.dataset import Dataset
    from ooc.tasks.node import NodeTask
    cfg = _cfg(ds, work / "probe", device, device_cache=str(cache_bytes))
    cfg.validate()
    d = Dataset(ds)
    dev = torch.device(device)
    task = NodeTask(cfg, d)
    data = task.data
    plan = task.plan(0)
    plain = data.node_batch(0, plan.batches[0], 0)
    cache = data.attach_device_cache(dev, plan)
    b = data.node_batch(0, plan.batches[0], 0)
    pinned = bool(b.x.numel() == 0 or b.x.is_pinned())
    _, x = b.inputs(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    exact = bool(torch.equal(x.cpu(), plain.x.float()))
    st = cache.reset_stats()
    task.close()
    d.close()
    return {"pinned_host_rows": pinned, "assembled_rows_exact": exact, "cache_rows": cache.num_rows,
            "probe_hit_ratio": st["device_cache_hit_ratio"], "cache_device": str(cache.device)}


def _row(name: str, m: dict) -> dict:
    h = m["history"][-1]
    return {"run": name, "seeds_per_s": h["seeds_per_s"], "epoch_time_s": h["epoch_time_s"],
            "device_cache_hit_ratio": h.get("device_cache_hit_ratio"),
            "stall_share": h["stall_s"] / max(h["train_time_s"], 1e-9), "val_acc": m["val_acc"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="gpu-check", help="dataset and runs (default ./gpu-check)")
    p.add_argument("--nodes", type=int, default=400_000)
    p.add_argument("--feat-dim", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1024, help="per-device batch B")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--cache-frac", type=float, default=0.25,
                   help="device cache size as a fraction of the feature bytes (default 0.25)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="no GPU: dry-run the script on CPU processes with gloo")
    p.add_argument("--max-devices", type=int, default=0, help="use at most this many GPUs (0 = all)")
    args = p.parse_args(argv)

    import torch
    ncuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if ncuda == 0 and not args.allow_cpu:
        print("gpu_check: error: no CUDA device is visible (torch.cuda.is_available() is "
              f"{torch.cuda.is_available()}, torch {torch.__version__}, CUDA build "
              f"{torch.version.cuda}). This script checks the GPU-only paths (NCCL DDP, device "
              "cache with pinned memory); run it on a GPU machine, or pass --allow-cpu for a dry "
              "run on CPU.", file=sys.stderr)
        return 2
    on_gpu = ncuda > 0
    ndev = (min(ncuda, args.max_devices) if args.max_devices else ncuda) if on_gpu else 2
    devices = [f"cuda:{i}" for i in range(ndev)] if on_gpu else ["cpu"] * ndev
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ds = _dataset(work, args.nodes, args.feat_dim)
    feat_bytes = args.nodes * args.feat_dim * 4
    cache_bytes = int(args.cache_frac * feat_bytes)
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "devices": devices,
            "device_names": [torch.cuda.get_device_name(i) for i in range(ndev)] if on_gpu else [],
            "nodes": args.nodes, "feat_dim": args.feat_dim, "batch_size": args.batch_size,
            "cache_bytes": cache_bytes, "dataset_s": time.perf_counter() - t0}
    print(f"gpu_check: {ndev} x {devices[0]} ({', '.join(info['device_names']) or 'CPU dry run'}), "
          f"torch {torch.__version__}; dataset {args.nodes:,} nodes x {args.feat_dim} in "
          f"{info['dataset_s']:.1f} s")

    from ooc.training.loop import train
    info["probe"] = _probe_pinned(ds, work, devices[0], cache_bytes)
    print(f"  device cache path: pinned host rows {info['probe']['pinned_host_rows']}, assembled rows "
          f"exact {info['probe']['assembled_rows_exact']}, hit ratio "
          f"{info['probe']['probe_hit_ratio']:.3f}")
    rows = []
    single = {}
    for name, kw in (("1 device, no cache", {}),
                     ("1 device, degree cache", {"device_cache": str(cache_bytes)}),
                     ("1 device, presample cache", {"device_cache": str(cache_bytes),
                                                    "device_cache_policy": "presample"})):
        m = train(_cfg(ds, work / name.replace(" ", "_").replace(",", ""), devices[0],
                       batch_size=args.batch_size, epochs=args.epochs, **kw))
        rows.append(_row(name, m))
        single[name] = m

    # NCCL (gloo on CPU) DDP over every device vs one process with the global batch
    from ooc.distributed.launch import LaunchSpec, launch, train_worker
    run = work / "ddp"
    cfg = _cfg(ds, run, devices[0], batch_size=args.batch_size, epochs=1,
               device_cache=str(cache_bytes))
    cfg.validate()
    t = time.perf_counter()
    rc = launch(train_worker, (cfg.to_dict(), False), LaunchSpec(devices), timeout_s=1200)
    if rc != 0:
        print(f"gpu_check: error: the {ndev}-rank DDP job failed (status {rc})", file=sys.stderr)
        return 1
    mddp = json.loads((run / "metrics.json").read_text())
    rows.append(_row(f"DDP {mddp['distributed']['backend']} x {ndev}, degree cache, 1 epoch", mddp))
    info["ddp_wall_s"] = time.perf_counter() - t
    ref = train(_cfg(ds, work / "ddp-reference", devices[0], batch_size=args.batch_size * ndev,
                     epochs=1, device_cache=str(cache_bytes)))
    wa = torch.load(run / "checkpoint.pt", weights_only=True, map_location="cpu")["model"]
    wb = torch.load(work / "ddp-reference" / "checkpoint.pt", weights_only=True,
                    map_location="cpu")["model"]
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    info["ddp_vs_single_max_abs_diff"] = diff
    info["ddp_steps_per_rank"] = mddp["distributed"]["steps_per_rank"]
    info["runs"] = rows
    print(f"\n{'run':<36} {'seeds/s':>10} {'epoch s':>8} {'cache hit':>9} {'stall':>6} {'val acc':>8}")
    for r in rows:
        hit = "-" if r["device_cache_hit_ratio"] is None else f"{r['device_cache_hit_ratio']:.3f}"
        print(f"{r['run']:<36} {r['seeds_per_s']:>10.0f} {r['epoch_time_s']:>8.2f} {hit:>9} "
              f"{r['stall_share']:>6.2f} {r['val_acc']:>8.4f}")
    print(f"\nDDP x {ndev} vs 1 process with batch {args.batch_size * ndev}: max |weight diff| "
          f"{diff:.2e}; steps per rank {info['ddp_steps_per_rank']}")
    (work / "gpu_check.json").write_text(json.dumps(info, indent=2))
    print(f"results in {work / 'gpu_check.json'} (total {time.perf_counter() - t0:.0f} s)")
    ok = info["probe"]["assembled_rows_exact"] and (info["probe"]["pinned_host_rows"] or not on_gpu) \
        and diff < 1e-3
    if not ok:
        print("gpu_check: FAILED (see above)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
