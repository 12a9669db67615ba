"""Shared fixtures: real datasets from ../shared/data (skipped when absent, failing under CI=true)."""

from __future__ import annotations

import os
from pathlib import Path

# OpenMP threads that spin while waiting make torch ops ~100x slower when the cores are shared with
# other processes (2-core CI / development machines); sleeping waiters cost nothing measurable.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
def _find_shared() -> Path:
    if os.environ.get("OOC_SHARED_DATA"):
        return Path(os.environ["OOC_SHARED_DATA"])
    for cand in (REPO.parent / "shared" / "data", Path("/work/shared/data")):
        if cand.exists():
            return cand
    return REPO.parent / "shared" / "data"


SHARED_DATA = _find_shared()


def shared_path(*parts: str) -> Path:
    """Path under the shared data folder; skip (or fail under CI=true) when it is absent."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        msg = f"real dataset {p} absent (set OOC_SHARED_DATA to the shared/data folder)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return p


@pytest.fixture(scope="session")
def cora_raw() -> Path:
    return shared_path("cora", "planetoid")


@pytest.fixture(scope="session")
def citeseer_raw() -> Path:
    return shared_path("citeseer", "planetoid")


@pytest.fixture(scope="session")
def cora_dataset(tmp_path_factory: pytest.TempPathFactory, cora_raw: Path) -> Path:
    from ooc.ingest.convert import convert_planetoid
    out = tmp_path_factory.mktemp("cora") / "cora"
    return convert_planetoid(cora_raw, "cora", out)


@pytest.fixture(scope="session")
def planted_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small planted-partition dataset (3,000 nodes, 8 partitions stored)."""
    from ooc.kernels.partition import contiguous_partitions
    from ooc.kernels.generators import planted_partition
    from ooc.ingest.convert import write_graph_dataset
    g = planted_partition(3000, num_classes=4, avg_degree=8, feat_dim=16, noise=2.0, seed=1,
                          train_frac=0.3)
    out = tmp_path_factory.mktemp("planted") / "planted"
    return write_graph_dataset(out, g.num_nodes, g.src, g.dst, g.features, g.labels,
                               {"train": g.train, "valid": g.valid, "test": g.test}, g.num_classes,
                               "planted", partition_offsets=contiguous_partitions(3000, 8))


def small_dataset(path: Path, num_nodes: int, src: list[int], dst: list[int], feat_dim: int = 3,
                  **kw: object) -> Path:
    """Write a tiny dataset with features ``x[v] = v`` (all columns) and labels ``v % 2``."""
    from ooc.ingest.convert import write_graph_dataset
    x = np.repeat(np.arange(num_nodes, dtype=np.float32)[:, None], feat_dim, axis=1)
    labels = (np.arange(num_nodes) % 2).astype(np.int32)
    return write_graph_dataset(path, num_nodes, np.array(src, dtype=np.int64),
                               np.array(dst, dtype=np.int64), x, labels,
                               {"train": np.arange(num_nodes)}, 2, "small", **kw)


def start_paused(args: list[str], env: dict[str, str], marker: Path, timeout: float = 120.0):
    """Start ``python -m ooc.tools.cli ARGS`` with ``env`` (a fault-point pause such as
    ``OOC_FAULT_PAUSE=<point>:<s>:<marker>``) and return the process once it has touched ``marker``,
    i.e. is paused at that point (ready for SIGKILL).  Fails if it exits or times out first."""
    import subprocess
    import sys
    import time
    proc = subprocess.Popen([sys.executable, "-m", "ooc.tools.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline, f"no pause within {timeout} s"
        time.sleep(0.05)
    return proc

