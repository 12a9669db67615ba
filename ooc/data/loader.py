"""The prefetching loader: ``require the step's buffer state -> build its batch`` on a background
thread, ``prefetch`` batches ahead of the trainer.

The Numba kernels and the reads release the GIL, so sampling and I/O overlap with the model.  Every
batch's random stream is keyed by (seed, epoch, batch index), so batches depend neither on the
thread, the prefetch depth nor the buffer size; the loader only decides *when* they are built.
"""

from __future__ import annotations

from contextlib import closing
from typing import Callable, Iterator, TypeVar

import numpy as np

from ooc.contracts import Batch, Plan
from ooc.data.buffer import BufferManager
from ooc.util.threads import prefetch

__all__ = ["prefetched", "Loader", "BuildFn"]

T = TypeVar("T")

#: ``build(step, seeds, epoch, state, key) -> Batch``: one step's batch, its state resident.
BuildFn = Callable[[int, np.ndarray, int, int, int], Batch]


def prefetched(build: Callable[[int], T], start: int, stop: int, depth: int,
               on_wait: Callable[[float], None]) -> Iterator[T]:
    """Yield ``build(i)`` for ``i`` in ``start..stop-1`` in order, built ``depth`` ahead on a
    background thread (``depth <= 0``: in the caller's thread); ``on_wait(seconds)`` receives the
    time the consumer waited for each item (the I/O + sampling stall).  See
    :func:`ooc.util.threads.prefetch`."""
    return prefetch(map(build, range(start, stop)), depth, on_wait)


class Loader:
    """Walks a :class:`~ooc.contracts.Plan`: before building a step it makes the step's buffer state
    resident (``buffer.require`` with a ticket that grows by one at every change of state, the hand-
    over number of a shared buffer), then calls ``build``.

    Args:
        buffer: the machine's partition buffer.
        prefetch: batches built ahead (0 = in the caller's thread).

    Attributes:
        stall_s: time the consumer waited for batches since the last reset.
        position: ``(epoch, next step)``: what a checkpoint needs.
    """

    def __init__(self, buffer: BufferManager, prefetch: int = 2) -> None:
        self.buffer = buffer
        self.prefetch = prefetch
        self.stall_s = 0.0
        self.position = (0, 0)
        self._ticket = 0
        self._state_key: tuple | None = None
        self.on_state: Callable[[list[int], tuple], None] | None = None

    def _require(self, plan: Plan, i: int, epoch: int) -> int:
        k = plan.batch_state[i]
        if k < 0:
            return k
        key = (epoch, k)
        if key != self._state_key:
            self._ticket += 1
            self._state_key = key
        parts = plan.states[k]
        self.buffer.require(parts, plan.upcoming[k][: max(self.buffer.capacity, 1)], self._ticket)
        if self.on_state is not None:
            self.on_state(parts, (epoch, k, tuple(parts)))
        return k

    def iterate(self, plan: Plan, epoch: int, start: int, build: BuildFn) -> Iterator[Batch]:
        """Yield steps ``start..`` of ``plan`` in order (``start > 0`` resumes mid-epoch)."""
        def make(i: int) -> Batch:
            k = self._require(plan, i, epoch)
            return build(i, plan.batches[i], epoch, k, plan.key(i))

        with closing(prefetched(make, start, len(plan.batches), self.prefetch, self._add_stall)) as it:
            for b in it:
                self.position = (epoch, b.index + 1)
                yield b
                del b  # not held while the next one is built

    def _add_stall(self, seconds: float) -> None:
        self.stall_s += seconds
