"""JSON node features keyed by node id ({"id": [active feature ids]} or {"id": [values]})."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ooc.ingest.convert import GraphOptions, NodeInputs, convert_edgelist, convert_numpy
from ooc.ingest.nodetables import JsonFeatures
from ooc.ingest.readers import InputError
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main


@pytest.fixture
def ring(tmp_path: Path) -> Path:
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 2\n2 3\n3 0\n")
    return f


def _features(ds_path: Path) -> list[list[float]]:
    return Dataset(ds_path).features.read_all().tolist()


def test_active_feature_ids_any_key_order_missing_row_zero(ring: Path, tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"2": [4, 0],\n "0": [1],\n "3": [0, 1, 2, 3, 4]}')
    assert main(["convert", "edgelist", str(ring), "--features", str(tmp_path / "x.json"),
                 "--out", str(tmp_path / "ds")]) == 0
    assert _features(tmp_path / "ds") == [[0, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 1],
                                          [1, 1, 1, 1, 1]]
    ds = Dataset(tmp_path / "ds")
    assert ds.manifest["feature_source"] == {"kind": "json", "layout": "indices", "dim": 5,
                                             "rows": 3, "missing_rows": 1}
    assert ds.check_structure() == []


def test_dense_values_and_feat_dim(ring: Path, tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"0": [0.5, -1.25], "1": [0, 2], "2": [3.0, 0],
                                                 "3": [-0.125, 1e3]}))
    assert main(["convert", "edgelist", str(ring), "--features", str(tmp_path / "x.json"),
                 "--out", str(tmp_path / "ds")]) == 0
    assert _features(tmp_path / "ds") == [[0.5, -1.25], [0, 2], [3, 0], [-0.125, 1000]]
    (tmp_path / "i.json").write_text('{"0": [1], "1": [1, 2]}')
    assert main(["convert", "edgelist", str(ring), "--features", str(tmp_path / "i.json"),
                 "--feat-dim", "6", "--out", str(tmp_path / "wide")]) == 0
    assert _features(tmp_path / "wide")[1] == [0, 1, 1, 0, 0, 0]


def test_ambiguous_integer_lists_need_the_format(ring: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "x.json").write_text('{"0": [1, 0], "1": [0, 2], "2": [1, 2], "3": [0, 1]}')
    base = ["convert", "edgelist", str(ring), "--features", str(tmp_path / "x.json")]
    assert main(base + ["--out", str(tmp_path / "a")]) != 0
    assert "every feature list holds 2 integers without repeats: pass --feature-format" in \
        capsys.readouterr().err
    assert main(base + ["--feature-format", "dense", "--out", str(tmp_path / "d")]) == 0
    assert _features(tmp_path / "d") == [[1, 0], [0, 2], [1, 2], [0, 1]]
    assert main(base + ["--feature-format", "indices", "--out", str(tmp_path / "i")]) == 0
    assert _features(tmp_path / "i") == [[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 0]]


def test_features_keyed_by_sparse_external_ids(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_text("900000000000,17\n17,5\n")
    (tmp_path / "x.json").write_text('{"17": [0], "900000000000": [2], "123": [1, 2]}')
    ds = Dataset(convert_edgelist(tmp_path / "e.csv", tmp_path / "ds", GraphOptions(ids="map"),
                                  NodeInputs(features=tmp_path / "x.json")))
    # 5 < 17 < 123 < 9e11 -> 0..3; 123 is a node only through the feature table
    assert ds.num_nodes == 4
    assert ds.features.read_all().tolist() == [[0, 0, 0], [1, 0, 0], [0, 1, 1], [0, 0, 1]]
    with ds.id_map() as m:
        assert m.to_external([2]) == [123]


def test_features_keyed_by_string_ids(tmp_path: Path) -> None:
    (tmp_path / "e.tsv").write_text("alice\tbob\nbob\tcarol\n")
    (tmp_path / "x.json").write_text('{"carol": [0.25, 1], "alice": [2, 0.5], "dave": [1, 1.5]}')
    ds = Dataset(convert_edgelist(tmp_path / "e.tsv", tmp_path / "ds", GraphOptions(ids="string"),
                                  NodeInputs(features=tmp_path / "x.json")))
    assert ds.features.read_all().tolist() == [[2, 0.5], [0, 0], [0.25, 1], [1, 1.5]]  # a b c d


def test_numpy_edges_with_json_features(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1], [1, 2], [2, 0]]))
    (tmp_path / "x.json").write_text('{"1": [3], "4": [0, 2]}')  # node 4: isolated, in the table only
    # a table naming a node the edges do not is an error unless --num-nodes declares it
    with pytest.raises(InputError, match="x.json: features for node 4, but the edges name nodes 0..2"):
        convert_numpy(tmp_path / "e.npy", tmp_path / "bad", nodes=NodeInputs(features=tmp_path / "x.json"))
    assert not (tmp_path / "bad").exists()
    ds = Dataset(convert_numpy(tmp_path / "e.npy", tmp_path / "ds", GraphOptions(num_nodes=5),
                               nodes=NodeInputs(features=tmp_path / "x.json")))
    assert ds.num_nodes == 5
    assert ds.features.read_all().tolist() == [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0],
                                               [0, 0, 0, 0], [1, 0, 1, 0]]


@pytest.mark.parametrize("text, message", [
    ('{"0": [1],\n "1": [2,, 3]}', "x.json:2: malformed JSON"),
    ('{"0": [1],\n "0": [2, 3]}', "x.json:2: node '0' has a second feature row"),
    ('{"0": [1.5, 2],\n "1": [2]}', "x.json:2: 1 feature values, but the first entry (line 1) has 2"),
    ('{"0": 1}', "x.json:1: node '0': expected a list of numbers, found int"),
    ('{"0": [1, "a"]}', "x.json:1: node '0': feature list holds 'a' (numbers only)"),
    ('{"0": [1],\n "x": [1, 2]}', "x.json:2: node id: 'x' is not an integer id"),
    ('{"0": [1],\n "9": [1, 2]}', "x.json:2: node id 9 >= node count 4"),
    ('[1, 2]', "x.json:1: expected a JSON object"),
])
def test_bad_json_names_file_and_line(ring: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                      text: str, message: str) -> None:
    (tmp_path / "x.json").write_text(text)
    assert main(["convert", "edgelist", str(ring), "--features", str(tmp_path / "x.json"),
                 "--num-nodes", "4", "--out", str(tmp_path / "ds")]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()


def test_entries_split_across_read_blocks_match_json_load(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    obj = {str(k): sorted(rng.choice(50, rng.integers(0, 6), replace=False).tolist()) for k in range(300)}
    text = json.dumps(obj, indent=1)
    (tmp_path / "x.json").write_text(text)
    t = JsonFeatures(tmp_path / "x.json", block_chars=7)
    keys = [k for ks, _ in t.scan() for k in ks]
    assert keys == list(obj) and t.format == "indices" and t.dim == 50
    got: dict[str, list[int]] = {k: [] for k in keys}
    for ks, lines, row, cols, _ in t.entries(block_values=64):
        for r, c in zip(row.tolist(), cols.tolist()):
            got[ks[r]].append(c)
        assert all(text.splitlines()[L - 1].lstrip().startswith(f'"{k}"') for k, L in zip(ks, lines))
    assert got == obj


def test_many_buckets_equal_one_bucket(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 3000
    np.save(tmp_path / "e.npy", np.stack([np.arange(n), (np.arange(n) + 1) % n]))
    x = {str(k): rng.choice(40, rng.integers(1, 6), replace=False).tolist() for k in rng.permutation(n)}
    (tmp_path / "x.json").write_text(json.dumps(x))
    want = np.zeros((n, 40), dtype=np.float32)
    for k, v in x.items():
        want[int(k), v] = 1
    small = convert_numpy(tmp_path / "e.npy", tmp_path / "s",
                          GraphOptions(memory_budget=300_000, chunk_edges=4000),
                          NodeInputs(features=tmp_path / "x.json"))
    assert np.array_equal(Dataset(small).features.read_all(), want)
