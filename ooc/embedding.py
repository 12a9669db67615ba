"""Learnable node embeddings as the model's input (``--embedding D``, config ``model.embedding``).

A graph without node features (no ``nodes/features``; e.g. a social graph given as an edge list)
can still be learnt from its structure: every node gets a trainable row of a table ``E`` [N, D]
float32, and the model's input for the source nodes of a batch's input block is

    h = concat(x, E[src_ids])                    [num_src, F + D]

where ``x`` [num_src, F] are the stored feature rows (``F = 0`` without features: the embedding is
the whole input) and ``src_ids`` the global node ids of the input block's sources, which the data
path puts on every block (:attr:`ooc.models.TorchBlock.src_ids`).  With features the embedding is
concatenated to them (a free per-node correction on top of the features).

The table is a parameter of the model (:class:`NodeEmbeddingInput` wraps any ooc model: a built-in
:class:`~ooc.models.GNN` or a user's module), so the optimiser trains it, checkpoints hold it, a
resumed run restores it bit for bit, and DDP all-reduces its gradient.  Rows are gathered with
``index_select`` (its backward is ``index_add_``, deterministic on CPU).  The gradient is dense: a
step touches all N x D entries (weight decay and Adam's moments move every row), so a step costs
O(N D) besides the batch.

Memory (:func:`embedding_bytes`): weights, gradient and the optimiser's state, ``4 N D`` bytes each
-- ``16 N D`` bytes with Adam/AdamW (two moment estimates), ``12 N D`` with SGD (momentum).  On a
CUDA device the table lives in device memory; on CPU it is host memory of every rank (each holds a
replica) and the memory budget counts it (:func:`ooc.data.budget.plan_budget`, ``embedding``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ooc.models import TorchBlock

__all__ = ["NodeEmbeddingInput", "embedding_bytes", "OPTIMIZER_STATES"]

#: float32 tensors of the table's size an optimiser keeps per parameter (Adam: two moments).
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1}


def embedding_bytes(num_nodes: int, dim: int, optimizer: str = "adam") -> int:
    """Bytes a trainable ``num_nodes x dim`` float32 table takes while training: weights, gradient
    and ``OPTIMIZER_STATES[optimizer]`` state tensors, ``4 * num_nodes * dim`` bytes each.

    Raises:
        ValueError: unknown optimiser.
    """
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r} (choose {', '.join(OPTIMIZER_STATES)})")
    return 4 * int(num_nodes) * int(dim) * (2 + OPTIMIZER_STATES[optimizer])


class NodeEmbeddingInput(nn.Module):
    """A model whose input rows are extended by a learnable embedding of every node.

    Args:
        model: the wrapped model, built with input width ``feat_dim + dim``; it is called as
            ``model(blocks, h)`` (and ``model.layer_forward(0, block, h)`` when it has one).
        num_nodes: N, rows of the table; dim: D, its width.
        feat_dim: F, width of the stored feature rows (0 for a dataset without features).

    Attributes:
        embedding: ``nn.Embedding(N, D)``, initialised N(0, 1) as torch does; model: the wrapped
            model; dims: ``[F] + model.dims[1:]`` when the wrapped model has ``dims``.

    Shapes:
        forward(blocks, x): ``x`` [blocks[0].num_src, F] float32 -> the wrapped model's output
        [blocks[-1].num_dst, out_dim].

    Raises (forward / layer_forward):
        ValueError: the input block carries no ``src_ids``, or ``x`` is not ``F`` wide.
    """

    def __init__(self, model: nn.Module, num_nodes: int, dim: int, feat_dim: int) -> None:
        super().__init__()
        if dim < 1 or num_nodes < 1:
            raise ValueError(f"a node embedding needs N >= 1 and D >= 1, got {num_nodes} x {dim}")
        self.embedding = nn.Embedding(int(num_nodes), int(dim))
        self.model = model
        self.feat_dim = int(feat_dim)
        inner = getattr(model, "dims", None)
        if inner is not None:
            self.dims = [self.feat_dim] + list(inner)[1:]

    @property
    def num_layers(self) -> int:
        return int(self.model.num_layers)

    @property
    def layers(self) -> nn.ModuleList:
        """The wrapped model's layers (``weight_decay_scope: first`` decays ``layers[0]``)."""
        return self.model.layers

    def inputs(self, block: TorchBlock, x: Tensor) -> Tensor:
        """``concat(x, E[block.src_ids])``: [num_src, F] -> [num_src, F + D] float32."""
        if block.src_ids is None:
            raise ValueError("node embeddings need the global ids of the input block's sources "
                             "(TorchBlock.src_ids); build blocks with ooc.models.to_torch_blocks")
        if x.shape[1] != self.feat_dim:
            raise ValueError(f"input rows are {x.shape[1]} wide, the model expects {self.feat_dim} "
                             "feature columns before the embedding")
        e = self.embedding.weight.index_select(0, block.src_ids)
        return e if self.feat_dim == 0 else torch.cat([x.to(e.dtype), e], 1)

    def layer_forward(self, i: int, block: TorchBlock, h: Tensor) -> Tensor:
        """Layer ``i`` of the wrapped model alone; layer 0 first extends ``h`` by the embedding."""
        return self.model.layer_forward(i, block, self.inputs(block, h) if i == 0 else h)

    def forward(self, blocks: list[TorchBlock], x: Tensor) -> Tensor:
        return self.model(blocks, self.inputs(blocks[0], x))
