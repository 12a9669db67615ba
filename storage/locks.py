"""Locks on datasets and run directories: readers share, writers exclude, holders are named.

A path ``DIR/NAME`` (a dataset or a run directory) is locked through the sibling file
``DIR/.NAME.lock``, so the lock outlives a rename of the directory itself (``convert --overwrite``
renames a new dataset over the old one) and exists before the directory does (two ``convert`` to
one ``--out``).  The lock is a POSIX record lock (``fcntl`` ``F_SETLK`` on the whole file):

- readers (``train``, ``eval``, ``predict``) take it shared; writers (``convert --overwrite``,
  ``partition`` in place, ``compress``) and the process writing a run directory take it exclusive;
- a conflicting command fails at once with :class:`LockError` naming the holder -- its pid, from
  ``F_GETLK``, and its command line, from ``/proc/PID/cmdline`` -- or, with ``wait=True``
  (``--wait``), blocks until the holder is gone;
- the kernel drops a process's record locks when it exits, however it exits (``kill -9`` too), so a
  lock of a dead process is taken over at once: there is nothing stale to clean up.  The last
  holder removes the (empty) ``.lock`` file while it still holds it exclusively; a process that
  opened the file before that notices after locking (the path names another inode, or none) and
  locks the new file, so two holders never lock different files.  A process killed with the lock
  leaves the empty file, which the next holder reuses and removes.

Record locks belong to the process, not to the file descriptor: a process that closed any other
descriptor of a lock file would lose its lock, so this module keeps one descriptor per lock file
and counts the holds on it (:class:`PathLock` objects of the same path share it).  Locks do not
conflict within one process.

File systems: local file systems (ext4, xfs, btrfs, tmpfs) implement record locks exactly.  On NFS
(v3 with ``lockd``, v4) the locks are forwarded to the server and exclude processes on other
clients too, but the holder's pid reported by ``F_GETLK`` is a pid on another machine (or 0), and
a client that dies keeps its lock until the server's lease expires (v4: about 90 s).  Mounts with
``nolock`` / ``local_lock`` lock only within one client.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
from pathlib import Path

__all__ = ["LockError", "PathLock", "lock_path", "holder_of", "describe_pid", "set_lock_wait"]

# struct flock on Linux (x86_64, aarch64): short l_type, short l_whence, off_t l_start, off_t l_len,
# pid_t l_pid, padded to 32 bytes
_FLOCK = "hhqqi4x"


_WAIT = False


def set_lock_wait(wait: bool) -> None:
    """Process default of :class:`PathLock`'s ``wait`` (the ``--wait`` flag of the CLI)."""
    global _WAIT
    _WAIT = bool(wait)


class LockError(OSError):
    """A dataset or run directory is locked by another process (the message names it)."""


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of ``path``: ``DIR/.NAME.lock`` beside it (``path`` made absolute)."""
    p = Path(os.path.abspath(path))
    return p.parent / f".{p.name}.lock"


def describe_pid(pid: int) -> str:
    """``pid 1234 (ooc train data/cora ...)``: the pid and its command line where /proc shows it."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cmd = " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    except OSError:
        cmd = ""
    if len(cmd) > 200:
        cmd = cmd[:197] + "..."
    return f"pid {pid} ({cmd})" if cmd else f"pid {pid}"


def holder_of(fd: int, exclusive: bool) -> int | None:
    """The pid of a process holding a lock on ``fd``'s file that conflicts with a shared
    (``exclusive=False``) or exclusive request, or None (``F_GETLK``; 0 on NFS: remote holder)."""
    want = fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK
    res = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(_FLOCK, want, os.SEEK_SET, 0, 0, 0))
    l_type, _w, _s, _l, pid = struct.unpack(_FLOCK, res)
    return None if l_type == fcntl.F_UNLCK else int(pid)


class _Shared:
    """One descriptor of a lock file in this process and the holds taken through it."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.shared = 0
        self.exclusive = 0

    def current(self) -> bool:
        """Whether the descriptor's file is still the one at the path (a holder that was the last
        removes the file; a process that opened it before then must lock the new one)."""
        try:
            a, b = os.fstat(self.fd), os.stat(self.file)
        except FileNotFoundError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def reopen(self) -> None:
        os.close(self.fd)
        self.fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


_REGISTRY: dict[Path, _Shared] = {}
_REG_LOCK = threading.Lock()


class PathLock:
    """A shared or exclusive lock on a dataset or run directory (see the module docstring).

    Use as a context manager, or :meth:`acquire` / :meth:`release`::

        with PathLock("data/cora", exclusive=True, what="dataset", purpose="partition in place"):
            ...

    Args:
        path: the dataset or run directory (need not exist yet; its parent is created).
        exclusive: writer (True) or reader (False).
        wait: block until the conflicting holder is gone instead of failing (None: the process
            default, :func:`set_lock_wait`).
        what: ``"dataset"`` or ``"run directory"`` (for the message).
        purpose: what this process wants to do (for the message), e.g. ``"write"``.

    Raises (from :meth:`acquire`):
        LockError: another process holds a conflicting lock and ``wait`` is false; the message
            names its pid and command line.
        OSError: the lock file cannot be created (read-only folder).
    """

    def __init__(self, path: str | os.PathLike, exclusive: bool, wait: bool | None = None,
                 what: str = "dataset", purpose: str = "") -> None:
        self.path = Path(os.path.abspath(path))
        self.file = lock_path(self.path)
        self.exclusive = exclusive
        self.wait = _WAIT if wait is None else wait
        self.what = what
        self.purpose = purpose or ("write" if exclusive else "read")
        self._held = False

    def acquire(self) -> "PathLock":
        """Take the lock (see the class docstring); returns self."""
        if self._held:
            return self
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with _REG_LOCK:
            sh = _REGISTRY.get(self.file)
            if sh is None:
                sh = _REGISTRY[self.file] = _Shared(self.file)
            # the strongest hold this process needs on the file after this one
            want_excl = self.exclusive or sh.exclusive > 0
            need_change = (self.exclusive and sh.exclusive == 0) or (sh.shared + sh.exclusive == 0)
            if need_change:
                try:
                    self._lock_fd(sh, want_excl)
                except BaseException:
                    if sh.shared + sh.exclusive == 0:
                        os.close(sh.fd)
                        del _REGISTRY[self.file]
                    raise
            if self.exclusive:
                sh.exclusive += 1
            else:
                sh.shared += 1
        self._held = True
        return self

    def _lock_fd(self, sh: "_Shared", exclusive: bool) -> None:
        kind = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        announced = False
        while True:
            try:
                fcntl.lockf(sh.fd, kind | fcntl.LOCK_NB)
                if sh.current():
                    return
                sh.reopen()  # the file was removed by its last holder: lock the new one
                continue
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    raise OSError(e.errno, f"{self.file}: cannot lock {self.what} {self.path}: "
                                           f"{e.strerror}") from None
            pid = holder_of(sh.fd, exclusive)
            who = describe_pid(pid) if pid else "another process (on another machine?)"
            if not self.wait:
                raise LockError(f"{self.path}: cannot {self.purpose} this {self.what}: it is in use by "
                                f"{who} (lock {self.file}). Wait for that to finish, or pass --wait "
                                "to wait for it")
            if not announced:
                import sys
                print(f"ooc: waiting for {who} to release {self.what} {self.path}", file=sys.stderr)
                announced = True
            time.sleep(0.2)  # polling keeps SIGINT/SIGTERM handling prompt (F_SETLKW would block)

    def release(self) -> None:
        """Drop this hold (the file lock goes when the process's last hold on it goes)."""
        if not self._held:
            return
        self._held = False
        with _REG_LOCK:
            sh = _REGISTRY.get(self.file)
            if sh is None:
                return
            if self.exclusive:
                sh.exclusive -= 1
            else:
                sh.shared -= 1
            if sh.shared + sh.exclusive == 0:
                try:  # nobody else holds it: remove the file while still holding it exclusively
                    fcntl.lockf(sh.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    if sh.current():
                        os.unlink(self.file)
                except OSError:
                    pass
                os.close(sh.fd)  # drops the lock
                del _REGISTRY[self.file]
            elif self.exclusive and sh.exclusive == 0:
                fcntl.lockf(sh.fd, fcntl.LOCK_SH)  # back to the readers' lock (never blocks)

    @property
    def held(self) -> bool:
        return self._held

    def __enter__(self) -> "PathLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
