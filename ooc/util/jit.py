"""First-run notice for Numba's on-disk kernel cache.

ooc's kernels are compiled by Numba the first time they run and cached on disk (``cache=True``;
``__pycache__`` next to the kernels, or ``NUMBA_CACHE_DIR``).  A first run therefore spends tens of
seconds compiling before any output; :func:`first_run_notice` says so beforehand when the cache
does not hold a command's kernels for the current sources.  The cache holds one version per
argument types, so a warm kernel can still compile for a dataset of other id or feature types;
after a silent check :func:`first_run_notice` therefore watches Numba's compile events and says so
the first time one starts.
"""

from __future__ import annotations

import importlib
import sys
from typing import Sequence, TextIO

__all__ = ["cold_kernels", "first_run_notice", "announce_compiles"]


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
        announce_compiles(file)
        return False
    out = sys.stderr if file is None else file
    print(f"compiling kernels, first run only, ~{seconds:.0f} s", file=out, flush=True)
    return True


_announcer: "object | None" = None


def announce_compiles(file: TextIO | None = None) -> None:
    """From now on, print ``compiling kernels for new argument types, first time only`` when Numba
    starts compiling a kernel in this process (a miss of its on-disk cache), once per process.

    A courtesy like :func:`first_run_notice`: where Numba's event API is missing, nothing happens.
    """
    global _announcer
    if _announcer is not None:
        return
    try:
        from numba.core import event
    except ImportError:  # pragma: no cover - another Numba
        return

    class _Once(event.Listener):
        said = False

        def on_start(self, ev: object) -> None:
            if not self.said:
                self.said = True
                print("compiling kernels for new argument types, first time only",
                      file=sys.stderr if file is None else file, flush=True)

        def on_end(self, ev: object) -> None:
            pass

    _announcer = _Once()
    event.register("numba:compile", _announcer)
