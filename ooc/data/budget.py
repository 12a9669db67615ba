"""Memory budgets and resident-set measurement.

:class:`RssMonitor` reports the current and peak resident set size of this process with psutil and
``/proc/self/status`` (``VmHWM``), and can reset the peak between epochs (Linux ``clear_refs``).
"""

from __future__ import annotations

import psutil

__all__ = ["RssMonitor", "release_free_memory", "tune_allocator"]


def _status_field(name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class RssMonitor:
    """Current and peak RSS of this process (bytes).

    ``peak()`` is the kernel's high-water mark ``VmHWM`` (falls back to the current RSS where /proc is
    missing); ``reset_peak()`` writes ``5`` to ``/proc/self/clear_refs`` so the next ``peak()`` covers
    only what follows (per-epoch peaks).  ``baseline`` is the RSS when the monitor was created: the
    runtime's fixed overhead (interpreter, torch, Numba) before any data is loaded.
    """

    def __init__(self) -> None:
        self._proc = psutil.Process()
        release_free_memory()
        self.baseline = self.current()
        self.reset_peak()

    def current(self) -> int:
        """Resident set size now."""
        return int(self._proc.memory_info().rss)

    def peak(self) -> int:
        """Peak resident set size since the last reset (or process start)."""
        hwm = _status_field("VmHWM")
        return hwm if hwm is not None else self.current()

    def reset_peak(self) -> bool:
        """Reset the peak to the current RSS; False where the kernel does not allow it."""
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False


def tune_allocator(mmap_threshold: int = 1 << 20, arena_max: int = 2) -> bool:
    """Make RSS follow live data under glibc: allocations >= ``mmap_threshold`` are always mapped
    (and unmapped on free; by default glibc raises this threshold up to 32 MiB after the first big
    free, so freed batch arrays stay in the heap), and at most ``arena_max`` malloc arenas (each
    thread would otherwise get its own heap).  Returns False where ``mallopt`` is unavailable."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(-3, int(mmap_threshold))  # M_MMAP_THRESHOLD
        ok &= libc.mallopt(-8, int(arena_max))  # M_ARENA_MAX
        return bool(ok)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False


def release_free_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``), so RSS tracks live data."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass
