"""Option kinds shared by the commands' parsers: byte sizes (``--memory-budget 4GB``).

Every size-valued option of every command is declared with ``action=SizeAction``: the value is
checked with the one size parser (:func:`ooc.util.sizes.parse_bytes`) while the command line is read,
and kept as given (the library parses it again where it is used). A bad size stops the command
before it does anything, with one line naming the option::

    ooc train: error: --memory-budget: -16MB is not a size (sizes are positive: 16MB, 1.5GiB)

:func:`size_options` lists these options so the command line can be prepared for argparse, which
would otherwise take a value such as ``-16MB`` for an option of its own (``expected one argument``).
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from ooc.util.sizes import parse_bytes

__all__ = ["SizeAction", "size_options"]


class SizeAction(argparse.Action):
    """``store`` for an option whose value is a byte size, checked with :func:`parse_bytes`.

    Args:
        empty: the empty string is accepted too (options where ``""`` means none, as
            ``--cache-size`` of ``ooc train``).
        auto: the word ``auto`` is accepted too (``--hot-topology auto``: chosen by the split).

    A value that is not a size exits with status 2 and one line, ``PROG: error: OPTION: why``.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, empty: bool = False,
                 auto: bool = False, **kwargs: Any) -> None:
        self.empty = empty
        self.auto = auto
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if not (self.empty and values == "") and not (self.auto and values == "auto"):
            try:
                parse_bytes(values)
            except ValueError as e:
                parser.exit(2, f"{parser.prog}: error: {option_string}: {e}\n")
        setattr(namespace, self.dest, values)


def size_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings declared with :class:`SizeAction` in ``parser`` and all its subcommands."""
    out: set[str] = set()
    for action in parser._actions:
        if isinstance(action, SizeAction):
            out.update(action.option_strings)
        elif isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= size_options(sub)
    return out
