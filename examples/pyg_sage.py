"""Train ``torch_geometric.nn.SAGEConv`` layers on ooc's out-of-core batches.

    pip install 'ooc-gnn[pyg]'
    python examples/pyg_sage.py data/cora --epochs 100          # ... prints "test accuracy 0.7xxx"

ooc builds every batch (the partition buffer under ``--memory-budget``, feature tiers, the
neighbour sampler: :class:`ooc.tasks.node.NodeTask` over :mod:`ooc.data.path`); PyG's layers
train on it.  :func:`ooc.interop.pyg.to_pyg` turns a batch into PyG's bipartite form (``x``, one
``(edge_index, size, edge_weight)`` per layer, ``y``, ``n_id``), the convention of PyG's
``NeighborSampler`` examples.  The same class trains under ``ooc train`` itself (checkpoints,
resume, metrics, ``ooc eval``), as ``--model MODULE:CLASS`` with this folder on ``PYTHONPATH``::

    PYTHONPATH=examples ooc train data/cora --model pyg_sage:SAGE --feat-norm row --fanout 10,10
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv

from ooc.config import TrainConfig, parse_fanouts
from ooc.interop.pyg import PygStack, to_pyg
from ooc.storage.dataset import Dataset
from ooc.tasks.node import NodeTask, evaluate_nodes
from ooc.training.loop import resolve_device, seed_everything


class SAGE(PygStack):
    """GraphSAGE-mean from PyG's ``SAGEConv`` (``lin_r x_v + lin_l mean_u x_u``), in the
    constructor signature ``ooc train --model`` calls: ``SAGE(in_dim, hidden, out_dim, num_layers,
    dropout)``."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                 dropout: float = 0.5) -> None:
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        super().__init__([SAGEConv(dims[i], dims[i + 1]) for i in range(num_layers)], dims, dropout)


def accuracy(model: SAGE, task: NodeTask, ids: np.ndarray, device: torch.device) -> float:
    """Accuracy on node ``ids`` with full neighbourhoods (ooc's evaluation batches)."""
    c = evaluate_nodes(model, task.data, ids, model.num_layers, task.cfg.eval_batch_size, device)
    return float(c[0] / max(c[1], 1))


def main(argv: list[str] | None = None) -> float:
    """Train, print ``test accuracy X.XXXX`` (at the best validation evaluation) and return it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", help="ooc dataset directory (ooc convert ...)")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--fanout", default="10,10", help="neighbours per layer, output layer first")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--feat-norm", choices=["none", "row"], default="row")
    p.add_argument("--mode", choices=["exact", "buffer", "hybrid"], default="exact")
    p.add_argument("--memory-budget", default="", help="host-memory budget, e.g. 2GB")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    a = p.parse_args(argv)
    cfg = TrainConfig(dataset=a.dataset, fanouts=parse_fanouts(a.fanout), batch_size=a.batch_size,
                      hidden=a.hidden, dropout=a.dropout, feat_norm=a.feat_norm, mode=a.mode,
                      memory_budget=a.memory_budget, partitions=a.partitions,
                      seed=a.seed, progress=False,
                      # without a budget: two partitions resident (the budget's split sizes them)
                      **({} if a.memory_budget else {"buffer_partitions": min(2, a.partitions)}))
    cfg.validate()
    device = resolve_device(a.device)
    seed_everything(cfg.seed)
    task = NodeTask(cfg, Dataset(cfg.dataset))  # the out-of-core data path: plans and batches
    model = SAGE(task.ds.feat_dim, cfg.hidden, task.out_dim, len(cfg.fanouts), cfg.dropout).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    best_val, test = -1.0, 0.0
    try:
        for epoch in range(a.epochs):
            model.train()
            for batch in task.batches(task.plan(epoch), epoch, 0):
                pb = to_pyg(batch, device)                 # x, adjs [(edge_index, size, w)], y, n_id
                out = model.forward_pyg(pb.x, pb.adjs)     # [batch_size, classes]
                loss = F.cross_entropy(out, pb.y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            if (epoch + 1) % a.eval_every == 0 or epoch == a.epochs - 1:
                val = accuracy(model, task, task.val_ids, device)
                if val > best_val:
                    best_val, test = val, accuracy(model, task, task.test_ids, device)
                print(f"epoch {epoch}: loss {loss.item():.4f} validation accuracy {val:.4f}")
    finally:
        task.close()
    print(f"test accuracy {test:.4f}")
    return test


if __name__ == "__main__":
    main()
