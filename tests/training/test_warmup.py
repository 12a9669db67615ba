"""The runtime warm-up (ooc.training.warmup): kernels a run calls after the RSS baseline are
compiled before it, so their compile memory never counts against the budget."""

from __future__ import annotations

import numpy as np

from ooc.kernels.graph import self_loop_counts
from ooc.kernels.sampling import sample_blocks
from ooc.models import to_torch_blocks
from ooc.training.warmup import warm_up_runtime


def _signatures() -> dict[str, int]:
    """Compiled signatures of every Numba kernel of the sampling and graph kernels."""
    import ooc.kernels.graph as kg
    import ooc.kernels.sampling as ks
    out = {}
    for mod in (ks, kg):
        for name, f in vars(mod).items():
            sigs = getattr(f, "signatures", None)
            if isinstance(sigs, list):
                out[f"{mod.__name__}.{name}"] = len(sigs)
    return out


def test_shared_warm_up_covers_read_only_topology() -> None:
    """Several local ranks read the topology as read-only shared-memory views (a Numba signature
    of their own): after ``warm_up_runtime(shared=True)`` sampling over such arrays, of either
    index width, compiles nothing."""
    warm_up_runtime(shared=True)
    before = _signatures()
    ip = np.array([0, 2, 3, 3, 5], dtype=np.int64)
    ip.flags.writeable = False
    for wide in (np.int64, np.int32):
        ix = np.array([1, 2, 0, 0, 1], dtype=wide)
        ix.flags.writeable = False
        sg = sample_blocks(ip, ix, np.array([0, 1]), [2, 2], np.uint64(7))
        deg = np.diff(ip)
        deg.flags.writeable = False
        loops = self_loop_counts(ip, ix)
        loops.flags.writeable = False
        to_torch_blocks(sg, deg, loops)
    assert _signatures() == before
