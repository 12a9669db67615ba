"""R-MAT graphs with planted, learnable labels, generated in parallel chunks (Numba).

Edges follow R-MAT (Chakrabarti, Zhan & Faloutsos, "R-MAT: A recursive model for graph mining",
SDM 2004) with the Graph500 parameters a=0.57, b=0.19, c=0.19 (d=0.05): each of the ``scale``
levels picks a quadrant of the adjacency matrix.  As in the Graph500 generator, vertex ids are then
scrambled by a seeded bijection of ``[0, 2^scale)`` (so hubs are spread over the id range and over
contiguous partitions), and ids ``>= N`` are cycle-walked back into ``[0, N)`` (Black & Rogaway,
"Ciphers with arbitrary finite domains", CT-RSA 2002), which keeps the map a bijection.

Labels are planted so a GNN can learn them: node ``v`` has class ``v mod K``; with probability
``homophily`` an edge's destination is moved to the node of the source's class within its own block
of K consecutive ids (a community structure: same-class edges are far more frequent than the 1/K of
a label-blind graph), and features are ``centroid[class] + noise * N(0, I)`` with random unit-variance
centroids, noisy enough that features alone are a weak classifier.

Everything is a pure function of ``(seed, edge index)`` or ``(seed, node id)`` through splitmix64
(:mod:`ooc.kernels.rng`), so any chunking and any thread count give the identical graph.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

from ooc.kernels.rng import mix_key, rand_unit, splitmix64

__all__ = ["rmat_edges", "rmat_node_data", "scramble", "GRAPH500_ABC"]

GRAPH500_ABC = (0.57, 0.19, 0.19)


@njit(cache=True, nogil=True, inline="always")
def _perm(x: np.uint64, scale: np.int64, mask: np.uint64, k1: np.uint64, k2: np.uint64) -> np.uint64:
    """A bijection of [0, 2^scale): xor-shift / odd-multiply rounds modulo 2^scale."""
    h = uint64(scale // 2 + 1)
    x = (x ^ k1) & mask
    x = (x * uint64(0x9E3779B97F4A7C15 | 1)) & mask
    x = x ^ (x >> h)
    x = (x * (k2 | uint64(1))) & mask
    x = x ^ (x >> h)
    x = (x * uint64(0xBF58476D1CE4E5B9 | 1)) & mask
    x = x ^ (x >> h)
    return x


@njit(cache=True, nogil=True)
def scramble(v: np.int64, n: np.int64, scale: np.int64, k1: np.uint64, k2: np.uint64) -> np.int64:
    """Seeded bijection of ``[0, n)`` (``n <= 2^scale``) by cycle walking a bijection of 2^scale."""
    mask = uint64((1 << scale) - 1) if scale < 64 else uint64(0xFFFFFFFFFFFFFFFF)
    x = _perm(uint64(v), scale, mask, k1, k2)
    while x >= uint64(n):
        x = _perm(x, scale, mask, k1, k2)
    return np.int64(x)


@njit(cache=True, nogil=True, parallel=True)
def rmat_edges(start: int, count: int, num_nodes: int, num_classes: int, homophily: float,
               a: float, b: float, c: float, key: np.uint64, src: np.ndarray, dst: np.ndarray) -> None:
    """Fill ``src[:count]``, ``dst[:count]`` with R-MAT edges ``start .. start+count-1``.

    Args:
        start: global index of the first edge (edges are a pure function of index and key).
        num_nodes: N; ids are in ``[0, N)``.
        num_classes: K (class of v = v mod K); homophily: probability of a same-class destination.
        a, b, c: R-MAT quadrant probabilities (d = 1 - a - b - c).
        key: the graph's uint64 key (from the seed).
        src, dst: int32 or int64 [>= count] outputs.
    """
    scale = 1
    while (1 << scale) < num_nodes:
        scale += 1
    ta = uint64(a * 65536.0)
    tab = uint64((a + b) * 65536.0)
    tabc = uint64((a + b + c) * 65536.0)
    k1 = splitmix64(key ^ uint64(0x1234567))
    k2 = splitmix64(key ^ uint64(0x7654321))
    hkey = mix_key(key, 77)
    for i in prange(count):
        e = start + i
        ek = mix_key(key, e)
        u = uint64(0)
        v = uint64(0)
        r = uint64(0)
        for lvl in range(scale):
            if lvl % 4 == 0:
                r = splitmix64(ek + uint64(lvl))
            q = r & uint64(0xFFFF)
            r = r >> uint64(16)
            u = u << uint64(1)
            v = v << uint64(1)
            if q < ta:
                pass
            elif q < tab:
                v |= uint64(1)
            elif q < tabc:
                u |= uint64(1)
            else:
                u |= uint64(1)
                v |= uint64(1)
        s = scramble(np.int64(u), num_nodes, scale, k1, k2)
        d = scramble(np.int64(v), num_nodes, scale, k1, k2)
        if num_classes > 1 and rand_unit(mix_key(hkey, e)) < homophily:
            d2 = d - d % num_classes + s % num_classes
            if d2 >= num_nodes:
                d2 -= num_classes
            d = d2
        src[i] = s
        dst[i] = d


@njit(cache=True, nogil=True, parallel=True)
def rmat_node_data(start: int, count: int, num_classes: int, centroids: np.ndarray, noise: float,
                   fractions: np.ndarray, key: np.uint64, features: np.ndarray, labels: np.ndarray,
                   split: np.ndarray) -> None:
    """Labels, features and split membership of nodes ``start .. start+count-1``.

    Args:
        centroids: float32 [K, D] class centroids.
        noise: standard deviation of the Gaussian feature noise.
        fractions: float64 [3] train / valid / test fractions.
        features: float32|float16 [>= count, D] output; labels: int32 [>= count] (v mod K);
        split: int8 [>= count]: 0 train, 1 valid, 2 test, -1 none.
    """
    d = centroids.shape[1]
    fkey = mix_key(key, 1001)
    skey = mix_key(key, 2002)
    t0 = fractions[0]
    t1 = t0 + fractions[1]
    t2 = t1 + fractions[2]
    for i in prange(count):
        v = start + i
        cls = v % num_classes
        labels[i] = cls
        nk = mix_key(fkey, v)
        for j in range(0, d, 2):
            # Box-Muller: two normals per pair of uniforms
            u1 = rand_unit(mix_key(nk, j))
            u2 = rand_unit(mix_key(nk, j + 1))
            rad = np.sqrt(-2.0 * np.log(1.0 - u1))
            z0 = rad * np.cos(2.0 * np.pi * u2)
            features[i, j] = centroids[cls, j] + noise * z0
            if j + 1 < d:
                z1 = rad * np.sin(2.0 * np.pi * u2)
                features[i, j + 1] = centroids[cls, j + 1] + noise * z1
        u = rand_unit(mix_key(skey, v))
        if u < t0:
            split[i] = 0
        elif u < t1:
            split[i] = 1
        elif u < t2:
            split[i] = 2
        else:
            split[i] = -1
