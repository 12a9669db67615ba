"""The README's GitHub commands, verbatim: convert the featureless MUSAE graph, then train on it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np

from conftest import REPO, SHARED_DATA, shared_path
from ooc.storage.dataset import Dataset
from ooc.tools.cli import main


def readme_commands(marker: str) -> list[list[str]]:
    """The ``ooc`` commands of the README's bash block that mentions ``marker`` (continuations
    joined), each as argv without the program name."""
    text = (REPO / "README.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        if marker in block:
            joined = block.replace("\\\n", " ")
            return [shlex.split(line.split("#")[0])[1:] for line in joined.splitlines()
                    if line.strip().startswith(".venv/bin/ooc ")]
    raise AssertionError(f"no README bash block mentions {marker}")


def test_readme_github_commands_convert_and_train(tmp_path: Path) -> None:
    shared_path("github_social", "edges.csv")
    cmds = readme_commands("github_social/edges.csv")
    assert [c[0] for c in cmds] == ["convert", "train"]
    local = {"../shared/data": str(SHARED_DATA), "data/github": str(tmp_path / "github"),
             "runs/github-sage": str(tmp_path / "run")}
    for argv in cmds:
        argv = [next((a.replace(k, v, 1) for k, v in local.items() if a.startswith(k)), a) for a in argv]
        assert main(argv) == 0
    ds = Dataset(tmp_path / "github")
    assert ds.feat_dim == 64 and ds.num_nodes == 37700
    test = ds.split("test")
    majority = float(np.bincount(ds.labels[test]).max() / test.shape[0])
    acc = json.loads((tmp_path / "run" / "metrics.json").read_text())["test_acc"]
    assert round(majority, 3) == 0.742
    assert acc > majority + 0.05, (acc, majority)
    assert "0.742" in (REPO / "README.md").read_text()
