"""GNN layers in plain PyTorch, operating on sampled message-flow graphs (MFGs).

A layer maps source-node features to destination-node features of one block:
``x: [num_src, F_in] -> [num_dst, F_out]``, float32; the destination nodes are the first ``num_dst``
source nodes.  Nodes without sampled in-edges aggregate exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from ooc.kernels.sampling import Block, SampledSubgraph

__all__ = ["TorchBlock", "to_torch_blocks", "SAGEConv", "GCNConv", "GNN", "build_model"]


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
    """

    num_src: int
    num_dst: int
    src: Tensor
    dst: Tensor
    deg_src: Tensor
    deg_dst: Tensor
    sampled: Tensor
    edge_weight: Tensor | None = None

    @staticmethod
    def from_edges(num_src: int, num_dst: int, src: list[int] | Tensor, dst: list[int] | Tensor,
                   deg_src: Tensor | None = None) -> "TorchBlock":
        """Build a block from explicit edges (tests, full-graph use); degrees default to the block's."""
        src_t = torch.as_tensor(src, dtype=torch.int64)
        dst_t = torch.as_tensor(dst, dtype=torch.int64)
        sampled = torch.bincount(dst_t, minlength=num_dst).float()
        if deg_src is None:  # the block is the whole neighbourhood: degree = sampled count
            deg_src = torch.zeros(num_src)
            deg_src[:num_dst] = sampled
        deg_src = torch.as_tensor(deg_src, dtype=torch.float32)
        return TorchBlock(num_src, num_dst, src_t, dst_t, deg_src, deg_src[:num_dst], sampled)


def to_torch_blocks(sg: SampledSubgraph, degrees: np.ndarray) -> list[TorchBlock]:
    """Convert a :class:`SampledSubgraph` to tensors; ``degrees`` is int64 [N] full-graph in-degree."""
    out = []
    deg_nodes = torch.from_numpy(degrees[sg.nodes].astype(np.float32))
    for b in sg.blocks:
        out.append(_block_tensors(b, deg_nodes))
    return out


def _block_tensors(b: Block, deg_nodes: Tensor) -> TorchBlock:
    counts = np.diff(b.indptr)
    dst = np.repeat(np.arange(b.num_dst, dtype=np.int64), counts)
    w = getattr(b, "edge_weight", None)
    return TorchBlock(b.num_src, b.num_dst, torch.from_numpy(b.indices.astype(np.int64, copy=False)),
                      torch.from_numpy(dst), deg_nodes[: b.num_src], deg_nodes[: b.num_dst],
                      torch.from_numpy(counts.astype(np.float32)),
                      None if w is None else torch.from_numpy(np.asarray(w, dtype=np.float32)))


def _aggregate_sum(block: TorchBlock, msg: Tensor) -> Tensor:
    """Sum edge messages [E, F] into destinations [num_dst, F] (0 where a node has no edge).

    Gathers use ``index_select`` and sums ``index_add_``: both are deterministic on CPU, forward and
    backward (plain ``h[idx]`` back-propagates through a parallel atomic ``index_put_``), which keeps
    runs bit-identical whatever the buffer size or thread timing.
    """
    out = msg.new_zeros((block.num_dst, msg.shape[1]))
    if msg.shape[0]:
        out.index_add_(0, block.dst, msg)
    return out


class SAGEConv(nn.Module):
    """GraphSAGE layer (Hamilton et al., NeurIPS'17): ``W_self x_v + W_neigh AGG({x_u})``.

    Args:
        in_dim, out_dim: feature sizes.
        aggregator: ``mean`` (average of sampled neighbours), ``sum`` or ``max`` (element-wise
            max-pool after a linear+ReLU, as in the paper's pooling aggregator).

    Shapes:
        x: [num_src, in_dim] -> [num_dst, out_dim]; nodes without sampled neighbours aggregate 0.
    """

    def __init__(self, in_dim: int, out_dim: int, aggregator: str = "mean") -> None:
        super().__init__()
        if aggregator not in ("mean", "sum", "max"):
            raise ValueError(f"unknown SAGE aggregator {aggregator!r}")
        self.aggregator = aggregator
        self.lin_self = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_neigh = nn.Linear(in_dim, out_dim, bias=False)
        if aggregator == "max":
            self.pool = nn.Linear(in_dim, in_dim)

    def forward(self, block: TorchBlock, x: Tensor) -> Tensor:
        x_dst = x[: block.num_dst]
        if self.aggregator == "max":
            h = torch.relu(self.pool(x))
            msg = h.index_select(0, block.src)
            agg = h.new_zeros((block.num_dst, h.shape[1]))
            if msg.shape[0]:
                idx = block.dst.unsqueeze(1).expand(-1, h.shape[1])
                agg = agg.scatter_reduce(0, idx, msg, reduce="amax", include_self=False)
        elif block.edge_weight is not None:
            # importance-weighted sum estimates the full neighbourhood sum; mean = sum / in-degree
            agg = _aggregate_sum(block, x.index_select(0, block.src) * block.edge_weight.unsqueeze(1))
            if self.aggregator == "mean":
                agg = agg / block.deg_dst.clamp(min=1).unsqueeze(1)
        else:
            agg = _aggregate_sum(block, x.index_select(0, block.src))
            if self.aggregator == "mean":
                agg = agg / block.sampled.clamp(min=1).unsqueeze(1)
        return self.lin_self(x_dst) + self.lin_neigh(agg)


class GCNConv(nn.Module):
    """Graph convolution (Kipf & Welling, ICLR'17) on sampled blocks.

    Self-loop convention (documented, one for all of ooc): with ``self_loops=True`` every node gets one
    self-loop, ``A + I``, and degrees count it (``d + 1``).  With ``normalize=True`` the update is

        h_v = W ( x_v / (d_v + 1) + (d_v / s_v) * sum_{u in S(v)} x_u / sqrt((d_u + 1)(d_v + 1)) ) + b

    where ``d`` are full-graph in-degrees and ``S(v)`` the ``s_v`` sampled neighbours; with all
    neighbours sampled this is exactly ``D^-1/2 (A+I) D^-1/2 X W``.  Without self-loops the ``x_v``
    term is dropped and degrees are ``d`` (clamped to 1).  With ``normalize=False`` messages are summed
    unweighted (the self-loop, if any, adds ``x_v``).

    Shapes:
        x: [num_src, in_dim] -> [num_dst, out_dim].
    """

    def __init__(self, in_dim: int, out_dim: int, self_loops: bool = True, normalize: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        self.self_loops = self_loops
        self.normalize = normalize
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None

    def forward(self, block: TorchBlock, x: Tensor) -> Tensor:
        h = self.lin(x)
        msg = h.index_select(0, block.src)
        if self.normalize:
            loop = 1.0 if self.self_loops else 0.0
            d_src = (block.deg_src + loop).clamp(min=1)
            d_dst = (block.deg_dst + loop).clamp(min=1)
            if block.edge_weight is None:
                scale = (block.deg_dst / block.sampled.clamp(min=1))[block.dst]
            else:
                scale = block.edge_weight
            w = (d_src[block.src] * d_dst[block.dst]).rsqrt() * scale
            msg = msg * w.unsqueeze(1)
        out = _aggregate_sum(block, msg)
        if self.self_loops:
            h_dst = h[: block.num_dst]
            if self.normalize:
                out = out + h_dst / (block.deg_dst + 1).unsqueeze(1)
            else:
                out = out + h_dst
        if self.bias is not None:
            out = out + self.bias
        return out


class GNN(nn.Module):
    """A stack of message-passing layers with ReLU and dropout between them.

    Args:
        model: ``sage`` or ``gcn``.
        in_dim, hidden, out_dim: feature sizes; ``num_layers`` layers in total.
        dropout: dropout probability on every layer's input.

    Shapes:
        forward(blocks, x): ``x`` [blocks[0].num_src, in_dim] -> [blocks[-1].num_dst, out_dim] logits.
    """

    def __init__(self, model: str, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                 dropout: float = 0.5, aggregator: str = "mean") -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        layers: list[nn.Module] = []
        for i in range(num_layers):
            if model == "sage":
                layers.append(SAGEConv(dims[i], dims[i + 1], aggregator))
            elif model == "gcn":
                layers.append(GCNConv(dims[i], dims[i + 1]))
            else:
                raise ValueError(f"unknown model {model!r} (choose sage or gcn)")
        self.layers = nn.ModuleList(layers)
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: list[TorchBlock], x: Tensor) -> Tensor:
        if len(blocks) != len(self.layers):
            raise ValueError(f"{len(blocks)} blocks for {len(self.layers)} layers")
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, self.dropout(h))
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h


def build_model(name: str, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                dropout: float) -> GNN:
    """Factory used by the trainer and the CLI."""
    return GNN(name, in_dim, hidden, out_dim, num_layers, dropout)
