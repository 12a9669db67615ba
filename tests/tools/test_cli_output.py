"""What the CLI writes outside training: first-run notice, quiet broken pipes, progress lines in logs,
`ooc info` on damaged metadata, `ooc verify`'s problem lines, warnings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import small_dataset
from ooc.tools.cli import main

CLI = [sys.executable, "-m", "ooc.tools.cli"]


def test_info_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    ds = small_dataset(tmp_path / "ds", 4, [0, 1, 2], [1, 2, 3])
    p = subprocess.Popen([*CLI, "info", str(ds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader leaves before ooc writes (like `ooc info DS | head -0`)
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141
    assert err == ""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_during_the_interpreters_exit_keeps_the_commands_status(tmp_path: Path,
                                                                         sig: str) -> None:
    """A signal that arrives after the command finished (here: from an atexit hook, while the
    interpreter tears down) ends the console script with the command's own status (0) and its
    output intact, not with 128 + signum: the work was done and committed."""
    ds = small_dataset(tmp_path / "ds", 4, [0, 1, 2], [1, 2, 3])
    code = ("import atexit, os, signal, sys\n"
            f"atexit.register(lambda: os.kill(os.getpid(), signal.{sig}))\n"
            f"sys.argv = ['ooc', 'info', {str(ds)!r}]\n"
            "from ooc.tools.cli import main\n"
            "sys.exit(main())\n")
    env = {**os.environ, "OOC_HUGEPAGES": "0"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "nodes" in r.stdout and r.stderr == ""


def test_first_run_notice_only_while_the_cache_is_cold(tmp_path: Path) -> None:
    code = ("from ooc.util.jit import first_run_notice\n"
            "import numpy as np\n"
            "from ooc.kernels.graph import count_into\n"
            "k = ['ooc.kernels.graph:count_into']\n"
            "print(first_run_notice(k, 12))\n"
            "count_into(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64))\n"
            "print(first_run_notice(k, 12))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "True\nFalse\n"
    assert r.stderr == "compiling kernels, first run only, ~12 s\n"


def test_a_warm_kernel_compiling_for_new_types_is_announced_once(tmp_path: Path) -> None:
    """The cache holds a version per argument types: a warm kernel called with int32 arrays still
    compiles, and the user is told when it starts (once per process)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    warm = ("import numpy as np\nfrom ooc.kernels.graph import count_into\n"
            "count_into(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64))\n")
    assert subprocess.run([sys.executable, "-c", warm], env=env, timeout=300).returncode == 0
    code = ("from ooc.util.jit import first_run_notice\n"
            "import numpy as np\nfrom ooc.kernels.graph import count_into\n"
            "print(first_run_notice(['ooc.kernels.graph:count_into'], 12))\n"
            "count_into(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64))\n"
            "print('int64 done', flush=True)\n"
            "count_into(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int32))\n"
            "count_into(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int16))\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout
    assert r.stdout == ("False\nint64 done\n"  # the cached version loads silently
                        "compiling kernels for new argument types, first time only\n")


def test_convert_progress_into_a_log_file_is_lines(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_text("0 1\n1 2\n2 0\n")
    env = {**os.environ, "OOC_PROGRESS_INTERVAL": "0"}
    r = subprocess.run([*CLI, "convert", "edgelist", str(tmp_path / "e.txt"), "--out", str(tmp_path / "ds"),
                        "--progress"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("count:")]
    assert lines[0].startswith("count:   0%") and lines[-1].startswith("count: 100%")


@pytest.mark.parametrize("damage", ["truncated", "not json", "missing"])
@pytest.mark.parametrize("array", ["nodes/labels", "nodes/features", "topology/indptr"])
def test_info_refuses_damaged_array_metadata(tmp_path: Path, capsys: pytest.CaptureFixture, array: str,
                                             damage: str) -> None:
    """Metadata of an array info does not otherwise read: one line naming the file, status 2."""
    ds = small_dataset(tmp_path / "ds", 4, [0, 1, 2], [1, 2, 3])
    meta = ds / "arrays.zarr" / array / "zarr.json"
    if damage == "missing":
        meta.unlink()
    else:
        meta.write_text(meta.read_text()[:50] if damage == "truncated" else "{not json")
    for json_out in ([], ["--json"]):
        assert main(["info", str(ds), *json_out]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert err.startswith("ooc info: error: ") and str(meta) in err
        assert ("Zarr array metadata missing" if damage == "missing" else "not valid JSON") in err
        assert f"`ooc verify {ds}` lists every problem" in err


def test_verify_problem_lines_share_the_error_prefix(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Structure and checksum problems alike: ``ooc verify: error: DATASET: ...``, status 1; a
    dataset that cannot be checked at all: the CLI's one-line error, status 2; sound: 0."""
    ds = small_dataset(tmp_path / "ds", 4, [0, 1, 2], [1, 2, 3])
    assert main(["verify", str(ds)]) == 0
    assert capsys.readouterr().out == f"OK {ds}: structure and checksums verified\n"
    chunk = ds / "arrays.zarr/topology/indices/c/0"
    raw = bytearray(chunk.read_bytes())
    raw[0] = 9  # node id 9 of 4: a structural problem and a checksum failure
    chunk.write_bytes(bytes(raw))
    assert main(["verify", str(ds)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(ln.startswith(f"ooc verify: error: {ds}: ") for ln in lines), lines
    assert "outside [0, 4)" in lines[0] and "fails its checksum" in lines[1]
    assert main(["verify", str(ds), "--structure-only"]) == 1
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert main(["verify", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"ooc verify: error: {tmp_path / 'none'}: no such dataset directory\n"


@pytest.mark.parametrize("verbose", [False, True])
def test_warnings_read_like_the_cli_errors(verbose: bool) -> None:
    """Every command's warnings: ``ooc COMMAND: warning: ...``; ``-v``: timestamped records of every level."""
    code = ("import logging\n"
            "from ooc.tools.cli import _setup_logging\n"
            f"_setup_logging('train', {verbose})\n"
            "logging.getLogger('ooc.data').warning('%s holds 4 stored partitions', 'DS')\n"
            "logging.getLogger('ooc.data').info('planned')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    if verbose:
        lines = r.stderr.splitlines()
        assert len(lines) == 2 and lines[0].endswith(" ooc.data WARNING DS holds 4 stored partitions")
        assert lines[1].endswith(" ooc.data INFO planned")
    else:
        assert r.stderr == "ooc train: warning: DS holds 4 stored partitions\n"


def test_a_train_option_error_is_two_lines(capsys: pytest.CaptureFixture) -> None:
    """A bad ``ooc train`` option prints a one-line usage and the error (the full usage listed
    every option: ~55 lines before the one that matters), exit 2."""
    with pytest.raises(SystemExit) as e:
        main(["train", "DS", "--hybrid-mix", "abc"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 2, err
    assert err.splitlines()[1] == "ooc train: error: argument --hybrid-mix: invalid float value: 'abc'"
