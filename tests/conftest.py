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


def ogb_folder(root: Path, num_nodes: int = 600, num_classes: int = 2, features: bool = False,
               seed: int = 0) -> Path:
    """Write an OGB node-property raw folder (the layout ``ooc convert ogb`` reads) of a planted
    two-community graph: ``raw/edge.csv.gz`` (each undirected edge once), ``num-node-list``,
    ``node-label``, ``node-feat`` (8 noisy class-centroid columns, only with ``features``) and
    ``split/random/{train,valid,test}.csv.gz`` (50 / 20 / 30 % of the nodes).  Name ``root``
    after a real OGB dataset (``ogbn_arxiv``) for OGB's Evaluator to accept it."""
    import gzip
    from ooc.kernels.generators import planted_partition
    g = planted_partition(num_nodes, num_classes=num_classes, avg_degree=8, p_intra=0.9, feat_dim=8,
                          noise=3.0, seed=seed, train_frac=0.5, valid_frac=0.2, test_frac=0.3)

    def write(path: Path, lines: list[str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.write("".join(line + "\n" for line in lines))

    write(root / "raw" / "edge.csv.gz", [f"{a},{b}" for a, b in zip(g.src, g.dst)])
    write(root / "raw" / "num-node-list.csv.gz", [str(num_nodes)])
    write(root / "raw" / "node-label.csv.gz", [str(int(v)) for v in g.labels])
    if features:
        write(root / "raw" / "node-feat.csv.gz", [",".join(f"{v:.5f}" for v in r) for r in g.features])
    for name, ids in (("train", g.train), ("valid", g.valid), ("test", g.test)):
        write(root / "split" / "random" / f"{name}.csv.gz", [str(int(i)) for i in ids])
    return root


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

