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


# ---------------------------------------------------------------- sparse aggregation
from ooc.models import GATConv, GINConv, MODELS, aggregate, build_model, edge_softmax  # noqa: E402


def _dense_adj(num_dst: int, num_src: int, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    a = torch.zeros(num_dst, num_src)
    for s, d in zip(src.tolist(), dst.tolist()):
        a[d, s] += 1.0
    return a


def test_sparse_aggregation_below_average_degree_one_equals_dense() -> None:
    g = torch.Generator().manual_seed(6)
    n, nnz = 2000, 400
    flat = torch.randperm(n * n, generator=g)[:nnz]  # 400 distinct (dst, src) pairs: avg degree 0.2
    dst, src = flat // n, flat % n
    x = torch.randn(n, 16, generator=g)
    b = TorchBlock.from_edges(n, n, src, dst)
    a = _dense_adj(n, n, src, dst)
    summed = aggregate(b, x, "sum")
    assert torch.allclose(summed, a @ x, atol=1e-5)
    empty_rows = a.sum(1) == 0
    assert int(empty_rows.sum()) >= 1600
    assert (summed[empty_rows] == 0).all()
    deg = a.sum(1, keepdim=True).clamp(min=1)
    assert torch.allclose(aggregate(b, x, "mean"), (a @ x) / deg, atol=1e-5)
    mx = aggregate(b, x, "max")
    assert (mx[empty_rows] == 0).all()
    for v in torch.nonzero(~empty_rows).flatten()[:50].tolist():
        assert torch.equal(mx[v], x[a[v] > 0].max(0).values)
    # a sum-based layer agrees with the dense product too: unnormalised GCN = (A + I) X W
    layer = GCNConv(16, 4, normalize=False, bias=False)
    assert torch.allclose(layer(b, x), (a + torch.eye(n)) @ layer.lin(x), atol=1e-4)


def test_single_edge_five_nodes() -> None:
    x = torch.arange(15, dtype=torch.float32).view(5, 3)
    b = TorchBlock.from_edges(5, 5, src=[0], dst=[1])
    for reduce in ("sum", "mean", "max"):
        out = aggregate(b, x, reduce)
        assert out[1].tolist() == [0.0, 1.0, 2.0]
        assert (out[[0, 2, 3, 4]] == 0).all()
    with pytest.raises(ValueError, match="unknown reduce"):
        aggregate(b, x, "median")


# ---------------------------------------------------------------- GAT / GIN values
def test_edge_softmax_normalises_per_destination() -> None:
    dst = torch.tensor([0, 0, 2, 2, 2])
    s = torch.tensor([[0.0, 1.0], [1.0, 1.0], [5.0, -3.0], [5.0, 0.0], [1000.0, 2.0]])
    a = edge_softmax(dst, s, 4)
    sums = torch.zeros(4, 2).index_add_(0, dst, a)
    assert torch.allclose(sums[[0, 2]], torch.ones(2, 2))
    assert torch.isfinite(a).all()  # no overflow thanks to the max shift
    assert torch.allclose(a[:2, 0], torch.softmax(torch.tensor([0.0, 1.0]), 0))
    assert a[4, 0] == 1.0


def _gat_dense_reference(layer: GATConv, b: TorchBlock, x: torch.Tensor) -> torch.Tensor:
    H, F = layer.heads, layer.out_dim
    h = layer.lin(x).view(-1, H, F)
    out = torch.zeros(b.num_dst, H, F)
    for v in range(b.num_dst):
        nbrs = [u for u, d in zip(b.src.tolist(), b.dst.tolist()) if d == v] + [v]
        for k in range(H):
            e = torch.stack([torch.nn.functional.leaky_relu(
                (layer.att_src[0, k] * h[u, k]).sum() + (layer.att_dst[0, k] * h[v, k]).sum(), 0.2)
                for u in nbrs])
            alpha = torch.softmax(e, 0)
            out[v, k] = sum(alpha[j] * h[u, k] for j, u in enumerate(nbrs))
    return (out.reshape(b.num_dst, H * F) if layer.concat else out.mean(1)) + layer.bias


@pytest.mark.parametrize("concat", [True, False])
def test_gat_matches_dense_reference(concat: bool) -> None:
    torch.manual_seed(1)
    layer = GATConv(4, 3, heads=2, concat=concat)
    with torch.no_grad():
        layer.bias.normal_()
    b = TorchBlock.from_edges(6, 4, src=[1, 2, 4, 0, 5, 5], dst=[0, 0, 0, 1, 1, 2])  # node 3: none
    x = torch.randn(6, 4)
    out = layer(b, x)
    assert out.shape == ((4, 6) if concat else (4, 3))
    assert torch.allclose(out, _gat_dense_reference(layer, b, x), atol=1e-5)
    # node 3 has only its self-loop: attention weight 1 on itself
    h3 = layer.lin(x[3:4]).view(1, 2, 3)
    expect3 = (h3.reshape(1, 6) if concat else h3.mean(1)) + layer.bias
    assert torch.allclose(out[3:4], expect3, atol=1e-6)


def test_gat_attention_dropout_only_in_training() -> None:
    torch.manual_seed(2)
    layer = GATConv(4, 3, heads=2, attn_dropout=0.9)
    b = TorchBlock.from_edges(6, 4, src=[1, 2, 4, 0, 5, 5], dst=[0, 0, 0, 1, 1, 2])
    x = torch.randn(6, 4)
    layer.eval()
    a, c = layer(b, x), layer(b, x)
    assert torch.equal(a, c)
    layer.train()
    assert not torch.allclose(layer(b, x), a)


@pytest.mark.parametrize("concat", [True, False])
def test_gat_feat_dropout_drops_aggregated_values_only_in_training(concat: bool) -> None:
    # the reference code's `seq_fts = dropout(seq_fts, in_drop)`: the aggregated W x is dropped, the
    # attention scores still come from the undropped W x
    torch.manual_seed(6)
    b = TorchBlock.from_edges(6, 4, src=[1, 2, 4, 0, 5, 5], dst=[0, 0, 0, 1, 1, 2])
    x = torch.randn(6, 4)
    plain = GATConv(4, 3, heads=2, concat=concat)
    layer = GATConv(4, 3, heads=2, concat=concat, feat_dropout=0.5)
    layer.load_state_dict(plain.state_dict())
    layer.eval()
    assert torch.equal(layer(b, x), plain(b, x))  # eval: exactly the layer without feat_dropout
    layer.train()
    torch.manual_seed(7)
    out = layer(b, x)
    # replay the same mask: dropout is the first random draw of the forward pass
    torch.manual_seed(7)
    h = layer.lin(x).view(-1, 2, 3)
    hv = torch.nn.functional.dropout(h, 0.5)
    assert (hv == 0).any() and not torch.equal(hv, h * 2)
    expect = torch.zeros(4, 2, 3)
    for v in range(4):
        nbrs = [u for u, d in zip(b.src.tolist(), b.dst.tolist()) if d == v] + [v]
        for k in range(2):
            e = torch.stack([torch.nn.functional.leaky_relu(
                (layer.att_src[0, k] * h[u, k]).sum() + (layer.att_dst[0, k] * h[v, k]).sum(), 0.2)
                for u in nbrs])
            alpha = torch.softmax(e, 0)  # scores from the undropped features
            expect[v, k] = sum(alpha[j] * hv[u, k] for j, u in enumerate(nbrs))
    expect = (expect.reshape(4, 6) if concat else expect.mean(1)) + layer.bias
    assert out.shape == ((4, 6) if concat else (4, 3))
    assert torch.allclose(out, expect, atol=1e-5)
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("density", [0.1, 1.0])  # sparse (non-zeros only) and dense paths
def test_gat_head_dropout_draws_a_mask_per_head(density: float) -> None:
    torch.manual_seed(8)
    n, d, heads = 40, 5, 3
    x = torch.rand(n, d) + 0.5
    x = x * (torch.rand(n, d) < density)
    layer = GATConv(d, d, heads=heads, head_dropout=0.5)
    with torch.no_grad():  # W_k = identity: head k's transformed input is its dropped x itself
        layer.lin.weight.copy_(torch.eye(d).repeat(heads, 1))
    layer.train()
    from ooc.models import _per_head_dropout_linear
    h = _per_head_dropout_linear(x, layer.lin.weight.view(heads, d, d), 0.5)  # [n, heads, d]
    assert h.shape == (n, heads, d)
    for k in range(heads):  # every entry is either dropped or scaled by 1 / (1 - p)
        kept = h[:, k] != 0
        assert torch.allclose(h[:, k][kept], 2 * x[kept])
        assert 0.2 < kept.sum() / (x != 0).sum() < 0.8
    assert not torch.equal(h[:, 0] != 0, h[:, 1] != 0)  # independent masks per head
    # the layer uses it in training; in eval it is the plain layer
    b = TorchBlock.from_edges(n, 4, src=[1, 2, 4, 0, 5, 5], dst=[0, 0, 0, 1, 1, 2])
    plain = GATConv(d, d, heads=heads)
    plain.load_state_dict(layer.state_dict())
    layer.eval()
    assert torch.equal(layer(b, x), plain(b, x))
    layer.train()
    w = layer.lin.weight
    out = layer(b, x)
    assert out.shape == (4, heads * d) and not torch.allclose(out, plain(b, x))
    out.sum().backward()
    assert w.grad is not None and torch.isfinite(w.grad).all() and w.grad.abs().sum() > 0


def test_gnn_dropout_per_head_moves_input_dropout_into_the_gat_layers() -> None:
    torch.manual_seed(9)
    net = build_model("gat", 6, 8, 3, 2, 0.6, heads=2, feat_dropout=0.4, dropout_per_head=True)
    assert net.dropout.p == 0.0
    assert [(m.head_dropout, m.feat_dropout.p) for m in net.layers] == [(0.6, 0.4), (0.6, 0.4)]
    ref = build_model("gat", 6, 8, 3, 2, 0.6, heads=2)
    assert net.dropout.p == 0.0 and ref.dropout.p == 0.6
    assert [(m.head_dropout, m.feat_dropout.p) for m in ref.layers] == [(0.0, 0.0), (0.0, 0.0)]
    ref.load_state_dict(net.state_dict())
    blocks = [TorchBlock.from_edges(7, 5, [5, 6, 0], [0, 0, 2]), TorchBlock.from_edges(5, 3, [3], [0])]
    x = torch.randn(7, 6)
    assert torch.equal(net.eval()(blocks, x), ref.eval()(blocks, x))


def test_gin_matches_dense_formula_and_learns_eps() -> None:
    torch.manual_seed(3)
    layer = GINConv(4, 5, eps=0.25)
    b = TorchBlock.from_edges(6, 4, src=[1, 2, 4, 0, 5, 5], dst=[0, 0, 0, 1, 1, 2])
    x = torch.randn(6, 4)
    a = _dense_adj(4, 6, b.src, b.dst)
    expect = layer.mlp(1.25 * x[:4] + a @ x)
    out = layer(b, x)
    assert torch.allclose(out, expect, atol=1e-5)
    out.sum().backward()
    assert layer.eps.grad is not None and layer.eps.grad.abs().item() > 0
    fixed = GINConv(4, 5, train_eps=False)
    assert [n for n, _ in fixed.named_parameters()] == ["mlp.0.weight", "mlp.0.bias", "mlp.2.weight",
                                                         "mlp.2.bias"]


@pytest.mark.parametrize("in_dim,out_dim", [(9, 2), (2, 9)])  # transform-first and aggregate-first paths
@pytest.mark.parametrize("aggregator", ["mean", "sum"])
def test_sage_matches_dense_formula_either_order(in_dim: int, out_dim: int, aggregator: str) -> None:
    torch.manual_seed(6)
    layer = SAGEConv(in_dim, out_dim, aggregator)
    b = TorchBlock.from_edges(6, 4, src=[1, 2, 4, 0, 5, 5], dst=[0, 0, 0, 1, 1, 2])
    x = torch.randn(6, in_dim)
    a = _dense_adj(4, 6, b.src, b.dst)
    if aggregator == "mean":
        a = a / a.sum(1, keepdim=True).clamp(min=1)
    expect = layer.lin_self(x[:4]) + (a @ x) @ layer.lin_neigh.weight.T
    assert torch.allclose(layer(b, x), expect, atol=1e-5)
    assert layer(b, x)[3].tolist() == pytest.approx(layer.lin_self(x[3]).tolist(), abs=1e-6)  # no edge


@pytest.mark.parametrize("in_dim,hidden", [(9, 3), (3, 9)])  # transform-first and aggregate-first paths
def test_gin_matches_dense_formula_either_order(in_dim: int, hidden: int) -> None:
    torch.manual_seed(7)
    layer = GINConv(in_dim, 2, hidden=hidden, eps=0.5)
    b = TorchBlock.from_edges(6, 4, src=[1, 2, 4, 0, 5, 5], dst=[0, 0, 0, 1, 1, 2])
    x = torch.randn(6, in_dim)
    expect = layer.mlp(1.5 * x[:4] + _dense_adj(4, 6, b.src, b.dst) @ x)
    assert torch.allclose(layer(b, x), expect, atol=1e-5)


def test_gin_mlp_is_hidden_wide_in_every_layer() -> None:
    # the output layer's MLP must not squeeze through the class count (3) units
    net = build_model("gin", 6, 16, 3, num_layers=2, dropout=0.5)
    shapes = [(c.mlp[0].in_features, c.mlp[0].out_features, c.mlp[2].out_features) for c in net.layers]
    assert shapes == [(6, 16, 16), (16, 16, 3)]


def test_sampled_sum_is_rescaled_to_full_degree() -> None:
    # node 0 has full in-degree 4 but only 2 sampled neighbours: the sum is scaled by 4 / 2
    b = TorchBlock(3, 1, torch.tensor([1, 2]), torch.tensor([0, 0]), torch.tensor([4.0, 1.0, 1.0]),
                   torch.tensor([4.0]), torch.tensor([2.0]))
    layer = SAGEConv(1, 1, "sum")
    with torch.no_grad():
        layer.lin_self.weight.zero_()
        layer.lin_self.bias.zero_()
        layer.lin_neigh.weight.fill_(1.0)
    assert layer(b, torch.tensor([[0.0], [1.0], [2.0]])).item() == 6.0


# ---------------------------------------------------------------- every model, degenerate blocks
def _stack_options() -> list[tuple[str, dict]]:
    out = []
    for m in MODELS:
        out.append((m, {}))
        out.append((m, {"residual": True, "norm": "batch"}))
        out.append((m, {"residual": True, "norm": "layer", "activation": "elu"}))
    out += [("sage", {"aggregator": "max"}), ("sage", {"aggregator": "sum"}),
            ("gat", {"heads": 4, "out_heads": 2, "attn_dropout": 0.5}),
            ("gat", {"heads": 4, "out_heads": 2, "attn_dropout": 0.5, "feat_dropout": 0.5,
                     "dropout_per_head": True})]
    return out


@pytest.mark.parametrize("model,opts", _stack_options())
@pytest.mark.parametrize("case", ["zero_edges", "isolated_nodes"])
def test_every_model_finite_on_degenerate_blocks(model: str, opts: dict, case: str) -> None:
    torch.manual_seed(4)
    if case == "zero_edges":
        blocks = [TorchBlock.from_edges(7, 5, [], []), TorchBlock.from_edges(5, 3, [], [])]
    else:  # nodes 1, 3, 4 of the first block and node 2 of the second have no in-edge
        blocks = [TorchBlock.from_edges(7, 5, [5, 6, 0], [0, 0, 2]),
                  TorchBlock.from_edges(5, 3, [3], [0])]
    net = build_model(model, 6, 8, 3, num_layers=2, dropout=0.5, **opts)
    x = torch.randn(7, 6, requires_grad=True)
    for mode in ("train", "eval"):
        getattr(net, mode)()
        net.zero_grad()
        x.grad = None
        out = net(blocks, x)
        assert out.shape == (3, 3)
        assert torch.isfinite(out).all()
        (out ** 2).sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("model", MODELS)
def test_layer_forward_composes_to_forward(model: str) -> None:
    torch.manual_seed(5)
    net = build_model(model, 4, 8, 2, num_layers=2, dropout=0.5, residual=True, norm="layer").eval()
    blocks = [TorchBlock.from_edges(6, 4, [1, 2, 4, 0, 5, 5], [0, 0, 0, 1, 1, 2]),
              TorchBlock.from_edges(4, 2, [1, 2, 3], [0, 0, 1])]
    x = torch.randn(6, 4)
    h = net.layer_forward(0, blocks[0], x)
    assert torch.equal(net.layer_forward(1, blocks[1], h), net(blocks, x))


def test_model_option_errors() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        build_model("gcnn", 4, 8, 2, 2, 0.5)
    with pytest.raises(ValueError, match="not divisible"):
        build_model("gat", 4, 10, 2, 2, 0.5, heads=4)
    with pytest.raises(ValueError, match="unknown norm"):
        build_model("gcn", 4, 8, 2, 2, 0.5, norm="group")


def test_glorot_init_option() -> None:
    """``init="glorot"``: every linear map of SAGE / GCN / GIN layers within the Glorot-uniform bound
    with the ReLU gain and filling it (not torch's narrower default), biases zero; unknown names fail."""
    import math
    torch.manual_seed(0)
    for name in ("sage", "gcn", "gin"):
        m = GNN(name, 256, 128, 16, 2, init="glorot")
        lins = [x for x in m.layers.modules() if isinstance(x, torch.nn.Linear)]
        assert lins
        for lin in lins:
            fan_out, fan_in = lin.weight.shape
            bound = math.sqrt(2.0) * math.sqrt(6.0 / (fan_in + fan_out))
            w = lin.weight.abs().max().item()
            assert 0.9 * bound < w <= bound + 1e-6
            assert lin.bias is None or torch.count_nonzero(lin.bias) == 0
    with pytest.raises(ValueError, match="unknown init"):
        GNN("sage", 4, 4, 2, 1, init="he")


@pytest.mark.parametrize("model,opts", [("sage", {}), ("sage", {"aggregator": "sum"}), ("gcn", {}),
                                        ("gin", {}), ("sage", {"residual": True, "norm": "layer"})])
@pytest.mark.parametrize("in_dim", [3, 12])  # transform-first (12 -> 8) and aggregate-first (3 -> 8)
def test_layer_split_into_propagation_and_node_function_equals_the_layer(model: str, opts: dict,
                                                                           in_dim: int) -> None:
    torch.manual_seed(8)
    net = build_model(model, in_dim, 8, 2, num_layers=2, dropout=0.5, **opts).eval()
    # node 3 has no in-edge; node 0 a self-loop and a parallel edge
    b = TorchBlock(6, 4, torch.tensor([0, 1, 2, 2, 4, 0, 5]), torch.tensor([0, 0, 0, 0, 1, 1, 2]),
                   torch.tensor([2.0, 1, 3, 1, 2, 1]), torch.tensor([4.0, 2, 1, 0]),
                   torch.tensor([4.0, 2, 1, 0]), loops=torch.tensor([1.0, 0, 0, 0, 0, 0]))
    x = torch.randn(6, in_dim)
    assert net.propagates(0)
    agg = net.layer_propagate(0, b, x)
    assert agg.shape == (4, in_dim)
    if model != "gcn":  # (GCN's propagation holds each node's own self-loop term)
        assert agg[3].abs().sum() == 0  # nothing for node 3, which has no in-edge
    torch.testing.assert_close(net.layer_from_propagated(0, x[:4], agg), net.layer_forward(0, b, x),
                               rtol=1e-5, atol=1e-6)
    # float16 rows as stored go in as they do to layer_forward
    xh = x.half()
    torch.testing.assert_close(net.layer_from_propagated(0, xh[:4], net.layer_propagate(0, b, xh)),
                               net.layer_forward(0, b, xh), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model,opts", [("gat", {}), ("sage", {"aggregator": "max"})])
def test_layers_with_parameters_before_aggregation_do_not_split(model: str, opts: dict) -> None:
    net = build_model(model, 4, 8, 2, num_layers=2, dropout=0.5, **opts).eval()
    assert not net.propagates(0)
    with pytest.raises(ValueError, match="cannot be split"):
        net.layer_propagate(0, TorchBlock.from_edges(3, 2, [1, 2], [0, 1]), torch.randn(3, 4))


def test_layer_split_refused_while_training() -> None:
    net = build_model("sage", 4, 8, 2, num_layers=2, dropout=0.5).train()
    with pytest.raises(ValueError, match="while training"):
        net.layer_propagate(0, TorchBlock.from_edges(3, 2, [1, 2], [0, 1]), torch.randn(3, 4))
