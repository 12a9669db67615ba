"""Work ahead on a background thread: the one prefetching iterator of ooc (edge chunks of the CSC
build, training and evaluation batches)."""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterable, Iterator, TypeVar

__all__ = ["prefetch"]

T = TypeVar("T")
_END = object()


def prefetch(items: Iterable[T], depth: int = 2,
             on_wait: Callable[[float], None] | None = None) -> Iterator[T]:
    """Yield ``items`` in order, produced ``depth`` ahead on a background thread (``depth <= 0``: in
    the caller's thread).

    Reads and Numba kernels release the GIL, so the next item is produced while the caller uses the
    current one.  ``on_wait(seconds)`` receives the time the consumer waited for each item.  An
    exception raised while producing is re-raised in the consumer; closing the consumer stops the
    producer and drops what it made ahead.
    """
    if depth <= 0:
        it = iter(items)
        while True:
            t = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            if on_wait is not None:
                on_wait(time.perf_counter() - t)
            yield item
            del item  # the next item is built while the caller holds none (batches in flight: 1)
    q: queue.Queue = queue.Queue(maxsize=int(depth))
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            q.put(e)

    th = threading.Thread(target=produce, name="ooc-prefetch", daemon=True)
    th.start()
    try:
        while True:
            t = time.perf_counter()
            got = q.get()
            if on_wait is not None:
                on_wait(time.perf_counter() - t)
            if got is _END:
                return
            if isinstance(got, BaseException):
                raise got
            yield got  # type: ignore[misc]
    finally:
        stop.set()
        while th.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                pass
            th.join(timeout=0.05)
