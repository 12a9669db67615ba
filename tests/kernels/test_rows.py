"""Row gathers by sorted id (ooc.kernels.rows) against NumPy's searchsorted and fancy indexing."""

from __future__ import annotations

import numpy as np
import pytest

from ooc.kernels.rows import gather_sorted, word_view


@pytest.mark.parametrize("dtype,shape", [(np.float16, (256,)), (np.float32, (3, 2)), (np.uint8, (3,)),
                                         (np.float16, (3,)), (np.int64, ())])
def test_gather_sorted_equals_numpy_lookup(dtype: type, shape: tuple[int, ...]) -> None:
    """Found ids get their rows bit for bit, in the order asked (duplicates too); the rest are
    reported missing and their output rows left untouched."""
    rng = np.random.default_rng(7)
    held = np.unique(rng.integers(0, 5_000, 1_200))
    rows = rng.integers(0, 250, (held.shape[0], *shape)).astype(dtype)
    ids = np.concatenate([rng.choice(held, 700), rng.integers(-3, 5_003, 300), held[:1], held[-1:]])
    rng.shuffle(ids)
    out = np.full((ids.shape[0], *shape), 99, dtype=dtype)
    found, hits = gather_sorted(held, rows, ids, out)
    pos = np.minimum(np.searchsorted(held, ids), held.shape[0] - 1)
    want = held[pos] == ids
    assert found.tolist() == want.tolist() and hits == int(want.sum())
    assert np.array_equal(out[want].view(np.uint8), rows[pos[want]].view(np.uint8))
    assert (out[~want] == 99).all()


def test_gather_sorted_of_nothing_and_from_nothing() -> None:
    held, rows = np.array([2, 5], np.int64), np.ones((2, 4), np.float32)
    out = np.zeros((0, 4), np.float32)
    found, hits = gather_sorted(held, rows, np.zeros(0, np.int64), out)
    assert found.shape == (0,) and hits == 0
    out = np.zeros((2, 4), np.float32)
    found, hits = gather_sorted(np.zeros(0, np.int64), np.zeros((0, 4), np.float32),
                                np.array([2, 5], np.int64), out)
    assert not found.any() and hits == 0 and (out == 0).all()


def test_gather_sorted_refuses_mismatched_rows() -> None:
    held = np.array([1], np.int64)
    with pytest.raises(ValueError, match="differ"):
        gather_sorted(held, np.ones((1, 4), np.float32), held, np.ones((1, 4), np.float16))
    with pytest.raises(ValueError, match="2 ids for 1 output rows"):
        gather_sorted(held, np.ones((1, 4), np.float32), np.array([1, 1]), np.ones((1, 4), np.float32))


def test_word_view_picks_the_widest_word_dividing_a_row() -> None:
    assert word_view(np.zeros((3, 4), np.float16)).dtype == np.uint64
    assert word_view(np.zeros((3, 3), np.float16)).dtype == np.uint16
    assert word_view(np.zeros((3, 3), np.uint8)).shape == (3, 3)
    with pytest.raises(ValueError, match="C-contiguous"):
        word_view(np.zeros((4, 4), np.float32)[:, ::2])
