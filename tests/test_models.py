"""Layers on blocks: exact aggregation values, empty blocks, GCN self-loop convention."""

from __future__ import annotations

import pytest
import torch

from ooc.models import GCNConv, GNN, SAGEConv, TorchBlock


def empty_block() -> TorchBlock:
    return TorchBlock.from_edges(num_src=5, num_dst=3, src=[], dst=[])


@pytest.mark.parametrize("layer", [SAGEConv(4, 2, "mean"), SAGEConv(4, 2, "max"), SAGEConv(4, 2, "sum"),
                                   GCNConv(4, 2), GCNConv(4, 2, self_loops=False)])
def test_zero_edge_block(layer: torch.nn.Module) -> None:
    b = empty_block()
    x = torch.randn(5, 4, requires_grad=True)
    out = layer(b, x)
    assert out.shape == (3, 2)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert x.grad is None or torch.isfinite(x.grad).all()  # no path to x when nothing is aggregated
    for p in layer.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


def test_sage_zero_edges_aggregate_exactly_zero() -> None:
    layer = SAGEConv(1, 1, "mean")
    with torch.no_grad():
        layer.lin_self.weight.zero_()
        layer.lin_self.bias.zero_()
        layer.lin_neigh.weight.fill_(1.0)
    out = layer(empty_block(), torch.ones(5, 1) * 7)
    assert out.flatten().tolist() == [0.0, 0.0, 0.0]


def path_block() -> TorchBlock:
    # undirected path 0-1-2 as in-edges of every node
    return TorchBlock.from_edges(3, 3, src=[1, 0, 2, 1], dst=[0, 1, 1, 2])


def test_gcn_self_loop_option_sum() -> None:
    x = torch.tensor([[0.0], [2.0], [1.0]])
    for loops, expect in ((True, [[2.0], [3.0], [3.0]]), (False, [[2.0], [1.0], [2.0]])):
        layer = GCNConv(1, 1, self_loops=loops, normalize=False, bias=False)
        with torch.no_grad():
            layer.lin.weight.fill_(1.0)
        assert layer(path_block(), x).tolist() == expect


def test_gcn_full_neighbourhood_equals_dense_formula() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    layer = GCNConv(4, 2, bias=False)
    a = torch.tensor([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=torch.float32) + torch.eye(3)
    dinv = a.sum(1).rsqrt()
    dense = (dinv[:, None] * a * dinv[None, :]) @ layer.lin(x)
    assert torch.allclose(layer(path_block(), x), dense, atol=1e-6)


def test_sage_mean_values() -> None:
    layer = SAGEConv(1, 1, "mean")
    with torch.no_grad():
        layer.lin_self.weight.fill_(1.0)
        layer.lin_self.bias.zero_()
        layer.lin_neigh.weight.fill_(10.0)
    x = torch.tensor([[0.0], [2.0], [1.0]])
    # node 1: self 2 + 10 * mean(0, 1) = 7
    assert layer(path_block(), x).flatten().tolist() == [20.0, 7.0, 21.0]


def test_gnn_rejects_block_count_mismatch() -> None:
    m = GNN("sage", 4, 8, 2, num_layers=2)
    with pytest.raises(ValueError, match="1 blocks for 2 layers"):
        m([empty_block()], torch.randn(5, 4))
