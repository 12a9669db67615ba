"""Size-valued options: every one of every command checks its value while the command line is read,
and a negative size given as a separate argument (``--memory-budget -16MB``) is refused by name."""

from __future__ import annotations

import argparse

import pytest

from ooc.tools.cli import build_parser, main
from ooc.tools.options import SizeAction, size_options


def _size_options_by_command(parser: argparse.ArgumentParser,
                             path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """``(subcommand path, option)`` of every :class:`SizeAction` option in the parser tree."""
    out = []
    for action in parser._actions:
        if isinstance(action, SizeAction):
            out.append((path, action.option_strings[0]))
        elif isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _size_options_by_command(sub, (*path, name))
    return out


def test_every_size_option_is_declared() -> None:
    found = _size_options_by_command(build_parser())
    commands = {(" ".join(c), o) for c, o in found}
    for want in [("train", "--memory-budget"), ("train", "--cache-size"), ("train", "--hot-topology"),
                 ("train", "--device-cache"), ("partition", "--memory-budget"),
                 ("convert edgelist", "--memory-budget"), ("convert numpy", "--memory-budget"),
                 ("convert ogb", "--memory-budget"), ("generate rmat", "--memory-budget"),
                 ("bench convert", "--memory-budget"), ("bench scale", "--gen-budget")]:
        assert want in commands, want
    assert size_options(build_parser()) == {o for _, o in found}


@pytest.mark.parametrize("form", ["space", "equals"])
def test_a_negative_size_is_one_line_naming_the_option(capsys: pytest.CaptureFixture, form: str) -> None:
    """Every size option of every command: exit status 2 and one line, before anything runs."""
    for command, opt in _size_options_by_command(build_parser()):
        argv = [*command, opt, "-16MB"] if form == "space" else [*command, f"{opt}=-16MB"]
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert err == (f"ooc {' '.join(command)}: error: {opt}: -16MB is not a size (sizes are "
                       "positive: 16MB, 1.5GiB)\n"), argv


def test_sizes_are_kept_as_given_and_empty_means_none() -> None:
    parser = build_parser()
    args = parser.parse_args(["train", "DS", "--memory-budget", "1.5GiB", "--cache-size", ""])
    assert args.memory_budget == "1.5GiB" and args.cache_size == ""
    with pytest.raises(SystemExit):
        parser.parse_args(["partition", "DS", "--memory-budget", ""])  # no "none" there
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "DS", "--memory-budget", "lots"])


def test_negative_fanouts_still_mean_all_neighbours() -> None:
    from ooc.tools.cli import _join_dash_values
    assert _join_dash_values(["train", "--fanout", "-1,-1", "--memory-budget", "-1GB", "--seed", "-3"],
                             {"--memory-budget"}) == ["train", "--fanout=-1,-1", "--memory-budget=-1GB",
                                                      "--seed", "-3"]


@pytest.mark.parametrize("argv, flag", [(["--fanout", "0,x"], "--fanout"),
                                        (["--eval-fanout", "5,y"], "--eval-fanout"),
                                        (["--fanout", "10,"], "--fanout")])
def test_a_bad_list_value_names_the_flag_typed(tmp_path, capsys: pytest.CaptureFixture,
                                               argv: list, flag: str) -> None:
    assert main(["train", str(tmp_path / "none"), *argv, "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"error: command line: {flag}: fanouts must be comma-separated integers" in err, err


@pytest.mark.parametrize("argv, flag", [(["--lr", "-1"], "--lr"), (["--lr", "-0.5"], "--lr"),
                                        (["--lr", "nan"], "--lr"),
                                        (["--weight-decay", "-0.1"], "--weight-decay")])
def test_a_bad_learning_rate_or_decay_names_the_flag(planted_dataset, tmp_path,
                                                     capsys: pytest.CaptureFixture,
                                                     argv: list, flag: str) -> None:
    assert main(["train", str(planted_dataset), *argv, "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ooc train: error: {flag} (") and "must be" in err, err
    assert not (tmp_path / "o").exists()


def test_resume_names_a_missing_run_or_one_without_config(tmp_path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--resume", str(tmp_path / "gone")]) == 2
    assert f"--resume {tmp_path / 'gone'}: no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["train", "--resume", str(tmp_path / "empty")]) == 2
    assert "not a run directory (it has no config.yaml)" in capsys.readouterr().err
