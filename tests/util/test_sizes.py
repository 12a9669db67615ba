"""One byte-size rule for every command: SI for kB/MB/GB, binary for KiB/MiB/GiB."""

from __future__ import annotations

import pytest

from ooc.util.sizes import format_bytes, parse_bytes


@pytest.mark.parametrize("text,value", [("4GB", 4 * 10**9), ("4gb", 4 * 10**9), ("4G", 4 * 10**9),
                                        ("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20),
                                        ("1.5kB", 1500), ("1.5KiB", 1536), ("123", 123), (123, 123),
                                        (" 7 MB ", 7 * 10**6), ("1TB", 10**12), ("1TiB", 2**40)])
def test_parse_bytes_si_and_binary(text: object, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["lots", "4XB", "", "1e3GB"])
def test_parse_bytes_refuses(bad: str) -> None:
    with pytest.raises(ValueError, match="cannot parse size"):
        parse_bytes(bad)


@pytest.mark.parametrize("bad", ["-1", "-16MB", " -1.5GiB", "-.5GB", -5])
def test_negative_sizes_are_refused_as_such(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^\S+ is not a size \(sizes are positive: 16MB, 1.5GiB\)$"):
        parse_bytes(bad)


def test_format_bytes_is_binary() -> None:
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(3 * 2**30) == "3.0 GiB"
    assert format_bytes(12) == "12 B"


def test_every_command_parses_budgets_the_same_way() -> None:
    """convert, generate, partition and train read --memory-budget with the one parser."""
    import inspect

    import ooc.data.budget
    import ooc.ingest.convert
    import ooc.ingest.generate
    import ooc.partition
    from ooc.util import sizes
    for mod in (ooc.ingest.convert, ooc.ingest.generate, ooc.partition):
        assert mod.parse_bytes is sizes.parse_bytes, mod.__name__
    assert "def parse_bytes" not in inspect.getsource(ooc.data.budget)
