"""Message passing over a block's edges as differentiable sparse operations.

The layers of :mod:`ooc.models` aggregate with four operations on the edges ``(src[e], dst[e])`` of a
block (an :class:`Adjacency`):

- :func:`spmm` -- ``out[v] = sum_{e: dst_e = v} w_e x[src_e]``, the sparse x dense product, fused:
  no per-edge message tensor (Hamilton et al.'s mean/sum aggregators, GCN's normalised sum, GIN's
  sum, GAT's attention-weighted sum with one weight per edge and head);
- :func:`segment_sum` -- ``out[v] = sum_{e: dst_e = v} msg[e]`` of per-edge messages;
- :func:`gather_src` / :func:`gather_dst` -- ``h[src]`` / ``h[dst]``, one row per edge.

On CPU (float32 / float64) forward and backward are the Numba kernels of
:mod:`ooc.kernels.aggregate`: one thread per output row, each row's edges in ascending edge id, so
the result does not depend on the thread count and equals, float for float, the sequential
``index_select`` + ``index_add_`` formulation it replaces (kept as the reference, and the path on
other devices, where ``index_add_`` uses atomics).  The gradient of a gather or sum with respect to
its input is the transposed operation over the same edges: the CSR over sources, built by a stable
counting sort in the first backward pass that needs it (O(E), ~1 % of a training step).  The gradient of :func:`spmm` with respect to the edge weights
(GAT) is a per-edge dot product (SDDMM) whose float rounding differs from autograd's.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ooc.kernels.aggregate import csr_by_key, segment_max_csr, sddmm_csr, spmm_csr

__all__ = ["Adjacency", "spmm", "segment_sum", "segment_max", "gather_src", "gather_dst",
           "spmm_reference", "reference_ops", "transform_first"]

_EMPTY_I = np.zeros(0, dtype=np.int64)
_USE_KERNELS = [True]


@contextmanager
def reference_ops() -> Iterator[None]:
    """Within this context every operation takes the ``index_select`` / ``index_add_`` path
    (tests compare the kernels with it; not thread-local)."""
    _USE_KERNELS.append(False)
    try:
        yield
    finally:
        _USE_KERNELS.pop()


class Adjacency:
    """The edges of a block, ``src[e] -> dst[e]``, as CSR over destinations and over sources.

    Args:
        src: int64 [E] source ids in ``[0, num_src)``; dst: int64 [E] destination ids in
            ``[0, num_dst)`` (torch tensors; on CPU the kernels read them without copying).
        num_src, num_dst: node counts.
        indptr: int64 [num_dst+1] when the edges are already grouped by destination in ascending
            order (sampled blocks: CSC order), so that no sort is needed; None: computed.

    The CSR over sources (the transpose) is built on first use (:meth:`transpose`).
    """

    def __init__(self, src: Tensor, dst: Tensor, num_src: int, num_dst: int,
                 indptr: np.ndarray | None = None) -> None:
        self.src, self.dst = src, dst
        self.num_src, self.num_dst = int(num_src), int(num_dst)
        self.num_edges = int(src.shape[0])
        self._t: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._seq: np.ndarray | None = None
        if src.device.type != "cpu":
            self.indptr = self.row_eid = self.row_col = None
            return
        s, d = src.numpy(), dst.numpy()
        if indptr is None and (self.num_edges < 2 or bool(np.all(d[1:] >= d[:-1]))):
            indptr = np.zeros(self.num_dst + 1, dtype=np.int64)
            np.cumsum(np.bincount(d, minlength=self.num_dst), out=indptr[1:])
        if indptr is not None:  # grouped by destination: the CSR is the edge list itself
            self.indptr, self.row_eid, self.row_col = np.asarray(indptr, dtype=np.int64), _EMPTY_I, s
        else:
            self.indptr, eid = csr_by_key(d, self.num_dst)
            self.row_eid, self.row_col = eid, s[eid]

    @property
    def grouped(self) -> bool:
        """Whether the edges are in destination order (the CSR over destinations is the edge list)."""
        return self.row_eid is not None and self.row_eid.shape[0] == 0

    def row_positions(self) -> np.ndarray:
        """int64 [E]: the edge id at every position of the CSR over destinations."""
        if self.row_eid is not None and self.row_eid.shape[0]:
            return self.row_eid
        if self._seq is None:
            self._seq = np.arange(self.num_edges, dtype=np.int64)
        return self._seq

    def transpose(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The CSR over sources: ``(indptr [num_src+1], dst of each entry, edge id of each entry)``,
        each source's edges in ascending edge id."""
        if self._t is None:
            ip, eid = csr_by_key(self.src.numpy(), self.num_src)
            self._t = (ip, self.dst.numpy()[eid], eid)
        return self._t


def _kernel_ok(*ts: Tensor | None) -> bool:
    return _USE_KERNELS[-1] and all(
        t is None or (t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)) for t in ts)


def _width(t: Tensor) -> int:
    """Elements per row of ``t`` [n, *F]."""
    return int(np.prod(t.shape[1:], dtype=np.int64))


def _as3(x: Tensor) -> Tensor:
    """[S, F] -> [S, 1, F]; [S, H, F] as it is (contiguous)."""
    x = x.contiguous()
    return x.unsqueeze(1) if x.dim() == 2 else x


def _spmm_np(indptr: np.ndarray, col: np.ndarray, eid: np.ndarray, w: Tensor | None, x3: Tensor,
             rows: int) -> Tensor:
    out = x3.new_empty((rows, x3.shape[1], x3.shape[2]))
    wn = w.numpy() if w is not None else np.zeros((0, x3.shape[1]), dtype=x3.numpy().dtype)
    spmm_csr(indptr, col, eid, wn, x3.numpy(), out.numpy())
    return out


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x3: Tensor, w2: Tensor | None, adj: Adjacency) -> Tensor:  # type: ignore[override]
        ctx.adj = adj
        ctx.save_for_backward(x3 if w2 is not None and w2.requires_grad else None, w2)
        return _spmm_np(adj.indptr, adj.row_col, adj.row_eid, w2, x3, adj.num_dst)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None, None]:  # type: ignore[override]
        adj: Adjacency = ctx.adj
        x3, w2 = ctx.saved_tensors
        g = g.contiguous()
        gx = gw = None
        if ctx.needs_input_grad[0]:
            tip, tcol, teid = adj.transpose()
            gx = _spmm_np(tip, tcol, teid, w2, g, adj.num_src)
        if ctx.needs_input_grad[1]:
            gw = g.new_empty((adj.num_edges, g.shape[1]))
            sddmm_csr(adj.indptr, adj.row_col, adj.row_eid, g.numpy(), x3.numpy(), gw.numpy())
        return gx, gw, None


def transform_first(adj: Adjacency, x: Tensor, in_dim: int, out_dim: int) -> bool:
    """Whether a linear map ``W`` [out_dim, in_dim] applied around a sum over the edges (which
    commute) is cheaper before it (``spmm(adj, x W^T)``) than after (``spmm(adj, x) W^T``).

    On CPU (the fused kernels: no per-edge message tensor) by multiply-adds: before costs
    ``num_src * in * out + E * out``, after ``E * in + num_dst * in * out``; a sampled block has far
    fewer destinations than sources, so after usually wins (2 M-node bench, first SAGE layer: 9x
    fewer).  Elsewhere the per-edge messages of ``index_add_`` are the cost: before when ``in_dim >
    out_dim``.  The choice depends on the block's shape only, so it is the same in every run.
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return in_dim > out_dim
    e = adj.num_edges
    return adj.num_src * in_dim * out_dim + e * out_dim < e * in_dim + adj.num_dst * in_dim * out_dim


def spmm_reference(adj: Adjacency, x: Tensor, weight: Tensor | None = None) -> Tensor:
    """:func:`spmm` as ``index_select`` + ``index_add_`` (any device; atomics on GPUs)."""
    msg = x.index_select(0, adj.src)
    if weight is not None:
        msg = msg * weight.unsqueeze(-1).to(msg.dtype)
    out = msg.new_zeros((adj.num_dst, *x.shape[1:]))
    if adj.num_edges:
        out.index_add_(0, adj.dst, msg)
    return out


def spmm(adj: Adjacency, x: Tensor, weight: Tensor | None = None) -> Tensor:
    """Weighted sum over in-edges: ``out[v] = sum_{e: dst_e = v} weight[e] * x[src_e]``.

    Args:
        adj: the edges.
        x: float [num_src, F], or [num_src, H, F] (one weight per edge and head).
        weight: None (all 1), float [E] for ``x`` [num_src, F], or [E, H] for [num_src, H, F];
            may require grad (attention weights).

    Returns:
        float [num_dst, F] (or [num_dst, H, F]); 0 where a node has no in-edge.

    Differentiable in ``x`` and ``weight``; on CPU (float32/float64) the Numba kernels, elsewhere
    :func:`spmm_reference`.

    Raises:
        ValueError: ``weight`` does not have one entry per edge (and head).
    """
    if weight is not None and (weight.shape[0] != adj.num_edges or weight.dim() != x.dim() - 1
                               or (x.dim() == 3 and weight.shape[1] != x.shape[1])):
        raise ValueError(f"weight {tuple(weight.shape)} for {adj.num_edges} edges and x "
                         f"{tuple(x.shape)}")
    if adj.indptr is None or not _kernel_ok(x, weight):
        return spmm_reference(adj, x, weight)
    w2 = None
    if weight is not None:
        w2 = weight.to(x.dtype).contiguous()
        w2 = w2.unsqueeze(1) if w2.dim() == 1 else w2
    out = _SpMM.apply(_as3(x), w2, adj)
    return out.squeeze(1) if x.dim() == 2 else out


class _SegmentSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, msg: Tensor, adj: Adjacency) -> Tensor:  # type: ignore[override]
        ctx.adj = adj
        m = msg.contiguous().reshape(msg.shape[0], 1, _width(msg))
        out = _spmm_np(adj.indptr, adj.row_positions(), _EMPTY_I, None, m, adj.num_dst)
        return out.reshape(adj.num_dst, *msg.shape[1:])

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return g.index_select(0, ctx.adj.dst), None


def segment_sum(adj: Adjacency, msg: Tensor) -> Tensor:
    """Sum per-edge messages into their destinations: ``out[v] = sum_{e: dst_e = v} msg[e]``.

    Args:
        adj: the edges; msg: float [E, *F].

    Returns:
        float [num_dst, *F]; 0 where a node has no in-edge.  Differentiable in ``msg``.
    """
    if adj.indptr is None or not _kernel_ok(msg):
        out = msg.new_zeros((adj.num_dst, *msg.shape[1:]))
        return out.index_add_(0, adj.dst, msg) if adj.num_edges else out
    return _SegmentSum.apply(msg, adj)


def segment_max(adj: Adjacency, s: Tensor) -> Tensor:
    """Per-destination maximum of edge values, not differentiable: ``out[v, h] = max_{e: dst_e = v}
    s[e, h]``, ``-inf`` where a node has no in-edge.

    Args:
        adj: the edges; s: float [E, H] (detached).

    Returns:
        float [num_dst, H].
    """
    s = s.detach()
    if adj.indptr is None or not _kernel_ok(s):
        idx = adj.dst.unsqueeze(1).expand_as(s)
        out = s.new_full((adj.num_dst, s.shape[1]), float("-inf"))
        return out.scatter_reduce(0, idx, s, reduce="amax", include_self=True)
    out = s.new_empty((adj.num_dst, s.shape[1]))
    segment_max_csr(adj.indptr, adj.row_eid, s.contiguous().numpy(), out.numpy())
    return out


class _GatherSrc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, adj: Adjacency) -> Tensor:  # type: ignore[override]
        ctx.adj = adj
        return h.index_select(0, adj.src)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        adj: Adjacency = ctx.adj
        tip, _, teid = adj.transpose()
        m = g.contiguous().reshape(g.shape[0], 1, _width(g))
        out = _spmm_np(tip, teid, _EMPTY_I, None, m, adj.num_src)
        return out.reshape(adj.num_src, *g.shape[1:]), None


def gather_src(adj: Adjacency, h: Tensor) -> Tensor:
    """``h[src]``: float [num_src, *F] -> [E, *F], differentiable (the gradient sums each source's
    edges in edge order)."""
    if adj.indptr is None or not _kernel_ok(h):
        return h.index_select(0, adj.src)
    return _GatherSrc.apply(h, adj)


class _GatherDst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, adj: Adjacency) -> Tensor:  # type: ignore[override]
        ctx.adj = adj
        return h.index_select(0, adj.dst)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return segment_sum(ctx.adj, g), None


def gather_dst(adj: Adjacency, h: Tensor) -> Tensor:
    """``h[dst]``: float [num_dst, *F] -> [E, *F], differentiable (the gradient is
    :func:`segment_sum`)."""
    if adj.indptr is None or not _kernel_ok(h):
        return h.index_select(0, adj.dst)
    return _GatherDst.apply(h, adj)
