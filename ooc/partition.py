"""Graph partitioning and the partition-order rewrite of a dataset (``ooc partition``).

Three methods assign every node to one of ``P`` partitions:

- ``random``: a balanced random assignment (training nodes and the other nodes dealt round-robin
  after a random permutation) -- the baseline;
- ``metis``: multilevel k-way METIS (Karypis & Kumar, SIAM J. Sci. Comput. 1998) through pymetis on
  the symmetrised graph, with two balance constraints (nodes, training nodes) -- needs the topology in
  memory (about 3 x 8 bytes per directed edge);
- ``stream``: Fennel (Tsourakakis et al., WSDM'14) or LDG (Stanton & Kliot, KDD'12) over the CSC read
  from disk block by block, restreamed ``passes`` times (Nishimura & Ugander, KDD'13); memory is
  O(N) (assignment, indptr) plus one block of indices, so it partitions graphs that do not fit.

Every method then goes through the same constraint pass: training nodes per partition within
``ceil((1 + tol) T / P)`` and ``floor((1 - tol) T / P)`` (a balance *constraint*, not a node-count
side effect) and no empty partition, ever (``P > N`` is an error raised before anything is written).

:func:`reorder_dataset` rewrites the dataset so each partition is a contiguous id range (partition
``p`` = new ids ``offsets[p] .. offsets[p+1]-1``, original relative order kept inside a partition):
features and other node arrays in partition order, the CSC relabelled (in-neighbour lists sorted),
labels, splits, ``partitions/offsets``, the permutation ``nodes/perm`` (``perm[new] = original id``)
and, optionally, the edge buckets ``partitions/buckets/{src,dst,offsets}``: all edges grouped by
(source partition ``i``, destination partition ``j``), bucket ``(i, j)`` being the range
``offsets[j * P + i] .. offsets[j * P + i + 1]``.  After the rewrite the in-edges of partition ``p``
(its topology, the CSC slice ``indptr[offsets[p]] .. indptr[offsets[p+1]]``) are one contiguous
range of ``topology/indices``, so a partition's features and topology load with sequential reads.
The rewrite streams: node arrays and the CSC are produced in groups of new ids that fit the memory
budget, each group filled by one sequential scan over the old arrays.  It writes a whole new dataset
beside the source (peak disk ~2x the dataset); in place, :mod:`ooc.partition_inplace` rewrites with a
peak of about 1.1x instead, consuming the old feature chunks (``footprint`` of
:func:`partition_dataset`).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ooc.util.progress import progress as progress_bar
from ooc.util.sizes import format_bytes, parse_bytes
from ooc.kernels.partition import (bucket_sort_block, count_cut_block,
                                   relabel_lists, scatter_rows, stream_assign_block)
from ooc.storage.dataset import ARRAY_NAMES, Dataset, DatasetWriter, _fault_point, check_replaceable
from ooc.storage.locks import PathLock
from ooc.storage.rawarray import RawArray, choose_chunk_rows

__all__ = ["METHODS", "PartitionResult", "partition_nodes", "reorder_dataset", "partition_dataset",
           "check_num_parts", "check_metis_result", "metis_memory_estimate", "run_in_child"]

log = logging.getLogger("ooc.partition")

METHODS = ("random", "metis", "stream")
_BUCKET_NAMES = ("partitions/buckets/src", "partitions/buckets/dst", "partitions/buckets/offsets")
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass
class PartitionResult:
    """A node -> partition assignment and its quality figures.

    Attributes:
        assign: int32 [N] partition of every node (ids of the graph that was partitioned).
        num_parts: P.
        method: ``random`` | ``metis`` | ``stream``.
        num_edges: directed edges of the graph.
        edge_cut: directed edges whose endpoints lie in different partitions.
        sizes: int64 [P] nodes per partition (all > 0).
        train_per_part: int64 [P] training nodes per partition.
        seconds: time spent assigning (not rewriting).
        moved: nodes moved by the constraint pass (balance, empty partitions).
    """

    assign: np.ndarray
    num_parts: int
    method: str
    num_edges: int
    edge_cut: int
    sizes: np.ndarray
    train_per_part: np.ndarray
    seconds: float
    moved: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def cut_fraction(self) -> float:
        return self.edge_cut / self.num_edges if self.num_edges else 0.0

    def summary(self) -> dict:
        """JSON-able report (stored in the manifest under ``partitioning``)."""
        return {"method": self.method, "num_parts": self.num_parts, "num_edges": self.num_edges,
                "edge_cut": self.edge_cut, "cut_fraction": self.cut_fraction,
                "sizes": self.sizes.tolist(), "train_per_part": self.train_per_part.tolist(),
                "seconds": self.seconds, "moved_by_constraints": self.moved, **self.extra}

    def format(self) -> str:
        """Multi-line human-readable report."""
        s, t = self.sizes, self.train_per_part
        lines = [f"method        {self.method}, {self.num_parts} partitions, {self.seconds:.2f} s",
                 f"edge cut      {self.edge_cut:,} of {self.num_edges:,} directed edges "
                 f"({100 * self.cut_fraction:.2f}%)",
                 f"nodes/part    min {s.min():,} max {s.max():,} (imbalance {s.max() / s.mean():.3f})",
                 f"train/part    min {t.min():,} max {t.max():,} "
                 f"(imbalance {t.max() / max(t.mean(), 1e-9):.3f})"]
        if self.num_parts <= 32:
            lines.append("per partition " + " ".join(f"{int(a)}/{int(b)}" for a, b in zip(s, t))
                         + "  (nodes/train)")
        return "\n".join(lines)


def check_num_parts(num_nodes: int, num_parts: int) -> None:
    """Raise ValueError unless ``1 <= num_parts <= num_nodes`` (no empty partition, ever)."""
    if num_parts < 1:
        raise ValueError(f"need at least 1 partition, got {num_parts}")
    if num_parts > num_nodes:
        raise ValueError(f"{num_parts} partitions for {num_nodes} nodes would leave a partition empty; "
                         f"use --parts <= {num_nodes}")


def _blocks(indptr: np.ndarray, indices: np.ndarray | RawArray, max_edges: int,
            start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield ``(first node, indptr slice [n+1] absolute, indices block)`` over nodes [start, stop)."""
    n = indptr.shape[0] - 1
    stop = n if stop is None else stop
    v = start
    while v < stop:
        s = int(np.searchsorted(indptr, indptr[v] + max_edges, side="right")) - 1
        s = min(max(s, v + 1), stop)
        a, b = int(indptr[v]), int(indptr[s])
        idx = indices.read(a, b) if isinstance(indices, RawArray) else indices[a:b]
        yield v, indptr[v:s + 1], idx
        v = s


def _random_assign(num_nodes: int, num_parts: int, is_train: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0xA55])
    assign = np.empty(num_nodes, dtype=np.int32)
    tr = np.flatnonzero(is_train)
    rest = np.flatnonzero(~is_train)
    assign[rng.permutation(tr)] = np.arange(tr.shape[0]) % num_parts
    assign[rng.permutation(rest)] = (np.arange(rest.shape[0]) + tr.shape[0]) % num_parts
    return assign


def _symmetric_adjacency(indptr: np.ndarray, indices: np.ndarray, num_nodes: int) -> tuple:
    """METIS input: xadj int64 [N+1], adjncy int64 of A + A^T without self-loops or duplicates."""
    from ooc.kernels.graph import build_csc
    dst = np.repeat(np.arange(num_nodes, dtype=np.int64), np.diff(indptr))
    src = indices.astype(np.int64)
    keep = src != dst
    s = np.concatenate([src[keep], dst[keep]])
    d = np.concatenate([dst[keep], src[keep]])
    del src, dst, keep
    return build_csc(s, d, num_nodes, dedup=True, index_dtype=np.dtype(np.int64))


def _metis_assign(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, num_parts: int,
                  is_train: np.ndarray, seed: int, balance_train: bool) -> np.ndarray:
    try:
        import pymetis
    except ImportError:  # pragma: no cover - pymetis is a dependency
        raise ValueError("--method metis needs pymetis (pip install pymetis)") from None
    if num_parts == 1:
        return np.zeros(num_nodes, dtype=np.int32)
    xadj, adjncy = _symmetric_adjacency(indptr, indices, num_nodes)
    vw = None
    if balance_train and is_train.any():
        vw = np.stack([np.ones(num_nodes, dtype=np.int64), is_train.astype(np.int64)], 1).ravel()

    def run() -> np.ndarray:
        _fault_point("metis")
        opts = pymetis.Options()
        opts.seed = int(seed)
        if hasattr(pymetis, "CSRAdjacency"):
            res = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, adjncy), vweights=vw,
                                     options=opts)
        else:  # pragma: no cover - pymetis < 2025.2
            res = pymetis.part_graph(num_parts, xadj=xadj, adjncy=adjncy, vweights=vw, options=opts)
        parts = res[1] if isinstance(res, tuple) else res.vertex_part
        return np.asarray(parts, dtype=np.int32)

    assign = run_in_child(run, num_nodes, "METIS")
    if assign.shape != (num_nodes,) or (num_nodes and (assign.min() < 0 or assign.max() >= num_parts)):
        raise ValueError(f"METIS returned an invalid assignment (shape {assign.shape}, ids outside "
                         f"[0, {num_parts})); nothing was written: use --method stream")
    # empty partitions of tiny graphs are filled by the constraint pass; a lopsided result is not
    check_metis_result(assign, num_nodes, num_parts, allow_empty=True)
    return assign


#: A METIS partition may hold at most this many times the mean partition size, and never more
#: than :data:`METIS_MAX_SHARE` of the nodes.  METIS aims at 1.03 (its default ``ufactor``) but,
#: balancing training nodes as a second constraint, it leaves node counts up to about 2x the mean
#: on R-MAT graphs (many isolated nodes; measured 2.01 at 1 M nodes); when it fails (it prints
#: "Failed during initial partitioning") it still returns an assignment, and one partition then
#: holds most of the graph (99% at 8 M nodes).
METIS_MAX_IMBALANCE = 3.0
METIS_MAX_SHARE = 0.75
#: Bytes per directed edge and per node that METIS partitioning holds at its peak: the topology
#: in memory, the symmetrised int64 adjacency and METIS's own coarsening levels (measured on an
#: R-MAT graph of 1 M nodes and 10 M edges: 2.8 GB, docs/benchmarks.md; rounded up).
METIS_BYTES_PER_EDGE = 280
METIS_BYTES_PER_NODE = 200


_METIS_SLACK = 8


def metis_memory_estimate(num_nodes: int, num_edges: int) -> int:
    """Peak bytes METIS partitioning needs for a graph of N nodes and E directed edges."""
    return METIS_BYTES_PER_EDGE * int(num_edges) + METIS_BYTES_PER_NODE * int(num_nodes)


def check_metis_result(assign: np.ndarray, num_nodes: int, num_parts: int,
                       allow_empty: bool = False) -> None:
    """Refuse a METIS assignment that leaves a partition empty (unless ``allow_empty``: the
    constraint pass moves a node into each) or puts more than :data:`METIS_MAX_IMBALANCE` times the mean partition
    size, or :data:`METIS_MAX_SHARE` of the nodes, (plus 8 nodes, for tiny graphs) in one.

    Raises:
        ValueError: naming the partition, its size and the bound (nothing has been written).
    """
    sizes = np.bincount(assign, minlength=num_parts)
    # (a few nodes of slack: on tiny graphs whole components cannot be split evenly)
    bound = int(math.ceil(min(METIS_MAX_IMBALANCE * num_nodes / num_parts,
                              METIS_MAX_SHARE * num_nodes))) + _METIS_SLACK
    empty = np.flatnonzero(sizes == 0) if not allow_empty else np.empty(0, dtype=np.int64) if not allow_empty else np.empty(0, dtype=np.int64)
    big = int(np.argmax(sizes))
    if empty.size or sizes[big] > bound:
        what = (f"partition {int(empty[0])} is empty" if empty.size else
                f"partition {big} holds {int(sizes[big]):,} of {num_nodes:,} nodes "
                f"({100 * sizes[big] / max(num_nodes, 1):.1f}%)")
        raise ValueError(f"METIS failed to balance the graph: {what}; the bound is {bound:,} nodes "
                         f"per partition ({METIS_MAX_IMBALANCE:g} x N/P, at most "
                         f"{100 * METIS_MAX_SHARE:g}% of N). Nothing was written: use "
                         "--method stream (Fennel, balanced by construction)")


def run_in_child(fn, num_rows: int, what: str) -> np.ndarray:
    """Run ``fn() -> int32 [num_rows]`` in a forked child and return its result.

    A long call into C (METIS) cannot be interrupted inside this process; in a child it can: the
    parent waits in short polls, so SIGINT / SIGTERM reach it promptly, and then kills the child.
    The child shares the parent's memory copy-on-write (its inputs are not copied).

    Raises:
        ValueError: ``fn`` raised in the child (its message), or the child died (killed by the
            out-of-memory killer, say).
    """
    import os
    import select
    import signal
    import struct
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                out = np.ascontiguousarray(fn(), dtype=np.int32)
                payload, status = out.tobytes(), 0
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                payload, status = f"{type(e).__name__}: {e}".encode(), 1
            data = struct.pack("<iq", status, len(payload)) + payload
            view = memoryview(data)
            while view:
                n = os.write(w, view)
                view = view[n:]
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([r], [], [], 0.1)  # signals are handled between polls
            if ready:
                b = os.read(r, 1 << 20)
                if not b:
                    break
                chunks.append(b)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        raise
    os.close(r)
    _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    if len(data) < 12:
        how = (f"was killed by {signal.Signals(os.WTERMSIG(status)).name} (out of memory?)"
               if os.WIFSIGNALED(status) else f"exited with status {os.WEXITSTATUS(status)}")
        raise ValueError(f"{what} {how}; nothing was written: use --method stream or a smaller graph")
    code, n = struct.unpack("<iq", data[:12])
    body = data[12:12 + n]
    if code != 0:
        raise ValueError(f"{what} failed: {body.decode(errors='replace')}; nothing was written")
    out = np.frombuffer(body, dtype=np.int32).copy()
    if out.shape[0] != num_rows:
        raise ValueError(f"{what} returned {out.shape[0]} entries for {num_rows} nodes")
    return out


def _stream_assign(indptr: np.ndarray, indices: np.ndarray | RawArray, num_nodes: int, num_parts: int,
                   is_train: np.ndarray, passes: int, objective: str, balance_train: bool,
                   tol: float, block_edges: int, progress: bool = False) -> np.ndarray:
    num_edges = int(indptr[-1])
    gamma = 1.5
    m = max(num_edges / 2.0, 1.0)
    alpha = math.sqrt(num_parts) * m / max(num_nodes, 1) ** gamma
    cap = max(int(math.ceil((1 + tol) * num_nodes / num_parts)), 1)
    cap = max(cap, -(-num_nodes // num_parts))
    t = int(is_train.sum())
    train_cap = int(math.ceil((1 + tol) * t / num_parts)) if balance_train else num_nodes
    train_cap = max(train_cap, -(-t // num_parts))
    assign = np.full(num_nodes, -1, dtype=np.int32)
    sizes = np.zeros(num_parts, dtype=np.int64)
    train_sizes = np.zeros(num_parts, dtype=np.int64)
    scratch = np.zeros(num_parts, dtype=np.int64)
    obj = {"fennel": 0, "ldg": 1}[objective]
    with progress_bar(total=max(passes, 1) * num_edges, unit="edge", unit_scale=True, enabled=progress,
                      desc=f"{objective} passes") as bar:
        for _ in range(max(passes, 1)):
            for start, ip, idx in _blocks(indptr, indices, block_edges):
                stream_assign_block(ip, idx, start, assign, sizes, train_sizes, is_train, cap, train_cap,
                                    alpha, gamma, obj, scratch, np.uint64(0))
                bar.update(idx.shape[0])
    return assign


def _neighbour_counts(indptr: np.ndarray | None, indices: np.ndarray | RawArray | None, assign: np.ndarray,
                      nodes: np.ndarray, part: int) -> np.ndarray:
    """In-neighbours of each of ``nodes`` lying in ``part`` (zeros without topology)."""
    if indptr is None or indices is None:
        return np.zeros(nodes.shape[0], dtype=np.int64)
    out = np.empty(nodes.shape[0], dtype=np.int64)
    disk = isinstance(indices, RawArray)
    for i, v in enumerate(nodes.tolist()):
        a, b = int(indptr[v]), int(indptr[v + 1])
        nb = indices.read(a, b) if disk else indices[a:b]
        out[i] = int(np.count_nonzero(assign[nb] == part))
    return out


def _enforce_constraints(assign: np.ndarray, num_parts: int, is_train: np.ndarray, tol: float,
                         balance_train: bool, indptr: np.ndarray | None,
                         indices: np.ndarray | RawArray | None) -> int:
    """Move the fewest nodes needed for training-node balance and non-empty partitions.

    Moves prefer nodes with the fewest in-neighbours inside their partition (cheap for the cut).
    Returns the number of moves.
    """
    moved = 0
    t = int(is_train.sum())
    if balance_train and t:
        hi = int(math.ceil((1 + tol) * t / num_parts))
        lo = int(math.floor((1 - tol) * t / num_parts))
        for _ in range(4 * num_parts + t):
            cnt = np.bincount(assign[is_train], minlength=num_parts)
            over, under = int(np.argmax(cnt)), int(np.argmin(cnt))
            if cnt[over] <= hi and cnt[under] >= lo:
                break
            k = max(1, min(cnt[over] - t // num_parts, -(-t // num_parts) - cnt[under]))
            cand = np.flatnonzero((assign == over) & is_train)
            gain = (_neighbour_counts(indptr, indices, assign, cand, under)
                    - _neighbour_counts(indptr, indices, assign, cand, over))
            pick = cand[np.argsort(-gain, kind="stable")[:k]]
            assign[pick] = under
            moved += pick.shape[0]
    for _ in range(num_parts):
        sizes = np.bincount(assign, minlength=num_parts)
        empty = np.flatnonzero(sizes == 0)
        if empty.size == 0:
            break
        for q in empty.tolist():
            sizes = np.bincount(assign, minlength=num_parts)
            big = int(np.argmax(sizes))
            cand = np.flatnonzero(assign == big)
            non_train = cand[~is_train[cand]]
            pool = non_train if non_train.size and sizes[big] > 1 else cand
            own = _neighbour_counts(indptr, indices, assign, pool[:4096], big)
            v = int(pool[:4096][int(np.argmin(own))])
            assign[v] = q
            moved += 1
    return moved


def partition_nodes(indptr: np.ndarray, indices: np.ndarray | RawArray, num_nodes: int,
                    num_parts: int, method: str = "metis", train_ids: np.ndarray | None = None,
                    seed: int = 0, balance_train: bool = True, passes: int = 2,
                    objective: str = "fennel", tol: float = 0.05,
                    block_edges: int = 1 << 24, progress: bool = False) -> PartitionResult:
    """Assign every node to one of ``num_parts`` partitions.

    Args:
        indptr: int64 [N+1] CSC offsets (in memory).
        indices: int32|int64 [E] CSC sources, in memory or a :class:`RawArray` read block by block
            (``stream`` and ``random`` never hold more than ``block_edges`` of them).
        num_nodes: N (isolated nodes are assigned like any other).
        num_parts: P, ``1 <= P <= N``.
        method: ``random`` | ``metis`` | ``stream``.
        train_ids: int [T] training node ids, balanced across partitions when ``balance_train``.
        seed: random seed (random permutation, METIS seed).
        passes: restreaming passes of ``stream``; objective: ``fennel`` or ``ldg``.
        tol: allowed relative imbalance of nodes (stream capacity) and training nodes.
        progress: progress bars (:func:`ooc.util.progress.progress`) of the streaming passes and the
            edge-cut count (METIS runs as one call: it has none).

    Returns:
        :class:`PartitionResult`, all partitions non-empty.

    Raises:
        ValueError: unknown method, ``P < 1`` or ``P > N``.
    """
    check_num_parts(num_nodes, num_parts)
    if method not in METHODS:
        raise ValueError(f"unknown partitioning method {method!r}; choose from {', '.join(METHODS)}")
    if objective not in ("fennel", "ldg"):
        raise ValueError(f"unknown streaming objective {objective!r}; choose fennel or ldg")
    t0 = time.perf_counter()
    is_train = np.zeros(num_nodes, dtype=np.bool_)
    if train_ids is not None and len(train_ids):
        is_train[np.asarray(train_ids, dtype=np.int64)] = True
    in_memory = not isinstance(indices, RawArray)
    if method == "random":
        assign = _random_assign(num_nodes, num_parts, is_train, seed)
    elif method == "metis":
        idx = indices if in_memory else indices.read_all()
        assign = _metis_assign(indptr, idx, num_nodes, num_parts, is_train, seed, balance_train)
    else:
        assign = _stream_assign(indptr, indices, num_nodes, num_parts, is_train, passes, objective,
                                balance_train, tol, block_edges, progress)
    moved = _enforce_constraints(assign, num_parts, is_train, tol, balance_train, indptr, indices)
    seconds = time.perf_counter() - t0
    cut = 0
    with progress_bar(total=int(indptr[-1]), unit="edge", unit_scale=True, enabled=progress,
                      desc="edge cut") as bar:
        for start, ip, idx in _blocks(indptr, indices, block_edges):
            cut += int(count_cut_block(ip, idx, start, assign))
            bar.update(idx.shape[0])
    return PartitionResult(assign=assign, num_parts=num_parts, method=method,
                           num_edges=int(indptr[-1]), edge_cut=cut,
                           sizes=np.bincount(assign, minlength=num_parts).astype(np.int64),
                           train_per_part=np.bincount(assign[is_train], minlength=num_parts)
                           .astype(np.int64), seconds=seconds, moved=moved,
                           extra={"passes": passes, "objective": objective} if method == "stream" else {})


# ---------------------------------------------------------------------------------------- rewrite
def _rows_view(a: np.ndarray) -> np.ndarray:
    return a.view(_UINT[a.dtype.itemsize]).reshape(a.shape[0], -1)


def _permute_topology(old_indptr: np.ndarray, old_indices: RawArray, new_indptr: np.ndarray,
                      perm: np.ndarray, inv: np.ndarray, writer, budget: int,
                      progress: bool = False) -> int:
    """Append the relabelled in-edge lists of new ids ``0..N-1`` to ``writer``, in groups of new
    destination ids whose lists fit ``budget`` bytes (the group's output plus one block of old lists).

    A function of its own so that the group buffer and the last block are freed before the feature
    rewrite starts (held as loop variables they stayed alive through it: ~0.7 GB at 1 B edges).

    Returns:
        Groups written (each one scan over the old lists of its source id range).
    """
    n = perm.shape[0]
    edge_bytes = old_indices.dtype.itemsize + 8
    max_group_edges = max(1, budget // (2 * edge_bytes))
    g0 = 0
    passes = 0
    bar = progress_bar(total=int(new_indptr[-1]), unit="edge", unit_scale=True, enabled=progress,
                       desc="topology")
    while g0 < n:
        g1 = int(np.searchsorted(new_indptr, new_indptr[g0] + max_group_edges, side="right")) - 1
        g1 = min(max(g1, g0 + 1), n)
        m = int(new_indptr[g1] - new_indptr[g0])
        buf = np.empty(m, dtype=old_indices.dtype)
        olds = perm[g0:g1]
        lo, hi = int(olds.min()), int(olds.max()) + 1
        got = 0
        for start, ip, idx in _blocks(old_indptr, old_indices, max(max_group_edges, 1 << 16), lo, hi):
            got += int(relabel_lists(ip, idx, start, inv, g0, g1, new_indptr, buf))
        assert got == m, (got, m)
        writer.append(buf)
        bar.update(m)
        passes += 1
        g0 = g1
    bar.close()
    return passes


def _permute_rows(src: RawArray, perm: np.ndarray, inv: np.ndarray, writer, budget: int,
                  spool_dir: Path | None = None, progress: bool = False, desc: str = "rows") -> int:
    """Append ``src[perm]`` to ``writer`` in groups of new ids that fit ``budget``.

    With at most two groups (or no ``spool_dir``), each group is filled by one sequential scan
    over the old rows.  With more, that would read the array once per group (a 12.8 GB feature
    array under a 2 GB budget: 13 full scans), so the rows are spooled instead: one scan appends
    every row to the spool file of its group (:func:`_spool_rows`), then each group is read back
    and placed — the array is read twice and written twice whatever the budget.

    ``progress`` shows a bar of the rows written (``desc``; spooled: one of the spool pass first).

    Returns:
        Full passes over the old rows (1 when spooled).
    """
    n = perm.shape[0]
    row_bytes = max(src.row_bytes, 1)
    # a group holds its rows twice (read back + placed) and, while placing, 4 int64 per row of ids
    group = max(1, budget // (2 * row_bytes + _GROUP_ID_BYTES))
    scan = max(1, min(group, (64 << 20) // row_bytes))
    if spool_dir is not None and -(-n // group) > 2:
        return _spool_rows(src, perm, inv, writer, group, scan, Path(spool_dir), progress, desc)
    passes = 0
    bar = progress_bar(total=n, unit="row", unit_scale=True, enabled=progress, desc=desc)
    for g0 in range(0, n, group):
        g1 = min(n, g0 + group)
        olds = perm[g0:g1]
        lo, hi = int(olds.min()), int(olds.max()) + 1
        out = np.empty((g1 - g0, *src.shape[1:]), dtype=src.dtype)
        ov = _rows_view(out) if out.ndim > 1 else out.view(_UINT[out.dtype.itemsize]).reshape(-1, 1)
        got = 0
        for b0 in range(lo, hi, scan):
            b1 = min(hi, b0 + scan)
            blk = src.read(b0, b1)
            bv = _rows_view(blk) if blk.ndim > 1 else blk.view(_UINT[blk.dtype.itemsize]).reshape(-1, 1)
            got += int(scatter_rows(bv, b0, inv, g0, g1, ov))
        assert got == g1 - g0, (got, g1 - g0)
        writer.append(out)
        bar.update(g1 - g0)
        passes += 1
    bar.close()
    return passes


def _spool_rows(src: RawArray, perm: np.ndarray, inv: np.ndarray, writer, group: int, scan: int,
                spool_dir: Path, progress: bool = False, desc: str = "rows") -> int:
    """:func:`_permute_rows` through one spool file per group of ``group`` new ids.

    Pass 1 reads the old rows in blocks of ``scan`` and appends each row to the file of group
    ``inv[old] // group`` (stable, so a file holds its rows in ascending old id); pass 2 loads one
    file (``group`` rows), puts row ``j`` at ``inv[sorted(perm[g0:g1])[j]] - g0`` and appends the
    group to ``writer``.  Each file is deleted once placed.  Returns 1 (one scan of ``src``).
    """
    n = perm.shape[0]
    k = -(-n // group)
    spool_dir.mkdir(parents=True, exist_ok=True)
    paths = [spool_dir / f"group-{g:05d}.bin" for g in range(k)]
    files = [open(p, "wb") for p in paths]
    bar = progress_bar(total=n, unit="row", unit_scale=True, enabled=progress, desc=f"{desc} spool")
    try:
        # two reused blocks (read, grouped): a fresh pair per block would briefly hold three
        blk_buf = np.empty((min(scan, n), *src.shape[1:]), dtype=src.dtype)
        rows_buf = np.empty_like(blk_buf)
        for b0 in range(0, n, scan):
            b1 = min(n, b0 + scan)
            blk = src.read(b0, b1, out=blk_buf[:b1 - b0])
            gid = inv[b0:b1] // group
            order = np.argsort(gid, kind="stable")
            counts = np.bincount(gid, minlength=k)
            rows = np.take(blk, order, axis=0, out=rows_buf[:b1 - b0], mode="clip")  # unbuffered
            a = 0
            for g in np.flatnonzero(counts):
                c = int(counts[g])
                files[g].write(memoryview(rows[a:a + c]).cast("B"))
                a += c
            bar.update(b1 - b0)
    finally:
        for f in files:
            f.close()
        bar.close()
    del blk_buf, rows_buf, blk, rows
    bar = progress_bar(total=n, unit="row", unit_scale=True, enabled=progress, desc=f"{desc} place")
    for g in range(k):
        g0, g1 = g * group, min(n, (g + 1) * group)
        got = np.fromfile(paths[g], dtype=src.dtype).reshape((-1, *src.shape[1:]))
        if got.shape[0] != g1 - g0:
            raise RuntimeError(f"spool {paths[g]} holds {got.shape[0]} rows, expected {g1 - g0}")
        out = np.empty_like(got)
        out[inv[np.sort(perm[g0:g1])] - g0] = got
        del got
        writer.append(out)
        del out
        paths[g].unlink()
        bar.update(g1 - g0)
    bar.close()
    return 1


#: arrays copied unchanged by the rewrite (PQ codebooks; the codes are a node array, permuted)
_VERBATIM = ("nodes/pq/centroids", "nodes/pq/bounds", "nodes/pq/means", "nodes/pq/gains")


def _known_arrays(ds: Dataset) -> tuple[list[str], list[str]]:
    """(node arrays to permute row-wise, arrays that block the rewrite)."""
    handled = {ARRAY_NAMES[k] for k in ("indptr", "indices", "features", "labels", "train", "valid",
                                        "test", "partition_offsets")} | {"nodes/perm", *_BUCKET_NAMES,
                                                                         *_VERBATIM}
    node_arrays, unknown = [], []
    for rel, rec in ds.manifest["arrays"].items():
        if rel in handled:
            continue
        if rel.startswith("nodes/") and rec["shape"] and rec["shape"][0] == ds.num_nodes:
            node_arrays.append(rel)
        else:
            unknown.append(rel)
    return node_arrays, unknown


#: Index bytes per row a spooled group holds while placing its rows (sorted old ids, new ids, offsets).
_GROUP_ID_BYTES = 32

#: Smallest rewrite group budget (bytes) left after the node-sized arrays.
_MIN_GROUP_BYTES = 256 << 10


@dataclass
class _Plan:
    """What every rewrite of ``ds`` under an assignment needs, computed (and the memory budget
    checked) before anything is written: see :func:`_plan_rewrite`."""

    n: int
    num_parts: int
    perm: np.ndarray | None          # int64 [N], perm[new] = old
    inv: np.ndarray | None           # int64 [N], inv[old] = new
    offsets: np.ndarray              # int64 [P+1]
    new_indptr: np.ndarray           # int64 [N+1]
    node_arrays: list[str]           # other nodes/* row arrays, permuted like the features
    group_budget: int                # bytes for rewrite groups
    held: int                        # bytes of the node-sized arrays held whole + one writer chunk
    chunk_bytes: int                 # largest writer chunk (bytes)
    index_dtype: np.dtype


def _plan_rewrite(ds: Dataset, result: PartitionResult, memory_budget: int | str,
                  edge_buckets: bool) -> _Plan:
    """Permutation, new indptr and the split of the memory budget (see :func:`reorder_dataset`).

    Raises:
        ValueError: see :func:`reorder_dataset` (all before anything is written).
    """
    budget = parse_bytes(memory_budget)  # as given: a budget too small is refused below, by its size
    n = ds.num_nodes
    assign = result.assign
    if assign.shape != (n,):
        raise ValueError(f"assignment has {assign.shape[0]} entries for {n} nodes")
    num_parts = result.num_parts
    node_arrays, unknown = _known_arrays(ds)
    if unknown:
        raise ValueError(f"{ds.path}: cannot reorder arrays {', '.join(sorted(unknown))} (unknown "
                         "layout); nothing was written")
    perm = np.argsort(assign, kind="stable").astype(np.int64, copy=False)  # perm[new] = old
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n, dtype=np.int64)
    offsets = np.zeros(num_parts + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(np.bincount(assign, minlength=num_parts))
    old_indptr = ds.indptr
    old_indices = ds.raw("indices")
    new_indptr = np.zeros(n + 1, dtype=np.int64)
    step = 1 << 20  # degrees gathered in slices: no node-sized temporaries beside the held arrays
    for a in range(0, n, step):
        p = perm[a:a + step]
        np.subtract(old_indptr[p + 1], old_indptr[p], out=new_indptr[a + 1:a + 1 + p.shape[0]])
    np.cumsum(new_indptr, out=new_indptr)
    # The node-sized arrays held for the whole rewrite count against the budget; the groups get the rest.
    held = sum(a.nbytes for a in (assign, perm, inv, new_indptr)
               if isinstance(a, np.ndarray) and not isinstance(a, np.memmap))
    held += old_indptr.nbytes if not isinstance(old_indptr, np.memmap) else 0
    # so does the chunk buffer of the one array writer open at a time (up to 8 MiB)
    chunk_bytes = [choose_chunk_rows(old_indices.shape[0], old_indices.row_bytes) * old_indices.row_bytes]
    chunk_bytes += [ds.raw(rel).chunk_rows * ds.raw(rel).row_bytes
                    for rel in [ARRAY_NAMES["features"], *node_arrays] if rel in ds.manifest["arrays"]]
    held += max(chunk_bytes)
    group_budget = budget - held
    # edge buckets hold one destination partition's lists, bucket sources and destinations and a
    # second writer chunk at once: known now, so a budget too small is refused before writing
    bucket_need = 0
    if edge_buckets:
        in_edges = np.diff(new_indptr[offsets])
        bucket_need = int(in_edges.max()) * 3 * old_indices.dtype.itemsize + max(chunk_bytes)
    need = max(_MIN_GROUP_BYTES, bucket_need)
    if group_budget < need:
        what = (f"{format_bytes(_MIN_GROUP_BYTES)} for rewrite groups" if need == _MIN_GROUP_BYTES else
                f"the {format_bytes(bucket_need)} the edge buckets of the largest partition "
                f"({int(in_edges.max()):,} in-edges) need (--no-edge-buckets skips them)")
        raise ValueError(
            f"{ds.path}: --memory-budget {format_bytes(budget)} is too small to rewrite {n:,} nodes: the "
            f"node-sized index arrays it keeps whole (assignment, permutation and its inverse, old and "
            f"new indptr) and one output chunk ({format_bytes(held)} together) leave less than "
            f"{what}; use at least {format_bytes(-(-(held + need) // (1 << 20)) << 20)}; nothing was "
            "written")
    result.extra.update(held_bytes=held, group_bytes=group_budget)
    return _Plan(n=n, num_parts=num_parts, perm=perm, inv=inv, offsets=offsets, new_indptr=new_indptr,
                 node_arrays=node_arrays, group_budget=group_budget, held=held,
                 chunk_bytes=max(chunk_bytes), index_dtype=old_indices.dtype)


def _write_reordered(ds: Dataset, plan: _Plan, w, with_features: bool = True,
                     progress: bool = False) -> tuple[int, int]:
    """Write every rewritten array except the edge buckets into ``w`` (a
    :class:`~ooc.storage.dataset.DatasetStage`): indptr, indices, the node arrays (``nodes/features``
    only ``with_features``), labels, splits, offsets, PQ codebooks, ``nodes/perm``; with
    ``progress``, a bar per topology and node array.

    Drops ``plan.perm`` and ``plan.inv`` at the end (node-sized, not needed by the buckets).

    Returns:
        ``(topology groups, feature passes)``.
    """
    perm, inv, n = plan.perm, plan.inv, plan.n
    budget = plan.group_budget
    old_indices = ds.raw("indices")
    w.write_array("indptr", plan.new_indptr)
    # --- topology: groups of new destination ids whose in-edges fit the budget
    iw = w.array_writer("indices", old_indices.dtype, (), expected_rows=old_indices.shape[0])
    topo_passes = _permute_topology(ds.indptr, old_indices, plan.new_indptr, perm, inv, iw, budget,
                                    progress)
    w.finish_array(iw)
    _fault_point("rewrite-topology")
    # --- node arrays
    feat_passes = 0
    rels = [ARRAY_NAMES["features"]] if with_features else []
    for rel in [*rels, *plan.node_arrays]:
        if rel not in ds.manifest["arrays"]:
            continue
        src = ds.raw(rel)
        fw = w.array_writer(rel, src.dtype, src.shape[1:], expected_rows=n, chunk_rows=src.chunk_rows)
        feat_passes += _permute_rows(src, perm, inv, fw, budget, spool_dir=w.tmp / "_spool",
                                     progress=progress, desc=rel.split("/", 1)[-1])
        w.finish_array(fw)
    shutil.rmtree(w.tmp / "_spool", ignore_errors=True)
    if ds.has("labels"):
        w.write_array("labels", ds.raw(ARRAY_NAMES["labels"]).read_all()[perm])  # not cached in ds
    for s in ("train", "valid", "test"):
        if ds.has(s):
            w.write_array(s, np.sort(inv[ds.split(s)]))
    w.write_array("partition_offsets", plan.offsets)
    for rel in _VERBATIM:
        if rel in ds.manifest["arrays"]:
            w.write_array(rel, ds.raw(rel).read_all())
    orig = ds.raw("nodes/perm").read_all()[perm] if ds.has("nodes/perm") else perm
    w.write_array("nodes/perm", orig.astype(np.int64, copy=False))
    del orig, perm, inv  # node-sized, not needed by the buckets or the commit's checks
    plan.perm = plan.inv = None
    return topo_passes, feat_passes


def _write_buckets(w, new_indptr: np.ndarray, offsets: np.ndarray, num_parts: int,
                   index_dtype: np.dtype, budget: int, chunk_bytes: int, progress: bool = False) -> None:
    """Write ``partitions/buckets/{src,dst,offsets}`` into ``w`` from the new topology already in it.

    Edge bucket ``(i -> j)`` is stored destination-major, at index ``j * P + i``; ``progress``: a bar
    of the destination partitions done.

    Raises:
        ValueError: a destination partition's in-edges (three int arrays of them and one writer
            chunk) exceed ``budget`` bytes.
    """
    new_indices = RawArray(w.arrays_root / ARRAY_NAMES["indices"])
    sw = w.array_writer("partitions/buckets/src", index_dtype, (), expected_rows=new_indices.shape[0])
    dw = w.array_writer("partitions/buckets/dst", index_dtype, (), expected_rows=new_indices.shape[0])
    boff = np.zeros(num_parts * num_parts + 1, dtype=np.int64)
    idx = so = do = None
    bar = progress_bar(total=num_parts, unit="partition", enabled=progress, desc="edge buckets")
    for j in range(num_parts):
        a, b = int(offsets[j]), int(offsets[j + 1])
        ea, eb = int(new_indptr[a]), int(new_indptr[b])
        # the partition's lists, its bucket sources and destinations, one more writer chunk
        if (eb - ea) * 3 * index_dtype.itemsize + chunk_bytes > budget:
            raise ValueError(f"partition {j} has {eb - ea:,} in-edges, more than the memory "
                             f"budget {format_bytes(budget)} holds for edge buckets; use more "
                             "partitions, a larger --memory-budget or --no-edge-buckets")
        idx = new_indices.read(ea, eb)
        so = np.empty(eb - ea, dtype=index_dtype)
        do = np.empty(eb - ea, dtype=index_dtype)
        counts = bucket_sort_block(new_indptr[a:b + 1], idx, a, offsets, num_parts, so, do)
        boff[j * num_parts + 1:(j + 1) * num_parts + 1] = ea + np.cumsum(counts)
        sw.append(so)
        dw.append(do)
        bar.update(1)
    bar.close()
    new_indices.close()
    del idx, so, do
    w.finish_array(sw)
    w.finish_array(dw)
    w.write_array("partitions/buckets/offsets", boff)


def _rewrite_manifest(ds: Dataset, result: PartitionResult, seconds: float, topo_passes: int,
                      feat_passes: int, edge_buckets: bool) -> dict:
    """Manifest fields of the rewritten dataset: the source's, plus ``partitioning``."""
    man = {k: v for k, v in ds.manifest.items()
           if k not in ("format_version", "created", "tool", "tool_version", "sources", "arrays")}
    summary = result.summary()
    summary.update(rewrite_seconds=seconds, topology_passes=topo_passes,
                   feature_passes=feat_passes, edge_buckets=edge_buckets)
    man["partitioning"] = summary
    return man


def reorder_dataset(ds: Dataset, result: PartitionResult, out: str | Path, overwrite: bool = False,
                    memory_budget: int | str = "2GB", edge_buckets: bool = True,
                    progress: bool = False) -> Path:
    """Rewrite ``ds`` in partition order (see the module docstring) through :class:`DatasetWriter`
    into a new directory renamed over ``out`` at the end (the source stays whole until then; the
    disk holds both copies and the feature spool at the peak: see
    :mod:`ooc.partition_inplace` for the low-footprint in-place rewrite).

    Args:
        ds: the source dataset (may be the same directory as ``out`` with ``overwrite``).
        result: the assignment of ``ds``'s node ids.
        out: target directory; written atomically.
        memory_budget: bytes (or ``"2GB"``) the rewrite may hold: the node-sized arrays it keeps
            whole (assignment, permutation, inverse, old and new indptr: ~36 B per node) count
            first, rewrite groups of rows / edges get the rest.
        edge_buckets: also write ``partitions/buckets/*``.
        progress: progress bars of the topology, each node array and the edge buckets.

    Returns:
        The new dataset's path.

    Raises:
        ValueError: the dataset holds an array whose layout this rewrite does not know (named), the
            assignment does not match the dataset, the budget does not hold the node-sized arrays
            plus 256 KiB of groups (before anything is written), or a destination partition's
            in-edges exceed the budget while writing edge buckets.
        FileExistsError: ``out`` exists and not ``overwrite``.
    """
    plan = _plan_rewrite(ds, result, memory_budget, edge_buckets)
    t0 = time.perf_counter()
    with DatasetWriter(out, overwrite=overwrite) as w:
        w.sources = list(ds.manifest.get("sources", []))
        topo_passes, feat_passes = _write_reordered(ds, plan, w, progress=progress)
        if edge_buckets:
            _write_buckets(w, plan.new_indptr, plan.offsets, plan.num_parts, plan.index_dtype,
                           plan.group_budget, plan.chunk_bytes, progress)
        new_indptr = plan.new_indptr
        plan.new_indptr = None
        del new_indptr
        man = _rewrite_manifest(ds, result, time.perf_counter() - t0, topo_passes, feat_passes,
                                edge_buckets)
        return w.commit(**man)


#: ``footprint`` choices of :func:`partition_dataset` (in place only).
FOOTPRINTS = ("auto", "low", "copy")
#: Margin on the disk estimates of :func:`ooc.partition_inplace.disk_estimate` (5% + 64 MiB).
_DISK_MARGIN = 1.05
_DISK_SLACK = 64 << 20


def partition_dataset(path: str | Path, num_parts: int | None, method: str = "metis",
                      out: str | Path | None = None, seed: int = 0, balance_train: bool = True,
                      passes: int = 2, objective: str = "fennel", memory_budget: int | str = "2GB",
                      edge_buckets: bool = True, tol: float = 0.05,
                      overwrite: bool = False, footprint: str = "auto",
                      resume: bool = False, progress: bool = False) -> tuple[Path, PartitionResult]:
    """Partition a dataset and rewrite it in partition order (``ooc partition``).

    With ``out`` (a directory elsewhere) the source is only read and the new dataset is written
    beside it and renamed into place (an existing ``out`` is replaced only with ``overwrite``).

    ``out=None`` rewrites the dataset in place, by one of two paths (``footprint``):

    - ``copy``: a complete new dataset beside the old one, renamed over it at the end: the old
      dataset stays whole until then (a run killed at any point leaves it as it was), but the disk
      holds both copies and the feature spool at the peak (~2x the dataset, more with buckets);
    - ``low``: :mod:`ooc.partition_inplace`: the old feature chunks are consumed as they are
      spooled, peak about ``1.1-1.3x`` the dataset (see there); a run killed after the consumption
      began leaves a journal from which ``ooc partition DS --resume`` (or the same command again)
      finishes the rewrite, and until then the dataset refuses to open, naming that command;
    - ``auto`` (default): ``copy`` when the file system has room for it
      (:func:`ooc.partition_inplace.disk_estimate`, +5% + 64 MiB), else ``low`` (with a warning).

    ``resume`` finishes an interrupted in-place rewrite with the arguments it was started with
    (the others are ignored; ``num_parts`` may be None).  The ids the assignment refers to are the
    dataset's current ids; the original ids stay reachable through ``nodes/perm``.  ``progress``
    shows progress bars (:func:`ooc.util.progress.progress`) of the streaming passes, the edge-cut
    count and each step of the rewrite.

    Returns:
        ``(path of the rewritten dataset, PartitionResult)``; ``result.extra["footprint"]`` says
        which path ran (``copy`` / ``low``; ``resumed`` for a finished interrupted rewrite),
        ``result.extra["memory_budget"]`` the budget it ran under (bytes; a resumed rewrite's is the
        one it was started with, from its journal, as are ``held_bytes`` and ``group_bytes``).

    Locks: in place, the dataset's exclusive lock for the whole run (a training run reading it makes
    this fail at once, naming it, and the other way round); with ``out``, the source's shared lock
    and ``out``'s exclusive one.

    Raises:
        ValueError: bad method or part count, METIS over ``memory_budget`` or failing its balance
            check (all before anything is written), unknown arrays; the file system has room for
            neither path (sizes named, nothing written); an interrupted rewrite with other
            arguments is pending (``--resume`` named); ``resume`` with nothing to resume or with
            ``out``.
        DatasetError: the source is damaged, or (with ``out``) an in-place rewrite of it is
            pending.
        LockError: another process reads or writes the dataset (or ``out``).
        FileExistsError: ``out`` exists without ``overwrite``, or is not an ooc dataset.
    """
    from ooc.partition_inplace import ARG_KEYS, discard_prepared, finish_rewrite
    from ooc.storage.dataset import pending_rewrite
    if footprint not in FOOTPRINTS:
        raise ValueError(f"unknown footprint {footprint!r}; choose from {', '.join(FOOTPRINTS)}")
    target = Path(out) if out is not None else Path(path)
    # resolved: ``DS/``, ``./x/../DS`` and a link to DS are DS itself (in place)
    source, dest = Path(path).resolve(), target.resolve()
    same = dest == source
    target = Path(path) if same else target
    if not same and dest.is_relative_to(source):
        raise ValueError(f"--out {out} is inside the dataset {path}: a dataset written there would "
                         "be lost when the source is rewritten or removed; choose a folder outside "
                         "it (or leave out --out to partition in place)")
    if resume and not same:
        raise ValueError("--resume finishes an interrupted in-place rewrite; it takes no --out")
    if footprint == "low" and not same:
        raise ValueError("--footprint low rewrites a dataset in place (consuming its old chunks); "
                         "with --out the source stays whole and the copy path is used: drop --out "
                         "or --footprint")
    args = {"num_parts": num_parts, "method": method, "seed": seed, "balance_train": balance_train,
            "passes": passes, "objective": objective, "edge_buckets": edge_buckets, "tol": tol,
            "memory_budget": memory_budget}
    # in place: nobody may read (train on) the dataset while it is rewritten; else it is only read
    lock = PathLock(path, exclusive=same, what="dataset",
                    purpose="partition in place" if same else "partition").acquire()
    try:
        if same:
            j = pending_rewrite(path)
            if j is not None and j.get("phase") != "prepare":
                if not resume and any(j["args"].get(k) != args[k] for k in ARG_KEYS):
                    was = " ".join(f"{k}={j['args'].get(k)}" for k in ARG_KEYS)
                    raise ValueError(f"{path}: an interrupted in-place `ooc partition` ({was}) must "
                                     f"finish first: run `ooc partition {path} --resume`")
                log.warning("%s: finishing the interrupted in-place rewrite (phase %s)", path, j["phase"])
                new, res = finish_rewrite(path, progress=progress)
                res.extra.update(footprint="resumed", memory_budget=parse_bytes(j["args"]["memory_budget"]))
                return new, res
            if resume:
                if j is None:
                    raise ValueError(f"{path}: no interrupted in-place `ooc partition` to resume")
                args = dict(j["args"])  # killed while preparing (the source whole): run it again
                footprint = "low"
            discard_prepared(path)
        elif num_parts is None:
            raise ValueError("--parts is required")
        if args["num_parts"] is None:
            raise ValueError("--parts is required (unless --resume)")
        new, res = _partition(path, args["num_parts"], args["method"], target, same, args["seed"],
                              args["balance_train"], args["passes"], args["objective"],
                              args["memory_budget"], args["edge_buckets"], args["tol"], overwrite,
                              footprint, args, progress)
        res.extra["memory_budget"] = parse_bytes(args["memory_budget"])
        return new, res
    finally:
        lock.release()


def _choose_footprint(ds: Dataset, footprint: str, edge_buckets: bool, num_parts: int = 0) -> str:
    """``copy`` or ``low`` for an in-place rewrite (see :func:`partition_dataset`).

    Raises:
        ValueError: the file system holds room for neither (before anything is written).
    """
    from ooc.partition_inplace import disk_estimate
    est = disk_estimate(ds, edge_buckets, num_parts)
    free = shutil.disk_usage(ds.path).free
    fits = {k: free >= est[f"{k}_extra"] * _DISK_MARGIN + _DISK_SLACK for k in ("copy", "low")}
    if footprint == "auto":
        footprint = "copy" if fits["copy"] else "low"
        if footprint == "low":
            log.warning("%s: %s free, a copy rewrite needs %s: rewriting in place with the low disk "
                        "footprint (%s more); if interrupted, the dataset is unusable until "
                        "`ooc partition %s --resume` finishes it", ds.path, format_bytes(free),
                        format_bytes(est["copy_extra"]), format_bytes(est["low_extra"]), ds.path)
    if footprint == "copy":
        return "copy"
    if not fits["low"]:
        raise ValueError(f"{ds.path}: not enough disk to partition in place: {format_bytes(free)} free, "
                         f"the low-footprint rewrite needs about {format_bytes(est['low_extra'])} more "
                         f"than the dataset's {format_bytes(est['source'])} (a copy "
                         f"{format_bytes(est['copy_extra'])}); nothing was written")
    return "low"


def _partition(path: str | Path, num_parts: int, method: str, target: Path, same: bool, seed: int,
               balance_train: bool, passes: int, objective: str, memory_budget: int | str,
               edge_buckets: bool, tol: float, overwrite: bool, footprint: str = "copy",
               args: dict | None = None, progress: bool = False) -> tuple[Path, PartitionResult]:
    if not same:
        check_replaceable(target.absolute(), overwrite)  # before any work
    ds = Dataset(path, verify="checksums")  # a corrupt source is never rewritten under new checksums
    try:
        check_num_parts(ds.num_nodes, num_parts)
        path_kind = _choose_footprint(ds, footprint, edge_buckets, num_parts) if same else "copy"
        if method == "metis":
            need = metis_memory_estimate(ds.num_nodes, ds.num_edges)
            budget = parse_bytes(memory_budget)
            if need > budget:
                raise ValueError(
                    f"{ds.path}: --method metis needs about {format_bytes(need)} for {ds.num_nodes:,} "
                    f"nodes and {ds.num_edges:,} edges (topology and METIS in memory), more than "
                    f"--memory-budget {format_bytes(budget)}: use --method stream (reads the "
                    f"topology block by block), or a budget of at least {format_bytes(need)}")
        topo = ds.indices if method == "metis" else ds.raw("indices")
        train = ds.split("train")
        block = max(1 << 16, parse_bytes(memory_budget) // 16)
        res = partition_nodes(ds.indptr, topo, ds.num_nodes, num_parts, method, train, seed=seed,
                              balance_train=balance_train, passes=passes, objective=objective,
                              tol=tol, block_edges=block, progress=progress)
        if path_kind == "low":
            from ooc.partition_inplace import rewrite_in_place
            res.extra["footprint"] = "low"
            new = rewrite_in_place(ds, res, args or {}, memory_budget, edge_buckets, progress)
        else:
            res.extra["footprint"] = "copy"
            new = reorder_dataset(ds, res, target, overwrite=same or overwrite,
                                  memory_budget=memory_budget, edge_buckets=edge_buckets,
                                  progress=progress)
    finally:
        ds.close()
    return new, res
