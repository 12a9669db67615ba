"""Dropout masks from a counter-based generator, in parallel.

``torch.nn.functional.dropout`` on CPU draws its mask with ``bernoulli_``, one sequential generator call
per element: on the billion-edge run the input dropout of a 15,10,5 batch of 1,024 seeds, a
~700,000 x 128 feature matrix, took about half of the trainer thread's time (py-spy, docs/benchmarks.md).
Here element ``i`` is kept when 32 bits of ``splitmix64(key, i // 2)`` fall at or above ``p * 2^32``
(two elements per 64-bit draw), so the mask is a pure function of (key, i): the same for any thread
count, and the forward pass writes the output and the mask in one parallel sweep.  Dropout itself is
Srivastava et al., JMLR'14 ("inverted" scaling by ``1 / (1 - p)`` at training time, as in PyTorch).
"""

from __future__ import annotations

import numpy as np
from numba import float32, njit, prange, types, uint8, uint32, uint64
from numba.extending import intrinsic

from ooc.kernels.rng import mix_key

__all__ = ["dropout_forward", "dropout_forward_half", "dropout_backward", "half_to_float",
           "keep_threshold"]


def keep_threshold(p: float) -> int:
    """The 32-bit threshold of drop probability ``p`` (an element is dropped when its 32 random bits
    are below it); ``p`` is rounded to a multiple of 2^-32.

    Raises:
        ValueError: ``p`` outside ``[0, 1)``.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability {p} outside [0, 1)")
    return int(round(p * 2.0 ** 32))


@intrinsic
def _f32_from_bits(typingctx, bits):  # type: ignore[no-untyped-def]
    """Reinterpret uint32 bits as a float32 (an LLVM bitcast)."""
    if bits != types.uint32:
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], context.get_value_type(types.float32))
    return types.float32(types.uint32), codegen


@njit(cache=True, nogil=True, inline="always")
def half_to_float(h: np.uint16) -> np.float32:
    """The float32 value of the IEEE float16 with bits ``h``, exactly (as ``np.float32(x)``):
    normals and infinities by moving exponent and mantissa into float32 position, zeros and
    subnormals as ``mantissa * 2^-24``; computed without branches, so loops over it vectorise."""
    b = uint32(h)
    mag = b & uint32(0x7FFF)
    sign = (b & uint32(0x8000)) << uint32(16)
    adj = uint32(0x38000000) if mag < uint32(0x7C00) else uint32(0x70000000)  # exponent bias, inf/NaN
    normal = _f32_from_bits(uint32(((mag << uint32(13)) + adj) | sign))
    sub = float32(mag) * float32(5.960464477539063e-08)
    sub = -sub if sign else sub
    return sub if mag < uint32(0x400) else normal


@njit(cache=True, nogil=True, parallel=True)
def dropout_forward(x: np.ndarray, out: np.ndarray, mask: np.ndarray, threshold: np.int64,
                    scale: float, key: np.uint64) -> None:
    """``out = x * scale`` where kept, 0 where dropped; ``mask`` 1 where kept.

    Args:
        x, out: float32|float64 [n] (flat, contiguous; ``out`` may not alias ``x``).
        mask: uint8 [n], written; or an empty array when no mask is wanted (an input without
            gradient).
        threshold: :func:`keep_threshold` of the drop probability.
        scale: ``1 / (1 - p)``.
        key: the draw's key (e.g. drawn from torch's generator, so ``torch.manual_seed`` fixes it).

    Element ``i`` is kept when its half of ``mix_key(key, i // 2)`` (low 32 bits for even ``i``)
    reaches ``threshold``.  Indices are unsigned: with signed ones inside a ``prange`` body Numba
    cannot prove them non-negative and checks every access for negative wrap-around, which kept the
    loop from being vectorised (7-10x slower); stores are selects, the mask is written as explicit
    ``uint8``, and nothing is counted (a reduction cost a quarter of the sweep).
    """
    n = x.shape[0]
    t = uint64(threshold)
    want = mask.shape[0] > 0
    for j in prange(n // 2):
        r = mix_key(key, j)
        i = uint64(2) * uint64(j)
        for q in range(2):
            ii = i + uint64(q)
            k = (r & uint64(0xFFFFFFFF) if q == 0 else r >> uint64(32)) >= t
            out[ii] = x[ii] * scale if k else 0.0
            if want:
                mask[ii] = uint8(1) if k else uint8(0)
    if n % 2:  # the last element: the low half of its pair's draw
        ii = uint64(n - 1)
        k = (mix_key(key, n // 2) & uint64(0xFFFFFFFF)) >= t
        out[ii] = x[ii] * scale if k else 0.0
        if want:
            mask[ii] = uint8(1) if k else uint8(0)


@njit(cache=True, nogil=True, parallel=True)
def dropout_forward_half(h: np.ndarray, out: np.ndarray, mask: np.ndarray, threshold: np.int64,
                         scale: float, key: np.uint64) -> None:
    """:func:`dropout_forward` of a float16 input, written as float32: ``out`` equals
    ``dropout_forward(x.astype(float32), ...)`` for the same key, without the float32 copy.

    Args:
        h: uint16 [n], the bits of a float16 array (``x.view(np.uint16)``).
        out: float32 [n], written; mask, threshold, scale, key: as :func:`dropout_forward`.
    """
    n = h.shape[0]
    t = uint64(threshold)
    want = mask.shape[0] > 0
    for j in prange(n // 2):
        r = mix_key(key, j)
        i = uint64(2) * uint64(j)
        for q in range(2):
            ii = i + uint64(q)
            k = (r & uint64(0xFFFFFFFF) if q == 0 else r >> uint64(32)) >= t
            v = half_to_float(h[ii])  # unconditionally: the select stays branch-free
            out[ii] = v * scale if k else 0.0
            if want:
                mask[ii] = uint8(1) if k else uint8(0)
    if n % 2:  # the last element: the low half of its pair's draw
        ii = uint64(n - 1)
        k = (mix_key(key, n // 2) & uint64(0xFFFFFFFF)) >= t
        out[ii] = half_to_float(h[ii]) * scale if k else 0.0
        if want:
            mask[ii] = uint8(1) if k else uint8(0)


@njit(cache=True, nogil=True, parallel=True)
def dropout_backward(grad: np.ndarray, mask: np.ndarray, out: np.ndarray, scale: float) -> None:
    """``out = grad * scale * mask`` (float [n], uint8 [n], float [n] written)."""
    for j in prange(grad.shape[0]):
        i = uint64(j)
        out[i] = grad[i] * scale if mask[i] != 0 else 0.0
