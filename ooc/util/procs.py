"""Process checks (stale partial datasets, shared segments and locks of dead processes)."""

from __future__ import annotations

import os

__all__ = ["pid_alive", "leftover_pid", "remove_dead_leftovers", "LEFTOVER_TAGS"]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (``pid <= 0``: not registered yet, counted as alive)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Tags of the hidden temporary siblings ooc writes: ``.NAME.partial-PID-XXXX`` (a dataset or
#: array group being built), ``.NAME.old-PID[-XXXX]`` (the replaced one, being removed) and
#: ``.NAME.tmp-PID`` (a file written atomically).
LEFTOVER_TAGS = ("partial", "old", "tmp")


def leftover_pid(name: str, tags: tuple[str, ...] = LEFTOVER_TAGS) -> int | None:
    """The pid in a leftover's name ``.NAME.TAG-PID[-XXXX]`` (None: not such a name)."""
    if not name.startswith("."):
        return None
    for tag in tags:
        marker = f".{tag}-"
        if marker in name:
            rest = name.rsplit(marker, 1)[1]
            head = rest.split("-", 1)[0]
            if head.isdigit():
                return int(head)
    return None


def remove_dead_leftovers(folder: str | os.PathLike, name: str | None = None,
                          tags: tuple[str, ...] = LEFTOVER_TAGS) -> list[str]:
    """Remove the temporary siblings (see :data:`LEFTOVER_TAGS`) in ``folder`` whose writing
    process is dead; with ``name``, only those of ``.NAME.*``.  Leftovers of live processes (a
    writer at work) are kept.  Returns the removed paths.
    """
    import shutil
    from pathlib import Path
    root = Path(folder)
    removed: list[str] = []
    if not root.is_dir():
        return removed
    pattern = f".{name}.*" if name is not None else ".*"
    for p in root.glob(pattern):
        pid = leftover_pid(p.name, tags)
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(str(p))
        except FileNotFoundError:
            pass
        except OSError:
            continue
    return removed
