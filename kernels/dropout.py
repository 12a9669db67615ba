"""Dropout masks from a counter-based generator, in parallel.

``torch.nn.functional.dropout`` on CPU draws its mask with ``bernoulli_``, one sequential generator call
per element: on the billion-edge run (issue 8) the input dropout of a 15,10,5 batch of 1,024 seeds, a
~700,000 x 128 feature matrix, took about half of the trainer thread's time (py-spy, docs/benchmarks.md).
Here element ``i`` is kept when 32 bits of ``splitmix64(key, i // 2)`` fall at or above ``p * 2^32``
(two elements per 64-bit draw), so the mask is a pure function of (key, i): the same for any thread
count, and the forward pass writes the output and the mask in one parallel sweep.  Dropout itself is
Srivastava et al., JMLR'14 ("inverted" scaling by ``1 / (1 - p)`` at training time, as in PyTorch).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint8, uint64

from ooc.kernels.rng import mix_key

__all__ = ["dropout_forward", "dropout_backward", "keep_threshold"]


def keep_threshold(p: float) -> int:
    """The 32-bit threshold of drop probability ``p`` (an element is dropped when its 32 random bits
    are below it); ``p`` is rounded to a multiple of 2^-32.

    Raises:
        ValueError: ``p`` outside ``[0, 1)``.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability {p} outside [0, 1)")
    return int(round(p * 2.0 ** 32))


@njit(cache=True, nogil=True, inline="always")
def _keep(x: np.ndarray, out: np.ndarray, mask: np.ndarray, i: np.uint64, bits: np.uint64,
          t: np.uint64, scale: float, want: bool) -> np.int64:
    k = bits >= t
    out[i] = x[i] * scale if k else 0.0
    if want:
        mask[i] = uint8(1) if k else uint8(0)
    return 1 if k else 0


@njit(cache=True, nogil=True, parallel=True)
def dropout_forward(x: np.ndarray, out: np.ndarray, mask: np.ndarray, threshold: np.int64,
                    scale: float, key: np.uint64) -> np.int64:
    """``out = x * scale`` where kept, 0 where dropped; ``mask`` 1 where kept.

    Args:
        x, out: float32|float64 [n] (flat, contiguous; ``out`` may not alias ``x``).
        mask: uint8 [n], written; or an empty array when no mask is wanted (an input without
            gradient).
        threshold: :func:`keep_threshold` of the drop probability.
        scale: ``1 / (1 - p)``.
        key: the draw's key (e.g. drawn from torch's generator, so ``torch.manual_seed`` fixes it).

    Returns:
        The number of kept elements.

    Indices are unsigned: with signed ones inside a ``prange`` body Numba cannot prove them
    non-negative and checks every access for negative wrap-around, which kept the loop from being
    vectorised (7-10x slower); stores are selects, and the mask is written as explicit ``uint8``.
    """
    n = x.shape[0]
    full = n // 2
    t = uint64(threshold)
    want = mask.shape[0] > 0
    kept = 0
    for j in prange(full):
        r = mix_key(key, j)
        i = uint64(2) * uint64(j)
        kept += _keep(x, out, mask, i, r & uint64(0xFFFFFFFF), t, scale, want) \
            + _keep(x, out, mask, i + uint64(1), r >> uint64(32), t, scale, want)
    if n % 2:  # the last element: the low half of pair `full`'s draw
        r = mix_key(key, full)
        kept += _keep(x, out, mask, uint64(n - 1), r & uint64(0xFFFFFFFF), t, scale, want)
    return kept


@njit(cache=True, nogil=True, parallel=True)
def dropout_backward(grad: np.ndarray, mask: np.ndarray, out: np.ndarray, scale: float) -> None:
    """``out = grad * scale * mask`` (float [n], uint8 [n], float [n] written)."""
    for j in prange(grad.shape[0]):
        i = uint64(j)
        out[i] = grad[i] * scale if mask[i] != 0 else 0.0
