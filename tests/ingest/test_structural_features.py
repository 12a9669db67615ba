"""--features structural[:D]: log-degree and a random projection of the adjacency, streamed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ooc.ingest.structural import parse_structural, structural_feature_rows
from ooc.kernels.rng import batch_key, mix_key_py
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main

EDGES = [(0, 1), (0, 2), (1, 2), (2, 3), (4, 3), (5, 5)]  # node 6 isolated (declared N = 7)


def _reference(n: int, edges: list[tuple[int, int]], dim: int, seed: int = 0) -> np.ndarray:
    """The definition, in plain Python: [log(1+deg), deg^-1/2 * sum of the in-neighbours' signs]."""
    key = int(batch_key(seed, 0, 0, stream=0x57C))
    k = dim - 1
    words = (k + 63) // 64
    nbrs: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:  # undirected, deduplicated: both directions, self-loop once
        nbrs[v].append(u)
        if u != v:
            nbrs[u].append(v)
    out = np.zeros((n, dim))
    for v in range(n):
        out[v, 0] = np.log1p(len(nbrs[v]))
        for u in nbrs[v]:
            for j in range(k):
                bit = (mix_key_py(key, u * words + j // 64) >> (j % 64)) & 1
                out[v, 1 + j] += 1.0 if bit else -1.0
        if nbrs[v]:
            out[v, 1:] /= np.sqrt(len(nbrs[v]))
    return out


@pytest.mark.parametrize("dim", [1, 5, 70])
def test_structural_features_match_the_definition(tmp_path: Path, dim: int) -> None:
    (tmp_path / "e.txt").write_text("".join(f"{u} {v}\n" for u, v in EDGES))
    assert main(["convert", "edgelist", str(tmp_path / "e.txt"), "--undirected", "--num-nodes", "7",
                 "--features", f"structural:{dim}", "--out", str(tmp_path / "ds")]) == 0
    ds = Dataset(tmp_path / "ds")
    x = ds.features.read_all()
    assert x.shape == (7, dim) and x.dtype == np.float32
    np.testing.assert_allclose(x, _reference(7, EDGES, dim), rtol=1e-6, atol=1e-6)
    assert x[6].tolist() == [0.0] * dim
    assert ds.manifest["feature_source"]["kind"] == "structural"
    # the same rows whatever the block size
    blocks = list(structural_feature_rows(tmp_path / "ds" / "arrays.zarr", 7, dim, block_edges=2))
    assert len(blocks) > 1
    assert np.array_equal(np.concatenate([b for _, b in blocks]), x)


def test_default_width_and_bad_spec() -> None:
    assert parse_structural("structural") == 64
    assert parse_structural("structural:16") == 16
    assert parse_structural("x.npy") is None
    with pytest.raises(ValueError, match="structural:D takes a width D >= 1"):
        parse_structural("structural:0")
