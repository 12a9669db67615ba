"""The subgraph induced by the resident partitions of a buffer state (``buffer`` mode).

MariusGNN's in-buffer sampling: a state's batches sample neighbours from the resident partitions
only.  :class:`ResidentGraph` rebuilds, for each state, a CSC in *state-local* ids -- local id
``b * slot_rows + r`` is row ``r`` of the ``b``-th partition of the state (partitions in ascending
order) -- keeping only in-edges whose source is resident.  Local ids, and the counter-based samples
keyed by them, do not depend on which slot a partition landed in, so a resumed run (or another
local rank sharing the buffer) samples the same batches.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ooc.data.buffer import BufferManager

__all__ = ["ResidentGraph"]


@njit(cache=True, nogil=True)
def _filter_lists(rel_ptr: np.ndarray, idx: np.ndarray, offsets: np.ndarray, part_slot: np.ndarray,
                  slot_rows: int, deg: np.ndarray, row0: int, out: np.ndarray, pos: int) -> int:
    """Keep in-neighbours whose partition is in the state (``part_slot[q] >= 0``: its block), as
    local ids ``block * slot_rows + row``; returns the new ``pos``."""
    for r in range(rel_ptr.shape[0] - 1):
        c = 0
        for j in range(rel_ptr[r], rel_ptr[r + 1]):
            u = idx[j]
            q = np.searchsorted(offsets, u, side="right") - 1
            s = part_slot[q]
            if s >= 0:
                out[pos] = s * slot_rows + (u - offsets[q])
                pos += 1
                c += 1
        deg[row0 + r] = c
    return pos


class ResidentGraph:
    """The subgraph induced by the resident partitions of a state, in state-local ids (buffer mode).

    Local id ``b * slot_rows + r`` is row ``r`` of the ``b``-th partition of the state (partitions in
    ascending order), so local ids -- and the counter-based samples keyed by them -- do not depend on
    which slot a partition landed in (a resumed run samples the same batches).  The CSC keeps only
    in-edges whose source is resident (MariusGNN's in-buffer sampling).
    """

    def __init__(self, buffer: BufferManager, indptr: np.ndarray, indices: np.ndarray | None,
                 loops: np.ndarray | None = None) -> None:
        self.buffer = buffer
        self.loops_global = loops
        self.loops: np.ndarray | None = None
        self.indptr_global = indptr
        self.indices_global = indices
        self.key: tuple | None = None
        self.indptr = np.zeros(1, dtype=np.int64)
        self.indices = np.empty(0, dtype=np.int64)
        self.degrees = np.zeros(0, dtype=np.int64)
        self.local_to_global = np.empty(0, dtype=np.int64)
        self.block_slot = np.empty(0, dtype=np.int64)

    def build(self, parts: list[int], key: tuple) -> None:
        """Rebuild for the state holding ``parts`` (all resident)."""
        if key == self.key:
            return
        b = self.buffer
        order = sorted(int(p) for p in parts)
        part_block = np.full(b.num_parts, -1, dtype=np.int64)
        for i, p in enumerate(order):
            part_block[p] = i
        total_rows = len(order) * b.slot_rows
        deg = np.zeros(total_rows, dtype=np.int64)
        l2g = np.full(total_rows, -1, dtype=np.int64)
        m = 0
        for p in order:
            a, z = int(b.offsets[p]), int(b.offsets[p + 1])
            m += int(self.indptr_global[z] - self.indptr_global[a])
        out = np.empty(m, dtype=np.int64)
        pos = 0
        for i, p in enumerate(order):
            a, z = int(b.offsets[p]), int(b.offsets[p + 1])
            ip = self.indptr_global[a:z + 1]
            rel = ip - ip[0]
            if self.indices_global is not None:
                idx = self.indices_global[int(ip[0]):int(ip[-1])]
            else:
                idx = b.in_edges_of(p)
            pos = _filter_lists(rel, idx, b.offsets, part_block, b.slot_rows, deg, i * b.slot_rows,
                                out, pos)
            l2g[i * b.slot_rows:i * b.slot_rows + (z - a)] = np.arange(a, z, dtype=np.int64)
        self.indptr = np.zeros(total_rows + 1, dtype=np.int64)
        np.cumsum(deg, out=self.indptr[1:])
        self.indices = out[:pos]
        self.degrees = deg
        self.local_to_global = l2g
        if self.loops_global is not None:  # a node's loops are resident with it
            self.loops = np.where(l2g >= 0, self.loops_global[np.maximum(l2g, 0)], 0).astype(np.int32)
        self.part_block = part_block
        self.block_slot = np.array([b.slot_of[p] for p in order], dtype=np.int64)
        self.key = key

    def to_local(self, ids: np.ndarray) -> np.ndarray:
        """State-local ids of global ``ids`` (all in the state's partitions)."""
        b = self.buffer
        p = np.searchsorted(b.offsets, ids, side="right") - 1
        blk = self.part_block[p]
        if (blk < 0).any():
            raise ValueError("seed outside the resident partitions")
        return blk * b.slot_rows + (ids - b.offsets[p])

    def to_slot_local(self, local: np.ndarray) -> np.ndarray:
        """Slot-local ids (``slot * slot_rows + row``, for :meth:`BufferManager.gather_local`)."""
        sr = self.buffer.slot_rows
        return self.block_slot[local // sr] * sr + local % sr
