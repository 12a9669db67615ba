"""``--features structural[:D]``: node features computed from the topology at conversion, for graphs
that come without any (``ooc train`` needs a feature array).

Column 0 is ``log(1 + in-degree)``; columns 1..D-1 are a random projection of the node's adjacency
row, ``deg^-1/2 * sum over in-neighbours u of r_u`` with random sign vectors ``r_u``
(:func:`ooc.kernels.structural.structural_rows`): the LINKX paper's features for graphs without
attributes (Lim et al., "Large scale learning on non-homophilous graphs", NeurIPS'21).  With
``--undirected`` the in-neighbours are all neighbours.

Streamed in bounded memory: the CSC offsets (8 B per node) and, per block of nodes, their
neighbour lists (at most ~4 M ids) and output rows (~32 MB).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from ooc.kernels.rng import batch_key
from ooc.kernels.structural import structural_rows
from ooc.storage.rawarray import RawArray

__all__ = ["DEFAULT_DIM", "parse_structural", "structural_feature_rows"]

DEFAULT_DIM = 64
_PREFIX = "structural"


def parse_structural(spec: object) -> int | None:
    """``"structural"`` -> 64, ``"structural:16"`` -> 16; anything else (a file) -> None.

    Raises:
        ValueError: ``structural:`` followed by something that is not an integer >= 1.
    """
    if not isinstance(spec, str) or not (spec == _PREFIX or spec.startswith(_PREFIX + ":")):
        return None
    if spec == _PREFIX:
        return DEFAULT_DIM
    tail = spec[len(_PREFIX) + 1:]
    if not tail.isdigit() or int(tail) < 1:
        raise ValueError(f"--features structural:D takes a width D >= 1, got {spec!r}")
    return int(tail)


def structural_feature_rows(arrays_root: Path, num_nodes: int, dim: int, seed: int = 0,
                            block_bytes: int = 32 << 20,
                            block_edges: int = 1 << 22) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(first node, float32 [m, dim] rows)`` for all nodes, in node order.

    Args:
        arrays_root: the ``arrays.zarr`` folder holding ``topology/indptr`` and ``topology/indices``
            (a dataset, or a writer's partial directory once the CSC is written).
        num_nodes: N.
        dim: D >= 1 (column 0 log-degree, D-1 projection columns).
        seed: seed of the random signs (rows are a pure function of the graph, D and seed).
    """
    indptr = RawArray(arrays_root / "topology" / "indptr").read_all()
    indices = RawArray(arrays_root / "topology" / "indices")
    key = batch_key(seed, 0, 0, stream=0x57C)
    rows_cap = max(1, block_bytes // (4 * dim))
    v = 0
    try:
        while v < num_nodes:
            stop = min(num_nodes, v + rows_cap)
            # at most block_edges neighbour ids, but always at least one node
            stop = max(v + 1, min(stop, int(np.searchsorted(indptr, indptr[v] + block_edges,
                                                              side="right")) - 1))
            base, end = int(indptr[v]), int(indptr[stop])
            nbrs = indices.read(base, end)
            out = np.empty((stop - v, dim), dtype=np.float32)
            structural_rows(indptr, nbrs, v, base, key, out)
            yield v, out
            v = stop
    finally:
        indices.close()
