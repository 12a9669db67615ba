"""The partition buffer (ooc.data.buffer): which rows are hits where misses may be approximated."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ooc.data.buffer import BufferManager
from ooc.storage.dataset import Dataset
from ooc.storage.io import DiskRows


class _Decoded:
    """A fallback tier that marks the rows it approximates: exact rows before ``approx_from``,
    -1 from there (as PQ-decoded rows differ from the exact ones)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x

    def gather(self, ids: np.ndarray, approx_from: int | None = None) -> tuple[np.ndarray, int]:
        rows = self.x[ids].copy()
        if approx_from is not None:
            rows[approx_from:] = -1
        return rows, 0


def test_prefetched_rows_are_not_hits_where_misses_are_approximated(planted_dataset: Path) -> None:
    """A partition prefetched into a spare slot is resident or not by timing (its load may or may
    not have finished when a batch is gathered).  Where the rows a batch misses are approximated
    (hybrid's outer hop with PQ codes), such a row would be exact in one run and decoded in the
    next, and the losses would differ run to run; so there only the state's partitions are hits.
    Rows before ``approx_from`` (exact either way) and gathers without it still use every loaded
    slot."""
    ds = Dataset(planted_dataset)
    off = np.asarray(ds.partition_offsets)
    rows = DiskRows(ds.features)
    x = ds.features.read_all()
    ids = np.concatenate([np.arange(off[0], off[0] + 5), np.arange(off[1], off[1] + 5)])
    got = {}
    for prefetched in (False, True):
        buf = BufferManager(rows, off, capacity=3, fallback=_Decoded(x), io_threads=1)
        try:
            buf.require([0], [1] if prefetched else [])
            for f in list(buf._loading.values()):
                f.result()
            buf.require([0], [1] if prefetched else [])  # settles the finished prefetch
            assert (1 in buf.resident()) == prefetched
            got[prefetched] = buf.gather(ids, approx_from=3)[0]
            exact, _ = buf.gather(ids)
            assert np.array_equal(exact, x[ids])
            hits = buf.stats.row_hits
        finally:
            buf.close()
        # approx_from=3: rows 0-2 exact; 3-4 hits of the state; 5-9 (partition 1) decoded
        want = x[ids].copy()
        want[5:] = -1
        assert np.array_equal(got[prefetched], want), prefetched
        assert hits == 5 + (10 if prefetched else 5)
    rows.close()
    ds.close()
