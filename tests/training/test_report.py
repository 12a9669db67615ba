"""`ooc report`: summary table values, PNGs that are not blank, repeat directories as groups."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ooc.training.report import load_runs, make_report, summary_table
from ooc.tools.cli import main


@pytest.fixture(scope="module")
def runs(planted_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    common = [str(planted_dataset), "--fanout", "5,5", "--batch-size", "128", "--epochs", "2",
              "--partitions", "8", "--hidden", "16", "--no-progress"]
    assert main(["train", *common, "--buffer-partitions", "1", "--output-dir", str(root / "b1")]) == 0
    assert main(["train", *common, "--buffer-partitions", "8", "--model", "gcn",
                 "--output-dir", str(root / "b8")]) == 0
    assert main(["train", *common, "--repeat", "2", "--model", "gin", "--output-dir", str(root / "rep")]) == 0
    return {"b1": root / "b1", "b8": root / "b8", "rep": root / "rep"}


def test_table_values(runs: dict[str, Path]) -> None:
    loaded = load_runs([runs["b1"], runs["b8"], runs["rep"]])
    assert [r.name for r in loaded] == ["b1", "b8", "rep"]
    assert loaded[2].is_group and len(loaded[2].members) == 2
    table = summary_table(loaded)
    lines = table.splitlines()
    assert len(lines) == 5 and lines[0].startswith("| run")
    m = json.loads((runs["b1"] / "metrics.json").read_text())
    row = lines[2]
    assert f"{100 * m['test_acc']:.2f}" in row and "sage/node" in row
    assert f"{m['buffer_hit_ratio']:.3f}" in row
    summ = json.loads((runs["rep"] / "summary.json").read_text())
    expect = f"{100 * np.mean(summ['test_acc']):.2f} ± {100 * np.std(summ['test_acc']):.2f}"
    assert expect in lines[4] and "rep (2 seeds)" in lines[4] and "gin/node" in lines[4]


def test_pngs_are_drawn(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import matplotlib.image as mpimg
    assert main(["report", str(runs["b1"]), str(runs["b8"]), str(runs["rep"]), "--out",
                 str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "| b8" in out and "wrote" in out
    for name in ("curves.png", "io.png"):
        img = mpimg.imread(tmp_path / "rep" / name)
        assert img.shape[0] > 400 and img.shape[1] > 1000
        assert float(img[..., :3].std()) > 0.05  # not a blank canvas
    assert (tmp_path / "rep" / "summary.md").read_text().startswith("| run")


def test_single_run_default_out_and_errors(runs: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    table, files = make_report([runs["b8"]], runs["b8"] / "report", plots=False)
    assert [f.name for f in files] == ["summary.md"]
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "no metrics.json" in capsys.readouterr().err
