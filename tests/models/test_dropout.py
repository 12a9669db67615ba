"""Counter-based CPU dropout (``ooc.models.Dropout``, ``ooc.kernels.dropout``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ooc.kernels.dropout import dropout_backward, dropout_forward, keep_threshold
from ooc.models import Dropout


def test_mask_rate_scale_and_gradient() -> None:
    """p = 0.3 on 200,000 elements: the kept fraction is 0.7 within 4 standard deviations, kept
    elements are scaled by 1/0.7, dropped ones are 0, and the gradient is the same mask times 1/0.7."""
    torch.manual_seed(0)
    x = torch.randn(1000, 200, dtype=torch.float32, requires_grad=True)
    d = Dropout(0.3).train()
    y = d(x)
    kept = y != 0
    frac = kept.float().mean().item()
    sd = (0.3 * 0.7 / x.numel()) ** 0.5
    assert abs(frac - 0.7) < 4 * sd
    assert torch.allclose(y[kept], x.detach()[kept] / 0.7)
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.allclose(x.grad, torch.where(kept, g / 0.7, torch.zeros_like(g)))


def test_seeded_reproducible_and_independent_of_threads() -> None:
    """The mask is a function of torch's seed only: same seed -> same output with 1 or 2 Numba
    threads; successive calls differ; eval mode is the identity."""
    import numba
    x = torch.randn(300, 64)
    d = Dropout(0.5).train()
    outs = []
    for threads in (1, 2):
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        torch.manual_seed(7)
        outs.append((d(x), d(x)))
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert not torch.equal(outs[0][0], outs[0][1])
    assert torch.equal(d.eval()(x), x)


def test_small_and_odd_sizes_and_float64() -> None:
    """Odd element counts (the last of a pair of draws), float64, and p = 0 all behave; tensors below
    4,096 elements fall back to torch's dropout with the same semantics."""
    for n, dt in ((4097, np.float32), (5001, np.float64)):
        x = np.random.default_rng(0).standard_normal(n).astype(dt)
        out, mask = np.empty_like(x), np.empty(n, np.uint8)
        dropout_forward(x, out, mask, keep_threshold(0.5), 2.0, np.uint64(3))
        kept = int(mask.sum())
        assert 0.4 * n < kept < 0.6 * n
        assert np.array_equal(out, np.where(mask == 1, 2 * x, 0))
        g = np.ones(n, dt)
        gi = np.empty_like(g)
        dropout_backward(g, mask, gi, 2.0)
        assert np.array_equal(gi, 2.0 * mask)
    x = torch.randn(10, 10)
    assert torch.equal(Dropout(0.0).train()(x), x)
    y = Dropout(0.5).train()(x)  # 100 elements: torch's path
    assert set(torch.unique(y[y != 0] / x[y != 0]).round(decimals=4).tolist()) == {2.0}
    with pytest.raises(ValueError, match="outside"):
        keep_threshold(1.0)


def test_float16_rows_converted_in_the_sweep() -> None:
    """Every float16 bit pattern: ``dropout_forward_half`` gives the float32 output and mask of
    ``dropout_forward`` on the converted array (zeros, subnormals, infinities; NaN stays NaN), and a
    GNN fed float16 rows trains exactly as one fed ``x.float()``: same output, same gradients."""
    from ooc.kernels.dropout import dropout_forward_half
    from ooc.models import GNN, TorchBlock
    bits = np.arange(65536, dtype=np.uint16)
    x32 = bits.view(np.float16).astype(np.float32)
    for n in (65536, 65535):
        a, ma = np.empty(n, np.float32), np.empty(n, np.uint8)
        b, mb = np.empty(n, np.float32), np.empty(n, np.uint8)
        dropout_forward(x32[:n], a, ma, keep_threshold(0.3), 1 / 0.7, np.uint64(5))
        dropout_forward_half(bits[:n], b, mb, keep_threshold(0.3), 1 / 0.7, np.uint64(5))
        nan = np.isnan(a)
        assert np.array_equal(ma, mb) and np.array_equal(nan, np.isnan(b))
        assert np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))
    block = TorchBlock.from_edges(300, 40, torch.randint(0, 300, (500,)),
                                  torch.sort(torch.randint(0, 40, (500,))).values)
    x = torch.randn(300, 32).half()
    model = GNN("sage", 32, 16, 3, 1, dropout=0.5).train()
    res = []
    for inp in (x, x.float()):
        model.zero_grad()
        torch.manual_seed(3)
        out = model([block], inp)
        out.square().sum().backward()
        res.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(res[0][0], res[1][0])
    assert all(torch.equal(u, v) for u, v in zip(res[0][1], res[1][1]))
    xg = x.clone().requires_grad_()  # a float16 input with a gradient gets a float16 gradient
    Dropout(0.5).train().forward_float(xg).sum().backward()
    assert xg.grad is not None and xg.grad.dtype == torch.float16
