"""ooc.sparse (the Numba CSR kernels of ooc.kernels.aggregate) against the index_select / index_add_
formulation it replaces: forward and gradients on random graphs, with destinations that have no
in-edge, sources no edge reads, repeated edges, edges in any order, heads, float64, 1 and 2 threads."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from ooc.models import GNN, TorchBlock, edge_softmax, to_torch_blocks
from ooc.sparse import (Adjacency, gather_dst, gather_src, reference_ops, segment_max, segment_sum,
                        spmm, spmm_reference, transform_first)


def random_edges(seed: int, num_src: int, num_dst: int, num_edges: int, grouped: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges over ``num_src`` sources and ``num_dst`` destinations; a quarter of the destinations
    and half of the sources take no part (empty neighbourhoods, isolated nodes), some edges repeat."""
    g = torch.Generator().manual_seed(seed)
    dsts = torch.randperm(num_dst, generator=g)[: max(1, (3 * num_dst) // 4)]
    srcs = torch.randperm(num_src, generator=g)[: max(1, num_src // 2)]
    dst = dsts[torch.randint(0, dsts.numel(), (num_edges,), generator=g)]
    src = srcs[torch.randint(0, srcs.numel(), (num_edges,), generator=g)]
    if num_edges > 4:
        src[-2:], dst[-2:] = src[:2], dst[:2]  # parallel edges
    if grouped:
        order = torch.sort(dst, stable=True).indices
        src, dst = src[order], dst[order]
    return src, dst


CASES = [(0, 50, 20, 200, True), (1, 50, 20, 200, False), (2, 7, 7, 0, True), (3, 300, 40, 1000, False),
         (4, 5, 5, 1, False), (5, 1000, 100, 3000, True)]


def grads(f, *inputs: torch.Tensor) -> tuple[torch.Tensor, list]:
    """``f(*inputs)`` and the gradients of ``sum(out * r)`` (a fixed random ``r``) w.r.t. the inputs."""
    ins = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = f(*ins)
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    if out.requires_grad:  # (the reference's output has no graph when there is no edge)
        (out * r).sum().backward()
    return out.detach(), [torch.zeros_like(t) if t.grad is None else t.grad
                          for t in ins if t.is_floating_point()]


@pytest.mark.parametrize("seed,ns,nd,ne,grouped", CASES)
@pytest.mark.parametrize("heads", [0, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_spmm_equals_index_add(seed: int, ns: int, nd: int, ne: int, grouped: bool, heads: int,
                               weighted: bool) -> None:
    """Forward and input gradient equal the reference float for float (same terms, same order); the
    weight gradient (a per-edge dot product) to float tolerance; rows without edges are 0."""
    src, dst = random_edges(seed, ns, nd, ne, grouped)
    adj = Adjacency(src, dst, ns, nd)
    assert adj.grouped == bool(ne < 2 or torch.all(dst[1:] >= dst[:-1]))
    g = torch.Generator().manual_seed(seed + 100)
    x = torch.randn((ns, heads, 6) if heads else (ns, 6), generator=g)
    w = torch.rand((ne, heads) if heads else (ne,), generator=g) if weighted else None
    args = (x,) if w is None else (x, w)
    out, gr = grads(lambda *a: spmm(adj, *a), *args)
    ref, gref = grads(lambda *a: spmm_reference(adj, *a), *args)
    assert torch.equal(out, ref)
    assert torch.equal(gr[0], gref[0])
    if weighted:
        torch.testing.assert_close(gr[1], gref[1], rtol=1e-5, atol=1e-6)
    empty = torch.ones(nd, dtype=torch.bool)
    empty[dst] = False
    assert torch.all(out[empty] == 0)


@pytest.mark.parametrize("seed,ns,nd,ne,grouped", CASES)
def test_segment_ops_and_gathers_equal_index_ops(seed: int, ns: int, nd: int, ne: int,
                                                 grouped: bool) -> None:
    src, dst = random_edges(seed, ns, nd, ne, grouped)
    adj = Adjacency(src, dst, ns, nd)
    g = torch.Generator().manual_seed(seed)
    msg = torch.randn(ne, 2, 3, generator=g)
    out, gm = grads(lambda m: segment_sum(adj, m), msg)
    ref, gr = grads(lambda m: m.new_zeros((nd, 2, 3)).index_add_(0, dst, m), msg)
    assert torch.equal(out, ref) and torch.equal(gm[0], gr[0])
    h = torch.randn(ns, 4, generator=g)
    out, gh = grads(lambda t: gather_src(adj, t), h)
    ref, gr = grads(lambda t: t.index_select(0, src), h)
    assert torch.equal(out, ref) and torch.equal(gh[0], gr[0])
    y = torch.randn(nd, 4, generator=g)
    out, gy = grads(lambda t: gather_dst(adj, t), y)
    ref, gr = grads(lambda t: t.index_select(0, dst), y)
    assert torch.equal(out, ref) and torch.equal(gy[0], gr[0])
    s = torch.randn(ne, 2, generator=g)
    mx = segment_max(adj, s)
    ref = s.new_full((nd, 2), float("-inf")).scatter_reduce(
        0, dst.unsqueeze(1).expand_as(s), s, reduce="amax", include_self=True)
    assert torch.equal(mx, ref)
    if ne:
        s[0, 0] = float("nan")
        assert torch.isnan(segment_max(adj, s)[dst[0], 0])


def test_edge_softmax_and_float64() -> None:
    src, dst = random_edges(7, 40, 15, 150, False)
    scores = torch.randn(150, 4, dtype=torch.float64)
    out, g = grads(lambda s: edge_softmax(dst, s, 15), scores)
    with reference_ops():
        ref, gr = grads(lambda s: edge_softmax(dst, s, 15), scores)
    assert out.dtype == torch.float64
    assert torch.equal(out, ref) and torch.equal(g[0], gr[0])
    sums = torch.zeros(15, 4, dtype=torch.float64).index_add_(0, dst, out)
    has = torch.zeros(15, dtype=torch.bool)
    has[dst] = True
    torch.testing.assert_close(sums[has], torch.ones_like(sums[has]))


def layer_blocks(seed: int) -> list[TorchBlock]:
    """Two random blocks (the second's sources are the first's destinations), uneven degrees."""
    blocks = []
    for ns, nd, ne, grouped in ((120, 30, 260, True), (30, 8, 40, False)):
        src, dst = random_edges(seed, ns, nd, ne, grouped)
        deg = torch.randint(1, 20, (ns,), generator=torch.Generator().manual_seed(seed)).float()
        blocks.append(TorchBlock.from_edges(ns, nd, src, dst, deg_src=deg))
        seed += 1
    return blocks


MODEL_CASES = [("sage", {"aggregator": "mean"}), ("sage", {"aggregator": "sum"}),
               ("sage", {"aggregator": "max"}), ("gcn", {}), ("gin", {}),
               ("gat", {"heads": 2, "attn_dropout": 0.0}), ("gat", {"heads": 1, "residual": True})]


@pytest.mark.parametrize("name,opts", MODEL_CASES)
@pytest.mark.parametrize("weighted", [False, True])
def test_layers_equal_reference(name: str, opts: dict, weighted: bool) -> None:
    """Every model with the kernels against the same model on the index_add_ path: outputs and
    every gradient equal (GAT's attention-weight gradients to float tolerance)."""
    torch.manual_seed(0)
    blocks = layer_blocks(3)
    if weighted:
        for b in blocks:
            b.edge_weight = torch.rand(b.num_edges, generator=torch.Generator().manual_seed(1)) + 0.5
    model = GNN(name, 16, 8, 3, 2, dropout=0.0, **opts)
    x = torch.randn(120, 16)
    res = []
    for ref in (False, True):
        model.zero_grad()
        ctx = reference_ops() if ref else torch.enable_grad()
        with ctx:
            out, (gx,) = grads(lambda t: model(blocks, t), x)
        res.append((out, gx, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (a, ga, pa), (b, gb, pb) = res
    exact = name != "gat"
    for u, v in [(a, b), (ga, gb), *zip(pa, pb)]:
        if exact:
            assert torch.equal(u, v)
        else:
            torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-6)
    assert len(pa) == len(pb)


def test_thread_count_does_not_change_results() -> None:
    """The same step with 1 and 2 Numba threads: identical output and gradients (GAT: the per-edge
    dot products too)."""
    blocks = layer_blocks(11)
    x = torch.randn(120, 16)
    model = GNN("gat", 16, 8, 3, 2, dropout=0.0, heads=2)
    res = []
    for threads in (1, 2):
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        model.zero_grad()
        out, (gx,) = grads(lambda t: model(blocks, t), x)
        res.append([out, gx] + [p.grad.clone() for p in model.parameters()])
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert all(torch.equal(u, v) for u, v in zip(*res))


def test_sampled_blocks_carry_both_csrs() -> None:
    """Blocks from the sampler come grouped by destination (no sort), and the transpose lists every
    source's edges in edge order."""
    from ooc.sampling.samplers import NeighborSampler
    rng = np.random.default_rng(0)
    n = 500
    indptr = np.arange(n + 1, dtype=np.int64) * 4
    indices = rng.integers(0, n, 4 * n).astype(np.int32)
    mb = NeighborSampler(indptr, indices, [3, 2]).sample(np.array([1, 5, 9]), np.uint64(3))
    for b in to_torch_blocks(mb, np.diff(indptr)):
        adj = b.adjacency
        assert adj.grouped
        tip, tdst, teid = adj.transpose()
        assert torch.equal(torch.from_numpy(tdst), b.dst[torch.from_numpy(teid)])
        for u in range(b.num_src):
            eids = teid[tip[u]:tip[u + 1]]
            assert np.all(np.diff(eids) > 0) and np.all(b.src.numpy()[eids] == u)


def test_transform_first_picks_the_cheaper_order_and_both_agree() -> None:
    """On CPU a wide layer over a sampled block (many sources, few destinations) aggregates first;
    few edges into many destinations transform first; the SAGE output is the same function either
    way (to float rounding)."""
    from ooc.models import SAGEConv
    src, dst = random_edges(4, 1000, 100, 1100, True)
    wide = Adjacency(src, dst, 1000, 100)
    x = torch.randn(1000, 64)
    assert not transform_first(wide, x, 64, 32)
    src2, dst2 = random_edges(5, 1000, 1000, 300, True)
    assert transform_first(Adjacency(src2, dst2, 1000, 1000), x, 64, 32)
    layer = SAGEConv(64, 32)
    b = TorchBlock.from_edges(1000, 100, src, dst)
    agg_first = layer(b, x)
    x_dst = x[:100]
    manual = layer.lin_self(x_dst) + spmm(b.adjacency, layer.lin_neigh(x)) / \
        b.sampled.clamp(min=1).unsqueeze(1)
    torch.testing.assert_close(agg_first, manual, rtol=1e-5, atol=1e-5)
