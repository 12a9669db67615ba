"""PyTorch Geometric layers on ooc's out-of-core batches (``pip install 'ooc-gnn[pyg]'``).

ooc's batches come from the one data path (partition buffer, feature tiers, samplers) as
message-flow graphs, :class:`ooc.models.TorchBlock` per layer, input layer first.  PyG's layers
take the same thing in PyG's bipartite message-passing convention -- the one of PyG's
``NeighborSampler`` examples:

- ``edge_index`` int64 [2, E]: ``edge_index[0]`` the local id of each edge's source among the
  block's ``num_src`` source nodes, ``edge_index[1]`` the local id of its destination among the
  ``num_dst`` destinations;
- ``size = (num_src, num_dst)``; the destinations are the first ``num_dst`` sources, so a layer
  is called as ``conv((x, x[:num_dst]), edge_index, size=size)`` and returns [num_dst, F_out];
- the rows ``x`` [num_src of the input block, F] are the input rows in ``n_id`` order (global node
  ids), and the labels ``y`` [batch_size] belong to the first ``batch_size`` rows of the output.

Nothing here imports ``torch_geometric``: :func:`pyg_adjs` and :func:`to_pyg` are tensor
conversions (no copy of the edges but the stacking), and :class:`PygStack` runs any PyG
convolutions you pass it.  Two ways to use them:

1. Your own loop over ooc's batches (``examples/pyg_sage.py``)::

       task = NodeTask(cfg, Dataset(path))
       for epoch in range(epochs):
           for batch in task.batches(task.plan(epoch), epoch, 0):
               pb = to_pyg(batch, device)
               out = model.forward_pyg(pb.x, pb.adjs)           # or any PyG-style forward
               loss = F.cross_entropy(out, pb.y)

2. ``ooc train --model MODULE:CLASS`` (:mod:`ooc.interop.custom`) with a :class:`PygStack`
   subclass: ``forward(blocks, x)`` is ooc's model signature and ``layer_forward`` makes
   ``--eval-mode layerwise``, ``ooc eval`` and ``ooc predict`` work.

Sampling weights: ``edge_weight`` is ooc's importance weight of every edge (LADIES, LABOR,
GraphSAINT; ``None`` for uniform sampling); pass it to layers that take one (``GCNConv``,
``GraphConv``) or ignore it.  PyG's mean aggregation over the sampled in-edges is what ooc's SAGE
computes; PyG's ``GCNConv`` normalises by the degrees of the sampled block, not ooc's full-graph
convention (:class:`ooc.models.GCNConv`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor, nn

from ooc.contracts import Batch
from ooc.models import Dropout, TorchBlock

__all__ = ["PygAdj", "PygBatch", "pyg_adjs", "to_pyg", "PygStack"]


class PygAdj(NamedTuple):
    """One block in PyG's convention (the ``(edge_index, e_id, size)`` tuples of PyG's
    ``NeighborSampler``, with ooc's edge weight in place of edge ids).

    Attributes:
        edge_index: int64 [2, E]; row 0 source local ids in ``[0, num_src)``, row 1 destination
            local ids in ``[0, num_dst)``.
        size: ``(num_src, num_dst)``.
        edge_weight: float32 [E] importance weights, or None (uniform sampling).
    """

    edge_index: Tensor
    size: tuple[int, int]
    edge_weight: Tensor | None


@dataclass
class PygBatch:
    """One ooc batch in PyG's form (:func:`to_pyg`).

    Attributes:
        x: float32 [num_input, F] input rows (the input block's sources), on the device.
        adjs: one :class:`PygAdj` per layer, input layer first.
        y: int64 [batch_size] labels of the seeds ([batch_size, C] multi-label); link batches: 0.
        n_id: int64 [num_input] global node ids of the rows of ``x`` (the seeds first).
        batch_size: number of seeds, the rows of the last layer's output.
        loss_weight: float32 [batch_size] per-seed loss weights (GraphSAINT) or None.
    """

    x: Tensor
    adjs: list[PygAdj]
    y: Tensor
    n_id: Tensor | None
    batch_size: int
    loss_weight: Tensor | None = None


def pyg_adjs(blocks: Sequence[TorchBlock]) -> list[PygAdj]:
    """ooc's blocks as PyG ``(edge_index, size, edge_weight)`` triples, input layer first.

    Args:
        blocks: :class:`ooc.models.TorchBlock` list (``Batch.blocks``, or what ooc passes a model's
            ``forward``); tensors stay on their device.

    Returns:
        ``[PygAdj(edge_index int64 [2, E_i], (num_src_i, num_dst_i), edge_weight or None)]``.
    """
    return [PygAdj(torch.stack([b.src, b.dst]), (int(b.num_src), int(b.num_dst)), b.edge_weight)
            for b in blocks]


def to_pyg(batch: Batch, device: torch.device | str = "cpu") -> PygBatch:
    """An ooc :class:`~ooc.contracts.Batch` (from ``task.batches`` / ``DataPath``) in PyG's form,
    on ``device``: float32 input rows (converted from the storage dtype after the copy, device-cache
    rows assembled, as :meth:`Batch.inputs` does), one :class:`PygAdj` per layer, labels, and the
    global ids of the input rows."""
    device = torch.device(device)
    blocks, x = batch.inputs(device)
    nb = device.type == "cuda"
    lw = batch.loss_weight
    return PygBatch(x, pyg_adjs(blocks), batch.y.to(device, non_blocking=nb), blocks[0].src_ids,
                    int(blocks[-1].num_dst), None if lw is None else lw.to(device, non_blocking=nb))


class PygStack(nn.Module):
    """PyG convolutions as an ooc model: per layer ``dropout -> conv -> activation`` (no
    activation after the last).

    Args:
        convs: one ``torch_geometric.nn`` convolution per layer (e.g. ``SAGEConv(dims[i],
            dims[i + 1])``).
        dims: the ``len(convs) + 1`` widths: input, hidden..., output.
        dropout: dropout probability on every layer's input (:class:`ooc.models.Dropout`).
        activation: applied after every layer but the last.
        bipartite: call layers as ``conv((x, x[:num_dst]), edge_index, size=size)`` (SAGEConv,
            GATConv, GraphConv, GINConv...); False for layers that take one node set only
            (``GCNConv``): ``conv(x, edge_index)[:num_dst]`` over the ``num_src`` sources, whose
            first ``num_dst`` are the destinations.
        edge_weight: pass the block's edge weight (when it has one) as ``edge_weight=``.

    Shapes:
        forward(blocks, x): ``x`` [blocks[0].num_src, dims[0]] -> [blocks[-1].num_dst, dims[-1]];
        forward_pyg(x, adjs): the same with :func:`pyg_adjs`' triples;
        layer_forward(i, block, h): [num_src, dims[i]] -> [num_dst, dims[i + 1]].

    Raises:
        ValueError: ``dims`` does not have ``len(convs) + 1`` entries; forward with another number of
            blocks than layers.
    """

    def __init__(self, convs: Sequence[nn.Module], dims: Sequence[int], dropout: float = 0.5,
                 activation: Callable[[Tensor], Tensor] = torch.relu, bipartite: bool = True,
                 edge_weight: bool = False) -> None:
        super().__init__()
        if len(dims) != len(convs) + 1:
            raise ValueError(f"{len(convs)} layers need {len(convs) + 1} dims, got {list(dims)}")
        self.convs = nn.ModuleList(convs)
        self.dims = [int(d) for d in dims]
        self.dropout = Dropout(dropout)
        self.activation = activation
        self.bipartite = bipartite
        self.use_edge_weight = edge_weight

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def _layer(self, i: int, adj: PygAdj, h: Tensor) -> Tensor:
        h = self.dropout(h)
        kw = {"edge_weight": adj.edge_weight} if self.use_edge_weight and adj.edge_weight is not None \
            else {}
        n_dst = adj.size[1]
        if self.bipartite:
            out = self.convs[i]((h, h[:n_dst]), adj.edge_index, size=adj.size, **kw)
        else:
            out = self.convs[i](h, adj.edge_index, **kw)[:n_dst]
        return self.activation(out) if i < len(self.convs) - 1 else out

    def forward_pyg(self, x: Tensor, adjs: Sequence[PygAdj]) -> Tensor:
        """The forward pass in PyG's convention (``adjs`` input layer first)."""
        if len(adjs) != len(self.convs):
            raise ValueError(f"{len(adjs)} blocks for {len(self.convs)} layers")
        for i, adj in enumerate(adjs):
            x = self._layer(i, adj, x)
        return x

    def layer_forward(self, i: int, block: TorchBlock, h: Tensor) -> Tensor:
        """Layer ``i`` alone (layer-wise inference calls it for every node)."""
        return self._layer(i, pyg_adjs([block])[0], h)

    def forward(self, blocks: list[TorchBlock], x: Tensor) -> Tensor:
        return self.forward_pyg(x, pyg_adjs(blocks))
