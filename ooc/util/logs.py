"""Log records as plain command-line messages (``ooc train: warning: ...``), the wording of the
CLI's errors; used by the commands and by the ranks of a data-parallel job."""

from __future__ import annotations

import logging

__all__ = ["PlainFormatter"]


class PlainFormatter(logging.Formatter):
    """Formats a record as ``PREFIX: LEVEL: MESSAGE`` (level in lower case), e.g.
    ``PlainFormatter("ooc train")`` -> ``ooc train: warning: ...``."""

    def __init__(self, prefix: str) -> None:
        super().__init__("%(message)s")
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        return f"{self.prefix}: {record.levelname.lower()}: {super().format(record)}"
