"""SIGINT / SIGTERM stop every long command promptly, leaving nothing half-written.

:func:`stop_on_signals` (the ``ooc`` command runs every subcommand inside it) turns SIGTERM into a
:class:`Terminated` exception in the main thread, as Python already turns SIGINT into
``KeyboardInterrupt``.  Both derive from ``BaseException``, so no ``except Exception`` swallows
them: the writers' context managers see them and remove their partial output (a dataset under
construction is a hidden ``.NAME.partial-PID-*`` sibling; atomic files are ``.NAME.tmp-PID``), and
locks go with the process.

Python runs signal handlers only between bytecodes of the main thread; a long call into C (a Numba
kernel, METIS) would delay them.  A watchdog thread learns of the signal at once through
``signal.set_wakeup_fd``; if the process has not stopped ``grace_s`` seconds later, it removes the
partial outputs registered with :func:`register_partial` and ends the process with
``os._exit(128 + signum)``.  Whatever is still left (a kill -9) carries the dead pid in its name and
is removed by the next command that touches the dataset or run.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["Terminated", "stop_on_signals", "exit_on_signals", "deferred_signals", "register_partial",
           "forget_partial", "GRACE_S"]

#: Seconds the main thread gets to stop by itself after SIGINT / SIGTERM before the watchdog ends
#: the process.
GRACE_S = 5.0

_PARTIALS: set[str] = set()
_PLOCK = threading.Lock()


class Terminated(BaseException):
    """SIGTERM received (raised in the main thread by :func:`stop_on_signals`)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        self.signum = signum
        super().__init__(f"terminated by {signal.Signals(signum).name}")


def register_partial(path: str | os.PathLike) -> None:
    """Record a partial output (file or folder) to remove if a signal forces the process out."""
    with _PLOCK:
        _PARTIALS.add(str(path))


def forget_partial(path: str | os.PathLike) -> None:
    """The partial output ``path`` was committed or removed: no longer the watchdog's business."""
    with _PLOCK:
        _PARTIALS.discard(str(path))


def _remove_partials() -> None:
    with _PLOCK:
        paths = list(_PARTIALS)
        _PARTIALS.clear()
    for p in paths:
        q = Path(p)
        if q.is_dir() and not q.is_symlink():
            shutil.rmtree(q, ignore_errors=True)
        else:
            try:
                q.unlink()
            except OSError:
                pass


@contextmanager
def stop_on_signals(grace_s: float = GRACE_S, command: str = "ooc") -> Iterator[None]:
    """Run the body with SIGTERM raising :class:`Terminated` (SIGINT: ``KeyboardInterrupt``) and a
    watchdog that ends the process ``grace_s`` seconds after a signal the body did not act on.

    Only in the main thread (elsewhere the body runs unchanged).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, True)
    stopping = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        raise Terminated(signum)

    def watchdog() -> None:
        while True:
            try:
                data = os.read(r, 16)
            except OSError:
                return
            if not data or stopping.is_set():
                return
            sig = data[-1]
            if sig not in (signal.SIGINT, signal.SIGTERM):
                continue
            if stopping.wait(grace_s):
                return
            print(f"{command}: {signal.Signals(sig).name}: still busy after {grace_s:.0f} s; stopping "
                  "now (partial output removed)", file=sys.stderr, flush=True)
            _remove_partials()
            os._exit(128 + sig)

    old_term = signal.signal(signal.SIGTERM, on_term)
    try:
        old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        old_fd = None
    t = threading.Thread(target=watchdog, name="ooc-signal-watchdog", daemon=True)
    t.start()
    try:
        yield
    finally:
        stopping.set()
        if old_fd is not None:
            signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGTERM, old_term)
        os.close(w)  # the watchdog's read returns b""
        t.join(timeout=1.0)
        os.close(r)


def exit_on_signals(rc: int) -> None:
    """The command's work is done and its status is ``rc``: from here to the interpreter's exit
    (its teardown of threads, modules and allocators can take seconds) SIGINT and SIGTERM end the
    process at once with ``rc``, not with ``128 + signum``: nothing is left to stop or remove, so
    a caller that sends a signal as the command finishes still reads the command's own status.

    Installs process-wide handlers: only for the console script's last step (main thread only).
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def on_signal(signum: int, frame: object) -> None:
        sys.stdout.flush()
        os._exit(rc)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the body runs, then act on the first one that came, as
    its handler would have (``KeyboardInterrupt``, :class:`Terminated`, or the default action).

    For a short write that a signal must not cut half-way: ``torch.save``'s zip writer, stopped
    by a ``KeyboardInterrupt`` raised inside it, fails with an unrelated ``RuntimeError`` (and a
    traceback) instead of the command's interrupt.  The watchdog of :func:`stop_on_signals` still
    ends a body that takes longer than its grace.  Main thread only (elsewhere it does nothing).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def hold(signum: int, frame: object) -> None:
        got.append(signum)

    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {sig: signal.signal(sig, hold) for sig in sigs}
    try:
        yield
    finally:
        for sig in sigs:
            signal.signal(sig, old[sig])
        if got:
            sig = got[0]
            handler = old[sig]
            if callable(handler):
                handler(sig, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), sig)
