"""A vectorised pure-PyTorch node-wise sampler: the reference that ``ooc bench sample`` sets beside the
Numba kernel, and an independent implementation the tests compare distributions against.

Per hop, for the frontier nodes with more than ``fanout`` in-neighbours, every in-edge gets a random key
and one sort of ``segment + key`` keeps the ``fanout`` smallest keys of each node (uniform without
replacement); nodes with at most ``fanout`` neighbours keep all.  Relabelling is ``torch.unique`` with
first-occurrence ordering, so earlier nodes keep their ids and seeds come first (same MFG layout as
:func:`ooc.kernels.sampling.neighbor_sample`; the samples themselves differ, the distribution does not).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["torch_neighbor_sample"]


def _hop(indptr: Tensor, indices: Tensor, frontier: Tensor, fanout: int,
         gen: torch.Generator) -> tuple[Tensor, Tensor]:
    start = indptr[frontier]
    deg = indptr[frontier + 1] - start
    k = deg if fanout < 0 else torch.clamp(deg, max=fanout)
    full = deg == k
    # all in-edges of the nodes that keep everything
    fidx = torch.nonzero(full).squeeze(1)
    fdeg = deg[fidx]
    fseg = torch.repeat_interleave(fidx, fdeg)
    fpos = torch.repeat_interleave(start[fidx] - torch.cumsum(fdeg, 0) + fdeg, fdeg) + \
        torch.arange(int(fdeg.sum()), dtype=torch.int64)
    # nodes that sample: random key per edge, keep the k smallest per node
    sidx = torch.nonzero(~full).squeeze(1)
    sdeg = deg[sidx]
    if sidx.numel():
        total = int(sdeg.sum())
        seg = torch.repeat_interleave(torch.arange(sidx.numel(), dtype=torch.int64), sdeg)
        off = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(
            torch.cumsum(sdeg, 0) - sdeg, sdeg)
        keys = seg.double() + torch.rand(total, generator=gen, dtype=torch.float64)
        order = torch.argsort(keys)
        rank = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(
            torch.cumsum(sdeg, 0) - sdeg, sdeg)
        sel = order[rank < fanout]
        sseg = sidx[seg[sel]]
        spos = start[sseg] + off[sel]
    else:
        sseg = torch.empty(0, dtype=torch.int64)
        spos = torch.empty(0, dtype=torch.int64)
    dst = torch.cat([fseg, sseg])
    pos = torch.cat([fpos, spos])
    o = torch.argsort(dst, stable=True)
    return dst[o], indices[pos[o]].long()


def torch_neighbor_sample(indptr: Tensor, indices: Tensor, seeds: Tensor, fanouts: list[int],
                          gen: torch.Generator | None = None) -> tuple[Tensor, list[tuple]]:
    """Multi-hop uniform neighbour sampling without replacement, vectorised in PyTorch.

    Args:
        indptr: int64 [N+1] CSC offsets; indices: int [E] in-neighbour ids.
        seeds: int64 [B] unique output nodes; fanouts: output layer first, ``-1`` = all.
        gen: torch random generator (default: a fresh unseeded one).

    Returns:
        ``(nodes int64 [n], blocks)`` with ``blocks`` input layer first, each
        ``(num_src, num_dst, dst int64 [E_h], src int64 [E_h])`` in local ids; ``nodes[:B] == seeds``.
    """
    gen = gen if gen is not None else torch.Generator()
    nodes = seeds.long()
    blocks = []
    for fanout in fanouts:
        n_dst = nodes.shape[0]
        dst, nbr = _hop(indptr, indices, nodes, int(fanout), gen)
        allids = torch.cat([nodes, nbr])
        uniq, inv = torch.unique(allids, return_inverse=True)
        first = torch.full((uniq.shape[0],), allids.shape[0], dtype=torch.int64)
        first.scatter_reduce_(0, inv, torch.arange(allids.shape[0], dtype=torch.int64), "amin")
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.shape[0], dtype=torch.int64)
        nodes = uniq[order]
        blocks.append((nodes.shape[0], n_dst, dst, rank[inv[n_dst:]]))
    blocks.reverse()
    return nodes, blocks
