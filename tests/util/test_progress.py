"""ooc.util.progress: frames on a terminal, plain lines (never "\\r") in a file."""

from __future__ import annotations

import io

from ooc.util.progress import progress

FMT = "{desc}: {n_fmt}/{total_fmt}"


def test_file_gets_one_line_per_update_when_interval_is_zero() -> None:
    log = io.StringIO()
    with progress(total=3, desc="rows", file=log, interval=0, bar_format=FMT) as bar:
        for _ in range(3):
            bar.update(1)
    assert log.getvalue() == "rows: 0/3\nrows: 1/3\nrows: 2/3\nrows: 3/3\n"


def test_file_gets_start_and_end_lines_within_one_interval() -> None:
    log = io.StringIO()
    for _ in progress(range(1000), desc="edges", file=log, interval=3600, bar_format=FMT):
        pass
    assert log.getvalue() == "edges: 0/1000\nedges: 1000/1000\n"


def test_disabled_bar_writes_nothing() -> None:
    log = io.StringIO()
    with progress(total=2, file=log, enabled=False) as bar:
        bar.update(2)
    assert log.getvalue() == ""


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_gets_tqdm_frames() -> None:
    tty = _Tty()
    with progress(total=2, desc="build", file=tty, bar_format=FMT, mininterval=0) as bar:
        bar.update(2)
    assert tty.getvalue().startswith("\rbuild: 0/2") and "\rbuild: 2/2" in tty.getvalue()
