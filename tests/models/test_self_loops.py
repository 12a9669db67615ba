"""GCN and GAT keep exactly one self-loop per node whatever loops the data holds (values by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ooc.kernels.graph import build_csc, self_loop_counts
from ooc.models import GATConv, GCNConv, TorchBlock

# 3 nodes; in-edges: node 0 <- 1, 2 and a self-loop 0 -> 0; node 1 <- 0; node 2 <- 1
SRC = [1, 2, 0, 0, 1]
DST = [0, 0, 0, 1, 2]
X = torch.tensor([[1.0], [2.0], [4.0]])


def _block() -> TorchBlock:
    return TorchBlock.from_edges(3, 3, SRC, DST)  # full neighbourhoods: degrees [3, 1, 1]


def _gcn(**kw: object) -> GCNConv:
    conv = GCNConv(1, 1, **kw)
    with torch.no_grad():
        conv.lin.weight.fill_(1.0)
    return conv


def test_gcn_counts_an_existing_self_loop_once() -> None:
    # A' (loops dropped) + I: node 0 has {0, 1, 2}, node 1 {0, 1}, node 2 {1, 2}; d^ = [3, 2, 2]
    want = [1 / 3 + 2 / math.sqrt(6) + 4 / math.sqrt(6), 2 / 2 + 1 / math.sqrt(6), 4 / 2 + 2 / 2]
    out = _gcn()(_block(), X)
    assert out[:, 0].tolist() == pytest.approx(want, abs=1e-6)
    # the same graph without its loop gives the same output
    no_loop = TorchBlock.from_edges(3, 3, [1, 2, 0, 1], [0, 0, 1, 2])
    assert torch.allclose(_gcn()(no_loop, X), out, atol=1e-6)


def test_gcn_unnormalised_adds_x_once() -> None:
    out = _gcn(normalize=False)(_block(), X)
    assert out[:, 0].tolist() == [1 + 2 + 4, 2 + 1, 4 + 2]


def test_gcn_sampled_block_uses_the_loop_table() -> None:
    # node 0 with only 1 -> 0 sampled (degree 3 of which one loop): d' = 2, s' = 1, scale 2
    blk = TorchBlock(2, 1, torch.tensor([1]), torch.tensor([0]), torch.tensor([3.0, 1.0]),
                     torch.tensor([3.0]), torch.tensor([1.0]), None, torch.tensor([1.0, 0.0]))
    out = _gcn()(blk, torch.tensor([[1.0], [2.0]]))
    assert out[0, 0].item() == pytest.approx(1 / 3 + 2 * 2 / math.sqrt(2 * 3), abs=1e-6)


def test_gat_attends_to_itself_exactly_once() -> None:
    conv = GATConv(1, 1, heads=1)
    with torch.no_grad():  # zero attention vectors: uniform weights over the attended nodes
        conv.lin.weight.fill_(1.0)
        conv.att_src.zero_()
        conv.att_dst.zero_()
    out = conv(_block(), X)
    # node 0 attends to {1, 2, 0} (not {1, 2, 0, 0}): (2 + 4 + 1) / 3
    assert out[:, 0].tolist() == pytest.approx([7 / 3, 1.5, 3.0], abs=1e-6)


def test_self_loop_counts() -> None:
    ip, idx = build_csc(np.array(SRC + [2]), np.array(DST + [2]), 3)
    assert self_loop_counts(ip, idx).tolist() == [1, 0, 1]


def test_sampled_blocks_carry_the_loop_table() -> None:
    """A batch holding only node 1: its source node 0's loop is known from the degree table, so
    node 1's output is the same as in the full-graph block above."""
    from ooc.kernels.sampling import sample_blocks
    from ooc.models import to_torch_blocks
    ip, idx = build_csc(np.array(SRC), np.array(DST), 3)
    deg, loops = np.diff(ip), self_loop_counts(ip, idx)
    assert deg.tolist() == [3, 1, 1] and loops.tolist() == [1, 0, 0]
    sg = sample_blocks(ip, idx, np.array([1]), [-1], key=0)
    blk = to_torch_blocks(sg, deg, loops)[0]
    assert blk.loops.tolist() == [0.0, 1.0]  # sources: node 1, then node 0 (one loop)
    x = X[torch.from_numpy(sg.nodes[: blk.num_src].astype(np.int64))]
    out = _gcn()(blk, x)
    assert out[0, 0].item() == pytest.approx(2 / 2 + 1 / math.sqrt(6), abs=1e-6)
