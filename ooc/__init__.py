"""ooc: out-of-core training of graph neural networks on graphs larger than memory."""

import os as _os

# OpenMP threads (Numba's ``omp`` layer and torch share libgomp) sleep at barriers instead of
# spinning.  ooc overlaps sampling, I/O threads and model compute on the same cores, and a spinning
# barrier steals the core another stage needs: on the 2-core development VM under load the node-wise
# sampler ran 3.4x faster with 2 threads (docs/benchmarks.md, "Sampling").  libgomp reads this when it
# is loaded, so it applies when ``ooc`` is imported before torch/Numba start their thread pools (the
# ``ooc`` command always does).  Set OMP_WAIT_POLICY=ACTIVE in the environment to keep spinning.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
