"""``ooc generate rmat``: a synthetic R-MAT graph with planted labels, written straight into the store.

Nothing is materialised: the edge chunks are regenerated for each pass of the streaming CSC build
(:func:`~ooc.ingest.streaming.build_csc_streaming`; they are a pure function of seed and edge index),
and node features, labels and splits are produced and written in node chunks.  Memory is the CSC
build's budget plus one chunk; the generator itself is parallel Numba (:mod:`ooc.kernels.rmat`).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Iterator

import numpy as np
from ooc.util.progress import progress as progress_bar

from ooc.kernels.graph import index_dtype_for
from ooc.kernels.rmat import GRAPH500_ABC, rmat_edges, rmat_node_data
from ooc.kernels.rng import batch_key
from ooc.storage.dataset import DatasetWriter
from ooc.util.sizes import parse_bytes
from ooc.ingest.streaming import (DEFAULT_CHUNK_EDGES, EdgeChunk, SymmetricSource, build_csc_to_writer)

__all__ = ["RmatSource", "generate_rmat", "write_rmat_edge_file"]

log = logging.getLogger("ooc.generate")


class RmatSource:
    """R-MAT edges as a re-iterable stream of chunks (see :func:`ooc.kernels.rmat.rmat_edges`).

    Args:
        num_nodes, num_edges: N and E.
        num_classes: K (class of v = v mod K); homophily: same-class destination probability.
        seed: the graph is a pure function of the seed (any chunking, any thread count).
        abc: R-MAT (a, b, c); default Graph500 (0.57, 0.19, 0.19).
    """

    has_weight = False

    def __init__(self, num_nodes: int, num_edges: int, num_classes: int = 1, homophily: float = 0.0,
                 seed: int = 0, abc: tuple[float, float, float] = GRAPH500_ABC,
                 chunk_edges: int = DEFAULT_CHUNK_EDGES) -> None:
        if num_nodes < 1 or num_edges < 0:
            raise ValueError(f"need nodes >= 1 and edges >= 0, got {num_nodes}, {num_edges}")
        a, b, c = abc
        if min(a, b, c) < 0 or a + b + c > 1:
            raise ValueError(f"R-MAT probabilities a={a} b={b} c={c} must be >= 0 with a+b+c <= 1")
        if not 0 <= homophily <= 1:
            raise ValueError(f"homophily must be in [0, 1], got {homophily}")
        self.num_nodes, self.num_edges = int(num_nodes), int(num_edges)
        self.num_classes, self.homophily = max(int(num_classes), 1), float(homophily)
        self.abc = (float(a), float(b), float(c))
        self.key = batch_key(seed, 0, 0, stream=0x524D4154)  # "RMAT"
        self.chunk_edges = max(int(chunk_edges), 1)
        self.dtype = index_dtype_for(self.num_nodes)

    def chunk(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Edges ``[start, start + count)`` as ``(src, dst)`` arrays of the index dtype."""
        s = np.empty(count, dtype=self.dtype)
        d = np.empty(count, dtype=self.dtype)
        rmat_edges(start, count, self.num_nodes, self.num_classes, self.homophily, *self.abc, self.key,
                   s, d)
        return s, d

    def chunks(self) -> Iterator[EdgeChunk]:
        for a in range(0, self.num_edges, self.chunk_edges):
            s, d = self.chunk(a, min(self.chunk_edges, self.num_edges - a))
            yield EdgeChunk(s, d, None)


def write_rmat_edge_file(path: str | Path, num_nodes: int, num_edges: int, seed: int = 0,
                         dtype: str = "int32", chunk_edges: int = DEFAULT_CHUNK_EDGES,
                         progress: bool = False) -> Path:
    """Write R-MAT edges (no label planting) as a ``.npy`` (E, 2) binary edge list, streaming.

    Used by ``ooc bench convert`` to make its inputs.  Returns the path.
    """
    src = RmatSource(num_nodes, num_edges, seed=seed, chunk_edges=chunk_edges)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype), shape=(num_edges, 2))
    for a in progress_bar(range(0, num_edges, chunk_edges), enabled=progress, desc="rmat edges",
                          unit="chunk"):
        s, d = src.chunk(a, min(chunk_edges, num_edges - a))
        out[a:a + s.shape[0], 0] = s
        out[a:a + s.shape[0], 1] = d
        out.flush()
    del out
    return Path(path)


def generate_rmat(out: str | Path, num_nodes: int, num_edges: int, feat_dim: int = 128,
                  num_classes: int = 16, seed: int = 0, homophily: float = 0.6, noise: float = 4.0,
                  feat_dtype: str = "float16", splits: tuple[float, float, float] = (0.1, 0.05, 0.05),
                  abc: tuple[float, float, float] = GRAPH500_ABC, undirected: bool = False,
                  self_loops: str = "keep", dedup: bool = False, memory_budget: int | str = "2GB",
                  partitions: int | None = None, chunk_edges: int = DEFAULT_CHUNK_EDGES,
                  overwrite: bool = False, progress: bool = False) -> Path:
    """Generate an R-MAT dataset with planted labels directly in the store (atomic, streaming).

    Args:
        out: dataset directory.
        num_nodes, num_edges: N and E (E directed edges generated; ``undirected`` doubles them).
        feat_dim: D; num_classes: K (labels ``v mod K``, balanced).
        homophily: probability that an edge stays within the source's class.
        noise: feature noise standard deviation (centroids are N(0, 1) per dimension).
        feat_dtype: ``float16`` or ``float32``.
        splits: train / valid / test fractions (random per node, disjoint).

    Returns:
        The dataset path.

    Raises:
        ValueError: bad sizes or probabilities; FileExistsError: ``out`` exists and not ``overwrite``.
    """
    t0 = time.perf_counter()
    if feat_dim < 1 or num_classes < 1:
        raise ValueError(f"need feat_dim >= 1 and classes >= 1, got {feat_dim}, {num_classes}")
    if sum(splits) > 1 or min(splits) < 0:
        raise ValueError(f"split fractions {splits} must be >= 0 and sum to <= 1")
    if feat_dtype not in ("float16", "float32"):
        raise ValueError(f"feat_dtype must be float16 or float32, got {feat_dtype!r}")
    budget = parse_bytes(memory_budget)
    chunk_edges = min(chunk_edges, max(budget // 400, 1024))  # chunk buffers ~10% of the budget
    src = RmatSource(num_nodes, num_edges, num_classes, homophily, seed, abc, chunk_edges)
    with DatasetWriter(out, overwrite=overwrite) as w:
        work = w.tmp / "_work"
        work.mkdir()
        sym = SymmetricSource(src, undirected, self_loops == "remove")
        stats = build_csc_to_writer(sym, num_nodes, w, work, dedup=dedup or undirected,
                                    memory_budget=budget, progress=progress)
        t_graph = time.perf_counter() - t0
        # node data in chunks of ~64 MiB of float32 features
        rng = np.random.default_rng(seed)
        centroids = rng.normal(0.0, 1.0, (num_classes, feat_dim)).astype(np.float32)
        fw = w.array_writer("features", feat_dtype, (feat_dim,), expected_rows=num_nodes)
        lw = w.array_writer("labels", np.int32, expected_rows=num_nodes)
        step = max(1024, (64 << 20) // (4 * feat_dim))
        feats = np.empty((step, feat_dim), dtype=np.float32)
        labels = np.empty(step, dtype=np.int32)
        member = np.empty(step, dtype=np.int8)
        split_ids: list[list[np.ndarray]] = [[], [], []]
        key = np.uint64(int(src.key) ^ 0x5EED)
        fr = np.asarray(splits, dtype=np.float64)
        for a in progress_bar(range(0, num_nodes, step), enabled=progress, desc="nodes", unit="chunk"):
            m = min(step, num_nodes - a)
            rmat_node_data(a, m, num_classes, centroids, float(noise), fr, key, feats, labels, member)
            fw.append(feats[:m].astype(feat_dtype, copy=False))
            lw.append(labels[:m])
            for k in range(3):
                split_ids[k].append(np.flatnonzero(member[:m] == k).astype(np.int64) + a)
        w.finish_array(fw)
        w.finish_array(lw)
        for k, name in enumerate(("train", "valid", "test")):
            w.write_array(name, np.concatenate(split_ids[k]) if split_ids[k] else
                          np.empty(0, dtype=np.int64))
        if partitions:
            from ooc.kernels.partition import contiguous_partitions
            w.write_array("partition_offsets", contiguous_partitions(num_nodes, partitions))
        shutil.rmtree(work, ignore_errors=True)
        man = {"name": Path(out).name, "num_nodes": int(num_nodes), "num_classes": int(num_classes),
               "directed_edges": stats["num_edges"], "input_edges": stats["input_edges"],
               "source_format": "rmat",
               "generator": {"model": "rmat", "a": abc[0], "b": abc[1], "c": abc[2], "seed": seed,
                             "edges": int(num_edges), "homophily": homophily, "noise": noise,
                             "feat_dim": feat_dim, "classes": num_classes, "splits": list(splits)},
               "undirected": undirected, "self_loops": self_loops, "dedup": bool(dedup or undirected),
               "build": {"buckets": stats["buckets"], "memory_budget": budget,
                         "seconds": dict(stats["seconds"], graph=t_graph,
                                         total=time.perf_counter() - t0)}}
        path = w.commit(**man)
    log.info("generated %s: %d nodes, %d edges in %.1f s", path, num_nodes, stats["num_edges"],
             time.perf_counter() - t0)
    return path
