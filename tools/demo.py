"""``ooc demo``: the main job on an embedded default, no download.

Generates a planted-partition graph (200,000 nodes, ~2 M directed edges, 64-d features, 8 classes),
writes it as an ooc dataset, partitions it with METIS (8 partitions, training nodes balanced) so partitions
follow the 8 communities, trains GraphSAGE out of core in ``exact`` mode (full-graph sampling, i.e. the
accuracy of in-memory training) with 3 of the 8 feature partitions resident and a 4 MB SIEVE cache in front
of batched disk reads for the rest, and prints accuracy, hit ratios and I/O figures.  (``hybrid`` trades
accuracy for I/O on exactly this kind of graph, where every partition is one class: see
docs/benchmarks.md.)
"""

from __future__ import annotations

import time
from pathlib import Path

from ooc.config import TrainConfig
from ooc.kernels.generators import planted_partition
from ooc.ingest.convert import write_graph_dataset
from ooc.training.loop import train

__all__ = ["run_demo"]


def run_demo(workdir: str | Path = "ooc-demo", nodes: int = 200_000, epochs: int = 3, seed: int = 0,
             progress: bool = True) -> int:
    """Generate, convert, train out of core, print the figures; returns the exit status (0)."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    g = planted_partition(nodes, num_classes=8, avg_degree=10, p_intra=0.7, feat_dim=64,
                          noise=8.0, seed=seed)
    parts = 8
    ds_path = write_graph_dataset(
        work / "planted", g.num_nodes, g.src, g.dst, g.features, g.labels,
        {"train": g.train, "valid": g.valid, "test": g.test}, g.num_classes, "planted",
        overwrite=True, feat_dtype="float16",
        extra_manifest={"source_format": "planted-partition", "generator_seed": seed})
    t1 = time.perf_counter()
    print(f"[demo] generated + converted {g.num_nodes:,} nodes, {g.src.shape[0]:,} directed edges "
          f"in {t1 - t0:.1f} s -> {ds_path}")
    del g
    from ooc.partition import partition_dataset
    _, res = partition_dataset(ds_path, parts, "metis", seed=seed)
    print(f"[demo] partitioned (METIS) in {time.perf_counter() - t1:.1f} s: edge cut "
          f"{100 * res.cut_fraction:.1f}%, training nodes per partition {res.train_per_part.min()}-"
          f"{res.train_per_part.max()}")
    cfg = TrainConfig(dataset=str(ds_path), output_dir=str(work / "run"), model="sage",
                      fanouts=[10, 10], batch_size=1024, epochs=epochs, seed=seed, partitions=parts,
                      buffer_partitions=3, hidden=64, lr=0.01, weight_decay=0.0, progress=progress,
                      mode="exact", cache_size="4MB")
    from ooc.training.rundir import set_run_control
    m = train(set_run_control(cfg, overwrite=True))  # the demo's own run folder: rerunning replaces it
    from ooc.tools.cli import _print_summary
    print(f"[demo] out-of-core GraphSAGE, exact mode: {parts} partitions, {cfg.buffer_partitions} "
          "resident")
    _print_summary(m)
    h = m["history"][-1]
    print(f"throughput    {h['seeds_per_s']:.0f} seeds/s, {h['edges_per_s'] / 1e6:.2f} M sampled "
          f"edges/s (last epoch)")
    print(f"[demo] total {time.perf_counter() - t0:.1f} s; metrics in {Path(cfg.output_dir) / 'metrics.json'}")
    return 0
