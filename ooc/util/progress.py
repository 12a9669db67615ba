"""Progress bars that suit both a terminal and a log file: one factory, :func:`progress`.

On a terminal it is an ordinary tqdm bar, redrawn in place.  When the bar's stream is not a
terminal (redirected to a file, a pipe, a CI log) tqdm's in-place frames (``\\r`` + bar, many per
second) would pile up in the file; there the same bar writes one plain line when it starts, at most
one line per ``interval`` seconds while it runs, and a final line when it closes.

    >>> import io
    >>> log = io.StringIO()
    >>> with progress(total=3, desc="rows", file=log, interval=0) as bar:
    ...     _ = bar.update(3)
    >>> "\\r" in log.getvalue(), log.getvalue().splitlines()[-1].startswith("rows: 100%")
    (False, True)
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable, TextIO

from tqdm import tqdm

__all__ = ["progress", "is_terminal", "DEFAULT_INTERVAL_S"]

DEFAULT_INTERVAL_S = 10.0
"""Seconds between two lines of a bar that writes to a file (``OOC_PROGRESS_INTERVAL`` overrides)."""


def is_terminal(stream: object) -> bool:
    """Whether ``stream`` is an interactive terminal (``False`` for files, pipes and closed streams)."""
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


class _Lines:
    """A text stream for tqdm that turns its in-place frames into whole lines.

    tqdm draws a frame as ``"\\r" + text + padding``; a frame becomes ``text + "\\n"``.  The cursor
    moves and bare newlines tqdm writes around frames carry nothing and are dropped.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, s: str) -> int:
        text = s.replace("\x1b[A", "").strip("\r\n").rstrip()
        if "\r" in text:  # several frames in one write: keep the last
            text = text.rsplit("\r", 1)[1].rstrip()
        if text:
            self.out.write(text + "\n")
        return len(s)

    def flush(self) -> None:
        self.out.flush()


class _LineBar(tqdm):
    """tqdm that draws a count once: ``close()`` does not repeat the line of the last update."""

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg is None:
            if self.n == getattr(self, "_shown_n", None):
                return True
            self._shown_n = self.n
        return super().display(msg, pos)


def _interval() -> float:
    try:
        return max(float(os.environ.get("OOC_PROGRESS_INTERVAL", DEFAULT_INTERVAL_S)), 0.0)
    except ValueError:
        return DEFAULT_INTERVAL_S


def progress(iterable: Iterable | None = None, *, total: float | None = None,
             desc: str | None = None, unit: str = "it", unit_scale: bool = False,
             enabled: bool = True, leave: bool = True, file: TextIO | None = None,
             interval: float | None = None, **kwargs: Any) -> tqdm:
    """A progress bar (a :class:`tqdm.tqdm`) that writes lines instead of frames when not on a terminal.

    Use it as tqdm is used: iterate over it, or call ``update(n)`` / ``set_postfix(...)`` and
    ``close()`` (or use it as a context manager).

    Args:
        iterable: what to iterate over (optional; without it call ``update``).
        total: expected number of units (``len(iterable)`` when it has one).
        desc: label printed before the bar, e.g. ``"count"``.
        unit: name of one unit (``"edge"``, ``"row"``); ``unit_scale`` prints 1.2M instead of 1200000.
        enabled: ``False`` gives a silent bar (same object, nothing written).
        leave: keep the final state on screen (terminal) / write a final line (file).
        file: the stream, default ``sys.stderr``.
        interval: seconds between lines when ``file`` is not a terminal (default
            ``OOC_PROGRESS_INTERVAL`` or :data:`DEFAULT_INTERVAL_S`); ignored on a terminal.
        **kwargs: passed to tqdm (``initial``, ``postfix``, ...).

    Returns:
        The tqdm bar.
    """
    out = sys.stderr if file is None else file
    if not enabled:
        return tqdm(iterable, total=total, disable=True)
    if is_terminal(out):
        return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, leave=leave,
                    file=out, dynamic_ncols=True, **kwargs)
    every = _interval() if interval is None else max(float(interval), 0.0)
    return _LineBar(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, leave=leave,
                    file=_Lines(out), ncols=80, mininterval=every, maxinterval=max(every, 1.0),
                    miniters=1 if every == 0 else None, **kwargs)
