"""Layer-wise importance sampling: LADIES (Zou et al., "Layer-dependent importance sampling for training
deep and large graph convolutional networks", NeurIPS'19).

For the destination nodes ``S`` of a layer, every candidate source ``u`` (an in-neighbour of some node of
``S``) gets probability ``p_u ∝ sum_{v in S} P[v, u]^2`` with ``P = D^-1/2 (A + I) D^-1/2`` (so
``P[v, u]^2 = 1 / ((d_u + 1)(d_v + 1))``, in-degrees ``d``); a fixed number ``n`` of distinct sources
is drawn with probability proportional to ``p`` (Efraimidis-Spirakis exponential keys: the ``n``
smallest ``-log U_u / p_u``), and the layer keeps the edges from the drawn sources to ``S``.

Edge weights are Horvitz-Thompson weights ``1 / pi_u`` with the inclusion probability of the bottom-n
sample conditioned on the ``(n+1)``-th smallest key ``tau``: ``pi_u = 1 - exp(-p_u tau)`` (Cohen &
Kaplan, "Summarizing data using bottom-k sketches", PODC'07), so ``sum_e w_e f(src e)`` is an unbiased
estimate of the full neighbourhood sum.  With ``normalize=True`` (LADIES' row normalisation) the weights
of each destination are rescaled to sum to its in-degree: a self-normalised estimate, exact when every
neighbour is drawn.  When there are at most ``n`` candidates, all are taken with weight 1.

The hop loop runs in Python around Numba/NumPy steps: a layer has only ``n`` new nodes, so relabelling
is a sort-based unique (new nodes of each layer in ascending id order, after all earlier nodes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ooc.kernels.rng import mix_key, mix_key_py, rand_unit
from ooc.kernels.sampling import Block, MiniBatch, unique_seeds

__all__ = ["ladies_sample"]


@njit(cache=True, nogil=True)
def _gather_in_edges(indptr: np.ndarray, indices: np.ndarray, dst: np.ndarray) -> tuple:
    """All in-edges of ``dst``: ``(ptr int64 [n+1], src int64 [m], eid int64 [m])``."""
    n = dst.shape[0]
    ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        v = dst[i]
        ptr[i + 1] = ptr[i] + indptr[v + 1] - indptr[v]
    src = np.empty(ptr[n], dtype=np.int64)
    eid = np.empty(ptr[n], dtype=np.int64)
    for i in range(n):
        v = dst[i]
        o = ptr[i]
        for j in range(indptr[v], indptr[v + 1]):
            src[o] = indices[j]
            eid[o] = j
            o += 1
    return ptr, src, eid


@njit(cache=True, nogil=True)
def _unit_variates(key: np.uint64, ids: np.ndarray) -> np.ndarray:
    out = np.empty(ids.shape[0], dtype=np.float64)
    for i in range(ids.shape[0]):
        out[i] = rand_unit(mix_key(key, ids[i]))
    return out


def ladies_sample(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, layer_sizes: list[int],
                  key: int | np.uint64, normalize: bool = True) -> MiniBatch:
    """LADIES mini-batch: ``layer_sizes[h]`` sources drawn per layer, output layer first.

    Args:
        indptr: int64 [N+1] CSC offsets; indices: int32|int64 [E] in-neighbour ids.
        seeds: integer [B] output nodes (duplicates merged).
        layer_sizes: nodes drawn per layer (``-1`` = all candidates, i.e. full neighbourhoods),
            ``layer_sizes[0]`` around the seeds.
        key: uint64 stream key.
        normalize: row-normalise the importance weights to each destination's in-degree.

    Returns:
        :class:`MiniBatch`; every block has ``edge_weight`` float32 (see module docstring) and ``eids``.

    Raises:
        ValueError: a seed is outside ``[0, N)`` or a layer size is 0 or below -1.
    """
    n_nodes = indptr.shape[0] - 1
    useeds, positions = unique_seeds(seeds, n_nodes)
    sizes = [int(s) for s in layer_sizes]
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"layer sizes {sizes} invalid: use positive counts or -1 for all")
    deg = np.diff(indptr)
    nodes = useeds.copy()
    blocks: list[Block] = []
    for h, n_draw in enumerate(sizes):
        hkey = np.uint64(mix_key_py(int(key), h))
        n_dst = nodes.shape[0]
        ptr, src, eid = _gather_in_edges(indptr, indices, nodes)
        dst_local = np.repeat(np.arange(n_dst, dtype=np.int64), np.diff(ptr))
        if src.shape[0] == 0:
            blocks.append(Block(n_dst, n_dst, ptr, np.empty(0, dtype=np.int32), eid,
                                np.empty(0, dtype=np.float32)))
            continue
        cand, inv = np.unique(src, return_inverse=True)
        p = np.bincount(inv, weights=1.0 / ((deg[src] + 1.0) * (deg[nodes][dst_local] + 1.0)),
                        minlength=cand.shape[0])
        p /= p.sum()
        if n_draw < 0 or cand.shape[0] <= n_draw:
            chosen = np.ones(cand.shape[0], dtype=bool)
            inc = np.ones(cand.shape[0])
        else:
            u = _unit_variates(hkey, cand)
            keys = -np.log1p(-u) / p
            part = np.argpartition(keys, n_draw)
            chosen = np.zeros(cand.shape[0], dtype=bool)
            chosen[part[:n_draw]] = True
            tau = keys[part[n_draw]]
            inc = -np.expm1(-p * tau)
        keep = chosen[inv]
        w = 1.0 / inc[inv[keep]]
        kdst = dst_local[keep]
        counts = np.bincount(kdst, minlength=n_dst)
        if normalize:
            tot = np.bincount(kdst, weights=w, minlength=n_dst)
            scale = np.where(tot > 0, deg[nodes] / np.where(tot > 0, tot, 1.0), 0.0)
            w = w * scale[kdst]
        ksrc = src[keep]
        # relabel: earlier nodes keep their ids, new ones follow in ascending id order
        new = np.setdiff1d(cand[chosen], nodes, assume_unique=True)
        nodes = np.concatenate([nodes, new])
        order = np.argsort(nodes, kind="stable")
        local = order[np.searchsorted(nodes[order], ksrc)]
        bptr = np.zeros(n_dst + 1, dtype=np.int64)
        np.cumsum(counts, out=bptr[1:])
        blocks.append(Block(nodes.shape[0], n_dst, bptr, local.astype(np.int32), eid[keep],
                            w.astype(np.float32)))
    blocks.reverse()
    return MiniBatch(seeds=useeds, nodes=nodes, blocks=blocks, seed_positions=positions)
