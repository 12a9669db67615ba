"""First-run notice for Numba's on-disk kernel cache.

ooc's kernels are compiled by Numba the first time they run and cached on disk (``cache=True``;
``__pycache__`` next to the kernels, or ``NUMBA_CACHE_DIR``).  A first run therefore spends tens of
seconds compiling before any output; :func:`first_run_notice` says so beforehand when the cache
does not hold a command's kernels for the current sources.
"""

from __future__ import annotations

import importlib
import sys
from typing import Sequence, TextIO

__all__ = ["cold_kernels", "first_run_notice"]


def cold_kernels(kernels: Sequence[str]) -> list[str]:
    """The kernels of ``kernels`` (``"module:function"``, Numba dispatchers with ``cache=True``) that
    have no compiled version in the on-disk cache for their current source.

    A kernel whose cache cannot be inspected (another Numba version's internals, no cache) counts as
    warm: the notice is a courtesy, never an error.
    """
    cold = []
    for spec in kernels:
        mod, _, name = spec.partition(":")
        try:
            disp = getattr(importlib.import_module(mod), name)
            if not disp._cache._cache_file._load_index():  # numba.core.caching.IndexDataCacheFile
                cold.append(spec)
        except Exception:  # noqa: BLE001 - numba internals differ between versions
            continue
    return cold


def first_run_notice(kernels: Sequence[str], seconds: float, file: TextIO | None = None) -> bool:
    """Print ``compiling kernels, first run only, ~N s`` if any of ``kernels`` is not compiled yet.

    Args:
        kernels: ``"module:function"`` names of kernels the command is sure to run.
        seconds: the measured compile time to announce.
        file: stream (default stderr).

    Returns:
        Whether the notice was printed.
    """
    if not cold_kernels(kernels):
        return False
    out = sys.stderr if file is None else file
    print(f"compiling kernels, first run only, ~{seconds:.0f} s", file=out, flush=True)
    return True
