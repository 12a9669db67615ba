"""The runtime's fixed overhead: load every kernel and run one tiny step before measuring.

The memory budget covers what a run allocates for data; the interpreter, torch (autograd engine,
optimiser modules, thread pools) and Numba's compiled code exist before any data does.
:func:`warm_up_runtime` touches all of them once and returns the RSS monitor whose baseline is that
overhead (``rss_baseline_bytes`` in metrics.json).
"""

from __future__ import annotations

import numpy as np
import torch

from ooc.data.budget import RssMonitor, tune_allocator
from ooc.data.buffer import _gather_local, _gather_slots
from ooc.data.lookahead import next_uses
from ooc.features.cache import CachedFeature
from ooc.kernels.disk_sampling import sample_blocks_lists
from ooc.kernels.graph import self_loop_counts
from ooc.kernels.rows import gather_sorted, word_dtype
from ooc.kernels.sampling import sample_blocks
from ooc.data.resident import _filter_lists
from ooc.kernels.verify import first_common, first_decrease, first_not_increasing, first_outside
from ooc.models import Dropout, build_model, to_torch_blocks
from ooc.storage.io import (ALIGN, _add_draw_scores, _copy_hot, _hot_nodes, _hot_rank, _hot_slots,
                            _list_rows, _place_lists, _select_hot, aligned_empty)

__all__ = ["warm_up_runtime"]


def _readonly(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b.flags.writeable = False
    return b


def warm_up_runtime(model: str = "sage", num_layers: int = 2, shared: bool = False) -> RssMonitor:
    """Load every kernel and run one tiny training step, then measure the RSS baseline.

    The baseline is the runtime's fixed overhead -- interpreter, torch (autograd engine, optimiser
    modules, thread pools), Numba's compiled code -- which exists before any data does; the memory
    budget covers everything allocated after it.  ``shared``: the run's topology arrays will be
    read-only views of shared memory (several local ranks), a signature of their own for Numba.
    """
    tune_allocator()
    if shared:
        ip_ro = _readonly(np.array([0, 1, 2, 2], dtype=np.int64))
        for wide in (np.int64, np.int32):
            ix_ro = _readonly(np.array([1, 0], dtype=wide))
            sg = sample_blocks(ip_ro, ix_ro, np.array([0]), [2] * num_layers, np.uint64(1))
            to_torch_blocks(sg, _readonly(np.diff(ip_ro)), _readonly(self_loop_counts(ip_ro, ix_ro)))
            _filter_lists(np.array([0, 1], dtype=np.int64), ix_ro[:1],
                          ip_ro[:2], np.zeros(1, dtype=np.int64), 1,
                          np.zeros(1, dtype=np.int64), 0, np.empty(1, dtype=np.int64), 0)
    ip = np.array([0, 1, 2, 2], dtype=np.int64)
    # both index widths: datasets store int32 or int64 lists, buffer mode's resident subgraph is
    # int64, and the budget planner's probe samples over lists read from disk (a signature compiled
    # after the baseline would count its compile memory against the budget)
    for wide in (np.int64, np.int32):
        ix = np.array([1, 0], dtype=wide)
        sg = sample_blocks(ip, ix, np.array([0]), [2] * num_layers, np.uint64(1))
        sample_blocks_lists(lambda v, ix=ix: (np.concatenate([[0], np.cumsum(ip[v + 1] - ip[v])]),
                                              np.concatenate([ix[ip[u]:ip[u + 1]] for u in v])),
                            3, np.array([0]), [2] * num_layers, np.uint64(1))
    blocks = to_torch_blocks(sg, np.diff(ip), self_loop_counts(ip, ix))
    net = build_model(model, 4, 4, 2, num_layers, 0.0)
    opt = torch.optim.Adam(net.parameters(), lr=0.0)
    loss = torch.nn.functional.cross_entropy(net(blocks, torch.zeros(sg.input_nodes.shape[0], 4)),
                                             torch.zeros(1, dtype=torch.int64))
    loss.backward()
    opt.step()
    # dropout's kernels (layers of at least 4,096 elements), float32 and float16 inputs
    drop = Dropout(0.5)
    drop.train()
    x = torch.zeros(64, 64, requires_grad=True)
    drop(x).sum().backward()
    drop.forward_float(torch.zeros(64, 64, dtype=torch.float16))
    # the dataset checks run when a dataset is opened, after the baseline
    for wide in (np.int64, np.int32):
        a = np.zeros(2, dtype=wide)
        first_decrease(a)
        first_outside(a, 0, 1)
        first_not_increasing(a)
        first_common(a, a)
    # buffer mode's resident subgraph, for in-edges of either width
    for wide in (np.int64, np.int32):
        _filter_lists(np.array([0, 1], dtype=np.int64), np.array([0], dtype=wide),
                      np.array([0, 1], dtype=np.int64), np.zeros(1, dtype=np.int64), 1,
                      np.zeros(1, dtype=np.int64), 0, np.empty(1, dtype=np.int64), 0)
    c = CachedFeature(_TinyRows(), 2, "sieve")
    c.gather(np.array([0, 1, 2]))
    for pol in ("clock", "lru"):
        CachedFeature(_TinyRows(), 2, pol).gather(np.array([0, 1, 2]))
    # --cache-policy belady: the row cache with next uses, and the look-ahead's next-use kernel for
    # both key widths (its compile memory would otherwise count against the budget on a first run)
    CachedFeature(_TinyRows(), 2, "belady").gather(np.array([0, 1, 2]), next_use=np.array([1, 5, 2]))
    for kd in (np.int32, np.int64):
        ids = np.array([0, 1, 1, 2], dtype=kd)
        next_uses(ids, np.array([0, 2, 4], dtype=np.int64), np.array([0, 1], dtype=np.int64), 1,
                  np.full(8, -1, dtype=kd), np.zeros(8, dtype=np.int32), np.empty(2, dtype=np.int64))
    mem = aligned_empty(2 * ALIGN)
    words = [word_dtype(w) for w in (8, 4, 2, 1)]
    for t in words:
        w = t.itemsize
        _gather_slots(np.array([0]), np.array([0, 1], dtype=np.int64), np.array([0], dtype=np.int64),
                      np.zeros(1, dtype=np.int64), ALIGN // w, 1, mem.view(t),
                      np.empty((1, 1), t), np.empty(1, np.int64), np.empty(0, np.int64))
        _gather_local(np.array([0]), 1, np.zeros(1, dtype=np.int64), ALIGN // w, 1, mem.view(t),
                      np.empty((1, 1), t))
    # a read-ahead window's staged rows, every word width (rows of any size)
    for t in words:
        gather_sorted(np.array([0], dtype=np.int64), np.zeros((1, 1), t), np.array([0, 1], dtype=np.int64),
                      np.empty((2, 1), t))
    # --topology disk: the list reader's kernels for both index widths (--hot-topology's too)
    for it in (np.int32, np.int64):
        src, dst = np.array([1, 0], dtype=it), np.empty(2, dtype=it)
        one = np.array([0], dtype=np.int64)
        _place_lists(ip, one, src, dst)
        _copy_hot(ip, one, ip, src, dst)
        _add_draw_scores(ip, src, 2, np.zeros(3, dtype=np.float32))
    _list_rows(ip, one, np.empty(2, dtype=np.int64))
    _hot_slots(np.ones(1, dtype=np.uint64), one, one, np.empty(1, dtype=np.int64))
    _hot_rank(np.ones(1, dtype=np.uint64), np.empty(1, dtype=np.int64))
    _hot_nodes(np.ones(1, dtype=np.uint64), np.empty(1, dtype=np.int64))
    _select_hot(ip, np.ones(3, dtype=np.float32), 4, 8, 64, np.zeros(1, dtype=np.uint64))
    _warm_row_reads()
    return RssMonitor()


def _warm_row_reads() -> None:
    """Compile the row reader's kernels (request planning, preads; O_DIRECT where the file system
    allows it) on an 8-row array in a temporary folder; never fails the run."""
    import tempfile

    from ooc.storage.io import DiskRows
    from ooc.storage.rawarray import RawArray, write_array
    try:
        with tempfile.TemporaryDirectory(prefix="ooc-warm-") as d:
            write_array(f"{d}/x", np.arange(8 * 4, dtype=np.float32).reshape(8, 4))
            for direct in (False, True):
                try:
                    rows = DiskRows(RawArray(f"{d}/x"), direct=direct, threads=1,
                                    gap=4096 if direct else 0, aio_depth=2 if direct else 0)
                except (OSError, ValueError):
                    continue
                try:
                    rows.gather(np.array([5, 1, 1], dtype=np.int64))
                    rows.read_range(0, 8, aligned_empty(2 * ALIGN))  # partition loads
                except OSError:
                    pass
                finally:
                    rows.close()
    except OSError:  # pragma: no cover - no writable temporary folder
        pass


class _TinyRows:
    shape, dtype = (4, 2), np.dtype(np.float32)

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        return np.zeros((ids.shape[0], 2), np.float32), 0
