"""Run directories: one writer at a time, no run overwritten by accident, the dataset verified.

:class:`RunGuard` is what a training run holds while it runs (``ooc train`` wraps
:func:`ooc.training.loop.train` in it through :func:`guarded`):

- the run directory's exclusive lock (:class:`~ooc.storage.locks.PathLock`): a second
  ``ooc train`` into the same ``--output-dir``, or ``ooc eval`` of a run still training, fails at
  once naming the holder (or waits, with ``--wait``);
- a new run refuses a directory that holds another run (``config.yaml``, ``metrics.json``,
  ``checkpoint.pt``, ...) unless ``--overwrite`` (the old run's files are removed first; other
  files are kept) or ``--resume``;
- ``.NAME.tmp-PID`` files of dead processes in the run directory are removed;
- the dataset is opened with :func:`~ooc.storage.access.open_for_read`: shared lock, leftovers of
  dead writers removed, structural scans, chunk checksums on first use (``--verify``).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from ooc.storage.access import ReadAccess, open_for_read, verifying
from ooc.storage.verify import read_verification, set_read_verification
from ooc.storage.locks import PathLock
from ooc.util.procs import remove_dead_leftovers
from ooc.util.files import remove_made_dirs

__all__ = ["RunGuard", "guarded", "RUN_FILES", "holds_run", "set_run_control", "run_control", "run_lock",
           "guard_inference"]

#: What a run directory holds (``ooc train``, ``ooc eval``): its presence marks a run.
RUN_FILES = ("config.yaml", "config.json", "metrics.json", "metrics.jsonl", "steps.jsonl",
             "checkpoint.pt", "checkpoint.prev.pt", "model.pt", "eval.json", "summary.json")

F = TypeVar("F", bound=Callable[..., Any])


def set_run_control(cfg: Any, overwrite: bool = False, wait: bool = False) -> Any:
    """Attach the run-control flags ``--overwrite`` / ``--wait`` to a configuration (they are not
    configuration fields: they say how to treat what is already there, and are never saved with
    the run).  Returns ``cfg``."""
    cfg.__dict__["_run_control"] = {"overwrite": bool(overwrite), "wait": bool(wait)}
    return cfg


def run_control(cfg: Any) -> dict:
    """The run-control flags attached by :func:`set_run_control` (``{"overwrite", "wait"}``; the
    defaults where none were), e.g. to hand them to the ranks of a data-parallel job."""
    return dict(cfg.__dict__.get("_run_control", {"overwrite": False, "wait": None}))



def holds_run(path: Path) -> list[str]:
    """The run files (:data:`RUN_FILES`) present in ``path``."""
    return [f for f in RUN_FILES if (path / f).exists()]


def run_lock(path: str | os.PathLike, exclusive: bool, wait: bool | None = None,
             purpose: str = "write") -> PathLock:
    """The (acquired) lock of run directory ``path``."""
    return PathLock(path, exclusive=exclusive, wait=wait, what="run directory",
                    purpose=purpose).acquire()


class RunGuard:
    """Locks, checks and cleans for one training run (see the module docstring).

    Args:
        cfg: the run's configuration (``output_dir``, ``dataset``, ``verify``; run control from
            :func:`set_run_control`).
        resume: the run continues ``output_dir``'s checkpoint (an existing run is expected).
        dist: the rank's ``DistContext`` in a data-parallel job (its ``run_dir`` is locked; only
            rank 0 checks for another run).

    Raises (from ``__enter__``):
        FileExistsError: a new run into a directory holding another run without ``--overwrite``,
            or ``--output-dir`` is a file.
        LockError: another process writes the run directory or writes the dataset.
        DatasetError: the dataset fails its structural checks.
    """

    def __init__(self, cfg: Any, resume: bool = False, dist: Any = None) -> None:
        self.cfg = cfg
        self.resume = resume
        self.dist = dist
        self._lock: PathLock | None = None
        self._data: ReadAccess | None = None
        self._mode: str | None = None
        self._out = Path()
        self._made: list[Path] = []

    def __enter__(self) -> "RunGuard":
        ctl = run_control(self.cfg)
        out = Path(self.cfg.output_dir) if self.dist is None else \
            Path(self.dist.run_dir(self.cfg.output_dir))
        if out.exists() and not out.is_dir():
            raise FileExistsError(f"{out}: --output-dir is a file, not a run directory")
        for p in Path(out).absolute().parents:  # the nearest existing folder must be one
            if p.exists():
                if not p.is_dir():
                    raise FileExistsError(f"{out}: --output-dir lies under {p}, which is a file")
                break
        self._out = out
        # the folders made for the run (its lock file's parents): removed again, as far as they
        # are empty, when the run fails before it has anything to keep (see ``train``)
        self._made = [p for p in Path(out).absolute().parents if not p.exists()]
        self._lock = run_lock(out, exclusive=True, wait=ctl.get("wait"), purpose="train into")
        try:
            if out.is_dir():
                remove_dead_leftovers(out)
                found = holds_run(out)
                first_rank = self.dist is None or getattr(self.dist, "rank", 0) == 0
                if found and not self.resume and first_rank and not ctl.get("overwrite"):
                    raise FileExistsError(
                        f"{out}: holds another run ({', '.join(found)}); pass --overwrite to "
                        f"replace it, --resume {out} to continue it, or choose another "
                        "--output-dir")
                if found and not self.resume and ctl.get("overwrite"):  # every rank clears its own
                    for f in found:
                        (out / f).unlink()
                    for d in ("inference",):
                        if (out / d).is_dir():
                            shutil.rmtree(out / d)
                if first_rank and not self.resume and ctl.get("overwrite"):
                    world = 1 if self.dist is None else self.dist.world_size
                    for d in out.glob("rank*"):  # an earlier job's ranks that this job does not have
                        r = d.name[4:]
                        if d.is_dir() and r.isdigit() and int(r) >= world and holds_run(d):
                            shutil.rmtree(d)
            dataset = getattr(self.cfg, "dataset", "")
            if dataset:
                mode = getattr(self.cfg, "verify", "checksums")
                self._data = open_for_read(dataset, verify=mode, wait=ctl.get("wait"),
                                           purpose="train on")
                self._data.ds.close()  # the run opens its own reader; the lock stays
                self._mode = read_verification()
                set_read_verification(mode)  # that reader checks chunks as asked, until the end
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._mode is not None:
            set_read_verification(self._mode)
            self._mode = None
        if self._data is not None:
            self._data.lock.release()
            self._data = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
            if self._made and not self._out.exists():
                remove_made_dirs(self._made)
            self._made = []


def guarded(train_fn: F) -> F:
    """Decorator for a ``train(cfg, resume=False, stop_after_steps=None, job=None)`` function:
    the call runs inside a :class:`RunGuard` (``job``: the rank's :class:`ooc.contracts.Job`)."""

    @functools.wraps(train_fn)
    def wrapper(cfg: Any, resume: bool = False, *args: Any, **kwargs: Any) -> Any:
        job = kwargs.get("job", args[1] if len(args) > 1 else None)
        with RunGuard(cfg, resume=resume, dist=job):
            return train_fn(cfg, resume, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


@contextmanager
def guard_inference(run: str | os.PathLike, dataset: str | None = None, verify: str = "checksums",
                    wait: bool | None = None, weights: str = "best") -> Iterator[None]:
    """What ``ooc eval`` / ``ooc predict`` hold while they run: the run directory's shared lock
    (a run still training holds it exclusively), the dataset opened by
    :func:`~ooc.storage.access.open_for_read` (shared lock, structural scans, chunk checksums),
    a check that ``--dataset`` has the feature width the run was trained on, and the weights
    (``model.pt`` for ``weights="best"``; the checkpoint's checksum is checked when it is loaded).

    Raises:
        FileNotFoundError: ``run`` is not a run directory (no ``config.yaml``).
        LockError: the run is still being written, or the dataset is.
        DatasetError: the dataset fails its checks.
        ValueError: ``dataset``'s features differ in width from the run's dataset; ``model.pt``
            is corrupt (:class:`~ooc.training.checkpoint.CheckpointError`).
    """
    from ooc.config import ConfigError, load_yaml
    from ooc.storage.dataset import Dataset, DatasetError
    r = Path(run)
    saved = r / "config.yaml"
    if not saved.is_file():
        raise FileNotFoundError(f"{r}: not a run directory (it has no config.yaml)")
    try:
        data = load_yaml(saved)
        trained_on = str((data.get("data") or {}).get("dataset", "") or data.get("dataset", ""))
    except (ConfigError, AttributeError):
        trained_on = ""
    lock = run_lock(r, exclusive=False, wait=wait, purpose="evaluate")
    access = None
    try:
        if weights == "best" and (r / "model.pt").exists():
            from ooc.training.checkpoint import check_weights_file
            check_weights_file(r / "model.pt")
        target = dataset or trained_on
        if target:
            access = open_for_read(target, verify=verify, wait=wait, purpose="evaluate on")
            if dataset and trained_on and Path(trained_on).exists():
                try:
                    d0 = Dataset(trained_on)
                    want = d0.feat_dim
                    d0.close()
                except DatasetError:
                    want = None
                got = access.ds.feat_dim
                if want is not None and got != want:
                    raise ValueError(f"--dataset {dataset}: features of width {got}, but {run} was "
                                     f"trained on {trained_on} with width {want}; the model cannot "
                                     "run on it")
            access.ds.close()
        with verifying(verify):
            yield
    finally:
        if access is not None:
            access.lock.release()
        lock.release()
