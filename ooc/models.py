"""GNN layers in plain PyTorch, operating on sampled message-flow graphs (MFGs).

A layer maps source-node features to destination-node features of one block:
``x: [num_src, F_in] -> [num_dst, F_out]``, float32; the destination nodes are the first ``num_dst``
source nodes.  Nodes without sampled in-edges aggregate exactly 0.

Layers: :class:`GCNConv` (Kipf & Welling, ICLR'17), :class:`SAGEConv` (Hamilton et al., NeurIPS'17;
mean, max-pool and sum aggregators), :class:`GATConv` (Velickovic et al., ICLR'18; multi-head, edge
softmax, attention dropout), :class:`GINConv` (Xu et al., ICLR'19; learnable epsilon).  :class:`GNN`
stacks them with dropout, optional residual connections and normalisation, and exposes one layer at
a time (:meth:`GNN.layer_forward`) for exact layer-wise inference (:mod:`ooc.inference`).

Determinism: aggregation is :mod:`ooc.sparse` (on CPU, Numba CSR kernels that sum every output row
in edge order on one thread: the floats of ``index_select`` + ``index_add_``, whatever the thread
count), so a run's losses and weights are bit-identical whatever the buffer size, prefetch depth or
thread timing (and a resumed run matches an uninterrupted one).

Sum-type aggregators (SAGE ``sum``, GIN, GCN) estimate the full-neighbourhood sum from a sample: the
sum over the ``s_v`` sampled in-edges is scaled by ``d_v / s_v`` (``d_v`` the full-graph in-degree),
which is exact when all neighbours are sampled.  Mean, max and attention need no correction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from ooc.kernels.dropout import dropout_backward, dropout_forward, dropout_forward_half, keep_threshold
from ooc.kernels.sampling import Block, SampledSubgraph
from ooc.sparse import (Adjacency, gather_dst, gather_src, segment_max, segment_sum, spmm,
                        transform_first)

__all__ = ["TorchBlock", "to_torch_blocks", "split_self_loops", "aggregate", "edge_softmax", "Dropout", "SAGEConv", "GCNConv",
           "GATConv", "GINConv", "GNN", "build_model", "takes_half", "needs_loop_counts", "MODELS"]


class _CounterDropout(torch.autograd.Function):
    """Dropout with the mask of :func:`ooc.kernels.dropout.dropout_forward` (see :class:`Dropout`)."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:  # type: ignore[override]
        xc = x.detach().contiguous()
        half = xc.dtype == torch.float16  # float16 rows come out float32, converted in the sweep
        out = torch.empty(xc.shape, dtype=torch.float32 if half else xc.dtype)
        # an input without gradient (the features) needs no mask
        mask = torch.empty(xc.shape if ctx.needs_input_grad[0] else (0,), dtype=torch.uint8)
        scale = 1.0 / (1.0 - p)
        # one draw of torch's generator keys the mask: torch.manual_seed and checkpointed RNG
        # states fix it, as they fix torch's own dropout
        key = np.uint64(int(torch.randint(0, 2 ** 62, (1,)).item()))
        if half:
            dropout_forward_half(xc.view(-1).view(torch.int16).numpy().view(np.uint16),
                                 out.view(-1).numpy(), mask.view(-1).numpy(), keep_threshold(p),
                                 scale, key)
        else:
            dropout_forward(xc.view(-1).numpy(), out.view(-1).numpy(), mask.view(-1).numpy(),
                            keep_threshold(p), scale, key)
        ctx.save_for_backward(mask)
        ctx.scale = scale
        ctx.in_dtype = xc.dtype
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        g = grad.contiguous()
        out = torch.empty_like(g)
        dropout_backward(g.view(-1).numpy(), mask.view(-1).numpy(), out.view(-1).numpy(), ctx.scale)
        return out.to(ctx.in_dtype), None


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose CPU mask comes from a parallel counter-based generator.

    Same semantics as ``torch.nn.Dropout`` (training only, inverted scaling ``1 / (1 - p)``,
    ``x: [*] -> [*]``); on CPU float32/float64 tensors of at least 4,096 elements the mask is drawn by
    :func:`ooc.kernels.dropout.dropout_forward` (all cores, one sweep) instead of ``bernoulli_`` (one
    generator call per element: about half of the trainer's time on a 700,000 x 128 input, see
    docs/benchmarks.md).  Other devices and dtypes use PyTorch's dropout.  :meth:`forward_float`
    is ``forward(x.float())`` with the conversion of float16 rows fused into the same sweep.
    """

    def forward_float(self, x: Tensor) -> Tensor:
        """``forward(x.float())``, the same output and mask: on CPU a float16 ``x`` of at least
        4,096 elements is read once and written once (float32) by
        :func:`ooc.kernels.dropout.dropout_forward_half` instead of converted, then dropped."""
        if (x.dtype == torch.float16 and self.training and self.p > 0.0 and x.device.type == "cpu"
                and not self.inplace and x.numel() >= 4096):
            return _CounterDropout.apply(x, float(self.p))
        return self.forward(x.float())

    def forward(self, x: Tensor) -> Tensor:
        if (not self.training or self.p == 0.0 or x.device.type != "cpu" or self.inplace
                or x.dtype not in (torch.float32, torch.float64) or x.numel() < 4096):
            return super().forward(x)
        return _CounterDropout.apply(x, float(self.p))


@dataclass
class TorchBlock:
    """A block as tensors.

    Attributes:
        num_src, num_dst: node counts.
        src, dst: int64 [E] local source / destination id of every sampled edge.
        deg_src: float32 [num_src] in-degree of each source node in the full graph.
        deg_dst: float32 [num_dst] in-degree of each destination node in the full graph.
        sampled: float32 [num_dst] number of sampled in-edges of each destination node.
        edge_weight: optional float32 [E] importance weight of every edge (see
            :class:`ooc.kernels.sampling.Block`): ``sum_e w_e f(src)`` estimates the full
            neighbourhood sum.  ``None`` = ``deg_dst / sampled`` per destination (uniform sampling).
        loops: optional float32 [num_src] self-loops of each source node in the full graph (counted
            in ``deg``), for GCN's exactly-one-self-loop normalisation ``d - loops + 1``.  ``None``:
            unknown, degrees keep the data's loops (see :func:`split_self_loops`).
        src_ids: optional int64 [num_src] global node id of every source node (the destinations'
            are ``src_ids[:num_dst]``); the data path sets it on every block it builds (the input
            block's ids select rows of a learnable embedding, :mod:`ooc.embedding`).
        adjacency: the edges as CSR over destinations and sources (:class:`ooc.sparse.Adjacency`),
            built on first use when not given.
    """

    num_src: int
    num_dst: int
    src: Tensor
    dst: Tensor
    deg_src: Tensor
    deg_dst: Tensor
    sampled: Tensor
    edge_weight: Tensor | None = None
    loops: Tensor | None = None
    src_ids: Tensor | None = None
    _adj: Adjacency | None = field(default=None, repr=False, compare=False)

    @property
    def adjacency(self) -> Adjacency:
        """The block's edges for :mod:`ooc.sparse` (built once)."""
        if self._adj is None:
            self._adj = Adjacency(self.src, self.dst, self.num_src, self.num_dst)
        return self._adj

    @staticmethod
    def from_edges(num_src: int, num_dst: int, src: list[int] | Tensor, dst: list[int] | Tensor,
                   deg_src: Tensor | None = None) -> "TorchBlock":
        """Build a block from explicit edges (tests, full-graph use); degrees default to the block's,
        loops are the block's loop edges (every in-edge of a destination is in the block)."""
        src_t = torch.as_tensor(src, dtype=torch.int64)
        dst_t = torch.as_tensor(dst, dtype=torch.int64)
        sampled = torch.bincount(dst_t, minlength=num_dst).float()
        if deg_src is None:  # the block is the whole neighbourhood: degree = sampled count
            deg_src = torch.zeros(num_src)
            deg_src[:num_dst] = sampled
        deg_src = torch.as_tensor(deg_src, dtype=torch.float32)
        loops = torch.zeros(num_src)  # the destinations' loops are all in the block
        is_loop = src_t == dst_t
        loops.index_add_(0, dst_t[is_loop], torch.ones(int(is_loop.sum())))
        return TorchBlock(num_src, num_dst, src_t, dst_t, deg_src, deg_src[:num_dst], sampled,
                          loops=loops)

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "TorchBlock":
        """A copy with every tensor on ``device`` (the same object if already there)."""
        if self.src.device == torch.device(device):
            return self
        w, lp, ids = self.edge_weight, self.loops, self.src_ids
        return TorchBlock(self.num_src, self.num_dst,
                          *(t.to(device, non_blocking=non_blocking) for t in
                            (self.src, self.dst, self.deg_src, self.deg_dst, self.sampled)),
                          None if w is None else w.to(device, non_blocking=non_blocking),
                          None if lp is None else lp.to(device, non_blocking=non_blocking),
                          None if ids is None else ids.to(device, non_blocking=non_blocking))


def to_torch_blocks(sg: SampledSubgraph, degrees: np.ndarray, loops: np.ndarray | None = None,
                    node_ids: np.ndarray | None = None) -> list[TorchBlock]:
    """Convert a :class:`SampledSubgraph` to tensors.

    Args:
        sg: the sample; degrees: int32 or int64 [N] full-graph in-degree, indexed by ``sg.nodes``.
        loops: int [N] self-loops per node (:func:`ooc.kernels.graph.self_loop_counts`; GCN then
            normalises with ``d - loops + 1``); ``None``: degrees keep the data's loops.
        node_ids: int64 global ids of ``sg.nodes`` when those are local ids (a buffer state's
            subgraph); default ``sg.nodes``.  Every block's ``src_ids`` is a prefix view of them.
    """
    out = []
    deg_nodes = torch.from_numpy(np.asarray(degrees)[sg.nodes].astype(np.float32))
    loop_nodes = None if loops is None else torch.from_numpy(loops[sg.nodes].astype(np.float32))
    ids = torch.from_numpy(np.ascontiguousarray(sg.nodes if node_ids is None else node_ids,
                                                dtype=np.int64))
    for b in sg.blocks:
        out.append(_block_tensors(b, deg_nodes, loop_nodes, ids))
    return out


def _block_tensors(b: Block, deg_nodes: Tensor, loop_nodes: Tensor | None, ids: Tensor) -> TorchBlock:
    counts = np.diff(b.indptr)
    dst = np.repeat(np.arange(b.num_dst, dtype=np.int64), counts)
    w = getattr(b, "edge_weight", None)
    src = torch.from_numpy(b.indices.astype(np.int64, copy=False))
    dst_t = torch.from_numpy(dst)
    # the block's CSC is the CSR over destinations; the transpose is built in the backward pass
    # (on the loader thread it would sit in every queued batch: 16 B per edge more)
    adj = Adjacency(src, dst_t, b.num_src, b.num_dst, indptr=b.indptr)
    return TorchBlock(b.num_src, b.num_dst, src, dst_t, deg_nodes[: b.num_src], deg_nodes[: b.num_dst],
                      torch.from_numpy(counts.astype(np.float32)),
                      None if w is None else torch.from_numpy(np.asarray(w, dtype=np.float32)),
                      None if loop_nodes is None else loop_nodes[: b.num_src],
                      ids[: b.num_src], adj)


def split_self_loops(block: TorchBlock) -> tuple[Tensor, Tensor, Tensor]:
    """The block's loop edges and its nodes' self-loops in the full graph.

    A loop edge is ``src == dst`` (local ids: the first ``num_dst`` sources are the destinations).

    Returns:
        ``(keep bool [E], loops_src float [num_src], loops_sampled float [num_dst])``: the edges
        that are not loops; each source node's self-loops in the graph (:attr:`TorchBlock.loops`);
        each destination's loop edges in the block.  Without :attr:`TorchBlock.loops` both counts
        are 0: a node's degree then keeps its loops, the same in every batch (a source node's loops
        are not in the block), so results do not depend on batching; the loop edges themselves are
        still dropped.
    """
    is_loop = block.src == block.dst
    sampled_loops = torch.zeros(block.num_dst, dtype=torch.float32, device=block.src.device)
    if bool(is_loop.any()):
        sampled_loops.index_add_(0, block.dst[is_loop],
                                 torch.ones(int(is_loop.sum()), device=block.src.device))
    if block.loops is not None:
        loops_src = block.loops
    else:  # unknown: degrees keep the data's loops (the same for every batch a node is in)
        loops_src = torch.zeros(block.num_src, dtype=torch.float32, device=block.src.device)
        sampled_loops = torch.zeros_like(sampled_loops)
    return ~is_loop, loops_src, sampled_loops


def _aggregate_sum(block: TorchBlock, msg: Tensor) -> Tensor:
    """Sum edge messages [E, *F] into destinations [num_dst, *F] (0 where a node has no edge);
    deterministic (:func:`ooc.sparse.segment_sum`)."""
    return segment_sum(block.adjacency, msg)


def _sum_scale(block: TorchBlock) -> Tensor:
    """float32 [num_dst, 1]: ``d_v / s_v`` (1 where nothing was sampled), the factor that turns a sum
    over the sampled in-edges into an unbiased estimate of the full-neighbourhood sum."""
    return (block.deg_dst / block.sampled.clamp(min=1)).unsqueeze(1)


def aggregate(block: TorchBlock, x: Tensor, reduce: str = "sum") -> Tensor:
    """Aggregate source features over the block's edges: ``out[v] = REDUCE_{(u, v) in E} x[u]``.

    This is the sparse product ``A x`` (``sum``), the row-normalised ``D^-1 A x`` (``mean``) or an
    element-wise maximum (``max``), with ``A`` the [num_dst, num_src] adjacency of the sampled edges
    (one entry per edge, so parallel edges count twice).  Rows without edges are exactly 0.

    Args:
        block: the MFG; x: float [num_src, F] source features.
        reduce: ``sum``, ``mean`` or ``max``.

    Returns:
        float [num_dst, F].

    Raises:
        ValueError: unknown ``reduce``.
    """
    if reduce in ("sum", "mean"):
        out = spmm(block.adjacency, x)
        if reduce == "mean":
            out = out / block.sampled.clamp(min=1).unsqueeze(1).to(out.dtype)
        return out
    if reduce == "max":
        agg = x.new_zeros((block.num_dst, x.shape[1]))
        if block.num_edges:
            msg = x.index_select(0, block.src)
            idx = block.dst.unsqueeze(1).expand(-1, x.shape[1])
            agg = agg.scatter_reduce(0, idx, msg, reduce="amax", include_self=False)
        return agg
    raise ValueError(f"unknown reduce {reduce!r} (choose sum, mean or max)")


def edge_softmax(dst: Tensor, scores: Tensor, num_dst: int, adj: Adjacency | None = None) -> Tensor:
    """Softmax of edge scores over the in-edges of each destination node.

    ``alpha[e] = exp(s[e]) / sum_{e' : dst[e'] = dst[e]} exp(s[e'])``, computed with the per-node
    maximum subtracted (detached: the result does not depend on it) for stability.  Sums and gathers
    are :mod:`ooc.sparse` operations, so forward and backward are deterministic on CPU.

    Args:
        dst: int64 [E] destination of every edge, in ``[0, num_dst)``.
        scores: float [E, H] one score per edge and head.
        num_dst: number of destination nodes.
        adj: the edges (any sources; only their destinations are used); default built from ``dst``.

    Returns:
        float [E, H]; each destination's weights sum to 1 per head (no entries for nodes without edges).
    """
    if scores.shape[0] == 0:
        return scores
    if adj is None:
        adj = Adjacency(dst, dst, num_dst, num_dst)
    smax = segment_max(adj, scores)
    e = torch.exp(scores - smax.index_select(0, dst))
    return e / gather_dst(adj, segment_sum(adj, e))


class SAGEConv(nn.Module):
    """GraphSAGE layer (Hamilton et al., "Inductive Representation Learning on Large Graphs",
    NeurIPS'17): ``h_v = W_self x_v + W_neigh AGG({x_u : u in S(v)})``.

    Args:
        in_dim, out_dim: feature sizes.
        aggregator: ``mean`` (average of sampled neighbours), ``sum`` (scaled by ``d_v / s_v`` to
            estimate the full-neighbourhood sum) or ``max`` (element-wise max-pool after a
            linear+ReLU, as in the paper's pooling aggregator).

    Shapes:
        x: [num_src, in_dim] float32 -> [num_dst, out_dim]; nodes without sampled neighbours
        aggregate 0 (their output is ``W_self x_v + b``).

    Raises:
        ValueError: unknown aggregator.
    """

    def __init__(self, in_dim: int, out_dim: int, aggregator: str = "mean") -> None:
        super().__init__()
        if aggregator not in ("mean", "sum", "max"):
            raise ValueError(f"unknown SAGE aggregator {aggregator!r} (choose mean, sum or max)")
        self.aggregator = aggregator
        self.lin_self = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_neigh = nn.Linear(in_dim, out_dim, bias=False)
        if aggregator == "max":
            self.pool = nn.Linear(in_dim, in_dim)

    def forward(self, block: TorchBlock, x: Tensor) -> Tensor:
        x_dst = x[: block.num_dst]
        if self.aggregator == "max":
            agg = aggregate(block, torch.relu(self.pool(x)), "max")
            return self.lin_self(x_dst) + self.lin_neigh(agg)
        lin = self.lin_neigh
        if transform_first(block.adjacency, x, lin.in_features, lin.out_features):
            # mean and sum are linear and commute with the bias-free W_neigh: transform first when
            # that is cheaper (ooc.sparse.transform_first; on GPUs: messages out_dim wide, not in_dim)
            return self.lin_self(x_dst) + self._aggregate(block, lin(x))
        return self.lin_self(x_dst) + lin(self._aggregate(block, x))

    @property
    def propagates(self) -> bool:
        """Whether :meth:`propagate` applies: the mean and sum aggregators are parameter-free."""
        return self.aggregator != "max"

    def propagate(self, block: TorchBlock, x: Tensor) -> Tensor:
        """The parameter-free part of the layer, ``AGG(x)`` [num_dst, in_dim] (mean or sum only)."""
        return self._aggregate(block, x)

    def from_propagated(self, x_dst: Tensor, agg: Tensor) -> Tensor:
        """The layer from :meth:`propagate`'s output: ``W_self x_v + W_neigh agg_v``."""
        return self.lin_self(x_dst) + self.lin_neigh(agg)

    def _aggregate(self, block: TorchBlock, x: Tensor) -> Tensor:
        """Mean or (degree-scaled) sum of ``x`` [num_src, F] over the sampled in-edges -> [num_dst, F]."""
        if block.edge_weight is not None:
            # importance-weighted sum estimates the full neighbourhood sum; mean = sum / in-degree
            agg = spmm(block.adjacency, x, block.edge_weight.to(x.dtype))
            if self.aggregator == "mean":
                agg = agg / block.deg_dst.clamp(min=1).unsqueeze(1).to(x.dtype)
        elif self.aggregator == "sum":
            agg = aggregate(block, x, "sum") * _sum_scale(block).to(x.dtype)
        else:
            agg = aggregate(block, x, "mean")
        return agg


class GCNConv(nn.Module):
    """Graph convolution (Kipf & Welling, "Semi-Supervised Classification with Graph Convolutional
    Networks", ICLR'17) on sampled blocks.

    Self-loop convention (documented, one for all of ooc): with ``self_loops=True`` every node has
    exactly one self-loop, whatever the data holds (as PyG's ``add_remaining_self_loops``): loop
    edges in the data are dropped and one is added, ``A' + I`` with ``A'`` the graph without its
    loops, and degrees count it (``d'_v + 1``, ``d'_v = d_v - l_v``, ``l_v`` the node's loops).  With
    ``normalize=True`` the update is

        h_v = W ( x_v / (d'_v + 1) + (d'_v / s'_v) * sum_{u in S'(v)} x_u / sqrt((d'_u + 1)(d'_v + 1)) ) + b

    where ``d`` are full-graph in-degrees and ``S'(v)`` the ``s'_v`` sampled neighbours other than
    ``v``; with all neighbours sampled this is exactly ``D^-1/2 (A'+I) D^-1/2 X W`` (Kipf & Welling's
    ``A + I`` on a loop-free ``A``).  Without self-loops the ``x_v`` term is dropped, loop edges are
    ordinary edges and degrees are ``d`` (clamped to 1).  With ``normalize=False`` messages are
    summed unweighted (the self-loop, if any, adds ``x_v`` once).

    Shapes:
        x: [num_src, in_dim] float32 -> [num_dst, out_dim].
    """

    def __init__(self, in_dim: int, out_dim: int, self_loops: bool = True, normalize: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        self.self_loops = self_loops
        self.normalize = normalize
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None

    propagates = True

    def _edges(self, block: TorchBlock) -> tuple[Adjacency, Tensor | None, Tensor]:
        """The block's edges without the data's loops (with ``self_loops``), their normalised
        weights (None: unweighted) and the destinations' degrees without loops."""
        src, dst, edge_weight, adj = block.src, block.dst, block.edge_weight, block.adjacency
        deg_src, deg_dst, sampled = block.deg_src, block.deg_dst, block.sampled
        if self.self_loops:  # exactly one self-loop per node: the data's loop edges are dropped
            keep, loops_src, loops_sampled = split_self_loops(block)
            if not bool(keep.all()):
                src, dst = src[keep], dst[keep]
                edge_weight = None if edge_weight is None else edge_weight[keep]
                adj = Adjacency(src, dst, block.num_src, block.num_dst)
            deg_src = deg_src - loops_src
            deg_dst = deg_dst - loops_src[: block.num_dst]
            sampled = sampled - loops_sampled
        w = None
        if self.normalize:
            loop = 1.0 if self.self_loops else 0.0
            d_src = (deg_src + loop).clamp(min=1)
            d_dst = (deg_dst + loop).clamp(min=1)
            if edge_weight is None:
                scale = (deg_dst / sampled.clamp(min=1)).index_select(0, dst)
            else:  # importance-sampled edges (LADIES, LABOR, GraphSAINT) carry their own weight
                scale = edge_weight
            w = (d_src.index_select(0, src) * d_dst.index_select(0, dst)).rsqrt() * scale
        return adj, w, deg_dst

    def _propagate_linear(self, block: TorchBlock, h: Tensor) -> Tensor:
        """``(D^-1/2 (A'+I) D^-1/2) h`` over the block (or its unnormalised / loop-free variant)."""
        adj, w, deg_dst = self._edges(block)
        out = spmm(adj, h, None if w is None else w.to(h.dtype))
        if self.self_loops:
            h_dst = h[: block.num_dst]
            if self.normalize:
                out = out + h_dst / (deg_dst + 1).clamp(min=1).unsqueeze(1).to(h.dtype)
            else:
                out = out + h_dst
        return out

    def forward(self, block: TorchBlock, x: Tensor) -> Tensor:
        out = self._propagate_linear(block, self.lin(x))
        if self.bias is not None:
            out = out + self.bias
        return out

    def propagate(self, block: TorchBlock, x: Tensor) -> Tensor:
        """The parameter-free part: the normalised sum of ``x`` [num_src, in_dim] -> [num_dst, in_dim]
        (``W`` commutes with it)."""
        return self._propagate_linear(block, x)

    def from_propagated(self, x_dst: Tensor, agg: Tensor) -> Tensor:
        """The layer from :meth:`propagate`'s output: ``W agg_v + b``."""
        out = self.lin(agg)
        return out + self.bias if self.bias is not None else out


def _per_head_dropout_linear(x: Tensor, w: Tensor, p: float) -> Tensor:
    """``h[:, k] = dropout(x) @ w[k]^T`` with a separate dropout mask for every head ``k``:
    ``x`` [N, D], ``w`` [H, F, D] -> [N, H, F].  Sparse inputs (bag-of-words features: CiteSeer's
    are ~1 % non-zero) only draw masks for their non-zeros (dropping a zero changes nothing), which
    avoids H dense [N, D] copies of the input; dense inputs take one masked matmul per head."""
    H, F, D = w.shape
    nz = x.count_nonzero()
    if int(nz) * F <= x.numel():
        rows, cols = x.nonzero(as_tuple=True)
        vals = nn.functional.dropout(x[rows, cols].unsqueeze(1).expand(-1, H), p)   # [nnz, H]
        msg = vals.unsqueeze(-1) * w.permute(2, 0, 1).index_select(0, cols)        # [nnz, H, F]
        return msg.new_zeros((x.shape[0], H, F)).index_add_(0, rows, msg)
    return torch.stack([nn.functional.linear(nn.functional.dropout(x, p), w[k]) for k in range(H)], 1)


class GATConv(nn.Module):
    """Graph attention layer (Velickovic et al., "Graph Attention Networks", ICLR'18).

    For every head ``k``: ``e_uv = LeakyReLU(a_src . W x_u + a_dst . W x_v)``, ``alpha = softmax``
    of ``e`` over the in-edges of ``v`` (:func:`edge_softmax`; over the sampled ones, plus ``v``
    itself exactly once when ``self_loops``, whatever loops the data holds), dropout on ``alpha`` (the paper's attention dropout), and
    ``h_v = sum_u alpha_uv W x_u``.  Heads are concatenated (hidden layers) or averaged (output layer).

    Args:
        in_dim: input size; out_dim: output size per head.
        heads: number of attention heads ``H``.
        concat: concatenate heads (output ``H * out_dim``) or average them (``out_dim``).
        negative_slope: LeakyReLU slope of the attention scores (0.2 in the paper).
        attn_dropout: dropout probability on the attention weights.
        feat_dropout: dropout probability on the transformed features ``W x`` that are aggregated
            (the values; the attention scores use the undropped ``W x``), as the reference
            TensorFlow code (``layers.attn_head``: ``seq_fts = dropout(seq_fts, in_drop)``).
        head_dropout: dropout probability on the layer input with a separate mask for every head
            (the reference code's ``in_drop``, applied inside each head); 0 leaves the input alone.
        self_loops: every destination also attends to itself (the paper's convention); without, a
            node with no sampled in-edge outputs only the bias.

    Shapes:
        x: [num_src, in_dim] float32 -> [num_dst, H * out_dim] (concat) or [num_dst, out_dim].
    """

    propagates = False  # attention weights depend on the parameters

    def __init__(self, in_dim: int, out_dim: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, attn_dropout: float = 0.0, self_loops: bool = True,
                 bias: bool = True, feat_dropout: float = 0.0, head_dropout: float = 0.0) -> None:
        super().__init__()
        if heads < 1:
            raise ValueError(f"heads must be >= 1, got {heads}")
        self.feat_dropout = Dropout(feat_dropout)
        self.head_dropout = head_dropout
        self.heads, self.out_dim, self.concat = heads, out_dim, concat
        self.self_loops = self_loops
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_dim))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_dim))
        self.leaky = nn.LeakyReLU(negative_slope)
        self.attn_dropout = Dropout(attn_dropout)
        width = heads * out_dim if concat else out_dim
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)

    def forward(self, block: TorchBlock, x: Tensor) -> Tensor:
        n_dst, H, F = block.num_dst, self.heads, self.out_dim
        if self.training and self.head_dropout > 0:
            h = _per_head_dropout_linear(x, self.lin.weight.view(H, F, -1), self.head_dropout)
        else:
            h = self.lin(x).view(-1, H, F)                    # [num_src, H, F]
        a_src = (h * self.att_src).sum(-1)                     # [num_src, H]
        a_dst = (h[:n_dst] * self.att_dst).sum(-1)             # [num_dst, H]
        src, dst = block.src, block.dst
        adj = block.adjacency
        if self.self_loops:  # exactly one attention slot on itself: the data's loop edges dropped
            keep = src != dst
            if not bool(keep.all()):
                src, dst = src[keep], dst[keep]
            loop = torch.arange(n_dst, dtype=src.dtype, device=src.device)
            src, dst = torch.cat([src, loop]), torch.cat([dst, loop])
            adj = Adjacency(src, dst, block.num_src, n_dst)
        e = self.leaky(gather_src(adj, a_src) + gather_dst(adj, a_dst))  # [E, H]
        alpha = self.attn_dropout(edge_softmax(dst, e, n_dst, adj))
        out = spmm(adj, self.feat_dropout(h), alpha)  # sum_e alpha[e, k] W x_src(e), per head k
        out = out.reshape(n_dst, H * F) if self.concat else out.mean(1)
        if self.bias is not None:
            out = out + self.bias
        return out


class GINConv(nn.Module):
    """Graph isomorphism layer (Xu et al., "How Powerful are Graph Neural Networks?", ICLR'19):
    ``h_v = MLP((1 + eps) x_v + sum_{u in N(v)} x_u)`` with a learnable ``eps`` (GIN-eps).

    The neighbour sum is estimated from the sample (scaled by ``d_v / s_v``; exact with all
    neighbours).  The MLP is ``Linear -> ReLU -> Linear``.

    Args:
        in_dim, out_dim: feature sizes; hidden: MLP width (default ``out_dim``).
        eps: initial epsilon; train_eps: learn it (GIN-eps) or keep it fixed (GIN-0 with ``eps=0``).

    Shapes:
        x: [num_src, in_dim] float32 -> [num_dst, out_dim].
    """

    def __init__(self, in_dim: int, out_dim: int, hidden: int | None = None, eps: float = 0.0,
                 train_eps: bool = True) -> None:
        super().__init__()
        hidden = hidden or out_dim
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))
        if train_eps:
            self.eps = nn.Parameter(torch.tensor([float(eps)]))
        else:
            self.register_buffer("eps", torch.tensor([float(eps)]))

    def forward(self, block: TorchBlock, x: Tensor) -> Tensor:
        first = self.mlp[0]
        if transform_first(block.adjacency, x, first.in_features, first.out_features):
            # the MLP's first Linear commutes with the (linear) neighbour sum: apply it first when
            # that is cheaper (ooc.sparse.transform_first; same function)
            h = nn.functional.linear(x, first.weight)
            agg = aggregate(block, h, "sum") * _sum_scale(block).to(h.dtype)
            z = (1 + self.eps) * h[: block.num_dst] + agg + first.bias
            return self.mlp[2](self.mlp[1](z))
        return self.from_propagated(x[: block.num_dst], self.propagate(block, x))

    propagates = True

    def propagate(self, block: TorchBlock, x: Tensor) -> Tensor:
        """The parameter-free part: the (degree-scaled) neighbour sum [num_dst, in_dim]."""
        return aggregate(block, x, "sum") * _sum_scale(block).to(x.dtype)

    def from_propagated(self, x_dst: Tensor, agg: Tensor) -> Tensor:
        """The layer from :meth:`propagate`'s output: ``MLP((1 + eps) x_v + agg_v)``."""
        return self.mlp((1 + self.eps) * x_dst + agg)


MODELS = ("sage", "gcn", "gat", "gin")


def needs_loop_counts(name: str) -> bool:
    """Whether model ``name`` reads :attr:`TorchBlock.loops` (each node's self-loops in the full
    graph): GCN's exactly-one-self-loop normalisation does, and a user's ``MODULE:CLASS`` may; SAGE,
    GAT (which only drops the loop edges of its block) and GIN do not, and their runs keep no
    4-byte-per-node loop counts."""
    return name == "gcn" or ":" in name


def takes_half(model: nn.Module) -> bool:
    """Whether ``model`` (or the module a DDP wrapper trains) accepts float16 input rows as stored
    (a :class:`GNN` converts them with its first dropout): tasks then pass the rows unconverted."""
    return bool(getattr(getattr(model, "module", model), "takes_half", False))


class GNN(nn.Module):
    """A stack of message-passing layers: per layer ``dropout -> conv [+ residual] -> norm -> act``
    (no norm or activation after the last layer).

    Args:
        model: ``sage``, ``gcn``, ``gat`` or ``gin``.
        in_dim, hidden, out_dim: feature sizes; ``num_layers`` layers in total.  For ``gat``,
            ``hidden`` is the concatenated width (``heads`` heads of ``hidden // heads``) and the last
            layer averages ``out_heads`` heads.
        dropout: dropout probability on every layer's input.
        aggregator: SAGE aggregator (``mean``, ``sum``, ``max``).
        heads, out_heads, attn_dropout: GAT options.
        feat_dropout: GAT dropout on the aggregated ``W x`` (see :class:`GATConv`), every layer.
        dropout_per_head: GAT: draw the input-dropout mask (``dropout``) separately for every head
            inside :class:`GATConv` (the reference code) instead of once for the layer input.
        residual: add ``x_v`` (or a linear projection of it when sizes differ) to each layer's output.
        norm: ``none``, ``batch`` (BatchNorm1d) or ``layer`` (LayerNorm) after hidden layers.
        activation: ``relu`` or ``elu`` (the GAT paper's).
        gin_eps: initial epsilon of GIN layers; gin_train_eps: learn it.  Every GIN layer's MLP is
            ``hidden`` wide (``Linear(dims[i], hidden) -> ReLU -> Linear(hidden, dims[i+1])``).
        init: ``torch`` (``nn.Linear``'s default, kaiming-uniform with a = sqrt(5), as PyG) or
            ``glorot``: every linear map of the SAGE, GCN and GIN layers Glorot-uniform with the ReLU
            gain (Glorot & Bengio, AISTATS'10), biases 0, as DGL's ``SAGEConv``.  GAT layers are
            Glorot either way.

    Shapes:
        forward(blocks, x): ``x`` [blocks[0].num_src, in_dim] -> [blocks[-1].num_dst, out_dim];
        ``x`` float32, or float16 rows as stored (converted in the first layer: :attr:`takes_half`).

    Raises:
        ValueError: unknown model, aggregator or norm; ``hidden`` not divisible by ``heads``.
    """

    takes_half = True  # forward() converts float16 rows itself (see takes_half())

    def __init__(self, model: str, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                 dropout: float = 0.5, aggregator: str = "mean", heads: int = 1, out_heads: int = 1,
                 attn_dropout: float = 0.0, residual: bool = False, norm: str = "none",
                 activation: str = "relu", gin_eps: float = 0.0, gin_train_eps: bool = True,
                 feat_dropout: float = 0.0, dropout_per_head: bool = False, init: str = "torch") -> None:
        super().__init__()
        if init not in ("torch", "glorot"):
            raise ValueError(f"unknown init {init!r} (choose torch or glorot)")
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r} (choose {', '.join(MODELS)})")
        if norm not in ("none", "batch", "layer"):
            raise ValueError(f"unknown norm {norm!r} (choose none, batch or layer)")
        if activation not in ("relu", "elu"):
            raise ValueError(f"unknown activation {activation!r} (choose relu or elu)")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if model == "gat" and hidden % heads:
            raise ValueError(f"gat: hidden {hidden} is not divisible by heads {heads}")
        self.model_name = model
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.dims = dims
        layers: list[nn.Module] = []
        for i in range(num_layers):
            last = i == num_layers - 1
            if model == "sage":
                layers.append(SAGEConv(dims[i], dims[i + 1], aggregator))
            elif model == "gcn":
                layers.append(GCNConv(dims[i], dims[i + 1]))
            elif model == "gat":
                gat = dict(attn_dropout=attn_dropout, feat_dropout=feat_dropout,
                           head_dropout=dropout if dropout_per_head else 0.0)
                if last:
                    layers.append(GATConv(dims[i], dims[i + 1], out_heads, concat=False, **gat))
                else:
                    layers.append(GATConv(dims[i], dims[i + 1] // heads, heads, concat=True, **gat))
            else:
                # the MLP is `hidden` wide in every layer (Xu et al.), also in the output layer,
                # whose MLP would otherwise squeeze through `out_dim` (the class count) units
                layers.append(GINConv(dims[i], dims[i + 1], hidden=hidden, eps=gin_eps,
                                      train_eps=gin_train_eps))
        self.layers = nn.ModuleList(layers)
        if init == "glorot" and model != "gat":
            gain = nn.init.calculate_gain("relu")
            for m in self.layers.modules():
                if isinstance(m, nn.Linear):
                    nn.init.xavier_uniform_(m.weight, gain=gain)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
        self.residuals = nn.ModuleList(
            [(nn.Identity() if dims[i] == dims[i + 1] else nn.Linear(dims[i], dims[i + 1], bias=False))
             if residual else nn.Identity() for i in range(num_layers)])
        self.residual = residual
        self.norms = nn.ModuleList(
            [nn.BatchNorm1d(dims[i + 1]) if norm == "batch" else
             nn.LayerNorm(dims[i + 1]) if norm == "layer" else nn.Identity()
             for i in range(num_layers - 1)])
        # with dropout_per_head the GAT layers drop their input themselves (one mask per head)
        self.dropout = Dropout(0.0 if model == "gat" and dropout_per_head else dropout)
        self.act = torch.relu if activation == "relu" else nn.functional.elu

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_forward(self, i: int, block: TorchBlock, h: Tensor) -> Tensor:
        """Layer ``i`` alone (dropout, conv, residual, norm, activation): ``h`` [num_src, dims[i]]
        -> [num_dst, dims[i+1]] (float16 ``h`` is converted to float32 with the dropout, see
        :meth:`Dropout.forward_float`).  :func:`ooc.inference.layerwise_inference` calls this for
        every node of the graph, layer by layer."""
        h_in = self.dropout.forward_float(h) if h.dtype == torch.float16 else self.dropout(h)
        out = self.layers[i](block, h_in)
        if self.residual:
            out = out + self.residuals[i](h_in[: block.num_dst])
        if i < len(self.layers) - 1:
            out = self.act(self.norms[i](out))
        return out

    def propagates(self, i: int) -> bool:
        """Whether layer ``i`` factors into a parameter-free propagation over its block
        (:meth:`layer_propagate`) and a per-node function of it (:meth:`layer_from_propagated`):
        SAGE with the mean or sum aggregator, GCN and GIN do (their aggregation is linear and comes
        before, or commutes with, every parameter, as SGC's and SIGN's precomputed features use);
        GAT and SAGE-max do not.  The output of layer 0 then depends on the weights only through
        the propagated features, which layer-wise inference computes once for a fixed set of
        targets and reuses."""
        return bool(self.layers[i].propagates)

    def layer_propagate(self, i: int, block: TorchBlock, h: Tensor) -> Tensor:
        """The parameter-free part of layer ``i`` in eval mode: ``h`` [num_src, dims[i]] (float32,
        or float16 as stored) -> float32 [num_dst, dims[i]].

        Raises:
            ValueError: the layer does not factor (:meth:`propagates`), or the model is training
                (its input dropout would come before the propagation)."""
        if not self.propagates(i) or self.training:
            raise ValueError(f"layer {i} ({type(self.layers[i]).__name__}) cannot be split into a "
                             "propagation and a per-node function" + (" while training" if self.training else ""))
        return self.layers[i].propagate(block, h.float())

    def layer_from_propagated(self, i: int, h_dst: Tensor, agg: Tensor) -> Tensor:
        """Layer ``i`` in eval mode from :meth:`layer_propagate`'s output: ``h_dst`` [num_dst,
        dims[i]] the destinations' own inputs, ``agg`` [num_dst, dims[i]] -> [num_dst, dims[i+1]];
        equal to :meth:`layer_forward` up to float rounding."""
        h_in = h_dst.float()
        out = self.layers[i].from_propagated(h_in, agg)
        if self.residual:
            out = out + self.residuals[i](h_in)
        if i < len(self.layers) - 1:
            out = self.act(self.norms[i](out))
        return out

    def forward(self, blocks: list[TorchBlock], x: Tensor) -> Tensor:
        if len(blocks) != len(self.layers):
            raise ValueError(f"{len(blocks)} blocks for {len(self.layers)} layers")
        h = x
        for i, block in enumerate(blocks):
            h = self.layer_forward(i, block, h)
        return h


def build_model(name: str, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                dropout: float, **options: object) -> GNN:
    """Factory used by the trainer and the CLI; ``options`` are :class:`GNN` keyword options."""
    return GNN(name, in_dim, hidden, out_dim, num_layers, dropout, **options)  # type: ignore[arg-type]
