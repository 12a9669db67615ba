"""Feature tiers, in the order a row is looked up: device cache, resident partition slots (in
:mod:`ooc.data.buffer`), CPU row cache, PQ codes or disk."""
